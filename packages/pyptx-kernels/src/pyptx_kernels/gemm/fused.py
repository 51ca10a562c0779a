"""GEMMs with a fused epilogue for transformer blocks (torch): ``swiglu_linear`` (one GEMM
over interleaved gate and up weights whose epilogue writes ``silu(x @ Wg^T) * (x @ Wu^T)``)
and ``linear_residual`` (``x @ W^T + residual`` in the epilogue). Each is a custom op
``torch.ops.pyptx.<name>`` with a fake implementation and autograd."""

from __future__ import annotations

import sys

from pyptx.errors import ShapeError, SpecError
from pyptx_kernels import _common
from pyptx_kernels._common import dtype_name, fail, framework
from pyptx_kernels.gemm.config import GATE_BLOCK, GemmConfig


def pack_gated(gate_weight, up_weight):
    """The ``(2 * I, H)`` weight ``swiglu_linear`` reads: ``gate_weight`` and ``up_weight``
    (each ``(I, H)``, ``I`` a multiple of 64) interleaved in blocks of 64 rows (gate block 0,
    up block 0, gate block 1, ...)."""
    if tuple(gate_weight.shape) != tuple(up_weight.shape) or len(gate_weight.shape) != 2:
        raise fail(ShapeError, "pack_gated", f"expects two (I, H) weights of one shape, got "
                   f"{tuple(gate_weight.shape)} and {tuple(up_weight.shape)}")
    inter, hidden = gate_weight.shape
    if inter % GATE_BLOCK:
        raise fail(ShapeError, "pack_gated", f"I must be a multiple of {GATE_BLOCK}, got {inter}")
    torch = sys.modules["torch"]
    blocks = torch.stack([gate_weight.reshape(-1, GATE_BLOCK, hidden),
                          up_weight.reshape(-1, GATE_BLOCK, hidden)], dim=1)
    return blocks.reshape(2 * inter, hidden).contiguous()


