"""Grouped GEMM for mixture-of-experts layers on Hopper tensor cores.

``out[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g]`` for every group ``g`` (the
``torch._grouped_mm`` convention): ``a`` is ``(M, K)`` bf16 row-major, ``b`` is
``(G, K, N)`` bf16 (or its transposed view, stored ``(G, N, K)``: K-major), ``offs`` is
an int32 ``(G,)`` tensor *on the device* holding the cumulative row ends. The group
sizes are read by the kernel itself, so a call never synchronises with the host and
captures in a CUDA graph. Empty groups and sizes that are not tile multiples are fine.

The forward kernel is ``examples/hopper/gemm.py``'s design with a ragged scheduler:

* warpgroup 0 produces (one thread issues the bulk tensor copies of A and of ``B[g]``
  through a 3-D tensor map over ``(G, K, N)``, so K and N edges clip per group) into an
  ``stages``-deep mbarrier ring; warpgroups 1.. consume it with ``wgmma`` (64 rows each);
* both sides walk the same persistent tile sequence ``t = cta, cta + ctas, ...``: a
  ``RaggedTiles`` walker reads ``offs`` as it goes (tiles of group ``g`` are
  ``ceil(rows_g / BM) * ceil(N / BN)``, m-block fastest) and stops past the last group;
* the epilogue stores a warpgroup's 64 rows with bulk tensor stores when they lie inside
  the group, and with predicated ``st.global`` (rows past the group end skipped) when
  they cross it, so the next group's rows are never written.

Backward (``pyptx.differentiable_kernel``): ``dA = dOut @ b[g]^T`` is the same kernel
with B read in the other major order (no copy), and ``dB[g] = a_g^T @ dOut_g`` is
``build_grouped_wgrad``: a GEMM over the fixed ``(K, N)`` tiles of every group whose
reduction runs over the group's ragged rows; rows of the last k-block past the group end
are zeroed in shared memory (then ``fence.proxy.async``) before the tensor cores read them.

``grouped_mm(a, b, offs)`` is the call for torch tensors and JAX arrays; the tile
configuration is tuned per shape on the device (``pyptx.autotune``).

Limits: rows of ``out`` (and of ``dA``) past ``offs[-1]`` are not written; ``offs`` must
be non-decreasing (values are clamped to ``[previous end, M]``).
"""

from __future__ import annotations

import functools
import os
import sys

from pyptx import Tile, kernel, ptx, reg
from pyptx.autodiff import differentiable_kernel
from pyptx.autotune import Config, autotune
from pyptx.errors import ConfigError
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.pipeline import Pipeline
from pyptx.source import where_outside
from pyptx.types import b32, bf16, f32, s32, u32, u64
from pyptx.warpspec import (
    SLAB_BYTES,
    RingMma,
    Roles,
    drain_stores,
    prologue,
    register_budget,
    ring_base,
    store_slabs,
    swizzled_rows,
    thread_ids,
)
from pyptx_kernels._common import PACKAGE_DIR

H100_SMS = 132
SMEM_LIMIT = 227 * 1024 - 256  # less the static barriers
EPI_BUFS = 2
STORES = ("auto", "masked")
L2_HINTS = (None, "stream_b")
MAX_SPLITS = 8
FORWARD_ONLY = ("l2_hint", "cluster", "cluster_along", "prefetch", "warm", "speculate")
"""``build_grouped`` keywords the weight-gradient kernel does not take (a ``config`` given to
``grouped_mm`` passes the rest to it)."""


def _error(msg):
    """A ``ConfigError`` whose message starts with the ``file:line`` of the first caller
    outside this example and pyptx."""
    return ConfigError(f"{where_outside(PACKAGE_DIR)}: {msg}")


def _out_type(name):
    table = {"bf16": bf16, "f32": f32, bf16: bf16, f32: f32}
    if name not in table:
        raise _error(f"grouped GEMM: out_dtype must be 'bf16' or 'f32', got {name!r}")
    return table[name]


