"""Grouped GEMM with wgmma: ``D[rows of g] = A[rows of g] @ B[g]`` for every group ``g``.

The mixture-of-experts product in the ``torch._grouped_mm`` convention: A is ``(M, K)``
bf16, B is ``(G, K, N)`` bf16 (one ``K x N`` weight per group), ``offs`` an int32 ``(G,)``
tensor of cumulative row ends (group ``g`` owns rows ``offs[g-1]:offs[g]``), D is
``(M, N)`` bf16. Group sizes live on the device, so the kernel reads them itself.

The concepts, in the order the kernel uses them:

* **Grid over (n-block, m-block, group)**: CTA ``(x, y, g)`` computes the ``64 x BN`` tile
  at rows ``offs[g-1] + 64*y`` and columns ``BN*x`` of group ``g``. The grid is sized for
  the worst case (any group could hold all M rows); CTAs whose tile starts past the end of
  their group return at once.
* **TMA loads into shared memory**: one thread issues bulk tensor copies
  (``cp.async.bulk.tensor``) of the A tile (2-D map over ``(M, K)``) and of the B tile
  (3-D map over ``(G, K, N)``, so K and N edges clip at each group's own weight). Parts
  of a box outside the tensor arrive as zeros: ragged K and N need no special case.
* **An mbarrier ring** (``pyptx.pipeline.Pipeline``): ``stages`` shared buffers, each
  with a ``full`` barrier (armed with the bytes the copies bring) and an ``empty`` one (the
  consumer arrives when it has read the stage). The copy of k-block ``kb + stages`` waits
  only for k-block ``kb`` to be consumed, so loads run ahead of the tensor cores.
* **wgmma through OperandTile descriptors** (``pyptx.operand.OperandTile``): the tile
  object knows the 128-byte swizzled layout the copies produce and builds the 64-bit
  matrix descriptors ``wgmma.mma_async`` reads A (K-major) and B (MN-major) through.
* **Per-group row offsets in the epilogue**: the A tile may run into the next group's rows
  (they are computed, never stored); each thread stores its accumulator pairs with
  predicated ``st.global`` for rows below the group's end and columns below N.

Warp roles: warpgroup 0 is the producer (its thread 0 issues every copy), warpgroup 1
the consumer (all 128 threads issue the wgmma and store). The library's
``pyptx_kernels.grouped_gemm`` is the fast version: persistent CTAs, two consumer
warpgroups, a wgmma kept in flight across k-blocks, bulk tensor stores.
"""

from __future__ import annotations

import sys

from pyptx import Tile, kernel, ptx, reg
from pyptx.errors import ConfigError
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.pipeline import Pipeline
from pyptx.types import b32, bf16, s32, u32, u64
from pyptx.warpspec import ring_base

BM, BK = 64, 64   # one consumer warpgroup owns 64 rows; one k-block is 64 bf16 = 128 bytes


