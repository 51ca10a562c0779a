"""JAX runtime for pyptx kernels; ``pyptx.jax_support`` re-exports this API.

Importing ``pyptx_jax`` does not import jax; the launch paths do.
"""

from __future__ import annotations

from pyptx.autodiff import differentiable_kernel

from .ffi import call_kernel_via_ffi, ensure_ffi_registered, set_mock_ffi_callback

__all__ = ["call_kernel_via_ffi", "ensure_ffi_registered", "set_mock_ffi_callback",
           "differentiable_kernel"]
