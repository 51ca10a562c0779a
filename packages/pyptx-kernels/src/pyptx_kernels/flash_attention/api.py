"""The public attention functions: ``attention`` and ``attention_varlen``.

For torch tensors each is one custom op, ``torch.ops.pyptx.attention`` /
``torch.ops.pyptx.attention_varlen`` returning ``(out, lse)``, with a fake implementation
(shapes only) and autograd through ``torch.ops.pyptx.attention_backward`` /
``torch.ops.pyptx.attention_varlen_backward``, so ``torch.compile(fullgraph=True)`` keeps a
model using them in one graph. The ops are declared at the first torch call, never at import,
and defined when a call first goes through ``torch.ops.pyptx`` (a trace, meta or fake
tensors): plain eager CUDA calls run their implementations directly (``_common.call_op``).
JAX arrays go to the host functions of ``fwd_host.py`` (differentiable with ``jax.grad``).
"""

from __future__ import annotations

import functools
import math
import numbers
import sys

from pyptx.errors import ConfigError
from pyptx_kernels import _common
from pyptx_kernels._common import framework, where

LAYOUTS = ("bshd", "bhsd")
FORWARD_HEAD_DIMS = (64, 128, 256)
BACKWARD_HEAD_DIMS = (64, 128)
#: device types the kernels run on (``_kernels`` builds for tensors on any device)
_DTYPES = {"bfloat16": "bf16", "float16": "f16"}


def _fail(fn, msg):
    return ConfigError(f"{where()}: {fn}: {msg}")


# ------------------------------------------------------------------ validation
def _check_arrays(fn, named, ranks, any_device):
    """Arrays ``named`` ((name, array) pairs) of the given ranks, of one framework; torch
    ones on one CUDA device (meta and fake tensors pass) unless ``any_device``."""
    for (name, x), rank in zip(named, ranks):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise _fail(fn, f"{name} must be a torch tensor or a JAX array, got "
                            f"{type(x).__name__}")
        if len(x.shape) != rank:
            raise _fail(fn, f"{name} must be {rank}-D, got shape {tuple(x.shape)}")
    libs = {framework(x) for _, x in named}
    if len(libs) != 1:
        raise _fail(fn, "inputs mix torch tensors and JAX arrays")
    if libs == {"torch"} and not any_device:
        _common.check_devices(fn, *(x for _, x in named))


def _dtype(fn, named):
    dtypes = [str(x.dtype).replace("torch.", "") for _, x in named]
    if dtypes[0] not in _DTYPES or len(set(dtypes)) != 1:
        raise _fail(fn, f"{', '.join(n for n, _ in named)} must share one dtype, bfloat16 or "
                        f"float16, got {', '.join(dtypes)}")
    return _DTYPES[dtypes[0]]


def _options(fn, causal, scale, D):
    """``(causal, scale)`` checked, ``scale`` resolved to a float (``1/sqrt(D)`` for None)."""
    if not isinstance(causal, bool):
        raise _fail(fn, f"causal must be a bool, got {causal!r}")
    if scale is None:
        return causal, 1.0 / math.sqrt(D)
    if type(scale).__name__ == "SymFloat":  # a float torch.compile traces symbolically
        return causal, scale
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) \
            or not math.isfinite(float(scale)):
        raise _fail(fn, f"scale must be None or a finite real number, got {scale!r}")
    return causal, float(scale)


def _head_dim(fn, D, xs):
    if D not in FORWARD_HEAD_DIMS:
        raise _fail(fn, f"head dim D must be one of {FORWARD_HEAD_DIMS}, got {D}")
    if D not in BACKWARD_HEAD_DIMS and framework(xs[0]) == "torch":
        import torch

        if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
            raise _fail(fn, f"inputs require grad, but head dim {D} has a forward only "
                            f"(backward head dims {BACKWARD_HEAD_DIMS}); run it under "
                            f"torch.no_grad() for inference")


def _features(window, softcap):
    """``(window, softcap)`` checked (``ConfigError`` at the caller's line)."""
    from pyptx_kernels.flash_attention.fwd_kernel import check_softcap, check_window

    return check_window(window), check_softcap(softcap)


