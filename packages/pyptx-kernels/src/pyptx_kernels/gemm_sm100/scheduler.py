"""The Blackwell GEMM's tile grid: one CTA (or 2-CTA cluster) per output tile, column-major
over tiles so consecutive CTAs share a block of B columns."""

from __future__ import annotations

from pyptx import ptx, reg
from pyptx.types import u32


class TileGrid:
    """The ``ceil(M / BM) x ceil(N / BN)`` tiles of ``D[M, N]`` under plan ``cfg``.

    ``ctas``: the grid's CTAs along x (tiles times ``cta_group``). ``origin()`` (at trace
    time) gives this CTA's first row of A / D and first row of B (N) to load, and the
    tile's first column of D, as u32 registers: tile ``t = ctaid.x // cta_group`` is
    ``(t % tiles_m, t // tiles_m)``; CTA rank ``r`` of a pair takes rows ``128 r ..`` of the
    tile and B rows ``r * BN / 2 ..``."""

    def __init__(self, M: int, N: int, cfg) -> None:
        self.M, self.N, self.cfg = M, N, cfg
        self.tiles_m = -(-M // cfg.BM)
        self.tiles_n = -(-N // cfg.BN)
        self.ctas = self.tiles_m * self.tiles_n * cfg.cta_group

    def origin(self):
        """``(rank, m0, nb0, n0)``: the CTA's rank in its pair (0 or a register), its first row
        of A and D, its first row of B to load and the tile's first column of D."""
        cfg = self.cfg
        cta = reg.from_(ptx.special.ctaid.x(), u32)
        if cfg.cta_group == 1:
            rank, t = 0, cta
        else:
            rank, t = cta & 1, cta >> 1
        tm = t % self.tiles_m
        tn = t // self.tiles_m
        m0 = tm * cfg.BM + rank * 128 if cfg.cta_group == 2 else tm * cfg.BM
        n0 = tn * cfg.BN
        nb0 = n0 + rank * cfg.b_rows if cfg.cta_group == 2 else n0
        return rank, m0, nb0, n0
