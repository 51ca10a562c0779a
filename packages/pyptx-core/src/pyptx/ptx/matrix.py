"""``ptx.ldmatrix`` / ``ptx.stmatrix``: warp-wide 8x8 b16 matrix moves between shared
memory and registers (the fragment layout of ``mma.sync``).

Each of the ``num`` (1, 2 or 4) 8x8 matrices has 8 rows of 16 bytes; threads
``8*j .. 8*j+7`` give the row addresses of matrix ``j`` (16-byte aligned), and
every thread holds one 32-bit register (two b16 values) of each matrix:
thread ``t`` gets row ``t // 4``, columns ``2*(t % 4)`` and ``2*(t % 4) + 1``
(``trans=True``: the matrix is transposed on the way). The whole warp must
execute them together (``.sync.aligned``).
"""

from __future__ import annotations

from typing import Any

from ..errors import OperandError, TypeMismatchError
from ..reg import Reg, RegArray, render
from ..source import where
from ..trace import Trace, current
from ._operands import check_bool, guard, reg_list, require_arch, shared_addr

__all__ = ["ldmatrix", "stmatrix"]

ROW_BYTES = 16
"""Bytes of one matrix row, and the alignment of every row address."""


def _regs(value: Any, name: str, fn: str, num: Any) -> list[Reg]:
    regs = reg_list(value, name, fn)
    if num is not None and (isinstance(num, bool) or num not in (1, 2, 4)):
        raise OperandError(f"{where(3)}: {fn} num must be 1, 2 or 4, got {num!r}")
    if len(regs) not in (1, 2, 4) or (num is not None and len(regs) != num):
        want = f"{num}" if num is not None else "1, 2 or 4"
        raise OperandError(f"{where(3)}: {fn} {name} must hold {want} 32-bit registers (one per "
                           f"8x8 matrix), got {len(regs)}")
    decl = regs[0].type.reg_decl
    for i, r in enumerate(regs):
        if r.type.bits != 32 or r.type.is_pred:
            raise TypeMismatchError(f"{where(3)}: {fn} {name}[{i}] must be a 32-bit register "
                                    f"(two b16 values), got .{r.type.name} register {r.name}")
        if r.type.reg_decl != decl:
            raise TypeMismatchError(f"{where(3)}: {fn} {name} registers must all have one type "
                                    f"(ptxas refuses mixed vectors); {name}[0] is "
                                    f".{regs[0].type.name}, {name}[{i}] is .{r.type.name}")
    return regs


def _opcode(op: str, n: int, trans: Any, fn: str) -> str:
    t = ".trans" if check_bool(trans, "trans", fn) else ""
    return f"{op}.sync.aligned.m8n8.x{n}{t}.shared.b16"


def _vector(regs: list[Reg], trace: Trace) -> str:
    return render(regs, None, trace)


def ldmatrix(dst_regs: RegArray | list[Reg], addr: Any, *, num: int | None = None,
             trans: bool = False, pred: Any = None) -> RegArray | list[Reg]:
    """``ldmatrix.sync.aligned.m8n8.x{num}{.trans}.shared.b16 {d..}, [addr];`` (sm_75).

    ``dst_regs``: ``num`` 32-bit registers of one type (``reg.array(b32, 4)``); ``num``
    defaults to their count. ``addr``: this thread's row address in shared memory (a
    shared array, ``ptx.addr(...)`` or a u32 register), 16-byte aligned. Returns
    ``dst_regs``. ``pred=p`` guards it (the warp must agree).
    """
    fn = "ptx.ldmatrix"
    trace = current()
    require_arch(trace, fn, 75)
    regs = _regs(dst_regs, "dst_regs", fn, num)
    opcode = _opcode("ldmatrix", len(regs), trans, fn)
    a = shared_addr(addr, "addr", fn, trace, align=ROW_BYTES, size=ROW_BYTES)
    trace.inst(opcode, (_vector(regs, trace), a), guard(pred, fn, trace))
    return dst_regs


def stmatrix(addr: Any, src_regs: RegArray | list[Reg], *, num: int | None = None,
             trans: bool = False, pred: Any = None) -> None:
    """``stmatrix.sync.aligned.m8n8.x{num}{.trans}.shared.b16 [addr], {s..};`` (sm_90).

    The inverse of ``ldmatrix``: ``src_regs`` (``num`` 32-bit registers of one type) are
    written as ``num`` 8x8 b16 matrices to the rows whose addresses threads give in
    ``addr`` (16-byte aligned). ``pred=p`` guards it.
    """
    fn = "ptx.stmatrix"
    trace = current()
    require_arch(trace, fn, 90)
    regs = _regs(src_regs, "src_regs", fn, num)
    opcode = _opcode("stmatrix", len(regs), trans, fn)
    a = shared_addr(addr, "addr", fn, trace, align=ROW_BYTES, size=ROW_BYTES)
    trace.inst(opcode, (a, _vector(regs, trace)), guard(pred, fn, trace))