def _check_dense(q, k, v, causal, scale, layout, any_device=False):
    """``(B, S, Hq, Hkv, D, Sk, dtype, causal, scale)`` of a valid ``attention`` call."""
    fn = "attention"
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise _fail(fn, f"layout must be one of {LAYOUTS}, got {layout!r}")
    named = (("q", q), ("k", k), ("v", v))
    _check_arrays(fn, named, (4, 4, 4), any_device)
    (B, S, Hq, D), (Bk, Sk, Hkv, Dk) = (
        tuple(int(d) for d in (x.shape if layout == "bshd" else
                                (x.shape[0], x.shape[2], x.shape[1], x.shape[3])))
        for x in (q, k))
    names = "(B, S, H, D)" if layout == "bshd" else "(B, H, S, D)"
    if tuple(k.shape) != tuple(v.shape):
        raise _fail(fn, f"k and v must have one shape, got {tuple(k.shape)} and "
                        f"{tuple(v.shape)}")
    if Bk != B or Dk != D:
        raise _fail(fn, f"q {tuple(q.shape)} and k/v {tuple(k.shape)} ({layout}: {names}) must "
                        f"have the same batch B and head dim D")
    if min(B, S, Hq, D, Sk, Hkv) < 1:
        raise _fail(fn, f"empty input: q {tuple(q.shape)}, k/v {tuple(k.shape)}")
    if Hq % Hkv:
        raise _fail(fn, f"the query heads ({Hq}) must be a multiple of the key/value heads "
                        f"({Hkv}) ({layout}: {names})")
    dtype = _dtype(fn, named)
    _head_dim(fn, D, (q, k, v))
    return (B, S, Hq, Hkv, D, Sk, dtype, *_options(fn, causal, scale, D))


def _check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, any_device=False):
    """``(Tq, Tk, B, Hq, Hkv, D, max_q, max_k, dtype, causal, scale)`` of a valid call."""
    fn = "attention_varlen"
    named = (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k))
    _check_arrays(fn, named, (3, 3, 3, 1, 1), any_device)
    for name, cu in named[3:]:
        if "int32" not in str(cu.dtype):
            raise _fail(fn, f"{name} must be int32, got {cu.dtype}")
    Tq, Hq, D = (int(d) for d in q.shape)
    Tk, Hkv, Dk = (int(d) for d in k.shape)
    B = int(cu_q.shape[0]) - 1
    if tuple(k.shape) != tuple(v.shape):
        raise _fail(fn, f"k and v must have one shape, got {tuple(k.shape)} and "
                        f"{tuple(v.shape)}")
    if Dk != D:
        raise _fail(fn, f"q {tuple(q.shape)} and k/v {tuple(k.shape)} must have the same head "
                        f"dim D")
    if B < 1 or int(cu_k.shape[0]) != B + 1:
        raise _fail(fn, f"cu_seqlens_q and cu_seqlens_k must both have B + 1 >= 2 entries, got "
                        f"{int(cu_q.shape[0])} and {int(cu_k.shape[0])}")
    if min(Tq, Tk, Hq, Hkv, D) < 1:
        raise _fail(fn, f"empty input: q {tuple(q.shape)}, k/v {tuple(k.shape)}")
    if Hq % Hkv:
        raise _fail(fn, f"the query heads ({Hq}) must be a multiple of the key/value heads "
                        f"({Hkv})")
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise _fail(fn, f"{name} must be a positive Python int (the longest sequence), "
                            f"got {m!r}")
    dtype = _dtype(fn, named[:3])
    _head_dim(fn, D, (q, k, v))
    return (Tq, Tk, B, Hq, Hkv, D, max_q, max_k, dtype, *_options(fn, causal, scale, D))


# ------------------------------------------------------------------ kernels
NO_FEATURES = ((-1, -1), 0.0)   # (window, softcap) of plain attention


def _forward_kernel(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, features=NO_FEATURES,
                    layouts=("bshd",) * 3):
    """The dense forward ``attention_forward`` launches for these sizes (the default plan,
    chosen without timing); ``layouts``: the memory orders of q, k, v."""
    from pyptx_kernels.flash_attention.fwd_host import forward_kernel

    window, softcap = features
    return forward_kernel(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, window=window,
                          softcap=softcap, layouts=layouts)


