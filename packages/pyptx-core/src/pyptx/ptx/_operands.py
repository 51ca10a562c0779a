"""Operand checks shared by the named helpers (mbarrier, tma, wgmma, cluster, matrix, ...).

Each check validates one operand at trace time and returns its rendered PTX
text, or raises ``OperandError`` / ``TypeMismatchError`` whose message starts
with the user's ``file:line``. ``fn`` is the helper's public name, used in
messages (``"ptx.mbarrier.init"``). ``guard`` renders a helper's ``pred=``
argument and ``require_arch`` refuses a helper the kernel's target lacks.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import OperandError, TraceError, TypeMismatchError
from ..reg import NotPred, Reg, RegArray, render
from ..smem import SharedArray
from ..source import where
from ..trace import Trace
from .memory import Addr

_ARCH = re.compile(r"^sm_(\d+)([af]?)$")
_ARCH_CACHE: dict[str, tuple[int, str]] = {}


def _arch_parts(arch: str) -> tuple[int, str]:
    hit = _ARCH_CACHE.get(arch)
    if hit is None:
        m = _ARCH.match(arch)
        hit = _ARCH_CACHE[arch] = (int(m.group(1)), m.group(2)) if m else (0, "")
    return hit


def require_arch(trace: Trace, fn: str, min_sm: int = 90, *, arch_specific: bool = False,
                 max_sm: int | None = None) -> None:
    """Refuse ``fn`` unless the traced kernel's arch has it (``TraceError`` naming the arch).

    ``min_sm``/``max_sm`` bound the SM version; ``arch_specific=True`` also needs the
    ``a`` (or family ``f``) suffix, as for ``wgmma`` and ``setmaxnreg`` on ``sm_90a``.
    """
    sm, suffix = _arch_parts(trace.arch)
    if sm >= min_sm and (max_sm is None or sm <= max_sm) and (not arch_specific or suffix):
        return
    if max_sm == min_sm:
        need = f"sm_{min_sm}{'a' if arch_specific else ''}"
    elif arch_specific:
        need = f"sm_{min_sm}a or a newer arch-specific target (an 'a' suffix)"
    else:
        need = f"sm_{min_sm} or newer"
    raise TraceError(
        f"{where()}: {fn} needs {need}, but this kernel targets {trace.arch}; "
        f"choose the target with @kernel(arch=...)"
    )


def guard(pred: Any, fn: str, trace: Trace) -> str | None:
    """The guard text of a helper's ``pred=`` argument: ``"%p1"``, ``"!%p1"`` or None."""
    if pred is None:
        return None
    if type(pred) is Reg:
        if not pred.type.is_pred:
            raise TypeMismatchError(
                f"{where()}: {fn} pred= must be a predicate register or ~p, got "
                f".{pred.type.name} register {pred.name}"
            )
        return render(pred, None, trace)
    if type(pred) is NotPred:
        return "!" + render(pred.reg, None, trace)
    raise OperandError(f"{where()}: {fn} pred= must be a predicate register or ~p, got {pred!r}")


