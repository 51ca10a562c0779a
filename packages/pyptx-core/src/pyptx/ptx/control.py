"""Control flow: labels, branches, structured loops, guarded blocks, ``ret``/``exit``.

Structured forms and the PTX they emit (``p`` a predicate, ``~p`` its negation):

* ``with ptx.if_(p): A`` then optionally ``with ptx.else_(): B``::

      @!p bra $L_endif;   A   [bra $L_endelse;]   $L_endif:   [B   $L_endelse:]

* ``with ptx.while_(lambda: i < n) as w: body`` (the condition's instructions are
  traced inside the loop, so they run again before every iteration)::

      $L_while:   <cond>   @!c bra $L_while_end;   body   bra $L_while;   $L_while_end:

* ``for i in ptx.loop(start, stop, step)``: a do-while guarded by one test.
* ``for i in ptx.unrolled(start, stop, step, unroll=k)``: the body traced ``k``
  times per device iteration, then a remainder for the tail (shape in its docstring).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import OperandError, TraceError, TypeMismatchError
from ..ir import Label as LabelStmt
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


def ret(*, pred: Any = None) -> None:
    """``[@pred] ret;``: return from the kernel (where ``pred`` holds)."""
    trace = current()
    trace.inst("ret", (), _pred_text(pred) if pred is not None else None)


def exit(*, pred: Any = None) -> None:  # noqa: A001 - the PTX name
    """``[@pred] exit;``: terminate the thread (where ``pred`` holds)."""
    trace = current()
    trace.inst("exit", (), _pred_text(pred) if pred is not None else None)


# The end label of the latest ``if_`` block of each trace: ``else_`` must come right after it.
_IF_ENDS: weakref.WeakKeyDictionary[Trace, LabelStmt] = weakref.WeakKeyDictionary()


@contextmanager
def if_(p: Reg | NotPred) -> Iterator[None]:
    """Run the block's instructions only where predicate ``p`` holds (a branch around them).

    Emits ``@!p bra $L_endif;`` (``@p`` for ``~p``), the block, then ``$L_endif:``. A
    ``with ptx.else_():`` block may follow directly.
    """
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
    _IF_ENDS[trace] = trace.body[-1]


@contextmanager
def else_() -> Iterator[None]:
    """The alternative of the ``with ptx.if_(p):`` block just before it: runs where ``p`` fails.

    Turns ``@!p bra $L_endif; A $L_endif:`` into
    ``@!p bra $L_endif; A bra $L_endelse; $L_endif: B $L_endelse:``. Anything traced
    between the ``if_`` block and this one (or a second ``else_``) is a ``TraceError``.
    """
    trace = current()
    body = trace.body
    end_if = _IF_ENDS.pop(trace, None)
    if end_if is None or not body or body[-1] is not end_if:
        raise TraceError(f"{where(3)}: ptx.else_() must directly follow a `with ptx.if_(p):` "
                         "block (nothing may be traced between them)")
    end = trace.unique("$L_endelse")
    trace.inst("bra", (end,))
    jump = body.pop()
    body.insert(len(body) - 1, jump)  # the jump over the else block ends the if block
    yield
    trace.label(end)


def _condition(cond: Any, fn: str) -> Any:
    """``cond()`` (or ``cond`` itself) as a predicate register or ``~p``."""
    c = cond() if callable(cond) and type(cond) not in (Reg, NotPred) else cond
    if type(c) is NotPred or (type(c) is Reg and c.type.is_pred):
        return c
    if type(c) is Reg:
        raise TypeMismatchError(f"{where(4)}: {fn} condition must be a predicate (e.g. i < n), "
                                f"got .{c.type.name} register {c.name}")
    raise OperandError(f"{where(4)}: {fn} condition must be a predicate register, ~p, or a "
                       f"function returning one (lambda: i < n), got {c!r}")


class WhileLoop:
    """The handle of a ``with ptx.while_(...) as w:`` block: ``w.break_()``, ``w.continue_()``."""

    __slots__ = ("top", "end", "trace")

    def __init__(self, top: str, end: str, trace: Trace) -> None:
        self.top = top
        self.end = end
        self.trace = trace

    def _jump(self, target: str, pred: Any, fn: str) -> None:
        trace = current()
        if trace is not self.trace:
            raise TraceError(f"{where(3)}: {fn} belongs to a loop of another kernel")
        p = _pred_text(pred) if pred is not None else None
        trace.inst("bra", (target,), p)

    def break_(self, *, pred: Any = None) -> None:
        """``[@pred] bra $L_while_end;``: leave the loop (where ``pred`` holds)."""
        self._jump(self.end, pred, "break_()")

    def continue_(self, *, pred: Any = None) -> None:
        """``[@pred] bra $L_while;``: start the next iteration (the condition is re-tested)."""
        self._jump(self.top, pred, "continue_()")


@contextmanager
def while_(cond: Callable[[], Any] | Reg | NotPred) -> Iterator[WhileLoop]:
    """A device while-loop: the block repeats while the condition holds.

    ``cond`` is a function returning a predicate (``lambda: i < n``): it is called once,
    at the loop's top, so the instructions it emits run again before every iteration
    and see the body's updates. A predicate register (or ``~p``) is also accepted; the
    body must then update it itself. Emits::

        $L_while:
            <cond's instructions>         // c = cond()
            @!c bra $L_while_end;
            <body>
            bra $L_while;
        $L_while_end:

    ``with ptx.while_(cond) as w:`` gives ``w.break_(pred=)`` and ``w.continue_(pred=)``.
    """
    trace = current()
    top = trace.unique("$L_while")
    end = trace.unique("$L_while_end")
    trace.label(top)
    c = _condition(cond, "ptx.while_")
    exit_guard = render(c.reg, None, trace) if type(c) is NotPred else "!" + render(c, None, trace)
    trace.inst("bra", (end,), exit_guard)
    yield WhileLoop(top, end, trace)
    trace.inst("bra", (top,))
    trace.label(end)


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


def unrolled(start: int | Reg, stop: int | Reg | None = None, step: int = 1, *,
             unroll: int = 4, type: PtxType = u32) -> Iterator[Reg]:
    """``for i in ptx.unrolled(n, unroll=k)``: a device loop whose body is traced ``k`` times
    per iteration, then a tail for the ``n mod k`` remaining iterations.

    Same bounds as ``ptx.loop`` (``start``/``stop`` ints or integer registers, ``step`` a
    positive int); every copy of the body sees ``i`` (one register) at its own value:
    ``i += step`` follows each copy. With register bounds the emitted shape is::

            mov i, start;
        $L_unroll:                          // main loop: k iterations per pass
            add t, i, (k-1)*step;  setp.ge p, t, stop;  @p bra $L_unroll_tail;
            <body>; add i, i, step;   ... k times
            bra $L_unroll;
        $L_unroll_tail:                     // remainder: one iteration per pass
            setp.ge q, i, stop;  @q bra $L_unroll_end;
            <body>; add i, i, step;
            bra $L_unroll_tail;
        $L_unroll_end:

    (the body is traced ``k + 1`` times; ``i + (k-1)*step`` must not overflow the type).
    With int bounds the trip count ``n`` is known: ``n // k`` passes of the main loop
    (a ``do``-loop tested at the bottom; straight code for one pass) and the
    ``n % k`` tail iterations as straight-line copies, no tail loop.
    A Python ``break`` out of the ``for`` leaves the loop unfinished: do not.
    """
    trace = current()
    if stop is None:
        start, stop = 0, start
    if isinstance(step, bool) or not isinstance(step, int) or step <= 0:
        raise OperandError(f"{where()}: ptx.unrolled step must be a positive int, got {step!r}")
    if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 1:
        raise OperandError(f"{where()}: ptx.unrolled unroll must be a positive int, got {unroll!r}")
    for name, v in (("start", start), ("stop", stop)):
        if isinstance(v, Reg):
            if not v.type.is_int:
                raise OperandError(f"{where()}: ptx.unrolled {name} must be an integer, got .{v.type.name}")
        elif isinstance(v, bool) or not isinstance(v, int):
            raise OperandError(f"{where()}: ptx.unrolled {name} must be an int or register, got {v!r}")
    if not isinstance(type, PtxType) or not type.is_int:
        raise OperandError(f"{where()}: ptx.unrolled type must be an integer PTX type, got {type!r}")
    if isinstance(start, int) and isinstance(stop, int):
        return _unrolled_static(trace, start, stop, step, unroll, type)
    return _unrolled_dynamic(trace, start, stop, step, unroll, type)


def _unrolled_static(trace: Trace, start: int, stop: int, step: int, k: int,
                     t: PtxType) -> Iterator[Reg]:
    from ..reg import scalar
    n = max(0, -(-(stop - start) // step))
    passes, tail = divmod(n, k)
    if n == 0:
        return
    i = scalar(t, init=start)
    if passes > 1:
        top = trace.unique("$L_unroll")
        trace.label(top)
    for _ in range(k if passes else 0):
        yield i
        i += step
    if passes > 1:
        again = i < start + passes * k * step
        trace.inst("bra", (top,), again.name)
    for _ in range(tail):
        yield i
        i += step


def _unrolled_dynamic(trace: Trace, start: Any, stop: Any, step: int, k: int,
                      t: PtxType) -> Iterator[Reg]:
    from ..reg import from_, scalar
    i = from_(start, t) if isinstance(start, Reg) else scalar(t, init=start)
    if isinstance(stop, Reg) and stop.type is not t and stop.type.bits == t.bits:
        stop = from_(stop, t)
    top = trace.unique("$L_unroll")
    tail = trace.unique("$L_unroll_tail")
    end = trace.unique("$L_unroll_end")
    trace.label(top)
    last = i + (k - 1) * step if k > 1 else i
    short = last >= stop
    trace.inst("bra", (tail,), short.name)
    for _ in range(k):
        yield i
        i += step
    trace.inst("bra", (top,))
    trace.label(tail)
    done = i >= stop
    trace.inst("bra", (end,), done.name)
    yield i
    i += step
    trace.inst("bra", (tail,))
    trace.label(end)
