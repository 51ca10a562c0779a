"""The forward's host functions (torch tensors or JAX arrays): kernel caches per size and
plan, the tuned default plan, and autograd through the backward kernels.

``attention(q, k, v)`` returns ``o`` and is differentiable (torch autograd, ``jax.grad``) at
head dims 64 and 128; ``attention_varlen(...)`` takes packed batches in the flash-attention
packages' layout, differentiable the same way. Head dim 256 has a forward only: a call whose
torch inputs require grad raises ``ConfigError``, as does ``jax.grad`` through it
(``NoBackward``). ``attention_forward`` / ``attention_varlen_forward`` return ``(o, lse)``
without autograd. ``config=None`` is the default plan, chosen without timing (``PLANNER``: a winner saved by
``PYPTX_AUTOTUNE=1`` / ``tune()`` for the exact shape, else the shipped table's plan for the
shape's bucket, else ``fwd_config.default_plan``) among ``ATTENTION_CONFIGS`` (dense;
``$PYPTX_ATTN_SCHEDULE`` fixes the schedule instead, ``$PYPTX_ATTN_PERSISTENT=1`` makes it
persistent), ``ForwardConfig()`` (packed). ``window`` and ``softcap`` (``build_attention``'s)
are part of a kernel's family; sizes are kernel parameters. Torch tensors laid out as
``(B, H, S, D)`` in memory (an SDPA-style view transposed to ``(B, S, H, D)``) are read
where they are (``memory_layouts``): no copy.
"""

from __future__ import annotations

import functools
import math
import os

from pyptx._dataclass import dataclass
from pyptx.autotune import Config, autotune
from pyptx.errors import ConfigError, PyptxError
from pyptx_kernels import _tuning
from pyptx_kernels._common import framework, where
from pyptx_kernels.flash_attention.fwd_config import (
    ATTENTION_CONFIGS,
    DEFAULT_PERSISTENT,
    ForwardConfig,
    _fail,
    default_plan,
)
from pyptx_kernels.flash_attention.fwd_kernel import (
    build_attention,
    build_attention_varlen,
    check_softcap,
    check_window,
)

NO_FEATURES = ((-1, -1), 0.0)   # (window, softcap) of plain attention
BSHD = ("bshd",) * 3

BACKWARD_HEAD_DIMS = (64, 128)   # head dims the backward kernels support (check_shapes)


def _persistent(persistent, D):
    """``persistent`` as given, else ``$PYPTX_ATTN_PERSISTENT`` (0/1), else the default
    (``DEFAULT_PERSISTENT``); never at head dim 256 (no room for the O staging buffer)."""
    if persistent is None:
        env = os.environ.get("PYPTX_ATTN_PERSISTENT")
        persistent = DEFAULT_PERSISTENT if env is None else env not in ("", "0")
        return bool(persistent) and D <= 128
    return bool(persistent)


@dataclass(frozen=True)
class Tuned:
    """The default plan: chosen among ``ATTENTION_CONFIGS`` without timing (``PLANNER``), or,
    ``persistent`` (``$PYPTX_ATTN_PERSISTENT=1``), the persistent default plan."""

    persistent: bool = False


def _plan(config, D):
    """The plan a dense call runs: ``config``, or the default (``Tuned``, or the plan
    ``$PYPTX_ATTN_SCHEDULE`` names)."""
    if config is not None:
        if not isinstance(config, ForwardConfig):
            raise _fail(f"attention: config must be a ForwardConfig or None, got {config!r}")
        return config
    persistent = _persistent(None, D)
    schedule = os.environ.get("PYPTX_ATTN_SCHEDULE")
    return ForwardConfig(schedule=schedule, persistent=persistent) if schedule \
        else Tuned(persistent)


def _varlen_plan(config):
    """The plan a packed call runs: ``config``, else the default with its schedule settled."""
    if config is None:
        return ForwardConfig(schedule=os.environ.get("PYPTX_ATTN_SCHEDULE") or None)
    if not isinstance(config, ForwardConfig):
        raise _fail(f"attention_varlen: config must be a ForwardConfig or None, got {config!r}")
    return config


