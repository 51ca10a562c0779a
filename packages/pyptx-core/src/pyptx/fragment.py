"""Accumulator fragments: the registers of a wgmma accumulator and the (row, col) each holds.

A warpgroup's ``m64 x n`` f32 accumulator is spread over its 128 threads, ``n / 2``
registers each. Thread ``t`` (warp ``w = t // 32``, lane ``l = t % 32``) holds, in
register ``i``,

    row = 16*w + l//4 + 8*((i//2) % 2)
    col = 8*(i//4) + 2*(l%4) + i%2

so registers ``2j`` and ``2j+1`` are two adjacent columns of one row (a natural pair for
a packed bf16x2 store), and registers ``4q..4q+3`` cover rows ``r`` and ``r+8`` of the
8-column block ``q``. ``Accumulator.coord(i)`` gives the constant part ``(8*((i//2)%2),
8*(i//4) + i%2)``; ``thread_origin()`` emits the per-thread part.
"""

from __future__ import annotations

from collections.abc import Iterator

from .errors import OperandError
from .reg import Reg, RegArray, array
from .source import where
from .trace import current
from .types import PtxType, f32, u32

__all__ = ["Accumulator", "accumulator_coord"]


def accumulator_coord(i: int, warp: int, lane: int) -> tuple[int, int]:
    """The (row, col) of register ``i`` of thread (``warp``, ``lane``) in an m64 f32 fragment."""
    return 16 * warp + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2


class Accumulator:
    """A warpgroup's ``64 x n`` wgmma accumulator: ``n / 2`` f32 registers per thread.

    Made inside a kernel body: ``acc = Accumulator(n)``. ``acc.regs`` is the register
    array to pass to ``ptx.wgmma.mma_async``; ``acc[i]`` is one register and
    ``acc[i] = v`` assigns it.
    """

    __slots__ = ("n", "m", "dtype", "regs")

    def __init__(self, n: int, dtype: PtxType = f32, *, m: int = 64) -> None:
        at = where()
        if m != 64:
            raise OperandError(f"{at}: Accumulator m must be 64 (wgmma is m64nNkK), got {m!r}")
        if isinstance(n, bool) or not isinstance(n, int) or not 8 <= n <= 256 or n % 8:
            raise OperandError(f"{at}: Accumulator n must be a multiple of 8 in 8..256, got {n!r}")
        if not isinstance(dtype, PtxType) or dtype.name not in ("f32", "s32"):
            raise OperandError(f"{at}: Accumulator dtype must be f32 or s32, got {dtype!r}")
        self.n, self.m, self.dtype = n, m, dtype
        self.regs: RegArray = array(dtype, n // 2)

    def __len__(self) -> int:
        return len(self.regs)

    def __getitem__(self, i: int) -> Reg:
        return self.regs[i]

    def __setitem__(self, i: int, value: Reg | int | float) -> None:
        r = self.regs[i]
        if value is r:
            return
        trace = current()
        if type(value) is Reg:
            if value.type.bits != r.type.bits:
                raise OperandError(f"{where()}: accumulator register {i} is .{r.type.name}, got "
                                   f".{value.type.name} register {value.name}")
            trace.inst(f"mov.b{r.type.bits}", (r.name, value.name))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            from . import imm
            trace.inst(f"mov.{r.type.name}", (r.name, imm.encode(value, r.type)))
        else:
            raise OperandError(f"{where()}: accumulator values are registers or numbers, got {value!r}")

    def __iter__(self) -> Iterator[Reg]:
        return iter(self.regs)

    @staticmethod
    def coord(i: int) -> tuple[int, int]:
        """The (row, col) of register ``i`` relative to the thread's origin."""
        return 8 * ((i // 2) % 2), 8 * (i // 4) + i % 2

    def pairs(self) -> Iterator[tuple[int, int, int]]:
        """``(i, row, col)`` of each register pair ``(i, i+1)``: two adjacent columns of a row."""
        for i in range(0, len(self.regs), 2):
            r, c = self.coord(i)
            yield i, r, c

    def thread_origin(self, tid_in_warpgroup: Reg) -> tuple[Reg, Reg]:
        """``(row, col)`` registers of this thread's origin: ``16*w + l//4`` and ``2*(l%4)``
        for ``t = tid_in_warpgroup`` (0..127). Emits six instructions."""
        trace = current()
        if type(tid_in_warpgroup) is not Reg or not tid_in_warpgroup.type.is_int:
            raise OperandError(f"{where()}: thread_origin expects the thread's index in its "
                               f"warpgroup as an integer register, got {tid_in_warpgroup!r}")
        t = tid_in_warpgroup.name
        row = Reg(trace.new_reg_name(u32), u32, trace)
        col = Reg(trace.new_reg_name(u32), u32, trace)
        tmp = Reg(trace.new_reg_name(u32), u32, trace)
        trace.inst("shr.u32", (tmp.name, t, "5"))           # warp
        trace.inst("shl.b32", (tmp.name, tmp.name, "4"))    # 16 * warp
        trace.inst("bfe.u32", (row.name, t, "2", "3"))      # (t % 32) // 4
        trace.inst("add.u32", (row.name, row.name, tmp.name))
        trace.inst("bfe.u32", (col.name, t, "0", "2"))
        trace.inst("shl.b32", (col.name, col.name, "1"))
        return row, col

    def zero(self) -> None:
        """``mov.f32 r, 0f00000000`` into every register."""
        trace = current()
        z = "0f00000000" if self.dtype is f32 else "0"
        for r in self.regs:
            trace.inst(f"mov.{self.dtype.name}", (r.name, z))

    def __repr__(self) -> str:
        return f"Accumulator(64x{self.n} .{self.dtype.name})"