@functools.lru_cache(maxsize=128)
def _backward_kernel(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, features=NO_FEATURES,
                     layouts=("bshd",) * 3):
    """The dense backward (``AttentionBackward``): ``BackwardPlan.for_eager(D)``'s kernels (the
    plan ``fwd_host._differentiable`` picks for torch eager calls), or the deterministic
    dQ / dK-dV pair at sizes they refuse. A window or soft cap goes to the backward's builder
    as keywords (``ConfigError`` at the caller's line while it does not take them);
    ``layouts``: q, k, v's memory orders (``"bhsd"`` ones are read in place)."""
    from pyptx.errors import PyptxError
    from pyptx_kernels.flash_attention.bwd_host import build_attention_backward
    from pyptx_kernels.flash_attention.bwd_plan import BackwardPlan
    from pyptx_kernels.flash_attention.fwd_host import build_backward

    kw = dict(Sk=Sk, dtype=dtype, causal=causal, scale=scale, features=features,
              layouts=layouts)
    try:
        return build_backward(build_attention_backward, B, S, Hq, Hkv, D, **kw,
                              plan=BackwardPlan.for_eager(D))
    except PyptxError:
        return build_backward(build_attention_backward, B, S, Hq, Hkv, D, **kw)


def _varlen_forward_kernel(Tq, Tk, B, Hq, Hkv, D, max_q, dtype, causal, scale,
                           features=NO_FEATURES):
    from pyptx_kernels.flash_attention.fwd_host import varlen_kernel

    window, softcap = features
    return varlen_kernel(Tq, Tk, B, Hq, Hkv, D, max_q, dtype, causal, scale, window=window,
                         softcap=softcap)


@functools.lru_cache(maxsize=128)
def _varlen_backward_kernel(Tq, Tk, B, Hq, Hkv, D, max_q, max_k, dtype, causal, scale,
                            features=NO_FEATURES):
    from pyptx_kernels.flash_attention.bwd_varlen import build_attention_backward_varlen
    from pyptx_kernels.flash_attention.fwd_host import build_backward

    return build_backward(build_attention_backward_varlen, Tq, Tk, B, Hq, Hkv, D, max_q, max_k,
                          dtype=dtype, causal=causal, scale=scale, features=features)


def _kernel_list(*objs):
    """The pyptx Kernels of forward / backward objects: a tuned kernel's default config, a
    backward's kernels (and its fallback's), each once."""
    out = {}
    for obj in objs:
        for k in getattr(obj, "kernels", None) or (obj,):
            k = getattr(k, "kernel", k)     # TunedKernel: its first config that builds
            out.setdefault(k.name, k)
        if getattr(obj, "fallback", None) is not None:
            out.update({k.name: k for k in _kernel_list(obj.fallback)})
    return list(out.values())


def _kernels(name, *args, **kwargs):
    """The pyptx Kernels (forward, then backward where the head dim has one) that the call
    ``<name>(*args, **kwargs)`` of this module's public function ``name`` (``"attention"``
    or ``"attention_varlen"``) builds; the inputs may be on any device (CPU and meta tensors
    included): nothing is launched."""
    if name not in ("attention", "attention_varlen"):
        raise _fail("_kernels", f"no public function {name!r}: attention or attention_varlen")
    features = _features(kwargs.pop("window", (-1, -1)), kwargs.pop("softcap", 0.0))
    if name == "attention":
        dims = _dense_dims(*args, **kwargs)
        D = dims[4]
        fwd = _forward_kernel(*dims, features)
        bwd = _backward_kernel(*dims, features) if D in BACKWARD_HEAD_DIMS else None
    else:
        dims = _varlen_dims(*args, **kwargs)
        Tq, Tk, B, Hq, Hkv, D, max_q, max_k, dtype, causal, scale = dims
        fwd = _varlen_forward_kernel(Tq, Tk, B, Hq, Hkv, D, max_q, dtype, causal, scale,
                                     features)
        bwd = _varlen_backward_kernel(*dims, features) if D in BACKWARD_HEAD_DIMS else None
    return _kernel_list(*(k for k in (fwd, bwd) if k is not None))


def _dense_dims(q, k, v, *, causal=False, scale=None, layout="bshd"):
    return _check_dense(q, k, v, causal, scale, layout, any_device=True)


def _varlen_dims(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                 causal=False, scale=None):
    return _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         causal, scale, any_device=True)


# ------------------------------------------------------------------ launches
def _dims_of(q, k):
    B, S, Hq, D = (int(d) for d in q.shape)
    return B, S, Hq, int(k.shape[2]), D, int(k.shape[1]), _DTYPES[str(q.dtype)[6:]]


def _launch_forward(q, k, v, causal, scale, features=NO_FEATURES):
    """``(o, lse)`` of the dense forward kernel (torch tensors, logically ``(B, S, H, D)``:
    contiguous, or views of ``(B, H, S, D)`` memory, which the kernel reads in place)."""
    from pyptx_kernels.flash_attention.fwd_host import memory_layouts

    xs, layouts = memory_layouts(q, k, v)
    return _forward_kernel(*_dims_of(q, k), causal, scale, features, layouts)(*xs)