def _build_with(B, S, Hq, Hkv, D, *, Sk, dtype, causal, scale, persistent=False,
                window=(-1, -1), softcap=0.0, layouts=BSHD, schedule=None, BN=None, stages=2,
                consumers=None):
    """``build_attention`` with one ``ATTENTION_CONFIGS`` plan given as keywords (the tuner's)."""
    plan = ForwardConfig(schedule=schedule, BN=BN, stages=stages, consumers=consumers,
                         persistent=persistent)
    return build_attention(B, S, Hq, Hkv, D, Sk=Sk, dtype=dtype, causal=causal, scale=scale,
                           config=plan, window=window, softcap=softcap, layouts=layouts)


attention_tuned = autotune([Config(**c.changes()) for c in ATTENTION_CONFIGS], key=[
    "B", "S", "Hq", "Hkv", "D", "Sk", "dtype", "causal", "scale", "window", "softcap",
    "layouts"])(_build_with)
"""``build_attention`` with its plan chosen among ``ATTENTION_CONFIGS`` (timed only when
asked: ``PYPTX_AUTOTUNE=1``, ``tune()``)."""


def _plan_name(D, causal, BH, S):
    """``fwd_config.default_plan``'s plan name (the heuristic behind the shipped tables)."""
    return default_plan(D, causal, BH, S).name


PLANNER = _tuning.Planner(
    "attention_fwd",
    lambda kv: {"D": kv["D"], "causal": kv["causal"], "BH": kv["B"] * kv["Hq"], "S": kv["S"]},
    {c.name: Config(**c.changes()) for c in ATTENTION_CONFIGS}, _plan_name)
"""The forward's plan without timing: the shipped table's for the bucket of head dim,
causal, ``B * Hq`` and ``S`` (op ``"attention_fwd"``), else ``fwd_config.default_plan``."""

attention_planned = _tuning.planned(attention_tuned, PLANNER)
"""``attention_tuned`` whose default call takes a saved winner, else ``PLANNER``'s plan (no
timing): what a default dense call launches."""


@functools.lru_cache(maxsize=128)
def _forward(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, plan, features=NO_FEATURES,
             layouts=BSHD):
    """The dense forward kernel of a plan (``ForwardConfig`` or ``Tuned``); ``features``:
    ``(window, softcap)``."""
    window, softcap = features
    kw = dict(Sk=Sk, dtype=dtype, causal=causal, scale=scale, window=window, softcap=softcap,
              layouts=layouts)
    if isinstance(plan, Tuned):   # persistent=True (the env var) names one plan: no choice
        extra = dict(persistent=True) if plan.persistent else {}
        return attention_planned(B, S, Hq, Hkv, D, **kw, **extra)
    return build_attention(B, S, Hq, Hkv, D, **kw, config=plan)


def _features(window, softcap):
    """``(window, softcap)`` checked (``ConfigError`` at the user's line)."""
    return check_window(window), check_softcap(softcap)


def forward_kernel(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, config=None, *, window=(-1, -1),
                   softcap=0.0, layouts=BSHD):
    """The dense forward kernel a call with these sizes launches (``config=None``: the
    default plan, chosen without timing; ``layouts``: q, k, v's memory orders)."""
    return _forward(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, _plan(config, D),
                    _features(window, softcap), tuple(layouts))


@functools.lru_cache(maxsize=128)
def _varlen(Tq, Tk, B, Hq, Hkv, D, max_q, dtype, causal, scale, plan, features=NO_FEATURES):
    window, softcap = features
    return build_attention_varlen(Tq, Tk, B, Hq, Hkv, D, max_q, dtype=dtype, causal=causal,
                                  scale=scale, config=plan, window=window, softcap=softcap)


