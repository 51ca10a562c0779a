"""The dense GEMM kernel on Hopper tensor cores, ``D = act(alpha * (A @ B) + bias)``:
``build_gemm`` assembles it from its plan (``config.GemmConfig``), tile scheduler
(``scheduler``), main loops (``mainloop``) and epilogue (``epilogue``); ``gemm_tuned``
picks the plan per shape on the device.

bf16 or f16 inputs, f32 accumulation, bf16/f16/f32 output. The kernel is warp-specialised
and persistent: warpgroup 0 is the producer (it gives registers back, and one of its
threads walks the tiles, issuing bulk tensor copies of A and B into a ``stages``-deep ring
of shared-memory buffers guarded by mbarriers); warpgroups 1.. are consumers, each issuing
``wgmma.mma_async`` on its rows of the ring's tiles, keeping one k-block in flight while the
previous stage is released, then running the epilogue. With ``cluster=2`` two CTAs that
share a B tile each copy half of it and multicast it to both. Tiles are
visited in grouped order (``group_m`` cluster rows per band) so consecutive tiles reuse A
and B in L2.
"""

from __future__ import annotations

import inspect

from pyptx import Tile, kernel
from pyptx.arch import register_budget
from pyptx.autotune import Config, autotune
from pyptx.errors import ConfigError
from pyptx.operand import OperandTile
from pyptx.types import bf16, f16, f32, u32
from pyptx_kernels import _family
from pyptx_kernels._common import fail
from pyptx_kernels.gemm.config import ACTIVATIONS, GEMM_CONFIGS, GemmConfig
from pyptx_kernels.gemm.scheduler import FLAG_WORDS, SplitTailGemm, TileSchedule


def _dtype(name, what):
    table = {"bf16": bf16, "f16": f16, "f32": f32, bf16: bf16, f16: f16, f32: f32}
    if name not in table:
        raise fail(ConfigError, "build_gemm", f"{what} must be bf16, f16 or f32, got {name!r}")
    return table[name]


