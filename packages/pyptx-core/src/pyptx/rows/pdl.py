"""Programmatic dependent launch (PDL) pieces of the row kernels: the prologue block and
the L2 prefetch of a CTA's slice of its inputs, issued before ``griddepcontrol.wait`` so the
loads overlap the previous grid's last wave."""

from __future__ import annotations

import contextlib
from typing import Any

from .. import ptx, reg
from ..types import u32, u64

__all__ = ["cta_slice", "prefetch_cta_slice", "entry"]


def cta_slice(span: int, count: Any, unit: int) -> tuple[Any, Any]:
    """(start, nbytes) of this CTA's bytes ``[cta*span, (cta+1)*span)`` of an array of
    ``count`` units of ``unit`` bytes (``count`` a u32 register: the row count, or the vector
    count, is a kernel parameter), cut at the array's end: ``start`` a u64 register,
    ``nbytes`` the int ``span`` when a CTA holds one unit (the grid has one CTA per unit, so
    every slice is whole), else a u32 register ``min(span, (count - cta*span/unit) * unit)``.
    ``span`` is a multiple of ``unit``; the CTA's slice must start inside the array."""
    cta = ptx.special.ctaid.x()
    start = reg.scalar(u64)
    ptx.inst.mul.wide.u32(start, cta, span)
    if span == unit:
        return start, span
    per = span // unit
    left = reg.scalar(u32)
    ptx.inst.mul.lo.u32(left, cta, per)
    ptx.inst.sub.u32(left, count, left)
    ptx.inst.min.u32(left, left, per)
    nbytes = reg.scalar(u32)
    ptx.inst.mul.lo.u32(nbytes, left, unit)
    return start, nbytes


def prefetch_cta_slice(ptrs: Any, span: int, count: Any, tid: Any, *, unit: int,
                       where: tuple[Any, Any] | None = None) -> None:
    """PDL prologue: thread 0 asks for this CTA's slice (``cta_slice(span, count, unit)``, or
    ``where`` if the caller has it) of each array at ``ptrs`` in L2, one
    ``cp.async.bulk.prefetch`` each. Nothing when the unit or the span is not a multiple of
    16 bytes (the bulk copy's granule); a kernel built with ``Hints(pdl_prefetch=False)``
    does not call it."""
    if span % 16 or unit % 16:
        return
    start, nbytes = where or cta_slice(span, count, unit)
    lead = tid == 0
    for ptr in ptrs:
        ptx.bulk_prefetch_l2(ptr + start, nbytes, pred=lead)


def entry(pdl: bool) -> Any:
    """The block a row kernel opens first: ``ptx.pdl_prologue()`` for a ``pdl=True`` kernel
    (address setup and the L2 prefetches overlap the previous grid), else nothing."""
    return ptx.pdl_prologue() if pdl else contextlib.nullcontext()