def varlen_kernel(Tq, Tk, B, Hq, Hkv, D, max_q, dtype, causal, scale, config=None, *,
                  window=(-1, -1), softcap=0.0):
    """The packed forward kernel a call with these sizes launches."""
    return _varlen(Tq, Tk, B, Hq, Hkv, D, max_q, dtype, causal, scale, _varlen_plan(config),
                   _features(window, softcap))


def memory_layouts(*xs):
    """``(tensors, layouts)`` for the dense kernel from logical ``(B, S, H, D)`` torch
    tensors: one contiguous as it is (``"bshd"``), one whose memory is ``(B, H, S, D)`` (an
    SDPA-style tensor transposed) as that contiguous tensor (``"bhsd"``), any other a
    contiguous copy (``"bshd"``). JAX arrays stay as they are (``"bshd"``)."""
    out, lays = [], []
    for x in xs:
        if framework(x) != "torch" or x.is_contiguous():
            out.append(x)
            lays.append("bshd")
            continue
        t = x.transpose(1, 2)
        if t.is_contiguous():
            out.append(t)
            lays.append("bhsd")
        else:
            out.append(x.contiguous())
            lays.append("bshd")
    return tuple(out), tuple(lays)


def _dtype_name(x):
    name = {"bfloat16": "bf16", "float16": "f16"}.get(str(x.dtype).replace("torch.", ""))
    if name is None:
        raise _fail(f"flash attention: q, k, v must be bfloat16 or float16, got {x.dtype}")
    return name


def _bwd_module():
    """The backward kernels' module (imported late: it is large and the forward needs it
    only when gradients are asked for)."""
    from pyptx_kernels.flash_attention import backward

    return backward


def _no_backward_message(D):
    return (f"no backward at head dim {D}: the attention backward kernels support head dims "
            f"{' and '.join(map(str, BACKWARD_HEAD_DIMS))}; for inference call "
            f"attention_forward (or attention_varlen_forward), or run under torch.no_grad()")


class NoBackward:
    """A kernel-like backward (``in_specs``, ``out_specs``, ``name``, ``arg_names``) for a
    forward whose backward does not exist (head dim 256): ``differentiable_kernel`` accepts
    it, and calling it (``loss.backward()``, ``jax.grad``) raises ``ConfigError`` naming the
    head dim, prefixed with the ``file:line`` of the latest ``attention()`` /
    ``attention_varlen()`` call that ran this forward (``where``)."""

    def __init__(self, fwd, D, n_saved_in, n_grad=3, message=None):
        n_out = len(fwd.out_specs)
        self.in_specs = tuple(fwd.in_specs[:n_saved_in]) + tuple(fwd.out_specs) * 2
        self.out_specs = tuple(fwd.in_specs[:n_grad])
        self.arg_names = tuple(f"x{i}" for i in range(n_saved_in + 2 * n_out + n_grad))
        self.name = f"{fwd.name}_no_backward"
        self.D = D
        self.message = message or _no_backward_message(D)
        self.where = "<unknown>:0"

    def __call__(self, *args):
        raise ConfigError(f"{self.where}: attention: {self.message}")


def _refuse_grad(fn, D, xs, op):
    """``attention()``/``attention_varlen()`` without a backward (a head dim, or a window or
    soft cap the backward does not take): ``ConfigError`` now when torch will want gradients
    (``requires_grad`` and grad mode on); otherwise note the call's ``file:line`` in ``op``'s
    ``NoBackward`` (a later ``jax.grad`` raises there)."""
    bwd = getattr(op, "backward_kernel", None)
    if not isinstance(bwd, NoBackward):
        return
    if framework(xs[0]) == "torch":
        import torch

        if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
            raise _fail(f"{fn}: q, k or v requires grad, but there is {bwd.message}")
    bwd.where = where()


def feature_keywords(features):
    """The keywords that hand ``(window, softcap)`` to a backward builder: none for plain
    attention (so a backward that does not know them yet still builds)."""
    window, softcap = features
    return {} if features == NO_FEATURES else dict(window=window, softcap=softcap)


