"""Inductor calls a single-output kernel's launcher directly (on unless ``PYPTX_TORCH_DIRECT=0``).

Without this, inductor's generated code calls ``pyptx::launch<n>`` as a fallback kernel:
``buf1 = torch.ops.pyptx.launch2.default(buf0, arg1_1, 'uid')`` then
``assert_size_stride(buf1, ...)``. That line pays ``OpOverload.__call__``, torch's
Python->op argument parsing (schema, boxing, a new string for the variant), the
dispatcher (Autograd kernel, redispatch) and the size assert before our C++ plan runs.
A ``torch.library.triton_op`` pays none of these: inductor inlines its Triton launch.

Unless ``PYPTX_TORCH_DIRECT=0`` is set when ``pyptx_torch.compiled`` is imported, a lowering
for ``pyptx::launch1`` .. ``launch4``, registered when the first graph with a pyptx kernel is
traced (importing inductor costs seconds: never at import or on an eager call), makes
inductor write
``buf1 = torch.ops.pyptx._direct(buf0, arg1_1, 'uid')`` instead: one C call
(``pyptx_torch._fastpath.direct``) that launches through the variant's bound plan,
or, when none takes the inputs (first call, new shape, poisoning, no extension), calls
the op itself, so errors and first-call binding are the op's. The output is the plan's
freshly allocated contiguous tensor, as the op's is; only the per-call size assert goes
(the plan only launches for the exact shapes it was built for).

Inductor's lowering API is private; anything unexpected (the C++ wrapper, symbolic
shapes, an inductor without the hooks used here) falls back to the ordinary fallback kernel.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["ENABLED", "DIRECT_NAME", "direct_call", "expose", "install_lowerings",
           "ensure_lowerings"]

#: Whether inductor should call kernels directly (read once, at import; measured 0.59x a
#: ``triton_op`` call's marginal cost in a compiled fn against 1.14x without it, H100).
ENABLED = os.environ.get("PYPTX_TORCH_DIRECT", "1") != "0"
#: How inductor's generated code names the direct launcher.
DIRECT_NAME = "torch.ops.pyptx._direct"

_installed: list[bool] = []


def direct_call(*args: Any) -> torch.Tensor:
    """``pyptx::launch<n>(*tensors, variant)`` through the op (the launcher without the
    extension, and what the extension's direct launcher calls when no plan matches)."""
    from .compiled import _FIXED

    return _FIXED[len(args) - 1](*args)


def expose() -> None:
    """Make ``DIRECT_NAME`` resolve (always, so code inductor cached with the option on
    still runs in a process without it): the extension's launcher, else ``direct_call``."""
    from .fastpath import FASTPATH

    launcher: Any = direct_call
    if FASTPATH is not None and hasattr(FASTPATH, "direct"):
        FASTPATH.set_direct_fallback(direct_call)
        launcher = FASTPATH.direct
    torch.ops.pyptx._direct = launcher


def ensure_lowerings(max_fixed: int) -> None:
    """Register the lowerings once, if ``ENABLED``: called by the ops' fake kernels, so
    while a graph is traced."""
    if ENABLED and not _installed:
        install_lowerings(max_fixed)


def install_lowerings(max_fixed: int) -> bool:
    """Register the lowerings of ``pyptx::launch1`` .. ``launch<max_fixed>`` (once); False
    when this inductor lacks what they need (the fallback kernel stays)."""
    if _installed:
        return _installed[0]
    try:
        from torch._inductor import ir
        from torch._inductor.lowering import fallback_handler, register_lowering
        from torch._inductor.virtualized import V
    except ImportError:
        _installed.append(False)
        return False

    class DirectLaunch(ir.ExternKernelAlloc):
        """``name = torch.ops.pyptx._direct(*inputs, variant)``: no size assert."""

        def codegen(self, wrapper: Any) -> None:
            wrapper.writeline(f"{self.get_name()} = {DIRECT_NAME}({', '.join(self.codegen_args())})")

    def lowering(op: Any) -> Any:
        default = fallback_handler(op, add_to_fallback_set=False)

        def lower(*args: Any) -> Any:
            *tensors, variant = args
            node = V.graph.current_node
            val = node.meta.get("val") if node is not None else None
            ins = [a.meta.get("val") for a in node.args[:-1]] if node is not None else []
            plain = (isinstance(val, torch.Tensor) and not V.graph.cpp_wrapper
                     and len(ins) == len(tensors)
                     and all(isinstance(t, torch.Tensor) for t in (val, *ins))
                     and all(type(d) is int for t in (val, *ins) for d in (*t.shape, *t.stride())))
            if not plain:
                return default(*args)
            inputs = []
            for t, fake in zip(tensors, ins):
                t = ir.ExternKernel.realize_input(t)
                # the strides the op saw while tracing, as the fallback kernel keeps them
                inputs.append(ir.ExternKernel.require_exact_strides(t, fake.stride())
                              if hasattr(ir.ExternKernel, "require_exact_strides")
                              else ir.ExternKernel.require_contiguous(t))
            layout = ir.FixedLayout(val.device, val.dtype, list(val.shape), list(val.stride()))
            return ir.TensorBox.create(DirectLaunch(layout, inputs, (variant,)))

        return lower

    for n in range(1, max_fixed + 1):
        op = getattr(torch.ops.pyptx, f"launch{n}").default
        register_lowering(op, type_promotion_kind=None)(lowering(op))
    _installed.append(True)
    return True
