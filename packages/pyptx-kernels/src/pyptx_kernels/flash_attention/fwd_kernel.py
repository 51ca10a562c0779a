"""The forward kernel builders: ``build_attention`` (dense ``(B, S, H, D)`` batches) and
``build_attention_varlen`` (packed sequences), assembled from the tile scheduler
(``fwd_scheduler``), the main loop (``fwd_mainloop``, ``fwd_softmax``, ``masks``) and the
epilogue (``fwd_epilogue``), for one plan (``fwd_config.ForwardConfig``).

A CTA is one producer warpgroup (``setmaxnreg.dec`` to 24 registers) and 2 or 3 consumer
warpgroups of 64 query rows each (``setmaxnreg.inc``: 240 registers with two, 160 with
three). Grouped-query and multi-query attention (fewer KV heads) read KV head
``h // (Hq // Hkv)``. Q, K and V are read through rank-4 tensor maps over ``(B, S, H, D)``
or ``(B, H, S, D)`` (``layouts``; rank 3 over ``(T, H, D)`` packed): copies past a
sequence's end read zeros. Sizes that vary per call (batch, sequence lengths, packed total
rows) are kernel parameters, so the PTX of a family (dtype, head dim, causal, window, soft
cap, layouts, plan) does not depend on them; the sliding window and the soft cap are
``masks.block_plan`` / ``mask_scores`` and ``OnlineSoftmax.cap_scores``.
"""

from __future__ import annotations

import math

from pyptx import Tile, kernel
from pyptx.types import f32, s32
from pyptx_kernels import _family
from pyptx_kernels.flash_attention.fwd_config import (
    LOG2E,
    ForwardConfig,
    _dtype,
    _fail,
    consumer_regs,
    dense_grid,
    varlen_grid,
)

DEFAULT_CONFIG = ForwardConfig()


LAYOUTS = ("bshd", "bhsd")


def _body(Q, K, V, CUQ, CUK, Out, LSE, *, shape, plan, dt, causal, scale, varlen, ctas,
          window=(-1, -1), softcap=0.0, layouts=("bshd",) * 3):
    """The kernel's instructions: ``shape = (B, S, Sk, Hq, Hkv, D, Tq)`` (``S`` the rows per
    sequence the grid covers, ``Sk``/``Tq`` None where unused), ``plan`` resolved. The sizes
    that vary per call are kernel parameters (the PTX does not depend on them): ``B`` (read
    by the persistent walk), ``S`` and ``Sk`` dense, ``Tq`` packed."""
    # The tracing code, loaded at the first trace: a kernel reused from its family's code
    # (this process's or the disk cache's) never imports it.
    from pyptx import ptx
    from pyptx.warpspec import Roles, thread_ids
    from pyptx_kernels.flash_attention.fwd_epilogue import Epilogue
    from pyptx_kernels.flash_attention.fwd_mainloop import ConsumerMainloop, SharedRings, produce
    from pyptx_kernels.flash_attention.fwd_scheduler import TileScheduler

    B, S, Sk, Hq, Hkv, D, Tq = shape
    BN, wgs, persistent = plan.BN, plan.consumers, ctas is not None
    tid, wg = thread_ids()
    if varlen:
        B = S = Sk = None
        Tq = ptx.scalar_param(s32, Tq, name="total_q")
    else:
        S = ptx.scalar_param(s32, S, name="seqlen_q")
        Sk = ptx.scalar_param(s32, Sk, name="seqlen_k")
        B = ptx.scalar_param(s32, B, name="batch") if persistent else B
    sched = TileScheduler(B=B, S=S, Sk=Sk, Hq=Hq, Hkv=Hkv, BN=BN, bm=plan.bm, causal=causal,
                          varlen=varlen, ctas=ctas, CUQ=CUQ, CUK=CUK, window=window)
    sm = SharedRings(bm=plan.bm, BN=BN, D=D, dt=dt, stages=plan.stages, wgs=wgs,
                     persistent=persistent, tid=tid)
    roles = Roles(wg, 24)
    produce(sm, sched, Q, K, V, BN=BN, D=D, varlen=varlen, persistent=persistent, tid=tid,
            layouts=layouts)
    roles.consumers(consumer_regs(wgs)[1])
    # a soft cap keeps tanh(scale * S / softcap); its softmax scale is softcap * log2(e)
    sl2, cap = ((softcap * LOG2E, float(scale) / softcap) if softcap
                else (float(scale) * LOG2E, None))
    ml = ConsumerMainloop(sm, tid=tid, wg=wg, wgs=wgs, BN=BN, D=D, dt=dt,
                          sl2=sl2, schedule=plan.schedule, causal=causal,
                          persistent=persistent, pin_overlap=plan.pin_overlap,
                          rescale_threshold=plan.rescale_threshold, window=window, cap=cap)
    ep = Epilogue(ml, Out, LSE, S=S, Hq=Hq, D=D, Tq=Tq, varlen=varlen, persistent=persistent)
    ml.start()
    for x in sched.tiles():
        wrow, rows = ml.run(x)
        ep.store(x, wrow, rows)
    ml.finish()
    ep.finish()
    roles.end()
    ptx.ret()


