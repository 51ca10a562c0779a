"""Programmatic dependent launch (PDL) pieces of the row kernels: the prologue block and
the L2 prefetch of a CTA's slice of its inputs, issued before ``griddepcontrol.wait`` so the
loads overlap the previous grid's last wave."""

from __future__ import annotations

import contextlib
from typing import Any

from .. import ptx, reg
from ..types import u32, u64

__all__ = ["cta_slice", "prefetch_cta_slice", "entry"]


def cta_slice(span: int, total: int) -> tuple[Any, Any]:
    """(start, nbytes) of this CTA's bytes ``[cta*span, (cta+1)*span)`` of an array of ``total``
    bytes: ``start`` a u64 register, ``nbytes`` the int ``span`` or, where the last CTA's
    slice is shorter (what is left of ``total``), a u32 register."""
    cta = ptx.special.ctaid.x()
    start = reg.scalar(u64)
    ptx.inst.mul.wide.u32(start, cta, span)
    nbytes: Any = span
    if total % span:
        last = -(-total // span) - 1
        nbytes = reg.scalar(u32)
        ptx.inst.selp.u32(nbytes, total - last * span, span, cta == last)
    return start, nbytes


def prefetch_cta_slice(ptrs: Any, span: int, total: int, tid: Any,
                       where: tuple[Any, Any] | None = None) -> None:
    """PDL prologue: thread 0 asks for this CTA's slice (``cta_slice``, or ``where`` if the
    caller has it) of each array at ``ptrs`` in L2, one ``cp.async.bulk.prefetch`` each.
    Nothing when the sizes are not multiples of 16 bytes (the bulk copy's granule); a
    kernel built with ``Hints(pdl_prefetch=False)`` does not call it."""
    if span % 16 or total % 16:
        return
    start, nbytes = where or cta_slice(span, total)
    lead = tid == 0
    for ptr in ptrs:
        ptx.bulk_prefetch_l2(ptr + start, nbytes, pred=lead)


def entry(pdl: bool) -> Any:
    """The block a row kernel opens first: ``ptx.pdl_prologue()`` for a ``pdl=True`` kernel
    (address setup and the L2 prefetches overlap the previous grid), else nothing."""
    return ptx.pdl_prologue() if pdl else contextlib.nullcontext()
