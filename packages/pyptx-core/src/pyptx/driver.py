"""The CUDA driver (``libcuda``) through ``ctypes``, opened at first use (never at ``import pyptx``).

The few entry points pyptx needs on the host, each a plain function: device queries, the
current context, module loading, function attributes and ``cuTensorMapEncodeTiled``. A
failing call raises ``LaunchError`` naming the call and the driver's error. ``cuda()`` is
the opened library, or None where there is no driver or GPU (``unavailable_reason`` says
why).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

from .errors import LaunchError

_lock = threading.Lock()
_state: dict[str, Any] = {}

__all__ = ["cuda", "unavailable_reason", "error_name", "driver_version", "device_count",
           "device_attribute", "device_capability", "max_shared_per_block",
           "multiprocessor_count", "device_name", "device_total_memory", "current_context",
           "set_current_context", "current_device", "ensure_context", "module_load",
           "module_load_ptx", "module_function", "function_attribute",
           "set_function_attribute", "tensor_map_encode_tiled",
           "ATTR_MULTIPROCESSOR_COUNT", "ATTR_COMPUTE_CAPABILITY_MAJOR",
           "ATTR_COMPUTE_CAPABILITY_MINOR", "ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
           "FUNC_ATTR_LOCAL_SIZE_BYTES", "FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES"]

#: ``CUdevice_attribute`` values (cuda.h).
ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76
ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
#: ``CUfunction_attribute`` values (cuda.h).
FUNC_ATTR_LOCAL_SIZE_BYTES = 3
FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_JIT_ERROR_LOG_BUFFER = 5
_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
_TENSOR_MAP_BYTES = 128

_c_int, _c_uint, _vp = ctypes.c_int, ctypes.c_uint, ctypes.c_void_p
_pint, _pvp = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p)
_pu64, _pu32 = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
#: Every entry point used, by its exported symbol, with its argument types (all return CUresult).
_SIGNATURES: dict[str, tuple[str, tuple[Any, ...]]] = {
    "cuInit": ("cuInit", (_c_uint,)),
    "cuGetErrorName": ("cuGetErrorName", (_c_int, ctypes.POINTER(ctypes.c_char_p))),
    "cuDriverGetVersion": ("cuDriverGetVersion", (_pint,)),
    "cuDeviceGetCount": ("cuDeviceGetCount", (_pint,)),
    "cuDeviceGet": ("cuDeviceGet", (_pint, _c_int)),
    "cuDeviceGetAttribute": ("cuDeviceGetAttribute", (_pint, _c_int, _c_int)),
    "cuDeviceGetName": ("cuDeviceGetName", (ctypes.c_char_p, _c_int, _c_int)),
    "cuDeviceTotalMem": ("cuDeviceTotalMem_v2", (ctypes.POINTER(ctypes.c_size_t), _c_int)),
    "cuDevicePrimaryCtxRetain": ("cuDevicePrimaryCtxRetain", (_pvp, _c_int)),
    "cuCtxGetCurrent": ("cuCtxGetCurrent", (_pvp,)),
    "cuCtxSetCurrent": ("cuCtxSetCurrent", (_vp,)),
    "cuCtxGetDevice": ("cuCtxGetDevice", (_pint,)),
    "cuModuleLoadData": ("cuModuleLoadData", (_pvp, ctypes.c_char_p)),
    "cuModuleLoadDataEx": ("cuModuleLoadDataEx", (_pvp, ctypes.c_char_p, _c_uint, _pint, _pvp)),
    "cuModuleGetFunction": ("cuModuleGetFunction", (_pvp, _vp, ctypes.c_char_p)),
    "cuFuncGetAttribute": ("cuFuncGetAttribute", (_pint, _c_int, _vp)),
    "cuFuncSetAttribute": ("cuFuncSetAttribute", (_vp, _c_int, _c_int)),
    "cuTensorMapEncodeTiled": ("cuTensorMapEncodeTiled", (
        _vp, _c_int, _c_uint, _vp, _pu64, _pu64, _pu32, _pu32, _c_int, _c_int, _c_int, _c_int)),
}


class _Driver:
    """``libcuda`` with the entry points of ``_SIGNATURES`` bound by their short names."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        for name, (symbol, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, symbol)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
            setattr(self, name, fn)


_SONAMES = ("libcuda.so.1", "libcuda.so")
"""Where the driver is looked for, in order (names the dynamic loader resolves)."""


