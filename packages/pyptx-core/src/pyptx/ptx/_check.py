"""Check one ``ptx.inst`` call against the instruction table (``pyptx.ptx._isa``).

``form(opcode)`` parses a spelling once: its row, type suffixes, modifiers and the
expected role and type of each operand, refusing unknown modifiers and invalid
combinations. ``Form.check(operands, trace)`` then costs one length test and one
type test per operand. Every refusal is a ``PyptxError`` naming the user's file:line.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..errors import OperandError, TraceError, TypeMismatchError
from ..reg import NotPred, Reg, RegArray
from ..smem import SharedArray
from ..source import where
from ..types import ALL_TYPES, PtxType
from ._types import TYPE_INFO
from .memory import Addr, TensorMapParam, TensorParam

if TYPE_CHECKING:
    from ._isa import Row

_PARAMS = (TensorParam, TensorMapParam)
_VEC = {"v2": 2, "v4": 4, "v8": 8, "x1": 1, "x2": 2, "x4": 4}
_RELAXED = frozenset({"ld", "ldu", "st", "cvt"})
_WIDE_ADDR = frozenset({"global", "generic"})
_ROLE_NAMES = {"d": "destination", "s": "source", "r": "source register", "a": "address",
               "p": "predicate", "q": "predicate destination", "i": "immediate",
               "l": "label", "x": "operand", "h": "shift amount"}
_NAMED = frozenset({SharedArray})
#: Rows whose ``ptx.addr`` operands are checked against the spelling's state space in every
#: space (a shared array is not a .local address, a kernel parameter only a .param one).
_SPACE_CHECKED = frozenset({"ld", "ldu", "st", "atom", "red", "ldmatrix", "stmatrix"})
ANY: frozenset = frozenset()  # the "take anything" marker, compared by identity
_ARCH = re.compile(r"^sm_(\d+)([af]?)$")


def _double(t: str) -> str:
    kind, bits = TYPE_INFO[t]
    return f"{kind}{bits * 2}"


_compat: dict[tuple[PtxType, str, bool], bool] = {}


def compatible(reg: PtxType, t: str, relaxed: bool = False) -> bool:
    """Whether a register of type ``reg`` may be an operand of an instruction of type ``.t``.

    PTX's type rules, on the type the register is declared with: ``.bN`` takes any
    ``N``-bit register, ``.uN``/``.sN`` integer or bit registers of ``N`` bits, ``.fN``
    float or bit registers of ``N`` bits, ``.pred`` predicates. ``relaxed`` (``ld``,
    ``st``, ``cvt``) also allows integer and bit registers wider than ``N``.
    """
    key = (reg, t, relaxed)
    hit = _compat.get(key)
    if hit is None:
        info = TYPE_INFO.get(t)
        dkind, dbits = TYPE_INFO.get(reg.reg_decl, (reg.kind, reg.bits))
        if info is None:
            hit = True
        elif info[0] == "pred" or dkind == "pred":
            hit = info[0] == dkind
        else:
            ikind, ibits = info
            size = dbits == ibits or (relaxed and dbits > ibits and dkind in "bus"
                                      and ikind in "bus")
            if ikind in ("b", "x"):
                hit = size
            elif ikind in ("u", "s"):
                hit = size and dkind in "bus"
            else:
                hit = size and dkind in "bf"
        _compat[key] = hit
    return hit


def _refuse(fn: str, msg: str, cls: type = OperandError) -> None:
    raise cls(f"{where()}: ptx.inst.{fn}: {msg}")


class Form:
    """A parsed spelling: what each operand must be, and what arch and PTX version it needs."""

    __slots__ = ("fn", "row", "types", "mods", "roles", "nmin", "nmax", "vec", "space",
                 "relaxed", "sm", "arch_a", "ptx", "ok_arch", "ok_version", "fast")

    def __init__(self, opcode: str) -> None:
        self.fn = opcode
        from ._isa import row_for  # the table is built at the first spelling parsed

        found = row_for(opcode)
        if found is None:
            _refuse(opcode, f"no PTX instruction is spelled {opcode!r}; see the PTX ISA for the "
                    "forms of this opcode")
        row, parts = found
        self.row = row
        types: list[str] = []
        mods: list[str] = []
        max_types = max(row.ntypes)
        for p in parts:
            if p in row.type_set and len(types) < max_types:
                types.append(p)
            elif p in row.allowed or (row.regex is not None and row.regex.match(p)):
                mods.append(p)
            elif p in row.type_set:
                _refuse(opcode, f"too many type suffixes: .{p} after "
                        f"{'.'.join('.' + t for t in types)}")
            else:
                known = sorted(row.allowed)
                extra = f" (or {row.pattern})" if row.pattern else ""
                tys = f"; type suffixes: .{' .'.join(sorted(row.type_set))}" if row.type_set else ""
                _refuse(opcode, f".{p} is not a modifier of {row.op}; expected one of "
                        f"{', '.join('.' + m for m in known) or 'none'}{extra}{tys}")
        self.types = tuple(types)
        self.mods = frozenset(mods)
        self._check_spelling(row, types, mods)
        self.relaxed = row.op in _RELAXED
        vec = [_VEC[m] for m in mods if m in _VEC]
        self.vec = vec[0] if vec else None
        spaces = row.spaces.split()
        self.space = next((m for m in mods if m in spaces), "generic")
        self.roles: list[tuple[str, str | None, bool]] = []
        self.nmin = self.nmax = 0
        for tok in row.roles:
            if tok == "x*":
                self.nmax = 1 << 16
                continue
            opt = tok.endswith("?")
            tok = tok.rstrip("?")
            role, _, ty = tok.partition(":")
            self.roles.append((role.rstrip("v"), self._type(ty), role.endswith("v")))
            self.nmax += 1
            if not opt:
                self.nmin = self.nmax
        keys = (*types, *mods, ".".join(types))
        self.nmin = max([self.nmin] + [row.counts.get(n, 0) for n in keys])
        self.nmax = min([self.nmax] + [row.most[m] for m in mods if m in row.most])
        self.sm = max([row.sm] + [row.bump.get(n, 0) for n in (*types, *mods)])
        self.arch_a = row.arch_a
        self.ptx = tuple(int(x) for x in row.ptx.split("."))
        self.ok_arch: str | None = None
        self.ok_version: str | None = None
        # per operand: the register types it takes (None: any register) and the operand
        # classes it takes without a closer look
        scalar_imm = frozenset({int, float, bool})
        self.fast = []
        for role, ty, vec in self.roles:
            regs = None
            if role in "dsrh" and ty is not None and ty != "*" and not (vec and self.vec):
                regs = frozenset(t for t in ALL_TYPES if compatible(t, ty, self.relaxed))
            elif role in "pq":
                regs = frozenset(t for t in ALL_TYPES if t.is_pred)
            ok = frozenset({str})
            ranged = len(self.fast) in row.imms  # its ints go through refuse for the range
            if role == "x":
                ok = ANY
            elif role == "s" and not (vec and self.vec):
                ok = ok | (scalar_imm - {int, bool} if ranged else scalar_imm)
            elif role == "i":
                ok = ok if ranged else ok | {int}
            elif role == "a" and self.space not in _WIDE_ADDR and row.op not in _SPACE_CHECKED:
                ok = ok | {Addr}
            self.fast.append((regs, ok))

    def _type(self, ty: str) -> str | None:
        t = self.types
        if not ty:
            return None
        if ty == "T":
            return t[-1] if t else None
        if ty == "T0":
            return t[0] if t else None
        if ty == "T1":
            return t[1] if len(t) > 1 else (t[0] if t else None)
        if ty == "W":
            return _double(t[-1]) if t else None
        if ty == "D":
            return (_double(t[-1]) if "wide" in self.mods else t[-1]) if t else None
        return ty

    def _check_spelling(self, row: Row, types: list[str], mods: list[str]) -> None:
        fn = self.fn
        if len(types) not in row.ntypes:
            allowed = ", ".join("." + t for t in sorted(row.type_set))
            if not types:
                _refuse(fn, f"{row.op} needs a type suffix, one of {allowed}")
            want = " or ".join(str(n) for n in row.ntypes)
            _refuse(fn, f"{row.op} takes {want} type suffix(es), got "
                    f"{' '.join('.' + t for t in types)}" + (f" (one of {allowed})" if allowed else ""))
        tset = set(types)
        mset = set(mods)
        for m in mods:
            need = row.allowed.get(m)
            if need is not None and not tset & need:
                _refuse(fn, f".{m} is not valid with {' '.join('.' + t for t in types) or 'no type'}"
                        f" in {row.op}; it takes {', '.join('.' + t for t in sorted(need))}")
            other = row.requires.get(m)
            if other is not None and other not in mset:
                _refuse(fn, f".{m} needs .{other} in {row.op}")
        for names, required, cond in row.groups:
            present = [m for m in mods if m in names]
            if len(present) > 1:
                _refuse(fn, f"{' and '.join('.' + m for m in present)} exclude each other in "
                        f"{row.op}; give at most one")
            if required and not present and (cond is None or tset & cond):
                _refuse(fn, f"{row.op}{''.join('.' + t for t in types)} needs one of "
                        f"{', '.join('.' + m for m in sorted(names))}")

    def check_target(self, trace: Any) -> None:
        """Refuse the form unless ``trace``'s arch and PTX version have it."""
        arch = trace.arch
        m = _ARCH.match(arch)
        sm, suffix = (int(m.group(1)), m.group(2)) if m else (0, "")
        top = self.row.sm_max
        if sm < self.sm or (self.arch_a and not suffix) or (top and sm > top):
            need = (f"sm_{self.sm}{'a' if self.arch_a else ''} exactly" if top == self.sm else
                    f"sm_{self.sm}{'a (an arch-specific target)' if self.arch_a else ' or newer'}")
            raise TraceError(f"{where()}: ptx.inst.{self.fn} needs {need}, but this kernel "
                             f"targets {arch}; choose the target with @kernel(arch=...)")
        version = trace.version
        if version:
            have = tuple(int(x) for x in version.split("."))
            if have < self.ptx:
                raise TraceError(
                    f"{where()}: ptx.inst.{self.fn} needs PTX ISA {self.row.ptx} or newer, but "
                    f"this kernel is written as PTX {version}; raise @kernel(version=...)")
        self.ok_arch, self.ok_version = arch, version

    def check(self, operands: tuple, trace: Any) -> None:
        """Refuse ``operands`` unless they fit this form, and the form unless ``trace``'s
        target has it."""
        if trace.arch is not self.ok_arch or trace.version is not self.ok_version:
            self.check_target(trace)
        if not self.nmin <= len(operands) <= self.nmax:
            self.count_error(len(operands))
        for o, (regs, ok) in zip(operands, self.fast):
            c = type(o)
            if c is Reg and regs is not None:
                if o.type not in regs:
                    self.refuse(operands, o)
            elif c not in ok and ok is not ANY:
                self.refuse(operands, o)

    def refuse(self, operands: tuple, o: Any) -> None:
        """Raise the error for operand ``o`` of ``operands``, which the fast check did not take
        (or return, where a closer look accepts it). ``o`` may fill several positions (one
        register as source and shift amount): each is checked against its own role."""
        for k, x in enumerate(operands[: len(self.roles)]):
            if x is o:
                self._refuse_at(k, o)

    def _refuse_at(self, k: int, o: Any) -> None:
        role, ty, vec = self.roles[k]
        if type(o) is Addr and role == "a":
            self._addr(k, o)
        elif type(o) is Reg and role in "dsrh" and ty is not None and ty != "*":
            if self.vec is not None and vec:
                self._bad(k, role, ty, o, f"a vector of {self.vec} registers "
                          f"[r0, ..., r{self.vec - 1}] (from .v{self.vec}/.x{self.vec})")
            if not compatible(o.type, ty, self.relaxed):
                self._mismatch(k, role, ty, o)
        elif type(o) is not str and role != "x":
            self._other(k, role, ty, vec, o)

    def count_error(self, n: int) -> None:
        """Raise the error for ``n`` operands."""
        names = " ".join(f"{_ROLE_NAMES[r.rstrip('v')]}" + (f":.{t}" if t else "")
                         for r, t, _ in self.roles)
        want = (str(self.nmin) if self.nmin == self.nmax else
                f"{self.nmin} to {self.nmax}" if self.nmax < 1 << 16 else f"at least {self.nmin}")
        _refuse(self.fn, f"takes {want} operands" + (f" ({names})" if names else "") + f", got {n}")

    def _bad(self, k: int, role: str, ty: str | None, o: Any, expected: str) -> None:
        what = _ROLE_NAMES[role.rstrip("v")]
        _refuse(self.fn, f"operand {k + 1} ({what}) must be {expected}, got {_describe(o)}")

    def _mismatch(self, k: int, role: str, ty: str, o: Reg) -> None:
        rule = ("any register of that width" if TYPE_INFO.get(ty, ("",))[0] == "b" else
                f"registers of .{ty}'s kind or .b{TYPE_INFO[ty][1]} of its width")
        what = _ROLE_NAMES[role.rstrip("v")]
        _refuse(self.fn, f"operand {k + 1} ({what}) must be a .{ty} register ({rule}), got "
                f".{o.type.name} register {o.name}; convert it with reg.from_(r, {ty}) or "
                "use the instruction type of the register", TypeMismatchError)

    def _other(self, k: int, role: str, ty: str | None, vec: bool, o: Any) -> None:
        from .control import Label  # control imports this module's caller

        c = type(o)
        r = role.rstrip("v")
        if c is Reg:  # predicate, immediate, address or label roles
            if r in "pq" and o.type.is_pred:
                return
            if r == "a":
                self._bad(k, role, ty, o, "an address: ptx.addr(register, offset) or "
                          "ptx.addr(shared_array)")
            self._bad(k, role, ty, o, {"p": "a predicate register or ~p",
                                       "q": "a predicate register",
                                       "i": "an immediate Python int",
                                       "l": "a label"}.get(r, "an operand"))
        if c is RegArray or c is list or c is tuple:
            if not vec or r not in "ds":
                self._bad(k, role, ty, o, "a single register" if r in "dsr" else
                          "an operand of its role, not a list")
            n = len(o)
            if self.vec is not None and n != self.vec:
                self._bad(k, role, ty, o, f"a vector of {self.vec} registers (from "
                          f".v{self.vec}/.x{self.vec}); got {n}")
            total = 0
            for e in o:
                if type(e) is Reg:
                    if self.vec is not None and ty and not compatible(e.type, ty, self.relaxed):
                        self._mismatch(k, role, ty, e)
                    total += e.type.bits
                elif type(e) is str:
                    total = -1 << 30
                elif r == "d":
                    self._bad(k, role, ty, o, "a vector of registers")
                else:
                    total = -1 << 30
            if self.vec is None:
                if ty not in TYPE_INFO:
                    return
                bits = TYPE_INFO[ty][1]
                if total >= 0 and total != bits:
                    self._bad(k, role, ty, o, f"registers totalling {bits} bits to pack into "
                              f".{ty}, or a single register")
            return
        if c not in _NAMED and c is not Addr and hasattr(o, "__ptx_operand__"):
            if r in "dsrlpq":
                return  # a named register or symbol (pyptx.module.Symbol)
        if r in "dq" or r == "r":
            self._bad(k, role, ty, o, "a register" if r != "q" else "a predicate register")
        if c is Addr:
            if r != "a":
                self._bad(k, role, ty, o, "a register or immediate, not an address "
                          "(ptx.addr(...) is for the memory operand)")
            self._addr(k, o)
            return
        if r == "a":
            self._bad(k, role, ty, o, "an address: ptx.addr(register, offset) or "
                      "ptx.addr(shared_array)")
        if c is int or c is float or c is bool:
            if r == "l":
                self._bad(k, role, ty, o, "a label")
            if r in "si" and self.vec is not None and vec:
                self._bad(k, role, ty, o, f"a vector of {self.vec} registers or values")
            if r == "h" and c is int:
                bits = TYPE_INFO.get(self.types[-1], ("", 0))[1] if self.types else 0
                if bits and not 0 <= o < bits:
                    _refuse(self.fn, f"operand {k + 1} (shift amount) {o} is outside 0..{bits - 1}"
                            f" for .{self.types[-1]}; a shift by the width or more does not "
                            "shift within the value")
            if r == "p" and o not in (0, 1):
                self._bad(k, role, ty, o, "a predicate register, ~p, 0 or 1")
            allowed = self.row.imms.get(k)
            if allowed is not None and o not in allowed:
                _refuse(self.fn, f"operand {k + 1} ({_ROLE_NAMES[r]}) must be "
                        f"{_allowed_text(allowed)}, got {o!r}")
            return
        if c is NotPred:
            if r == "p" or ty == "pred":
                return
            self._bad(k, role, ty, o, "a register or immediate (~p is only for predicates)")
        if c is Label:
            if r != "l":
                self._bad(k, role, ty, o, "a register or immediate, not a label")
            return
        if r in "si" or r == "l" or r == "p":
            if hasattr(o, "__ptx_operand__"):
                return  # a symbol (shared array, parameter): its address as a value
        # anything else: render() refuses what is not an operand at all

    def _addr(self, k: int, a: Addr) -> None:
        base = a.base
        space = self.space
        if type(base) is Reg:
            if space in _WIDE_ADDR and base.type.bits != 64:
                self._bad(k, "a", None, a, f"a 64-bit address for a {space} access "
                          f"(ptx.addr of a u64 register)")
        elif type(base) is SharedArray:
            if not (space.startswith("shared") or space == "generic"):
                self._bad(k, "a", None, a, f"a .{space} address; {base.name} is a shared "
                          "array (use .shared)")
        elif type(base) in _PARAMS and not space.startswith("param") \
                and self.row.op in _SPACE_CHECKED:
            self._bad(k, "a", None, a, f"a .{space} address; {base.name} is a kernel parameter, "
                      f"read with ld.param (its global pointer: ptx.global_ptrs({base.name}))")


def _allowed_text(allowed: range | tuple) -> str:
    if type(allowed) is range:
        step = f", a multiple of {allowed.step}" if allowed.step > 1 else ""
        return f"an int in {allowed.start}..{allowed[-1]}{step}"
    return "one of " + ", ".join(map(str, allowed))


def _describe(o: Any) -> str:
    c = type(o)
    if c is Reg:
        return f".{o.type.name} register {o.name}"
    if c is RegArray:
        return f"a register array of {len(o)} .{o.type.name}"
    if c is list or c is tuple:
        return f"a list of {len(o)}"
    if c is Addr:
        return f"the address ptx.addr({_describe(o.base) if type(o.base) is Reg else o.base!r}, {o.offset})"
    if c in (int, float, bool):
        return f"the immediate {o!r}"
    return f"{c.__name__} {o!r}"