def smem_bytes(BM, BN, BK, stages):
    """Dynamic shared memory of a configuration: the ring, two 8 KiB epilogue slabs per
    consumer warpgroup and 1024 bytes of alignment slack."""
    return stages * (BM + BN) * BK * 2 + (BM // 64) * EPI_BUFS * 64 * 128 + 1024


def _check_tile(BM, BN, BK, stages, what):
    if BM not in (64, 128) or BN % 64 or not 64 <= BN <= 256 or BK != 64:
        raise _error(f"{what}: unsupported tile {BM}x{BN}x{BK} (BM 64 or 128, BN a multiple "
                          f"of 64 up to 256, BK 64)")
    if stages is None:
        per_stage = smem_bytes(BM, BN, BK, 1) - smem_bytes(BM, BN, BK, 0)
        stages = max(2, min(8, (SMEM_LIMIT - smem_bytes(BM, BN, BK, 0)) // per_stage))
    total = smem_bytes(BM, BN, BK, stages)
    if total > SMEM_LIMIT:
        raise _error(f"{what}: {BM}x{BN}x{BK} with {stages} stages needs {total} bytes of "
                          f"shared memory, over {SMEM_LIMIT}")
    return stages, total


def _mov(dst, src):
    """``mov`` of ``src`` into the existing register ``dst`` (a loop-carried value)."""
    ptx.inst(f"mov.b{dst.type.bits}")(dst, src)


def _min_max(x, lo, hi):
    """``max(min(x, hi), lo)`` for u32 registers."""
    m = reg.scalar(u32)
    ptx.inst.min.u32(m, x, hi)
    out = reg.scalar(u32)
    ptx.inst.max.u32(out, m, lo)
    return out


class RaggedTiles:
    """The persistent walk over the tiles of ragged groups, as loop-carried registers.

    Group ``g`` covers rows ``[start, end)`` (``end = offs[g]`` clamped to
    ``[start, M]``) and tiles ``[first, stop)`` of the global tile order:
    ``ceil((end - start) / BM)`` m-blocks times ``num_n`` n-blocks, m-block fastest.
    ``seek(t)`` moves forward (``t`` never decreases) until the current group holds
    tile ``t`` or every group is read; then ``t >= stop`` means the walk is over.
    """

    def __init__(self, offs_ptr, G, M, BM, num_n):
        self.p, self.G, self.M, self.BM, self.num_n = offs_ptr, G, M, BM, num_n
        self.shift = BM.bit_length() - 1
        self.read = reg.scalar(u32, init=0)   # groups read so far (the current one is read - 1)
        self.start = reg.scalar(u32, init=0)
        self.end = reg.scalar(u32, init=0)
        self.first = reg.scalar(u32, init=0)
        self.stop = reg.scalar(u32, init=0)

    def blocks(self):
        """m-blocks of the current group."""
        return (self.end - self.start + (self.BM - 1)) >> self.shift

    def seek(self, t):
        """Advance to the group that holds tile ``t`` (emits a device while-loop)."""
        with ptx.while_(lambda: (t >= self.stop) & (self.read < self.G)):
            _mov(self.start, self.end)
            raw = reg.scalar(u32)
            ptx.inst.ld.global_.nc.u32(raw, ptx.addr(self.p + reg.from_(self.read, u64) * 4))
            _mov(self.end, _min_max(raw, self.start, self.M))
            _mov(self.first, self.stop)
            self.stop += self.blocks() * self.num_n
            self.read += 1

    def done(self, t):
        """Predicate: tile ``t`` lies past the last group (call after ``seek(t)``)."""
        return t >= self.stop

    def tile(self, t, BN):
        """``(g, m0, n0)`` registers of tile ``t`` (after ``seek(t)``, when not done)."""
        local = t - self.first
        nblk = self.blocks()
        mb = local % nblk
        nb = local // nblk
        return self.read - 1, self.start + (mb << self.shift), nb * BN


def uniform_guess(t, *, M, G, BM, BN, num_n):
    """``(g, m0, n0)`` of unit ``t`` of the ``RaggedTiles`` order (m-block fastest, then
    n-block, then group) if each of the ``G`` groups had ``M // G`` rows; ``t`` a Python int
    (a CPU model) or a u32 register (in a kernel)."""
    rows = M // G
    blocks = max(1, -(-rows // BM))
    per = blocks * num_n
    g = t // per
    local = t - g * per
    return g, g * rows + local % blocks * BM, local // blocks * BN


def group_rows(p_offs, g, M):
    """``(start, end)`` u32 registers of group ``g``'s rows (clamped to ``[0, M]``)."""
    start = reg.scalar(u32, init=0)
    ptx.inst.ld.global_.nc.u32(start, ptx.addr(p_offs + reg.from_(g, u64) * 4 - 4), pred=g != 0)
    start = _min_max(start, 0, M)
    raw = reg.scalar(u32)
    ptx.inst.ld.global_.nc.u32(raw, ptx.addr(p_offs + reg.from_(g, u64) * 4))
    return start, _min_max(raw, start, M)


def wgrad_unit(u, tiles, splits):
    """``(tile, split)`` registers of the weight gradient's work unit ``u`` (split-major:
    split ``u // tiles`` of tile ``u % tiles``); ``(u, None)`` when ``splits == 1``."""
    if splits == 1:
        return u, None
    s = u // tiles
    return u - s * tiles, s


def split_blocks(s, start, end, splits, BK=64):
    """``(kb_lo, kb_hi)``: split ``s``'s run of the ``nkb = ceil((end - start) / BK)`` row
    blocks of a group, ``floor(nkb * s / splits)`` up to ``floor(nkb * (s + 1) / splits)``
    (all of them, ``(0, nkb)``, when ``s`` is None). The runs of ``s = 0..splits-1`` tile
    ``[0, nkb)`` in order; a run may be empty (then the split's partial sum is zero)."""
    nkb = (end - start + (BK - 1)) >> (BK.bit_length() - 1)
    if s is None:
        return 0, nkb
    return (nkb * s) // splits, (nkb * (s + 1)) // splits


def _open(stages, consumers, offs, prod_regs, cluster=1, prefetch=(), early=None):
    """The grouped kernels' opening: ``(base, pipe, tid, wg, rank, cid, p_offs, roles)``, the
    ring base and its pipeline (released by the consumers of every CTA of the cluster), the
    thread's ids, the CTA's rank in its cluster (``0`` without one) and the cluster's index,
    the group ends' pointer, and the role split (the producer's code follows: registers
    both roles use are made before it). ``prefetch``: tensor maps thread 0 prefetches into the
    descriptor cache (with the group ends into L2) before the barriers are set up;
    ``early()``: more code thread 0 runs there (e.g. L2 prefetches of operand tiles)."""
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


class _Consumer:
    """A consumer warpgroup's fixed registers and its epilogue (shared by both kernels)."""

    def __init__(self, base, ring_bytes, wg, tid, BN, ot, out_cols):
        self.w = wg - 1
        self.t_wg = tid & 127
        self.leader = self.t_wg == 0
        self.bar_id = self.w + 1
        self.acc = Accumulator(BN)
        self.row0, self.col0 = self.acc.thread_origin(self.t_wg)
        self.ot, self.out_cols, self.BN = ot, out_cols, BN
        lane = tid & 31
        self.cbuf = base + ring_bytes + self.w * (EPI_BUFS * SLAB_BYTES)
        self.sw = swizzled_rows(self.cbuf, self.row0, lane, ot.bytes)

    def ring_mma(self, pipe, a_tile, b_tile, base, stage_bytes, consumers, cluster=1):
        """The warpgroup's ``RingMma`` over the ring at ``base``: its 64 rows of each A tile
        (``consumers`` warpgroups split the tile), all of B; with a cluster, a stage is
        released in every CTA of it (their copies fill it)."""
        a_desc0 = a_tile.descriptor(base + self.w * a_tile.offset(0, 64) if consumers > 1 else base)
        b_desc0 = b_tile.descriptor(base, offset=a_tile.nbytes)
        release = dict(cta_ranks=range(cluster), sem="release.cta") if cluster > 1 else {}
        return RingMma(pipe, self.acc, a_tile, b_tile, a_desc0, b_desc0, stage_bytes, n=self.BN,
                       dtype="bf16", leader=self.leader, **release)

    def _pack(self, i):
        v0, v1 = self.acc[i], self.acc[i + 1]
        if self.ot is f32:
            return [v0, v1]
        packed = reg.scalar(b32)
        ptx.inst("cvt.rn.bf16x2.f32")(packed, v1, v0)
        return packed

    def store_tma(self, d_map, coords):
        """Bulk tensor stores of the 64 x BN tile, one 64 x ``out_cols`` slab at a time
        through two buffers; ``coords(j)`` gives slab ``j``'s tensor coordinates."""
        out_cols, e = self.out_cols, self.ot.bytes

        def write(j, buf):
            for i, dr, dc in self.acc.pairs():
                if dc // out_cols != j:
                    continue
                q = dc % out_cols * e // 16
                v = self._pack(i)
                if self.ot is f32:
                    ptx.inst.st.shared.v2.f32(ptx.addr(self.sw[q], buf + dr * 128), v)
                else:
                    ptx.inst.st.shared.b32(ptx.addr(self.sw[q], buf + dr * 128), v)

        store_slabs(self.BN // out_cols, leader=self.leader, bar_id=self.bar_id, cbuf=self.cbuf,
                    tmap=d_map, write=write, coords=coords, bufs=EPI_BUFS)

    def store_masked(self, p_out, N, mrow, n0, end):
        """Predicated ``st.global`` of every pair whose row is below ``end`` and column
        below ``N`` (the tile crosses a group end)."""
        e = self.ot.bytes
        r0 = mrow + self.row0
        c0 = n0 + self.col0
        p0 = p_out + (reg.from_(r0, u64) * N + reg.from_(c0, u64)) * e
        row_ok = {dr: (r0 + dr) < end for dr in (0, 8)}
        for i, dr, dc in self.acc.pairs():
            ok = row_ok[dr] & ((c0 + dc) < N)
            a = ptx.addr(p0, (dr * N + dc) * e)
            v = self._pack(i)
            if self.ot is f32:
                ptx.inst.st.global_.v2.f32(a, v, pred=ok)
            else:
                ptx.inst.st.global_.b32(a, v, pred=ok)


def build_grouped(M: int, N: int, K: int, G: int, *, b_major="MN", out_dtype="bf16", BM=128,
                  BN=256, BK=64, stages=None, num_sms=H100_SMS, store="auto", l2_hint=None,
                  cluster=1, cluster_along="n", prefetch=False, warm=0, speculate=0):
    """The grouped GEMM kernel ``D[rows of g] = A[rows of g] @ B[g]``.

    Tensor arguments: A ``(M, K)`` bf16, B ``(G, K, N)`` (``b_major="MN"``) or
    ``(G, N, K)`` (``"K"``) bf16, offs ``(G,)`` int32 cumulative row ends; output D
    ``(M, N)`` in ``out_dtype`` (rows past ``offs[-1]`` are not written).

    Tiles: ``BM`` (64 rows per consumer warpgroup) x ``BN`` x ``BK``, ``stages`` ring
    buffers (default: as many as fit) over ``num_sms`` persistent CTAs. ``store="masked"``
    stores every tile with predicated ``st.global`` (a debugging aid: no bulk stores).
    ``l2_hint="stream_b"`` (opt-in, not tuned yet) loads B with an L2 evict-first policy
    and A with evict-last, for shapes whose B tiles are each read by one CTA (few rows per
    group: B streams from memory once and should not push A's reused rows out of L2).
    ``cluster=2``: two CTAs take the two neighbouring n-blocks of one m-block (always in the
    same group, whatever the group sizes) and share its A tile, each copying half of it to
    both (multicast); a CTA whose n-block lies past ``N`` computes on zeros and stores
    nothing. The A tile then crosses L2 once per pair, for shapes with few n-blocks.
    ``cluster_along="m"`` (``cluster`` 2 or 4): the cluster's CTAs take neighbouring
    m-blocks of one group instead and share the B tile, each copying a ``1/cluster`` part
    of it to all (multicast): few n-blocks and many rows per group (4x2048x256x2048: every
    CTA of a group reads all of ``B[g]``, so B's L2 traffic dominates); a CTA whose rows lie
    past its group's end still consumes the ring (its peers' copies land in it) but
    stores nothing. Opt-in: slower where measured (H100, 4x2048x256x2048 forward, 64x256
    tiles: 28.3 us in pairs, 38.6 in fours, 26.0 without a cluster; 128x128 pairs 28.5), so
    that shape is not bound by B's L2 traffic.
    ``prefetch=True`` (tuned with 64x256 tiles): thread 0 prefetches the three tensor maps and
    the group ends at the start, ahead of the barrier setup (for short kernels, where the
    first copies' descriptor fetch is on the critical path: 4x2048x256x2048 forward 25.0 vs
    25.5 us on the H100).
    ``warm=n`` (opt-in; slower where measured: 4x2048x256x2048 forward with 32 k-blocks
    33-35 vs 25.5 us, 6 k-blocks in a cluster 25.5): before anything else, thread 0 asks L2
    for the first ``n`` k-blocks of A and B of the tile this CTA would take first if the ``G``
    groups had ``M // G`` rows each (``ptx.tma.prefetch_tile``, a hint): the copies then
    start while the group ends are still being read. A wrong guess costs only bandwidth.
    ``speculate=n`` (cluster 1): the producer copies the first ``n`` k-blocks of that guessed
    tile into the ring before it reads a group end; if the CTA's real first tile is the
    guess, its k-loop starts at block ``n``, otherwise both sides agree the guess missed
    (each computes it from the CTA index) and the consumers hand those stages back unread.
    """
    what = "build_grouped"
    ot = _out_type(out_dtype)
    if b_major not in ("K", "MN"):
        raise _error(f"{what}: b_major must be 'K' or 'MN', got {b_major!r}")
    if store not in STORES:
        raise _error(f"{what}: store must be one of {STORES}, got {store!r}")
    if l2_hint not in L2_HINTS:
        raise _error(f"{what}: l2_hint must be one of {L2_HINTS}, got {l2_hint!r}")
    if N % 8 or K % 8:
        raise _error(f"{what}: N and K must be multiples of 8 (16-byte rows for the tensor "
                          f"copies), got N={N}, K={K}; pad them (grouped_mm does)")
    if cluster_along not in ("n", "m"):
        raise _error(f"{what}: cluster_along must be 'n' or 'm', got {cluster_along!r}")
    if cluster not in ((1, 2, 4) if cluster_along == "m" else (1, 2)):
        raise _error(f"{what}: cluster must be 1 or 2 (or 4 along m), got {cluster!r} "
                     f"(cluster_along={cluster_along!r})")
    if isinstance(warm, bool) or not isinstance(warm, int) or warm < 0:
        raise _error(f"{what}: warm must be an int >= 0 (k-blocks to prefetch), got {warm!r}")
    stages, smem_total = _check_tile(BM, BN, BK, stages, what)
    if (isinstance(speculate, bool) or not isinstance(speculate, int) or speculate < 0
            or speculate > stages or speculate and cluster > 1):
        raise _error(f"{what}: speculate must be an int from 0 to the {stages} stages, without "
                     f"a cluster, got {speculate!r} (cluster={cluster})")
    consumers = BM // 64
    threads = 128 * (1 + consumers)
    a_tile = OperandTile(BM, BK, bf16, major="K", swizzle=128)
    b_tile = OperandTile(BN, BK, bf16, major=b_major, swizzle=128)
    a_bytes = a_tile.nbytes
    stage_bytes = a_bytes + b_tile.nbytes
    ring_bytes = stages * stage_bytes
    out_cols = 128 // ot.bytes
    along_m = cluster > 1 and cluster_along == "m"
    along_n = cluster > 1 and not along_m
    unit_m = BM * cluster if along_m else BM     # rows of one scheduling unit
    unit_n = BN * cluster if along_n else BN     # columns of one
    num_n = -(-N // unit_n)
    num_kb = -(-K // BK)
    max_tiles = (-(-M // unit_m) + G) * num_n
    clusters = max(1, min(num_sms // cluster, max_tiles))
    ctas = clusters * cluster
    prod_regs = 40
    maxnreg, cons_regs = register_budget(consumers, prod_regs)

    b_spec = Tile(G, K, N, bf16) if b_major == "MN" else Tile(G, N, K, bf16)
    # along m, each CTA copies whole slabs of B (every cluster-th) or 1/cluster of each
    # slab's rows, multicast to the cluster
    b_slab_split = along_m and b_major == "MN" and b_tile.slabs % cluster == 0
    b_rows = (BK if b_major == "MN" else BN) // (cluster if along_m and not b_slab_split else 1)
    b_box = (1, b_rows, 64)
    tma = {"A": a_tile.tma_options(cluster if along_n else 1),
           "B": {"box": b_box, "swizzle": "128B"},
           "D": {"box": (64, out_cols), "swizzle": "128B"}}

    def b_coords(i, n0, k0, g):
        """Tensor coordinates (innermost first) of B slab ``i`` of tile (n0, k0) in group g."""
        if b_major == "MN":
            return (n0 + i * 64 if i else n0, k0, g)
        return (k0 + i * 64 if i else k0, n0, g)

    def b_parts(rank, n0, k0, g):
        """``(coords, byte offset in the B tile)`` of the boxes of B this CTA copies (lazily,
        so each copy's address math stays beside it): every slab, or (along m) its
        ``1/cluster`` share of them."""
        if not along_m:
            return ((b_coords(i, n0, k0, g), i * b_tile.slab_bytes) for i in range(b_tile.slabs))
        if b_slab_split:
            first = n0 + rank * 64
            return ((b_coords(j * cluster, first, k0, g),
                     rank * b_tile.slab_bytes + j * cluster * b_tile.slab_bytes)
                    for j in range(b_tile.slabs // cluster))
        row = rank * b_rows
        if b_major == "MN":   # split the k rows of every slab
            return ((b_coords(i, n0, k0 + row, g), i * b_tile.slab_bytes + row * 128)
                    for i in range(b_tile.slabs))
        return iter([(b_coords(0, n0 + row, k0, g), row * 128)])  # K-major: one slab of BN rows

    def warm_guess(A, B):
        """L2 prefetches of the first ``warm`` k-blocks of the CTA's first tile under the
        uniform-groups guess (``uniform_guess``)."""
        cta = reg.from_(ptx.special.ctaid.x(), u32)
        rank = cta & (cluster - 1) if cluster > 1 else 0
        g, m0, n0 = uniform_guess(cta >> (cluster.bit_length() - 1) if cluster > 1 else cta,
                                  M=M, G=G, BM=unit_m, BN=unit_n, num_n=num_n)
        n0 = n0 + rank * BN if along_n else n0
        a_m = m0 + rank * (a_tile.tma_box(cluster)[1] if along_n else BM) if cluster > 1 else m0
        ok = g < G
        a_map, b_map = ptx.tma.tensormap_ptr(A.tmap), ptx.tma.tensormap_ptr(B.tmap)
        for kb in range(min(warm, num_kb)):
            ptx.tma.prefetch_tile(a_map, (kb * BK, a_m), pred=ok)
            for coords, _ in b_parts(rank, n0, kb * BK, g):
                ptx.tma.prefetch_tile(b_map, coords, pred=ok)

    def grouped(A, B, Offs, D):
        # the rank comes from the opening, before the role split: the consumers use it too
        base, pipe, tid, wg, rank, cid, p_offs, roles = _open(
            stages, consumers, Offs, prod_regs, cluster,
            prefetch=(A.tmap, B.tmap, D.tmap) if prefetch else (),
            early=(lambda: warm_guess(A, B)) if warm else None)

        def origin(walk, t):
            """``(g, m0, n0)`` of this CTA's tile in unit ``t``."""
            g, m0, n0 = walk.tile(t, unit_n)
            if along_m:
                return g, m0 + rank * BM, n0
            return g, m0, (n0 + rank * BN if along_n else n0)

        spec = min(speculate, num_kb)

        def guess():
            """The guessed first tile ``(g, m0, n0)``, whether it is a tile at all, and a
            first-tile flag: made on each side of the role split (the code before it is the
            producer's), from the CTA index, so both sides agree."""
            gs, ms, ns = uniform_guess(cid, M=M, G=G, BM=BM, BN=BN, num_n=num_n)
            return (gs, ms, ns), gs < G, reg.scalar(u32, init=1)

        def guessed(walk, t, tile, first):
            """Predicate: this is the CTA's first tile and the guess named it."""
            g, m0, n0 = origin(walk, t)
            return (first != 0) & (g == tile[0]) & (m0 == tile[1]) & (n0 == tile[2])

        # ---------------------------------------------------------------- producer
        with ptx.if_(tid == 0):
            st = pipe.producer_state()
            a_map = ptx.tma.tensormap_ptr(A.tmap)
            b_map = ptx.tma.tensormap_ptr(B.tmap)
            hint_a = hint_b = None
            if l2_hint == "stream_b":
                hint_a, hint_b = ptx.tma.cache_policy("last"), ptx.tma.cache_policy("first")
            walk = RaggedTiles(p_offs, G, M, unit_m, num_n)
            t = reg.scalar(u32, init=cid)
            mask = (1 << cluster) - 1

            def load(sbase, g, m0, n0, k0, bar):
                if along_n:
                    a_tile.load(sbase, A, m0, k0, bar, map_ptr=a_map, cache_hint=hint_a,
                                multicast_mask=mask, part=(rank, cluster))
                else:
                    a_tile.load(sbase, A, m0, k0, bar, map_ptr=a_map, cache_hint=hint_a)
                for coords, off in b_parts(rank, n0, k0, g):
                    ptx.tma.load_tile(ptx.addr(sbase + off, a_bytes) if type(off) is not int
                                      else ptx.addr(sbase, a_bytes + off), b_map, coords, bar,
                                      cache_hint=hint_b, multicast_mask=mask if along_m else None)

            if spec:    # before any group end is read
                tile, spec_ok, first = guess()
                with ptx.if_(spec_ok):
                    for kb in range(spec):
                        pipe.acquire(st)
                        bar = pipe.arm(st, stage_bytes)
                        load(st.stage * stage_bytes + base, *tile, kb * BK, bar)
                        st.advance()
            top, out = ptx.label("ptile"), ptx.label("pend")
            ptx.place(top)
            walk.seek(t)
            ptx.bra(out, pred=walk.done(t))
            g, m0, n0 = origin(walk, t)
            kb0 = 0
            if spec:    # a hit: the guessed k-blocks are this tile's first
                kb0 = reg.scalar(u32)
                ptx.inst.selp.u32(kb0, spec, 0, spec_ok & guessed(walk, t, tile, first))
                ptx.inst.mov.u32(first, 0)
            for kb in ptx.loop(kb0, num_kb):
                k0 = kb * BK
                pipe.acquire(st)
                bar = pipe.arm(st, stage_bytes)
                load(st.stage * stage_bytes + base, g, m0, n0, k0, bar)
                st.advance()
            t += clusters
            ptx.bra(top)
            ptx.place(out)
        # ---------------------------------------------------------------- consumers
        roles.consumers(cons_regs)
        c = _Consumer(base, ring_bytes, wg, tid, BN, ot, out_cols)
        mma = c.ring_mma(pipe, a_tile, b_tile, base, stage_bytes, consumers, cluster)
        d_map = ptx.tma.tensormap_ptr(D.tmap)
        (p_d,) = ptx.global_ptrs(D)
        walk = RaggedTiles(p_offs, G, M, unit_m, num_n)
        t = reg.scalar(u32, init=cid)
        if spec:
            tile, spec_ok, first = guess()
        top, out = ptx.label("ctile"), ptx.label("cend")
        ptx.place(top)
        walk.seek(t)
        if spec:    # a miss (or no tile at all): the guessed stages go back unread
            hit = reg.scalar(u32, init=0)
            with ptx.if_(~walk.done(t)):
                ptx.inst.selp.u32(hit, 1, 0, guessed(walk, t, tile, first))
            with ptx.if_(spec_ok & (first != 0) & (hit == 0)):
                for _ in range(spec):
                    mma.skip()
            ptx.inst.mov.u32(first, 0)
        ptx.bra(out, pred=walk.done(t))
        _g, m0, n0 = origin(walk, t)

        mma.run(num_kb)

        mrow = m0 + c.w * 64
        if store == "masked":
            c.store_masked(p_d, N, mrow, n0, walk.end)
        else:
            with ptx.if_(mrow + 64 <= walk.end):  # the warpgroup's 64 rows lie in the group
                c.store_tma(d_map, lambda j: (n0 + j * out_cols, mrow))
            with ptx.else_():
                c.store_masked(p_d, N, mrow, n0, walk.end)
        t += clusters
        ptx.bra(top)
        ptx.place(out)
        drain_stores(c.leader)
        roles.end()
        if cluster > 1:  # the peer may still arrive on this CTA's barriers
            ptx.cluster_sync()
        ptx.ret()

    name = (f"grouped_{ot.name}_{b_major}_{BM}x{BN}x{BK}_s{stages}"
            f"{'_masked' if store == 'masked' else ''}{'_l2' + l2_hint if l2_hint else ''}"
            f"{f'_c{cluster}' if cluster > 1 else ''}{'m' if along_m else ''}"
            f"{'_pf' if prefetch else ''}"
            f"{f'_w{warm}' if warm else ''}{f'_spec{speculate}' if speculate else ''}")
    return kernel(in_specs=(Tile(M, K, bf16), b_spec, Tile(G, s32)), out_specs=(Tile(M, N, ot),),
                  grid=(ctas, 1, 1), block=(threads, 1, 1), cluster=(cluster, 1, 1),
                  smem=smem_total, maxnreg=maxnreg, tma=tma, name=name)(grouped)


def build_grouped_wgrad(M: int, KX: int, NY: int, G: int, *, out_dtype="bf16", BM=128, BN=256,
                        BK=64, stages=None, num_sms=H100_SMS, splits=1):
    """The weight-gradient kernel ``W[g] = X[rows of g]^T @ Y[rows of g]``.

    Tensor arguments: X ``(M, KX)`` bf16, Y ``(M, NY)`` bf16, offs ``(G,)`` int32; output W
    ``(G, KX, NY)`` in ``out_dtype`` (an empty group's W is zero). Both operands are read
    MN-major (rows are the reduction); tiles of W are ``BM x BN``; the reduction runs in
    ``BK``-row blocks over the group's rows, and the rows of the last block past the group
    end are zeroed in X's shared tile before the tensor cores read it.

    ``splits=S > 1`` (opt-in, not tuned yet) splits each group's row blocks into ``S``
    contiguous runs, one work unit each (``S`` times the tiles, for shapes with fewer tiles
    than SMs); the output is then ``S`` f32 partial sums, ``(S * G, KX, NY)`` with split
    ``s`` of group ``g`` at ``s * G + g`` (``out_dtype`` must be ``"f32"``), which
    ``build_split_reduce`` adds in a fixed order (deterministic).
    """
    what = "build_grouped_wgrad"
    ot = _out_type(out_dtype)
    if KX % 8 or NY % 8:
        raise _error(f"{what}: KX and NY must be multiples of 8, got KX={KX}, NY={NY}")
    if isinstance(splits, bool) or not isinstance(splits, int) or not 1 <= splits <= MAX_SPLITS:
        raise _error(f"{what}: splits must be an int in 1..{MAX_SPLITS}, got {splits!r}")
    if splits > 1 and ot is not f32:
        raise _error(f"{what}: splits={splits} writes f32 partial sums: out_dtype must be "
                     f"'f32', got {out_dtype!r}")
    stages, smem_total = _check_tile(BM, BN, BK, stages, what)
    consumers = BM // 64
    threads = 128 * (1 + consumers)
    a_tile = OperandTile(BM, BK, bf16, major="MN", swizzle=128)
    b_tile = OperandTile(BN, BK, bf16, major="MN", swizzle=128)
    a_bytes = a_tile.nbytes
    stage_bytes = a_bytes + b_tile.nbytes
    ring_bytes = stages * stage_bytes
    out_cols = 128 // ot.bytes
    num_m = -(-KX // BM)
    num_n = -(-NY // BN)
    per_group = num_m * num_n
    tiles = G * per_group
    units = tiles * splits  # split-major: unit u is split u // tiles of tile u % tiles
    ctas = max(1, min(num_sms, units))
    prod_regs = 40
    maxnreg, cons_regs = register_budget(consumers, prod_regs)
    tma = {"X": a_tile.tma_options(), "Y": b_tile.tma_options(),
           "W": {"box": (1, 64, out_cols), "swizzle": "128B"}}
    zero_iters = BK * 8 // 128  # 16-byte chunks of a slab's BK rows per thread

    def decode(t):
        g = t // per_group
        within = t - g * per_group
        mb = within % num_m
        nb = within // num_m
        return g, mb * BM, nb * BN

    def unit(u):
        return wgrad_unit(u, tiles, splits)

    def block_run(s, start, end):
        return split_blocks(s, start, end, splits)

    def wgrad(X, Y, Offs, W):
        base, pipe, tid, wg, _, cid, p_offs, roles = _open(stages, consumers, Offs, prod_regs)
        # ---------------------------------------------------------------- producer
        with ptx.if_(tid == 0):
            st = pipe.producer_state()
            x_map = ptx.tma.tensormap_ptr(X.tmap)
            y_map = ptx.tma.tensormap_ptr(Y.tmap)
            for u in ptx.loop(cid, units, ctas):
                t, split = unit(u)
                g, m0, n0 = decode(t)
                start, end = group_rows(p_offs, g, M)
                lo, hi = block_run(split, start, end)
                for kb in ptx.loop(lo, hi):
                    r0 = start + kb * BK
                    pipe.acquire(st)
                    bar = pipe.arm(st, stage_bytes)
                    sbase = st.stage * stage_bytes + base
                    a_tile.load(sbase, X, m0, r0, bar, map_ptr=x_map)
                    b_tile.load(sbase + a_bytes, Y, n0, r0, bar, map_ptr=y_map)
                    st.advance()
        # ---------------------------------------------------------------- consumers
        roles.consumers(cons_regs)
        c = _Consumer(base, ring_bytes, wg, tid, BN, ot, out_cols)
        acc = c.acc
        mma = c.ring_mma(pipe, a_tile, b_tile, base, stage_bytes, consumers)
        w_map = ptx.tma.tensormap_ptr(W.tmap)
        zero = reg.scalar(b32, init=0)
        # this thread's 16-byte chunks of the warpgroup's slab: row idx >> 3 (idx = t_wg + 128 i)
        my_rows = [(c.t_wg + 128 * i) >> 3 for i in range(zero_iters)]
        my_off = [(c.t_wg + 128 * i) << 4 for i in range(zero_iters)]
        slab_off = c.w * a_tile.slab_bytes if consumers > 1 else 0

        for u in ptx.loop(cid, units, ctas):
            t, split = unit(u)
            g, m0, n0 = decode(t)
            start, end = group_rows(p_offs, g, M)
            lo, hi = block_run(split, start, end)

            def k_block(first, kb, start=start, end=end):
                def zero_tail():
                    # rows of the group left from this block on (kb: the absolute block index)
                    left = end - start if isinstance(kb, int) and kb == 0 else end - (start + kb * BK)
                    with ptx.if_(left < BK):  # the group ends inside this block: zero the rest
                        slab = mma.cons.stage * stage_bytes + base + slab_off
                        for rows, off in zip(my_rows, my_off):
                            ptx.inst.st.shared.v4.b32(ptx.addr(slab + off), [zero] * 4,
                                                      pred=rows >= left)
                        ptx.fence_proxy_async("shared::cta")
                        ptx.bar_sync(c.bar_id, 128)
                mma.block(first, zero_tail)

            with ptx.if_(hi != lo):
                k_block(True, lo)
                for kb in ptx.loop(lo + 1 if splits > 1 else 1, hi):
                    k_block(False, kb)
                mma.drain()
            with ptx.else_():
                acc.zero()
            mrow = m0 + c.w * 64
            gz = g if split is None else split * G + g
            c.store_tma(w_map, lambda j, n0=n0, mrow=mrow, gz=gz: (n0 + j * out_cols, mrow, gz))
        drain_stores(c.leader)
        roles.end()
        ptx.ret()

    name = f"grouped_wgrad_{ot.name}_{BM}x{BN}x{BK}_s{stages}" + (f"_split{splits}" if splits > 1 else "")
    return kernel(in_specs=(Tile(M, KX, bf16), Tile(M, NY, bf16), Tile(G, s32)),
                  out_specs=(Tile(splits * G, KX, NY, ot),), grid=(ctas, 1, 1), block=(threads, 1, 1),
                  smem=smem_total, maxnreg=maxnreg, tma=tma, name=name)(wgrad)


def build_split_reduce(G: int, KX: int, NY: int, splits: int, *, out_dtype="bf16"):
    """The deterministic reduction of ``build_grouped_wgrad(..., splits=S)``'s partial sums:
    ``W[g] = P[g] + P[G + g] + ... + P[(S - 1) * G + g]`` added in that order, in f32, then
    rounded to ``out_dtype``. Tensor arguments: P ``(S * G, KX, NY)`` f32; output W
    ``(G, KX, NY)``. One thread per 8 consecutive elements (``NY % 8 == 0``)."""
    what = "build_split_reduce"
    ot = _out_type(out_dtype)
    if KX % 8 or NY % 8:
        raise _error(f"{what}: KX and NY must be multiples of 8, got KX={KX}, NY={NY}")
    if isinstance(splits, bool) or not isinstance(splits, int) or not 1 <= splits <= MAX_SPLITS:
        raise _error(f"{what}: splits must be an int in 1..{MAX_SPLITS}, got {splits!r}")
    n = G * KX * NY
    if n // 8 >= 2**31:
        raise _error(f"{what}: {n} elements are too many for 32-bit thread indices")
    block = 256
    blocks = max(1, -(-n // (block * 8)))

    def reduce(P, W):
        pp, pw = ptx.global_ptrs(P, W)
        i = reg.from_(ptx.special.ctaid.x(), u32) * block + reg.from_(ptx.special.tid.x(), u32)
        with ptx.if_(i < n // 8):
            src = reg.from_(i, u64) * 32 + pp
            acc = reg.array(f32, 8)
            ptx.inst.ld.global_.nc.v4.f32(list(acc)[:4], ptx.addr(src))
            ptx.inst.ld.global_.nc.v4.f32(list(acc)[4:], ptx.addr(src, 16))
            for sp in range(1, splits):
                part = reg.array(f32, 8)
                at = src + sp * n * 4
                ptx.inst.ld.global_.nc.v4.f32(list(part)[:4], ptx.addr(at))
                ptx.inst.ld.global_.nc.v4.f32(list(part)[4:], ptx.addr(at, 16))
                for e in range(8):
                    ptx.inst.add.rn.f32(acc[e], acc[e], part[e])
            if ot is f32:
                dst = reg.from_(i, u64) * 32 + pw
                ptx.inst.st.global_.v4.f32(ptx.addr(dst), list(acc)[:4])
                ptx.inst.st.global_.v4.f32(ptx.addr(dst, 16), list(acc)[4:])
            else:
                dst = reg.from_(i, u64) * 16 + pw
                packed = reg.array(b32, 4)
                for m in range(4):
                    ptx.inst("cvt.rn.bf16x2.f32")(packed[m], acc[2 * m + 1], acc[2 * m])
                ptx.inst.st.global_.v4.b32(ptx.addr(dst), list(packed))
        ptx.ret()

    return kernel(in_specs=(Tile(splits * G, KX, NY, f32),), out_specs=(Tile(G, KX, NY, ot),),
                  grid=(blocks, 1, 1), block=(block, 1, 1),
                  name=f"grouped_split_reduce_{ot.name}_s{splits}")(reduce)


class SplitWgrad:
    """The split weight gradient as one kernel-like callable ``(X, Y, offs) -> W``: the
    ``splits``-way ``build_grouped_wgrad`` (f32 partials), then ``build_split_reduce``."""

    def __init__(self, wgrad, reduce):
        self.wgrad, self.reduce = wgrad, reduce
        self.in_specs = tuple(wgrad.in_specs)
        self.out_specs = tuple(reduce.out_specs)
        self.name = f"{wgrad.name}_reduced"
        self.arg_names = ("X", "Y", "Offs", "W")
        self.kernels = (wgrad, reduce)

    def __call__(self, x, y, offs):
        """``W`` (the reduced gradient)."""
        return self.reduce(self.wgrad(x, y, offs))

    def __repr__(self):
        return f"<SplitWgrad {self.name}>"


def build_wgrad_split(M: int, KX: int, NY: int, G: int, *, out_dtype="bf16", splits=2, **tile):
    """``build_grouped_wgrad(..., splits=splits)`` followed by its reduction, as one
    ``SplitWgrad`` (``splits=1``: the plain kernel). ``tile``: BM, BN, BK, stages, num_sms."""
    if splits == 1:
        return build_grouped_wgrad(M, KX, NY, G, out_dtype=out_dtype, **tile)
    w = build_grouped_wgrad(M, KX, NY, G, out_dtype="f32", splits=splits, **tile)
    return SplitWgrad(w, build_split_reduce(G, KX, NY, splits, out_dtype=out_dtype))


# ------------------------------------------------------------------------ host side
WGRAD_CONFIGS = [
    Config(BM=128, BN=256),
    Config(BM=128, BN=128),
    Config(BM=64, BN=256),
    Config(BM=64, BN=128),
]
"""The tile configurations the tuner times per shape for the dB kernel; the first is the
default when ``PYPTX_AUTOTUNE=0``."""

GROUPED_CONFIGS = WGRAD_CONFIGS + [Config(BM=128, BN=256, l2_hint="stream_b"),
                                   Config(BM=128, BN=128, cluster=2),
                                   Config(BM=128, BN=256, cluster=2),
                                   Config(BM=64, BN=256, prefetch=True),
                                   Config(BM=64, BN=256, prefetch=True, speculate=5)]
"""The forward and dA kernels' configurations: the dB kernel's, 128x256 tiles loading B
evict-first (64x128x4096x2048 streams each 16 MB ``B[g]`` once: 409 vs 414 us on the H100),
pairs of n-blocks sharing A in a 2-CTA cluster (few n-blocks: N=256 has two of 128), and
64x256 tiles whose thread 0 prefetches the tensor maps and group ends (short kernels), also
with the whole ring filled from the guessed first tile before the group ends are read
(``speculate=5``: 4x2048x256x2048 forward 24.5 vs 25.3 us for the same tiles without it on
the H100, 5 interleaved rounds)."""

grouped_tuned = autotune(GROUPED_CONFIGS, key=["M", "N", "K", "G", "b_major", "out_dtype"])(
    build_grouped)
"""``build_grouped`` with its tile configuration chosen on the device at the first launch."""

wgrad_tuned = autotune(WGRAD_CONFIGS, key=["M", "KX", "NY", "G", "out_dtype"])(
    build_grouped_wgrad)
"""``build_grouped_wgrad`` tuned the same way."""


def _to_bf16(x):
    if "bfloat16" in str(x.dtype):
        return x
    if type(x).__module__.startswith("torch"):
        import torch

        return x.to(torch.bfloat16)
    import jax.numpy as jnp

    return x.astype(jnp.bfloat16)


class GroupedBackward:
    """The backward of the grouped GEMM as one kernel-like callable for
    ``pyptx.differentiable_kernel``: ``(A, B, offs, dD) -> (dA, dB)``, two launches
    (the grouped kernel with B in the other major order, then the weight gradient)."""

    def __init__(self, forward, dgrad, wgrad, b_major):
        self.dgrad, self.wgrad, self.b_major = dgrad, wgrad, b_major
        self.in_specs = tuple(forward.in_specs) + tuple(forward.out_specs)
        self.out_specs = (forward.in_specs[0], forward.in_specs[1])
        self.name = f"{forward.name}_backward"
        self.arg_names = ("A", "B", "Offs", "dD", "dA", "dB")
        self.kernels = (dgrad, wgrad)

    def __call__(self, a, b, offs, dd):
        """``(dA, dB)`` (dB in B's own layout)."""
        dd = _to_bf16(dd)
        da = self.dgrad(dd, b, offs)
        db = self.wgrad(a, dd, offs) if self.b_major == "MN" else self.wgrad(dd, a, offs)
        return da, db

    def __repr__(self):
        return f"<GroupedBackward {self.name}>"


def _build(tuned, plain, config, *args, **kw):
    return tuned(*args, **kw) if config is None else plain(*args, **kw, **dict(config))


@functools.lru_cache(maxsize=128)
def grouped_op(M, N, K, G, b_major="MN", out_dtype="bf16", config=None, wgrad_config=None):
    """The differentiable grouped GEMM for one shape: a ``DifferentiableKernel`` taking
    ``(A (M, K), B (G, K, N) or (G, N, K), offs (G,))``. ``config``: a tuple of
    ``(name, value)`` build keywords (``None``: tuned). ``wgrad_config``: the same for the
    weight-gradient kernel alone (``build_wgrad_split`` keywords, e.g. ``splits``),
    overriding ``config`` there."""
    fwd = _build(grouped_tuned, build_grouped, config, M, N, K, G, b_major=b_major,
                 out_dtype=out_dtype)
    flip = "K" if b_major == "MN" else "MN"
    cfg_b = None if config is None else tuple((k, v) for k, v in config if k != "store")
    dgrad = _build(grouped_tuned, build_grouped, cfg_b, M, K, N, G, b_major=flip,
                   out_dtype="bf16")
    kx, ny = (K, N) if b_major == "MN" else (N, K)
    if wgrad_config is not None:
        wgrad = build_wgrad_split(M, kx, ny, G, out_dtype="bf16",
                                  **{"splits": 1, **dict(wgrad_config)})
    else:
        cfg_w = None if cfg_b is None else tuple((k, v) for k, v in cfg_b
                                                 if k not in FORWARD_ONLY)
        wgrad = _build(wgrad_tuned, build_grouped_wgrad, cfg_w, M, kx, ny, G, out_dtype="bf16")
    return differentiable_kernel(fwd, GroupedBackward(fwd, dgrad, wgrad, b_major),
                                 num_grad_inputs=2)


def _pad_last(x, mult, lib, dim=-1):
    n = x.shape[dim]
    extra = -n % mult
    if not extra:
        return x
    if lib == "torch":
        import torch.nn.functional as F

        d = dim % x.ndim
        return F.pad(x, [0, 0] * (x.ndim - 1 - d) + [0, extra])
    import jax.numpy as jnp

    widths = [(0, 0)] * x.ndim
    widths[dim] = (0, extra)
    return jnp.pad(x, widths)


_CALLS: dict = {}
"""Torch call signatures ``grouped_mm`` has checked (no padding, tuned config) -> whether
``b`` is read through its transpose, and the ``grouped_op`` arguments."""
_CALLS_SIZE = 256


def _call_key(a, b, offs, out_dtype, trans_b):
    """The signature of a torch call that decides all of ``grouped_mm``'s checks and
    arguments (types, shapes, dtypes, ``b``'s strides); None while torch.compile traces
    (the traced path keeps the checks) or where a dim is symbolic."""
    if sys.modules["torch"].compiler.is_compiling():
        return None
    try:
        key = (a.__class__, a.shape, a.dtype, b.__class__, b.shape, b.stride(), b.dtype,
               offs.__class__, offs.shape, offs.dtype, out_dtype, trans_b)
        hash(key)
    except (TypeError, RuntimeError):  # symbolic dims; a layout without strides
        return None
    return key


def grouped_mm(a, b, offs, *, out_dtype=None, trans_b=False, config=None):
    """``out[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g]`` for torch tensors or JAX arrays.

    ``a``: ``(M, K)`` bf16; ``b``: ``(G, K, N)`` bf16 (torch: a transposed view of a
    ``(G, N, K)`` tensor is read K-major without a copy; JAX: ``trans_b=True`` means ``b``
    is given as ``(G, N, K)``); ``offs``: ``(G,)`` int32 on the device. ``out_dtype``:
    ``"bf16"`` (default) or ``"f32"``. Differentiable in ``a`` and ``b`` (torch autograd,
    ``jax.grad``). ``config``: a dict of ``build_grouped`` tile keywords (default: tuned);
    its keys starting with ``wgrad_`` configure the weight-gradient kernel alone
    (``build_wgrad_split`` keywords: ``{"wgrad_splits": 2, "wgrad_BM": 128}``, opt-in and
    untuned). Rows past ``offs[-1]`` are not written. K or N not a multiple of 8 is
    zero-padded.
    """
    lib = "torch" if type(a).__module__.startswith("torch") else "jax"
    key = _call_key(a, b, offs, out_dtype, trans_b) if lib == "torch" and config is None else None
    if key is not None:
        hit = _CALLS.get(key)
        if hit is not None:  # a signature checked before: skip the checks and the padding
            flip, op_args = hit
            if flip:
                b = b.transpose(-2, -1)
            return grouped_op(*op_args)(a.contiguous(), b.contiguous(), offs)
    flip = False
    if len(a.shape) != 2 or len(b.shape) != 3 or len(offs.shape) != 1:
        raise _error(f"grouped_mm expects a (M, K), b (G, K, N) and offs (G,), got "
                          f"{tuple(a.shape)}, {tuple(b.shape)} and {tuple(offs.shape)}")
    if lib == "torch":
        bt = b.transpose(-2, -1)
        if not b.is_contiguous() and bt.is_contiguous():
            b, trans_b, flip = bt, True, True
        a, b = a.contiguous(), b.contiguous()
    M, K = a.shape
    G = b.shape[0]
    Kb, N = (b.shape[2], b.shape[1]) if trans_b else (b.shape[1], b.shape[2])
    if Kb != K or offs.shape[0] != G:
        raise _error(f"grouped_mm: a is {M}x{K}, b holds {G} groups of {Kb}x{N} and offs "
                          f"has {offs.shape[0]} entries")
    for x, what in ((a, "a"), (b, "b")):
        if "bfloat16" not in str(x.dtype):
            raise _error(f"grouped_mm: {what} must be bfloat16, got {x.dtype}")
    if "int32" not in str(offs.dtype):
        raise _error(f"grouped_mm: offs must be int32, got {offs.dtype}")
    out = out_dtype or "bf16"
    a = _pad_last(a, 8, lib)
    b = _pad_last(_pad_last(b, 8, lib), 8, lib, dim=1)  # both of b's matrix dims
    Kp, Np = a.shape[1], (b.shape[1] if trans_b else b.shape[2])
    cfg = dict(config or {})
    wcfg = {k[len("wgrad_"):]: cfg.pop(k) for k in list(cfg) if k.startswith("wgrad_")}
    op_args = (M, Np, Kp, G, "K" if trans_b else "MN", out,
               tuple(sorted(cfg.items())) if cfg else None,
               tuple(sorted(wcfg.items())) if wcfg else None)
    op = grouped_op(*op_args)
    if key is not None and Np == N and Kp == K:
        if len(_CALLS) >= _CALLS_SIZE:
            _CALLS.clear()
        _CALLS[key] = (flip, op_args)
    d = op(a, b, offs)
    return d[:, :N] if Np != N else d


def reference(a, b, offs):
    """float64 reference (torch tensors): ``b`` as ``(G, K, N)``; rows past ``offs[-1]`` zero."""
    import torch

    out = torch.zeros(a.shape[0], b.shape[-1], dtype=torch.float64, device=a.device)
    ends = offs.tolist()
    s = 0
    for g, e in enumerate(ends):
        if e > s:
            out[s:e] = a[s:e].double() @ b[g].double()
        s = max(s, e)
    return out


def random_offsets(sizes, device="cuda"):
    """int32 cumulative row ends of ``sizes`` (a list of group sizes)."""
    import itertools

    import torch

    return torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32, device=device)


def main(argv=None) -> int:
    import torch

    torch.manual_seed(0)
    cfg = None
    if os.environ.get("GROUPED_CONFIG"):  # e.g. "BM=64,BN=128,store=masked" to bisect
        cfg = {k: (v if not v.isdigit() else int(v)) for k, v in
               (kv.split("=") for kv in os.environ["GROUPED_CONFIG"].split(","))}
    fails = 0

    def check(name, got, ref, tol):
        nonlocal fails
        bad = torch.isnan(got).any().item()
        err = ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        ok = not bad and err < tol
        fails += not ok
        print(f"{name}: rel err {err:.2e}{' (NaN: unwritten)' if bad else ''} "
              f"{'PASS' if ok else 'FAIL'}", flush=True)

    cases = [([0, 37, 130], 72, 100), ([128, 128], 256, 128), ([5, 0, 300, 1, 200], 264, 200),
             ([1000, 24, 0, 512], 512, 384)]
    for sizes, N, K in cases:
        M = sum(sizes)
        offs = random_offsets(sizes)
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        for tb in (False, True):
            b = torch.randn(len(sizes), N, K, device="cuda", dtype=torch.bfloat16).transpose(-2, -1) \
                if tb else torch.randn(len(sizes), K, N, device="cuda", dtype=torch.bfloat16)
            ref = reference(a, b, offs)
            tag = f"sizes={sizes} N={N} K={K}{' b.T' if tb else ''}"
            check(f"fwd bf16 {tag}", grouped_mm(a, b, offs, config=cfg), ref, 6e-3)
            check(f"fwd f32  {tag}", grouped_mm(a, b, offs, out_dtype="f32", config=cfg), ref, 1e-4)
            aa = a.clone().requires_grad_(True)
            bb = b.detach().clone().requires_grad_(True)
            if tb:
                bb = b.transpose(-2, -1).contiguous().requires_grad_(True)
            bview = bb.transpose(-2, -1) if tb else bb
            y = grouped_mm(aa, bview, offs, config=cfg)
            dy = torch.randn_like(y)
            (y.float() * dy.float()).sum().backward()
            a64 = a.double().requires_grad_(True)
            b64 = bview.detach().double().requires_grad_(True)
            (reference(a64, b64, offs) * dy.double()).sum().backward()
            check(f"dA {tag}", aa.grad, a64.grad, 6e-3)
            gb = b64.grad.transpose(-2, -1) if tb else b64.grad
            check(f"dB {tag}", bb.grad, gb, 6e-3)
    torch.cuda.synchronize()
    print("all PASS" if not fails else f"{fails} FAIL")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
