"""PTX -> loaded CUfunction through the driver JIT, with the on-disk cubin cache.

``compile_ptx_to_cubin`` is the spec's entry point: it returns
``(cu_function_ptr, cu_module)`` or None where there is no cuda-python or
driver. A PTX rejection raises ``CompileError`` carrying the JIT log, mapped
back to the DSL's ``file:line`` when the emitter's line map is given.
"""

from __future__ import annotations

import ctypes
import re
from typing import Any

from . import cache, driver
from .errors import CompileError, LaunchError
from .source import Loc, fmt_loc

__all__ = ["compile_ptx_to_cubin", "cubin_for", "load_cubin", "entry_name", "map_log"]

_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)")
_LINE = re.compile(r"line (\d+)")
_LOG_BYTES = 1 << 16


def entry_name(ptx: str) -> str:
    """The first ``.entry`` symbol of ``ptx`` (``CompileError`` if there is none)."""
    m = _ENTRY.search(ptx)
    if not m:
        raise CompileError("the PTX has no .entry function")
    return m.group(1)


def map_log(log: str, ptx: str, locs: list[Loc | None] | None) -> str:
    """Append the Python ``file:line`` and the PTX text to every ``line N`` in a JIT/ptxas log."""
    lines = ptx.splitlines()
    out = []
    for msg in log.strip().splitlines():
        out.append(msg)
        m = _LINE.search(msg)
        if m:
            n = int(m.group(1))
            if locs is not None and 0 < n <= len(locs) and locs[n - 1] is not None:
                out.append(f"    from {fmt_loc(locs[n - 1])}")
            if 0 < n <= len(lines):
                out.append(f"    PTX line {n}: {lines[n - 1].strip()}")
    return "\n".join(out)


def _jit(mod: Any, ptx: str, name: str) -> bytes:
    """Driver-JIT ``ptx`` into cubin bytes; ``CompileError`` with the log on rejection."""
    opt = mod.CUjit_option
    err_buf = bytearray(_LOG_BYTES)
    keys = [opt.CU_JIT_ERROR_LOG_BUFFER, opt.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES]
    vals: list[Any] = [err_buf, _LOG_BYTES]
    try:
        err, state = mod.cuLinkCreate(len(keys), keys, vals)
    except (TypeError, ValueError):
        err_buf = None
        err, state = mod.cuLinkCreate(0, [], [])
    if int(err) != 0:
        raise LaunchError(f"cuLinkCreate failed: {driver._name(mod, err)}")
    try:
        data = ptx.encode() + b"\0"
        (err,) = mod.cuLinkAddData(state, mod.CUjitInputType.CU_JIT_INPUT_PTX, data, len(data),
                                   name.encode(), 0, [], [])
        if int(err) == 0:
            err, cubin_ptr, size = mod.cuLinkComplete(state)
        if int(err) != 0:
            log = bytes(err_buf).split(b"\0", 1)[0].decode(errors="replace") if err_buf else ""
            raise CompileError(driver._name(mod, err), log)
        return ctypes.string_at(int(cubin_ptr), int(size))
    finally:
        mod.cuLinkDestroy(state)


def compile_ptx_to_cubin(
    ptx_source: str,
    arch: str,
    kernel_name: str = "",
    dynamic_smem_bytes: int = 0,
    *,
    locs: list[Loc | None] | None = None,
) -> tuple[int, Any] | None:
    """Driver-JIT a PTX string into a loaded kernel: ``(cu_function_ptr, cu_module)``.

    Returns None where there is no cuda-python or driver. Uses and fills the
    disk cache, so a second process loads the cubin without JIT. Raises
    ``CompileError`` (log mapped to ``locs``) when the PTX is rejected.
    """
    mod = driver.cuda()
    if mod is None:
        return None
    name = kernel_name or entry_name(ptx_source)
    cubin = cubin_for(ptx_source, arch, name, locs=locs)
    return load_cubin(cubin, name, dynamic_smem_bytes)


def cubin_for(ptx_source: str, arch: str, name: str, *,
              locs: list[Loc | None] | None = None) -> bytes:
    """The cubin of ``ptx_source`` for ``arch``: from the disk cache, else driver-JITted and
    stored there. Needs the driver (``LaunchError`` without one)."""
    mod = driver.cuda()
    if mod is None:
        raise LaunchError(f"CUDA driver unavailable: {driver.unavailable_reason()}")
    key = cache.cache_key(ptx_source, arch, driver.driver_version())
    cubin = cache.load(key)
    if cubin is None:
        try:
            cubin = _jit(mod, ptx_source, name)
        except CompileError as e:
            status, log = e.args if len(e.args) == 2 else ("", str(e))
            raise CompileError(
                f"the CUDA driver rejected the PTX of {name!r} for {arch} ({status}):\n"
                + (map_log(log, ptx_source, locs) or "(the driver gave no log; run "
                   "`pyptx check` for ptxas's diagnostics)")
            ) from None
        cache.store(key, cubin)
    return cubin


def load_cubin(cubin: bytes, name: str, dynamic_smem_bytes: int = 0) -> tuple[int, Any]:
    """Load ``cubin`` into the current context: ``(cu_function_ptr, cu_module)``."""
    mod = driver.cuda()
    module = driver.call("cuModuleLoadData", cubin, what=f"loading {name}")
    fn = driver.call("cuModuleGetFunction", module, name.encode(), what=f"entry {name}")
    if dynamic_smem_bytes > 0:  # static + dynamic past 48 KiB needs the opt-in too
        attr = mod.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        driver.call("cuFuncSetAttribute", fn, attr, int(dynamic_smem_bytes),
                    what=f"{dynamic_smem_bytes} bytes of dynamic shared memory")
    return int(fn), module
