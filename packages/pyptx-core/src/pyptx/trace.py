"""The active trace: register allocator, labels and the statement buffer of one kernel."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import TraceError
from .ir import Function, Instruction, Label, Raw, SharedDecl
from .source import user_loc, user_site
from .types import PtxType

_state = threading.local()


class Trace:
    """Everything one run of a kernel body appends to.

    Registers are named per declared type (``%f3``, ``%rd1``); labels and
    shared symbols get unique names; every statement records the user's
    ``file:line``.
    """

    #: ``setmaxnreg`` needs ``maxnreg`` set (``@kernel(maxnreg=...)``): pyptx assembles the
    #: kernel itself, so nothing else gives it a register budget.
    checks_register_budget = True

    def __init__(self, func: Function, arch: str) -> None:
        self.func = func
        self.arch = arch
        self.body = func.body
        self.counts = func.reg_counts
        self.shared: list[SharedDecl] = []
        self.shared_bytes = 0
        self.dynamic_smem = False
        self.scalar_params: list[tuple[str, PtxType, int | float]] = []
        self._names: dict[str, int] = {}
        self.pdl_wait: Instruction | None = None  # the @kernel(pdl=True) entry wait
        self.pdl_prologue_used = False
        self.version: str | None = None  # the PTX ISA version ptx.inst checks forms against
        self.maxnreg: int | None = None  # @kernel(maxnreg=...): the budget setmaxnreg needs
        self.smem_names: dict[str, str] = {}  # smem.alloc names the kernel's code gave: file:line
        self.divergence = None  # ptx._divergence's scan, made by the first CTA-wide barrier

    def new_reg_name(self, t: PtxType) -> str:
        n = self.counts.get(t, 0)
        self.counts[t] = n + 1
        return f"%{t.prefix}{n}"

    def new_reg_names(self, t: PtxType, count: int) -> list[str]:
        n = self.counts.get(t, 0)
        self.counts[t] = n + count
        p = "%" + t.prefix
        return [f"{p}{i}" for i in range(n, n + count)]

    def unique(self, stem: str) -> str:
        """A fresh identifier starting with ``stem``."""
        n = self._names.get(stem, 0)
        name = stem if n == 0 else f"{stem}_{n}"
        while n and name in self._names:  # "L" twice must not collide with a user's "L_1"
            n += 1
            name = f"{stem}_{n}"
        self._names[stem] = n + 1
        self._names.setdefault(name, 1)
        return name

    def inst(self, opcode: str, operands: tuple[str, ...], pred: str | None = None) -> None:
        self.body.append(Instruction(opcode, operands, pred, user_site(2)))

    def label(self, name: str) -> None:
        self.body.append(Label(name, user_site(2)))

    def raw(self, line: str) -> None:
        self.body.append(Raw(line, user_site(2)))


def current() -> Trace:
    """The trace being recorded on this thread; ``TraceError`` outside a kernel body."""
    t = getattr(_state, "trace", None)
    if t is None:
        raise TraceError(
            f"{user_loc(2)[0]}:{user_loc(2)[1]}: pyptx DSL calls are only valid inside a "
            "@kernel body while it is traced (call Kernel.ptx() or launch the kernel)"
        )
    return t


def active() -> Trace | None:
    """The trace being recorded on this thread, or None."""
    return getattr(_state, "trace", None)


@contextmanager
def tracing(t: Trace) -> Iterator[Trace]:
    """Make ``t`` the current trace for the duration of the block."""
    prev = getattr(_state, "trace", None)
    _state.trace = t
    try:
        yield t
    finally:
        _state.trace = prev