def unpack_gated(weight):
    """``(gate_weight, up_weight)`` of a ``pack_gated`` weight ``(2 * I, H)``."""
    n, hidden = weight.shape
    blocks = weight.reshape(n // (2 * GATE_BLOCK), 2, GATE_BLOCK, hidden)
    return blocks[:, 0].reshape(n // 2, hidden), blocks[:, 1].reshape(n // 2, hidden)


def swiglu_linear(x, weight):
    """``silu(x @ Wg^T) * (x @ Wu^T)`` in one GEMM: ``x (..., H)``, ``weight`` the
    ``(2 * I, H)`` ``pack_gated(Wg, Wu)`` (bf16/f16, ``H`` and ``I`` multiples of 64);
    returns ``(..., I)``. Differentiable in both; the backward recomputes the gate and up
    projections with one GEMM (nothing of size ``2 * I`` is kept between the passes)."""
    _check("swiglu_linear", x, weight, None)
    if weight.shape[0] % (2 * GATE_BLOCK):
        raise fail(ShapeError, "swiglu_linear", f"weight rows must be a multiple of "
                   f"{2 * GATE_BLOCK} (pack_gated), got {weight.shape[0]}")
    x2, lead = _common.rows_of(x)
    _define()
    y = _common.call_op("swiglu_linear", x2, weight)
    return y.reshape(*lead, y.shape[-1])


def linear_residual(x, weight, residual):
    """``x @ weight.T + residual`` with the add in the GEMM's epilogue: ``x (..., in)``,
    ``weight (out, in)`` bf16/f16, ``residual (..., out)`` bf16 (with bf16 inputs) or f32;
    the output has ``residual``'s dtype. Differentiable in all three."""
    _check("linear_residual", x, weight, residual)
    x2, lead = _common.rows_of(x)
    r2, _ = _common.rows_of(residual)
    _define()
    y = _common.call_op("linear_residual", x2, weight, r2)
    return y.reshape(*lead, y.shape[-1])


def _check(who, x, weight, residual):
    if framework(x) != "torch" or framework(weight) != "torch":
        raise fail(SpecError, who, f"takes torch tensors, got {type(x).__name__} and "
                   f"{type(weight).__name__}")
    if len(x.shape) < 1 or len(weight.shape) != 2 or x.shape[-1] != weight.shape[1]:
        raise fail(ShapeError, who, f"expects x (..., in) and weight (out, in), got "
                   f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if dtype_name(x.dtype) not in ("bf16", "f16") or weight.dtype != x.dtype:
        raise fail(SpecError, who, f"x and weight must both be bfloat16 or float16, got "
                   f"{x.dtype} and {weight.dtype}")
    if x.shape[-1] % 8 or weight.shape[0] % 8:
        raise fail(ShapeError, who, f"in and out features must be multiples of 8, got "
                   f"{tuple(weight.shape)}")
    if residual is not None:
        want = (*x.shape[:-1], weight.shape[0])
        if tuple(residual.shape) != want:
            raise fail(ShapeError, who, f"residual must have shape {want}, got "
                       f"{tuple(residual.shape)}")
        if dtype_name(residual.dtype) not in ("bf16", "f32") or (
                dtype_name(residual.dtype) == "bf16" and dtype_name(x.dtype) != "bf16"):
            raise fail(SpecError, who, f"residual must be bfloat16 (with bfloat16 inputs) or "
                       f"float32, got {residual.dtype}")
    _common.check_devices(who, x, weight, residual)


def _launch(x, weight, *, activation=None, residual=None):
    """The fused GEMM on 2-D ``x (M, K)``, ``weight (N, K)`` (read K-major, no copy)."""
    from pyptx_kernels.gemm import host

    M, K = x.shape
    N = weight.shape[0]
    x, weight = x.contiguous(), weight.contiguous()
    out = dtype_name(residual.dtype) if residual is not None else dtype_name(x.dtype)
    key = tuple(sorted(dict(dtype=dtype_name(x.dtype), out_dtype=out, a_major="K", b_major="K",
                            bias=False, alpha=1.0, activation=activation,
                            residual=residual is not None, KB=K, NB=N).items()))
    config = None
    if activation == "swiglu":   # the gate/up pairing needs tiles of 128 or 256 columns
        config = GemmConfig() if M > 1024 else GemmConfig(BN=128, cluster=1)
    k = host._cached(M, N, K, key, config)
    args = (x, weight) if residual is None else (x, weight, residual.contiguous())
    return k(*args)


@_common.defines_ops
def _define():
    """Define ``pyptx::swiglu_linear`` and ``pyptx::linear_residual`` (a constant for dynamo:
    a first call inside ``torch.compile`` defines them at trace time)."""
    _common.torch_op("swiglu_linear", "(Tensor x, Tensor weight) -> Tensor",
                     lambda x, w: _launch(x, w, activation="swiglu"),
                     lambda x, w: x.new_empty((x.shape[0], w.shape[0] // 2)),
                     _swiglu_backward, _save_inputs)
    _common.torch_op("linear_residual", "(Tensor x, Tensor weight, Tensor residual) -> Tensor",
                     lambda x, w, r: _launch(x, w, residual=r),
                     lambda x, w, r: r.new_empty((x.shape[0], w.shape[0])),
                     _residual_backward, _save_inputs)
    return True


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:2])


def _swiglu_backward(ctx, grad):
    import torch

    from pyptx_kernels.gemm.api import linear, matmul

    x, w = ctx.saved_tensors
    h = linear(x, w).float()                        # the gate and up projections, recomputed
    blocks = h.reshape(h.shape[0], -1, 2, GATE_BLOCK)
    g, u = blocks[:, :, 0], blocks[:, :, 1]
    sig = torch.sigmoid(g)
    gy = grad.float().reshape(g.shape)
    dg = gy * u * sig * (1 + g * (1 - sig))
    du = gy * g * sig
    dh = torch.stack([dg, du], dim=2).reshape(h.shape).to(x.dtype)
    dx = matmul(dh, w) if ctx.needs_input_grad[0] else None
    dw = matmul(dh.T, x) if ctx.needs_input_grad[1] else None
    return dx, dw


def _residual_backward(ctx, grad):
    from pyptx_kernels.gemm.api import matmul

    x, w = ctx.saved_tensors
    g = grad.to(x.dtype)
    dx = matmul(g, w) if ctx.needs_input_grad[0] else None
    dw = matmul(g.T, x) if ctx.needs_input_grad[1] else None
    return dx, dw, grad
