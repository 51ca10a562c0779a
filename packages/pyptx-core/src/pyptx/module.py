"""``pyptx.module``: build a whole PTX module statement by statement, below ``@kernel``.

``@kernel`` owns its parameters (one u64 per tensor), register names and
header. ``PtxModule`` hands all of that to the caller, so any PTX file can be
written as pyptx code (it is what ``pyptx transpile`` produces): several
functions, ``.func`` with return values, named registers, exact labels,
module variables and debug sections. Inside a ``function`` block the usual DSL
works (``ptx.inst...``, ``reg`` sugar, ``ptx.loop``, ``ptx.global_ptrs`` on
``fn.tensor_params()``).

    from pyptx import ptx
    from pyptx.module import PtxModule
    from pyptx.types import b32, b64, f32, pred

    m = PtxModule("8.0", "sm_90a")
    with m.function("scale", params=[".param .u64 x", ".param .f32 a"]) as fn:
        x, a = fn.params
        rd = fn.reg(b64, "%rd", 3)
        f = fn.reg(f32, "%f", 3)
        ptx.inst.ld.param.u64(rd[1], ptx.addr(x))
        ptx.inst.ld.param.f32(f[1], ptx.addr(a))
        ...
        ptx.ret()
    print(m.ptx())

Layout: every statement is printed after a separator (its "trivia", by
default a newline and, inside a body, a tab). ``PtxModule(layout=...)`` can
override the separator and the spelling of statement ``i`` (counting from 0
over the printed statements); ``pyptx transpile --exact`` uses this to
reproduce an input file byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .errors import OperandError, TraceError
from .ir import Function, Instruction, Label, Raw
from .ptx.control import Label as DslLabel
from .ptx.memory import TensorParam
from .reg import Reg, RegArray
from .source import where
from .trace import Trace, tracing
from .types import _BY_NAME, PtxType

__all__ = ["PtxModule", "FunctionBuilder", "Symbol"]


class Symbol:
    """A named PTX symbol used as an operand (a parameter, a variable): renders as its name."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name
        """The symbol's PTX name."""

    def __ptx_operand__(self, trace: Trace) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Symbol({self.name})"


class _RawTrace(Trace):
    """A trace whose fresh registers never collide with the names the caller declared."""

    #: A raw module's register budget may come from ptxas's ``-maxrregcount`` (nvcc's output
    #: has setmaxnreg without ``.maxnreg``), which the trace cannot see: not checked.
    checks_register_budget = False

    def __init__(self, func: Function, arch: str) -> None:
        super().__init__(func, arch)
        self.declared: dict[str, int] = {}  # prefix -> next free number
        self.extra: list[tuple[PtxType, str]] = []

    def new_reg_name(self, t: PtxType) -> str:
        return self.new_reg_names(t, 1)[0]

    def new_reg_names(self, t: PtxType, count: int) -> list[str]:
        p = "%" + t.prefix
        n = max(self.declared.get(p, 0), self.counts.get(t, 0))
        self.counts[t] = n + count
        self.declared[p] = n + count
        names = [f"{p}{i}" for i in range(n, n + count)]
        self.extra.extend((t, nm) for nm in names)
        return names


