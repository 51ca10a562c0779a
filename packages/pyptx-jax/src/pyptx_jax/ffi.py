"""The XLA typed-FFI path: register the shim's handler once, build ``jax.ffi.ffi_call``s."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from pyptx.errors import SpecError
from pyptx.launch import check_registered_geometry
from pyptx.specs import Tile
from pyptx.types import numpy_name

__all__ = ["TARGET", "ensure_ffi_registered", "set_mock_ffi_callback", "call_kernel_via_ffi",
           "result_types"]

TARGET = "pyptx_launch"
_lock = threading.Lock()
_registered: bool | None = None
_mock: Callable[..., Any] | None = None


def set_mock_ffi_callback(callback: Callable[..., Any] | None) -> None:
    """Install a test hook that replaces the FFI launch; None removes it.

    While set, ``call_kernel_via_ffi`` returns ``callback(*inputs,
    cubin_handle=..., result_types=[jax.ShapeDtypeStruct, ...])`` instead of
    emitting the custom call, so the JAX path can be tested without a GPU.
    """
    global _mock
    _mock = callback


def ensure_ffi_registered() -> bool:
    """Register the ``pyptx_launch`` FFI target for CUDA with typed FFI, once per process.

    Also installs the shim's resolver, so a program exported by another process (which
    names its kernels by content hash) finds them in the disk cache on its first call.
    Returns False, never raises, where JAX or the shim is missing.
    """
    global _registered
    if _registered is not None:
        return _registered
    with _lock:
        if _registered is None:
            try:
                import jax

                from pyptx_shim import native

                if native is None:
                    raise ImportError("the pyptx shim extension is not built")
                jax.ffi.register_ffi_target(TARGET, native.ffi_handler(), platform="CUDA",
                                            api_version=1)
                from .launch import resolve_handle

                native.set_resolver(resolve_handle)  # kernels of programs exported elsewhere
                _registered = True
            except Exception:
                _registered = False
    return _registered


def result_types(out_specs: Sequence[Tile], env: dict[str, int]) -> list[Any]:
    """``jax.ShapeDtypeStruct`` of each output of ``out_specs`` under ``env``."""
    import jax
    import jax.numpy as jnp

    out = []
    for s in out_specs:
        name = numpy_name(s.dtype)
        if name is None:
            raise SpecError(f"no JAX dtype holds PTX .{s.dtype.name} outputs")
        out.append(jax.ShapeDtypeStruct(s.resolve(env, "output"), jnp.dtype(name)))
    return out


def call_kernel_via_ffi(
    *inputs: Any,
    cubin_handle: int,
    out_specs: Sequence[Tile],
    out_shape_env: dict[str, int],
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    cluster: tuple[int, int, int] = (1, 1, 1),
    smem_bytes: int = 0,
) -> Any:
    """Launch a registered kernel through ``jax.ffi.ffi_call`` on XLA's stream.

    Uses typed FFI; the only attribute passed to the handler is
    ``cubin_handle`` (grid, block and smem are registered in the shim under
    it; ``LaunchError`` if the ones given differ from those registered).
    Returns one array or a tuple matching ``out_specs``.
    """
    import jax
    import numpy as np

    check_registered_geometry(cubin_handle, grid, block, cluster, smem_bytes)
    types = result_types(out_specs, out_shape_env)
    if _mock is not None:
        outs = _mock(*inputs, cubin_handle=cubin_handle, result_types=types)
    else:
        ensure_ffi_registered()
        call = jax.ffi.ffi_call(TARGET, types, vmap_method="sequential")
        outs = call(*inputs, cubin_handle=np.uint64(cubin_handle))
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    return outs[0] if len(outs) == 1 else tuple(outs)