def _open() -> tuple[_Driver | None, str | None]:
    lib = None
    for soname in _SONAMES:
        try:
            lib = ctypes.CDLL(soname)
            break
        except OSError:
            continue
    if lib is None:
        return None, "the CUDA driver (libcuda.so.1) was not found: no NVIDIA driver here"
    try:
        drv = _Driver(lib)
    except AttributeError as e:
        return None, f"the CUDA driver is too old for pyptx ({e}); CUDA 12.0 or newer is needed"
    err = drv.cuInit(0)
    if err != 0:
        return None, f"cuInit failed: {_name_of(drv, err)} (no usable GPU or driver)"
    return drv, None


def cuda() -> Any | None:
    """The opened, initialised CUDA driver, or None (see ``unavailable_reason``)."""
    if "mod" in _state:
        return _state["mod"]
    with _lock:
        if "mod" not in _state:
            _state["mod"], _state["why"] = _open()
        return _state["mod"]


def unavailable_reason() -> str | None:
    """Why ``cuda()`` is None, or None if the driver is usable."""
    cuda()
    return _state.get("why")


def _name_of(drv: Any, err: int) -> str:
    name = ctypes.c_char_p()
    try:
        if drv.cuGetErrorName(int(err), ctypes.byref(name)) == 0 and name.value:
            return name.value.decode()
    except Exception:  # noqa: BLE001 - a name is only decoration
        pass
    return f"CUresult {int(err)}"


def error_name(err: int) -> str:
    """The driver's name for a ``CUresult`` (``'CUDA_ERROR_INVALID_VALUE'``), or its number."""
    drv = cuda()
    return f"CUresult {int(err)}" if drv is None else _name_of(drv, err)


def _driver() -> Any:
    drv = cuda()
    if drv is None:
        raise LaunchError(f"CUDA driver unavailable: {unavailable_reason()}")
    return drv


def _check(fn: str, *args: Any, what: str = "") -> None:
    err = getattr(_driver(), fn)(*args)
    if err != 0:
        raise LaunchError(f"{fn} failed: {error_name(err)}{' (' + what + ')' if what else ''}")


def driver_version() -> int:
    """The driver's CUDA version as an int (e.g. 13000), 0 when unavailable."""
    if "version" not in _state:
        v = ctypes.c_int()
        if cuda() is not None:
            _check("cuDriverGetVersion", ctypes.byref(v))
        _state["version"] = v.value
    return _state["version"]


def device_count() -> int:
    """How many GPUs the driver sees (0 when it is unavailable)."""
    if cuda() is None:
        return 0
    n = ctypes.c_int()
    _check("cuDeviceGetCount", ctypes.byref(n))
    return n.value


def _device(ordinal: int) -> int:
    dev = ctypes.c_int()
    _check("cuDeviceGet", ctypes.byref(dev), int(ordinal), what=f"device {ordinal}")
    return dev.value


def device_attribute(ordinal: int, attribute: int) -> int:
    """``cuDeviceGetAttribute(attribute)`` of device ``ordinal`` (an ``ATTR_*`` value)."""
    key = ("attr", ordinal, attribute)
    if key not in _state:  # device attributes never change within a process
        value = ctypes.c_int()
        _check("cuDeviceGetAttribute", ctypes.byref(value), int(attribute), _device(ordinal))
        _state[key] = value.value
    return _state[key]


def device_capability(ordinal: int) -> tuple[int, int]:
    """(major, minor) compute capability of device ``ordinal``."""
    return (device_attribute(ordinal, ATTR_COMPUTE_CAPABILITY_MAJOR),
            device_attribute(ordinal, ATTR_COMPUTE_CAPABILITY_MINOR))


def max_shared_per_block(ordinal: int) -> int:
    """The opt-in dynamic shared memory limit per block of device ``ordinal``, in bytes."""
    return device_attribute(ordinal, ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)


def multiprocessor_count(ordinal: int) -> int:
    """The number of SMs of device ``ordinal``."""
    return device_attribute(ordinal, ATTR_MULTIPROCESSOR_COUNT)


def device_name(ordinal: int) -> str:
    """The marketing name of device ``ordinal`` (``'NVIDIA H200'``)."""
    buf = ctypes.create_string_buffer(256)
    _check("cuDeviceGetName", buf, 256, _device(ordinal))
    return buf.value.decode(errors="replace")


