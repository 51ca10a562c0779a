"""The forward's epilogue: O divided by the row sums, ``lse = ln(sum_j exp(scale q.k_j))``
(``-inf`` for a row without keys), and O stored.

Dense batches stage O through shared memory (128-byte swizzle, conflict free: the Q tile's
place, or its own buffer when persistent) and store it with bulk tensor copies, which clip at
the sequence end. Packed batches store O with predicated ``st.global``: a copy would spill
into the next sequence.
"""

from __future__ import annotations

from pyptx import ptx, reg
from pyptx.types import b32, f32, u32, u64
from pyptx_kernels.flash_attention.fwd_config import LN2
from pyptx_kernels.flash_attention.masks import NEG_INF, frag_half


class Epilogue:
    """The stores of one consumer warpgroup (``ConsumerMainloop`` ``ml``), its addressing
    set up where created."""

    def __init__(self, ml, Out, LSE, *, S, Hq, D, Tq, varlen, persistent):
        self.ml, self.S, self.Hq, self.D, self.Tq = ml, S, Hq, D, Tq
        self.varlen, self.persistent = varlen, persistent
        (self.plse,) = ptx.global_ptrs(LSE)
        if varlen:
            (self.po,) = ptx.global_ptrs(Out)
        else:
            self.omap = ptx.tma.tensormap_ptr(Out.tmap)
            self.obuf = ml.sm.o_base + ml.w * (64 * 128)   # this warpgroup's 64 rows of a slab
            # row r, 16-byte chunk q at chunk q ^ (r % 8) = q ^ (lane / 4)
            rowbase = self.obuf + reg.from_(ml.row0, u32) * 128 + (ml.lane & 3) * 4
            self.sw = {q: (((ml.lane >> 2) ^ q) << 4) + rowbase for q in range(8)}

    def _normalize(self, x, rows):
        """O /= l per row, and lse written (by the first thread of each row)."""
        ml, sm_state = self.ml, self.ml.softmax
        h, b = x["h"], x["b"]
        inv = []
        for hh in range(2):
            ls = reg.from_(sm_state.l_row[hh])
            ptx.warp.reduce_sum(ls, width=4)
            empty = ls <= 0.0
            r = reg.scalar(f32)
            ptx.inst.rcp.approx.ftz.f32(r, ls)
            ptx.inst.selp.f32(r, 0.0, r, empty)
            inv.append(r)
            lg = reg.scalar(f32)
            ptx.inst.lg2.approx.ftz.f32(lg, ls)
            lse = (sm_state.m_row[hh] + lg) * LN2
            ptx.inst.selp.f32(lse, NEG_INF, lse, empty)
            row = rows[hh]
            ok = (row < x["seqlen_q"]) & ((ml.lane & 3) == 0)
            idx = (h * self.Tq + x["q_start"] + row if self.varlen
                   else (b * self.Hq + h) * self.S + row)
            ptx.inst.st.global_.f32(ptx.addr(self.plse + reg.from_(idx, u64) * 4), lse, pred=ok)
        for i in range(self.D // 2):
            ptx.inst.mul.f32(ml.o_acc[i], ml.o_acc[i], inv[frag_half(i)])

    def store(self, x, wrow, rows):
        """Tile ``x``'s lse and O (``wrow``: the warpgroup's first row, ``rows``: the thread's)."""
        self._normalize(x, rows)
        ml, dt, o_acc = self.ml, self.ml.dt, self.ml.o_acc
        if self.varlen:
            for hh in range(2):
                row = rows[hh]
                ok = row < x["seqlen_q"]
                rbase = (reg.from_(x["q_start"] + row, u64) * self.Hq
                         + reg.from_(x["h"], u64)) * (self.D * 2) + self.po
                cb = reg.from_(ml.col0, u64) * 2 + rbase
                for i, dr, dc in o_acc.pairs():
                    if dr // 8 != hh:
                        continue
                    packed = reg.scalar(b32)
                    ptx.inst(f"cvt.rn.{dt.name}x2.f32")(packed, o_acc[i + 1], o_acc[i])
                    ptx.inst.st.global_.b32(ptx.addr(cb, dc * 2), packed, pred=ok)
            return
        # stage O in 128-byte-swizzled slabs: this warpgroup's 64 rows of the Q tile (its
        # Q K^T reads are complete), or of its own buffer when persistent (the previous
        # tile's store must have read it)
        slab_bytes = ml.sm.q_tile.slab_bytes
        if self.persistent:
            ptx.tma.wait_group(0, read=True, pred=ml.leader)
        ptx.bar_sync(ml.bar_id, 128)
        for i, dr, dc in o_acc.pairs():
            packed = reg.scalar(b32)
            ptx.inst(f"cvt.rn.{dt.name}x2.f32")(packed, o_acc[i + 1], o_acc[i])
            off = (dc // 64) * slab_bytes + dr * 128
            ptx.inst.st.shared.b32(ptx.addr(self.sw[(dc % 64) // 8], off), packed)
        ptx.fence_proxy_async("shared::cta")
        ptx.bar_sync(ml.bar_id, 128)
        with ptx.if_(ml.leader):
            for i in range(self.D // 64):
                ptx.tma.store_tile(self.omap, (i * 64, x["h"], wrow, x["b"]),
                                   self.obuf + i * slab_bytes)
            ptx.tma.commit_group()

    def finish(self):
        """After the last tile: the bulk stores have completed."""
        if not self.varlen:
            ptx.tma.wait_group(0, read=False, pred=self.ml.leader)