def _launch_backward(q, k, v, o, lse, do, causal, scale, features=NO_FEATURES):
    """``(dq, dk, dv)`` (contiguous ``(B, S, H, D)``) of the dense backward kernels: q, k, v
    logically ``(B, S, H, D)``, contiguous or views of ``(B, H, S, D)`` memory, which the
    kernels read in place (other strides are copied); o, do and lse are made contiguous."""
    from pyptx_kernels.flash_attention.fwd_host import memory_layouts

    dims = _dims_of(q, k)
    xs, layouts = memory_layouts(q, k, v)
    o, lse, do = (x.contiguous() for x in (o, lse, do))
    return tuple(_backward_kernel(*dims, causal, scale, features, layouts)(*xs, o, lse, do))


def _launch_varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale,
                           features=NO_FEATURES):
    Tq, Hq, D = (int(d) for d in q.shape)
    Tk, Hkv, B = int(k.shape[0]), int(k.shape[1]), int(cu_q.shape[0]) - 1
    kern = _varlen_forward_kernel(Tq, Tk, B, Hq, Hkv, D, max_q, _DTYPES[str(q.dtype)[6:]],
                                  causal, scale, features)
    return kern(q, k, v, cu_q, cu_k)


def _launch_varlen_backward(q, k, v, cu_q, cu_k, o, lse, do, max_q, max_k, causal, scale,
                            features=NO_FEATURES):
    Tq, Hq, D = (int(d) for d in q.shape)
    Tk, Hkv, B = int(k.shape[0]), int(k.shape[1]), int(cu_q.shape[0]) - 1
    kern = _varlen_backward_kernel(Tq, Tk, B, Hq, Hkv, D, max_q, max_k,
                                   _DTYPES[str(q.dtype)[6:]], causal, scale, features)
    return tuple(kern(q, k, v, cu_q, cu_k, o, lse, do))


# ------------------------------------------------------------------ torch custom ops
#: the ops' schemas (``pyptx::<name>``), given: this module's annotations are strings
_FEATURE_ARGS = "int window_left=-1, int window_right=-1, float softcap=0.0"
SCHEMAS = {
    "attention": f"(Tensor q, Tensor k, Tensor v, bool causal, float scale, {_FEATURE_ARGS}) "
                 f"-> (Tensor, Tensor)",
    "attention_backward": f"(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor do, "
                          f"bool causal, float scale, {_FEATURE_ARGS}) "
                          f"-> (Tensor, Tensor, Tensor)",
    "attention_varlen": f"(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
                        f"Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, "
                        f"bool causal, float scale, {_FEATURE_ARGS}) -> (Tensor, Tensor)",
    "attention_varlen_backward": f"(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
                                 f"Tensor cu_seqlens_k, Tensor o, Tensor lse, Tensor do, "
                                 f"SymInt max_seqlen_q, SymInt max_seqlen_k, bool causal, "
                                 f"float scale, {_FEATURE_ARGS}) -> (Tensor, Tensor, Tensor)",
}


def _as_features(window_left, window_right, softcap):
    """The ops' feature arguments as ``(window, softcap)``."""
    return (int(window_left), int(window_right)), float(softcap)


def _no_grad():
    return sys.modules["torch"].no_grad()


def _dense(*xs):
    return tuple(x.contiguous() for x in xs)


def _attention_impl(q, k, v, causal, scale, window_left=-1, window_right=-1, softcap=0.0):
    with _no_grad():   # (B, H, S, D) memory is read in place: no copy
        return _launch_forward(q, k, v, causal, scale,
                               _as_features(window_left, window_right, softcap))


def _attention_fake(q, k, v, causal, scale, window_left=-1, window_right=-1, softcap=0.0):
    import torch

    B, S, H, D = q.shape
    return q.new_empty((B, S, H, D)), q.new_empty((B, H, S), dtype=torch.float32)


def _attention_backward_impl(q, k, v, o, lse, do, causal, scale, window_left=-1,
                             window_right=-1, softcap=0.0):
    with _no_grad():   # (B, H, S, D) q, k, v are read in place: no copy
        return _launch_backward(q, k, v, o, lse, do, causal, scale,
                                _as_features(window_left, window_right, softcap))


