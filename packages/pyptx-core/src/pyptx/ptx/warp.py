"""Warp-level helpers: butterfly-shuffle reductions that leave the result in every lane."""

from __future__ import annotations

from typing import Any

from ..errors import OperandError, TypeMismatchError
from ..reg import Reg
from ..source import where
from ..trace import current
from ..types import pred as _pred
from ._operands import guard, require_arch

_OPS = {"sum": "add", "max": "max", "min": "min"}


def _reduce(kind: str, value: Reg, width: int, mask: int) -> Reg:
    trace = current()
    if type(value) is not Reg:
        raise OperandError(f"{where(3)}: warp.reduce_{kind} expects a register, got {value!r}")
    t = value.type
    if t.bits != 32 or not (t.is_float or t.kind in ("u", "s")):
        raise OperandError(
            f"{where(3)}: warp.reduce_{kind} needs a 32-bit f32/u32/s32 register, got "
            f".{t.name} {value.name}"
        )
    if t.name not in ("f32", "u32", "s32"):
        raise OperandError(f"{where(3)}: warp.reduce_{kind} does not support .{t.name}")
    if width not in (2, 4, 8, 16, 32):
        raise OperandError(f"{where(3)}: warp reduction width must be 2, 4, 8, 16 or 32, got {width!r}")
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 < mask <= 0xFFFFFFFF:
        raise OperandError(f"{where(3)}: member mask must be a nonzero 32-bit int, got {mask!r}")
    if value.trace is not trace:
        raise OperandError(f"{where(3)}: register {value.name} belongs to another kernel")
    tmp = Reg(trace.new_reg_name(t), t, trace)
    op = _OPS[kind]
    m = f"0x{mask:08x}"
    clamp = f"0x{((32 - width) << 8) | 0x1F:x}"
    off = width // 2
    while off:
        trace.inst("shfl.sync.bfly.b32", (tmp.name, value.name, str(off), clamp, m))
        trace.inst(f"{op}.{t.name}", (value.name, value.name, tmp.name))
        off //= 2
    return value


def reduce_sum(value: Reg, *, width: int = 32, mask: int = 0xFFFFFFFF) -> Reg:
    """Sum ``value`` across ``width`` lanes in place (every lane gets the total); returns it."""
    return _reduce("sum", value, width, mask)


def reduce_max(value: Reg, *, width: int = 32, mask: int = 0xFFFFFFFF) -> Reg:
    """Maximum of ``value`` across ``width`` lanes, in place; returns it."""
    return _reduce("max", value, width, mask)


def reduce_min(value: Reg, *, width: int = 32, mask: int = 0xFFFFFFFF) -> Reg:
    """Minimum of ``value`` across ``width`` lanes, in place; returns it."""
    return _reduce("min", value, width, mask)


def elect_sync(mask: int | Reg = 0xFFFFFFFF, *, pred: Any = None) -> Reg:
    """``elect.sync _|p, mask;``: a predicate true in exactly one active lane of ``mask``.

    ``mask`` is a nonzero 32-bit int or a u32 register; returns the predicate. sm_90.
    ``pred=`` guards the instruction (the result is undefined where the guard is false).
    """
    trace = current()
    require_arch(trace, "elect_sync")
    g = guard(pred, "elect_sync", trace)
    if type(mask) is Reg:
        if not (mask.type.is_int and mask.type.bits == 32):
            raise TypeMismatchError(
                f"{where()}: elect_sync mask must be a 32-bit integer register or int, got "
                f".{mask.type.name} register {mask.name}"
            )
        if mask.trace is not trace:
            raise OperandError(f"{where()}: register {mask.name} belongs to another kernel")
        m = mask.name
    elif isinstance(mask, bool) or not isinstance(mask, int) or not 0 < mask <= 0xFFFFFFFF:
        raise OperandError(f"{where()}: elect_sync mask must be a nonzero 32-bit int, got {mask!r}")
    else:
        m = f"0x{mask:08x}"
    p = Reg(trace.new_reg_name(_pred), _pred, trace)
    trace.inst("elect.sync", ("_|" + p.name, m), g)
    return p
