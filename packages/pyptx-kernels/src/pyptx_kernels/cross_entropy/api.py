"""``linear_cross_entropy``: the cross-entropy of a linear layer's output (a language model's
head) without its logits, for torch tensors (the custom op ``pyptx::linear_cross_entropy``
with autograd)."""

from __future__ import annotations

import math
import sys

from pyptx.errors import ConfigError, ShapeError, SpecError
from pyptx_kernels import _common
from pyptx_kernels._common import fail, framework
from pyptx_kernels.cross_entropy.config import DEFAULT, MAX_VOCAB, CrossEntropyConfig

REDUCTIONS = ("mean", "sum")
WHO = "linear_cross_entropy"


def linear_cross_entropy(x, weight, target, *, bias=None, ignore_index=-100,
                         label_smoothing=0.0, z_loss=0.0, reduction="mean", config=None):
    """``F.cross_entropy(F.linear(x, weight, bias), target, ignore_index=...,
    label_smoothing=..., reduction=...)`` (+ ``z_loss * logsumexp(logits)**2``, reduced like
    the loss over the non-ignored tokens, as PaLM's z-loss), never holding all the logits.

    ``x (..., H)`` bfloat16, ``weight (V, H)`` and ``bias (V,)`` of ``x``'s dtype, ``target``
    integer of shape ``x.shape[:-1]``; ``V`` up to ``2**20``. The tokens are walked in chunks
    (``config``: a ``CrossEntropyConfig``; by default as many tokens as keep one chunk's
    logits within 1 GiB): per chunk one GEMM for the logits, one row kernel for the loss
    and, in place, the logits' gradient, and the two GEMMs of ``x``'s and ``weight``'s
    gradients, so the backward is formed in the forward (where an input requires grad) and
    the autograd backward only scales it. Returns an f32 scalar. ``reduction`` is ``"mean"``
    (over non-ignored tokens) or ``"sum"``. torch: ``torch.ops.pyptx.linear_cross_entropy``,
    differentiable in ``x``, ``weight`` and ``bias``."""
    _check(x, weight, target, bias, ignore_index, label_smoothing, z_loss, reduction, config)
    c = DEFAULT if config is None else config
    x2 = x.reshape(-1, x.shape[-1])
    t2 = target.reshape(-1)
    _define()
    need = [_common.wants_grad(v) for v in (x, weight, bias)]
    chunk = c.chunk(x2.shape[0], weight.shape[0], x.element_size())
    loss, *_ = _common.call_op("linear_cross_entropy",
        x2, weight, t2, bias, int(ignore_index), float(label_smoothing), float(z_loss),
        reduction, *need, chunk, c.threads, c.unroll)
    return loss


def _check(x, weight, target, bias, ignore_index, label_smoothing, z_loss, reduction, config):
    if framework(x) != "torch":
        raise fail(SpecError, WHO, "takes torch tensors")
    if len(x.shape) < 1 or len(weight.shape) != 2 or weight.shape[1] != x.shape[-1]:
        raise fail(ShapeError, WHO, f"x must be (..., H) and weight (V, H), got "
                   f"{tuple(x.shape)} and {tuple(weight.shape)}")
    V = weight.shape[0]
    if not 1 <= V <= MAX_VOCAB:
        raise fail(ConfigError, WHO, f"vocabularies of 1 to {MAX_VOCAB} entries, got V = {V}")
    if str(x.dtype) != "torch.bfloat16" or weight.dtype != x.dtype:
        raise fail(SpecError, WHO, f"x and weight must be bfloat16, got {x.dtype} and "
                   f"{weight.dtype}")
    if bias is not None and (tuple(bias.shape) != (V,) or bias.dtype != x.dtype):
        raise fail(ShapeError, WHO, f"bias must be ({V},) bfloat16, got {tuple(bias.shape)} "
                   f"{bias.dtype}")
    if tuple(target.shape) != tuple(x.shape[:-1]) or target.dtype.is_floating_point \
            or target.dtype.is_complex or str(target.dtype) == "torch.bool":
        raise fail(ShapeError, WHO, f"target must be integer of shape {tuple(x.shape[:-1])}, "
                   f"got {target.dtype} of shape {tuple(target.shape)}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise fail(ConfigError, WHO, f"ignore_index must be an int, got {ignore_index!r}")
    for name, v, hi in (("label_smoothing", label_smoothing, 1.0), ("z_loss", z_loss, math.inf)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= hi \
                or not math.isfinite(v):
            raise fail(ConfigError, WHO, f"{name} must be a finite number in [0, {hi}], "
                       f"got {v!r}")
    if reduction not in REDUCTIONS:
        raise fail(ConfigError, WHO, f"reduction must be one of {REDUCTIONS} (the gradient is "
                   f"formed in the forward with one scale), got {reduction!r}")
    if config is not None and not isinstance(config, CrossEntropyConfig):
        raise fail(ConfigError, WHO, f"config must be a CrossEntropyConfig, got {config!r}")
    _common.check_devices(WHO, x, weight, target, bias)


# ------------------------------------------------------------------------------ torch op
def _impl(x, weight, target, bias, ignore_index, label_smoothing, z_loss, reduction, need_x,
          need_w, need_b, chunk, threads, unroll):
    from pyptx_kernels.cross_entropy import host

    return host.forward(x, weight, target, bias, ignore_index, label_smoothing, z_loss,
                        reduction, need_x, need_w, need_b, chunk, threads, unroll)


def _fake(x, weight, target, bias, ignore_index, label_smoothing, z_loss, reduction, need_x,
          need_w, need_b, chunk, threads, unroll):
    import torch

    def like(t, need):
        return t.new_empty(t.shape) if need else x.new_empty((0,))

    return (x.new_empty((), dtype=torch.float32), like(x, need_x), like(weight, need_w),
            like(bias, need_b) if bias is not None else x.new_empty((0,)))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*output[1:])
    ctx.need = inputs[8:11]


def _backward(ctx, grad, *_):
    gx, gw, gb = ctx.saved_tensors
    need_x, need_w, need_b = ctx.need
    scaled = [(grad * g).to(g.dtype) if n else None for g, n in ((gx, need_x), (gw, need_w),
                                                                 (gb, need_b))]
    return scaled[0], scaled[1], None, scaled[2], *([None] * 10)


@_common.defines_ops
def _define():
    """Define ``pyptx::linear_cross_entropy``."""
    _common.torch_op(
        "linear_cross_entropy",
        "(Tensor x, Tensor weight, Tensor target, Tensor? bias, int ignore_index, "
        "float label_smoothing, float z_loss, str reduction, bool need_x, bool need_w, "
        "bool need_b, int chunk, int threads, int unroll) -> (Tensor, Tensor, Tensor, Tensor)",
        _impl, _fake, _backward, _setup)
    return True


if "torch" in sys.modules:   # a torch user: define the ops before any trace reaches them
    _define()


# ------------------------------------------------------------------------ kernels (ptx())
def _kernels_linear_cross_entropy(x, weight, target, *, bias=None, ignore_index=-100,
                                  label_smoothing=0.0, z_loss=0.0, reduction="mean",
                                  config=None):
    from pyptx_kernels.cross_entropy import host

    c = DEFAULT if config is None else config
    T = math.prod(x.shape[:-1])
    chunk = c.chunk(T, weight.shape[0], 2)
    grad = _common.wants_grad(x, weight, bias)
    return host._row_kernel(chunk, weight.shape[0], "bf16", int(ignore_index),
                            float(label_smoothing), float(z_loss), grad, c.threads, c.unroll)


_kernels = {"linear_cross_entropy": _kernels_linear_cross_entropy}
