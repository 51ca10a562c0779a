"""A TMA ring: rows of a persistent kernel streamed into shared memory by the bulk copy
engine (``cp.async.bulk`` + one mbarrier per slot), so ``S`` rows per CTA are in flight
without registers to hold them."""

from __future__ import annotations

from typing import Any

from .. import ptx, reg, smem
from ..errors import ConfigError, SpecError
from ..source import where
from ..trace import current
from ..types import PtxType, b64, u32, u64
from .plan import WARP, RowPlan, _pos_int, persistent_ctas, plan_rows
from .view import Rows

__all__ = ["Ring", "ring_plan", "ring_reg_cap", "MAX_RING_BYTES"]


def ring_plan(B: int, N: int, dtype: PtxType, *, who: str, ctas: Any, stages: Any,
              chunks: int | None = None, threads: int | None = None) -> tuple[RowPlan, int, int]:
    """(plan, CTAs, stages) of a TMA-ring row kernel (``Ring``): one row per CTA step (a
    short row gets a whole warp), ``stages`` (2..8) rows of ``N * bytes`` in shared memory,
    ``N * bytes`` a multiple of 16 (the bulk copy's granule), at most ``MAX_RING_BYTES``
    of ring per CTA."""
    plan = plan_rows(B, N, dtype, who=who, chunks=chunks, threads=threads)
    if plan.rows > 1:
        plan = plan_rows(B, N, dtype, who=who, chunks=chunks, threads=max(plan.threads, WARP),
                         rows=1)
    S = _pos_int(stages, "stages", who)
    if S < 2:  # each reduction slot is rewritten one step later: a later barrier must come first
        raise ConfigError(f"{where()}: {who}: a TMA ring needs stages >= 2, got {S}")
    row_bytes = N * dtype.bytes
    if row_bytes % 16:
        raise SpecError(f"{where()}: {who}: the TMA ring copies whole rows in 16-byte granules; N * "
                        f"{dtype.bytes} bytes must be a multiple of 16, got N={N}")
    if S > 8 or S * row_bytes > MAX_RING_BYTES:
        raise ConfigError(f"{where()}: {who}: stages={S} rows of {row_bytes} bytes make a ring of "
                          f"{S * row_bytes} bytes; at most 8 stages and {MAX_RING_BYTES} bytes fit")
    return plan, persistent_ctas(plan, ctas, who), S


