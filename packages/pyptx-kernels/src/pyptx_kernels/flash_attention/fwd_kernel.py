"""The forward kernel builders: ``build_attention`` (dense ``(B, S, H, D)`` batches) and
``build_attention_varlen`` (packed sequences), assembled from the tile scheduler
(``fwd_scheduler``), the main loop (``fwd_mainloop``, ``fwd_softmax``, ``masks``) and the
epilogue (``fwd_epilogue``), for one plan (``fwd_config.ForwardConfig``).

A CTA is one producer warpgroup (``setmaxnreg.dec`` to 24 registers) and 2 or 3 consumer
warpgroups of 64 query rows each (``setmaxnreg.inc``: 240 registers with two, 160 with
three). Grouped-query and multi-query attention (fewer KV heads) read KV head
``h // (Hq // Hkv)``. K and V are read through rank-4 tensor maps over ``(B, S, H, D)``
(rank 3 over ``(T, H, D)`` packed): copies past a sequence's end read zeros.
"""

from __future__ import annotations

import math

from pyptx import Tile, kernel, ptx
from pyptx.types import f32, s32
from pyptx.warpspec import Roles, thread_ids
from pyptx_kernels.flash_attention.fwd_config import (
    LOG2E,
    ForwardConfig,
    _dtype,
    _fail,
    consumer_regs,
)
from pyptx_kernels.flash_attention.fwd_epilogue import Epilogue
from pyptx_kernels.flash_attention.fwd_mainloop import ConsumerMainloop, SharedRings, produce
from pyptx_kernels.flash_attention.fwd_scheduler import TileScheduler, dense_grid, varlen_grid

DEFAULT_CONFIG = ForwardConfig()


def _body(Q, K, V, CUQ, CUK, Out, LSE, *, shape, plan, dt, causal, scale, varlen, ctas):
    """The kernel's instructions: ``shape = (B, S, Sk, Hq, Hkv, D, Tq)`` (``S`` the rows per
    sequence the grid covers, ``Sk``/``Tq`` None where unused), ``plan`` resolved."""
    B, S, Sk, Hq, Hkv, D, Tq = shape
    BN, wgs, persistent = plan.BN, plan.consumers, ctas is not None
    tid, wg = thread_ids()
    sched = TileScheduler(B=B, S=S, Sk=Sk, Hq=Hq, Hkv=Hkv, BN=BN, bm=plan.bm, causal=causal,
                          varlen=varlen, ctas=ctas, CUQ=CUQ, CUK=CUK)
    sm = SharedRings(bm=plan.bm, BN=BN, D=D, dt=dt, stages=plan.stages, wgs=wgs,
                     persistent=persistent, tid=tid)
    roles = Roles(wg, 24)
    produce(sm, sched, Q, K, V, BN=BN, D=D, varlen=varlen, persistent=persistent, tid=tid)
    roles.consumers(consumer_regs(wgs)[1])
    ml = ConsumerMainloop(sm, tid=tid, wg=wg, wgs=wgs, BN=BN, D=D, dt=dt,
                          sl2=float(scale) * LOG2E, schedule=plan.schedule, causal=causal,
                          persistent=persistent, pin_overlap=plan.pin_overlap,
                          rescale_threshold=plan.rescale_threshold)
    ep = Epilogue(ml, Out, LSE, S=S, Hq=Hq, D=D, Tq=Tq, varlen=varlen, persistent=persistent)
    ml.start()
    for x in sched.tiles():
        wrow, rows = ml.run(x)
        ep.store(x, wrow, rows)
    ml.finish()
    ep.finish()
    roles.end()
    ptx.ret()


def _resolve(config, D, Hq, Hkv, dtype, scale):
    """``(plan, dt, scale)`` checked: the plan at head dim ``D``, the pyptx dtype, the scale."""
    if not isinstance(config, ForwardConfig):
        raise _fail(f"flash attention: config must be a ForwardConfig, got {config!r}")
    dt = _dtype(dtype)
    plan = config.resolve(D)
    if Hq % Hkv:
        raise _fail(f"flash attention: Hq={Hq} is not a multiple of Hkv={Hkv}")
    return plan, dt, 1.0 / math.sqrt(D) if scale is None else float(scale)


