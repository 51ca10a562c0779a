"""``rms_norm``, ``layer_norm``, ``softmax`` and ``swiglu`` over the last dimension, for torch
tensors (custom ops ``pyptx::<name>`` with autograd) and JAX arrays (forward kernels).

The row kernels take ``(B, N)``: the leading dimensions are flattened into ``B`` and the
result is shaped back. Backward: the library's ``build_rms_norm_bwd``,
``build_layer_norm_bwd`` and ``build_swiglu_backward`` kernels; softmax has no backward
kernel, so its backward op is torch's elementwise ops in f32."""

from __future__ import annotations

import functools
import math
import sys

from pyptx.errors import ConfigError, ShapeError, SpecError
from pyptx_kernels import _common
from pyptx_kernels._common import dtype_name, fail, framework
from pyptx_kernels.rows.config import DEFAULT_ARCH, device_arch

MAX_N = 32768       # the forward kernels' longest row (pyptx.rows.MAX_N)
MAX_N_BWD = 8192    # the norms' backward kernels' (pyptx.rows.MAX_N_BWD)


def _fast_dtype(x, others, max_n):
    """``"f32"``/``"bf16"`` when ``x (..., N)`` with ``1 <= N <= max_n`` and ``others`` (None
    skipped) are CUDA torch tensors of one device and dtype, f32 or bf16; else None (the full
    checks decide)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor) or not x.is_cuda:
        return None
    dtype, shape = x.dtype, x.shape
    dt = "bf16" if dtype is torch.bfloat16 else "f32" if dtype is torch.float32 else None
    if dt is None or not shape or not 1 <= shape[-1] <= max_n:
        return None
    index, Tensor = x.get_device(), torch.Tensor
    for o in others:
        if o is not None and not (isinstance(o, Tensor) and o.dtype is dtype and o.is_cuda
                                  and o.get_device() == index):
            return None
    return dt


def _check_x(who, x, *others, launch=True, grad=None):
    """Validate ``x (..., N)`` f32/bf16 and same-dtype ``others`` (None skipped); return the
    dtype name. ``grad``: the inputs whose gradient the norms' backward kernels would take."""
    dt = _fast_dtype(x, others, MAX_N if grad is None else MAX_N_BWD)
    if dt is not None:
        return dt
    if len(x.shape) < 1 or x.shape[-1] < 1:
        raise fail(ShapeError, who, f"x must have shape (..., N) with N >= 1, got {tuple(x.shape)}")
    dt = dtype_name(x.dtype)
    if dt not in ("f32", "bf16"):
        raise fail(SpecError, who, f"x must be float32 or bfloat16, got {x.dtype}")
    N = x.shape[-1]
    if N > MAX_N:
        raise fail(ConfigError, who, f"rows of at most {MAX_N} elements, got N = {N}")
    for o in others:
        if o is None:
            continue
        if framework(o) != framework(x):
            raise fail(SpecError, who, "inputs must all be torch tensors or all JAX arrays")
        if o.dtype != x.dtype:
            raise fail(SpecError, who, f"inputs must share x's dtype {x.dtype}, got {o.dtype}")
    if grad is not None and framework(x) == "torch" and N > MAX_N_BWD and _common.wants_grad(
            *grad):
        raise fail(ConfigError, who, f"the backward kernel takes rows of at most {MAX_N_BWD} "
                   f"elements, got N = {N}")
    if launch:
        _common.check_devices(who, x, *others)
    return dt


def _check_weight(who, w, N, what="weight"):
    if w is not None and w.shape != (N,):
        raise fail(ShapeError, who, f"{what} must have shape ({N},), got {tuple(w.shape)}")


def _check_rms_norm(x, weight, eps, launch=True):
    _check_weight("rms_norm", weight, x.shape[-1] if len(x.shape) else 0)
    return _check_x("rms_norm", x, weight, launch=launch, grad=(x, weight))


def _check_layer_norm(x, weight, bias, eps, launch=True):
    N = x.shape[-1] if len(x.shape) else 0
    _check_weight("layer_norm", weight, N)
    _check_weight("layer_norm", bias, N, "bias")
    return _check_x("layer_norm", x, weight, bias, launch=launch, grad=(x, weight, bias))


