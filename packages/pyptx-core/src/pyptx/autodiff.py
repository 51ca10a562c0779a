"""``differentiable_kernel``: a forward/backward kernel pair as one differentiable operation.

The same object works with every runtime: called on torch tensors it is a
``torch.autograd.Function``, on JAX arrays a ``jax.custom_vjp`` function. Core
checks the pairing and picks the runtime that owns the arguments; the
runtime's plugin supplies the framework glue (``Runtime.differentiable(op)``).

The backward kernel is called with ``(*saved inputs, *saved outputs, *output
gradients)`` (``save_outputs``: forward outputs it needs, e.g. attention's
log-sum-exp; none by default) and returns one gradient for each of the first
``num_grad_inputs`` inputs; the other inputs get no gradient (zero).

Under ``jax.vmap`` both kernels are batched like any pyptx call: sequentially,
one launch per batch element (``vmap_method="sequential"`` of the custom call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .errors import SpecError
from .runtimes import load, loaded, preload, runtime_for
from .source import where

__all__ = ["DifferentiableKernel", "differentiable_kernel"]

#: What a kernel-like callable (``Kernel``, or e.g. two kernels run in turn) must have.
_KERNEL_LIKE = ("in_specs", "out_specs", "name", "arg_names")


class DifferentiableKernel:
    """A forward kernel whose gradient is the backward kernel; call it like the forward one."""

    def __init__(self, forward_kernel: Any, backward_kernel: Any, *,
                 save_for_backward: Sequence[int] | None = None,
                 num_grad_inputs: int | None = None,
                 save_outputs: Sequence[int] | None = None) -> None:
        at = where()
        for what, k in (("forward_kernel", forward_kernel), ("backward_kernel", backward_kernel)):
            if not (callable(k) and all(hasattr(k, a) for a in _KERNEL_LIKE)):
                raise SpecError(f"{at}: {what} must be a pyptx Kernel (made by @kernel) or "
                                f"behave like one ({', '.join(_KERNEL_LIKE)}), got {k!r}")
        n_in = len(forward_kernel.in_specs)
        if save_for_backward is None:
            saved = tuple(range(n_in))
        elif isinstance(save_for_backward, (str, bytes)) or not isinstance(
                save_for_backward, Iterable):
            raise SpecError(f"{at}: save_for_backward must be a sequence of input indices, "
                            f"got {save_for_backward!r}")
        else:
            saved = tuple(save_for_backward)
        inputs = ", ".join(forward_kernel.arg_names[:n_in])
        for i in saved:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_in:
                raise SpecError(f"{at}: save_for_backward index {i!r} is not an input index of "
                                f"{forward_kernel.name} (it has {n_in} inputs: {inputs})")
        n_grad = n_in if num_grad_inputs is None else num_grad_inputs
        if isinstance(n_grad, bool) or not isinstance(n_grad, int) or not 0 < n_grad <= n_in:
            raise SpecError(f"{at}: num_grad_inputs must be an int in 1..{n_in}, "
                            f"got {num_grad_inputs!r}")
        n_out = len(forward_kernel.out_specs)
        if save_outputs is None:
            saved_out: tuple[int, ...] = ()
        elif isinstance(save_outputs, (str, bytes)) or not isinstance(save_outputs, Iterable):
            raise SpecError(f"{at}: save_outputs must be a sequence of output indices, "
                            f"got {save_outputs!r}")
        else:
            saved_out = tuple(save_outputs)
        outputs = ", ".join(forward_kernel.arg_names[n_in:n_in + n_out])
        for i in saved_out:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_out:
                raise SpecError(f"{at}: save_outputs index {i!r} is not an output index of "
                                f"{forward_kernel.name} (it has {n_out} outputs: {outputs})")
        n_bwd = len(backward_kernel.in_specs)
        if n_bwd != len(saved) + len(saved_out) + n_out:
            kept = f" + {len(saved_out)} saved outputs" if saved_out else ""
            raise SpecError(f"{at}: {backward_kernel.name} takes {n_bwd} inputs, but backward "
                            f"passes {len(saved)} saved tensors{kept} + {n_out} output gradients")
        if len(backward_kernel.out_specs) != n_grad:
            raise SpecError(
                f"{at}: {backward_kernel.name} returns {len(backward_kernel.out_specs)} tensors, "
                f"expected one gradient for each of the {n_grad} differentiable inputs")
        #: The forward and backward ``Kernel``.
        self.forward_kernel, self.backward_kernel = forward_kernel, backward_kernel
        #: Indices of the forward inputs the backward kernel receives first.
        self.saved = saved
        #: Indices of the forward outputs the backward kernel receives after the saved inputs.
        self.saved_outputs = saved_out
        #: How many leading inputs get a gradient.
        self.num_grad_inputs = n_grad
        self.__name__ = forward_kernel.name
        self.__doc__ = f"{forward_kernel.name} with gradients through {backward_kernel.name}."
        self._glue: dict[Any, Callable[..., Any]] = {}
        # The glue of the runtimes whose framework is imported is made now, outside any graph
        # compiler that might trace the first call.
        preload()
        for name, rt in loaded().items():
            if getattr(rt, "differentiable", None) is not None:
                self._glue[name] = rt.differentiable(self)

    def __call__(self, *inputs: Any) -> Any:
        """Run the forward kernel, differentiably, through the runtime that owns ``inputs``."""
        glue = self._glue.get(inputs[0].__class__) if inputs else None
        if glue is None:
            glue = self.for_runtime(runtime_for(inputs).name)
            self._glue[inputs[0].__class__] = glue
        return glue(*inputs)

    def for_runtime(self, name: str) -> Callable[..., Any]:
        """The differentiable callable of runtime ``name`` (built once by its plugin)."""
        glue = self._glue.get(name)
        if glue is None:
            rt = load(name)
            make = getattr(rt, "differentiable", None)
            if make is None:
                raise SpecError(f"{where()}: the {name} runtime has no gradient support "
                                "(its plugin defines no differentiable())")
            glue = self._glue[name] = make(self)
        return glue

    def __repr__(self) -> str:
        return (f"<pyptx.DifferentiableKernel {self.forward_kernel.name} "
                f"backward={self.backward_kernel.name} saved={list(self.saved)}"
                + (f" saved_outputs={list(self.saved_outputs)}" if self.saved_outputs else "")
                + ">")


def differentiable_kernel(forward_kernel: Any, backward_kernel: Any, *,
                          save_for_backward: Sequence[int] | None = None,
                          num_grad_inputs: int | None = None,
                          save_outputs: Sequence[int] | None = None) -> DifferentiableKernel:
    """Wrap a forward + backward pyptx kernel pair for autograd (torch) and ``jax.grad``.

    The backward kernel is called with ``(*saved_inputs, *saved_outputs,
    *grad_outputs)`` and must return one gradient per differentiable input (the
    first ``num_grad_inputs`` inputs; all of them by default). ``save_for_backward``
    lists the forward-input indices to save (all inputs by default);
    ``save_outputs`` the forward-output indices to save (none by default), e.g.
    ``[0, 1]`` for an attention forward whose backward needs ``o`` and the
    log-sum-exp. Every output still receives its gradient (zeros for an output
    that did not reach the loss).
    """
    return DifferentiableKernel(forward_kernel, backward_kernel,
                                save_for_backward=save_for_backward,
                                num_grad_inputs=num_grad_inputs, save_outputs=save_outputs)
