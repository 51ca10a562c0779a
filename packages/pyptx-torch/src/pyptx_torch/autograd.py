"""Torch glue of ``pyptx.differentiable_kernel``: the pair as a ``torch.autograd.Function``.

``differentiable_kernel`` itself is core's (one object for every runtime); the
torch runtime builds the Function below for it on the first call with tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pyptx.autodiff import differentiable_kernel

__all__ = ["differentiable_kernel", "autograd_function"]


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def autograd_function(op: Any) -> Callable[..., Any]:
    """``op`` (a ``pyptx.autodiff.DifferentiableKernel``) as a callable on tensors whose
    gradients flow through ``op.backward_kernel``."""
    forward_kernel, backward_kernel = op.forward_kernel, op.backward_kernel
    saved_idx = op.saved
    saved_out = getattr(op, "saved_outputs", ())
    n_in = len(forward_kernel.in_specs)
    n_grad = op.num_grad_inputs
    no_grads = (None,) * (n_in - n_grad)
    # the common pairing saves every input in order and no output: saved as given
    save_all = not saved_out and tuple(saved_idx) == tuple(range(n_in))

    class Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *inputs: torch.Tensor) -> Any:
            out = forward_kernel(*inputs)
            if save_all and len(inputs) == n_in:
                ctx.save_for_backward(*inputs)
            else:
                outs = _as_tuple(out)
                ctx.save_for_backward(*[inputs[i] for i in saved_idx],
                                      *[outs[i] for i in saved_out])
            return out

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor) -> Any:
            out = backward_kernel(*ctx.saved_tensors, *[g.contiguous() for g in grads])
            return (*out, *no_grads) if isinstance(out, (tuple, list)) else (out, *no_grads)

    Op.__name__ = f"{forward_kernel.name}_autograd"
    # Function.apply's Python wrapper only adds functorch handling; eager calls outside any
    # functorch transform or graph trace take the C entry point directly (about 1 us less)
    direct_apply = super(torch.autograd.Function, Op).apply
    transforms_active = torch._C._are_functorch_transforms_active
    compiling = torch.compiler.is_compiling

    def call(*inputs: torch.Tensor) -> Any:
        if transforms_active() or compiling():
            return Op.apply(*inputs)
        return direct_apply(*inputs)

    call.__name__ = forward_kernel.name
    return call
