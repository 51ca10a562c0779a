"""The Blackwell (sm_100a) bf16 GEMM, ``D[M, N] = A[M, K] @ B[K, N]``, untested on hardware:
``build_gemm_sm100`` assembles it from its plan (``config.Sm100GemmConfig``), tile grid
(``scheduler``), main loop (``mainloop``) and epilogue (``epilogue``).

One CTA of 128 threads per 128 x BN tile (``cta_group=1``), or a 2-CTA cluster per 256 x BN
tile (``cta_group=2``). Thread 0 walks the k-blocks, copying A and B tiles (128-byte
swizzled, K-major or MN-major) into a ``stages``-deep ring; thread 32 (of the even CTA) issues
``tcgen05.mma`` from the ring into an f32 accumulator in tensor memory and commits each stage
back to the producer(s); in a pair, thread 64 of the odd CTA relays its filled stages to the
even CTA. Then all four warps move the accumulator tensor memory -> registers -> global
memory (``epilogue.store_tile``)."""

from __future__ import annotations

from pyptx import Tile, kernel, ptx, smem
from pyptx.errors import ConfigError
from pyptx.operand import OperandTile
from pyptx.pipeline import BarrierArray, Pipeline
from pyptx.ptx import mbarrier, tcgen05
from pyptx.types import b32, bf16, f32
from pyptx.warpspec import ring_base, thread_ids
from pyptx_kernels._common import fail
from pyptx_kernels.gemm_sm100 import epilogue, mainloop
from pyptx_kernels.gemm_sm100.config import SM100_GEMM_CONFIGS, Sm100GemmConfig
from pyptx_kernels.gemm_sm100.scheduler import TileGrid

ARCH = "sm_100a"
_OUT = {"bf16": bf16, "f32": f32, bf16: bf16, f32: f32}


def _plan(config):
    if config is None:
        return SM100_GEMM_CONFIGS[0]
    if isinstance(config, Sm100GemmConfig):
        return config
    if isinstance(config, dict):
        return Sm100GemmConfig(**config)
    raise fail(ConfigError, "build_gemm_sm100",
               f"config must be an Sm100GemmConfig or a dict of its fields, got {config!r}")