def _resolve(config, D, Hq, Hkv, dtype, scale, window=(-1, -1), softcap=0.0):
    """``(plan, dt, scale, window, softcap)`` checked: the plan at head dim ``D``, the pyptx
    dtype, the scale, the window as two ints and the soft cap as a float."""
    if not isinstance(config, ForwardConfig):
        raise _fail(f"flash attention: config must be a ForwardConfig, got {config!r}")
    dt = _dtype(dtype)
    plan = config.resolve(D)
    if Hq % Hkv:
        raise _fail(f"flash attention: Hq={Hq} is not a multiple of Hkv={Hkv}")
    return (plan, dt, 1.0 / math.sqrt(D) if scale is None else float(scale),
            check_window(window), check_softcap(softcap))


def check_window(window):
    """``window`` as ``(left, right)`` ints, each ``-1`` (unbounded) or ``>= 0``, else
    ``ConfigError``."""
    try:
        left, right = window
    except (TypeError, ValueError):
        raise _fail(f"flash attention: window must be a pair (left, right) of ints >= -1, "
                    f"got {window!r}") from None
    for w in (left, right):
        if isinstance(w, bool) or not isinstance(w, int) or w < -1:
            raise _fail(f"flash attention: window must be a pair (left, right) of ints >= -1 "
                        f"(-1: unbounded), got {window!r}")
    return int(left), int(right)


