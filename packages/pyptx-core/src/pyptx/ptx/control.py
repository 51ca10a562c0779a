"""Control flow: labels, branches, a structured loop, a guarded block, ``ret``/``exit``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import OperandError, TraceError
from ..reg import NotPred, Reg, render
from ..source import where
from ..trace import Trace, current
from ..types import PtxType, u32
from .inst import _pred_text


class Label:
    """A branch target; ``ptx.place(lbl)`` puts it in the instruction stream."""

    __slots__ = ("name", "trace", "placed")

    def __init__(self, name: str, trace: Trace) -> None:
        self.name = name
        self.trace = trace
        self.placed = False

    def __ptx_operand__(self, trace: Trace) -> str:
        if trace is not self.trace:
            raise TraceError(f"{where(4)}: label {self.name} belongs to another kernel")
        return self.name

    def __repr__(self) -> str:
        return f"Label({self.name})"


def label(name: str = "L") -> Label:
    """A new label with a unique name built from ``name``; place it with ``ptx.place``."""
    trace = current()
    if not isinstance(name, str) or not name.replace("$", "_").isidentifier():
        raise OperandError(f"{where()}: label name must be an identifier, got {name!r}")
    return Label(trace.unique("$" + name), trace)


def place(lbl: Label) -> None:
    """Emit ``lbl:`` here."""
    trace = current()
    if type(lbl) is not Label or lbl.trace is not trace:
        raise OperandError(f"{where()}: ptx.place expects a label of this kernel, got {lbl!r}")
    if lbl.placed:
        raise TraceError(f"{where()}: label {lbl.name} is already placed")
    lbl.placed = True
    trace.label(lbl.name)


def bra(target: Label, *, pred: Any = None, uni: bool = False) -> None:
    """Branch to ``target``; with ``pred=p`` (or ``~p``) only where ``p`` holds."""
    trace = current()
    if type(target) is not Label:
        raise OperandError(f"{where()}: ptx.bra expects a Label from ptx.label(), got {target!r}")
    p = _pred_text(pred) if pred is not None else None
    trace.inst("bra.uni" if uni else "bra", (render(target, None, trace),), p)


def ret() -> None:
    """``ret;``: return from the kernel."""
    current().inst("ret", ())


def exit() -> None:  # noqa: A001 - the PTX name
    """``exit;``: terminate the thread."""
    current().inst("exit", ())


@contextmanager
def if_(p: Reg | NotPred) -> Iterator[None]:
    """Run the block's instructions only where predicate ``p`` holds (a branch around them)."""
    trace = current()
    if type(p) is NotPred:
        skip = p.reg
        negate = False
    elif type(p) is Reg and p.type.is_pred:
        skip, negate = p, True
    else:
        raise OperandError(f"{where(3)}: ptx.if_ expects a predicate register, got {p!r}")
    end = Label(trace.unique("$L_endif"), trace)
    trace.inst("bra", (end.name,), ("!" if negate else "") + render(skip, None, trace))
    yield
    end.placed = True
    trace.label(end.name)


def loop(start: int | Reg, stop: int | Reg | None = None, step: int = 1, *,
         type: PtxType = u32, unroll: bool = True) -> Iterator[Reg]:
    """A device loop ``for (i = start; i < stop; i += step)``: ``for i in ptx.loop(n): ...``.

    The body is traced once; ``i`` is a register. ``unroll=False`` adds
    ``.pragma "nounroll"``. ``step`` must be a positive Python int.
    """
    trace = current()
    if stop is None:
        start, stop = 0, start
    if isinstance(step, bool) or not isinstance(step, int) or step <= 0:
        raise OperandError(f"{where()}: ptx.loop step must be a positive int, got {step!r}")
    for name, v in (("start", start), ("stop", stop)):
        if isinstance(v, Reg):
            if not v.type.is_int:
                raise OperandError(f"{where()}: ptx.loop {name} must be an integer, got .{v.type.name}")
        elif isinstance(v, bool) or not isinstance(v, int):
            raise OperandError(f"{where()}: ptx.loop {name} must be an int or register, got {v!r}")
    return _loop(trace, start, stop, step, type, unroll)


def _loop(trace: Trace, start: Any, stop: Any, step: int, t: PtxType, unroll: bool) -> Iterator[Reg]:
    from ..reg import from_, scalar
    i = from_(start, t) if isinstance(start, Reg) else scalar(t, init=start)
    if isinstance(stop, Reg) and stop.type is not t and stop.type.bits == t.bits:
        stop = from_(stop, t)  # e.g. an s32 bound of a u32 loop: compare in the loop's type
    top = Label(trace.unique("$L_loop"), trace)
    end = Label(trace.unique("$L_loop_end"), trace)
    done = i >= stop
    trace.inst("bra", (end.name,), done.name)
    trace.label(top.name)
    if not unroll:
        trace.raw('.pragma "nounroll";')
    yield i
    i += step
    again = i < stop
    trace.inst("bra", (top.name,), again.name)
    trace.label(end.name)
