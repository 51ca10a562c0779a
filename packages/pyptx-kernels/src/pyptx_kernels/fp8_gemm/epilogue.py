"""The FP8 GEMM's epilogue: the scales applied to the f32 accumulator, bf16/f32 rows into
128-byte-swizzled shared slabs, bulk tensor stores (clipped at the output's edges)."""

from __future__ import annotations

from pyptx import ptx, reg
from pyptx.types import b32, f32
from pyptx.warpspec import store_slabs
from pyptx_kernels.fp8_gemm.config import EPI_BUFS
from pyptx_kernels.fp8_gemm.scales import load_f32, tensor_scale


class Epilogue:
    """A consumer warpgroup's tile stores. Created before the tile loop: per-tensor scales
    are loaded once, there."""

    def __init__(self, acc, *, scale, ot, BN, sw, cbuf, leader, bar_id, tmap, psa, psb, M, N,
                 col0):
        self.acc, self.scale, self.ot = acc, scale, ot
        self.sw, self.cbuf, self.leader, self.bar_id, self.tmap = sw, cbuf, leader, bar_id, tmap
        self.psa, self.psb, self.M, self.N, self.col0 = psa, psb, M, N, col0
        self.out_cols = 128 // ot.bytes
        self.slabs = BN // self.out_cols
        self.s_ab = tensor_scale(psa, psb) if scale == "tensor" else None

    def store(self, m0, n0, w, r0):
        """Store the tile at ``(m0, n0)`` from warpgroup ``w`` (``r0``: this thread's first
        row): scale, convert, write the slabs, bulk-store them."""
        acc, scale, ot, sw, M, N = self.acc, self.scale, self.ot, self.sw, self.M, self.N
        psa, psb, out_cols, e_out = self.psa, self.psb, self.out_cols, self.ot.bytes
        sr = ncol = None
        if scale == "row":
            sr = (load_f32(psa, r0, r0 < M), load_f32(psa, r0 + 8, r0 + 8 < M))
            ncol = n0 + self.col0
        mrow = m0 + w * 64

        def write(j, buf):
            col_scale = {}
            for i, dr, dc in acc.pairs():
                if dc // out_cols != j:
                    continue
                v0, v1 = acc[i], acc[i + 1]
                if scale == "tensor":
                    v0, v1 = v0 * self.s_ab, v1 * self.s_ab
                elif scale == "row":
                    if dc not in col_scale:  # once per column pair, for both rows
                        c0 = ncol + dc
                        col_scale[dc] = (load_f32(psb, c0, c0 < N),
                                         load_f32(psb, c0 + 1, c0 + 1 < N))
                    rs = sr[1] if dr else sr[0]
                    v0 = v0 * rs * col_scale[dc][0]
                    v1 = v1 * rs * col_scale[dc][1]
                q = dc % out_cols * e_out // 16
                off = buf + dr * 128
                if ot is f32:
                    ptx.inst.st.shared.v2.f32(ptx.addr(sw[q], off), [v0, v1])
                else:
                    packed = reg.scalar(b32)
                    ptx.inst("cvt.rn.bf16x2.f32")(packed, v1, v0)
                    ptx.inst.st.shared.b32(ptx.addr(sw[q], off), packed)

        store_slabs(self.slabs, leader=self.leader, bar_id=self.bar_id, cbuf=self.cbuf,
                    tmap=self.tmap, write=write, bufs=EPI_BUFS,
                    coords=lambda j: (n0 + j * out_cols, mrow))