def check_softcap(softcap):
    """``softcap`` as a float, 0 (none) or positive and finite, else ``ConfigError``."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) \
            or not math.isfinite(softcap) or softcap < 0:
        raise _fail(f"flash attention: softcap must be 0 (none) or a positive finite number, "
                    f"got {softcap!r}")
    return float(softcap)


def _check_layouts(layouts):
    if (not isinstance(layouts, tuple) or len(layouts) != 3
            or any(x not in LAYOUTS for x in layouts)):
        raise _fail(f"flash attention: layouts must be a tuple of three of {LAYOUTS} (q, k, v), "
                    f"got {layouts!r}")
    return layouts


def _feature_tag(causal, window, softcap):
    """Kernel-name suffix of the mask and the soft cap."""
    tag = "_causal" if causal else ""
    if window != (-1, -1):
        tag += "_w" + "_".join("n" if w < 0 else str(w) for w in window)
    return tag + ("_cap" + f"{softcap:g}".replace(".", "p") if softcap else "")


def _layout_tag(layouts):
    return "" if layouts == ("bshd",) * 3 else "_" + "".join(x[1] for x in layouts)


def build_attention(B, S, Hq, Hkv, D, *, Sk=None, dtype="bf16", causal=False, scale=None,
                    config=DEFAULT_CONFIG, window=(-1, -1), softcap=0.0,
                    layouts=("bshd",) * 3):
    """The forward kernel for ``q (B, S, Hq, D)``, ``k, v (B, Sk, Hkv, D)``: returns
    ``o (B, S, Hq, D)`` and ``lse (B, Hq, S)`` f32 (natural log of each row's sum of
    ``exp(scale q.k)``). ``scale`` defaults to ``1/sqrt(D)``; ``causal`` masks key ``j > i``
    (top-left aligned). ``window=(left, right)``: query ``i`` sees keys ``i - left .. i +
    right`` (``-1`` unbounded; causal caps ``right`` at 0); blocks wholly outside are skipped.
    ``softcap > 0``: the scaled scores become ``softcap * tanh(score / softcap)`` (lse of
    those). ``layouts``: the memory order of q, k, v, each ``"bshd"`` or ``"bhsd"`` (the
    input is then ``(B, H, S, D)``); o is ``(B, S, Hq, D)``. ``B``, ``S`` and ``Sk`` are
    kernel parameters: kernels of two sizes have one PTX. ``config``: the plan
    (``ForwardConfig``), checked against ``D``."""
    plan, dt, scale, window, softcap = _resolve(config, D, Hq, Hkv, dtype, scale, window,
                                                softcap)
    layouts = _check_layouts(layouts)
    Sk = S if Sk is None else Sk
    bm, BN = plan.bm, plan.BN
    grid, ctas = dense_grid(B, S, Hq, plan)

    def spec(H, L, lay, rows):
        if lay == "bhsd":
            return Tile(B, H, L, D, dt), dict(box=(1, 1, rows, 64), swizzle="128B")
        return Tile(B, L, H, D, dt), dict(box=(1, rows, 1, 64), swizzle="128B")

    (qs, qm), (ks, km), (vs, vm) = (spec(Hq, S, layouts[0], bm), spec(Hkv, Sk, layouts[1], BN),
                                    spec(Hkv, Sk, layouts[2], BN))
    tma = {"Q": qm, "K": km, "V": vm, "Out": dict(box=(1, 64, 1, 64), swizzle="128B")}
    name = (f"flash_fwd_{dt.name}_d{D}_bn{BN}_s{plan.stages}_{plan.schedule}"
            f"{_feature_tag(causal, window, softcap)}_g{Hq // Hkv}"
            f"{'_persistent' if plan.persistent else ''}{plan.name_tag()}{_layout_tag(layouts)}")
    deco = kernel(in_specs=(qs, ks, vs),
                  out_specs=(Tile(B, S, Hq, D, dt), Tile(B, Hq, S, f32)),
                  grid=grid, block=(128 * (1 + plan.consumers), 1, 1), smem=plan.smem(D),
                  maxnreg=consumer_regs(plan.consumers)[0], tma=tma, name=name)

    def flash_fwd(Q, K, V, Out, LSE):
        _body(Q, K, V, None, None, Out, LSE, shape=(B, S, Sk, Hq, Hkv, D, None), plan=plan,
              dt=dt, causal=causal, scale=scale, varlen=False, ctas=ctas, window=window,
              softcap=softcap, layouts=layouts)
    family = ("attention_fwd", dt.name, D, Hq, Hkv, causal, scale, window, softcap, layouts,
              plan, ctas)
    sizes = {"seqlen_q": S, "seqlen_k": Sk, **({"batch": B} if ctas is not None else {})}
    return _family.specialized(deco(flash_fwd), family, sizes)


def build_attention_varlen(Tq, Tk, B, Hq, Hkv, D, max_seqlen_q, *, dtype="bf16", causal=False,
                           scale=None, config=DEFAULT_CONFIG, window=(-1, -1), softcap=0.0):
    """The packed variable-length forward kernel: ``q (Tq, Hq, D)``, ``k, v (Tk, Hkv, D)``,
    ``cu_seqlens_q``/``cu_seqlens_k`` int32 ``(B + 1,)``; returns ``o (Tq, Hq, D)`` and
    ``lse (Hq, Tq)`` f32. The grid covers ``max_seqlen_q`` rows per sequence; ``causal`` and
    ``window`` are top-left aligned per sequence; ``softcap`` and ``config`` as
    ``build_attention``'s, not persistent. ``Tq`` is a kernel parameter and the sequence
    bounds are read on the device: kernels of two sizes have one PTX."""
    plan, dt, scale, window, softcap = _resolve(config, D, Hq, Hkv, dtype, scale, window,
                                                softcap)
    if plan.persistent:
        raise _fail("flash attention: the packed (varlen) kernel has no persistent plan")
    bm, BN = plan.bm, plan.BN
    tma = {"Q": dict(box=(bm, 1, 64), swizzle="128B"),
           "K": dict(box=(BN, 1, 64), swizzle="128B"),
           "V": dict(box=(BN, 1, 64), swizzle="128B")}
    name = (f"flash_fwd_varlen_{dt.name}_d{D}_bn{BN}_s{plan.stages}_{plan.schedule}"
            f"{_feature_tag(causal, window, softcap)}_g{Hq // Hkv}{plan.name_tag()}")
    deco = kernel(in_specs=(Tile(Tq, Hq, D, dt), Tile(Tk, Hkv, D, dt), Tile(Tk, Hkv, D, dt),
                            Tile(B + 1, s32), Tile(B + 1, s32)),
                  out_specs=(Tile(Tq, Hq, D, dt), Tile(Hq, Tq, f32)),
                  grid=varlen_grid(B, max_seqlen_q, Hq, plan),
                  block=(128 * (1 + plan.consumers), 1, 1), smem=plan.smem(D),
                  maxnreg=consumer_regs(plan.consumers)[0], tma=tma, name=name)

    def flash_fwd_varlen(Q, K, V, CUQ, CUK, Out, LSE):
        _body(Q, K, V, CUQ, CUK, Out, LSE, shape=(B, max_seqlen_q, None, Hq, Hkv, D, Tq),
              plan=plan, dt=dt, causal=causal, scale=scale, varlen=True, ctas=None,
              window=window, softcap=softcap)
    family = ("attention_fwd_varlen", dt.name, D, Hq, Hkv, causal, scale, window, softcap, plan)
    return _family.specialized(deco(flash_fwd_varlen), family, {"total_q": Tq})
