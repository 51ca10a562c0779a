"""``pyptx.jax_support``: the JAX runtime API: core's registry, compile, TMA and shim
pieces plus the pyptx-jax plugin's FFI functions."""

from __future__ import annotations

from .jit import compile_ptx_to_cubin
from .launch import (
    add_scalar_param_to_shim,
    add_tma_spec_to_shim,
    register_launch_config,
    shim_is_available,
    shim_load_error,
)
from .registry import CubinRecord, CubinRegistry, get_cubin_registry
from .tma import synthesize_tma_descriptor, synthesize_tma_descriptor_3d

try:
    from pyptx_jax import (
        call_kernel_via_ffi,
        differentiable_kernel,
        ensure_ffi_registered,
        set_mock_ffi_callback,
    )
except ImportError as e:  # pragma: no cover - exercised where the plugin is absent
    raise ImportError(
        "pyptx.jax_support needs the JAX plugin: pip install \"pyptx-core[jax]\""
    ) from e

__all__ = [
    "CubinRecord", "CubinRegistry", "get_cubin_registry", "shim_is_available",
    "shim_load_error", "compile_ptx_to_cubin", "register_launch_config",
    "add_scalar_param_to_shim", "synthesize_tma_descriptor", "synthesize_tma_descriptor_3d",
    "add_tma_spec_to_shim", "set_mock_ffi_callback", "ensure_ffi_registered",
    "call_kernel_via_ffi", "differentiable_kernel",
]
