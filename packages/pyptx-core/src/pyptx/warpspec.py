"""The skeleton of a warp-specialised, persistent tensor-core kernel.

The Hopper GEMM-like kernels share one shape: a dynamic shared-memory window rounded up
to 1024 bytes (the 128-byte swizzle's anchor), a barrier prologue (``Pipeline`` init
then a CTA or cluster barrier, the CTA's cluster rank and cluster index), a role split
(warpgroup 0 produces with few registers, the others consume with many) and a
persistent walk of output tiles in grouped order (``gm`` cluster rows per band, so
consecutive tiles reuse operands in L2). These functions emit exactly those pieces::

    base = ring_base()
    tid, wg = thread_ids()
    rank, cid = prologue(pipe, tid, cluster)
    roles = Roles(wg, producer_regs=40)
    with ptx.if_(tid == 0):               # producer warpgroup: one thread
        load_ab_ring(pipe, A, B, a_tile, b_tile, base=base, tile_range=(cid, tiles, clusters),
                     coords=tile_coords, num_kb=num_kb, BK=BK)
    roles.consumers(232)
    mma = RingMma(pipe, acc, a_tile, b_tile, a_desc0, b_desc0, stage_bytes, n=BN,
                  dtype="bf16", leader=leader)
    mma.run(num_kb)                       # per output tile
    ...                                   # epilogue: swizzled_rows, store_slabs
    roles.end()
"""

from __future__ import annotations

from typing import Any

from pyptx import ptx, reg, smem
from pyptx.arch import register_budget  # noqa: F401  (defined there: no tracing code)
from pyptx.errors import ConfigError, OperandError
from pyptx.source import where
from pyptx.types import u32, u64

__all__ = ["ring_base", "thread_ids", "prologue", "Roles", "min_u32", "grouped_tile_origin",
           "load_ab_ring", "RingMma", "SLAB_BYTES", "swizzled_rows", "store_slabs", "drain_stores"]

SLAB_BYTES = 64 * 128
"""Bytes of one epilogue slab: a consumer warpgroup's 64 rows of 128 bytes."""


def ring_base(name: str = "ring") -> Any:
    """The kernel's dynamic shared-memory window (named ``name``), its address rounded
    up to a 1024-byte boundary: the anchor of 128-byte swizzled tiles. Reserve 1024
    bytes of slack in the kernel's ``smem`` for the rounding."""
    return (smem.dynamic(align=128, name=name).addr() + 1023) & 0xFFFFFC00


def thread_ids() -> tuple[Any, Any]:
    """``(tid, wg)``: the thread's index in the CTA (u32) and its warpgroup (``tid >> 7``)."""
    tid = reg.from_(ptx.special.tid.x(), u32)
    return tid, tid >> 7


def prologue(pipe: Any, tid: Any, cluster: int = 1) -> tuple[Any, Any]:
    """Initialise ``pipe``'s barriers (thread 0) and wait for every thread of the CTA, or
    of the cluster when ``cluster > 1`` (a power of two, along x). Returns ``(rank, cid)``: the
    CTA's rank in its cluster (``0`` without one) and the cluster's index along x."""
    pipe.init(pred=tid == 0, cluster=cluster > 1)
    if cluster > 1:
        ptx.cluster_sync()
        rank = ptx.cluster.ctarank()
        cid = reg.from_(ptx.special.ctaid.x(), u32) >> (cluster.bit_length() - 1)
    else:
        ptx.bar_sync(0)
        rank = 0
        cid = reg.from_(ptx.special.ctaid.x(), u32)
    return rank, cid


class Roles:
    """The producer/consumer split of the warpgroups: constructing it branches warpgroups
    other than ``wg == 0`` to the consumer code and lowers the producer's register limit
    to ``producer_regs`` (``setmaxnreg.dec``); the code traced next is the producer's."""

    def __init__(self, wg: Any, producer_regs: int):
        self.consumer = ptx.label("consumer")
        self.done = ptx.label("done")
        ptx.bra(self.consumer, pred=wg != 0)
        ptx.setmaxnreg(producer_regs, inc=False)

    def consumers(self, regs: int) -> None:
        """End the producer's code (it jumps to ``end``) and open the consumers', raising
        their register limit to ``regs`` (``setmaxnreg.inc``)."""
        ptx.bra(self.done)
        ptx.place(self.consumer)
        ptx.setmaxnreg(regs, inc=True)

    def end(self) -> None:
        """Where both roles meet again (the kernel's common exit)."""
        ptx.place(self.done)


def min_u32(r: Any, v: Any) -> Any:
    """``min.u32 d, r, v`` into a new u32 register (``v`` a register or an int)."""
    from pyptx.reg import Reg
    from pyptx.trace import current

    trace = current()
    d = Reg(trace.new_reg_name(u32), u32, trace)
    trace.inst("min.u32", (d.name, r.name, str(v)))
    return d


