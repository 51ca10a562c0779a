"""Registers: ``reg.scalar``, ``reg.array``, ``reg.from_`` and the ``Reg`` operator sugar.

Each operator on a ``Reg`` emits one PTX instruction into the active trace and
returns a fresh register (``a + b`` -> ``add.u32``); the in-place forms
(``a += b``) write ``a`` itself. Integer registers of different widths are
widened first (a 64-bit pointer plus a 32-bit offset adds a ``cvt``).
Comparisons produce predicate registers; ``~p`` on a predicate is a negation
usable as ``pred=~p`` without emitting anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from . import imm
from .errors import OperandError, RegisterScopeError, TraceError, TypeMismatchError
from .ir import Instruction
from .source import user_site, where
from .trace import Trace, active, current
from .types import PtxType
from .types import pred as _pred

__all__ = ["Reg", "RegArray", "NotPred", "scalar", "array", "from_", "render"]


class Reg:
    """A typed PTX register owned by one kernel trace."""

    __slots__ = ("name", "type", "trace")

    def __init__(self, name: str, type: PtxType, trace: Trace) -> None:
        self.name = name
        self.type = type
        self.trace = trace

    def __repr__(self) -> str:
        return f"Reg({self.name}: {self.type.name})"

    def __bool__(self) -> bool:
        raise TraceError(
            f"{where()}: register {self.name} has no Python truth value while tracing; "
            "branch on the device with ptx.if_(p), ptx.bra(label, pred=p) or pred=p"
        )

    __hash__ = object.__hash__

    def __add__(self, o: Any) -> Reg:
        return _binary("add", self, o)

    def __radd__(self, o: Any) -> Reg:
        return _binary("add", self, o)

    def __sub__(self, o: Any) -> Reg:
        return _binary("sub", self, o)

    def __rsub__(self, o: Any) -> Reg:
        return _binary("sub", self, o, swap=True)

    def __mul__(self, o: Any) -> Reg:
        return _binary("mul", self, o)

    def __rmul__(self, o: Any) -> Reg:
        return _binary("mul", self, o)

    def __truediv__(self, o: Any) -> Reg:
        return _binary("div", self, o)

    def __floordiv__(self, o: Any) -> Reg:
        return _binary("idiv", self, o)

    def __rtruediv__(self, o: Any) -> Reg:
        return _binary("div", self, o, swap=True)

    def __rfloordiv__(self, o: Any) -> Reg:
        return _binary("idiv", self, o, swap=True)

    def __rmod__(self, o: Any) -> Reg:
        return _binary("rem", self, o, swap=True)

    def __rlshift__(self, o: Any) -> Reg:
        return _binary("shl", self, o, swap=True)

    def __rrshift__(self, o: Any) -> Reg:
        return _binary("shr", self, o, swap=True)

    def __mod__(self, o: Any) -> Reg:
        return _binary("rem", self, o)

    def __and__(self, o: Any) -> Reg:
        return _binary("and", self, o)

    def __rand__(self, o: Any) -> Reg:
        return _binary("and", self, o)

    def __or__(self, o: Any) -> Reg:
        return _binary("or", self, o)

    def __ror__(self, o: Any) -> Reg:
        return _binary("or", self, o)

    def __xor__(self, o: Any) -> Reg:
        return _binary("xor", self, o)

    def __rxor__(self, o: Any) -> Reg:
        return _binary("xor", self, o)

    def __lshift__(self, o: Any) -> Reg:
        return _binary("shl", self, o)

    def __rshift__(self, o: Any) -> Reg:
        return _binary("shr", self, o)

    def __iadd__(self, o: Any) -> Reg:
        return _binary("add", self, o, dst=self)

    def __isub__(self, o: Any) -> Reg:
        return _binary("sub", self, o, dst=self)

    def __imul__(self, o: Any) -> Reg:
        return _binary("mul", self, o, dst=self)

    def __iand__(self, o: Any) -> Reg:
        return _binary("and", self, o, dst=self)

    def __ior__(self, o: Any) -> Reg:
        return _binary("or", self, o, dst=self)

    def __ixor__(self, o: Any) -> Reg:
        return _binary("xor", self, o, dst=self)

    def __ilshift__(self, o: Any) -> Reg:
        return _binary("shl", self, o, dst=self)

    def __irshift__(self, o: Any) -> Reg:
        return _binary("shr", self, o, dst=self)

    def __lt__(self, o: Any) -> Reg:
        return _compare("lt", self, o)

    def __le__(self, o: Any) -> Reg:
        return _compare("le", self, o)

    def __gt__(self, o: Any) -> Reg:
        return _compare("gt", self, o)

    def __ge__(self, o: Any) -> Reg:
        return _compare("ge", self, o)

    def __eq__(self, o: Any) -> Reg:  # type: ignore[override]
        return _compare("eq", self, o)

    def __ne__(self, o: Any) -> Reg:  # type: ignore[override]
        return _compare("ne", self, o)

    def __neg__(self) -> Reg:
        t = self.type
        if t.is_pred or t.kind in ("u", "b"):
            raise TypeMismatchError(f"{where()}: cannot negate .{t.name} register {self.name}")
        out = _new(self.trace, t)
        self.trace.inst(f"neg.{t.name}", (out.name, self.name))
        return out

    def __invert__(self) -> Reg | NotPred:
        if self.type.is_pred:
            return NotPred(self)
        if not self.type.is_int:
            raise TypeMismatchError(f"{where()}: ~ needs an integer register, got .{self.type.name}")
        out = _new(self.trace, self.type)
        self.trace.inst(f"not.b{self.type.bits}", (out.name, self.name))
        return out


class NotPred:
    """``~p``: the negation of predicate ``p``, rendered ``!%p`` where PTX allows it."""

    __slots__ = ("reg",)

    def __init__(self, reg: Reg) -> None:
        self.reg = reg

    def __invert__(self) -> Reg:
        return self.reg

    def __repr__(self) -> str:
        return f"NotPred({self.reg.name})"

    def __bool__(self) -> bool:
        return self.reg.__bool__()

    def materialize(self) -> Reg:
        """Emit ``not.pred`` and return the result as a predicate register."""
        out = _new(self.reg.trace, _pred)
        self.reg.trace.inst("not.pred", (out.name, self.reg.name))
        return out

    def __and__(self, o: Any) -> Reg:
        return self.materialize() & o

    def __or__(self, o: Any) -> Reg:
        return self.materialize() | o

    def __xor__(self, o: Any) -> Reg:
        return self.materialize() ^ o


def _bound(v: Any) -> str:
    return "" if v is None else str(v)


class RegArray(Sequence[Reg]):
    """``n`` registers of one type; index for one, slice for a list, pass whole as a vector."""

    __slots__ = ("regs", "type")

    def __init__(self, regs: list[Reg], type: PtxType) -> None:
        self.regs = regs
        self.type = type

    def __getitem__(self, i):  # type: ignore[override]
        regs = self.regs
        if type(i) is int and i >= 0:
            try:
                return regs[i]
            except IndexError:
                raise OperandError(
                    f"{where()}: register array index {i} out of range for length {len(regs)}"
                ) from None
        if type(i) is int:
            raise OperandError(
                f"{where()}: register array index {i} is negative; expected 0..{len(regs) - 1}"
                " (register arrays do not count from the end)"
            )
        if type(i) is slice:
            return regs[self._slice(i)]
        raise OperandError(
            f"{where()}: register arrays are indexed by Python ints at trace time, got {i!r}"
        )

    def _slice(self, s: slice) -> slice:
        """``s`` if it lies inside the array (no negative bounds, none past the end)."""
        n = len(self.regs)
        for name, v in (("start", s.start), ("stop", s.stop), ("step", s.step)):
            if v is None:
                continue
            if type(v) is not int:
                raise OperandError(f"{where(3)}: register array slice {name} must be a Python "
                                   f"int, got {v!r}")
            if v < 0 or (name != "step" and v > n) or (name == "step" and v == 0):
                want = "a positive int" if name == "step" else f"in 0..{n}"
                raise OperandError(
                    f"{where(3)}: register array slice [{_bound(s.start)}:{_bound(s.stop)}"
                    f"{':' + str(s.step) if s.step is not None else ''}] of length {n}: {name} "
                    f"{v} is outside it; expected {want} (register arrays do not count from "
                    "the end, and a slice past the end would silently be shorter)"
                )
        return s

    def __setitem__(self, i, value: Any) -> None:
        """``acc[i] = v``: one ``mov`` of ``v`` into the array's register ``acc[i]``.

        ``v`` is a register of the same width (``mov.b32`` between same-width types such
        as f32 and b32), ``~p`` for a predicate array (``not.pred``), or a Python number
        (encoded as for ``reg.scalar``). Assigning ``acc[i]`` itself emits nothing, so
        ``acc[i] *= s`` / ``acc[i] += s`` are exactly one in-place instruction. A slice
        takes a sequence of the same length or one value for every register
        (``acc[:] = 0.0``).
        """
        trace = current()
        if type(i) is slice:
            dsts = self.regs[self._slice(i)]
            if isinstance(value, (RegArray, list, tuple)):
                if len(value) != len(dsts):
                    raise OperandError(
                        f"{where()}: register array slice of {len(dsts)} registers cannot take "
                        f"{len(value)} values"
                    )
                for d, v in zip(dsts, value):
                    self._assign(trace, d, v)
            else:
                for d in dsts:
                    self._assign(trace, d, value)
            return
        self._assign(trace, self[i], value)

    @staticmethod
    def _assign(trace: Trace, dst: Reg, value: Any) -> None:
        if value is dst:
            return
        _own(dst, trace)
        t = dst.type
        if type(value) is Reg:
            _own(value, trace)
            s = value.type
            if s is t:
                trace.inst(f"mov.{_mov_type(t)}", (dst.name, value.name))
            elif s.bits == t.bits and not s.is_pred and not t.is_pred:
                trace.inst(f"mov.b{t.bits}", (dst.name, value.name))
            else:
                raise TypeMismatchError(
                    f"{where(3)}: cannot assign .{s.name} register {value.name} to .{t.name} "
                    f"register {dst.name} of a register array; convert first: "
                    f"reg.from_({value.name}, {t.name})"
                )
        elif type(value) is NotPred:
            if not t.is_pred:
                raise TypeMismatchError(
                    f"{where(3)}: cannot assign ~{value.reg.name} to .{t.name} register {dst.name}"
                )
            _own(value.reg, trace)
            trace.inst("not.pred", (dst.name, value.reg.name))
        elif isinstance(value, (int, float)):
            if isinstance(value, float) and not (t.is_float or t.is_pred):
                raise TypeMismatchError(
                    f"{where(3)}: cannot assign float {value!r} to .{t.name} register {dst.name}"
                )
            _move_immediate(trace, dst, value)
        else:
            raise OperandError(
                f"{where(3)}: a register array element takes a register or a Python number, "
                f"got {type(value).__name__} {value!r}"
            )

    def __len__(self) -> int:
        return len(self.regs)

    def __iter__(self) -> Iterator[Reg]:
        return iter(self.regs)

    def __repr__(self) -> str:
        return f"RegArray({len(self.regs)} x {self.type.name})"


def _new(trace: Trace, t: PtxType) -> Reg:
    return Reg(trace.new_reg_name(t), t, trace)


def _own(r: Reg, trace: Trace) -> None:
    if r.trace is not trace:
        raise RegisterScopeError(
            f"{where(3)}: register {r.name} ({r.type.name}) belongs to kernel "
            f"{r.trace.func.name!r}, not {trace.func.name!r}; registers cannot cross kernels"
        )


def render(value: Any, t: PtxType | None, trace: Trace) -> str:
    """Render one instruction operand (register, immediate, address, vector, label...)."""
    cls = type(value)
    if cls is Reg:
        if value.trace is not trace:
            _own(value, trace)
        return value.name
    if cls is int or cls is float or cls is bool:
        return imm.encode(value, t)
    if cls is NotPred:
        return "!" + render(value.reg, t, trace)
    if cls is RegArray or cls is list or cls is tuple:
        return "{" + ", ".join([render(v, t, trace) for v in value]) + "}"
    if cls is str:
        if value and not value.isspace():
            return value
        raise OperandError(
            f"{where(3)}: an operand given as PTX text must name something (a register, symbol "
            f"or label), got the empty text {value!r}"
        )
    hook = getattr(value, "__ptx_operand__", None)
    if hook is not None:
        return hook(trace)
    raise OperandError(
        f"{where(3)}: expected a register, Python number, ptx.addr(...), label or vector "
        f"as an operand, got {cls.__name__} {value!r}"
    )


def _arith_type(t: PtxType) -> str:
    return f"u{t.bits}" if t.kind == "b" else t.name


def _widen_opcode(to: PtxType, frm: PtxType) -> str:
    """The ``cvt`` that widens integer type ``frm`` to ``to`` (bit types as unsigned)."""
    return f"cvt.{to.kind if to.kind != 'b' else 'u'}{to.bits}.{'s' if frm.is_signed else 'u'}{frm.bits}"


def _widen(r: Reg, to: PtxType) -> Reg:
    out = _new(r.trace, to)
    r.trace.inst(_widen_opcode(to, r.type), (out.name, r.name))
    return out


def _unify(op: str, a: Reg, b: Reg) -> tuple[PtxType, Reg, Reg]:
    ta, tb = a.type, b.type
    if ta is tb:
        return ta, a, b
    if ta.is_int and tb.is_int:
        if ta.bits == tb.bits:
            if ta.kind == "b":
                return tb, a, b
            if tb.kind == "b":
                return ta, a, b
        elif ta.bits > tb.bits:
            return ta, a, _widen(b, ta)
        else:
            return tb, _widen(a, tb), b
    raise TypeMismatchError(
        f"{where(4)}: {op} of .{ta.name} register {a.name} and .{tb.name} register {b.name}; "
        f"convert one first, e.g. reg.from_(<the {tb.name} register>, {ta.name})"
    )


def _operand_type(op: str, a: Reg, o: Any) -> tuple[PtxType, Reg, Any]:
    t = a.type
    if type(o) is Reg:
        _own(o, a.trace)
        return _unify(op, a, o)
    if type(o) is NotPred:
        return _operand_type(op, a, o.materialize())
    if isinstance(o, float) and not t.is_float:
        raise TypeMismatchError(
            f"{where(4)}: {op} of .{t.name} register {a.name} with float {o!r}; "
            "integer registers take int immediates"
        )
    if not isinstance(o, (int, float)):
        raise TypeMismatchError(
            f"{where(4)}: {op} of register {a.name} with {type(o).__name__} {o!r}; "
            "expected a register or a Python number"
        )
    if t.is_pred and o not in (0, 1):
        raise OperandError(f"{where(4)}: {op} of predicate {a.name} with {o!r}; expected a "
                           "predicate register, ~p, True/False or 0/1")
    if t.is_float and (t.bits <= 16 or t.name in ("f16x2", "bf16x2")):
        # PTX arithmetic and setp take no 16-bit or packed float immediates: load one first.
        o = scalar(t, init=o)
    return t, a, o


_FLOAT_OPS = {"add", "sub", "mul", "div"}
_INT_OPS = {"add", "sub", "mul", "idiv", "rem", "and", "or", "xor", "shl", "shr"}
_PRED_OPS = {"and", "or", "xor"}


_OPCODES: dict[tuple[str, PtxType], str] = {}


def _opcode(op: str, t: PtxType) -> str:
    if t.is_pred:
        if op not in _PRED_OPS:
            raise TypeMismatchError(f"{where()}: '{op}' is not defined on predicates")
        opcode = f"{op}.pred"
    elif t.is_float:
        if op not in _FLOAT_OPS:
            raise TypeMismatchError(f"{where()}: '{op}' needs integer registers, got .{t.name}")
        if op == "div" and t.name not in ("f32", "f64"):
            raise TypeMismatchError(
                f"{where()}: PTX has no div.{t.name}; convert to f32 first (reg.from_(r, f32))"
            )
        opcode = f"div.rn.{t.name}" if op == "div" and t.bits >= 32 else f"{op}.{t.name}"
    else:
        if op not in _INT_OPS:
            raise TypeMismatchError(
                f"{where()}: '/' on integer registers is ambiguous; use // for div.{t.name}"
            )
        if op in ("and", "or", "xor", "shl"):
            opcode = f"{op}.b{t.bits}"
        elif op == "mul":
            opcode = f"mul.lo.{_arith_type(t)}"
        elif op == "idiv":
            opcode = f"div.{_arith_type(t)}"
        else:
            opcode = f"{op}.{_arith_type(t)}"
    _OPCODES[(op, t)] = opcode
    return opcode


def _binary(op: str, a: Reg, o: Any, *, swap: bool = False, dst: Reg | None = None) -> Reg:
    trace = a.trace
    if trace is not active():
        _own(a, current())
    t = a.type
    co = type(o)
    if not swap and t.is_int and (co is int or (co is Reg and o.type is t and o.trace is trace
                                                and op != "shl" and op != "shr")):
        # Fast path for the index arithmetic that dominates tracing: same-type or immediate.
        opcode = _OPCODES.get((op, t)) or _opcode(op, t)
        if dst is None:
            dst = Reg(trace.new_reg_name(t), t, trace)
        elif dst.type is not t:
            return _slow(op, a, o, swap, dst)
        if co is int and not o and (op == "idiv" or op == "rem"):
            _division_by_zero(op, a)
        if co is int and (op == "shl" or op == "shr") and not 0 <= o < t.bits:
            _shift_past_width(op, a, o)
        rb = o.name if co is Reg else imm.encode(o, None if op in ("shl", "shr") else t)
        trace.body.append(Instruction(opcode, (dst.name, a.name, rb), None, user_site(3)))
        if t.bits == 64 and (op == "add" or op == "sub"):
            _carry_wide_pointer(trace, dst, a, o)
        return dst
    if ((op == "add" or op == "sub") and co is Reg and not swap and dst is None
            and o.trace is trace and t.is_int and o.type.is_int and o.type.bits != t.bits
            and not getattr(trace, "wide_pointers", None)):
        # Fast path for pointer + narrower offset: what _slow emits (cvt of the narrower
        # operand to the wider type, then the op), without its frame walks.
        site = user_site(3)
        narrow, wide = (o, a) if o.type.bits < t.bits else (a, o)
        wt, nt = wide.type, narrow.type
        w = Reg(trace.new_reg_name(wt), wt, trace)
        trace.body.append(Instruction(_widen_opcode(wt, nt), (w.name, narrow.name), None, site))
        ra, rb = (a.name, w.name) if narrow is o else (w.name, o.name)
        out = Reg(trace.new_reg_name(wt), wt, trace)
        opcode = _OPCODES.get((op, wt)) or _opcode(op, wt)
        trace.body.append(Instruction(opcode, (out.name, ra, rb), None, site))
        return out
    return _slow(op, a, o, swap, dst)


def _carry_wide_pointer(trace: Trace, out: Reg, a: Reg, o: Any) -> None:
    """Mark ``out`` as a pointer into a tensor over 4 GiB if ``a`` or ``o`` is one."""
    wide = getattr(trace, "wide_pointers", None)
    if wide:
        hit = wide.get(a.name) or (wide.get(o.name) if type(o) is Reg else None)
        if hit is not None:
            wide[out.name] = hit


def _refuse_narrow_offset(op: str, a: Reg, o: Any) -> None:
    """A 32-bit offset added to a pointer into a tensor over 4 GiB wraps: refuse it."""
    wide = getattr(a.trace, "wide_pointers", None)
    if not wide or type(o) is not Reg or not (a.type.is_int and o.type.is_int):
        return
    for ptr, off in ((a, o), (o, a)):
        hit = wide.get(ptr.name)
        if hit is not None and ptr.type.bits == 64 and off.type.bits < 64:
            tensor, nbytes = hit
            raise TypeMismatchError(
                f"{where(4)}: {op} of the {off.type.bits}-bit register {off.name} and "
                f"{ptr.name}, a pointer into tensor {tensor!r} of {nbytes} bytes (over 4 GiB): "
                f"an offset computed in {off.type.bits} bits wraps past 4 GiB; compute it in "
                f"64 bits, e.g. reg.from_(i, u64) * 4, or ptx.inst.mul.wide.u32"
            )


def _division_by_zero(op: str, a: Reg) -> None:
    raise OperandError(
        f"{where(4)}: {'//' if op == 'idiv' else '%'} by the immediate 0 on .{a.type.name} "
        f"register {a.name}; PTX integer division by zero gives an undefined value "
        "(expected a non-zero divisor)"
    )


def _shift_past_width(op: str, a: Reg, o: int) -> None:
    raise OperandError(
        f"{where(4)}: {'<<' if op == 'shl' else '>>'} by {o} on the {a.type.bits}-bit register "
        f"{a.name}; expected a shift amount in 0..{a.type.bits - 1} (a shift by the width or "
        "more does not shift within the value)"
    )


def _slow(op: str, a: Reg, o: Any, swap: bool, dst: Reg | None) -> Reg:
    trace = a.trace
    if (op == "idiv" or op == "rem") and type(o) is int and not o and not swap:
        _division_by_zero(op, a)
    if op == "shl" or op == "shr":
        t = a.type
        if type(o) is Reg:
            _own(o, trace)
            if not (o.type.is_int and o.type.bits == 32):
                raise TypeMismatchError(
                    f"{where(3)}: shift amount must be a 32-bit integer register or int, "
                    f"got .{o.type.name} {o.name}"
                )
        elif type(o) is not int:
            raise TypeMismatchError(f"{where(3)}: shift amount must be an int, got {o!r}")
        elif not swap and not 0 <= o < t.bits:
            _shift_past_width(op, a, o)
        b = o
    else:
        if op == "add" or op == "sub":
            _refuse_narrow_offset(op, a, o)
        a0 = a
        t, a, b = _operand_type(op, a, o)
    opcode = _OPCODES.get((op, t)) or _opcode(op, t)
    out = dst if dst is not None else _new(trace, t)
    if t.bits == 64 and (op == "add" or op == "sub"):
        _carry_wide_pointer(trace, out, a0, o)
    if dst is not None and dst.type is not t and not (
            dst.type.is_int and t.is_int and dst.type.bits == t.bits):
        raise TypeMismatchError(
            f"{where(3)}: in-place {op} would change {dst.name} from .{dst.type.name} to .{t.name}"
        )
    ra = a.name
    rb = render(b, t if op not in ("shl", "shr") else None, trace)
    trace.inst(opcode, (out.name, rb, ra) if swap else (out.name, ra, rb))
    return out


def _compare(cmp: str, a: Reg, o: Any) -> Reg:
    trace = a.trace
    if trace is not active():
        _own(a, current())
    t, a, b = _operand_type(cmp, a, o)
    if t.is_pred:
        raise TypeMismatchError(f"{where(3)}: cannot compare predicates with '{cmp}'; use & | ^ ~")
    ty = _arith_type(t)
    out = _new(trace, _pred)
    trace.inst(f"setp.{cmp}.{ty}", (out.name, a.name, render(b, t, trace)))
    return out


def _mov_type(t: PtxType) -> str:
    if t.is_pred or t.is_int or t.name in ("f32", "f64"):
        return t.name
    return f"b{t.bits}"


def _move_immediate(trace: Trace, dst: Reg, value: int | float) -> None:
    """``mov`` of the exactly encoded ``value`` into ``dst`` (``cvt`` for 8-bit integers:
    PTX has no 8-bit ``mov``, and ``cvt`` takes the immediate)."""
    t = dst.type
    if t.is_pred and (value not in (0, 1) or type(value) is float):
        raise OperandError(f"{where(4)}: a predicate register takes True/False or 0/1, got "
                           f"{value!r}")
    if t.bits == 8 and t.is_int:
        k = "s" if t.is_signed else "u"
        trace.inst(f"cvt.{k}8.{k}32", (dst.name, imm.encode(value, t)))
    else:
        trace.inst(f"mov.{_mov_type(t)}", (dst.name, imm.encode(value, t)))


def scalar(t: PtxType, init: int | float | Reg | None = None) -> Reg:
    """A new register of type ``t``; ``init`` emits one ``mov`` (immediates encoded exactly)."""
    trace = current()
    if not isinstance(t, PtxType):
        raise OperandError(f"{where()}: reg.scalar expects a PTX type such as f32, got {t!r}")
    r = _new(trace, t)
    if init is not None:
        if type(init) is Reg:
            _own(init, trace)
            if init.type.bits != t.bits:
                raise TypeMismatchError(
                    f"{where()}: init register {init.name} is .{init.type.name}, expected "
                    f".{t.name}; use reg.from_ to convert"
                )
            mt = _mov_type(t) if init.type is t else f"b{t.bits}"  # mov.f32 %f, %r is rejected
            trace.inst(f"mov.{mt}", (r.name, init.name))
        elif isinstance(init, (int, float)):
            if isinstance(init, float) and not (t.is_float or t.is_pred):
                raise TypeMismatchError(
                    f"{where()}: float init {init!r} for integer register type .{t.name}"
                )
            _move_immediate(trace, r, init)
        else:
            raise OperandError(f"{where()}: init must be a Python number or a register, got {init!r}")
    return r


REGISTER_FILE = 65536
"""32-bit registers in one SM's register file: no register array can be larger."""


