"""Which keys a query block visits and which of them it masks: the causal diagonal and the
end of the keys, for dense and packed (per-sequence) batches.

``block_plan`` and ``row_limit`` take Python ints (the CPU model of the plan) or registers
(inside the kernel) and return the same kind: one definition for both. Only the blocks that
straddle the diagonal or the end of the keys are masked (``mask_scores``).
"""

from __future__ import annotations

from pyptx import ptx, reg
from pyptx.fragment import Accumulator
from pyptx.types import s32
from pyptx_kernels.flash_attention.fwd_config import BM

NEG_INF = float("-inf")


def _min(a, b):
    """``min(a, b)`` of ints, or ``min.s32`` when either is a register."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    if isinstance(a, int):
        a, b = b, a
    d = reg.scalar(s32)
    ptx.inst.min.s32(d, a, b)
    return d


def _max(a, b):
    """``max(a, b)`` of ints, or ``max.s32`` when either is a register."""
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    if isinstance(a, int):
        a, b = b, a
    d = reg.scalar(s32)
    ptx.inst.max.s32(d, a, b)
    return d


def block_plan(m0, seqlen_q, seqlen_k, BN, causal, bm=BM):
    """``(n_blocks, n_unmasked)`` of the ``bm``-row query block at row ``m0``: KV blocks
    ``0..n_blocks`` are visited, the first ``n_unmasked`` need no mask."""
    last = _min(seqlen_k, _min(m0 + bm, seqlen_q)) if causal else seqlen_k  # keys visited
    n_blocks = (last + (BN - 1)) // BN
    full = seqlen_k // BN                       # blocks with no key past the end
    if causal:                                  # and none past the diagonal of row m0
        full = _min(full, (m0 + 1) // BN)
    return n_blocks, _min(full, n_blocks)


def row_limit(row, seqlen_k, causal):
    """First masked key of query ``row``: ``seqlen_k``, or ``min(seqlen_k, row + 1)`` causal."""
    return _min(seqlen_k, row + 1) if causal else seqlen_k


def frag_col(i):
    """Column of accumulator register ``i`` relative to the thread's first column."""
    return Accumulator.coord(i)[1]


def frag_half(i):
    """Which of the thread's two rows (0: row, 1: row + 8) register ``i`` belongs to."""
    return (i // 2) % 2


def mask_scores(s_acc, BN, col0, j, lims):
    """Set to ``-inf`` the scores of key block ``j`` (``s_acc``, ``m64 x BN``) at or past each
    of the thread's two rows' first masked key ``lims`` (``col0``: the thread's first column)."""
    n0c = j * BN + col0
    for hh in range(2):
        t = lims[hh] - n0c                   # first masked column, relative to col0
        for i in range(BN // 2):
            if frag_half(i) == hh:
                ptx.inst.selp.f32(s_acc[i], NEG_INF, s_acc[i], t <= frag_col(i))
