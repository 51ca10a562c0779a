"""Lazy access to the CUDA driver through cuda-python (never imported at ``import pyptx``).

``cuda()`` returns the cuda-python driver module or None when cuda-python or
a driver is missing; ``call`` unwraps cuda-python's ``(err, *values)`` tuples
and raises ``LaunchError`` with the driver's error name.
"""

from __future__ import annotations

import threading
from typing import Any

from .errors import LaunchError

_lock = threading.Lock()
_state: dict[str, Any] = {}

__all__ = ["cuda", "unavailable_reason", "call", "driver_version", "device_count",
           "device_capability", "max_shared_per_block", "multiprocessor_count", "ensure_context"]


def cuda() -> Any | None:
    """The cuda-python driver module, initialised, or None (see ``unavailable_reason``)."""
    if "mod" in _state:
        return _state["mod"]
    with _lock:
        if "mod" in _state:
            return _state["mod"]
        mod = None
        try:
            try:
                from cuda.bindings import driver as mod
            except ImportError:
                from cuda import cuda as mod  # cuda-python < 12.6
        except ImportError as e:
            _state["why"] = f"cuda-python is not installed ({e}); pip install cuda-python"
            _state["mod"] = None
            return None
        try:
            (err,) = mod.cuInit(0)
            if int(err) != 0:
                _state["why"] = f"cuInit failed: {_name(mod, err)} (no usable GPU or driver)"
                mod = None
        except Exception as e:  # the bindings raise when libcuda itself is missing
            _state["why"] = f"the CUDA driver could not be loaded: {e}"
            mod = None
        _state["mod"] = mod
        return mod


def unavailable_reason() -> str | None:
    """Why ``cuda()`` is None, or None if the driver is usable."""
    cuda()
    return _state.get("why")


def _name(mod: Any, err: Any) -> str:
    try:
        e, name = mod.cuGetErrorName(err)
        if int(e) == 0:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        pass
    return f"CUresult {int(err)}"


def call(fn: str, *args: Any, what: str = "") -> Any:
    """``cuda().<fn>(*args)``; return the values (one value unwrapped), raise ``LaunchError``."""
    mod = cuda()
    if mod is None:
        raise LaunchError(f"CUDA driver unavailable: {unavailable_reason()}")
    out = getattr(mod, fn)(*args)
    err = out[0]
    if int(err) != 0:
        raise LaunchError(f"{fn} failed: {_name(mod, err)}{' (' + what + ')' if what else ''}")
    rest = out[1:]
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def driver_version() -> int:
    """The driver's CUDA version as an int (e.g. 13000), 0 when unavailable."""
    if "version" not in _state:
        _state["version"] = call("cuDriverGetVersion") if cuda() is not None else 0
    return _state["version"]


def device_count() -> int:
    """How many GPUs the driver sees (0 when it is unavailable)."""
    if cuda() is None:
        return 0
    return int(call("cuDeviceGetCount"))


def device_capability(ordinal: int) -> tuple[int, int]:
    """(major, minor) compute capability of device ``ordinal``."""
    mod = cuda()
    dev = call("cuDeviceGet", ordinal)
    attr = mod.CUdevice_attribute
    major = call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    minor = call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    return int(major), int(minor)


def max_shared_per_block(ordinal: int) -> int:
    """The opt-in dynamic shared memory limit per block of device ``ordinal``, in bytes."""
    mod = cuda()
    dev = call("cuDeviceGet", ordinal)
    attr = mod.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    return int(call("cuDeviceGetAttribute", attr, dev))


def multiprocessor_count(ordinal: int) -> int:
    """The number of SMs of device ``ordinal``."""
    mod = cuda()
    dev = call("cuDeviceGet", ordinal)
    attr = mod.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return int(call("cuDeviceGetAttribute", attr, dev))


def ensure_context(ordinal: int) -> None:
    """Make device ``ordinal``'s primary context current on this thread (it is what
    PyTorch and JAX use), retaining it once per process."""
    ctxs = _state.setdefault("ctx", {})
    ctx = ctxs.get(ordinal)
    if ctx is None:
        dev = call("cuDeviceGet", ordinal)
        ctx = ctxs[ordinal] = call("cuDevicePrimaryCtxRetain", dev)
    call("cuCtxSetCurrent", ctx)
