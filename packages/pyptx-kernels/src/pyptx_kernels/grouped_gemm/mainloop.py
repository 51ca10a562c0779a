"""The grouped kernels' main loops: the opening (ring, pipeline, role split), the producer's
bulk tensor copies of one tile's k-blocks into the mbarrier ring (the forward's A and
``B[g]`` through a 3-D tensor map, shared across a cluster by multicast; the weight
gradient's X and Y row blocks), and the consumers' ``wgmma`` over the ring (the weight
gradient's zeroing of rows past a group end before the tensor cores read them).

The operands' geometry and tensor-map options (what a host builds a kernel with) import no
tracing code: what emits code imports it (a kernel built from its family's stored code never
does)."""

from __future__ import annotations

from pyptx.operand import OperandTile
from pyptx.types import b32, bf16, u32
from pyptx_kernels.grouped_gemm.scheduler import uniform_guess


def open_ring(stages, consumers, offs, prod_regs, cluster=1, prefetch=(), early=None):
    """The grouped kernels' opening: ``(base, pipe, tid, wg, rank, cid, p_offs, roles)``, the
    ring base and its pipeline (released by the consumers of every CTA of the cluster), the
    thread's ids, the CTA's rank in its cluster (``0`` without one) and the cluster's index,
    the group ends' pointer, and the role split (the producer's code follows: registers
    both roles use are made before it). ``prefetch``: tensor maps thread 0 prefetches into the
    descriptor cache (with the group ends into L2) before the barriers are set up;
    ``early()``: more code thread 0 runs there (e.g. L2 prefetches of operand tiles)."""
    from pyptx import ptx
    from pyptx.pipeline import Pipeline
    from pyptx.warpspec import Roles, prologue, ring_base, thread_ids

    base = ring_base()
    pipe = Pipeline(stages, consumer_arrivals=consumers * cluster)
    tid, wg = thread_ids()
    (p_offs,) = ptx.global_ptrs(offs)
    if prefetch:
        for tmap in prefetch:
            ptx.tma.prefetch_tensormap(tmap, pred=tid == 0)
        ptx.inst("prefetch.global.L2")(ptx.addr(p_offs), pred=tid == 0)
    if early is not None:
        with ptx.if_(tid == 0):
            early()
    rank, cid = prologue(pipe, tid, cluster)
    return base, pipe, tid, wg, rank, cid, p_offs, Roles(wg, prod_regs)


def ring_mma(c, pipe, a_tile, b_tile, base, stage_bytes, consumers, cluster=1):
    """Consumer ``c``'s ``RingMma`` over the ring at ``base``: its 64 rows of each A tile
    (``consumers`` warpgroups split the tile), all of B; with a cluster, a stage is released
    in every CTA of it (their copies fill it)."""
    from pyptx.warpspec import RingMma

    a_desc0 = a_tile.descriptor(base + c.w * a_tile.offset(0, 64) if consumers > 1 else base)
    b_desc0 = b_tile.descriptor(base, offset=a_tile.nbytes)
    release = dict(cta_ranks=range(cluster), sem="release.cta") if cluster > 1 else {}
    return RingMma(pipe, c.acc, a_tile, b_tile, a_desc0, b_desc0, stage_bytes, n=c.BN,
                   dtype="bf16", leader=c.leader, **release)


def copy_block(pipe, st, base, stage_bytes, k0, load):
    """The producer's copy of one k-block (``k0``: its first row or column) into the next
    stage: wait for it to be free, arm its barrier with ``stage_bytes``, then
    ``load(stage_base, k0, bar)``."""
    pipe.acquire(st)
    bar = pipe.arm(st, stage_bytes)
    load(st.stage * stage_bytes + base, k0, bar)
    st.advance()


def fill(pipe, st, base, stage_bytes, lo, hi, at, load):
    """``copy_block`` of k-blocks ``lo..hi`` of one tile (a device loop); ``at(kb)``: block
    ``kb``'s ``k0``."""
    from pyptx import ptx

    for kb in ptx.loop(lo, hi):
        copy_block(pipe, st, base, stage_bytes, at(kb), load)