def array(t: PtxType, n: int) -> RegArray:
    """``n`` fresh registers of type ``t`` (consecutively numbered)."""
    trace = current()
    if not isinstance(t, PtxType):
        raise OperandError(f"{where()}: reg.array expects a PTX type such as f32, got {t!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise OperandError(f"{where()}: reg.array length must be a positive int, got {n!r}")
    if n * max(t.bits // 32, 1) > REGISTER_FILE:
        raise OperandError(
            f"{where()}: reg.array({t.name}, {n}) needs more 32-bit registers than an SM's "
            f"register file has ({REGISTER_FILE}); a thread can address at most 255"
        )
    return RegArray([Reg(nm, t, trace) for nm in trace.new_reg_names(t, n)], t)


def _cvt_opcode(dst: PtxType, src: PtxType) -> str:
    if dst.is_float and src.is_float:
        rnd = ".rn" if dst.bits <= src.bits else ""  # f16 <-> bf16 also rounds
        return f"cvt{rnd}.{dst.name}.{src.name}"
    if dst.is_float:
        return f"cvt.rn.{dst.name}.{_arith_type(src)}"
    if src.is_float:
        return f"cvt.rzi.{_arith_type(dst)}.{src.name}"
    return f"cvt.{_arith_type(dst)}.{_arith_type(src)}"


def from_(value: Any, t: PtxType | None = None) -> Reg:
    """A new register of type ``t`` holding ``value`` (a register, a special register or a number).

    Same-width integer types move; other types convert (``cvt``, round to
    nearest for float results, toward zero for float to int).
    """
    trace = current()
    if type(value) is NotPred:
        value = value.materialize()
    if type(value) is Reg:
        _own(value, trace)
        t = t or value.type
        if not isinstance(t, PtxType):
            raise OperandError(f"{where()}: reg.from_ expects a PTX type, got {t!r}")
        r = _new(trace, t)
        s = value.type
        if s is t:
            trace.inst(f"mov.{_mov_type(t)}", (r.name, value.name))
        elif s.bits == t.bits and s.is_int and t.is_int:
            trace.inst(f"mov.b{t.bits}", (r.name, value.name))
        elif s.is_pred or t.is_pred:
            if t.is_pred:
                zero = imm.encode(0, s)  # 0f00000000 for f32: setp.ne.f32 rejects a bare 0
                if s.is_float and s.bits <= 16:  # no 16-bit float immediates in setp
                    zero = scalar(s, init=0.0).name
                trace.inst(f"setp.ne.{_arith_type(s)}", (r.name, value.name, zero))
            else:
                ty = _arith_type(t) if t.name in ("f32", "f64") or not t.is_float else f"b{t.bits}"
                trace.inst(f"selp.{ty}", (r.name, imm.encode(1, t), imm.encode(0, t), value.name))
        else:
            trace.inst(_cvt_opcode(t, s), (r.name, value.name))
        return r
    if isinstance(value, (int, float)):
        if t is None:
            raise OperandError(f"{where()}: reg.from_ of a Python number needs a type: reg.from_({value!r}, f32)")
        return scalar(t, init=value)
    raise OperandError(f"{where()}: reg.from_ expects a register or a number, got {value!r}")