def _check_softmax(x, dim, launch=True):
    if dim not in (-1, len(x.shape) - 1):
        raise fail(ConfigError, "softmax", f"dim must be the last dimension (-1), got {dim} for "
                   f"shape {tuple(x.shape)}")
    return _check_x("softmax", x, launch=launch)


def _check_swiglu(gate, up, launch=True):
    if gate.shape != up.shape:
        raise fail(ShapeError, "swiglu", f"gate and up must have the same shape, got "
                   f"{tuple(gate.shape)} and {tuple(up.shape)}")
    return _check_x("swiglu", gate, up, launch=launch)


def _check_add_rms_norm(x, residual, weight, eps, launch=True):
    if x.shape != residual.shape:
        raise fail(ShapeError, "add_rms_norm", f"x and residual must have the same shape, got "
                   f"{tuple(x.shape)} and {tuple(residual.shape)}")
    _check_weight("add_rms_norm", weight, x.shape[-1] if len(x.shape) else 0)
    return _check_x("add_rms_norm", x, residual, weight, launch=launch,
                    grad=(x, residual, weight))


def _check_rotary(q, k, cos, sin, layout, launch=True):
    """Validate ``apply_rotary``'s inputs; return the memory layout the kernel reads."""
    who = "apply_rotary"
    if layout not in ("bhsd", "bshd"):
        raise fail(ConfigError, who, f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    if len(q.shape) != 4 or len(k.shape) != 4:
        raise fail(ShapeError, who, f"q and k must be 4-D ({layout}), got {tuple(q.shape)} and "
                   f"{tuple(k.shape)}")
    s_dim = 2 if layout == "bhsd" else 1
    qs, ks = q.shape, k.shape
    B, S, D = qs[0], qs[s_dim], qs[3]
    if ks[0] != B or ks[s_dim] != S or ks[3] != D:
        raise fail(ShapeError, who, f"k must share q's batch, sequence and head dims ({layout}), "
                   f"got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if D % 2 or D > 1024:
        raise fail(ShapeError, who, f"the head dimension must be even and at most 1024, got {D}")
    for name, t in (("cos", cos), ("sin", sin)):
        ts = t.shape
        ok = (len(ts) == 3 and ts[1] == S and ts[2] == D and (ts[0] == 1 or ts[0] == B)
              or len(ts) == 2 and ts[0] == S and ts[1] == D)
        if not ok:
            raise fail(ShapeError, who, f"{name} must have shape ({S}, {D}) or (B or 1, {S}, "
                       f"{D}), got {tuple(t.shape)}")
    _check_x(who, q, k, cos, sin, launch=launch)


def _memory(q, layout):
    """The layout 4-D ``q`` lies in memory: ``layout``, or the other one when ``q`` is not
    contiguous and ``q.transpose(1, 2)`` is (judged from the strides: no view made)."""
    if framework(q) != "torch" or q.is_contiguous():
        return layout
    size, stride = q.shape, q.stride()
    expected = 1
    for d in (3, 1, 2, 0):   # q.transpose(1, 2)'s dims, innermost first
        n = size[d]
        if n == 0:
            return layout
        if n != 1:
            if stride[d] != expected:
                return layout
            expected *= n
    return "bshd" if layout == "bhsd" else "bhsd"


# ----------------------------------------------------------------------------- public
def rms_norm(x, weight, eps=1e-6):
    """RMSNorm over the last dimension: ``x * rsqrt(mean(x**2, -1) + eps) * weight``; ``x
    (..., N)`` float32/bfloat16, ``weight (N,)`` of ``x``'s dtype; f32 arithmetic.
    torch: ``torch.ops.pyptx.rms_norm``, differentiable in ``x`` and ``weight`` (N <= 8192)."""
    _check_rms_norm(x, weight, eps)
    return _rows(x, lambda x2: _op("rms_norm", x2, weight, float(eps)))


def layer_norm(x, weight, bias=None, eps=1e-5):
    """LayerNorm over the last dimension: ``(x - mean) * rsqrt(var + eps) * weight + bias``;
    ``x (..., N)`` float32/bfloat16, ``weight``/``bias (N,)`` of ``x``'s dtype (no bias:
    zero). torch: ``torch.ops.pyptx.layer_norm``, differentiable in all inputs (N <= 8192)."""
    _check_layer_norm(x, weight, bias, eps)
    return _rows(x, lambda x2: _op("layer_norm", x2, weight, bias, float(eps)))


def softmax(x, dim=-1):
    """Softmax over the last dimension (``dim`` must name it) of ``x (..., N)``
    float32/bfloat16. torch: ``torch.ops.pyptx.softmax``, differentiable."""
    _check_softmax(x, dim)
    return _rows(x, lambda x2: _op("softmax", x2))


def swiglu(gate, up):
    """``silu(gate) * up`` of two same-shape float32/bfloat16 arrays. torch:
    ``torch.ops.pyptx.swiglu``, differentiable in both."""
    _check_swiglu(gate, up)
    if len(gate.shape) == 2:   # rows already
        return _op("swiglu", gate, up)
    u2 = _common.rows_of(up)[0]
    return _rows(gate, lambda g2: _op("swiglu", g2, u2))


def add_rms_norm(x, residual, weight, eps=1e-6):
    """RMSNorm with the residual add fused, as a pre-norm block runs it: ``h = x + residual``,
    returns ``(rms_norm(h, weight, eps), h)`` (the normed input of the next sublayer and the
    new residual). ``x``, ``residual (..., N)`` of one shape and dtype (float32/bfloat16),
    ``weight (N,)``; f32 arithmetic, ``h`` rounded to the dtype before it is normalised.
    torch: ``torch.ops.pyptx.add_rms_norm``, differentiable in all three (N <= 8192): one
    backward kernel takes the gradients of both outputs."""
    _check_add_rms_norm(x, residual, weight, eps)
    if len(x.shape) == 2:   # rows already
        return _op("add_rms_norm", x, residual, weight, float(eps))
    r2 = _common.rows_of(residual)[0]
    y, h = _op("add_rms_norm", _common.rows_of(x)[0], r2, weight, float(eps))
    return y.reshape(x.shape), h.reshape(x.shape)


def apply_rotary(q, k, cos, sin, *, layout="bhsd"):
    """Rotary position embedding of ``q`` and ``k`` in one launch, in transformers'
    ``rotate_half`` convention: ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) =
    cat(-x[..., D/2:], x[..., :D/2])``. ``q (B, Hq, S, D)``, ``k (B, Hkv, S, D)``
    (``layout="bshd"``: ``(B, S, H, D)``), ``cos``/``sin`` ``(S, D)`` or ``(B, S, D)`` (a
    leading 1 broadcasts), all float32 or all bfloat16; returns ``(q_rotated, k_rotated)``
    shaped like ``q`` and ``k``. A ``bhsd`` tensor stored as ``bshd`` (transformers'
    ``view(B, S, H, D).transpose(1, 2)``) is read where it lies, and the result has its
    strides. torch: ``torch.ops.pyptx.rotary``, differentiable in ``q`` and ``k`` (the
    backward is the transposed rotation, the same kernel)."""
    _check_rotary(q, k, cos, sin, layout)
    if len(cos.shape) == 2:
        cos, sin = cos[None], sin[None]
    mem = _memory(q, layout)
    if mem == layout:
        return _op("rotary", q, k, cos, sin, mem, False)
    if _common.direct_autograd(q, k, cos, sin):
        # q/k seen in memory order inside the autograd node: no view nodes on the inputs
        _define()
        qo, ko = _common.call_function("rotary_swapped", q, k, cos, sin, mem, False)
    else:
        qo, ko = _op("rotary", q.transpose(1, 2), k.transpose(1, 2), cos, sin, mem, False)
    return qo.transpose(1, 2), ko.transpose(1, 2)


def _rows(x, run):
    x2, lead = _common.rows_of(x)
    return run(x2).reshape(*lead, x.shape[-1])


def _op(name, *args):
    if framework(args[0]) == "torch":
        _define()
        return _common.call_op(name, *args)
    return _LAUNCH[name](*args)


# ---------------------------------------------------------------------------- launches
@functools.lru_cache(maxsize=256)
def _build(module, builder, B, N, dtype, *extra, arch=None):
    import importlib

    build = getattr(importlib.import_module(f"pyptx_kernels.rows.{module}"), builder)
    return build(B, N, dtype, *extra) if arch is None else build(B, N, dtype, *extra, arch=arch)


#: the op modules whose builders take ``arch=`` (the target of the tensor's device)
_ARCH_MODULES = frozenset({"rms_norm", "layer_norm", "softmax", "swiglu"})


def _dtype(dtype):
    """``dtype_name(dtype)``, cached per dtype object."""
    try:
        return _DTYPES[dtype]
    except KeyError:
        name = _DTYPES[dtype] = dtype_name(dtype)
        return name
    except TypeError:   # not hashable
        return dtype_name(dtype)


_DTYPES: dict = {}


def _kernel(module, builder, x, *extra):
    """The builder's kernel for 2-D ``x``; for ``x (..., N)`` of ``_kernels_*``, its rows."""
    shape = x.shape
    B = shape[0] if len(shape) == 2 else math.prod(shape[:-1])
    dt = _dtype(x.dtype)
    arch = device_arch(x) if module in _ARCH_MODULES else DEFAULT_ARCH
    if arch == DEFAULT_ARCH:  # the builders' default target: no keyword
        return _build(module, builder, B, shape[-1], dt, *extra)
    return _build(module, builder, B, shape[-1], dt, *extra, arch=arch)


def _no_grad():
    import contextlib

    if "torch" in sys.modules:
        return sys.modules["torch"].no_grad()
    return contextlib.nullcontext()


def _dense(*xs):
    """torch tensors made contiguous (the kernels read dense rows); JAX arrays as they are."""
    return [x.contiguous() if framework(x) == "torch" else x for x in xs]


def _rms_norm(x, weight, eps):
    """The forward launch on 2-D ``x``."""
    with _no_grad():
        return _kernel("rms_norm", "build_rms_norm_fast", x, eps)(*_dense(x, weight))


def _rms_norm_backward(grad, x, weight, eps):
    """``(dx, dweight)``: the ``build_rms_norm_bwd`` kernels."""
    with _no_grad():
        return tuple(_kernel("rms_norm", "build_rms_norm_bwd", x, eps)(*_dense(x, weight, grad)))


def _layer_norm(x, weight, bias, eps):
    if bias is None:
        bias = _zeros_like(weight)
    with _no_grad():
        return _kernel("layer_norm", "build_layer_norm", x, eps)(*_dense(x, weight, bias))


def _layer_norm_backward(grad, x, weight, eps):
    """``(dx, dweight, dbias)``: the ``build_layer_norm_bwd`` kernels."""
    with _no_grad():
        k = _kernel("layer_norm", "build_layer_norm_bwd", x, eps)
        return tuple(k(*_dense(x, weight, grad)))


def _softmax(x):
    with _no_grad():
        return _kernel("softmax", "build_softmax_fast", x)(*_dense(x))


def _swiglu(gate, up):
    k = _kernel("swiglu", "build_swiglu", gate)
    if framework(gate) == "torch":   # outputs are fresh tensors: no autograd to turn off
        return k(gate.contiguous(), up.contiguous())
    return k(gate, up)


def _zeros_like(w):
    if framework(w) == "torch":
        return w.new_zeros(w.shape)
    import jax.numpy as jnp

    return jnp.zeros_like(w)


def _outs(out):
    return out if type(out) is tuple else tuple(out)


def _add_rms_norm(x, residual, weight, eps):
    k = _kernel("add_rms_norm", "build_add_rms_norm", x, eps)
    if framework(x) == "torch":
        return _outs(k(x.contiguous(), residual.contiguous(), weight.contiguous()))
    return _outs(k(x, residual, weight))


def _add_rms_norm_backward(grad_y, grad_h, h, weight, eps):
    """``(dx, dweight)``: the ``build_add_rms_norm_bwd`` kernels; ``dx`` is also the
    residual's gradient."""
    k = _kernel("add_rms_norm", "build_add_rms_norm_bwd", h, eps)
    return _outs(k(h.contiguous(), weight.contiguous(), grad_y.contiguous(),
                   grad_h.contiguous()))


@functools.lru_cache(maxsize=256)
def _rope_kernel(B, Hq, Hk, S, D, dtype, cos_batch, layout, transpose):
    from pyptx_kernels.rows.rope import build_rope

    return build_rope(B, Hq, Hk, S, D, dtype, cos_batch=cos_batch, layout=layout,
                      transpose=transpose)


def _rope_shape(q, k, cos, layout):
    """``(B, Hq, Hk, S, D, cos_batch)`` of memory-layout ``q``/``k`` and 3-D ``cos``."""
    if layout == "bhsd":
        (B, Hq, S, D), Hk = q.shape, k.shape[1]
    else:
        (B, S, Hq, D), Hk = q.shape, k.shape[2]
    return B, Hq, Hk, S, D, cos.shape[0]


def _rotary(q, k, cos, sin, layout, transpose):
    """The rope launch on memory-layout ``q``/``k`` and 3-D ``cos``/``sin``, made dense (the
    kernel's specs are these shapes)."""
    B, Hq, Hk, S, D, cb = _rope_shape(q, k, cos, layout)
    kern = _rope_kernel(B, Hq, Hk, S, D, _dtype(q.dtype), cb, layout, bool(transpose))
    if framework(q) == "torch":
        return _outs(kern(q.contiguous(), k.contiguous(), cos.contiguous(), sin.contiguous()))
    return _outs(kern(q, k, cos, sin))


_LAUNCH = {"rms_norm": lambda *a: _rms_norm(*a), "layer_norm": lambda *a: _layer_norm(*a),
           "softmax": lambda *a: _softmax(*a), "swiglu": lambda *a: _swiglu(*a),
           "add_rms_norm": lambda *a: _add_rms_norm(*a), "rotary": lambda *a: _rotary(*a)}


# ------------------------------------------------------------------------------ torch ops
def _empty(x):
    return x.new_empty(x.shape)


def _save_norm(ctx, inputs, output):
    """rms_norm (x, weight, eps) and layer_norm (x, weight, bias, eps): the inputs, eps."""
    ctx.save_for_backward(*inputs[:-1])
    ctx.eps = inputs[-1]


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _save_output(ctx, inputs, output):
    ctx.save_for_backward(output)


def _rms_norm_grad(ctx, grad):

    x, w = ctx.saved_tensors
    dx, dw = _common.call_op("rms_norm_backward", grad, x, w, ctx.eps)
    return dx, dw, None


def _layer_norm_grad(ctx, grad):

    x, w, b = ctx.saved_tensors
    dx, dw, db = _common.call_op("layer_norm_backward", grad, x, w, ctx.eps)
    return dx, dw, (db if b is not None else None), None


def _softmax_grad(ctx, grad):

    return _common.call_op("softmax_backward", grad, ctx.saved_tensors[0])


def _softmax_backward(grad, y):
    """``y * (grad - sum(grad * y, -1))`` in f32."""
    g, yf = grad.float(), y.float()
    return (yf * (g - (g * yf).sum(-1, keepdim=True))).to(y.dtype)


def _swiglu_grad(ctx, grad):

    gate, up = ctx.saved_tensors
    return _common.call_op("swiglu_backward", grad, gate, up)


def _swiglu_kernel_takes(grad, gate, up):
    """Whether ``build_swiglu_backward`` takes these: CUDA tensors of one dtype, f32 or bf16."""
    torch = sys.modules["torch"]
    dtype = gate.dtype
    return ((dtype is torch.bfloat16 or dtype is torch.float32) and grad.dtype is dtype
            and up.dtype is dtype and grad.is_cuda and gate.is_cuda and up.is_cuda)


def _swiglu_backward(grad, gate, up):
    """``(dgate, dup)`` of ``silu(gate) * up``: the ``build_swiglu_backward`` kernel where it
    takes the tensors (``_swiglu_kernel_takes``), else torch's elementwise ops in f32."""
    import torch

    if _swiglu_kernel_takes(grad, gate, up):
        return _outs(_kernel("swiglu", "build_swiglu_backward", gate)(
            grad.contiguous(), gate.contiguous(), up.contiguous()))
    dy, g, u = grad.float(), gate.float(), up.float()
    s = torch.sigmoid(g)
    return (dy * u * s * (1 + g * (1 - s))).to(gate.dtype), (dy * g * s).to(up.dtype)


def _save_add_rms_norm(ctx, inputs, output):
    """add_rms_norm (x, residual, weight, eps) -> (y, h): h and the weight, eps."""
    ctx.save_for_backward(output[1], inputs[2])
    ctx.eps = inputs[3]


def _add_rms_norm_grad(ctx, grad_y, grad_h):
    import torch

    h, w = ctx.saved_tensors
    grad_y = torch.zeros_like(h) if grad_y is None else grad_y
    grad_h = torch.zeros_like(h) if grad_h is None else grad_h
    dx, dw = _common.call_op("add_rms_norm_backward", grad_y, grad_h, h, w, ctx.eps)
    return dx, dx, dw, None


def _save_rotary(ctx, inputs, output):
    """rotary (q, k, cos, sin, layout, transpose): cos, sin and the two flags."""
    ctx.save_for_backward(inputs[2], inputs[3])
    ctx.layout, ctx.transpose = inputs[4], inputs[5]


def _rotary_grad(ctx, grad_q, grad_k):

    cos, sin = ctx.saved_tensors
    dq, dk = _common.call_op("rotary", grad_q, grad_k, cos, sin, ctx.layout, not ctx.transpose)
    return dq, dk, None, None, None, None


def _rotary_swapped(q, k, cos, sin, layout, transpose):
    """``rotary`` of ``q``/``k`` whose memory order is ``layout`` with dims 1 and 2 swapped
    (the outputs are in memory order)."""
    return _rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin, layout, transpose)


def _rotary_swapped_grad(ctx, grad_q, grad_k):
    dq, dk = _rotary_grad(ctx, grad_q, grad_k)[:2]
    return dq.transpose(1, 2), dk.transpose(1, 2), None, None, None, None


@_common.defines_ops
def _define():
    """Define the four forward ops and their ``pyptx::<name>_backward`` ops."""
    op = _common.torch_op
    op("rms_norm_backward", "(Tensor grad, Tensor x, Tensor weight, float eps) "
       "-> (Tensor, Tensor)", lambda *a: _rms_norm_backward(*a),
       lambda grad, x, w, eps: (_empty(x), _empty(w)))
    op("rms_norm", "(Tensor x, Tensor weight, float eps) -> Tensor",
       lambda *a: _rms_norm(*a), lambda x, w, eps: _empty(x), _rms_norm_grad, _save_norm)
    op("layer_norm_backward", "(Tensor grad, Tensor x, Tensor weight, float eps) "
       "-> (Tensor, Tensor, Tensor)", lambda *a: _layer_norm_backward(*a),
       lambda grad, x, w, eps: (_empty(x), _empty(w), _empty(w)))
    op("layer_norm", "(Tensor x, Tensor weight, Tensor? bias, float eps) -> Tensor",
       lambda *a: _layer_norm(*a), lambda x, w, b, eps: _empty(x), _layer_norm_grad, _save_norm)
    op("softmax_backward", "(Tensor grad, Tensor y) -> Tensor", _softmax_backward,
       lambda grad, y: _empty(y))
    op("softmax", "(Tensor x) -> Tensor", lambda x: _softmax(x), _empty, _softmax_grad,
       _save_output)
    op("swiglu_backward", "(Tensor grad, Tensor gate, Tensor up) -> (Tensor, Tensor)",
       _swiglu_backward, lambda grad, g, u: (_empty(g), _empty(u)))
    op("swiglu", "(Tensor gate, Tensor up) -> Tensor", lambda g, u: _swiglu(g, u),
       lambda g, u: _empty(g), _swiglu_grad, _save_inputs)
    op("add_rms_norm_backward", "(Tensor grad_y, Tensor grad_h, Tensor h, Tensor weight, "
       "float eps) -> (Tensor, Tensor)", lambda *a: _add_rms_norm_backward(*a),
       lambda gy, gh, h, w, eps: (_empty(h), _empty(w)))
    op("add_rms_norm", "(Tensor x, Tensor residual, Tensor weight, float eps) "
       "-> (Tensor, Tensor)", lambda *a: _add_rms_norm(*a),
       lambda x, r, w, eps: (_empty(x), _empty(x)), _add_rms_norm_grad, _save_add_rms_norm)
    # the backward calls the same op (transpose flipped): registered with its own autograd
    op("rotary", "(Tensor q, Tensor k, Tensor cos, Tensor sin, str layout, bool transpose) "
       "-> (Tensor, Tensor)", lambda *a: _rotary(*a),
       lambda q, k, c, s, layout, tr: (_empty(q), _empty(k)), _rotary_grad, _save_rotary)
    # eager only (apply_rotary's direct autograd): rotary on q/k not in memory order
    _common.register_eager("rotary_swapped", _rotary_swapped, _rotary_swapped_grad,
                           _save_rotary)
    return True

if "torch" in sys.modules:   # a torch user: define the ops before any trace reaches them
    _define()


# ------------------------------------------------------------------------ kernels (ptx())
def _grad_kernel(module, builder, x, eps, *inputs):
    """The backward kernels where a torch input requires grad (else None)."""
    if framework(x) == "torch" and _common.wants_grad(x, *inputs):
        return _kernel(module, builder, x, eps)
    return None


def _kernels_rms_norm(x, weight, eps=1e-6):
    _check_rms_norm(x, weight, eps, launch=False)
    return [_kernel("rms_norm", "build_rms_norm_fast", x, float(eps)),
            _grad_kernel("rms_norm", "build_rms_norm_bwd", x, float(eps), weight)]


def _kernels_layer_norm(x, weight, bias=None, eps=1e-5):
    _check_layer_norm(x, weight, bias, eps, launch=False)
    return [_kernel("layer_norm", "build_layer_norm", x, float(eps)),
            _grad_kernel("layer_norm", "build_layer_norm_bwd", x, float(eps), weight, bias)]


def _kernels_softmax(x, dim=-1):
    _check_softmax(x, dim, launch=False)
    return _kernel("softmax", "build_softmax_fast", x)


def _kernels_swiglu(gate, up):
    _check_swiglu(gate, up, launch=False)
    grad = framework(gate) == "torch" and _common.wants_grad(gate, up)
    return [_kernel("swiglu", "build_swiglu", gate),
            _kernel("swiglu", "build_swiglu_backward", gate) if grad else None]


def _kernels_add_rms_norm(x, residual, weight, eps=1e-6):
    _check_add_rms_norm(x, residual, weight, eps, launch=False)
    return [_kernel("add_rms_norm", "build_add_rms_norm", x, float(eps)),
            _grad_kernel("add_rms_norm", "build_add_rms_norm_bwd", x, float(eps), residual,
                         weight)]


def _kernels_apply_rotary(q, k, cos, sin, *, layout="bhsd"):
    _check_rotary(q, k, cos, sin, layout, launch=False)
    mem = _memory(q, layout)
    if mem != layout:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    c3 = cos.reshape(-1, cos.shape[-2], cos.shape[-1])
    B, Hq, Hk, S, D, cb = _rope_shape(q, k, c3, mem)
    return _rope_kernel(B, Hq, Hk, S, D, dtype_name(q.dtype), cb, mem, False)


_kernels = {"rms_norm": _kernels_rms_norm, "layer_norm": _kernels_layer_norm,
            "softmax": _kernels_softmax, "swiglu": _kernels_swiglu,
            "add_rms_norm": _kernels_add_rms_norm, "apply_rotary": _kernels_apply_rotary}
