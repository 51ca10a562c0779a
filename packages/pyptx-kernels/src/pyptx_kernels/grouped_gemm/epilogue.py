"""The grouped kernels' epilogue: a consumer warpgroup's accumulator and its stores, bulk
tensor stores through two shared-memory slabs for tiles inside a group, predicated
``st.global`` (rows past the group end and columns past ``N`` skipped) for tiles that cross
one; f32 out, or rounded to bf16 pairs."""

from __future__ import annotations

from pyptx import ptx, reg
from pyptx.fragment import Accumulator
from pyptx.types import b32, f32, u64
from pyptx.warpspec import SLAB_BYTES, store_slabs, swizzled_rows
from pyptx_kernels.grouped_gemm.config import EPI_BUFS, out_type  # noqa: F401  (defined there)


class Consumer:
    """A consumer warpgroup's fixed registers (its index ``w``, leader thread, accumulator of
    64 x ``BN`` and its thread origin, epilogue slab) and its epilogue stores."""
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