def device_total_memory(ordinal: int) -> int:
    """The memory of device ``ordinal``, in bytes."""
    size = ctypes.c_size_t()
    _check("cuDeviceTotalMem", ctypes.byref(size), _device(ordinal))
    return size.value


def current_context() -> int:
    """This thread's current ``CUcontext`` as an int (0: none)."""
    ctx = ctypes.c_void_p()
    _check("cuCtxGetCurrent", ctypes.byref(ctx))
    return ctx.value or 0


def set_current_context(ctx: int) -> None:
    """Make ``ctx`` (from ``current_context``) this thread's current context."""
    _check("cuCtxSetCurrent", ctypes.c_void_p(ctx or None))


def current_device() -> int | None:
    """The ordinal of this thread's current context's device, or None with no context."""
    dev = ctypes.c_int()
    return dev.value if _driver().cuCtxGetDevice(ctypes.byref(dev)) == 0 else None


def ensure_context(ordinal: int) -> None:
    """Make device ``ordinal``'s primary context current on this thread (it is what
    PyTorch and JAX use), retaining it once per process."""
    ctxs = _state.setdefault("ctx", {})
    ctx = ctxs.get(ordinal)
    if ctx is None:
        out = ctypes.c_void_p()
        _check("cuDevicePrimaryCtxRetain", ctypes.byref(out), _device(ordinal),
               what=f"device {ordinal}")
        ctx = ctxs[ordinal] = out.value
    set_current_context(ctx)


def module_load(cubin: bytes, what: str = "") -> int:
    """Load ``cubin`` into the current context; the ``CUmodule`` as an int."""
    module = ctypes.c_void_p()
    _check("cuModuleLoadData", ctypes.byref(module), cubin, what=what)
    return module.value


def module_load_ptx(ptx: str, log_bytes: int = 1 << 16) -> tuple[int, int, str]:
    """Load PTX text (the driver compiles it) into the current context: ``(CUresult,
    CUmodule as an int or 0, the driver's error log)``; the caller reports a failure."""
    drv = _driver()
    log = ctypes.create_string_buffer(log_bytes)
    options = (ctypes.c_int * 2)(_JIT_ERROR_LOG_BUFFER, _JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
    values = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p).value, log_bytes)
    module = ctypes.c_void_p()
    err = drv.cuModuleLoadDataEx(ctypes.byref(module), ptx.encode() + b"\0", 2, options, values)
    return err, module.value or 0, log.value.decode(errors="replace")


def module_function(module: int, name: str) -> int:
    """The ``CUfunction`` (an int) of entry ``name`` in ``module``."""
    fn = ctypes.c_void_p()
    _check("cuModuleGetFunction", ctypes.byref(fn), module, name.encode(), what=f"entry {name}")
    return fn.value


def function_attribute(fn: int, attribute: int) -> int:
    """``cuFuncGetAttribute(attribute)`` of ``fn`` (a ``FUNC_ATTR_*`` value)."""
    value = ctypes.c_int()
    _check("cuFuncGetAttribute", ctypes.byref(value), int(attribute), fn)
    return value.value


def set_function_attribute(fn: int, attribute: int, value: int, what: str = "") -> None:
    """``cuFuncSetAttribute(fn, attribute, value)``."""
    _check("cuFuncSetAttribute", fn, int(attribute), int(value), what=what)


def tensor_map_encode_tiled(data_type: int, rank: int, address: int, dims: Sequence[int],
                            strides: Sequence[int], box: Sequence[int],
                            element_strides: Sequence[int], interleave: int, swizzle: int,
                            l2_promotion: int, oob_fill: int, what: str = "") -> bytes:
    """``cuTensorMapEncodeTiled`` with the enums as ints; the 128-byte ``CUtensorMap``."""
    buf = ctypes.create_string_buffer(_TENSOR_MAP_BYTES + 63)
    at = (ctypes.addressof(buf) + 63) & ~63  # the driver wants it 64-byte aligned

    def u64(xs):
        return (ctypes.c_uint64 * max(1, len(xs)))(*xs)

    def u32(xs):
        return (ctypes.c_uint32 * max(1, len(xs)))(*xs)

    _check("cuTensorMapEncodeTiled", at, int(data_type), int(rank), address or None, u64(dims),
           u64(strides), u32(box), u32(element_strides), int(interleave), int(swizzle),
           int(l2_promotion), int(oob_fill), what=what)
    return ctypes.string_at(at, _TENSOR_MAP_BYTES)