def _attention_backward_fake(q, k, v, o, lse, do, causal, scale, window_left=-1,
                             window_right=-1, softcap=0.0):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_setup(ctx, inputs, output):
    q, k, v, *ctx.options = inputs
    ctx.save_for_backward(q, k, v, *output)


def _attention_grad(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    return (*_common.call_op("attention_backward", q, k, v, o, lse, do, *ctx.options),
            *(None,) * len(ctx.options))


def _varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                 scale, window_left=-1, window_right=-1, softcap=0.0):
    with _no_grad():
        return _launch_varlen_forward(*_dense(q, k, v, cu_seqlens_q, cu_seqlens_k),
                                      max_seqlen_q, max_seqlen_k, causal, scale,
                                      _as_features(window_left, window_right, softcap))


def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                 scale, window_left=-1, window_right=-1, softcap=0.0):
    import torch

    T, H, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((H, T), dtype=torch.float32)


def _varlen_backward_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse, do, max_seqlen_q,
                          max_seqlen_k, causal, scale, window_left=-1, window_right=-1,
                          softcap=0.0):
    with _no_grad():
        return _launch_varlen_backward(
            *_dense(q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse, do), max_seqlen_q,
            max_seqlen_k, causal, scale, _as_features(window_left, window_right, softcap))


def _varlen_backward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse, do, max_seqlen_q,
                          max_seqlen_k, causal, scale, window_left=-1, window_right=-1,
                          softcap=0.0):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, *ctx.options = inputs
    ctx.save_for_backward(q, k, v, cu_q, cu_k, *output)


def _varlen_grad(ctx, do, dlse):
    q, k, v, cu_q, cu_k, o, lse = ctx.saved_tensors
    grads = _common.call_op("attention_varlen_backward", q, k, v, cu_q, cu_k, o, lse, do,
                            *ctx.options)
    return (*grads, None, None, *(None,) * len(ctx.options))


@_common.defines_ops
def _register():
    """Declare the ``pyptx::attention*`` custom ops (defined when a call first goes through
    ``torch.ops.pyptx``: ``_common.define_op``)."""
    _common.torch_op("attention_backward", SCHEMAS["attention_backward"],
                     _attention_backward_impl, _attention_backward_fake)
    _common.torch_op("attention", SCHEMAS["attention"], _attention_impl, _attention_fake,
                     _attention_grad, _attention_setup)
    _common.torch_op("attention_varlen_backward", SCHEMAS["attention_varlen_backward"],
                     _varlen_backward_impl, _varlen_backward_fake)
    _common.torch_op("attention_varlen", SCHEMAS["attention_varlen"], _varlen_impl,
                     _varlen_fake, _varlen_grad, _varlen_setup)
    return True


# ------------------------------------------------------------------ public functions
def _check_backward(fn, xs, features, build):
    """A torch call that will want gradients with a window or soft cap: ``build()`` (the
    backward kernels) now, so a backward that does not take them yet raises ``ConfigError``
    at the caller's line instead of inside ``loss.backward()``."""
    if features == NO_FEATURES:
        return
    import torch

    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        build()


def _sm80_attention(q, k, v, causal, scale, layout, features, dims):
    """The Ampere forward's call, or ``ConfigError`` for what it lacks."""
    if features != ((-1, -1), 0.0) or dims[4] not in (64, 128) or _common.wants_grad(q, k, v):
        raise _common.fail(ConfigError, "attention", "the sm_80 attention is a forward at head "
                           "dim 64 or 128 without window or soft cap: call it with none of "
                           "them and no input requiring grad")
    from pyptx_kernels.ampere.api import sm80_attention

    return sm80_attention(q, k, v, causal=causal, scale=scale, layout=layout)


