"""Registering launch configs with the C++ shim (``pyptx-shim``), shared by every runtime."""

from __future__ import annotations

import ctypes
import struct
from typing import Any

from .errors import LaunchError, RuntimeUnavailableError
from .source import where
from .types import PtxType, from_name

__all__ = ["shim", "shim_is_available", "shim_load_error", "register_launch_config",
           "add_scalar_param_to_shim", "add_tma_spec_to_shim", "scalar_bytes",
           "check_registered_geometry", "TMA_PLACEHOLDER_ADDRESS"]

#: Address the tensor maps are encoded with; the shim replaces it at every launch.
TMA_PLACEHOLDER_ADDRESS = 1 << 20


def shim() -> Any:
    """The shim's native module; ``RuntimeUnavailableError`` naming the fix if it is missing."""
    try:
        from pyptx_shim import native, shim_load_error
    except ImportError:
        raise RuntimeUnavailableError(
            "the pyptx launcher is not installed: pip install pyptx-shim "
            "(every runtime plugin depends on it)"
        ) from None
    if native is None:
        raise RuntimeUnavailableError(shim_load_error())
    return native


def shim_is_available() -> bool:
    """True if the C++ shim is loaded and ready."""
    try:
        import pyptx_shim
    except ImportError:
        return False
    return pyptx_shim.shim_is_available()


def shim_load_error() -> str | None:
    """Return the last shim-load error, or None if the shim loaded fine."""
    try:
        import pyptx_shim
    except ImportError as e:
        return f"pyptx-shim is not installed ({e})"
    return pyptx_shim.shim_load_error()


def _shim_call(fn: str, *args: Any) -> None:
    native = shim()
    try:
        getattr(native, fn)(*args)
    except (RuntimeError, ValueError, TypeError) as e:
        raise LaunchError(f"shim {fn} refused: {e}") from None


def register_launch_config(
    handle: int,
    cu_function: int,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    cluster: tuple[int, int, int] = (1, 1, 1),
    smem_bytes: int = 0,
    *,
    num_pointers: int | None = None,
    pdl: bool = False,
) -> None:
    """Populate the shim's launch registry with a (handle, cu_fn, ...) entry.

    ``num_pointers`` is how many pointer arguments every launch must pass;
    by default it is read off the registered PTX (its ``.u64`` params).
    ``pdl`` launches with programmatic dependent launch allowed.
    """
    if num_pointers is None:
        from .registry import get_cubin_registry

        rec = get_cubin_registry().get(handle)
        if rec is None:
            raise LaunchError(f"no registered kernel has handle {handle}")
        head = rec.ptx_source.split("{", 1)[0]
        num_pointers = head.count(".param .u64")
    _shim_call("register", handle, cu_function, tuple(grid), tuple(block), tuple(cluster),
               smem_bytes, num_pointers)
    if pdl:
        _shim_call("set_pdl", handle, True)


def scalar_bytes(value: int | float, t: PtxType | str) -> bytes:
    """The little-endian bytes of ``value`` as a ``.param`` of type ``t``."""
    t = from_name(t) if isinstance(t, str) else t
    if t.is_float:
        fmt = {16: "<e", 32: "<f", 64: "<d"}[t.bits]
        return struct.pack(fmt, float(value))
    fmt = {8: "b", 16: "h", 32: "i", 64: "q"}[t.bits]
    fmt = "<" + (fmt if t.is_signed or value < 0 else fmt.upper())
    return struct.pack(fmt, int(value))


def add_scalar_param_to_shim(handle: int, value: int | float | bytes,
                             type: PtxType | str = "u32") -> None:
    """Register a scalar raw ``.param`` value with the shim's launch config (appended in order)."""
    raw = value if isinstance(value, bytes) else scalar_bytes(value, type)
    _shim_call("add_scalar", handle, raw)


def add_tma_spec_to_shim(handle: int, xla_arg_index: int, host_blob_ptr: Any,
                         device_blob_ptr: int = 0) -> None:
    """Register a by-value 128-byte tensor map; the shim patches its address to pointer
    argument ``xla_arg_index`` at every launch.

    ``host_blob_ptr`` is the map's bytes, a ``pyptx.tma.TensorMap``, or the int address
    of its 128 bytes. Maps travel by value, so ``device_blob_ptr`` must be 0 (what
    ``synthesize_tma_descriptor`` returns); a device copy is refused, not ignored.
    """
    if device_blob_ptr:
        raise LaunchError(f"{where()}: add_tma_spec_to_shim: tensor maps are passed by value "
                          f"(no device copy), so device_blob_ptr must be 0, got "
                          f"{device_blob_ptr:#x}")
    if isinstance(host_blob_ptr, int) and not isinstance(host_blob_ptr, bool):
        if host_blob_ptr <= 0:
            raise LaunchError(f"add_tma_spec_to_shim: host_blob_ptr must be the address of a "
                              f"128-byte tensor map, got {host_blob_ptr}")
        blob = ctypes.string_at(host_blob_ptr, 128)
    elif isinstance(host_blob_ptr, (bytes, bytearray, memoryview)):
        blob = bytes(host_blob_ptr)
    elif hasattr(host_blob_ptr, "blob"):
        blob = bytes(host_blob_ptr.blob)
    else:
        raise LaunchError(f"add_tma_spec_to_shim: expected a tensor map's bytes, a TensorMap "
                          f"or its address, got {host_blob_ptr!r}")
    _shim_call("add_tma", handle, xla_arg_index, blob)


def check_registered_geometry(handle: int, grid: Any, block: Any, cluster: Any,
                              smem_bytes: int) -> Any:
    """The registry's record of ``handle``, after checking that the launch geometry a caller
    passes is the one registered (``LaunchError`` naming both otherwise, or when no record
    has that handle). Spec functions that take geometry beside a handle call this."""
    from .registry import get_cubin_registry

    rec = get_cubin_registry().get(handle)
    if rec is None:
        raise LaunchError(f"{where()}: no registered kernel has handle {handle} (register it "
                          "with get_cubin_registry().register(...) first)")
    given = {"grid": tuple(grid), "block": tuple(block), "smem_bytes": int(smem_bytes)}
    known = {"grid": tuple(rec.grid), "block": tuple(rec.block), "smem_bytes": rec.smem_bytes}
    if rec.key:  # records of specializations know their cluster too
        given["cluster"], known["cluster"] = tuple(cluster), tuple(rec.cluster)
    for what, value in given.items():
        if value != known[what]:
            raise LaunchError(f"{where()}: kernel handle {handle} ({rec.kernel_name}) was "
                              f"registered with {what}={known[what]}, got {what}={value}")
    return rec