def build_gemm(M: int, N: int, K: int, *, dtype="bf16", out_dtype="bf16", a_major="K",
               b_major="MN", KB=None, NB=None, bias=False, alpha=1.0, activation=None,
               residual=False, config=None):
    """The GEMM kernel for ``D[M, N] = activation(alpha * A[M, K] @ B[K, N] + bias)``.

    Tensor arguments: A as ``(M, K)`` (``a_major="K"``) or ``(K, M)`` (``"MN"``), B as
    ``(KB, NB)`` (``b_major="MN"``) or ``(NB, KB)`` (``"K"``), then ``bias`` ``(N,)`` f32
    if ``bias``; output D ``(M, N)`` in ``out_dtype``. ``KB``/``NB`` (default ``K``/``N``)
    are B's extents when a zero-padded operand is larger than the product needs: copies
    past a tensor's edge read zeros, so the k-loop runs over the larger K and D gets N
    columns. ``activation``: one of ``ACTIVATIONS``; ``"swiglu"`` is gated: B's N columns
    are 64-column gate and up blocks interleaved (``pyptx_kernels.gemm.fused.pack_gated``)
    and D is ``(M, N / 2)`` of ``silu(gate) * up``. ``residual``: one more input ``R``
    ``(M, N)``, added after the activation, in the output type (``True``; bf16 or f32) or
    in the named one (``"f32"`` or ``"bf16"``: an f32 sum read, a bf16 result written).
    ``config``: the tile and schedule plan, a ``GemmConfig`` (or the name of a tuned plan,
    or a mapping of its fields; default ``GemmConfig()``). A split-tail plan that applies
    to the shape returns a ``SplitTailGemm``; otherwise a ``Kernel``."""
    dt = _dtype(dtype, "dtype")
    if dt is f32:
        raise fail(ConfigError, "build_gemm", "inputs must be bf16 or f16")
    ot = _dtype(out_dtype, "out_dtype")
    if activation not in ACTIVATIONS:
        raise fail(ConfigError, "build_gemm",
                   f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if a_major not in ("K", "MN") or b_major not in ("K", "MN"):
        raise fail(ConfigError, "build_gemm", "a_major and b_major must be 'K' or 'MN'")
    cfg = GemmConfig.of(config)
    BM, BN, BK, stages, cluster = cfg.BM, cfg.BN, cfg.BK, cfg.stages, cfg.cluster
    gated = activation == "swiglu"
    if gated and (N % 128 or BN % 128 or residual):
        raise fail(ConfigError, "build_gemm",
                   f"activation='swiglu' pairs 64-column gate and up blocks: N and the tile's "
                   f"BN must be multiples of 128 and there is no residual, got N={N}, BN={BN}, "
                   f"residual={residual}")
    if residual and out_dtype not in ("bf16", "f32", bf16, f32):
        raise fail(ConfigError, "build_gemm",
                   f"residual needs a bf16 or f32 output, got out_dtype={out_dtype!r}")
    if residual not in (False, True, "bf16", "f32"):
        raise fail(ConfigError, "build_gemm",
                   f"residual must be False, True, 'bf16' or 'f32', got {residual!r}")
    rt = (ot if residual is True else _dtype(residual, "residual")) if residual else None
    if rt is ot:
        residual = True    # one family per residual type
    KB = K if KB is None else KB
    NB = N if NB is None else NB
    multicast = cfg.multicast and cluster > 1
    consumers, bands = cfg.consumers, cfg.bands
    threads = 128 * (1 + consumers)
    smem_total = cfg.smem_bytes()

    a_tile = OperandTile(BM, BK, dt, major=a_major, swizzle=128)
    b_tile = OperandTile(BN, BK, dt, major=b_major, swizzle=128)
    ring_bytes = stages * (a_tile.nbytes + b_tile.nbytes)
    wg_out_bytes = cfg.epi_bufs * 64 * 128     # one consumer's 64-row x 128-byte slabs
    host_sched = TileSchedule(M, N, K, KB, cfg)
    plan = host_sched.plan
    prod_regs = 40 if consumers <= 2 else 24
    maxnreg, cons_regs = register_budget(consumers, prod_regs)

    a_spec = Tile(M, K, dt) if a_major == "K" else Tile(K, M, dt)
    b_spec = Tile(KB, NB, dt) if b_major == "MN" else Tile(NB, KB, dt)
    in_specs = (a_spec, b_spec) + ((Tile(N, f32),) if bias else ()) + \
        ((Tile(M, N, rt),) if residual else ())
    out_specs = (Tile(M, N // 2 if gated else N, ot),)
    part_bytes = bands * 64 * BN * 4               # a warpgroup's f32 partial tile
    if plan:
        flags = plan[1] * cluster * consumers      # one per warpgroup of a tail tile
        if flags > FLAG_WORDS:
            raise fail(ConfigError, "build_gemm",
                       f"split_tail needs {flags} flags, over {FLAG_WORDS}")
        in_specs += (Tile(FLAG_WORDS, u32),)
        out_specs += (Tile(flags * (plan[2] - 1) * part_bytes // 4, f32),)
    parts = cluster if multicast and cfg.split == "rows" else 1
    tma = {"A": a_tile.tma_options(1),
           "B": b_tile.tma_options(parts),
           "D": {"box": (64, 128 // ot.bytes), "swizzle": "128B"}}

    def body(A, B, Bias, D, Flags=None, WS=None, R=None):
        # The tracing code, loaded at the first trace: a kernel built from its family's code
        # (this process's or the disk cache's) never imports it.
        from pyptx import ptx
        from pyptx.fragment import Accumulator
        from pyptx.pipeline import Pipeline
        from pyptx.warpspec import Roles, drain_stores, prologue, ring_base, thread_ids
        from pyptx_kernels.gemm import mainloop
        from pyptx_kernels.gemm.epilogue import TileEpilogue
        from pyptx_kernels.gemm.scheduler import SplitTailFixup

        sched = host_sched.bind()
        base = ring_base()
        pipe = Pipeline(stages, consumer_arrivals=consumers * (cluster if multicast else 1))
        tid, wg = thread_ids()
        rank, cid = prologue(pipe, tid, cluster)
        roles = Roles(wg, prod_regs)
        with ptx.if_(tid == 0):
            mainloop.produce(pipe, A, B, a_tile, b_tile, cfg=cfg, sched=sched, base=base,
                             rank=rank, cid=cid, multicast=multicast)
        roles.consumers(cons_regs)
        w = wg - 1
        t_wg = tid & 127
        leader = t_wg == 0
        bar_id = w + 1
        accs = [Accumulator(BN) for _ in range(bands)]
        row0, col0 = accs[0].thread_origin(t_wg)
        lane = tid & 31
        cbuf = base + ring_bytes + w * wg_out_bytes
        mma = mainloop.consumer_mma(pipe, accs, a_tile, b_tile, cfg=cfg, base=base, w=w,
                                    leader=leader, dt=dt, multicast=multicast)
        epilogue = TileEpilogue(cfg, accs=accs, ot=ot, M=sched.M, N=N, alpha=alpha, bias=bias,
                                activation=activation, Bias=Bias, D=D, tid=tid, lane=lane, w=w,
                                row0=row0, col0=col0, cbuf=cbuf, leader=leader, bar_id=bar_id,
                                R=R, rt=rt)
        if not plan:
            mainloop.cooperative_loop(mma, sched, cid=cid, rank=rank, epilogue=epilogue)
        else:
            fixup = SplitTailFixup(Flags, WS, accs=accs, plan=plan, cluster=cluster,
                                   consumers=consumers, rank=rank, w=w, t_wg=t_wg,
                                   leader=leader, bar_id=bar_id, part_bytes=part_bytes, BN=BN)
            mainloop.split_tail_loop(mma, sched, fixup, cid=cid, rank=rank, epilogue=epilogue)
        drain_stores(leader)
        roles.end()
        if cluster > 1:
            ptx.cluster_sync()
        ptx.ret()

    name = (f"gemm_{dt.name}_{ot.name}_{a_major}{b_major}_{BM}x{BN}x{BK}_s{stages}_c{cluster}"
            f"{'_w128' if cfg.wg_rows == 128 else ''}{f'_st{plan[2]}' if plan else ''}")
    deco = kernel(in_specs=in_specs, out_specs=out_specs, grid=(host_sched.ctas, 1, 1),
                  block=(threads, 1, 1), cluster=(cluster, 1, 1), smem=smem_total,
                  maxnreg=maxnreg, tma=tma, name=name)
    names = ("A", "B", *("Bias",) * bias, *("R",) * bool(residual), *("Flags",) * bool(plan), "D",
             *("WS",) * bool(plan))

    def gemm(*args):
        t = dict(zip(names, args))
        body(t["A"], t["B"], t.get("Bias"), t["D"], t.get("Flags"), t.get("WS"), t.get("R"))

    gemm.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    if plan:
        return SplitTailGemm(deco(gemm), host_sched.ctas)
    family = (dt.name, ot.name, a_major, b_major, N, bias, float(alpha), activation, residual,
              cfg)   # M, K and B's extents are not in the code
    return _family.specialized(deco(gemm), ("gemm", family), host_sched.params())


gemm_tuned = autotune([Config(config=c.name) for c in GEMM_CONFIGS],
                      key=["M", "N", "K", "dtype", "out_dtype", "a_major", "b_major", "bias",
                           "activation", "residual", "KB", "NB"])(build_gemm)
"""``build_gemm`` with its plan chosen from ``GEMM_CONFIGS`` on the device at the first
launch (each tuner ``Config`` names a plan: ``Config(config=GemmConfig.name)``)."""
