"""``pyptx.torch_support``: the PyTorch runtime API, re-exported from the pyptx-torch plugin."""

from __future__ import annotations

try:
    from pyptx_torch import (  # noqa: F401
        any_torch_tensors,
        call_kernel_via_torch,
        call_kernel_via_torch_compile,
        differentiable_kernel,
        extract_input_shapes,
        get_or_register_torch_op,
        is_torch_tensor,
    )
except ImportError as e:  # pragma: no cover - exercised where the plugin is absent
    raise ImportError(
        "pyptx.torch_support needs the PyTorch plugin: pip install \"pyptx-core[torch]\""
    ) from e

__all__ = [
    "is_torch_tensor", "any_torch_tensors", "call_kernel_via_torch", "extract_input_shapes",
    "get_or_register_torch_op", "call_kernel_via_torch_compile", "differentiable_kernel",
]
