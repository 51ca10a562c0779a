"""The forward's online softmax in registers, and P handed to ``P V`` from registers.

Per thread two rows (``row`` and ``row + 8`` of the warpgroup's 64) carry a running max
``m`` (log2 units, ``scale * log2(e)`` folded in) and sum ``l``. A block's scores become
``P = exp2(S * sl2 - m)``; O is rescaled by ``alpha = exp2(m_old - m_new)``. The lazy rescale
(``rescale_threshold``) keeps a row's max until a block raises it by more than the threshold,
and skips the O rescale when no row of the warp moved (a warp vote). P, packed to bf16/f16
pairs, is the A fragment wgmma reads (``a_fragment``). The logit soft cap (``softcap``, as
FlashAttention-3's) replaces the scaled scores by ``softcap * tanh(scale * S / softcap)``
before the mask and the max: ``cap_scores`` keeps ``tanh(S * cap)`` (``cap = scale /
softcap``) and ``sl2`` is then ``softcap * log2(e)``.
"""

from __future__ import annotations

from pyptx import ptx, reg
from pyptx.types import f32, pred
from pyptx_kernels.flash_attention.masks import NEG_INF, frag_half


def a_fragment(k_step):
    """Accumulator registers (of S, ``m64 x BN``) that make wgmma's A fragment of ``k_step``:
    ``a0..a3`` = (row, cols c..c+1), (row+8, c..c+1), (row, c+8..c+9), (row+8, c+8..c+9)
    of the 16 columns ``16 * k_step``, each pair packed low element first."""
    b = 8 * k_step
    return [(b, b + 1), (b + 2, b + 3), (b + 4, b + 5), (b + 6, b + 7)]


class OnlineSoftmax:
    """The softmax state of a thread's two rows (``m_row``, ``l_row``, ``alpha``) over the
    scores ``s_acc`` (``Accumulator(BN)``), the output ``o_acc`` and P's registers ``p_regs``."""

    def __init__(self, s_acc, o_acc, p_regs, *, BN, D, sl2, rescale_threshold, dt, cap=None):
        self.s_acc, self.o_acc, self.p_regs = s_acc, o_acc, p_regs
        self.BN, self.D, self.sl2, self.dt, self.cap = BN, D, sl2, dt, cap
        self.threshold = rescale_threshold
        self.m_row = [reg.scalar(f32) for _ in range(2)]
        self.l_row = [reg.scalar(f32) for _ in range(2)]
        self.alpha = [reg.scalar(f32) for _ in range(2)]
        self.moved_rows = [None, None]    # per block: did row hh move its max (lazy rescale)

    def reset(self):
        """A new tile: no max, no sum."""
        for hh in range(2):
            ptx.inst.mov.f32(self.m_row[hh], NEG_INF)
            ptx.inst.mov.f32(self.l_row[hh], 0.0)

    def cap_scores(self):
        """With a soft cap: ``S = tanh(S * cap)`` (``tanh.approx``); nothing otherwise."""
        if self.cap is None:
            return
        for i in range(self.BN // 2):
            ptx.inst.mul.f32(self.s_acc[i], self.s_acc[i], self.cap)
            ptx.inst.tanh.approx.f32(self.s_acc[i], self.s_acc[i])

    def update(self):
        """P (in s_acc) = exp2(S * sl2 - m_new); l, m updated; alpha = exp2(m_old - m_new)."""
        s_acc, m_row, l_row, alpha, sl2 = self.s_acc, self.m_row, self.l_row, self.alpha, self.sl2
        for hh in range(2):
            idx = [i for i in range(self.BN // 2) if frag_half(i) == hh]
            vals = [s_acc[i] for i in idx]
            while len(vals) > 1:
                nxt = []
                for a, c in zip(vals[::2], vals[1::2]):
                    d = reg.scalar(f32)
                    ptx.inst.max.f32(d, a, c)
                    nxt.append(d)
                vals = nxt + vals[len(vals) // 2 * 2:]
            mx = vals[0]
            ptx.warp.reduce_max(mx, width=4)
            m_new = reg.scalar(f32)
            ptx.inst.mul.f32(m_new, mx, sl2)          # -inf stays -inf
            ptx.inst.max.f32(m_new, m_new, m_row[hh])
            if self.threshold is not None:  # keep the old max unless raised by more than it
                moved = m_new > m_row[hh] + self.threshold   # false for -inf, -inf
                ptx.inst.selp.f32(m_new, m_new, m_row[hh], moved)
                self.moved_rows[hh] = moved
            m_use = reg.scalar(f32)                   # a row with no key yet: exp2(x - 0)
            ptx.inst.selp.f32(m_use, 0.0, m_new, m_new == NEG_INF)
            ptx.inst.ex2.approx.ftz.f32(alpha[hh], m_row[hh] - m_use)
            neg = reg.scalar(f32)
            ptx.inst.neg.f32(neg, m_use)
            for i in idx:
                ptx.inst.fma.rn.f32(s_acc[i], s_acc[i], sl2, neg)
                ptx.inst.ex2.approx.ftz.f32(s_acc[i], s_acc[i])
            vals = [s_acc[i] for i in idx]
            while len(vals) > 1:
                vals = [a + c for a, c in zip(vals[::2], vals[1::2])] + vals[len(vals) // 2 * 2:]
            ptx.inst.fma.rn.f32(l_row[hh], l_row[hh], alpha[hh], vals[0])
            ptx.inst.mov.f32(m_row[hh], m_new)

    def _rescale_o(self):
        for i in range(self.D // 2):
            ptx.inst.mul.f32(self.o_acc[i], self.o_acc[i], self.alpha[frag_half(i)])

    def rescale_and_pack(self):
        """O *= alpha (skipped when the whole warp kept its max, lazy rescale), and P packed
        into ``p_regs``, the A fragments of ``P V``."""
        if self.threshold is not None:  # alpha is exactly 1 on every row that kept its max
            anyp = reg.scalar(pred)
            ptx.inst.vote.sync.any.pred(anyp, self.moved_rows[0] | self.moved_rows[1],
                                        0xFFFFFFFF)
            with ptx.if_(anyp):
                self._rescale_o()
        else:
            self._rescale_o()
        for kk in range(self.BN // 16):
            for q, (lo, hi) in enumerate(a_fragment(kk)):
                ptx.inst(f"cvt.rn.{self.dt.name}x2.f32")(self.p_regs[4 * kk + q],
                                                         self.s_acc[hi], self.s_acc[lo])