def build_backward(builder, *args, features=NO_FEATURES, **kw):
    """``builder(*args, **kw)`` with ``features``' keywords; ``ConfigError`` when the backward
    does not take a window or soft cap yet (``TypeError`` of an unknown keyword)."""
    try:
        return builder(*args, **kw, **feature_keywords(features))
    except TypeError as e:
        if features == NO_FEATURES or "unexpected keyword" not in str(e):
            raise
        raise _fail(f"attention: {_features_message(features)}") from None


def _features_message(features):
    window, softcap = features
    return (f"no backward with window={window}, softcap={softcap:g} yet: the attention "
            f"backward kernels take neither; for inference call attention_forward (or "
            f"attention_varlen_forward), or run under torch.no_grad()")


@functools.lru_cache(maxsize=128)
def _differentiable(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, plan=None, deterministic=True,
                    features=NO_FEATURES):
    """The forward kernel of ``plan`` (``ForwardConfig``, ``Tuned`` or None: the default)
    wrapped with the backward (``BackwardPlan.for_eager``'s kernels falling back to the
    deterministic dQ / dK-dV pair, which JAX and ``torch.compile`` traces run), or with
    ``NoBackward`` where the backward refuses (head dim 256, a window or soft cap it does not
    take)."""
    fwd = _forward(B, S, Hq, Hkv, D, Sk, dtype, causal, scale,
                   _plan(None, D) if plan is None else plan, features)
    bwd_mod = _bwd_module()
    from pyptx.autodiff import differentiable_kernel

    kw = dict(Sk=Sk, dtype=dtype, causal=causal, scale=scale, features=features)
    build = bwd_mod.build_attention_backward
    try:
        bwd = build_backward(build, B, S, Hq, Hkv, D, **kw)
    except PyptxError:  # a size or feature the backward refuses: gradients raise
        msg = None if features == NO_FEATURES else _features_message(features)
        return differentiable_kernel(fwd, NoBackward(fwd, D, 3, message=msg),
                                     save_for_backward=[0, 1, 2], save_outputs=[0, 1],
                                     num_grad_inputs=3)
    from pyptx_kernels.flash_attention.bwd_plan import BackwardPlan

    fast = BackwardPlan.for_eager(D, deterministic)
    if fast != BackwardPlan():
        try:
            bwd = build_backward(build, B, S, Hq, Hkv, D, **kw, plan=fast).with_fallback(bwd)
        except PyptxError:  # the pair alone
            pass
    return differentiable_kernel(fwd, bwd, save_for_backward=[0, 1, 2], save_outputs=[0, 1],
                                 num_grad_inputs=3)


