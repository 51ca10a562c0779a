"""Which keys a query block visits and which of them it masks: the causal diagonal, the
sliding window ``(left, right)`` (query ``i`` sees keys ``i - left .. i + right``, ``-1``
unbounded; FlashAttention's convention, causal caps ``right`` at 0) and the end of the keys,
for dense and packed (per-sequence) batches.

``block_plan`` and ``row_limit`` take Python ints (the CPU model of the plan) or registers
(inside the kernel) and return the same kind: one definition for both. Blocks wholly outside
the window are not visited; only the blocks that straddle an edge or the end of the keys are
masked (``mask_scores``).
"""

from __future__ import annotations

from typing import NamedTuple

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


class KeyBlocks(NamedTuple):
    """The key blocks a query block visits, in order: ``[first, lo)`` masked (the window's
    left edge), ``[lo, hi)`` unmasked, ``[hi, end)`` masked (the causal diagonal, the window's
    right edge, the end of the keys); ``first <= lo <= hi <= end`` (``end <= first``: none)."""

    first: object
    lo: object
    hi: object
    end: object


def right_reach(causal, window):
    """Keys past its own row a query sees: ``None`` (unbounded), else ``>= 0`` (0 causal)."""
    return 0 if causal else (None if window[1] < 0 else window[1])


def block_plan(m0, seqlen_q, seqlen_k, BN, causal, bm=BM, window=(-1, -1)):
    """``KeyBlocks`` of the ``bm``-row query block at row ``m0``: only blocks holding a key
    some row may see are visited (blocks wholly outside the window are skipped), and only the
    blocks straddling an edge are masked."""
    left, right = window[0], right_reach(causal, window)
    if right is None:
        last = seqlen_k                          # keys visited: [0 or the window's start, last)
        full = seqlen_k // BN                    # blocks with no key past the end
    else:                                        # nor past row m0's right edge
        last = _min(seqlen_k, _min(m0 + bm, seqlen_q) + right)
        full = _min(seqlen_k // BN, (m0 + 1 + right) // BN)
    end = (last + (BN - 1)) // BN
    if left < 0:
        return KeyBlocks(0, 0, _min(full, end), end)
    first = _max(m0 - left, 0) // BN             # the block of row m0's first key
    lo = (_max(m0 + bm - 1 - left, 0) + (BN - 1)) // BN   # from here no row's left edge cuts
    lo = _max(first, _min(lo, end))
    return KeyBlocks(first, lo, _max(lo, _min(full, end)), end)


def row_limit(row, seqlen_k, causal, window=(-1, -1)):
    """``(low, lim)`` of query ``row``: its first key (``row - left``; None unbounded) and
    its first masked key past it (``seqlen_k``, or ``min(seqlen_k, row + 1 + right)``)."""
    right = right_reach(causal, window)
    lim = seqlen_k if right is None else _min(seqlen_k, row + 1 + right)
    return (None if window[0] < 0 else row - window[0]), lim


def frag_col(i):
    """Column of accumulator register ``i`` relative to the thread's first column."""
    return Accumulator.coord(i)[1]


def frag_half(i):
    """Which of the thread's two rows (0: row, 1: row + 8) register ``i`` belongs to."""
    return (i // 2) % 2


def mask_scores(s_acc, BN, col0, j, limits):
    """Set to ``-inf`` the scores of key block ``j`` (``s_acc``, ``m64 x BN``) outside each of
    the thread's two rows' ``row_limit`` (``(low, lim)``: keys before ``low``, None for none,
    and at or past ``lim``); ``col0`` is the thread's first column."""
    n0c = j * BN + col0
    for hh in range(2):
        low, lim = limits[hh]
        t = lim - n0c                        # first masked column, relative to col0
        u = None if low is None else low - n0c   # first allowed column
        for i in range(BN // 2):
            if frag_half(i) == hh:
                ptx.inst.selp.f32(s_acc[i], NEG_INF, s_acc[i], t <= frag_col(i))
                if u is not None:
                    ptx.inst.selp.f32(s_acc[i], NEG_INF, s_acc[i], u > frag_col(i))


def query_blocks(k0, seqlen_k, seqlen_q, BQ, causal, bkv=BM, window=(-1, -1)):
    """The attention backward's transposed plan: ``KeyBlocks`` of the ``BQ``-row query blocks
    the ``bkv``-row key block at row ``k0`` reaches (key ``j`` is seen by the queries ``i``
    with ``j - right <= i <= j + left``: ``block_plan`` with the window mirrored), only the
    blocks straddling an edge masked."""
    right = right_reach(causal, window)
    mirrored = (-1 if right is None else right, window[0])
    return block_plan(k0, seqlen_k, seqlen_q, BQ, False, bkv, mirrored)
