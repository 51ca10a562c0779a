"""``ptx.inst.<opcode>.<modifiers...>(operands, pred=p)``: build any PTX instruction.

Attribute names map to PTX spelling: a trailing ``_`` is dropped (``global_``,
``and_``, ``async_``), a leading ``_`` before a digit is dropped (``_2d``), and
``__`` becomes ``::`` (``shared__cta``). ``ptx.inst("cp.async.bulk.tensor.2d...")``
takes the spelling as one string.
"""

from __future__ import annotations

from typing import Any

from ..errors import OperandError
from ..ir import Instruction
from ..reg import NotPred, Reg, render
from ..source import user_site, where
from ..trace import current
from ..types import _BY_NAME, PtxType
from ._check import ANY, Form
from ._divergence import cta_barrier_operands, refuse_divergent_cta_barrier
from .warpgroup import require_register_budget

OPCODES = frozenset("""
abs activemask add addc alloca and applypriority atom bar barrier bfe bfi bfind bmsk
bra brev brkpt brx call clz cnot copysign cos cp cp.async createpolicy cvt cvta discard
div dp2a dp4a elect ex2 exit fence fma fns getctarank griddepcontrol isspacep istypep ld
ldmatrix ldu lg2 lop3 mad mad24 madc mapa match max mbarrier membar min mma mov movmatrix
mul mul24 multimem nanosleep neg not or pmevent popc prefetch prefetchu prmt rcp red
redux rem ret rsqrt sad selp set setmaxnreg setp shf shfl shl shr sin slct sqrt st
stackrestore stacksave stmatrix sub subc suld suq sured sust szext tanh testp tex tld4
trap txq vabsdiff vabsdiff2 vabsdiff4 vadd vadd2 vadd4 vavrg2 vavrg4 vmad vmax vmax2
vmax4 vmin vmin2 vmin4 vote vset vset2 vset4 vshl vshr vsub vsub2 vsub4 wgmma wmma xor
tensormap tcgen05 clusterlaunchcontrol st.async red.async cp.reduce.async.bulk
""".split())
"""The PTX opcodes ``ptx.inst`` accepts as the first part of a spelling."""


def ptx_spelling(name: str) -> str:
    """Map a Python attribute name to its PTX modifier spelling."""
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    if name.startswith("_") and len(name) > 1 and name[1].isdigit():
        name = name[1:]
    return name.replace("__", "::")


def _pred_text(p: Any) -> str:
    if type(p) is Reg and p.type.is_pred:
        return render(p, None, current())  # raises outside a trace or for another kernel's reg
    if type(p) is NotPred:
        return "!" + render(p.reg, None, current())
    raise OperandError(f"{where(3)}: pred= expects a predicate register or ~p, got {p!r}")


class Instr:
    """A partly spelled instruction; attribute access appends a modifier, a call emits it."""

    __slots__ = ("opcode", "type", "_children", "_form", "_kernel_rule")

    def __init__(self, opcode: str) -> None:
        self.opcode = opcode
        self.type: PtxType | None = None
        # mma-family immediates (scale, transpose flags) are plain ints, not the operand type
        parts = () if opcode.split(".")[0] in ("wgmma", "mma", "wmma", "tcgen05") else opcode.split(".")
        for part in reversed(parts):
            t = _BY_NAME.get(part)
            if t is not None:
                self.type = t
                break
        self._children: dict[str, Instr] = {}
        self._form: Form | None = None
        #: operands of this spelling when it waits for the whole CTA, -1 for setmaxnreg (which
        #: needs the kernel's register budget), None for every other instruction
        self._kernel_rule = -1 if opcode.startswith("setmaxnreg") else cta_barrier_operands(opcode)

    def __getattr__(self, name: str) -> Instr:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        child = self._children.get(name)
        if child is None:
            child = self._children[name] = Instr(f"{self.opcode}.{ptx_spelling(name)}")
        return child

    def __call__(self, *operands: Any, pred: Any = None) -> None:
        """Emit ``[@pred] opcode operands;`` into the active trace, after checking the
        spelling, the operands and the kernel's target against ``pyptx.ptx._isa``."""
        trace = current()
        form = self._form
        if form is None:
            form = Form(self.opcode)
            self._form = form
        # Form.check, inlined: this runs once per instruction traced
        if trace.arch is not form.ok_arch or trace.version is not form.ok_version:
            form.check_target(trace)
        if not form.nmin <= len(operands) <= form.nmax:
            form.count_error(len(operands))
        for o, (regs, ok) in zip(operands, form.fast):
            if type(o) is Reg and regs is not None:
                if o.type not in regs:
                    form.refuse(operands, o)
            elif type(o) not in ok and ok is not ANY:
                form.refuse(operands, o)
        t = self.type
        if t is not None and t.kind == "s":  # masks such as 0xFFFFFFFF in redux.sync.min.s32
            t = _BY_NAME[f"u{t.bits}"]  # same text; accepts the full bit-pattern range
        ops = tuple([render(o, t, trace) for o in operands])
        p = _pred_text(pred) if pred is not None else None
        if self._kernel_rule is not None:
            if self._kernel_rule < 0:
                require_register_budget(trace, f"ptx.inst.{self.opcode}")
            elif len(ops) <= self._kernel_rule:
                refuse_divergent_cta_barrier(trace, f"ptx.inst.{self.opcode}", p)
        trace.body.append(Instruction(self.opcode, ops, p, user_site(2)))

    def __repr__(self) -> str:
        return f"ptx.inst.{self.opcode}"


class _Root:
    """The ``ptx.inst`` namespace."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[str, Instr] = {}

    def __getattr__(self, name: str) -> Instr:
        hit = self._cache.get(name)
        if hit is not None:
            return hit
        if name.startswith("__"):
            raise AttributeError(name)
        return self(ptx_spelling(name), _skip=3)

    def __call__(self, opcode: str, *, _skip: int = 2) -> Instr:
        """The instruction spelled ``opcode`` (e.g. ``"cp.async.bulk.tensor.2d.global.shared::cta"``)."""
        hit = self._cache.get(opcode)
        if hit is not None:
            return hit
        if not isinstance(opcode, str) or not opcode:
            raise OperandError(f"{where(_skip)}: ptx.inst expects an opcode string, got {opcode!r}")
        head = opcode.split(".")[0]
        if head not in OPCODES:
            raise OperandError(
                f"{where(_skip)}: {head!r} is not a PTX opcode (from ptx.inst.{opcode}); "
                "see the PTX ISA instruction list"
            )
        hit = self._cache[opcode] = Instr(opcode)
        return hit

    def __repr__(self) -> str:
        return "ptx.inst"


inst = _Root()
"""Any PTX instruction: ``ptx.inst.<opcode>.<modifiers>(operands, pred=p)`` or
``ptx.inst("opcode.with.modifiers")(operands)``."""
