"""The FP8 GEMM's main loops: the producer thread filling the operand ring, and a consumer
warpgroup's k-block loop, promoted (each k-block's tensor-core sum added to an f32
register accumulator, times the block scales) or accumulated in the tensor core over all
of K (``fast_accum``)."""

from __future__ import annotations

from pyptx import ptx, reg
from pyptx.types import u32, u64
from pyptx.warpspec import load_ab_ring
from pyptx_kernels.fp8_gemm.config import BK, partial_columns  # noqa: F401  (defined there)
from pyptx_kernels.fp8_gemm.scales import load_f32


def produce(pipe, A, B, a_tile, b_tile, *, base, cid, g, coords, rank):
    """The producer thread: every k-block of this CTA's tiles into the ring (B multicast
    across a cluster of 2)."""
    load_ab_ring(pipe, A, B, a_tile, b_tile, base=base, tile_range=(cid, g.tiles, g.stride),
                 coords=coords, num_kb=g.num_kb, BK=BK, rank=rank, cluster=g.cluster,
                 multicast=g.cluster > 1)


class ConsumerRing:
    """A consumer warpgroup's side of the operand ring: waits for stages, issues wgmma on
    them, releases them (to every CTA of the cluster)."""

    def __init__(self, pipe, a_tile, b_tile, *, base, w, consumers, leader, cluster, NH, ab):
        self.pipe, self.a_tile, self.b_tile = pipe, a_tile, b_tile
        self.leader, self.NH, self.ab = leader, NH, ab
        self.stage_bytes = a_tile.nbytes + b_tile.nbytes
        self.a_desc0 = a_tile.descriptor(base + w * a_tile.offset(0, 64) if consumers > 1
                                         else base)
        self.b_desc0 = b_tile.descriptor(base, offset=a_tile.nbytes)
        self.cons = pipe.consumer_state()
        self.rel = pipe.consumer_state()
        self.release_ranks = range(cluster) if cluster > 1 else None

    def stage(self):
        """Wait for the current stage; its A and B descriptors."""
        self.pipe.wait(self.cons)
        soff64 = reg.from_(reg.from_(self.cons.stage * (self.stage_bytes >> 4), u32), u64)
        return self.a_desc0 + soff64, self.b_desc0 + soff64

    def advance(self):
        self.cons.advance()

    def release(self):
        """Hand the oldest held stage back to the producer."""
        self.pipe.release(self.rel, pred=self.leader, cta_ranks=self.release_ranks,
                          sem="release.cta")
        self.rel.advance()

    def mma(self, part, da, db, h, first_scale_d):
        """One commit group: a k-block's four k32 wgmma into ``part``, column half ``h``
        (``first_scale_d`` 0: the first overwrites ``part``)."""
        ptx.wgmma.fence()
        for kk in range(self.a_tile.k_steps):
            ptx.wgmma.mma_async(part.regs, self.a_tile.advance(da, kk),
                                self.b_tile.advance(db, kk, mn_start=h * self.NH), n=self.NH,
                                dtype_ab=self.ab, scale_d=first_scale_d if kk == 0 else 1)
        ptx.wgmma.commit_group()


def promoted(ring, acc, part, *, scale, r0, n0, g, M, psa, psb):
    """One tile's promoted loop: per k-block and column half, wgmma into ``part``, wait,
    then ``acc += part`` (block scales: ``acc += sa * sb * part``). ``r0``: this thread's
    first row (its second is ``r0 + 8``)."""
    NH = ring.NH
    halves = g.BN // NH
    KS, NS = g.KS, g.NS
    block = scale == "block"
    acc.zero()
    if block:
        ra = r0 * KS  # row r0's scales; row r0 + 8's are 8 * KS further
        nbs = [(n0 + h * NH) >> 7 for h in range(halves)]  # B's scale rows
    for kb in ptx.loop(0, g.num_kb):
        if block:
            sa0 = load_f32(psa, ra + kb, r0 < M)
            sa1 = load_f32(psa, ra + kb + 8 * KS, r0 + 8 < M)
            sbs = [load_f32(psb, nbk * KS + kb, nbk < NS) for nbk in nbs]
        da, db = ring.stage()
        for h in range(halves):
            ring.mma(part, da, db, h, 0)
            ptx.wgmma.wait_group(0)
            if h == halves - 1:
                ring.release()
            if block:
                s0 = sa0 * sbs[h]
                s1 = sa1 * sbs[h]
            for i in range(len(part)):
                j = h * (NH // 2) + i
                if block:
                    s = s1 if (i // 2) % 2 else s0
                    ptx.inst.fma.rn.f32(acc[j], part[i], s, acc[j])
                else:
                    ptx.inst.add.f32(acc[j], acc[j], part[i])
        ring.advance()


def tensor_core(ring, acc, num_kb):
    """One tile's ``fast_accum`` loop: every k-block's wgmma into ``acc`` itself, one group
    in flight while the next is issued."""
    def k_block(first):
        da, db = ring.stage()
        ring.mma(acc, da, db, 0, 0 if first else 1)
        if not first:
            ptx.wgmma.wait_group(1)
            ring.release()
        ring.advance()

    k_block(True)
    for _kb in ptx.loop(1, num_kb):
        k_block(False)
    ptx.wgmma.wait_group(0)
    ring.release()
