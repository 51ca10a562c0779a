"""PyTorch runtime for pyptx kernels; ``pyptx.torch_support`` re-exports this API.

Importing this package never imports ``torch``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pyptx_torch.runtime import launch_unavailable

if TYPE_CHECKING:
    from pyptx import Tile

__all__ = [
    "any_torch_tensors",
    "call_kernel_via_torch",
    "call_kernel_via_torch_compile",
    "differentiable_kernel",
    "extract_input_shapes",
    "get_or_register_torch_op",
    "is_torch_tensor",
]


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
                f"input {index}: expected a torch.Tensor, got {type(x).__module__}.{type(x).__qualname__}"
            )
        shapes.append(tuple(int(d) for d in x.shape))
    return shapes


def call_kernel_via_torch(
    *inputs: Any,
    cubin_handle: int,
    out_specs: Sequence[Tile],
    out_shape_env: dict[str, int],
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    cluster: tuple[int, int, int] = (1, 1, 1),
    smem_bytes: int = 0,
) -> Any:
    """Launch a registered kernel on torch tensors (eager); needs the shim launcher."""
    raise launch_unavailable()


def get_or_register_torch_op(
    cubin_handle: int,
    out_specs: Sequence[Tile],
    out_shape_env: dict[str, int],
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    cluster: tuple[int, int, int],
    smem_bytes: int,
) -> Callable[..., Any]:
    """Return the ``torch.library.custom_op`` for a handle; needs the shim launcher."""
    raise launch_unavailable()


def call_kernel_via_torch_compile(
    *inputs: Any,
    cubin_handle: int,
    out_specs: Sequence[Tile],
    out_shape_env: dict[str, int],
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    cluster: tuple[int, int, int] = (1, 1, 1),
    smem_bytes: int = 0,
) -> Any:
    """Launch through a custom op that ``torch.compile`` traces; needs the shim launcher."""
    raise launch_unavailable()


def differentiable_kernel(
    forward_kernel: Any,
    backward_kernel: Any,
    *,
    save_for_backward: Sequence[int] | None = None,
    num_grad_inputs: int | None = None,
) -> Callable[..., Any]:
    """Wrap a forward/backward kernel pair for autograd; needs the shim launcher."""
    raise launch_unavailable()