def attention(q, k, v, *, causal=False, scale=None, layout="bshd", window=(-1, -1),
              softcap=0.0, arch=None):
    """Flash attention ``softmax(scale * q k^T) v`` on Hopper tensor cores.

    ``layout="bshd"``: ``q (B, S, Hq, D)``, ``k, v (B, Sk, Hkv, D)``; ``layout="bhsd"``:
    ``q (B, Hq, S, D)``, ``k, v (B, Hkv, Sk, D)`` (SDPA's and Hugging Face's), and the output
    comes in that layout (a view of the kernel's ``(B, S, H, D)`` output). Torch inputs are
    read where they are, without a copy, when their memory is ``(B, S, H, D)`` or
    ``(B, H, S, D)`` (a transposed view, as Hugging Face's ``view(...).transpose(1, 2)``
    gives, counts as the order it was made in); other strides are copied first.
    ``Hq % Hkv == 0`` (query head ``h`` reads key/value head ``h // (Hq // Hkv)``), bfloat16
    or float16, head dim ``D`` 64, 128 or 256. ``causal``: query ``i`` sees keys ``j <= i``
    (top-left aligned). ``scale`` defaults to ``1/sqrt(D)``. ``window=(left, right)``:
    query ``i`` sees keys ``i - left <= j <= i + right`` (``-1``: unbounded; with
    ``causal``, ``right`` is 0), FlashAttention's convention; key blocks wholly outside the
    window are skipped, so a window of ``w`` keys costs about ``w / Sk`` of full attention.
    ``softcap > 0``: the scaled scores become ``softcap * tanh(score / softcap)`` before the
    softmax (FlashAttention-3's soft cap). Returns ``out`` shaped like ``q``. Torch tensors
    (CUDA) go through ``torch.ops.pyptx.attention``, differentiable at ``D`` 64 and 128
    (deterministic backward; with a window or soft cap, where the backward takes them);
    JAX arrays through ``fwd_host.attention`` (``jax.grad``). One compiled kernel serves
    every batch and sequence length of a family (dtype, head dim, causal, window, soft cap,
    layouts, plan); the plan is chosen without timing unless ``PYPTX_AUTOTUNE=1``. Bad
    input raises ``ConfigError`` naming the caller's line. ``arch``: the kernel family, by
    default the device's; sm_8x devices (and ``arch="sm_80"`` anywhere) take the Ampere
    forward (``pyptx_kernels.ampere``: D 64/128, no window, soft cap or backward)."""
    *dims, causal, scale = _check_dense(q, k, v, causal, scale, layout)
    features = _features(window, softcap)
    (window_left, window_right), softcap = features
    if framework(q) == "torch":
        arch = _common.device_arch(q) if arch is None else arch
        if arch == "sm_80":
            return _sm80_attention(q, k, v, causal, scale, layout, features, dims)
        if arch != "sm_90a":
            raise _common.fail(ConfigError, "attention", f"no attention kernel for arch "
                               f"{arch!r}: the targets are ('sm_80', 'sm_90a')")
    if framework(q) == "jax":
        from pyptx_kernels.flash_attention import fwd_host as forward

        if layout == "bhsd":
            import jax.numpy as jnp

            q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
            return jnp.swapaxes(forward.attention(q, k, v, causal, scale, window=features[0],
                                                  softcap=softcap), 1, 2)
        return forward.attention(q, k, v, causal, scale, window=features[0], softcap=softcap)

    _register()
    if layout == "bhsd":   # logical (B, S, H, D) views; the kernel reads their memory in place
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    _check_backward("attention", (q, k, v), features,
                    lambda: _backward_kernel(*dims, causal, scale, features))
    out = _common.call_op("attention", q, k, v, causal, scale, window_left, window_right,
                                    softcap)[0]
    return out.transpose(1, 2) if layout == "bhsd" else out


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, scale=None, window=(-1, -1), softcap=0.0):
    """Flash attention over packed sequences (the flash-attention packages' layout).

    ``q (Tq, Hq, D)``, ``k, v (Tk, Hkv, D)``; sequence ``b`` is rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q and ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``
    of k, v (int32 ``(B + 1,)`` on q's device; empty sequences allowed); ``max_seqlen_q/k``
    are Python ints bounding the sequence lengths (no host sync). Dtypes, head dims,
    ``causal`` and ``window`` (top-left aligned per sequence), ``softcap`` and ``scale`` as
    in ``attention``. Returns ``out (Tq, Hq, D)``. Torch tensors go through
    ``torch.ops.pyptx.attention_varlen``, differentiable at ``D`` 64 and 128; JAX arrays
    through ``fwd_host.attention_varlen``."""
    dims = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         causal, scale)
    *_, causal, scale = dims
    features = _features(window, softcap)
    (window_left, window_right), softcap = features
    if framework(q) == "jax":
        from pyptx_kernels.flash_attention import fwd_host as forward

        return forward.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                        max_seqlen_k, causal, scale, window=features[0],
                                        softcap=softcap)

    _register()
    _check_backward("attention_varlen", (q, k, v), features,
                    lambda: _varlen_backward_kernel(*dims, features))
    return _common.call_op("attention_varlen", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                            max_seqlen_k, causal, scale, window_left,
                                            window_right, softcap)[0]