def ring_reg_cap(plan: RowPlan) -> int:
    """Default ``.maxnreg`` of a ring kernel: two CTAs per SM fit (at most 128 registers)."""
    return max(24, min(128, 65536 // (2 * plan.block[0]) // 8 * 8))


#: shared memory a ``Ring`` may take per CTA (of the 227 KiB an sm_90 CTA may have).
MAX_RING_BYTES = 192 * 1024


class Ring:
    """Rows of a persistent kernel streamed into shared memory by the bulk copy engine.

    CTA ``c`` of ``P`` handles rows ``c, c+P, c+2P, ...`` below ``B`` (``P`` is the grid's
    ``%nctaid.x`` and ``B`` the view's ``nrows``, both read at run time); row ``i`` of its walk lands
    in slot ``i mod S`` of a ring of ``S`` row-sized slots in the dynamic shared window
    (``@kernel(smem=S * N * bytes)``), each with an mbarrier. Thread 0 issues one
    ``cp.async.bulk`` per row (``arrive.expect_tx`` of the row's bytes first); every
    thread waits on the slot's barrier, reads its chunks with ``ld.shared`` and computes.
    A slot is refilled with the row ``S`` steps ahead right after the row's first
    all-reduce: its ``bar.sync`` is the point where every thread has read the slot. So
    ``S`` rows per CTA are in flight without registers to hold them.

    ``bulk_store=True`` writes each result row back through its slot as well: every
    thread stores its values into the slot, ``fence.proxy.async`` and a ``bar.sync``
    later thread 0 issues one ``cp.async.bulk`` shared -> global for the row, and the
    slot is refilled one step later, once that copy has read it (``wait_group.read``).

    Make it in the kernel's PDL prologue (barrier setup touches only shared memory),
    ``start`` it after, then ``run``.
    """

    def __init__(self, io: Rows, stages: int, *, bulk_store: bool = False) -> None:
        self.io = io
        self.S = stages
        self.bulk_store = bulk_store
        p = io.p
        self.row_bytes = p.N * p.es
        self.slots = smem.dynamic(name="ring")
        self.bars = smem.alloc(b64, stages, align=8, name="ring_bar")
        self.base = self.slots.addr()
        bars = self.bars.addr()
        with ptx.if_(io.tid == 0):
            for s in range(stages):
                ptx.mbarrier.init(bars + 8 * s, 1)
            ptx.fence_proxy_async()
        ptx.bar_sync(0)
        self._bars = bars
        self.first_row = reg.scalar(u32)
        ptx.inst.mov.u32(self.first_row, ptx.special.ctaid.x())
        self.row = reg.scalar(u32)
        ptx.inst.mov.u32(self.row, self.first_row)
        self.P = ptx.special.nctaid.x()
        #: ``k * P`` for the ``k`` rows ahead the ring reaches (u32 registers, made on first use)
        self._ahead: dict[int, Any] = {}

    def _steps(self, k: int) -> Any:
        """The row ``k`` steps of the walk ahead: ``k * P`` (a register, or 0)."""
        if k == 0:
            return 0
        if k == 1:
            return self.P
        hit = self._ahead.get(k)
        if hit is None:
            hit = self._ahead[k] = reg.scalar(u32)
            ptx.inst.mul.lo.u32(hit, self.P, k)
        return hit

    def prefetch(self, src: Any) -> None:
        """PDL prologue: ask for the first ``S`` rows of this CTA in L2 (thread 0); nothing
        when the view's ``Hints`` turn the prefetch off."""
        if not self.io.hints.pdl_prefetch:
            return
        lead = self.io.tid == 0
        for s in range(self.S):
            r = self.row + self._steps(s) if s else self.row
            off = reg.scalar(u64)
            ptx.inst.mul.wide.u32(off, r, self.row_bytes)
            has = r < self.io.nrows
            ptx.bulk_prefetch_l2(src + off, self.row_bytes, pred=lead & has)

    def _fill(self, s: int, src: Any, row: Any, pred: Any = None, *, drain: bool = False) -> None:
        lead = self.io.tid == 0
        ok = lead & (row < self.io.nrows)
        with ptx.if_(ok if pred is None else ok & pred):
            if drain:  # the slot's bulk store must have read it
                ptx.tma.wait_group(0, read=True)
            bar = self._bars + 8 * s
            ptx.mbarrier.arrive_expect_tx(bar, self.row_bytes)
            off = reg.scalar(u64)
            ptx.inst.mul.wide.u32(off, row, self.row_bytes)
            ptx.tma.copy_bulk(self.base + s * self.row_bytes, src + off, self.row_bytes, bar)

    def start(self, src: Any) -> None:
        """Thread 0 issues the first ``S`` rows (after ``griddepcontrol.wait``)."""
        for s in range(self.S):
            self._fill(s, src, self.row + self._steps(s) if s else self.row)

    def run(self, src: Any, dst: Any, first: Any, then: Any) -> None:
        """The device loop, unrolled ``S`` times (one static slot per copy of the body).

        ``first(raw)`` gets the thread's chunks of the row as stored (``Rows.load_raw``
        from the slot) and must all-reduce once over the row (``Rows.reduce``; for rows
        of at most 32 threads, which have no barrier, the ring adds a ``bar.sync``); it
        returns a state from which ``then(state)`` computes the thread's f32 results,
        which the ring writes to the row of ``dst`` (same shape and dtype as ``src``).
        """
        io, S, P, B = self.io, self.S, self.P, self.io.nrows
        row = self.row
        phase = reg.scalar(u32, init=0)
        col = io.t * (io.p.vec * io.p.es)
        top, end = ptx.label("ring"), ptx.label("ring_end")
        ptx.place(top)
        current().raw('.pragma "nounroll";')
        for s in range(S):
            if s:
                ptx.bra(end, pred=row >= B, uni=True)
            ptx.mbarrier.wait(self._bars + 8 * s, phase)
            slot = self.base + (col + s * self.row_bytes)
            state = first(io.load_raw(slot, space="shared"))
            if io.p.threads <= WARP:
                ptx.bar_sync(0)
            if not self.bulk_store:
                self._fill(s, src, row + self._steps(S))
                io.store(dst + io.offset(row), then(state))
            else:  # refill the slot stored from one step ago; store this row through its slot
                self._fill((s - 1) % S, src, row + self._steps(S - 1), row != self.first_row,
                           drain=True)
                io.store(slot, then(state), space="shared")
                ptx.fence_proxy_async()
                ptx.bar_sync(0)
                with ptx.if_(io.tid == 0):
                    off = reg.scalar(u64)
                    ptx.inst.mul.wide.u32(off, row, self.row_bytes)
                    ptx.tma.store_bulk(dst + off, self.base + s * self.row_bytes, self.row_bytes)
                    ptx.tma.commit_group()
            ptx.inst.add.u32(row, row, P)
        ptx.inst.xor.b32(phase, phase, 1)
        ptx.bra(top, pred=row < B, uni=True)
        ptx.place(end)
        if self.bulk_store:
            with ptx.if_(io.tid == 0):
                ptx.tma.wait_group(0, read=False)