class FunctionBuilder:
    """The open function of a ``PtxModule.function`` block."""

    def __init__(self, module: PtxModule, name: str, trace: _RawTrace, params: list[Symbol],
                 returns: list[Symbol]) -> None:
        self.module = module
        """The ``PtxModule`` the function belongs to."""
        self.name = name
        """The function's PTX name."""
        self.trace = trace
        """The trace its statements are appended to."""
        self.params = params
        """One ``Symbol`` per parameter, in declaration order."""
        self.returns = returns
        """One ``Symbol`` per return parameter of a ``.func``."""

    # -- declarations ------------------------------------------------------
    def reg(self, t: PtxType | str, name: str, count: int | None = None, *,
            vector: int | None = None) -> Any:
        """Declare ``.reg .t name<count>;`` and return its registers (a ``RegArray`` indexed by
        number), or ``.reg .t name;`` and return the one ``Reg``."""
        tname = t if isinstance(t, str) else t.name
        ptype = _BY_NAME.get(tname) if isinstance(t, str) else t
        if not isinstance(name, str) or not name:
            raise OperandError(f"{where()}: register name must be a non-empty string, got {name!r}")
        vec = f".v{vector} " if vector else ""
        trace = self.trace
        if count is None:
            trace.body.append(Raw(f".reg {vec}.{tname} {name};", None))
            return Reg(name, ptype, trace) if ptype is not None and not vector else name
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise OperandError(f"{where()}: register count must be a non-negative int, got {count!r}")
        trace.body.append(Raw(f".reg {vec}.{tname} {name}<{count}>;", None))
        trace.declared[name] = max(trace.declared.get(name, 0), count)
        if ptype is None or vector:
            return [f"{name}{i}" for i in range(count)]
        return RegArray([Reg(f"{name}{i}", ptype, trace) for i in range(count)], ptype)

    def labels(self, *names: str) -> tuple[DslLabel, ...]:
        """Labels with exactly these names (place them with ``ptx.place``)."""
        return tuple(DslLabel(n, self.trace) for n in names)

    def tensor_params(self) -> tuple[TensorParam, ...]:
        """The parameters as tensor parameters, for ``ptx.global_ptrs``."""
        return tuple(TensorParam(p.name, None, (), i, self.trace) for i, p in enumerate(self.params))

    # -- statements --------------------------------------------------------
    def directive(self, text: str) -> None:
        """A body statement written out verbatim (``.loc``, ``.pragma``, ``.local``, ``.param``...)."""
        self.trace.body.append(Raw(text, None))

    def comment(self, text: str) -> None:
        """A ``// text`` line in the body."""
        self.trace.body.append(Raw(f"// {text}", None))

    def inst(self, opcode: str, *operands: Any, pred: Any = None) -> None:
        """An instruction by full spelling, for opcodes ``ptx.inst`` does not know
        (``pred`` may also be the guard as PTX text, e.g. ``"!%p1"``)."""
        from .ptx.inst import _pred_text
        from .reg import render

        trace = self.trace
        ops = tuple(render(o, None, trace) for o in operands)
        p = pred if isinstance(pred, str) or pred is None else _pred_text(pred)
        trace.body.append(Instruction(opcode, ops, p, None))

    @contextmanager
    def block(self) -> Iterator[None]:
        """A nested ``{ ... }`` scope (registers declared inside are local to it)."""
        self.trace.body.append(Raw("{", None))
        yield
        self.trace.body.append(Raw("}", None))


def _extra_decls(extra: list[tuple[PtxType, str]]) -> list[str]:
    """Declarations of the registers the DSL allocated: ``%p<n>`` for a run from 0, else one each."""
    by: dict[tuple[str, str], list[int]] = {}
    for t, nm in extra:
        prefix = "%" + t.prefix
        by.setdefault((t.reg_decl, prefix), []).append(int(nm[len(prefix):]))
    out = []
    for (decl, prefix), nums in by.items():
        if sorted(nums) == list(range(len(nums))):
            out.append(f".reg .{decl} {prefix}<{len(nums)}>;")
        else:
            out.extend(f".reg .{decl} {prefix}{n};" for n in nums)
    return out


class _Fn:
    __slots__ = ("header", "directives", "trace")

    def __init__(self, header: str, directives: list[str], trace: _RawTrace | None) -> None:
        self.header = header
        self.directives = directives
        self.trace = trace


