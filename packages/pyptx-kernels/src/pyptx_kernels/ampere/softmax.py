"""The online softmax of ``mma.sync`` m16n8 accumulators (f32 C/D fragments: lane
``4g + t`` holds rows ``g`` and ``g + 8``, columns ``2t, 2t + 1`` of each n8 tile), shared by
the Ampere attention forward and the decode kernel's tensor-core plan."""

from __future__ import annotations

from pyptx import ptx, reg
from pyptx.types import f32

NEG_INF = float("-inf")


def softmax_rows(vals, m_row, l_row, o_row, hh, sl2):
    """The online softmax of one query row's scores ``vals`` (``(array, index)`` pairs of this
    thread's S fragments; the row spans the four lanes of a quad): the new running max
    ``m_row`` (scaled, base 2), ``vals`` replaced by ``exp2(sl2 * s - m)``, the partial row sum
    ``l_row`` and the row's O fragments (half ``hh`` of each) rescaled by ``exp2(m_old - m)``."""
    regs = [a[e] for a, e in vals]
    mx = reg.scalar(f32)
    ptx.inst.max.f32(mx, regs[0], regs[1])
    for r in regs[2:]:
        ptx.inst.max.f32(mx, mx, r)
    ptx.warp.reduce_max(mx, width=4)
    m_new = reg.scalar(f32)
    ptx.inst.mul.f32(m_new, mx, sl2)
    ptx.inst.max.f32(m_new, m_new, m_row)
    m_use = reg.scalar(f32)                      # a row with no key yet: exp2(x - 0)
    ptx.inst.selp.f32(m_use, 0.0, m_new, m_new == NEG_INF)
    alpha = reg.scalar(f32)
    ptx.inst.sub.f32(alpha, m_row, m_use)
    ptx.inst.ex2.approx.ftz.f32(alpha, alpha)
    neg = reg.scalar(f32)
    ptx.inst.neg.f32(neg, m_use)
    total = None
    for r in regs:
        ptx.inst.fma.rn.f32(r, r, sl2, neg)
        ptx.inst.ex2.approx.ftz.f32(r, r)
        if total is None:
            total = reg.scalar(f32)
            ptx.inst.mov.f32(total, r)
        else:
            ptx.inst.add.f32(total, total, r)
    ptx.inst.fma.rn.f32(l_row, l_row, alpha, total)
    ptx.inst.mov.f32(m_row, m_new)
    for a in o_row:
        ptx.inst.mul.f32(a[2 * hh], a[2 * hh], alpha)
        ptx.inst.mul.f32(a[2 * hh + 1], a[2 * hh + 1], alpha)
