"""``differentiable_kernel``: a forward/backward kernel pair as a ``torch.autograd.Function``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from pyptx.errors import SpecError
from pyptx.source import where

__all__ = ["differentiable_kernel"]


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def differentiable_kernel(
    forward_kernel: Any,
    backward_kernel: Any,
    *,
    save_for_backward: Sequence[int] | None = None,
    num_grad_inputs: int | None = None,
) -> Callable[..., Any]:
    """Wrap a forward + backward pyptx kernel pair for ``torch.autograd``.

    The backward kernel is called with ``(*saved_tensors, *grad_outputs)`` and
    must return one gradient per differentiable input (the first
    ``num_grad_inputs`` inputs; all of them by default). ``save_for_backward``
    lists the forward-input indices to save (all inputs by default).
    """
    at = where()
    for what, k in (("forward_kernel", forward_kernel), ("backward_kernel", backward_kernel)):
        if not hasattr(k, "in_specs") or not hasattr(k, "out_specs"):
            raise SpecError(f"{at}: differentiable_kernel {what} must be a pyptx Kernel "
                            f"(made by @kernel(...)), got {k!r}")
    n_in = len(forward_kernel.in_specs)
    try:
        saved_idx = tuple(range(n_in)) if save_for_backward is None else tuple(save_for_backward)
    except TypeError:
        raise SpecError(f"{at}: save_for_backward must be a sequence of input indices, got "
                        f"{save_for_backward!r}") from None
    for i in saved_idx:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_in:
            raise SpecError(
                f"{at}: save_for_backward index {i!r} is not an input index of "
                f"{forward_kernel.name} (expected ints in 0..{n_in - 1}; it has {n_in} inputs: "
                f"{', '.join(forward_kernel.arg_names[:n_in])})"
            )
    n_grad = n_in if num_grad_inputs is None else num_grad_inputs
    if isinstance(n_grad, bool) or not isinstance(n_grad, int) or not 0 < n_grad <= n_in:
        raise SpecError(f"{at}: num_grad_inputs must be an int in 1..{n_in}, got "
                        f"{num_grad_inputs!r}")
    n_bwd = len(backward_kernel.in_specs)
    n_fwd_out = len(forward_kernel.out_specs)
    if n_bwd != len(saved_idx) + n_fwd_out:
        raise SpecError(
            f"{at}: {backward_kernel.name} takes {n_bwd} inputs, but backward passes "
            f"{len(saved_idx)} saved tensors + {n_fwd_out} output gradients"
        )
    if len(backward_kernel.out_specs) != n_grad:
        raise SpecError(
            f"{at}: {backward_kernel.name} returns {len(backward_kernel.out_specs)} tensors, expected "
            f"one gradient for each of the {n_grad} differentiable inputs"
        )

    class Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *inputs: torch.Tensor) -> Any:
            ctx.save_for_backward(*(inputs[i] for i in saved_idx))
            return forward_kernel(*inputs)

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor) -> Any:
            grads = tuple(g.contiguous() for g in grads)
            out = _as_tuple(backward_kernel(*ctx.saved_tensors, *grads))
            return out + (None,) * (n_in - n_grad)

    Op.__name__ = f"{forward_kernel.name}_autograd"

    def call(*inputs: torch.Tensor) -> Any:
        return Op.apply(*inputs)

    call.__name__ = forward_kernel.name
    call.__doc__ = f"{forward_kernel.name} with autograd through {backward_kernel.name}."
    return call