def _shapes(q, k, v):
    if len(q.shape) != 4 or len(k.shape) != 4 or tuple(k.shape) != tuple(v.shape):
        raise _fail(f"attention expects q (B, S, Hq, D) and k, v (B, Sk, Hkv, D), got "
                    f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, S, Hq, D = (int(d) for d in q.shape)
    Bk, Sk, Hkv, Dk = (int(d) for d in k.shape)
    if Bk != B or Dk != D or Hq % Hkv:
        raise _fail(f"attention: k/v {tuple(k.shape)} do not match q {tuple(q.shape)} "
                    f"(same B and D, Hq a multiple of Hkv)")
    name = _dtype_name(q)
    if _dtype_name(k) != name or _dtype_name(v) != name:
        raise _fail(f"attention: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, "
                    f"{v.dtype}")
    return B, S, Hq, Hkv, D, Sk, name


def _contiguous(*xs):
    return tuple(x.contiguous() if framework(x) == "torch" else x for x in xs)


def _scale(scale, D):
    return 1.0 / math.sqrt(D) if scale is None else float(scale)


def attention_forward(q, k, v, causal=False, scale=None, *, config=None, window=(-1, -1),
                      softcap=0.0):
    """``(o, lse)`` of the forward kernel (no autograd): ``o (B, S, Hq, D)``, ``lse (B, Hq, S)``
    float32, natural log of each row's sum of ``exp(scale * q.k)`` (of the capped scores with
    ``softcap``). ``window``, ``softcap``: ``build_attention``'s. ``config``: the plan
    (``ForwardConfig``), by default chosen without timing (``PLANNER``). Torch views whose
    memory is ``(B, H, S, D)`` are read in place (``memory_layouts``)."""
    B, S, Hq, Hkv, D, Sk, name = _shapes(q, k, v)
    xs, layouts = memory_layouts(q, k, v)
    kern = forward_kernel(B, S, Hq, Hkv, D, Sk, name, bool(causal), _scale(scale, D), config,
                          window=window, softcap=softcap, layouts=layouts)
    return kern(*xs)


def attention(q, k, v, causal=False, scale=None, *, config=None, deterministic=True,
              window=(-1, -1), softcap=0.0):
    """Flash attention ``softmax(scale * q k^T) v`` (torch tensors or JAX arrays):
    ``q (B, S, Hq, D)``, ``k, v (B, Sk, Hkv, D)`` with ``Hq % Hkv == 0``, bf16 or f16,
    ``D`` in 64/128/256. ``causal``: key ``j`` allowed for query ``i`` iff ``j <= i``.
    ``scale`` defaults to ``1/sqrt(D)``. Differentiable in ``q, k, v`` at ``D`` 64 and 128;
    at 256 there is no backward: torch inputs that require grad (grad mode on) raise
    ``ConfigError`` here, ``jax.grad`` raises it when it reaches the backward.
    ``config``, ``window``, ``softcap``: as ``attention_forward``'s (the backward takes them;
    at D=64 it runs the dQ / dK-dV pair: the fused kernel does not take them yet).
    ``deterministic=False``: a faster backward whose dQ sums come in run-dependent order
    (torch eager only)."""
    B, S, Hq, Hkv, D, Sk, name = _shapes(q, k, v)
    fn = _differentiable(B, S, Hq, Hkv, D, Sk, name, bool(causal), _scale(scale, D),
                         _plan(config, D), bool(deterministic), _features(window, softcap))
    _refuse_grad("attention", D, (q, k, v), fn)
    return fn(*_contiguous(q, k, v))[0]


def _varlen_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """``(Tq, Tk, B, Hq, Hkv, D, max_q, max_k, dtype name)`` of a packed call, or
    ``ConfigError`` at the user's line."""
    if len(q.shape) != 3 or len(k.shape) != 3 or tuple(k.shape) != tuple(v.shape):
        raise _fail(f"attention_varlen expects q (Tq, Hq, D) and k, v (Tk, Hkv, D), got "
                    f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    Tq, Hq, D = (int(d) for d in q.shape)
    Tk, Hkv, _ = (int(d) for d in k.shape)
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if len(cu.shape) != 1 or "int32" not in str(cu.dtype):
            raise _fail(f"attention_varlen: {name} must be a 1-D int32 tensor (B + 1,), got "
                        f"shape {tuple(cu.shape)} dtype {cu.dtype}")
    B = int(cu_seqlens_q.shape[0]) - 1
    if int(cu_seqlens_k.shape[0]) - 1 != B or B < 1:
        raise _fail(f"attention_varlen: cu_seqlens_q and cu_seqlens_k must both have B + 1 "
                    f"entries, got {cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")
    if int(k.shape[2]) != D or Hq % Hkv:
        raise _fail(f"attention_varlen: k/v {tuple(k.shape)} do not match q {tuple(q.shape)} "
                    f"(same D, Hq a multiple of Hkv)")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise _fail(f"attention_varlen: {name} must be a positive Python int (the "
                        f"longest sequence), got {m!r}")
    name = _dtype_name(q)
    if _dtype_name(k) != name or _dtype_name(v) != name:
        raise _fail(f"attention_varlen: q, k, v must share one dtype, got {q.dtype}, "
                    f"{k.dtype}, {v.dtype}")
    return Tq, Tk, B, Hq, Hkv, D, max_seqlen_q, max_seqlen_k, name


def attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             causal=False, scale=None, *, config=None, window=(-1, -1),
                             softcap=0.0):
    """``(o, lse)`` of the packed variable-length forward (no autograd): ``o (Tq, Hq, D)``,
    ``lse (Hq, Tq)`` float32 (``-inf`` for rows of a sequence without keys); ``window`` and
    ``softcap`` as ``attention_forward``'s, per sequence."""
    Tq, Tk, B, Hq, Hkv, D, max_q, _, name = _varlen_shapes(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    kern = varlen_kernel(Tq, Tk, B, Hq, Hkv, D, max_q, name, bool(causal), _scale(scale, D),
                         config, window=window, softcap=softcap)
    return kern(*_contiguous(q, k, v, cu_seqlens_q, cu_seqlens_k))


@functools.lru_cache(maxsize=128)
def _differentiable_varlen(Tq, Tk, B, Hq, Hkv, D, max_q, max_k, dtype, causal, scale,
                           plan=None, features=NO_FEATURES):
    """The varlen forward wrapped with the varlen backward pair
    (``build_attention_backward_varlen``: the deterministic dQ / dK-dV kernels) by
    ``differentiable_kernel`` (saved ``q, k, v, cu_q, cu_k`` and ``o, lse``; gradients of
    ``q, k, v``), or with ``NoBackward`` where the backward refuses (head dim 256, a window
    or soft cap it does not take)."""
    fwd = _varlen(Tq, Tk, B, Hq, Hkv, D, max_q, dtype, causal, scale, _varlen_plan(plan),
                  features)
    from pyptx.autodiff import differentiable_kernel

    bwd = NoBackward(fwd, D, 5)
    if D in BACKWARD_HEAD_DIMS:
        try:
            bwd = build_backward(_bwd_module().build_attention_backward_varlen, Tq, Tk, B, Hq,
                                 Hkv, D, max_q, max_k, dtype=dtype, causal=causal, scale=scale,
                                 features=features)
        except PyptxError:
            if features == NO_FEATURES:
                raise
            bwd = NoBackward(fwd, D, 5, message=_features_message(features))
    return differentiable_kernel(fwd, bwd, save_for_backward=[0, 1, 2, 3, 4],
                                 save_outputs=[0, 1], num_grad_inputs=3)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     causal=False, scale=None, *, config=None, window=(-1, -1), softcap=0.0):
    """Flash attention over packed sequences (the flash-attention packages' layout):
    ``q (Tq, Hq, D)``, ``k, v (Tk, Hkv, D)``, ``cu_seqlens_q/k`` int32 ``(B + 1,)`` on the
    device (sequence ``b`` is rows ``cu[b]:cu[b+1]``; empty sequences allowed),
    ``max_seqlen_q/k`` Python ints (the grids' sizes: no host sync, so the call can be
    captured in a CUDA graph). ``causal`` is top-left aligned per sequence. Returns ``o (Tq,
    Hq, D)``, differentiable in ``q, k, v`` at head dims 64 and 128 through the deterministic
    varlen backward pair; at head dim 256 there is no backward (as ``attention``).
    ``Tq``/``Tk`` should equal ``cu_seqlens_q/k[-1]``: rows past the last sequence get no
    output and no gradient. ``window``, ``softcap``: as ``attention``'s, per sequence."""
    Tq, Tk, B, Hq, Hkv, D, max_q, max_k, name = _varlen_shapes(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    fn = _differentiable_varlen(Tq, Tk, B, Hq, Hkv, D, max_q, max_k, name, bool(causal),
                                _scale(scale, D), _varlen_plan(config), _features(window, softcap))
    _refuse_grad("attention_varlen", D, (q, k, v), fn)
    return fn(*_contiguous(q, k, v, cu_seqlens_q, cu_seqlens_k))[0]
