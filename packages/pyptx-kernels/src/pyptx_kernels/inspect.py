"""``ptx(fn, *args, **kwargs)``: the PTX of every kernel a library call would launch."""

from __future__ import annotations

import importlib

from pyptx_kernels._common import fail


def kernels(fn, *args, **kwargs) -> dict:
    """``{name: kernel}`` of the kernels ``fn(*args, **kwargs)`` would launch (with its
    backward's where a torch input requires grad), without launching. ``fn``'s module holds
    ``_kernels``: a dict from public function names to functions taking ``fn``'s arguments,
    or one function taking the name first; either returns kernels (a ``Kernel``, a
    ``TunedKernel`` (its untuned first config), a kernel-like object with ``.kernels``, or
    a tuple/list/dict of those)."""
    from pyptx.errors import ConfigError

    name = getattr(fn, "__name__", None)
    module = getattr(fn, "__module__", None) or ""
    table = getattr(importlib.import_module(module), "_kernels", None) \
        if module.startswith("pyptx_kernels.") else None
    if isinstance(table, dict) and name in table:
        found = table[name](*args, **kwargs)
    elif callable(table) and not isinstance(table, dict):
        found = table(name, *args, **kwargs)
    else:
        raise fail(ConfigError, "ptx", f"{fn!r} is not a pyptx_kernels function with kernels")
    out: dict = {}
    _collect(found, out)
    return out


def ptx(fn, *args, **kwargs) -> dict[str, str]:
    """``{kernel name: PTX text}`` of every kernel ``fn(*args, **kwargs)`` would launch for
    these arguments (``fn`` a ``pyptx_kernels`` function). Nothing launches: the arguments
    may be CPU or ``device="meta"`` torch tensors or ``jax.ShapeDtypeStruct``s. A tuned
    kernel gives the PTX of the plan a default call takes on the current device (a winner
    saved in this process, else the shipped table's or the heuristic's plan;
    ``PYPTX_AUTOTUNE=0``: the first configuration)."""
    return {k: v.ptx() for k, v in kernels(fn, *args, **kwargs).items()}


def _collect(value, out: dict) -> None:
    from pyptx.autotune import TunedKernel
    from pyptx.kernel import Kernel

    if isinstance(value, TunedKernel):
        value = value.kernel
    if isinstance(value, Kernel):
        if any(k is value for k in out.values()):
            return
        name = value.name
        out[name if name not in out else f"{name}#{len(out)}"] = value
    elif isinstance(value, dict):
        for v in value.values():
            _collect(v, out)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _collect(v, out)
    elif value is None:
        return
    elif hasattr(value, "kernels"):
        _collect(tuple(value.kernels), out)
    elif hasattr(value, "forward_kernel"):   # a pyptx.differentiable_kernel
        _collect(value.forward_kernel, out)
    else:
        raise TypeError(f"not a kernel: {value!r}")
