"""``pyptx.jax_support``: the JAX runtime API, re-exported from the pyptx-jax plugin."""

from __future__ import annotations

try:
    from pyptx_jax import (  # noqa: F401
        call_kernel_via_ffi,
        ensure_ffi_registered,
        set_mock_ffi_callback,
    )
except ImportError as e:  # pragma: no cover - exercised where the plugin is absent
    raise ImportError(
        "pyptx.jax_support needs the JAX plugin: pip install \"pyptx-core[jax]\""
    ) from e

__all__ = ["call_kernel_via_ffi", "ensure_ffi_registered", "set_mock_ffi_callback"]
