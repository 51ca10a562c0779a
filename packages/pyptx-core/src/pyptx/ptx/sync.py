"""Barriers and fences."""

from __future__ import annotations

from ..errors import OperandError
from ..reg import Reg, render
from ..source import where
from ..trace import current


def _check_barrier(barrier: int | Reg, threads: int | Reg | None) -> None:
    if isinstance(barrier, int) and not isinstance(barrier, bool):
        if not 0 <= barrier <= 15:
            raise OperandError(f"{where(3)}: barrier id must be 0..15, got {barrier}")
    elif not isinstance(barrier, Reg):
        raise OperandError(f"{where(3)}: barrier id must be an int or register, got {barrier!r}")
    if isinstance(threads, int) and not isinstance(threads, bool):
        if threads <= 0 or threads % 32:
            raise OperandError(
                f"{where(3)}: barrier thread count must be a positive multiple of 32, got {threads}"
            )
    elif threads is not None and not isinstance(threads, Reg):
        raise OperandError(f"{where(3)}: barrier thread count must be an int or register, got {threads!r}")


def bar_sync(barrier: int | Reg = 0, threads: int | Reg | None = None) -> None:
    """``bar.sync barrier[, threads];``: wait until the CTA (or ``threads`` threads) arrive."""
    trace = current()
    _check_barrier(barrier, threads)
    ops = [render(barrier, None, trace)]
    if threads is not None:
        ops.append(render(threads, None, trace))
    trace.inst("bar.sync", tuple(ops))


def bar_arrive(barrier: int | Reg, threads: int | Reg) -> None:
    """``bar.arrive barrier, threads;``: signal arrival without waiting."""
    trace = current()
    _check_barrier(barrier, threads)
    trace.inst("bar.arrive", (render(barrier, None, trace), render(threads, None, trace)))


_FENCE_SCOPES = ("cta", "cluster", "gpu", "sys")


def fence(scope: str = "cta", *, sem: str = "sc") -> None:
    """``fence.{sc,acq_rel}.{cta,cluster,gpu,sys};`` memory ordering fence."""
    if scope not in _FENCE_SCOPES or sem not in ("sc", "acq_rel"):
        raise OperandError(
            f"{where()}: fence expects sem in ('sc', 'acq_rel') and scope in {_FENCE_SCOPES}, "
            f"got sem={sem!r} scope={scope!r}"
        )
    current().inst(f"fence.{sem}.{scope}", ())