class ForwardOperands:
    """The forward kernel's operand tiles and copies: A ``BM x BK`` K-major, B ``BN x BK`` in
    ``b_major`` order through a 3-D ``(G, ., .)`` tensor map. In a cluster along n each CTA
    copies ``1/cluster`` of A multicast to all; along m each copies whole slabs of B (every
    ``cluster``-th) or ``1/cluster`` of each slab's rows, multicast."""

    def __init__(self, BM, BN, BK, b_major, cluster, along_m):
        self.BK, self.b_major, self.cluster = BK, b_major, cluster
        self.along_m = along_m
        self.along_n = cluster > 1 and not along_m
        self.a_tile = a_tile = OperandTile(BM, BK, bf16, major="K", swizzle=128)
        self.b_tile = b_tile = OperandTile(BN, BK, bf16, major=b_major, swizzle=128)
        self.a_bytes = a_tile.nbytes
        self.stage_bytes = self.a_bytes + b_tile.nbytes
        self.b_slab_split = along_m and b_major == "MN" and b_tile.slabs % cluster == 0
        self.b_rows = (BK if b_major == "MN" else BN) // (
            cluster if along_m and not self.b_slab_split else 1)

    def tma(self):
        """The tensor maps' options of A and B."""
        return {"A": self.a_tile.tma_options(self.cluster if self.along_n else 1),
                "B": {"box": (1, self.b_rows, 64), "swizzle": "128B"}}

    def b_coords(self, i, n0, k0, g):
        """Tensor coordinates (innermost first) of B slab ``i`` of tile (n0, k0) in group g."""
        if self.b_major == "MN":
            return (n0 + i * 64 if i else n0, k0, g)
        return (k0 + i * 64 if i else k0, n0, g)

    def b_parts(self, rank, n0, k0, g):
        """``(coords, byte offset in the B tile)`` of the boxes of B this CTA copies (lazily,
        so each copy's address math stays beside it): every slab, or (along m) its
        ``1/cluster`` share of them."""
        b_tile, cluster, b_coords = self.b_tile, self.cluster, self.b_coords
        if not self.along_m:
            return ((b_coords(i, n0, k0, g), i * b_tile.slab_bytes) for i in range(b_tile.slabs))
        if self.b_slab_split:
            first = n0 + rank * 64
            return ((b_coords(j * cluster, first, k0, g),
                     rank * b_tile.slab_bytes + j * cluster * b_tile.slab_bytes)
                    for j in range(b_tile.slabs // cluster))
        row = rank * self.b_rows
        if self.b_major == "MN":   # split the k rows of every slab
            return ((b_coords(i, n0, k0 + row, g), i * b_tile.slab_bytes + row * 128)
                    for i in range(b_tile.slabs))
        return iter([(b_coords(0, n0 + row, k0, g), row * 128)])  # K-major: one slab of BN rows

    def loader(self, A, a_map, b_map, rank, hint_a=None, hint_b=None):
        """``load(sbase, g, m0, n0, k0, bar)``: this CTA's copies of A and B of k-block ``k0``
        of tile ``(g, m0, n0)`` into the stage at ``sbase``, completing on ``bar``."""
        from pyptx import ptx

        a_tile, a_bytes, cluster = self.a_tile, self.a_bytes, self.cluster
        mask = (1 << cluster) - 1

        def load(sbase, g, m0, n0, k0, bar):
            if self.along_n:
                a_tile.load(sbase, A, m0, k0, bar, map_ptr=a_map, cache_hint=hint_a,
                            multicast_mask=mask, part=(rank, cluster))
            else:
                a_tile.load(sbase, A, m0, k0, bar, map_ptr=a_map, cache_hint=hint_a)
            for coords, off in self.b_parts(rank, n0, k0, g):
                ptx.tma.load_tile(ptx.addr(sbase + off, a_bytes) if type(off) is not int
                                  else ptx.addr(sbase, a_bytes + off), b_map, coords, bar,
                                  cache_hint=hint_b, multicast_mask=mask if self.along_m else None)

        return load

    def warm(self, A, B, blocks, *, M, G, BM, BN, unit_m, unit_n, num_n):
        """L2 prefetches of the first ``blocks`` k-blocks of the CTA's first tile under the
        uniform-groups guess (``uniform_guess``)."""
        from pyptx import ptx, reg

        cluster, along_n = self.cluster, self.along_n
        cta = reg.from_(ptx.special.ctaid.x(), u32)
        rank = cta & (cluster - 1) if cluster > 1 else 0
        g, m0, n0 = uniform_guess(cta >> (cluster.bit_length() - 1) if cluster > 1 else cta,
                                  M=M, G=G, BM=unit_m, BN=unit_n, num_n=num_n)
        n0 = n0 + rank * BN if along_n else n0
        a_m = (m0 + rank * (self.a_tile.tma_box(cluster)[1] if along_n else BM)
               if cluster > 1 else m0)
        ok = g < G
        a_map, b_map = ptx.tma.tensormap_ptr(A.tmap), ptx.tma.tensormap_ptr(B.tmap)
        for kb in range(blocks):
            ptx.tma.prefetch_tile(a_map, (kb * self.BK, a_m), pred=ok)
            for coords, _ in self.b_parts(rank, n0, kb * self.BK, g):
                ptx.tma.prefetch_tile(b_map, coords, pred=ok)


class WgradOperands:
    """The weight gradient's operand tiles: X ``BM x BK`` and Y ``BN x BK``, both MN-major
    (rows are the reduction), and the zeroing of X's rows past a group end."""

    def __init__(self, BM, BN, BK):
        self.BK = BK
        self.a_tile = OperandTile(BM, BK, bf16, major="MN", swizzle=128)
        self.b_tile = OperandTile(BN, BK, bf16, major="MN", swizzle=128)
        self.a_bytes = self.a_tile.nbytes
        self.stage_bytes = self.a_bytes + self.b_tile.nbytes

    def tma(self):
        """The tensor maps' options of X and Y."""
        return {"X": self.a_tile.tma_options(), "Y": self.b_tile.tma_options()}

    def loader(self, X, Y, x_map, y_map, m0, n0):
        """``load(sbase, r0, bar)``: X and Y rows ``r0 .. r0 + BK`` of tile ``(m0, n0)``."""
        def load(sbase, r0, bar):
            self.a_tile.load(sbase, X, m0, r0, bar, map_ptr=x_map)
            self.b_tile.load(sbase + self.a_bytes, Y, n0, r0, bar, map_ptr=y_map)

        return load

    def zeroer(self, c, mma, base, consumers):
        """``block(first, kb, start, end)``: consumer ``c``'s ``wgmma`` of k-block ``kb`` (the
        absolute block index) of a group of rows ``[start, end)``; when the group ends inside
        the block, the warpgroup's slab of X rows past it is zeroed first, then fenced for
        the async proxy."""
        from pyptx import ptx, reg

        BK, stage_bytes = self.BK, self.stage_bytes
        zero = reg.scalar(b32, init=0)
        iters = BK * 8 // 128  # 16-byte chunks of a slab's BK rows per thread
        # this thread's 16-byte chunks of the warpgroup's slab: row idx >> 3 (idx = t_wg + 128 i)
        my_rows = [(c.t_wg + 128 * i) >> 3 for i in range(iters)]
        my_off = [(c.t_wg + 128 * i) << 4 for i in range(iters)]
        slab_off = c.w * self.a_tile.slab_bytes if consumers > 1 else 0

        def block(first, kb, start, end):
            def zero_tail():
                # rows of the group left from this block on
                left = end - start if isinstance(kb, int) and kb == 0 else end - (start + kb * BK)
                with ptx.if_(left < BK):  # the group ends inside this block: zero the rest
                    slab = mma.cons.stage * stage_bytes + base + slab_off
                    for rows, off in zip(my_rows, my_off):
                        ptx.inst.st.shared.v4.b32(ptx.addr(slab + off), [zero] * 4,
                                                  pred=rows >= left)
                    ptx.fence_proxy_async("shared::cta")
                    ptx.bar_sync(c.bar_id, 128)
            mma.block(first, zero_tail)

        return block
