"""The IR the DSL builds and the emitter prints: statements, params, functions, modules.

Operands are stored already rendered (``%r3``, ``[%rd1+16]``, ``0f3F800000``):
checking happens when a statement is built, so printing is a join.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from ._dataclass import dataclass
from .source import resolve
from .types import PtxType


class Instruction:
    """``@pred opcode operands;`` with the Python location that made it."""

    __slots__ = ("opcode", "operands", "pred", "_loc")

    def __init__(self, opcode: str, operands: tuple[str, ...], pred: str | None, loc: Any) -> None:
        self.opcode = opcode
        self.operands = operands
        self.pred = pred
        self._loc = loc

    loc = property(lambda self: resolve(self._loc), lambda self, v: setattr(self, "_loc", v),
                   doc="The Python ``(file, line)`` that made this statement, or None.")

    def text(self) -> str:
        """The statement as PTX, without indentation."""
        head = f"@{self.pred} {self.opcode}" if self.pred else self.opcode
        if self.operands:
            return f"{head} {', '.join(self.operands)};"
        return head + ";"

    def __repr__(self) -> str:
        return f"Instruction({self.text()!r})"


class Label:
    """A branch target ``name:``."""

    __slots__ = ("name", "_loc")

    def __init__(self, name: str, loc: Any) -> None:
        self.name = name
        self._loc = loc

    loc = Instruction.loc

    def text(self) -> str:
        """The label line."""
        return f"{self.name}:"


class Raw:
    """A verbatim body line: a directive such as ``.pragma "nounroll";`` or a comment."""

    __slots__ = ("line", "_loc")

    def __init__(self, line: str, loc: Any) -> None:
        self.line = line
        self._loc = loc

    loc = Instruction.loc

    def text(self) -> str:
        """The line itself."""
        return self.line


Statement = Instruction | Label | Raw


@dataclass(frozen=True)
class Param:
    """One kernel ``.param``: a pointer (``u64``), a scalar, or a byte blob."""

    name: str
    type: PtxType
    align: int | None = None
    count: int | None = None

    def text(self) -> str:
        """The parameter declaration."""
        align = f" .align {self.align}" if self.align else ""
        count = f"[{self.count}]" if self.count else ""
        return f".param{align} .{self.type.name} {self.name}{count}"


@dataclass(frozen=True)
class SharedDecl:
    """A ``.shared`` array at module scope; ``count=None`` is dynamic (``.extern``)."""

    name: str
    type: PtxType
    align: int
    count: int | None

    def text(self) -> str:
        """The declaration line."""
        if self.count is None:
            return f".extern .shared .align {self.align} .{self.type.name} {self.name}[];"
        return f".shared .align {self.align} .{self.type.name} {self.name}[{self.count}];"


@dataclass
class Function:
    """A ``.entry`` kernel: params, performance directives, registers and body."""

    name: str
    params: list[Param] = field(default_factory=list)
    directives: list[str] = field(default_factory=list)
    reg_counts: dict[PtxType, int] = field(default_factory=dict)
    body: list[Statement] = field(default_factory=list)


@dataclass
class Module:
    """A PTX module: header, shared declarations and one entry function."""

    version: str
    target: str
    functions: list[Function]
    shared: list[SharedDecl] = field(default_factory=list)
    address_size: int = 64
