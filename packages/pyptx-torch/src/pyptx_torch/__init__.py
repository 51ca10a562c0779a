"""PyTorch runtime for pyptx kernels; ``pyptx.torch_support`` re-exports this API.

Importing ``pyptx_torch`` itself does not import torch; the launch paths do.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

__all__ = [
    "any_torch_tensors",
    "call_kernel_via_torch",
    "call_kernel_via_torch_compile",
    "differentiable_kernel",
    "extract_input_shapes",
    "get_or_register_torch_op",
    "is_torch_tensor",
]

_LAZY = {
    "call_kernel_via_torch": "eager",
    "get_or_register_torch_op": "compiled",
    "call_kernel_via_torch_compile": "compiled",
    "differentiable_kernel": "autograd",
}


def is_torch_tensor(obj: Any) -> bool:
    """Return True iff ``obj`` is a torch tensor; False when torch is not installed."""
    # No tensor can exist before torch is imported, so never import it here.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def any_torch_tensors(inputs: Iterable[Any]) -> bool:
    """Return True if any of ``inputs`` is a torch tensor."""
    return any(is_torch_tensor(x) for x in inputs)


def extract_input_shapes(inputs: Iterable[Any]) -> list[tuple[int, ...]]:
    """Return the concrete shape of each input tensor, in order."""
    shapes = []
    for index, x in enumerate(inputs):
        if not is_torch_tensor(x):
            from pyptx.errors import SpecError

            raise SpecError(
                f"input {index}: expected a torch.Tensor, got "
                f"{type(x).__module__}.{type(x).__qualname__}"
            )
        shapes.append(tuple(int(d) for d in x.shape))
    return shapes


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'pyptx_torch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value
