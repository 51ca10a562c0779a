"""JAX runtime for pyptx kernels; ``pyptx.jax_support`` re-exports this API.

Importing this package never imports ``jax``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pyptx_jax.runtime import launch_unavailable

if TYPE_CHECKING:
    from pyptx import Tile

__all__ = ["call_kernel_via_ffi", "ensure_ffi_registered", "set_mock_ffi_callback"]

_mock_ffi_callback: Callable[..., Any] | None = None


def set_mock_ffi_callback(callback: Callable[..., Any] | None) -> None:
    """Install a mock callback (legacy test hook; pre-shim); None removes it."""
    global _mock_ffi_callback
    _mock_ffi_callback = callback


def ensure_ffi_registered() -> bool:
    """Register the ``pyptx_launch`` FFI target with JAX; False (never raises) without the shim."""
    return False


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
    """Build the ``jax.ffi.ffi_call`` that launches this kernel; needs the shim launcher."""
    raise launch_unavailable()