def build_grouped_gemm(M: int, N: int, K: int, G: int, *, BN: int = 128, stages: int = 4):
    """The grouped GEMM kernel for ``A (M, K)``, ``B (G, K, N)``, ``offs (G,)`` and output
    ``D (M, N)``, all bf16 but offs (int32). Rows of D past ``offs[-1]`` are not written;
    ``offs`` must be non-decreasing. ``BN``: tile columns (64, 128, 192 or 256);
    ``stages``: ring depth."""
    if BN not in (64, 128, 192, 256):
        raise ConfigError(f"build_grouped_gemm: BN must be 64, 128, 192 or 256, got {BN}")
    if N % 8 or K % 8:
        raise ConfigError(f"build_grouped_gemm: N and K must be multiples of 8 (16-byte rows "
                          f"for the tensor copies), got N={N}, K={K}")
    if not 1 <= stages <= 8:
        raise ConfigError(f"build_grouped_gemm: stages must be 1..8, got {stages}")
    a_tile = OperandTile(BM, BK, bf16, major="K", swizzle=128)    # 64 rows x 128 bytes
    b_tile = OperandTile(BN, BK, bf16, major="MN", swizzle=128)   # BN/64 slabs of 64 k-rows
    stage_bytes = a_tile.nbytes + b_tile.nbytes
    num_kb = -(-K // BK)

    tma = {"A": a_tile.tma_options(),                          # box (64 rows, 64 cols)
           "B": {"box": (1, BK, 64), "swizzle": "128B"}}       # (group, k rows, 64 n cols)

    @kernel(in_specs=(Tile(M, K, bf16), Tile(G, K, N, bf16), Tile(G, s32)),
            out_specs=(Tile(M, N, bf16),), grid=(-(-N // BN), -(-M // BM), G),
            block=(256, 1, 1), smem=stages * stage_bytes + 1024, tma=tma,
            name=f"grouped_gemm_bn{BN}_s{stages}")
    def grouped_gemm(A, B, Offs, D):
        p_offs, p_d = ptx.global_ptrs(Offs, D)
        tid = reg.from_(ptx.special.tid.x(), u32)
        wg = tid >> 7
        g = reg.from_(ptx.special.ctaid.z(), u32)

        # ---- this CTA's tile: rows [m0, m0 + 64) of group g, which ends at row `end`
        start = reg.scalar(u32, init=0)
        ptx.inst.ld.global_.u32(start, ptx.addr(p_offs + reg.from_(g, u64) * 4 - 4),
                                pred=g != 0)
        end = reg.scalar(u32)
        ptx.inst.ld.global_.u32(end, ptx.addr(p_offs + reg.from_(g, u64) * 4))
        ptx.inst.min.u32(end, end, M)              # never store past the last row of D
        m0 = start + reg.from_(ptx.special.ctaid.y(), u32) * BM
        n0 = reg.from_(ptx.special.ctaid.x(), u32) * BN
        ptx.ret(pred=m0 >= end)                    # the whole CTA: no tile of this group here

        # ---- shared memory: the ring (1024-byte aligned for the swizzle) and its barriers
        base = ring_base()
        pipe = Pipeline(stages, consumer_arrivals=1)
        pipe.init(pred=tid == 0)
        ptx.bar_sync(0)                            # barriers initialised before anyone waits

        # ---- producer: thread 0 fills stage after stage with one k-block of A and B
        with ptx.if_(tid == 0):
            st = pipe.producer_state()
            for kb in ptx.loop(num_kb):
                pipe.acquire(st)                   # wait until the consumer freed the stage
                bar = pipe.arm(st, stage_bytes)    # full[stage] completes when these land
                stage = st.stage * stage_bytes + base
                a_tile.load(stage, A, m0, kb * BK, bar)
                for i in range(b_tile.slabs):      # one copy per 64-column slab of B[g]
                    ptx.tma.load_tile(ptx.addr(stage, a_tile.nbytes + i * b_tile.slab_bytes),
                                      B.tmap, (n0 + i * 64, kb * BK, g), bar)
                st.advance()

        # ---- consumer: warpgroup 1 multiplies each stage into its 64 x BN accumulator
        with ptx.if_(wg == 1):
            t = tid & 127
            acc = Accumulator(BN)                  # 64 * BN f32 spread over 128 threads
            a_desc0 = a_tile.descriptor(base)      # the descriptors of stage 0
            b_desc0 = b_tile.descriptor(base, offset=a_tile.nbytes)
            cs = pipe.consumer_state()
            for kb in ptx.loop(num_kb):
                pipe.wait(cs)                      # the stage's copies landed
                # descriptors address shared memory in 16-byte units: move them to the stage
                soff = reg.from_(reg.from_(cs.stage * (stage_bytes >> 4), u32), u64)
                a_desc, b_desc = a_desc0 + soff, b_desc0 + soff
                ptx.wgmma.fence()
                for kk in range(a_tile.k_steps):   # 4 wgmma of k = 16 per 64-wide k-block
                    ptx.wgmma.mma_async(acc.regs, a_tile.advance(a_desc, kk),
                                        b_tile.advance(b_desc, kk), n=BN, dtype_ab="bf16",
                                        scale_d=(kb != 0) if kk == 0 else 1,  # first: D = A@B
                                        trans_a=a_tile.trans, trans_b=b_tile.trans)
                ptx.wgmma.commit_group()
                ptx.wgmma.wait_group(0)            # done reading the stage: hand it back
                pipe.release(cs, pred=t == 0)
                cs.advance()

            # ---- epilogue: each register pair is two adjacent columns of one row
            row0, col0 = acc.thread_origin(t)
            r0, c0 = m0 + row0, n0 + col0
            p0 = p_d + (reg.from_(r0, u64) * N + reg.from_(c0, u64)) * 2
            for i, dr, dc in acc.pairs():
                packed = reg.scalar(b32)
                ptx.inst("cvt.rn.bf16x2.f32")(packed, acc[i + 1], acc[i])
                ok = ((r0 + dr) < end) & ((c0 + dc) < N)   # inside the group, inside D
                ptx.inst.st.global_.b32(ptx.addr(p0, (dr * N + dc) * 2), packed, pred=ok)
        ptx.ret()

    return grouped_gemm


def reference(a, b, offs):
    """``D`` of nested lists of floats, in Python (float64) arithmetic."""
    out, start = [], 0
    for g, end in enumerate(int(e) for e in offs):
        bt = list(zip(*b[g]))                          # columns of B[g]
        out += [[sum(x * y for x, y in zip(row, col)) for col in bt] for row in a[start:end]]
        start = end
    return out


def main(argv=None) -> int:
    """Check on a GPU against float64, or print the ptxas report."""
    from pyptx.testing import parse_args, run_example

    p = parse_args(__doc__.splitlines()[0], argv, M=300, N=136, K=200, G=4)
    M, N, K, G = p["M"], p["N"], p["K"], p["G"]

    def make_inputs(torch):
        gen = torch.Generator().manual_seed(0)
        cuts = torch.randint(0, M + 1, (G - 1,), generator=gen).sort().values
        offs = torch.cat([cuts, torch.tensor([M])]).to(torch.int32)   # ragged, ends at M
        a = torch.randn(M, K, generator=gen).to(torch.bfloat16)
        b = torch.randn(G, K, N, generator=gen).to(torch.bfloat16)
        return a.cuda(), b.cuda(), offs.cuda()

    return run_example(build_grouped_gemm(M, N, K, G), make_inputs, reference,
                       atol=5e-2, rtol=1e-2)


if __name__ == "__main__":
    sys.exit(main())
