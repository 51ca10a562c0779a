"""PTX -> loaded CUfunction, with the on-disk cubin cache.

``compile_ptx_to_cubin`` is the spec's entry point: it returns
``(cu_function_ptr, cu_module)`` or None where there is no CUDA
driver. A PTX rejection raises ``CompileError`` carrying the compiler's log,
mapped back to the DSL's ``file:line`` when the emitter's line map is given.

The PTX is compiled as a whole program, by ptxas where one no newer than the
driver is found (its cubin goes to the disk cache), else by the driver when the
module is loaded (the driver keeps its own cache). Never through the driver's
linker (``cuLink*``): that compiles PTX as relocatable code, which ignores the
``setmaxnreg`` budget of warp-specialised kernels and spilled the head-dim-128
attention kernels to local memory (1.6x slower forward, 2.2x backward, H100).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from . import cache, driver
from ._lazyre import LazyRe
from .errors import CompileError, LaunchError, ToolchainError
from .source import Loc, fmt_loc

__all__ = ["compile_ptx_to_cubin", "cubin_for", "load_cubin", "load_image", "compiler",
           "entry_name", "map_log"]

_ENTRY = LazyRe(r"\.entry\s+([A-Za-z_$][\w$]*)")
_LINE = LazyRe(r"line (\d+)")
_LOG_BYTES = 1 << 16
_UNSUPPORTED_VERSION = LazyRe(r"Unsupported \.version")
_compilers: dict[tuple[str | None, int], tuple[str, str] | None] = {}


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


def compile_ptx_to_cubin(
    ptx_source: str,
    arch: str,
    kernel_name: str = "",
    dynamic_smem_bytes: int = 0,
    *,
    locs: list[Loc | None] | None = None,
) -> tuple[int, Any] | None:
    """Compile a PTX string and load it: ``(cu_function_ptr, cu_module)``.

    Returns None where there is no CUDA driver. With ptxas it uses and
    fills the disk cache, so a second process loads the cubin without compiling.
    Raises ``CompileError`` (log mapped to ``locs``) when the PTX is rejected.
    """
    if driver.cuda() is None:
        return None
    name = kernel_name or entry_name(ptx_source)
    cubin = cubin_for(ptx_source, arch, name, locs=locs)
    return load_image(ptx_source if cubin is None else cubin, name, dynamic_smem_bytes, locs=locs)


def compiler() -> tuple[str, str] | None:
    """``(path, version)`` of the ptxas that compiles kernels, or None when the driver does:
    none found (``$PYPTX_PTXAS`` decides alone when set), or newer than the driver (its cubins
    might not load)."""
    dv = driver.driver_version()
    key = (os.environ.get("PYPTX_PTXAS"), dv)
    if key not in _compilers:
        from . import ptxas

        found = None
        exe = ptxas.find_ptxas()
        if exe is not None:
            try:
                version = _version_of(ptxas, exe)
                major, minor = (int(x) for x in version.split(".")[:2])
            except (ToolchainError, ValueError):
                major = None
            if major is not None and (major, minor) <= (dv // 1000, dv % 1000 // 10):
                found = (exe, version)
        _compilers[key] = found
    return _compilers[key]


def _version_of(ptxas: Any, exe: str) -> str:
    """``ptxas.ptxas_version(exe)``, kept in the disk cache under the executable's identity
    (real path, size, modification time, inode), so a new process runs no ``ptxas --version``
    (~5 ms) for a ptxas it has seen; a new or rebuilt ptxas is asked again."""
    import hashlib

    try:
        real = os.path.realpath(exe)
        st = os.stat(real)
    except OSError:
        return ptxas.ptxas_version(exe)
    ident = f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"
    key = "ptxas-" + hashlib.sha256(ident.encode()).hexdigest()[:32]
    raw = cache.load(key, ".version")
    if raw:
        try:
            version = raw.decode()
            if version.replace(".", "").isdigit():
                return version
        except UnicodeDecodeError:
            pass
    version = ptxas.ptxas_version(exe)
    cache.store(key, version.encode(), ".version")
    return version


def machine_arch(arch: str) -> str:
    """The SASS target for PTX written for ``arch`` on the current device: ``arch`` itself
    for an arch-specific target (``sm_90a``: it runs on that GPU alone) or one the device
    matches; for a plain ``sm_XY`` older than the device, the device's own plain target (PTX
    is forward compatible, SASS is not: an sm_80 cubin does not load on an H200)."""
    import re

    m = re.fullmatch(r"sm_(\d+)", arch)
    if m is None or driver.cuda() is None:
        return arch
    from .arch import _current_ordinal

    try:
        major, minor = driver.device_capability(_current_ordinal(driver))
    except Exception:  # no device here: keep the target as written
        return arch
    return arch if int(m.group(1)) >= major * 10 + minor else f"sm_{major}{minor}"


def cubin_for(ptx_source: str, arch: str, name: str, *,
              locs: list[Loc | None] | None = None) -> bytes | None:
    """The cubin of ``ptx_source`` for ``arch`` (on the current device: ``machine_arch``):
    from the disk cache, else assembled by
    ptxas (``compiler()``) and stored there; None when no ptxas is usable (``load_image``
    then gives the PTX to the driver, as it does when this ptxas is too old for the PTX's
    ``.version``). ``CompileError`` when ptxas rejects the PTX otherwise."""
    comp = compiler()
    if comp is None:
        return None
    arch = machine_arch(arch)
    key = cache.cache_key(ptx_source, arch, f"{driver.driver_version()}/ptxas {comp[1]}")
    cubin = cache.load(key)
    if cubin is not None:
        return cubin
    with _inflight_lock:   # another thread assembling the same PTX: wait for its cubin
        busy = _inflight.get(key)
        if busy is None:
            busy = _inflight[key] = threading.Event()
            mine = True
        else:
            mine = False
    if not mine:
        busy.wait()
        cubin = cache.load(key)
        if cubin is not None:
            return cubin
    try:
        from . import ptxas

        try:
            cubin = ptxas.assemble(ptx_source, arch, locs=locs).cubin
        except CompileError as e:
            if _UNSUPPORTED_VERSION.search(str(e)):
                return None  # an older ptxas than the PTX needs: the driver may know it
            raise
        cache.store(key, cubin)
        return cubin
    finally:
        if mine:
            with _inflight_lock:
                _inflight.pop(key, None)
            busy.set()


#: Cubin keys being assembled now, each with the event set when its cubin is stored.
_inflight: dict[str, threading.Event] = {}
_inflight_lock = threading.Lock()


def load_image(image: bytes | str, name: str, dynamic_smem_bytes: int = 0, *,
               locs: list[Loc | None] | None = None) -> tuple[int, int]:
    """Load a cubin (bytes) or PTX text (compiled by the driver, whole program) into the
    current context: ``(cu_function_ptr, cu_module)``."""
    if isinstance(image, bytes):
        return load_cubin(image, name, dynamic_smem_bytes)
    if driver.cuda() is None:
        raise LaunchError(f"CUDA driver unavailable: {driver.unavailable_reason()}")
    err, module, log = driver.module_load_ptx(image, _LOG_BYTES)
    if err != 0:
        raise CompileError(
            f"the CUDA driver rejected the PTX of {name!r} ({driver.error_name(err)}):\n"
            + (map_log(log, image, locs) or "(the driver gave no log; run `pyptx check` for "
               "ptxas's diagnostics)"))
    return _function(module, name, dynamic_smem_bytes)


def load_cubin(cubin: bytes, name: str, dynamic_smem_bytes: int = 0) -> tuple[int, int]:
    """Load ``cubin`` into the current context: ``(cu_function_ptr, cu_module)``."""
    module = driver.module_load(cubin, what=f"loading {name}")
    return _function(module, name, dynamic_smem_bytes)


def _function(module: int, name: str, dynamic_smem_bytes: int) -> tuple[int, int]:
    fn = driver.module_function(module, name)
    if dynamic_smem_bytes > 0:  # static + dynamic past 48 KiB needs the opt-in too
        driver.set_function_attribute(
            fn, driver.FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(dynamic_smem_bytes),
            what=f"{dynamic_smem_bytes} bytes of dynamic shared memory")
    return fn, module
