"""The scaled FP8 GEMM kernel on Hopper tensor cores, ``D = scale(A @ W^T)``, assembled from
its producer and consumer loops (``mainloop``), its stores (``epilogue``) and its tile order
(``scheduler``) under a plan (``config.Fp8GemmConfig``).

A is ``(M, K)`` e4m3/e5m2 row-major and W ``(N, K)`` (both fp8 wgmma operands must be
K-major), f32 accumulation, bf16 or f32 output, tensor, row or block scales (``scales``).
Warpgroup 0 produces (one thread issues bulk tensor copies into an mbarrier ring),
warpgroups 1-2 consume 64 rows each, clusters of 2 CTAs along M multicast W, tiles run
persistently in grouped order.

Long-K accuracy: the tensor core's fp8 accumulator keeps fewer mantissa bits than f32, so
each k-block's wgmma sum goes into a *partial* accumulator and is then added to an f32
register accumulator: a promotion every 128 K. The partial covers at most 128 columns; a
256-column tile runs two column halves through it per k-block (registers: 128 main + 64
partial). ``fast_accum=True`` skips the promotion and accumulates in the tensor core.
"""

from __future__ import annotations

import sys

from pyptx import Tile, kernel
from pyptx.arch import register_budget
from pyptx.errors import ConfigError
from pyptx.operand import OperandTile
from pyptx.types import bf16, e4m3, e5m2, f32
from pyptx_kernels import _family
from pyptx_kernels._common import fail
from pyptx_kernels.fp8_gemm.config import BK, EPI_BUFS, Fp8GemmConfig, partial_columns, smem_bytes
from pyptx_kernels.fp8_gemm.scales import SCALES, scale_specs
from pyptx_kernels.fp8_gemm.scheduler import Geometry, tile_origin

FP8 = {"e4m3": e4m3, "e5m2": e5m2, e4m3: e4m3, e5m2: e5m2}
_DEFAULT = Fp8GemmConfig()