def grouped_tile_origin(t: Any, rank: Any, *, num_mc: int, num_n: int, gm: int, cluster: int,
                        BM: int, BN: int) -> tuple[Any, Any]:
    """``(m0, n0)`` of cluster tile ``t`` for cluster CTA ``rank``: ``num_mc`` cluster rows
    (``cluster`` CTAs of ``BM`` rows each) by ``num_n`` columns of ``BN``, walked in bands
    of ``gm`` cluster rows, column by column within a band. ``t`` a Python int (a CPU
    model) or a u32 register (in a kernel)."""
    band = t // (gm * num_n)
    first = band * gm
    if isinstance(t, int):
        rows = min(num_mc - first, gm)
    else:
        rows = min_u32(reg.scalar(u32, init=num_mc) - first, gm)
    within = t - band * (gm * num_n)
    mc = first + within % rows
    nb = within // rows
    m0 = (mc * cluster + rank) * BM if cluster > 1 else mc * BM
    return m0, nb * BN


def swizzled_rows(cbuf: Any, row0: Any, lane: Any, elem_bytes: int) -> dict[int, Any]:
    """Shared addresses of this thread's column pairs in a 128-byte swizzled epilogue slab
    at ``cbuf``: ``{q: address}`` for each 16-byte chunk ``q`` (0..7) of an unswizzled row,
    for row ``row0`` of the accumulator fragment (``Accumulator.thread_origin``); add
    ``dr * 128`` (and the buffer's offset) for its other rows. Row ``r``'s chunk is XOR-ed
    with ``r % 8``, which is ``lane // 4`` for every register of the fragment."""
    colb = (lane & 3) * (2 * elem_bytes)
    xr = lane >> 2
    rowbase = cbuf + row0 * 128 + (colb & 15)
    chunk_hi = colb >> 4
    return {q: ((chunk_hi + q) ^ xr) * 16 + rowbase for q in range(128 // 16)}


def store_slabs(slabs: int, *, leader: Any, bar_id: Any, cbuf: Any, tmap: Any,
                write: Any, coords: Any, bufs: int = 2) -> None:
    """A consumer warpgroup's epilogue through ``bufs`` slab buffers at ``cbuf``: for slab
    ``j`` of ``slabs``, wait until the bulk store that last read its buffer is done,
    ``write(j, buf)`` the slab into shared memory at byte offset ``buf`` from ``cbuf``, then
    the leader thread stores it to ``tmap`` at ``coords(j)`` (a bulk tensor copy, which
    clips at the tensor's edges). ``bar_id``: the warpgroup's named barrier (128 threads).
    Every call starts at buffer 0: when ``slabs`` is not a multiple of ``bufs`` the previous
    call's last store may still read buffer 0, so its first slab waits for every store."""
    for j in range(slabs):
        buf = (j % bufs) * SLAB_BYTES
        with ptx.if_(leader):
            ptx.tma.wait_group(bufs - 1 if j or slabs % bufs == 0 else 0, read=True)
        ptx.bar_sync(bar_id, 128)
        write(j, buf)
        ptx.fence_proxy_async("shared::cta")
        ptx.bar_sync(bar_id, 128)
        with ptx.if_(leader):
            ptx.tma.store_tile(tmap, coords(j), cbuf + buf)
            ptx.tma.commit_group()


def drain_stores(leader: Any) -> None:
    """The leader thread waits until every bulk store it issued is complete."""
    with ptx.if_(leader):
        ptx.tma.wait_group(0, read=False)


class RingMma:
    """A consumer warpgroup's side of the operand ring: each k-block waits for a stage,
    issues its wgmma into ``acc`` (``n`` columns, ``dtype`` operands; descriptors
    ``a_desc0``/``b_desc0`` of stage 0, stages ``stage_bytes`` apart) and keeps one group
    in flight: the previous stage is released (by ``leader``) once this one is issued.
    ``acc`` and ``a_desc0`` may also be equal-length sequences: one wgmma per accumulator
    and k-step, each with its own A descriptor (a warpgroup that owns 64-row bands of a
    taller tile). ``wait_scope``: the acquire scope of the stage waits; ``release``:
    ``Pipeline.release`` keywords (``cta_ranks``, ``sem``). Creates the consumer's two
    ring states."""

    def __init__(self, pipe: Any, acc: Any, a_tile: Any, b_tile: Any, a_desc0: Any,
                 b_desc0: Any, stage_bytes: int, *, n: int, dtype: str, leader: Any,
                 wait_scope: str | None = None, **release: Any):
        self.pipe, self.acc, self.a_tile, self.b_tile = pipe, acc, a_tile, b_tile
        self.a_desc0, self.b_desc0, self.stage_bytes = a_desc0, b_desc0, stage_bytes
        many = isinstance(acc, (list, tuple))
        self.bands = list(zip(acc, a_desc0)) if many else [(acc, a_desc0)]
        if many and len(acc) != len(a_desc0):
            raise OperandError(f"{where()}: RingMma takes one A descriptor per accumulator, got "
                               f"{len(a_desc0)} for {len(acc)}")
        self.n, self.dtype, self.leader = n, dtype, leader
        self.wait_scope, self.release_kw = wait_scope, release
        self.cons = pipe.consumer_state()
        self.rel = pipe.consumer_state()

    def block(self, first: bool, before_mma: Any = None) -> None:
        """One k-block (``first``: overwrite the accumulator); ``before_mma()`` runs once
        the stage has landed, before its wgmma (e.g. to zero rows past an edge)."""
        self.pipe.wait(self.cons, scope=self.wait_scope)
        if before_mma is not None:
            before_mma()
        soff = reg.from_(reg.from_(self.cons.stage * (self.stage_bytes >> 4), u32), u64)
        das = [d0 + soff for _, d0 in self.bands]
        db = self.b_desc0 + soff
        a, b = self.a_tile, self.b_tile
        ptx.wgmma.fence()
        for kk in range(a.k_steps):
            for (acc, _), da in zip(self.bands, das):
                ptx.wgmma.mma_async(acc.regs, a.advance(da, kk), b.advance(db, kk), n=self.n,
                                    dtype_ab=self.dtype, scale_d=0 if first and kk == 0 else 1,
                                    trans_a=a.trans, trans_b=b.trans)
        ptx.wgmma.commit_group()
        if not first:
            ptx.wgmma.wait_group(1)
            self._release()
        self.cons.advance()

    def drain(self) -> None:
        """After the last k-block: wait for its wgmma and release its stage."""
        ptx.wgmma.wait_group(0)
        self._release()

    def run(self, num_kb: Any, issued: Any = None) -> None:
        """The k-loop of one output tile: ``num_kb`` (at least 1) k-blocks, then ``drain``;
        ``issued()`` runs between the last k-block's issue and the drain (e.g. a warpgroup
        handing the tensor cores to another while its last products finish)."""
        self.block(True)
        for _kb in ptx.loop(1, num_kb):
            self.block(False)
        if issued is not None:
            issued()
        self.drain()

    def skip(self) -> None:
        """Between tiles: wait for the next stage and hand it back unread (a stage the
        producer filled on a guess that turned out wrong)."""
        self.pipe.wait(self.cons, scope=self.wait_scope)
        self.cons.advance()
        self._release()

    def _release(self) -> None:
        self.pipe.release(self.rel, pred=self.leader, **self.release_kw)
        self.rel.advance()


def load_ab_ring(pipe: Any, A: Any, B: Any, a_tile: Any, b_tile: Any, *, base: Any,
                 tile_range: tuple, coords: Any, num_kb: Any, BK: int, rank: Any = 0,
                 cluster: int = 1, multicast: bool = False, split: str = "rows",
                 wait_scope: str | None = None, shared: str = "B", items: Any = None) -> None:
    """The producer thread of a GEMM ring: for each tile ``t`` of ``ptx.loop(*tile_range)``
    at ``coords(t) = (m0, n0)`` and each of its ``num_kb`` k-blocks of ``BK``, acquire a
    free stage (A's tile, then B's, from ``base``), arm its barrier with the stage's bytes
    and copy ``a_tile``/``b_tile`` from tensors ``A``/``B`` into it. ``items``: a function
    of the loop index giving ``(t, kb0, kb1)``, the tile and its k-blocks ``kb0..kb1-1``
    (a split tail's pieces; default ``(i, 0, num_kb)``). ``multicast``: the
    ``cluster`` CTAs share operand ``shared`` (``"B"``: CTAs along M; ``"A"``: along N),
    each copying a part of it to all, ``split="rows"`` (a slice of every slab) or
    ``"slabs"`` (whole slabs, alternating). ``wait_scope``: the acquire scope of the stage
    waits."""
    if shared not in ("A", "B"):
        raise ConfigError(f"{where()}: load_ab_ring: shared must be 'A' or 'B', got {shared!r}")
    a_bytes = a_tile.nbytes
    stage_bytes = a_bytes + b_tile.nbytes
    st = pipe.producer_state()
    mask = (1 << cluster) - 1
    a_map = ptx.tma.tensormap_ptr(A.tmap)
    b_map = ptx.tma.tensormap_ptr(B.tmap)
    for i in ptx.loop(*tile_range):
        t, kb0, kb1 = (i, 0, num_kb) if items is None else items(i)
        m0, n0 = coords(t)
        for kb in ptx.loop(kb0, kb1):
            k0 = kb * BK
            pipe.acquire(st, scope=wait_scope)
            bar = pipe.arm(st, stage_bytes)
            sbase = st.stage * stage_bytes + base
            for name, tile, tensor, mn0, off, map_ptr in (("A", a_tile, A, m0, 0, a_map),
                                                           ("B", b_tile, B, n0, a_bytes, b_map)):
                dst = sbase + off if off else sbase
                if multicast and name == shared:
                    share = {"part" if split == "rows" else "slabs": (rank, cluster)}
                    tile.load(dst, tensor, mn0, k0, bar, multicast_mask=mask, map_ptr=map_ptr,
                              **share)
                else:
                    tile.load(dst, tensor, mn0, k0, bar, map_ptr=map_ptr)
            st.advance()
