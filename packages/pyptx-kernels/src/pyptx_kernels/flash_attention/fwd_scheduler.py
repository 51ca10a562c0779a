"""The forward's tile scheduler: which query block of which (batch, head) a CTA works on,
in what order, and the grid that covers them.

One CTA per query block (``grid = (query blocks, Hq, B)``), causal blocks longest first; or,
persistent, ``ctas`` CTAs walking the tiles ``ctaid.x, ctaid.x + ctas, ...`` (heads
outermost, longest rows first). Packed batches read each sequence's bounds from
``cu_seqlens`` and leave early past the sequence's end. The sizes (``B``, ``S``, ``Sk``) are
registers loaded from kernel parameters, so one kernel serves every size: only the grid
(``dense_grid``, ``varlen_grid``) is computed per call.
"""

from __future__ import annotations

from pyptx import ptx, reg
from pyptx.types import s32
from pyptx_kernels.flash_attention.fwd_config import (  # noqa: F401  (the grid: in fwd_config)
    dense_grid,
    query_blocks,
    varlen_grid,
)
from pyptx_kernels.flash_attention.masks import block_plan


class TileScheduler:
    """The tiles of one CTA, emitted where it is created (the CTA index register, and the
    tile's coordinates when not persistent). ``tiles()`` yields a dict per tile: ``h``,
    ``b``, ``hk`` (the KV head), ``m0`` (first query row), ``q_start``/``k_start`` (packed
    rows, None dense), ``seqlen_q``/``seqlen_k``, ``blocks`` (``masks.KeyBlocks``).
    ``B``, ``S``, ``Sk``: registers (or ints) of the dense sizes, None packed."""

    def __init__(self, *, B, S, Sk, Hq, Hkv, BN, bm, causal, varlen, ctas, CUQ=None, CUK=None,
                 window=(-1, -1)):
        self.B, self.S, self.Sk, self.Hq, self.BN, self.bm = B, S, Sk, Hq, BN, bm
        self.group = Hq // Hkv
        self.causal, self.varlen, self.ctas, self.window = causal, varlen, ctas, window
        self.CUQ, self.CUK = CUQ, CUK
        self.num_m = None if varlen else query_blocks(S, bm)
        self.cx = reg.from_(ptx.special.ctaid.x(), s32)
        self.one = None if ctas is not None else self.tile()

    def tile(self, t=None):
        """The query block's coordinates and KV plan: of CTA ``ctaid`` (one block per CTA)
        or of tile ``t`` of the persistent order (heads outermost, longest rows first)."""
        num_m, bm, Hq, causal = self.num_m, self.bm, self.Hq, self.causal
        if t is None:
            mi = self.cx
            h = reg.from_(ptx.special.ctaid.y(), s32)
            b = reg.from_(ptx.special.ctaid.z(), s32)
        else:
            bh = t // num_m
            mi = t - bh * num_m
            b = bh // Hq
            h = bh - b * Hq
        mb = (num_m - 1) - mi if causal and not self.varlen else mi   # the longest rows first
        x = dict(h=h, b=b, m0=mb * bm, hk=h // self.group if self.group > 1 else h,
                 q_start=None, k_start=None, seqlen_q=self.S, seqlen_k=self.Sk)
        if self.varlen:
            pq, pk = ptx.global_ptrs(self.CUQ, self.CUK)
            q_start, q_end, k_start, k_end = (reg.scalar(s32) for _ in range(4))
            ptx.inst.ld.global_.nc.s32(q_start, ptx.addr(pq + b * 4))
            ptx.inst.ld.global_.nc.s32(q_end, ptx.addr(pq + b * 4 + 4))
            ptx.inst.ld.global_.nc.s32(k_start, ptx.addr(pk + b * 4))
            ptx.inst.ld.global_.nc.s32(k_end, ptx.addr(pk + b * 4 + 4))
            x.update(q_start=q_start, k_start=k_start, seqlen_q=q_end - q_start,
                     seqlen_k=k_end - k_start)
            ptx.ret(pred=mi * bm >= x["seqlen_q"])  # the whole CTA leaves together
            if causal:  # the grid covers max_seqlen_q: reverse within this sequence's blocks
                nq = (x["seqlen_q"] + (bm - 1)) // bm
                x["m0"] = ((nq - 1) - mi) * bm
        x["blocks"] = block_plan(x["m0"], x["seqlen_q"], x["seqlen_k"], self.BN, causal, bm,
                                 self.window)
        return x

    def tiles(self):
        """The CTA's one tile (a Python loop of one iteration) or the device loop over the
        persistent order (stride: the grid's CTA count, ``%nctaid.x``)."""
        if self.ctas is None:
            yield self.one
            return
        # tiles cx, cx + nctaid, ...: the grid's size is read, not built in (one PTX per plan)
        ctas = reg.from_(ptx.special.nctaid.x(), s32)
        total = self.num_m * self.Hq * self.B
        for i in ptx.loop(0, (total - self.cx + (ctas - 1)) // ctas, type=s32):
            yield self.tile(i * ctas + self.cx)
