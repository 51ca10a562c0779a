"""The device loops of persistent row kernels: ``row_loop``, each CTA walking its rows with
the next row's loads in flight (two register sets, the loop unrolled twice), and
``row_groups``, the plain grid-stride walk of the backward kernels. Both read the grid
(``%nctaid.x``) and the row count (``Rows.nrows``) at run time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .. import ptx, reg
from ..trace import current
from ..types import u32
from .view import Rows

__all__ = ["row_loop", "row_groups"]


def group_stride(io: Rows) -> Any:
    """``P * R`` (u32): the row groups all CTAs of the grid cover in one step."""
    step = reg.scalar(u32)
    ptx.inst.mul.lo.u32(step, ptx.special.nctaid.x(), io.p.rows)
    return step


def row_groups(io: Rows) -> Iterator[Any]:
    """``for it in row_groups(io)``: this CTA's row groups ``it = c*R, c*R + P*R, ...`` below
    ``B``, a device loop traced once (``.pragma "nounroll"``); ``it`` is a u32 register."""
    it = reg.scalar(u32)
    ptx.inst.mul.lo.u32(it, ptx.special.ctaid.x(), io.p.rows)
    step = group_stride(io)
    top, end = ptx.label("groups"), ptx.label("groups_end")
    ptx.bra(end, pred=it >= io.nrows)
    ptx.place(top)
    current().raw('.pragma "nounroll";')
    yield it
    ptx.inst.add.u32(it, it, step)
    ptx.bra(top, pred=it < io.nrows)
    ptx.place(end)


def row_loop(io: Rows, fetch: Any, body: Any) -> None:
    """Device loop of a persistent row kernel, the next row's loads in flight during this one.

    CTA ``c`` walks row groups ``it = c*R, c*R + P*R, ...`` below ``B`` (``P`` = the grid's
    CTAs, ``%nctaid.x``, and ``B`` = ``io.nrows``, both read at run time: one PTX serves every
    grid and row count; ``persistent_ctas`` keeps ``c*R < B``). ``fetch(off, guard, dst)`` issues the
    loads of the thread's row at byte offset ``off`` (``io.offset``) and returns raw
    registers (``Rows.load_raw``; ``guard`` and ``dst`` go to it); ``body(raw, off, ok)``
    computes and stores that row (``ok``: store predicate, None when every row is
    inside ``B``). Two register sets ``A``, ``B`` and the loop unrolled twice, so no set
    is copied::

        A = fetch(c*R)
        top: B = fetch(it + P*R) if it + P*R < B;  body(A)
             if it + P*R >= B: done
             it += 2*P*R;  A = fetch(it) if it < B;  body(B)
             if it < B: goto top

    Each ``body`` call traces its reductions afresh, so the two halves use different
    shared-memory slots: a reduction slot is rewritten only after the next barrier,
    which no warp passes before every warp has read it. Rows past ``B`` inside a group
    (``R > 1``, last group) read row ``B-1`` and store nothing (``Rows.locate``).
    """
    p = io.p
    R = p.rows
    step = group_stride(io)

    def where(it: Any) -> tuple[Any, Any]:
        row, ok = io.locate(it if R == 1 else it + io.g)
        return io.offset(row), ok

    it0 = reg.scalar(u32)
    ptx.inst.mul.lo.u32(it0, ptx.special.ctaid.x(), R)
    a = fetch(where(it0)[0], None, None)
    top, end = ptx.label("rows"), ptx.label("rows_end")
    ptx.place(top)
    current().raw('.pragma "nounroll";')
    it1 = it0 + step
    has1 = it1 < io.nrows
    b = fetch(where(it1)[0], has1, None)
    body(a, *where(it0))
    ptx.bra(end, pred=~has1, uni=True)
    ptx.inst.add.u32(it0, it1, step)
    has0 = it0 < io.nrows
    fetch(where(it0)[0], has0, a)
    body(b, *where(it1))
    ptx.bra(top, pred=has0, uni=True)
    ptx.place(end)