def is_int(value: Any) -> bool:
    """A Python int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_bool(value: Any, name: str, fn: str) -> bool:
    """``value`` must be True or False."""
    if not isinstance(value, bool):
        raise OperandError(f"{where()}: {fn} {name} must be True or False, got {value!r}")
    return value


def int_in(value: Any, name: str, fn: str, lo: int, hi: int, extra: str = "") -> int:
    """A Python int in ``lo..hi`` (inclusive)."""
    if not is_int(value) or not lo <= value <= hi:
        raise OperandError(
            f"{where()}: {fn} {name} must be an int in {lo}..{hi}{extra}, got {value!r}"
        )
    return value


def reg_of(value: Any, name: str, fn: str, bits: tuple[int, ...], what: str) -> Reg:
    """``value`` must be an integer register of one of the widths ``bits``."""
    t = value.type
    if not t.is_int or t.bits not in bits:
        raise TypeMismatchError(
            f"{where()}: {fn} {name} must be {what}, got .{t.name} register {value.name}"
        )
    return value


def u32_or_imm(value: Any, name: str, fn: str, trace: Trace, lo: int = 0,
               hi: int = 0xFFFFFFFF, extra: str = "") -> str:
    """A 32-bit integer register or a Python int in ``lo..hi``; rendered."""
    if type(value) is Reg:
        reg_of(value, name, fn, (32,), "a 32-bit integer register (u32/s32/b32) or an int")
        return render(value, None, trace)
    if is_int(value):
        int_in(value, name, fn, lo, hi, extra)
        return str(value)
    raise OperandError(
        f"{where()}: {fn} {name} must be a 32-bit integer register or an int, got {value!r}"
    )


def predicate(value: Any, name: str, fn: str, trace: Trace) -> str:
    """A predicate register, ``~p``, or the constants 0/1 (True/False); rendered."""
    if type(value) is Reg:
        if not value.type.is_pred:
            raise TypeMismatchError(
                f"{where()}: {fn} {name} must be a predicate register, ~p, 0 or 1, got "
                f".{value.type.name} register {value.name}"
            )
        return render(value, None, trace)
    if type(value) is NotPred:
        return render(value, None, trace)
    if isinstance(value, (bool, int)) and value in (0, 1):
        return str(int(value))
    raise OperandError(f"{where()}: {fn} {name} must be a predicate register, ~p, 0 or 1, got {value!r}")


def _shared_base_check(arr: SharedArray, offset: int, size: int, align: int, name: str,
                       fn: str) -> None:
    if arr.align < align:
        raise OperandError(
            f"{where()}: {fn} {name} needs {align}-byte aligned shared memory; "
            f"{arr.name} is declared with align={arr.align} (smem.alloc(..., align={align}))"
        )
    if offset % align:
        raise OperandError(
            f"{where()}: {fn} {name} offset {offset} into {arr.name} is not a multiple of {align} bytes"
        )
    n = arr.nbytes
    if n is not None and not 0 <= offset <= n - size:
        raise OperandError(
            f"{where()}: {fn} {name} offset {offset} (+{size} bytes) is outside {arr.name} "
            f"({n} bytes)"
        )


def shared_addr(value: Any, name: str, fn: str, trace: Trace, *, align: int, size: int = 0) -> str:
    """A shared-memory address operand ``[...]``.

    Accepts a ``SharedArray``, ``ptx.addr(shared_array_or_reg, offset)`` or a 32/64-bit
    integer register holding a shared-window address. For arrays the declared
    alignment and the offset are checked against ``align`` bytes, and ``size``
    bytes must fit inside the array.
    """
    if type(value) is SharedArray:
        _shared_base_check(value, 0, size, align, name, fn)
        return f"[{render(value, None, trace)}]"
    if type(value) is Addr:
        base = value.base
        if type(base) is SharedArray:
            _shared_base_check(base, value.offset, size, align, name, fn)
        elif type(base) is Reg:
            if value.offset % align:
                raise OperandError(
                    f"{where()}: {fn} {name} offset {value.offset} is not a multiple of {align} bytes"
                )
        else:
            raise OperandError(
                f"{where()}: {fn} {name} must address shared memory (a shared array or a "
                f"register), got ptx.addr({base!r}, {value.offset})"
            )
        return render(value, None, trace)
    if type(value) is Reg:
        reg_of(value, name, fn, (32, 64), "a 32/64-bit integer register holding a shared address")
        return f"[{render(value, None, trace)}]"
    raise OperandError(
        f"{where()}: {fn} {name} must be a shared array, ptx.addr(...) of one, or a u32 shared "
        f"address register, got {value!r}"
    )


def global_addr(value: Any, name: str, fn: str, trace: Trace) -> str:
    """A global-memory address operand ``[...]``: a 64-bit register or ``ptx.addr(reg64, off)``."""
    if type(value) is Reg:
        reg_of(value, name, fn, (64,), "a 64-bit global address register (u64/b64)")
        return f"[{render(value, None, trace)}]"
    if type(value) is Addr and type(value.base) is Reg:
        reg_of(value.base, name, fn, (64,), "a 64-bit global address register (u64/b64)")
        return render(value, None, trace)
    raise OperandError(
        f"{where()}: {fn} {name} must be a u64 global address register (see ptx.global_ptrs) "
        f"or ptx.addr(reg, offset), got {value!r}"
    )


def reg_list(value: Any, name: str, fn: str) -> list[Reg]:
    """A ``RegArray`` or a list/tuple of registers."""
    if type(value) is RegArray:
        return list(value.regs)
    if isinstance(value, (list, tuple)) and all(type(v) is Reg for v in value):
        return list(value)
    raise OperandError(
        f"{where()}: {fn} {name} must be a register array (reg.array) or a list of registers, "
        f"got {value!r}"
    )
