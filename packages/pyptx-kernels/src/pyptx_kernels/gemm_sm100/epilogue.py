"""The Blackwell GEMM's epilogue (untested on hardware): tensor memory -> registers ->
global memory. Warp ``w`` of the CTA's four owns TMEM lanes ``32 w .. 32 w + 31`` (rows of
its 128-row block of D): per 32 columns, one ``tcgen05.ld.32x32b.x32`` gives each thread 32
f32 values of its row, stored as 16-byte vectors (8 bf16 or 4 f32) where the row and the
columns are inside ``D``."""

from __future__ import annotations

from pyptx import ptx, reg
from pyptx.ptx import tcgen05
from pyptx.rows.access import store_vec
from pyptx.types import f32, u32, u64

CHUNK = 32
"""Columns of one ``tcgen05.ld`` (``32x32b.x32``)."""


def store_tile(D, *, d, tid, m0, n0, M, N, BN, ot):
    """Store this CTA's 128 rows x ``BN`` columns of D (rows from ``m0``, columns from ``n0``)
    from the f32 accumulator at TMEM address ``d``, converted to ``ot`` (bf16 or f32)."""
    warp = tid >> 5
    row = m0 + warp * 32 + (tid & 31)
    taddr = d + ((warp * 32) << 16)
    (pd,) = ptx.global_ptrs(D)
    eb = ot.bytes
    prow = pd + reg.from_(row * N + n0, u64) * eb
    cols_left = reg.scalar(u32)
    ptx.inst.sub.u32(cols_left, N, n0)
    inside = row < M
    per = 16 // eb
    for c in range(BN // CHUNK):
        vals = reg.array(f32, CHUNK)
        tcgen05.ld(vals, taddr + c * CHUNK if c else taddr, shape="32x32b", num=CHUNK)
        tcgen05.wait_ld()
        with ptx.if_(inside):
            for g in range(0, CHUNK, per):
                col = c * CHUNK + g
                store_vec(prow, col * eb, ot, list(vals[g:g + per]), pred=cols_left > col)
