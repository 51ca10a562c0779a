"""The dense backward as one kernel-like object and its host calls: ``build_attention_backward``
builds the kernels a ``BackwardPlan`` names (cached per size and plan) as an
``AttentionBackward`` (``bwd(q, k, v, o, lse, do, dlse) -> (dq, dk, dv)``, for
``pyptx.differentiable_kernel``); ``attention_backward`` is the direct call for torch tensors
or JAX arrays."""

from __future__ import annotations

import functools
import sys
from dataclasses import replace

from pyptx import Tile
from pyptx.errors import ConfigError
from pyptx.types import f32
from pyptx_kernels._common import framework
from pyptx_kernels.flash_attention.bwd_common import (
    BSHD3,
    _dtype,
    _fail,
    check_layouts,
    check_shapes,
    dq_accumulator_width,
    input_spec,
)
from pyptx_kernels.flash_attention.bwd_dkdv import build_dkdv
from pyptx_kernels.flash_attention.bwd_dq import build_dq
from pyptx_kernels.flash_attention.bwd_fused import build_fused
from pyptx_kernels.flash_attention.bwd_plan import (
    BackwardPlan,
    default_dq_bkv,
    default_dq_chains,
    default_heavy_first,
    default_kv_split,
    resolve_stats_lead,
)
from pyptx_kernels.flash_attention.bwd_prep import build_convert, build_prep
from pyptx_kernels.flash_attention.fwd_kernel import check_softcap, check_window


class AttentionBackward:
    """``bwd(q, k, v, o, lse, do, dlse=None) -> (dq, dk, dv)``: the dQ kernel (which also
    writes the stats) then the dK/dV kernel; with ``atomic_dq``, the prep kernel (stats and
    a zeroed f32 dQ), the dK/dV kernel adding dQ too, then the conversion. Kernel-like
    (``in_specs``, ``out_specs``, ``name``, ``arg_names``) so ``pyptx.differentiable_kernel``
    accepts it as a backward kernel. ``layouts``: q, k, v's memory orders (``"bhsd"``: given
    as ``(B, H, S, D)`` tensors, read in place); o, do and the gradients are ``(B, S, H, D)``."""

    def __init__(self, kernels, B, S, Hq, Hkv, D, Sk, dt, atomic_dq=False, fallback=None,
                 layouts=BSHD3):
        self.kernels, self.atomic_dq, self.fallback = kernels, atomic_dq, fallback
        self.layouts = layouts
        self._dims = (B, S, Hq, Hkv, D, Sk, dt)
        qspec, kspec = Tile(B, S, Hq, D, dt), Tile(B, Sk, Hkv, D, dt)
        lse = Tile(B, Hq, S, f32)
        ins = tuple(input_spec(B, L, H, D, dt, lay) for L, H, lay in
                    ((S, Hq, layouts[0]), (Sk, Hkv, layouts[1]), (Sk, Hkv, layouts[2])))
        self.in_specs = (*ins, qspec, lse, qspec, lse)
        self.out_specs = (qspec, kspec, kspec)
        self.arg_names = ("q", "k", "v", "o", "lse", "do", "dlse", "dq", "dk", "dv")
        self.name = kernels[-1].name.replace("_dkdv_", "_")

    @property
    def dq_kernel(self):
        """The dQ kernel (``None`` in the atomic-dQ mode)."""
        return None if self.atomic_dq else self.kernels[0]

    @property
    def dkdv_kernel(self):
        """The dK/dV kernel."""
        return self.kernels[1]

    def __call__(self, q, k, v, o, lse, do, dlse=None):
        """Run the kernels; ``dlse`` is ignored (lse is an auxiliary output)."""
        if not self.atomic_dq:
            dq, stats = self.kernels[0](q, k, v, o, lse, do)
            dk, dv = self.kernels[1](q, k, v, do, stats)
            return dq, dk, dv
        if framework(q) != "torch" or sys.modules["torch"].compiler.is_compiling():
            if self.fallback is not None:   # JAX or a graph trace: the out-of-place pair
                return self.fallback(q, k, v, o, lse, do, dlse)
            from pyptx.source import where

            raise ConfigError(f"{where()}: attention backward with atomic_dq=True adds into a "
                              f"buffer in place: torch eager tensors only (not JAX or "
                              f"torch.compile), got {type(q).__name__}")
        prep, dkdv, *convert = self.kernels
        stats, dqacc, *sem = prep(o, lse, do)
        if "OUT" in dkdv.arg_names:     # stats_lead: the dK/dV grid writes most stats
            sem += [o, lse]
        if not convert:     # dq_convert: the dK/dV grid writes dQ too
            dk, dv, dq = dkdv(q, k, v, do, stats, dqacc, *sem)
            return dq, dk, dv
        dk, dv = dkdv(q, k, v, do, stats, dqacc, *sem)
        (convert,) = convert
        return convert(dqacc), dk, dv

    def with_fallback(self, other):
        """This backward, running ``other`` (same sizes) where an atomic-dQ mode cannot run
        (JAX arrays, ``torch.compile`` traces)."""
        if self._dims != other._dims or self.layouts != other.layouts:
            raise _fail("AttentionBackward.with_fallback: the fallback is for other sizes or "
                        "layouts")
        return AttentionBackward(self.kernels, *self._dims, atomic_dq=self.atomic_dq,
                                 fallback=other, layouts=self.layouts)

    def __repr__(self):
        return f"<AttentionBackward {' + '.join(k.name for k in self.kernels)}>"


