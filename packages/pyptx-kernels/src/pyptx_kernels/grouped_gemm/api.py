"""``grouped_mm``: the grouped GEMM (``torch._grouped_mm``'s 2-D ``a`` x 3-D ``b`` with
``offs``) for torch tensors (custom op ``pyptx::grouped_mm`` with autograd) and JAX arrays."""

from __future__ import annotations

import sys

from pyptx.errors import ConfigError, ShapeError, SpecError
from pyptx_kernels import _common
from pyptx_kernels._common import dtype_name, fail, framework


def _check(a, b, offs, out_dtype, launch=True):
    """Validate; return the output dtype name."""
    who = "grouped_mm"
    if len(a.shape) != 2 or len(b.shape) != 3 or len(offs.shape) != 1:
        raise fail(ShapeError, who, f"expects a (M, K), b (G, K, N) and offs (G,), got "
                   f"{tuple(a.shape)}, {tuple(b.shape)} and {tuple(offs.shape)}")
    M, K = a.shape
    G, Kb, N = b.shape
    if Kb != K or offs.shape[0] != G:
        raise fail(ShapeError, who, f"a is {M}x{K}, b holds {G} groups of {Kb}x{N} and offs "
                   f"has {offs.shape[0]} entries")
    for x, what in ((a, "a"), (b, "b")):
        if dtype_name(x.dtype) != "bf16":
            raise fail(SpecError, who, f"{what} must be bfloat16, got {x.dtype}")
    if dtype_name(offs.dtype) != "s32":
        raise fail(SpecError, who, f"offs must be int32, got {offs.dtype}")
    out = "bf16" if out_dtype is None else dtype_name(out_dtype)
    if out not in ("bf16", "f32"):
        raise fail(ConfigError, who, f"out_dtype must be bfloat16 or float32, got {out_dtype!r}")
    if len({framework(a), framework(b), framework(offs)}) > 1:
        raise fail(SpecError, who, "inputs must all be torch tensors or all JAX arrays")
    if launch:
        _common.check_devices(who, a, b, offs)
    return out


def grouped_mm(a, b, offs, *, out_dtype=None):
    """``out[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g]``: ``a (M, K)`` bf16, ``b
    (G, K, N)`` bf16 (a transposed view of a ``(G, N, K)`` tensor is read K-major), ``offs
    (G,)`` int32 cumulative row ends; returns ``(M, N)`` in ``out_dtype`` (bf16 default, or
    f32); rows past ``offs[-1]`` are unspecified. torch: ``torch.ops.pyptx.grouped_mm``,
    differentiable in ``a`` and ``b``; JAX: ``grouped_gemm.host.grouped_mm``."""
    out = _check(a, b, offs, out_dtype)
    if framework(a) != "torch":
        return _grouped(a, b, offs, out)
    _define()
    return _common.call_op("grouped_mm", a, b, offs, out)


def _grouped(a, b, offs, out):
    """The forward launch (``grouped_gemm.host.grouped_mm``), autograd off."""
    from pyptx_kernels.grouped_gemm import host

    if framework(a) != "torch":
        return host.grouped_mm(a, b, offs, out_dtype=out)
    import torch

    with torch.no_grad():
        d = host.grouped_mm(a, b, offs, out_dtype=out)
    return d if d.is_contiguous() else d.contiguous()


def _grouped_backward(grad, a, b, offs):
    """``(da, db)``, ``db`` in ``b``'s strides: ``GroupedBackward``'s two kernels (the grouped
    GEMM on ``b`` in the other major order, then the weight gradient) on the operands
    zero-padded as the forward pads them (K and N to multiples of 8), cropped back."""
    import torch
    import torch.nn.functional as F

    from pyptx_kernels.grouped_gemm import host

    M, K = a.shape
    G, _, N = b.shape
    bt = b.transpose(-2, -1)
    k_major = not b.is_contiguous() and bt.is_contiguous()
    pk, pn = -K % 8, -N % 8

    def pad(t, *widths):
        return F.pad(t, widths) if any(widths) else t

    stored = pad(bt, 0, pk, 0, pn) if k_major else pad(b, 0, pn, 0, pk)
    op = host.grouped_op(M, N + pn, K + pk, G, "K" if k_major else "MN",
                           dtype_name(grad.dtype))
    with torch.no_grad():
        da, db = op.backward_kernel(pad(a, 0, pk).contiguous(), stored.contiguous(), offs,
                                    pad(grad, 0, pn).contiguous())
    if pk or pn:
        da = da[:, :K].contiguous()
        db = (db[:, :N, :K] if k_major else db[:, :K, :N]).contiguous()
    return da, (db.transpose(-2, -1) if k_major else db)


def _empty_like(b):
    """An empty tensor of ``b``'s shape and strides (the backward's ``db`` keeps them)."""
    import torch

    return torch.empty_like(b)


def _fake(a, b, offs, out_dtype):
    return a.new_empty((a.shape[0], b.shape[2]), dtype=_common.torch_dtype(out_dtype))


def _setup(ctx, inputs, output):
    a, b, offs, _ = inputs
    ctx.save_for_backward(a, b, offs)


def _grad(ctx, grad):

    a, b, offs = ctx.saved_tensors
    da, db = _common.call_op("grouped_mm_backward", grad, a, b, offs)
    return da, db, None, None


@_common.defines_ops
def _define():
    """Define ``pyptx::grouped_mm`` and ``pyptx::grouped_mm_backward``."""
    _common.torch_op("grouped_mm_backward",
                     "(Tensor grad, Tensor a, Tensor b, Tensor offs) -> (Tensor, Tensor)",
                     lambda *x: _grouped_backward(*x),
                     lambda grad, a, b, offs: (a.new_empty(a.shape), _empty_like(b)))
    _common.torch_op("grouped_mm", "(Tensor a, Tensor b, Tensor offs, str out_dtype) -> Tensor",
                     lambda *x: _grouped(*x), _fake, _grad, _setup)
    return True

if "torch" in sys.modules:   # a torch user: define the ops before any trace reaches them
    _define()


def _kernels_grouped_mm(a, b, offs, *, out_dtype=None):
    """The forward kernel (K and N padded to multiples of 8 as the launch does), and the
    backward's where a torch input requires grad."""
    from pyptx_kernels.grouped_gemm import host

    out = _check(a, b, offs, out_dtype, launch=False)
    M, K = a.shape
    G, _, N = b.shape
    k_major = framework(b) == "torch" and not b.is_contiguous() and \
        b.transpose(-2, -1).is_contiguous()
    op = host.grouped_op(M, N + -N % 8, K + -K % 8, G, "K" if k_major else "MN", out)
    if framework(a) == "torch" and _common.wants_grad(a, b):
        return [op.forward_kernel, op.backward_kernel]
    return op.forward_kernel


_kernels = {"grouped_mm": _kernels_grouped_mm}