class PtxModule:
    """A PTX module built statement by statement; ``ptx()`` prints it."""

    def __init__(self, version: str, target: str, address_size: int | None = 64, *,
                 opsep: str = " ", layout: dict | None = None) -> None:
        self.version = version
        """The ``.version`` (PTX ISA), e.g. ``"8.0"``."""
        self.target = target
        """The ``.target`` text, e.g. ``"sm_90a"``."""
        self.address_size = address_size
        """The ``.address_size`` (64), or None to omit the directive."""
        self.opsep = opsep
        """The separator printed between an opcode and its operands."""
        self.layout = layout or {}
        """Per-statement separators and spellings (``pyptx transpile --exact``)."""
        self._items: list[Any] = []
        if version is not None:
            self._items.append(f".version {version}")
        if target is not None:
            self._items.append(f".target {target}")
        if address_size is not None:
            self._items.append(f".address_size {address_size}")
        self._open = False

    @property
    def arch(self) -> str:
        """The architecture of the ``.target`` (its first item), for ptxas."""
        return (self.target or "sm_90a").split(",")[0].strip()

    def directive(self, text: str) -> None:
        """A module-scope statement written out verbatim (variables, ``.file``, sections...)."""
        self._items.append(text)

    @contextmanager
    def function(self, name: str, *, kind: str = "entry", linkage: Sequence[str] = ("visible",),
                 params: Sequence[str] = (), returns: Sequence[str] | None = None,
                 directives: Sequence[str] = (), param_list: bool = True) -> Iterator[FunctionBuilder]:
        """Define ``.entry``/``.func`` ``name``; the ``with`` body traces its statements.

        ``params``/``returns`` are the parameter declarations as PTX
        (``".param .u64 x"``); ``fn.params``/``fn.returns`` hold them as operands.
        """
        if self._open:
            raise TraceError(f"{where(3)}: PtxModule.function blocks do not nest")
        header = _header(name, kind, linkage, params, returns, param_list)
        func = Function(name)
        trace = _RawTrace(func, self.arch)
        fn = FunctionBuilder(self, name, trace, [Symbol(_param_name(p)) for p in params],
                             [Symbol(_param_name(p)) for p in (returns or ())])
        self._open = True
        try:
            with tracing(trace):
                yield fn
        finally:
            self._open = False
        self._items.append(_Fn(header, list(directives), trace))

    def declare(self, name: str, *, kind: str = "func", linkage: Sequence[str] = ("extern",),
                params: Sequence[str] = (), returns: Sequence[str] | None = None,
                directives: Sequence[str] = (), param_list: bool = True) -> None:
        """Declare a function without a body (``.extern .func ... ;``)."""
        header = _header(name, kind, linkage, params, returns, param_list)
        self._items.append(_Fn(header, list(directives), None))

    # -- printing ----------------------------------------------------------
    def statements(self) -> list[tuple[str, str]]:
        """Every printed statement as ``(default separator, canonical text)``, in order."""
        out: list[tuple[str, str]] = []
        add = out.append
        sep = self.opsep
        for it in self._items:
            if type(it) is not _Fn:
                add(("\n", it))
                continue
            add(("\n", it.header))
            for d in it.directives:
                add(("\n", d))
            if it.trace is None:
                add(("\n", ";"))
                continue
            add(("\n", "{"))
            trace = it.trace
            for decl in _extra_decls(trace.extra):
                add(("\n\t", decl))
            for st in trace.func.body:
                cls = type(st)
                if cls is Instruction:
                    head = f"@{st.pred} {st.opcode}" if st.pred else st.opcode
                    add(("\n\t", f"{head}{sep}{', '.join(st.operands)};" if st.operands else head + ";"))
                elif cls is Label:
                    add(("\n", f"{st.name}:"))
                else:
                    add(("\n\t", st.line))
            add(("\n", "}"))
        return out

    def ptx(self) -> str:
        """The module as PTX text (with ``layout`` applied)."""
        trivia = self.layout.get("trivia", {})
        spell = self.layout.get("spell", {})
        parts = []
        for i, (sep, text) in enumerate(self.statements()):
            parts.append(trivia.get(i, sep))
            parts.append(spell.get(i, text))
        parts.append(self.layout.get("trailing", "\n"))
        return "".join(parts)


def _param_name(decl: str) -> str:
    body = decl.split("//")[0].strip()
    tail = body.split()[-1] if body.split() else ""
    return tail.split("[")[0]


def _header(name: str, kind: str, linkage: Sequence[str], params: Sequence[str],
            returns: Sequence[str] | None, param_list: bool) -> str:
    head = " ".join([f".{w}" for w in linkage] + [f".{kind}"])
    if returns is not None:
        head += " (" + ", ".join(returns) + ")"
    head += f" {name}"
    if params:
        head += "(\n" + ",\n".join("\t" + p for p in params) + "\n)"
    elif param_list:
        head += "()"
    return head
