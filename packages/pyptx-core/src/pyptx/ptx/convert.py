"""Packed half-precision conversions: two f32 values to one bf16x2 / f16x2 register and back.

PTX's ``cvt.rn.bf16x2.f32 d, a, b`` puts its *first* source ``a`` in the upper
16 bits of ``d`` and ``b`` in the lower. These helpers take the halves by name
instead: ``lo`` is element 0 (bits 0-15, the lower address when the register is
stored), ``hi`` element 1, so ``pack_bf16x2(x[0], x[1])`` stored with one
``st.b32`` writes ``x[0], x[1]`` in order. They emit ``cvt.rn.bf16x2.f32 d, hi, lo;``.
"""

from __future__ import annotations

from typing import Any

from ..errors import OperandError, TypeMismatchError
from ..reg import Reg, render
from ..source import where
from ..trace import Trace, current
from ..types import PtxType, bf16x2, f16, f16x2, f32
from ._operands import check_bool, guard, require_arch

__all__ = ["pack_bf16x2", "pack_f16x2", "unpack_bf16x2", "unpack_f16x2"]


def _f32(value: Any, name: str, fn: str, trace: Trace) -> str:
    if type(value) is not Reg:
        raise OperandError(f"{where(3)}: {fn} {name} must be an f32 register, got {value!r}")
    if value.type is not f32:
        raise TypeMismatchError(f"{where(3)}: {fn} {name} must be an f32 register, got "
                                f".{value.type.name} register {value.name}")
    return render(value, None, trace)


def _pack(t: PtxType, lo: Any, hi: Any, relu: Any, pred: Any, fn: str) -> Reg:
    trace = current()
    require_arch(trace, fn, 80)
    h = _f32(hi, "hi", fn, trace)
    lw = _f32(lo, "lo", fn, trace)
    r = ".relu" if check_bool(relu, "relu", fn) else ""
    g = guard(pred, fn, trace)
    d = Reg(trace.new_reg_name(t), t, trace)
    trace.inst(f"cvt.rn{r}.{t.name}.f32", (d.name, h, lw), g)
    return d


def pack_bf16x2(lo: Reg, hi: Reg, *, relu: bool = False, pred: Any = None) -> Reg:
    """A bf16x2 register holding ``(lo, hi)`` rounded to nearest: ``cvt.rn.bf16x2.f32 d, hi, lo;``.

    ``lo``/``hi`` are f32 registers (``lo`` lands in bits 0-15); ``relu=True`` clamps
    negatives to 0 (``cvt.rn.relu``). sm_80.
    """
    return _pack(bf16x2, lo, hi, relu, pred, "ptx.pack_bf16x2")


def pack_f16x2(lo: Reg, hi: Reg, *, relu: bool = False, pred: Any = None) -> Reg:
    """An f16x2 register holding ``(lo, hi)`` rounded to nearest: ``cvt.rn.f16x2.f32 d, hi, lo;``.

    Same operand convention as ``pack_bf16x2``. sm_80.
    """
    return _pack(f16x2, lo, hi, relu, pred, "ptx.pack_f16x2")


def _packed(value: Any, fn: str, trace: Trace) -> str:
    if type(value) is not Reg:
        raise OperandError(f"{where(3)}: {fn} expects a 32-bit register holding two halves, got {value!r}")
    t = value.type
    if t.bits != 32 or t.is_pred or t is f32:
        raise TypeMismatchError(f"{where(3)}: {fn} expects a 32-bit packed register (bf16x2, f16x2 "
                                f"or b32), got .{t.name} register {value.name}")
    return render(value, None, trace)


def unpack_bf16x2(packed: Reg, *, pred: Any = None) -> tuple[Reg, Reg]:
    """``(lo, hi)`` f32 registers from a bf16x2 register; exact (bf16 is an f32 prefix).

    Emits ``shl.b32 lo, packed, 16;`` and ``and.b32 hi, packed, 0xFFFF0000;`` (no
    conversion instruction, any arch).
    """
    fn = "ptx.unpack_bf16x2"
    trace = current()
    src = _packed(packed, fn, trace)
    g = guard(pred, fn, trace)
    lo = Reg(trace.new_reg_name(f32), f32, trace)
    hi = Reg(trace.new_reg_name(f32), f32, trace)
    trace.inst("shl.b32", (lo.name, src, "16"), g)
    trace.inst("and.b32", (hi.name, src, "0xFFFF0000"), g)
    return lo, hi


def unpack_f16x2(packed: Reg, *, pred: Any = None) -> tuple[Reg, Reg]:
    """``(lo, hi)`` f32 registers from an f16x2 register (exact).

    Emits ``mov.b32 {l, h}, packed;``, ``cvt.f32.f16 lo, l;``, ``cvt.f32.f16 hi, h;``.
    """
    fn = "ptx.unpack_f16x2"
    trace = current()
    src = _packed(packed, fn, trace)
    g = guard(pred, fn, trace)
    lh, hh = (Reg(n, f16, trace) for n in trace.new_reg_names(f16, 2))
    lo = Reg(trace.new_reg_name(f32), f32, trace)
    hi = Reg(trace.new_reg_name(f32), f32, trace)
    trace.inst("mov.b32", (f"{{{lh.name}, {hh.name}}}", src), g)
    trace.inst("cvt.f32.f16", (lo.name, lh.name), g)
    trace.inst("cvt.f32.f16", (hi.name, hh.name), g)
    return lo, hi
