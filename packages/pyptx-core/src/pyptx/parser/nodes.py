"""Nodes of a parsed PTX module: the DSL's IR classes plus what PTX files carry beyond it.

Every node keeps two strings beside its structure:

* ``trivia``: the whitespace and comments in front of it, exactly as read;
* ``raw``: its own spelling, exactly as read (``None`` once edited).

Printing a node is ``trivia + raw``; so printing a parsed module reproduces the
input byte for byte. A tool that changes a node calls ``node.edit(field=...)``
(or sets ``raw = None`` itself): the node then prints its canonical spelling,
built from the structure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import ir
from ..types import _BY_NAME, PtxType

__all__ = [
    "Instruction", "Label", "Directive", "RegDecl", "VarDecl", "Block", "Section",
    "Param", "Function", "Module", "Node",
]


def _edit(node, fields: dict) -> None:
    for k, v in fields.items():
        if not hasattr(node, k):
            raise AttributeError(f"{type(node).__name__} has no field {k!r}")
        setattr(node, k, v)
    node.raw = None


class Instruction(ir.Instruction):
    """``[@pred] opcode operands;``: ``opcode`` with its modifiers (``ld.global.v4.f32``),
    ``operands`` as written (vectors, calls' lists and addresses are one operand each),
    ``pred`` as written (``%p1`` or ``!%p1``)."""

    __slots__ = ("trivia", "raw")

    def __init__(self, opcode: str, operands: tuple[str, ...], pred: str | None,
                 trivia: str = "", raw: str | None = None) -> None:
        self.opcode = opcode
        self.operands = operands
        self.pred = pred
        self.loc = None
        self.trivia = trivia
        self.raw = raw

    @property
    def base(self) -> str:
        """The opcode without modifiers: ``ld`` for ``ld.global.v4.f32``."""
        return self.opcode.partition(".")[0]

    @property
    def modifiers(self) -> tuple[str, ...]:
        """The dotted modifiers after the base: ``('global', 'v4', 'f32')``."""
        return tuple(self.opcode.split(".")[1:])

    def edit(self, **fields) -> Instruction:
        """Change fields (``opcode``, ``operands``, ``pred``); the node then prints canonically."""
        _edit(self, fields)
        return self

    def spelling(self) -> str:
        """The statement as read, or its canonical text once edited."""
        return self.raw if self.raw is not None else self.text()

    def __repr__(self) -> str:
        return f"Instruction({self.spelling()!r})"


class Label(ir.Label):
    """A branch target ``name:``."""

    __slots__ = ("trivia", "raw")

    def __init__(self, name: str, trivia: str = "", raw: str | None = None) -> None:
        self.name = name
        self.loc = None
        self.trivia = trivia
        self.raw = raw

    def edit(self, **fields) -> Label:
        """Change ``name``; the label then prints canonically."""
        _edit(self, fields)
        return self

    def spelling(self) -> str:
        return self.raw if self.raw is not None else self.text()

    def __repr__(self) -> str:
        return f"Label({self.name!r})"


class Directive(ir.Raw):
    """A directive statement: ``name`` (``.loc``, ``.pragma``, ``.maxntid``, ``.version``...)
    and ``args`` (the rest, without a final ``;``). ``line`` is its canonical spelling."""

    __slots__ = ("name", "args", "semicolon", "trivia", "raw")

    def __init__(self, name: str, args: str, semicolon: bool, trivia: str = "",
                 raw: str | None = None) -> None:
        self.name = name
        self.args = args
        self.semicolon = semicolon
        self.loc = None
        self.trivia = trivia
        self.raw = raw

    @property
    def line(self) -> str:  # type: ignore[override]
        text = f"{self.name} {self.args}" if self.args else self.name
        return text + ";" if self.semicolon else text

    def text(self) -> str:
        return self.line

    def edit(self, **fields) -> Directive:
        """Change ``name``/``args``; the directive then prints canonically."""
        _edit(self, fields)
        return self

    def spelling(self) -> str:
        return self.raw if self.raw is not None else self.text()

    def __repr__(self) -> str:
        return f"Directive({self.spelling()!r})"


class RegDecl(Directive):
    """``.reg [.vN] .type names;``: ``names`` are ``(name, count)``; ``%r<12>`` is
    ``('%r', 12)``, a plain name has count ``None``."""

    __slots__ = ("type_name", "vector", "names")

    def __init__(self, type_name: str, vector: int | None, names: list[tuple[str, int | None]],
                 trivia: str = "", raw: str | None = None) -> None:
        self.type_name = type_name
        self.vector = vector
        self.names = names
        super().__init__(".reg", "", True, trivia, raw)

    @property
    def type(self) -> PtxType | None:
        """The pyptx type of the registers (``None`` for types pyptx has no singleton for)."""
        return _BY_NAME.get(self.type_name)

    @property
    def line(self) -> str:  # type: ignore[override]
        vec = f".v{self.vector} " if self.vector else ""
        names = ", ".join(n if c is None else f"{n}<{c}>" for n, c in self.names)
        return f".reg {vec}.{self.type_name} {names};"

    def __repr__(self) -> str:
        return f"RegDecl({self.spelling()!r})"


class VarDecl(Directive):
    """A variable: ``[.visible|.extern|.weak|.common] .space [.align N] [.vN] .type name[dims] [= init];``.

    ``space`` is ``global``, ``const``, ``shared``, ``local``, ``param`` or ``tex``;
    ``dims`` holds each ``[n]`` (``None`` for ``[]``); ``init`` the initializer text;
    ``attrs`` any other dotted words in order (e.g. ``.ptr``).
    """

    __slots__ = ("linkage", "space", "align", "vector", "type_name", "var", "dims", "init", "attrs")

    def __init__(self, linkage: tuple[str, ...], space: str, align: int | None, vector: int | None,
                 type_name: str, var: str, dims: tuple[int | None, ...], init: str | None,
                 attrs: tuple[str, ...] = (), trivia: str = "", raw: str | None = None) -> None:
        self.linkage = linkage
        self.space = space
        self.align = align
        self.vector = vector
        self.type_name = type_name
        self.var = var
        self.dims = dims
        self.init = init
        self.attrs = attrs
        super().__init__("." + space, "", True, trivia, raw)

    @property
    def type(self) -> PtxType | None:
        return _BY_NAME.get(self.type_name)

    @property
    def line(self) -> str:  # type: ignore[override]
        parts = [f".{w}" for w in self.linkage] + [f".{self.space}"]
        parts += [f".{a}" for a in self.attrs]
        if self.align:
            parts.append(f".align {self.align}")
        if self.vector:
            parts.append(f".v{self.vector}")
        parts.append(f".{self.type_name}")
        dims = "".join(f"[{'' if d is None else d}]" for d in self.dims)
        text = " ".join(parts) + f" {self.var}{dims}"
        if self.init is not None:
            text += f" = {self.init}"
        return text + ";"

    def __repr__(self) -> str:
        return f"VarDecl({self.spelling()!r})"


class Block:
    """A nested ``{ ... }`` scope inside a function body (nvcc wraps inline asm and calls in them)."""

    __slots__ = ("body", "trivia", "close_trivia", "raw")

    def __init__(self, trivia: str = "") -> None:
        self.body: list[Node] = []
        self.trivia = trivia
        self.close_trivia = ""
        self.raw = "{"

    def __repr__(self) -> str:
        return f"Block({len(self.body)} statements)"


class Section:
    """A ``.section name { ... }`` of debug data: ``body`` holds labels and data directives."""

    __slots__ = ("name", "body", "trivia", "raw", "open_trivia", "close_trivia")

    def __init__(self, name: str, trivia: str = "", raw: str | None = None) -> None:
        self.name = name
        self.body: list[Node] = []
        self.trivia = trivia
        self.raw = raw
        self.open_trivia = ""
        self.close_trivia = ""

    def __repr__(self) -> str:
        return f"Section({self.name!r}, {len(self.body)} entries)"


@dataclass(frozen=True)
class Param(ir.Param):
    """A ``.param`` (or ``.reg``) in a function's parameter list.

    ``type`` is the pyptx type when it has one (else ``None``; ``type_name``
    always holds the spelling); ``space`` is ``param`` or ``reg``; ``ptr`` the
    state space after ``.ptr`` (``""`` for ``.ptr`` alone), ``ptr_align`` its
    ``.align``; ``dims`` every ``[n]``; ``raw`` the spelling inside the list.
    """

    type_name: str = ""
    space: str = "param"
    vector: int | None = None
    ptr: str | None = None
    ptr_align: int | None = None
    dims: tuple[int | None, ...] = ()
    raw: str | None = field(default=None, compare=False)

    def text(self) -> str:
        parts = [f".{self.space}"]
        if self.align:
            parts.append(f".align {self.align}")
        if self.vector:
            parts.append(f".v{self.vector}")
        parts.append(f".{self.type_name or self.type.name}")
        if self.ptr is not None:
            parts.append(".ptr")
            if self.ptr:
                parts.append(f".{self.ptr}")
            if self.ptr_align:
                parts.append(f".align {self.ptr_align}")
        dims = "".join(f"[{'' if d is None else d}]" for d in self.dims)
        return " ".join(parts) + f" {self.name}{dims}"


@dataclass
class Function(ir.Function):
    """A ``.entry`` or ``.func``: a definition (``body`` is not ``None``... it is a list) or a
    declaration (``defined`` is False: the header ends with ``;``).

    ``kind`` is ``entry`` or ``func``; ``linkage`` e.g. ``('visible',)``;
    ``returns`` the ``.func`` return parameters; ``params`` the parameters;
    ``directives`` the performance directives (``Directive`` nodes) between
    header and body; ``body`` the statements (``Instruction``, ``Label``,
    ``Directive``/``RegDecl``/``VarDecl``, ``Block``).
    """

    kind: str = "entry"
    linkage: tuple[str, ...] = ()
    returns: list[Param] = field(default_factory=list)
    defined: bool = True
    has_param_list: bool = True
    trivia: str = ""
    raw: str | None = None
    open_trivia: str = ""
    close_trivia: str = ""

    def header_text(self) -> str:
        """The canonical header (linkage, kind, return list, name, parameter list)."""
        head = " ".join([f".{w}" for w in self.linkage] + [f".{self.kind}"])
        if self.returns:
            head += " (" + ", ".join(p.text() for p in self.returns) + ")"
        head += f" {self.name}"
        if self.params:
            head += "(\n" + ",\n".join("\t" + p.text() for p in self.params) + "\n)"
        elif self.has_param_list:
            head += "()"
        return head

    def edit(self, **fields) -> Function:
        """Change header fields; the header then prints canonically."""
        _edit(self, fields)
        return self

    def instructions(self):
        """Every instruction of the body, nested blocks included, in order."""
        stack = [iter(self.body)]
        while stack:
            for st in stack[-1]:
                if type(st) is Instruction:
                    yield st
                elif type(st) is Block:
                    stack.append(iter(st.body))
                    break
            else:
                stack.pop()


@dataclass
class Module(ir.Module):
    """A parsed PTX file: ``items`` is every top-level node in order (directives,
    variables, functions, sections); ``version``/``target``/``address_size``
    and ``functions`` are read from them; ``trailing`` is the text after the last one."""

    items: list = field(default_factory=list)
    trailing: str = ""
    source: str = "<ptx>"

    @property
    def variables(self) -> list[VarDecl]:
        """Module-scope variable declarations (``.global``, ``.const``, ``.shared``...)."""
        return [it for it in self.items if type(it) is VarDecl]

    def function(self, name: str) -> Function:
        """The function (entry or func) called ``name``; ``KeyError`` if none."""
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)

    def emit(self) -> str:
        """The module as PTX: the input, byte for byte, unless nodes were edited."""
        from .emit import emit

        return emit(self)


Node = Instruction | Label | Directive | Block | Section | Function
