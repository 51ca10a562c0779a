"""JAX glue of ``pyptx.differentiable_kernel``: the pair as a ``jax.custom_vjp`` function.

The forward kernel runs in the primal and forward passes, the backward kernel
in the VJP (residuals: the saved inputs, then the saved outputs); inputs past ``num_grad_inputs`` get a zero cotangent. Under
``jax.vmap`` both kernels are batched sequentially, like any pyptx call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["custom_vjp_function"]


def custom_vjp_function(op: Any) -> Callable[..., Any]:
    """``op`` (a ``pyptx.autodiff.DifferentiableKernel``) as a ``jax.custom_vjp`` function."""
    import jax

    forward_kernel, backward_kernel = op.forward_kernel, op.backward_kernel
    saved_idx = op.saved
    saved_out = getattr(op, "saved_outputs", ())
    n_in = len(forward_kernel.in_specs)
    n_grad = op.num_grad_inputs
    single = len(forward_kernel.out_specs) == 1

    @jax.custom_vjp
    def call(*inputs: Any) -> Any:
        return forward_kernel(*inputs)

    def forward(*inputs: Any) -> tuple[Any, tuple[Any, ...]]:
        out = forward_kernel(*inputs)
        outs = (out,) if single else tuple(out)
        return out, tuple(inputs[i] for i in saved_idx) + tuple(outs[i] for i in saved_out)

    def backward(saved: tuple[Any, ...], grads: Any) -> tuple[Any, ...]:
        grads = (grads,) if single else tuple(grads)
        out = backward_kernel(*saved, *grads)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        return out + (None,) * (n_in - n_grad)

    call.defvjp(forward, backward)
    return call