def _check(M, N, K, scale, dtype, dtype_b, out_dtype, fast_accum, ND, config):
    """Refuse what the kernel cannot compute; ``(dt_a, dt_b, ot, ND)``."""
    def bad(msg):
        return fail(ConfigError, "build_fp8_gemm", msg)

    dt_a = FP8.get(dtype)
    dt_b = FP8.get(dtype if dtype_b is None else dtype_b)
    if dt_a is None or dt_b is None:
        raise bad(f"dtype/dtype_b must be 'e4m3' or 'e5m2', got {dtype!r}/{dtype_b!r}")
    if scale not in SCALES:
        raise bad(f"scale must be one of {SCALES}, got {scale!r}")
    ot = {"bf16": bf16, "f32": f32, bf16: bf16, f32: f32}.get(out_dtype)
    if ot is None:
        raise bad(f"out_dtype must be 'bf16' or 'f32', got {out_dtype!r}")
    for name, v in (("M", M), ("N", N), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise bad(f"{name} must be a positive int, got {v!r}")
    if K % 16:
        raise bad(f"K must be a multiple of 16 (16-byte rows for the copy engine), got {K}; "
                  f"zero-pad A and W along K")
    ND = N if ND is None else ND
    if ND < N or ND * ot.bytes % 16:
        raise bad(f"ND must be >= N = {N} with 16-byte output rows, got {ND}")
    if not isinstance(config, Fp8GemmConfig):
        raise bad(f"config must be an Fp8GemmConfig, got {config!r}")
    if scale == "block" and config.BN not in (64, 128, 256):
        raise bad(f"block scales need BN in 64, 128, 256, got {config.BN}")
    if fast_accum and scale == "block":
        raise bad("block scales are applied at each promotion; fast_accum is for "
                  "'tensor'/'row' scales")
    return dt_a, dt_b, ot, ND


def build_fp8_gemm(M: int, N: int, K: int, *, scale="tensor", dtype="e4m3", dtype_b=None,
                   out_dtype="bf16", fast_accum=False, ND=None, config=_DEFAULT):
    """The scaled FP8 GEMM kernel ``D[M, ND] = scale(A[M, K] @ W[N, K]^T)``.

    Tensor arguments: A ``(M, K)`` and W ``(N, K)`` fp8 (``dtype``, ``dtype_b``: 'e4m3' or
    'e5m2'; K a multiple of 16, the copy engine's row rule), then the scales of kind
    ``scale`` ('tensor' takes two ``(1,)`` f32 tensors, ``scales``); output D ``(M, ND)`` in
    ``out_dtype`` ('bf16' or 'f32'), ``ND >= N`` (a padded row; columns past N are 0).
    ``fast_accum``: no promotion (tensor/row scales only). ``config``: the tile plan.
    Bad arguments raise ``ConfigError``.
    """
    dt_a, dt_b, ot, ND = _check(M, N, K, scale, dtype, dtype_b, out_dtype, fast_accum, ND,
                                config)
    BM, BN, cluster, stages = config.BM, config.BN, config.cluster, config.ring_stages
    consumers = BM // 64
    threads = 128 * (1 + consumers)
    a_tile = OperandTile(BM, BK, dt_a, major="K", swizzle=128)
    b_tile = OperandTile(BN, BK, dt_b, major="K", swizzle=128)
    ring_bytes = stages * (a_tile.nbytes + b_tile.nbytes)
    e_out = ot.bytes
    wg_out_bytes = EPI_BUFS * 64 * 128
    promote = not fast_accum
    NH = partial_columns(BN, fast_accum)
    host_g = Geometry.of(M, N, K, config)
    prod_regs = 40
    maxnreg, cons_regs = register_budget(consumers, prod_regs)
    multicast = cluster > 1
    in_specs = (Tile(M, K, dt_a), Tile(N, K, dt_b)) + scale_specs(scale, M, N, host_g)
    tma = {"A": a_tile.tma_options(), "B": b_tile.tma_options(cluster if multicast else 1),
           "D": {"box": (64, 128 // e_out), "swizzle": "128B"}}

    def fp8_gemm(A, B, SA, SB, D):
        # The tracing code, loaded at the first trace: a kernel built from its family's code
        # (this process's or the disk cache's) never imports it.
        from pyptx import ptx
        from pyptx.fragment import Accumulator
        from pyptx.pipeline import Pipeline
        from pyptx.warpspec import (
            Roles,
            drain_stores,
            prologue,
            ring_base,
            swizzled_rows,
            thread_ids,
        )
        from pyptx_kernels.fp8_gemm import mainloop
        from pyptx_kernels.fp8_gemm.epilogue import Epilogue

        g = host_g.bind()
        base = ring_base()
        pipe = Pipeline(stages, consumer_arrivals=consumers * (cluster if multicast else 1))
        tid, wg = thread_ids()
        rank, cid = prologue(pipe, tid, cluster)

        def tile_coords(t):
            return tile_origin(t, rank, g)

        roles = Roles(wg, prod_regs)
        with ptx.if_(tid == 0):
            mainloop.produce(pipe, A, B, a_tile, b_tile, base=base, cid=cid, g=g,
                             coords=tile_coords, rank=rank)
        roles.consumers(cons_regs)
        w = wg - 1
        t_wg = tid & 127
        leader = t_wg == 0
        bar_id = w + 1
        acc = Accumulator(BN)                       # the f32 register accumulator
        part = Accumulator(NH) if promote else acc  # one k-block's tensor-core sum
        row0, col0 = acc.thread_origin(t_wg)
        lane = tid & 31
        cbuf = base + ring_bytes + w * wg_out_bytes
        ring = mainloop.ConsumerRing(pipe, a_tile, b_tile, base=base, w=w, consumers=consumers,
                                     leader=leader, cluster=cluster, NH=NH,
                                     ab=(dt_a.name, dt_b.name))
        sw = swizzled_rows(cbuf, row0, lane, e_out)
        psa, psb = ptx.global_ptrs(SA, SB)
        epi = Epilogue(acc, scale=scale, ot=ot, BN=BN, sw=sw, cbuf=cbuf, leader=leader,
                       bar_id=bar_id, tmap=ptx.tma.tensormap_ptr(D.tmap), psa=psa, psb=psb,
                       M=g.M, N=N, col0=col0)
        for t in ptx.loop(cid, g.tiles, g.stride):
            m0, n0 = tile_coords(t)
            r0 = m0 + w * 64 + row0                 # this thread's rows r0 and r0 + 8
            if promote:
                mainloop.promoted(ring, acc, part, scale=scale, r0=r0, n0=n0, g=g, M=g.M,
                                  psa=psa, psb=psb)
            else:
                mainloop.tensor_core(ring, acc, g.num_kb)
            epi.store(m0, n0, w, r0)
        drain_stores(leader)
        roles.end()
        if cluster > 1:
            ptx.cluster_sync()
        ptx.ret()

    name = (f"fp8_gemm_{scale}_{dt_a.name}{dt_b.name}_{ot.name}_{BM}x{BN}_s{stages}_c{cluster}"
            f"{'_fast' if fast_accum else ''}")
    fp8_gemm.__name__ = name
    deco = kernel(in_specs=in_specs, out_specs=(Tile(M, ND, ot),), grid=(host_g.ctas, 1, 1),
                  block=(threads, 1, 1), cluster=(cluster, 1, 1),
                  smem=smem_bytes(BM, BN, stages), maxnreg=maxnreg, tma=tma, name=name)
    family = ("fp8_gemm", N, K, ND, scale, dt_a.name, dt_b.name, ot.name, fast_accum, config)
    return _family.specialized(deco(fp8_gemm), family, host_g.params())


if __name__ == "__main__":   # ``python -m pyptx_kernels.fp8_gemm.kernel [simple]``: the GPU checks
    from pyptx_kernels.fp8_gemm.testing import main

    sys.exit(main())