def build_gemm_sm100(M: int, N: int, K: int, *, out_dtype="bf16", a_major="K", b_major="MN",
                     config=None):
    """The Blackwell GEMM kernel for ``D[M, N] = A @ B`` (bf16 inputs, f32 accumulation in
    tensor memory, ``out_dtype`` bf16 or f32), untested on hardware.

    Tensor arguments: A as ``(M, K)`` (``a_major="K"``) or ``(K, M)`` (``"MN"``), B as
    ``(K, N)`` (``b_major="MN"``, a row-major ``B``) or ``(N, K)`` (``"K"``, the ``w`` of
    ``x @ w.T``); output D ``(M, N)``. The row strides must be multiples of 16 bytes (the
    tensor-copy rule): ``K`` and ``N`` (and ``M`` for an MN-major A) multiples of 8.
    Ragged edges are fine: copies past an edge read zeros and stores past it are skipped.
    ``config``: an ``Sm100GemmConfig`` (or a dict of its fields; default the first of
    ``SM100_GEMM_CONFIGS``). Returns a ``Kernel`` for ``arch="sm_100a"``."""
    cfg = _plan(config)
    who = "build_gemm_sm100"
    for name, v in (("M", M), ("N", N), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise fail(ConfigError, who, f"{name} must be a positive int, got {v!r}")
    if out_dtype not in _OUT:
        raise fail(ConfigError, who, f"out_dtype must be 'bf16' or 'f32', got {out_dtype!r}")
    if a_major not in ("K", "MN") or b_major not in ("K", "MN"):
        raise fail(ConfigError, who, f"a_major and b_major must be 'K' or 'MN', got "
                   f"{a_major!r} and {b_major!r}")
    need8 = {"K": K, "N": N} | ({"M": M} if a_major == "MN" else {})
    bad = [f"{k}={v}" for k, v in need8.items() if v % 8]
    if bad:
        raise fail(ConfigError, who, f"{', '.join(bad)}: must be multiples of 8 (16-byte row "
                   "strides for the tensor copies)")
    if M * N >= 2**32:
        raise fail(ConfigError, who, f"M * N = {M * N} elements of D need 64-bit offsets "
                   "(not supported)")
    ot = _OUT[out_dtype]
    cg = cfg.cta_group
    grid = TileGrid(M, N, cfg)
    a_tile = OperandTile(128, cfg.BK, bf16, major=a_major, swizzle=128)
    b_tile = OperandTile(cfg.b_rows, cfg.BK, bf16, major=b_major, swizzle=128)
    stage_bytes = a_tile.nbytes + b_tile.nbytes
    num_kb = -(-K // cfg.BK)
    idesc = tcgen05.InstrDescriptor(m=cfg.BM, n=cfg.BN, kind="f16", dtype_a="bf16",
                                    dtype_b="bf16", dtype_d="f32", major_a=a_major,
                                    major_b=b_major, cta_group=cg)
    a_spec = Tile(M, K, bf16) if a_major == "K" else Tile(K, M, bf16)
    b_spec = Tile(K, N, bf16) if b_major == "MN" else Tile(N, K, bf16)
    tma = {"A": a_tile.tma_options(), "B": b_tile.tma_options()}

    def gemm(A, B, D):
        base = ring_base()
        pipe = Pipeline(cfg.stages)
        done = BarrierArray(1, name="mma_done")
        peer_full = BarrierArray(cfg.stages, name="peer_full") if cg == 2 else None
        slot = smem.alloc(b32, 1, align=4, name="tmem_slot")
        tid, _ = thread_ids()
        warp = tid >> 5
        rank, m0, nb0, n0 = grid.origin()
        pipe.init(pred=tid == 0, cluster=cg == 2)
        with ptx.if_(tid == 0):
            done.init(1)
            if peer_full is not None:
                for s in range(cfg.stages):
                    mbarrier.init(peer_full.at(s), 1)
        with ptx.if_(warp == 0):
            tm = tcgen05.alloc(slot, cfg.tmem_columns, cta_group=cg)
            tcgen05.relinquish_alloc_permit(cta_group=cg)
        tcgen05.fence_before_thread_sync()
        if cg == 2:
            ptx.cluster_sync()
        else:
            ptx.bar_sync(0)
        tcgen05.fence_after_thread_sync()
        d = tm.address()
        with ptx.if_(tid == 0):
            mainloop.produce(pipe, A, B, a_tile, b_tile, base=base, m0=m0, nb0=nb0,
                             num_kb=num_kb, BK=cfg.BK)
        issuer = tid == 32 if cg == 1 else (tid == 32) & (rank == 0)
        with ptx.if_(issuer):
            mainloop.issue_mma(pipe, a_tile, b_tile, base=base, stage_bytes=stage_bytes, d=d,
                               idesc=idesc, num_kb=num_kb, done=done.at(0), peer_full=peer_full)
        if cg == 2:
            with ptx.if_((tid == 64) & (rank == 1)):
                mainloop.relay(pipe, peer_full, num_kb=num_kb)
        mbarrier.wait(done.at(0), 0)
        tcgen05.fence_after_thread_sync()
        epilogue.store_tile(D, d=d, tid=tid, m0=m0, n0=n0, M=M, N=N, BN=cfg.BN, ot=ot)
        tcgen05.fence_before_thread_sync()
        if cg == 2:
            ptx.cluster_sync()
        else:
            ptx.bar_sync(0)
        with ptx.if_(warp == 0):
            tm.dealloc(d)
        ptx.ret()

    name = f"gemm_{cfg.name}_{a_major}{b_major}_{ot.name}"
    deco = kernel(in_specs=(a_spec, b_spec), out_specs=(Tile(M, N, ot),),
                  grid=(grid.ctas, 1, 1), block=(128, 1, 1), cluster=(cg, 1, 1),
                  smem=cfg.smem_bytes(), tma=tma, arch=ARCH, name=name)
    return deco(gemm)