def build_attention(B, S, Hq, Hkv, D, *, Sk=None, dtype="bf16", causal=False, scale=None,
                    config=DEFAULT_CONFIG):
    """The forward kernel for ``q (B, S, Hq, D)``, ``k, v (B, Sk, Hkv, D)``: returns
    ``o (B, S, Hq, D)`` and ``lse (B, Hq, S)`` f32 (natural log of each row's sum of
    ``exp(scale q.k)``). ``scale`` defaults to ``1/sqrt(D)``; ``causal`` masks key ``j > i``
    (top-left aligned). ``config``: the plan (``ForwardConfig``), checked against ``D``."""
    plan, dt, scale = _resolve(config, D, Hq, Hkv, dtype, scale)
    Sk = S if Sk is None else Sk
    bm, BN = plan.bm, plan.BN
    grid, ctas = dense_grid(B, S, Hq, plan)
    tma = {"Q": dict(box=(1, bm, 1, 64), swizzle="128B"),
           "K": dict(box=(1, BN, 1, 64), swizzle="128B"),
           "V": dict(box=(1, BN, 1, 64), swizzle="128B"),
           "Out": dict(box=(1, 64, 1, 64), swizzle="128B")}
    name = (f"flash_fwd_{dt.name}_d{D}_bn{BN}_s{plan.stages}_{plan.schedule}"
            f"{'_causal' if causal else ''}_g{Hq // Hkv}"
            f"{'_persistent' if plan.persistent else ''}{plan.name_tag()}")
    deco = kernel(in_specs=(Tile(B, S, Hq, D, dt), Tile(B, Sk, Hkv, D, dt), Tile(B, Sk, Hkv, D, dt)),
                  out_specs=(Tile(B, S, Hq, D, dt), Tile(B, Hq, S, f32)),
                  grid=grid, block=(128 * (1 + plan.consumers), 1, 1), smem=plan.smem(D),
                  maxnreg=consumer_regs(plan.consumers)[0], tma=tma, name=name)

    def flash_fwd(Q, K, V, Out, LSE):
        _body(Q, K, V, None, None, Out, LSE, shape=(B, S, Sk, Hq, Hkv, D, None), plan=plan,
              dt=dt, causal=causal, scale=scale, varlen=False, ctas=ctas)
    return deco(flash_fwd)


def build_attention_varlen(Tq, Tk, B, Hq, Hkv, D, max_seqlen_q, *, dtype="bf16", causal=False,
                           scale=None, config=DEFAULT_CONFIG):
    """The packed variable-length forward kernel: ``q (Tq, Hq, D)``, ``k, v (Tk, Hkv, D)``,
    ``cu_seqlens_q``/``cu_seqlens_k`` int32 ``(B + 1,)``; returns ``o (Tq, Hq, D)`` and
    ``lse (Hq, Tq)`` f32. The grid covers ``max_seqlen_q`` rows per sequence; ``causal`` is
    top-left aligned per sequence; ``config`` as ``build_attention``'s, not persistent."""
    plan, dt, scale = _resolve(config, D, Hq, Hkv, dtype, scale)
    if plan.persistent:
        raise _fail("flash attention: the packed (varlen) kernel has no persistent plan")
    bm, BN = plan.bm, plan.BN
    tma = {"Q": dict(box=(bm, 1, 64), swizzle="128B"),
           "K": dict(box=(BN, 1, 64), swizzle="128B"),
           "V": dict(box=(BN, 1, 64), swizzle="128B")}
    name = (f"flash_fwd_varlen_{dt.name}_d{D}_bn{BN}_s{plan.stages}_{plan.schedule}"
            f"{'_causal' if causal else ''}_g{Hq // Hkv}{plan.name_tag()}")
    deco = kernel(in_specs=(Tile(Tq, Hq, D, dt), Tile(Tk, Hkv, D, dt), Tile(Tk, Hkv, D, dt),
                            Tile(B + 1, s32), Tile(B + 1, s32)),
                  out_specs=(Tile(Tq, Hq, D, dt), Tile(Hq, Tq, f32)),
                  grid=varlen_grid(B, max_seqlen_q, Hq, plan),
                  block=(128 * (1 + plan.consumers), 1, 1), smem=plan.smem(D),
                  maxnreg=consumer_regs(plan.consumers)[0], tma=tma, name=name)

    def flash_fwd_varlen(Q, K, V, CUQ, CUK, Out, LSE):
        _body(Q, K, V, CUQ, CUK, Out, LSE, shape=(B, max_seqlen_q, None, Hq, Hkv, D, Tq),
              plan=plan, dt=dt, causal=causal, scale=scale, varlen=True, ctas=None)
    return deco(flash_fwd_varlen)
