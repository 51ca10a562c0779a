"""Swizzled shared-memory tiles of 16-bit elements for the Ampere kernels, and the per-thread
pieces that fill and read them: ``TileCopy`` (a thread's ``cp.async`` share of a tile, zero
fill past the matrix's edges) and ``Fragments`` (``ldmatrix`` loads of ``mma.sync``
m16n8k16 operands).

A tile is ``rows`` rows of ``cols`` 16-bit elements, each row ``cols / 8`` 16-byte chunks.
Chunk ``c`` of row ``r`` lies at ``r * row_bytes + (c ^ s(r)) * 16``: ``s(r) = r & 7`` for
rows of 128 bytes or more, ``(r >> 1) & 3`` for 64-byte rows. The 8 rows one ``ldmatrix``
phase reads at one column then hit 8 different bank groups, and so do the 16-byte copies.
"""

from __future__ import annotations

import dataclasses

from pyptx import ptx, reg
from pyptx.types import b32, u32, u64


@dataclasses.dataclass(frozen=True)
class SmemTile:
    """A ``rows x cols`` tile of 16-bit elements in shared memory (swizzle: module doc)."""

    rows: int
    cols: int

    def __post_init__(self):
        if self.cols % 32 or (self.row_bytes != 64 and self.row_bytes % 128) or self.rows % 8:
            raise ValueError(f"unsupported tile {self.rows}x{self.cols}")

    @property
    def row_bytes(self) -> int:
        """Bytes of one row."""
        return 2 * self.cols

    @property
    def nbytes(self) -> int:
        """Bytes of the tile."""
        return self.rows * self.row_bytes

    def offset(self, row, chunk):
        """Byte offset of 16-byte chunk ``chunk`` of row ``row`` (ints or u32 registers)."""
        s = (row & 7) if self.row_bytes >= 128 else ((row >> 1) & 3)
        return row * self.row_bytes + ((chunk ^ s) << 4)


class TileCopy:
    """One thread's ``cp.async`` share of a tile: chunk ``tid % (cols / 8)`` of the rows
    ``tid // (cols / 8) + i * step`` (``step = threads / (cols / 8)``, a multiple of 8, so
    every such row has the same swizzle). ``ptr`` is the row-major global matrix, ``ld`` its
    row length in elements; ``rows_total``/``cols_total`` its extents where a window may run
    past them (None: it never does), the chunks outside copied as zeros."""

    def __init__(self, tile: SmemTile, threads: int, tid, ptr, ld: int, *,
                 rows_total: int | None, cols_total: int | None):
        cpr = tile.cols // 8
        self.tile, self.ld, self.step = tile, ld, threads // cpr
        self.reps = tile.rows // self.step
        self.rows_total, self.cols_total = rows_total, cols_total
        self.row_t = tid // cpr if cpr & (cpr - 1) else tid >> (cpr.bit_length() - 1)
        self.col_t = (tid & (cpr - 1)) * 8
        self.soff = tile.offset(self.row_t, tid & (cpr - 1))
        self.ptr = ptr
        off = reg.scalar(u64)
        ptx.inst.mul.wide.u32(off, self.row_t, 2 * ld)
        self.gptr = ptr + off + self.col_t * 2

    def issue(self, dst, row0, col0) -> None:
        """Copy the window whose top-left element is ``(row0, col0)`` (u32 registers or ints)
        into the tile at shared address ``dst`` (a u32 register)."""
        start = reg.scalar(u64)
        ptx.inst.mul.wide.u32(start, _u32(row0), 2 * self.ld)
        g = self.gptr + start + _u32(col0) * 2
        s = dst + self.soff
        col_ok = None
        if self.cols_total is not None:     # col0 < cols_total: the window starts inside
            col_ok = (self.col_t + col0) < self.cols_total
        row = None if self.rows_total is None else self.row_t + row0
        for i in range(self.reps):
            dst = ptx.addr(s, i * self.step * self.tile.row_bytes)
            ok = col_ok
            if row is not None:
                left = self.rows_total - i * self.step
                if left <= 0:       # past the last row for every thread: zeros
                    ptx.cp_async.copy(dst, self.ptr, 16, cache="cg", src_size=0)
                    continue
                row_ok = row < left
                ok = row_ok if ok is None else (row_ok & ok)
            if ok is None:
                ptx.cp_async.copy(dst, ptx.addr(g, 2 * i * self.step * self.ld), 16, cache="cg")
                continue
            safe = reg.scalar(u64)
            ptx.inst.add.u64(safe, g, 2 * i * self.step * self.ld)
            ptx.inst.selp.u64(safe, safe, self.ptr, ok)   # an in-bounds address where masked
            n = reg.scalar(u32)
            ptx.inst.selp.u32(n, 16, 0, ok)
            ptx.cp_async.copy(dst, safe, 16, cache="cg", src_size=n)


class Fragments:
    """``ldmatrix`` loads of a warp's ``mma.sync`` m16n8k16 operands from a ``SmemTile``.

    ``kind``: ``"a"`` (A, 16 rows x 16 k, the tile's rows are m and its columns k: x4, four
    registers), ``"b_nk"`` (B for two n8 tiles, the tile's rows n, columns k: x4, registers
    ``[b0, b1]`` of each) or ``"b_kn"`` (B for two n8 tiles, the tile's rows k, columns n:
    x4.trans). ``row0``/``col0`` (registers or ints) are the warp's origin in the tile; the
    per-lane offsets of each 16-column step ``steps`` (column origins relative to ``col0``,
    multiples of 16) are computed once."""

    def __init__(self, tile: SmemTile, kind: str, lane, row0, col0, steps):
        self.tile, self.kind = tile, kind
        if kind == "a":
            lr, lc = lane & 15, lane >> 4
        elif kind == "b_nk":
            lr, lc = (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1
        else:
            lr, lc = (lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4
        row = lr + row0
        self.offsets = {}
        for c in steps:
            chunk = lc + (col0 // 8 if isinstance(col0, int) else col0 >> 3) + c // 8
            self.offsets[c] = self.tile.offset(row, chunk)

    def at(self, base, col: int):
        """This lane's address of column step ``col`` (one of ``steps``) in the tile at
        shared address ``base``: what ``load`` takes."""
        return base + self.offsets[col]

    def load(self, at, row: int = 0):
        """Four b32 registers: the fragments at ``at`` (from ``at()``) and row offset ``row``
        (a multiple of 16)."""
        regs = reg.array(b32, 4)
        ptx.ldmatrix(regs, ptx.addr(at, row * self.tile.row_bytes), trans=self.kind == "b_kn")
        return regs


def _u32(x):
    """``x`` as a u32 register (an int is moved into a new one)."""
    return reg.scalar(u32, init=x) if isinstance(x, int) else x