def build_attention_backward(B, S, Hq, Hkv, D, *, Sk=None, dtype="bf16", causal=False, scale=None,
                             plan=None, window=(-1, -1), softcap=0.0, layouts=BSHD3,
                             **options):
    """The kernels of ``plan`` (a ``BackwardPlan``; ``None``: ``BackwardPlan()``, the
    deterministic pair) for these sizes, as one ``AttentionBackward``: ``bwd(q, k, v, o, lse,
    do, dlse) -> (dq, dk, dv)``. ``options``: the plan given as its fields' keywords instead
    (``BackwardPlan.from_options``, as ``parse_options`` reads them from a command line).
    ``window``, ``softcap``: the forward's (``build_attention``'s); every plan takes them but
    ``dkdv_bq=128`` (``ConfigError``). ``layouts``: q, k, v's memory orders, each
    ``"bshd"`` or ``"bhsd"`` (the tensor then ``(B, H, S, D)``, read in place through its
    tensor map). ``ConfigError`` for sizes or a plan the kernels do not take."""
    if options:
        if plan is not None:
            raise _fail("build_attention_backward: give plan= or option keywords, not both")
        plan = BackwardPlan.from_options(**options)
    elif plan is None:
        plan = BackwardPlan()
    elif not isinstance(plan, BackwardPlan):
        raise _fail(f"build_attention_backward: plan must be a BackwardPlan, got {plan!r}")
    plan = plan.resolved()
    layouts = check_layouts("build_attention_backward", layouts)
    Sk = S if Sk is None else Sk
    features = (check_window(window), check_softcap(softcap))
    if features != ((-1, -1), 0.0) and plan.dkdv_bq == 128:
        raise _fail(f"build_attention_backward: window={features[0]}, softcap={features[1]:g} "
                    f"are not taken yet by the {plan.name} plan with dkdv_bq={plan.dkdv_bq} "
                    f"(128-row dK/dV q blocks); the other plans take them")
    sized = isinstance(Hq, int) and isinstance(Hkv, int) and Hkv > 0
    split = plan.kv_split
    if split == "auto":
        split = default_kv_split(Hq // Hkv, bool(causal)) if sized else 1
    chains = plan.dq_chains
    if chains == "auto":    # the ordered dK/dV kernel's; one chain elsewhere
        chains = (default_dq_chains(S, Sk, Hq, Hkv, D, bool(causal))
                  if sized and plan.dq_ordered and plan.fused_bq is None else 1)
    plan = replace(plan, kv_split=split, dq_chains=chains)
    if plan.fused_bq is None:
        lead = resolve_stats_lead("build_attention_backward", plan.stats_lead, Sk, plan.num_sms,
                                  plan.dq_ordered, plan.safe, plan.dkdv_bq, causal,
                                  kv_split=split)
        plan = replace(plan, stats_lead=lead)
    if plan.heavy_first == "auto":
        plan = replace(plan, heavy_first=default_heavy_first(
            causal, features[0], plan.fused_bq is not None, plan.stats_lead,
            Hq // Hkv if sized else 1, S))
    return _build(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, plan, features, layouts)


@functools.lru_cache(maxsize=64)
def _build(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, plan, features=((-1, -1), 0.0),
           layouts=BSHD3):
    """The kernels of a resolved ``plan`` (``safe`` a bool, ``stats_lead`` an int),
    ``features`` (``(window, softcap)``, checked) and ``layouts`` (checked)."""
    window, softcap = features
    kw = dict(Sk=Sk, dtype=dtype, causal=causal, scale=scale, safe=plan.safe)
    feat = {} if features == ((-1, -1), 0.0) else dict(window=window, softcap=softcap)
    lay = {} if layouts == BSHD3 else dict(layouts=layouts)
    dkdv_kw = dict(kw, BQ=plan.dkdv_bq, overlap=plan.dkdv_overlap, kv_split=plan.kv_split,
                   heavy_first=plan.heavy_first)
    dt = _dtype(dtype)
    ordered = plan.dq_ordered
    if plan.fused_bq:
        fused = build_fused(B, S, Hq, Hkv, D, Sk=Sk, dtype=dtype, causal=causal, scale=scale,
                            ordered=ordered, defer=plan.fused_defer,
                            pingpong=plan.fused_pingpong, kv_split=plan.kv_split,
                            heavy_first=plan.heavy_first, **feat, **lay)
        kernels = (build_prep(B, S, Hq, D, dtype=dtype, counters=ordered,
                              zero=True if feat else None),     # a window: q blocks unreached
                   fused, build_convert(B, S, Hq, D, dtype=dtype))
    elif plan.atomic_dq:
        check_shapes(B, S, Hq, Hkv, D, Sk)
        width, chains = dq_accumulator_width(D, plan.dq_bulk), plan.dq_chains
        # a window or chains: q blocks (chains) no kv block reaches get no first store; the
        # conversion kernel reads them (zeroed), the dK/dV grid's converters do not
        unreached = bool(feat) or chains > 1
        kernels = (build_prep(B, S, Hq, D, dtype=dtype, counters=ordered, width=width * chains,
                              lead=plan.stats_lead, Hkv=Hkv,
                              zero=None if not unreached else not plan.dq_convert,
                              chains=chains),
                   build_dkdv(B, S, Hq, Hkv, D, atomic_dq=True, dq_bulk=plan.dq_bulk,
                              dq_ordered=ordered, num_sms=plan.num_sms,
                              dq_convert=plan.dq_convert, convert_lag=plan.convert_lag,
                              stats_lead=plan.stats_lead, dq_chains=chains, **dkdv_kw, **feat,
                              **lay),  # adds dQ
                   build_convert(B, S, Hq, D, dtype=dtype, width=width, chains=chains))
        if plan.dq_convert:      # the dK/dV grid converts dQ
            kernels = kernels[:2]
    else:
        dq_kw = dict(kw, BKV=default_dq_bkv(D) if plan.dq_bkv is None else plan.dq_bkv)
        kernels = (build_dq(B, S, Hq, Hkv, D, **dq_kw, **feat, **lay),
                   build_dkdv(B, S, Hq, Hkv, D, **dkdv_kw, **feat, **lay))
    return AttentionBackward(kernels, B, S, Hq, Hkv, D, Sk, dt,
                             plan.atomic_dq or plan.fused_bq is not None, layouts=layouts)


def attention_backward(q, k, v, o, lse, do, causal=False, scale=None, *, plan=None,
                       window=(-1, -1), softcap=0.0, **options):
    """``(dq, dk, dv)`` of attention for torch tensors or JAX arrays (``q/o/do (B, S, Hq, D)``,
    ``k/v (B, Sk, Hkv, D)``, ``lse (B, Hq, S)`` float32) by the kernels of ``plan`` (or its
    ``options`` keywords, as ``build_attention_backward``); ``window``, ``softcap``: the
    forward's. Torch q, k, v whose memory is ``(B, H, S, D)`` (transposed views) are read in
    place; o, do, lse and other strides are made contiguous first."""
    if len(q.shape) != 4 or len(k.shape) != 4 or tuple(k.shape) != tuple(v.shape):
        raise _fail(f"attention_backward: q (B, S, Hq, D) and k, v (B, Sk, Hkv, D) expected, "
                    f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, S, Hq, D = (int(x) for x in q.shape)
    Sk, Hkv = int(k.shape[1]), int(k.shape[2])
    name = {"bfloat16": "bf16", "float16": "f16"}.get(str(q.dtype).replace("torch.", ""))
    if name is None:
        raise _fail(f"attention_backward: q must be bfloat16 or float16, got {q.dtype}")
    layouts = BSHD3
    if framework(q) == "torch":
        from pyptx_kernels.flash_attention.fwd_host import memory_layouts

        (q, k, v), layouts = memory_layouts(q, k, v)
        o, lse, do = (x.contiguous() for x in (o, lse, do))
    bwd = build_attention_backward(B, S, Hq, Hkv, D, Sk=Sk, dtype=name, causal=causal,
                                   scale=None if scale is None else float(scale), plan=plan,
                                   window=window, softcap=softcap, layouts=layouts, **options)
    return bwd(q, k, v, o, lse, do)
