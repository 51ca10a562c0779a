"""Launch shapes of row kernels: how a ``(B, N)`` array's rows map onto threads and CTAs.

``plan_rows`` picks the vector width (16-byte accesses: 4 f32 or 8 bf16 per load,
narrowed to the largest power of two dividing ``N`` so every row start stays
aligned), the threads per row ``G`` (1..32 as a power of two, or a multiple of 32 up
to 1024), the vector chunks per thread ``K`` and, for short rows, several rows per
CTA (so a CTA has at least 128 threads). Thread ``t`` of a row owns chunks
``j*G + t`` for ``j < K``: every warp-wide access covers consecutive bytes.
``persistent_plan``/``persistent_ctas`` shape the persistent kernels (a device loop
over rows), ``reg_cap``/``bwd_ctas`` the backward ones.
"""

from __future__ import annotations

from typing import Any

from .._dataclass import dataclass
from ..errors import ConfigError, SpecError
from ..source import where
from ..types import PtxType, bf16, f32, from_name

__all__ = ["WARP", "MAX_N", "MAX_N_BWD", "RowPlan", "plan_rows", "dtype_of", "persistent_plan",
           "persistent_ctas", "reg_cap", "bwd_ctas"]

WARP = 32
#: rows live in registers: the forward kernels take ``N`` up to this.
MAX_N = 32768
#: The backward kernels keep x, dy and the running weight gradients in registers.
MAX_N_BWD = 8192


def dtype_of(dtype: Any, who: str) -> PtxType:
    """f32 or bf16 from a PtxType, a name ('f32', 'bfloat16') or a torch/jax/numpy dtype."""
    if isinstance(dtype, PtxType):
        t = dtype
    else:
        name = str(getattr(dtype, "name", dtype)).removeprefix("torch.")
        try:
            t = from_name(name)
        except Exception:
            t = None
    if t is not f32 and t is not bf16:
        raise SpecError(f"{where()}: {who}: dtype must be f32 or bf16 (float32/bfloat16), got {dtype!r}")
    return t


def _pos_int(v: Any, name: str, who: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SpecError(f"{where()}: {who}: {name} must be a positive int, got {v!r}")
    return v


def _round_threads(g: int) -> int:
    """Threads per row: a power of two below 128, a multiple of 32 from 128 up to 1024."""
    if g < 128:
        return 1 << max(0, (g - 1).bit_length())
    return min(1024, -(-g // WARP) * WARP)


@dataclass(frozen=True)
class RowPlan:
    """Launch shape of a row kernel (see the module docstring)."""

    B: int
    N: int
    dtype: PtxType
    vec: int      # elements per vector access (divides N)
    threads: int  # G: threads per row
    chunks: int   # K: vector chunks per thread
    rows: int     # R: rows per CTA

    @property
    def es(self) -> int:
        """Bytes per element."""
        return self.dtype.bytes

    @property
    def nvec(self) -> int:
        """Vector chunks per row."""
        return self.N // self.vec

    @property
    def elems(self) -> int:
        """Elements each thread holds in registers."""
        return self.chunks * self.vec

    @property
    def block(self) -> tuple[int, int, int]:
        """CTA shape: ``threads * rows`` threads."""
        return (self.threads * self.rows, 1, 1)

    @property
    def grid(self) -> tuple[int, int, int]:
        """One CTA per ``rows`` rows."""
        return (-(-self.B // self.rows), 1, 1)

    @property
    def tail_threads(self) -> int:
        """Threads of a row whose last chunk is inside the row (== threads: no tail)."""
        return self.nvec - (self.chunks - 1) * self.threads

    @property
    def ragged_rows(self) -> bool:
        """True when the last CTA has rows past B (clamped loads, masked stores)."""
        return self.B % self.rows != 0

    def describe(self) -> str:
        """One line naming the plan's numbers (benchmark logs)."""
        return (f"vec={self.vec} threads/row={self.threads} chunks={self.chunks} "
                f"rows/cta={self.rows} block={self.block[0]} grid={self.grid[0]}")


def plan_rows(B: int, N: int, dtype: PtxType, *, who: str, chunks: int | None = None,
              threads: int | None = None, rows: int | None = None, max_n: int = MAX_N,
              max_elems: int = 32, target_bytes: int = 64, min_block: int = 128) -> RowPlan:
    """Pick the launch shape of a row kernel; ``SpecError`` names the supported ``N``.

    ``chunks`` (target K), ``threads`` (G) and ``rows`` (R) override the
    heuristics: K ~ ``target_bytes`` of 16-byte vectors per thread, G from N/K,
    R so a CTA has ``min_block`` threads.
    """
    B = _pos_int(B, "B", who)
    N = _pos_int(N, "N", who)
    if N > max_n:
        raise SpecError(
            f"{where()}: {who}: N={N} is not supported; rows live in registers, so N must be in "
            f"1..{max_n} (got B={B})")
    if B >= 2**31:
        raise SpecError(f"{where()}: {who}: B must be below 2**31, got {B}")
    es = dtype.bytes
    vec = 16 // es
    while N % vec:
        vec //= 2
    nvec = N // vec
    max_k = max(1, max_elems // vec)
    if threads is None:
        k = chunks if chunks is not None else max(1, target_bytes // (vec * es))
        k = min(_pos_int(k, "chunks", who), max_k)
        g = _round_threads(-(-nvec // k))
    else:
        g = _pos_int(threads, "threads", who)
        if g > 1024 or (g < WARP and g & (g - 1)) or (g > WARP and g % WARP):
            raise ConfigError(
                f"{where()}: {who}: threads per row must be a power of two up to 32 or a multiple of 32 "
                f"up to 1024, got {g}")
    k = -(-nvec // g)
    if k > max_k:
        raise SpecError(
            f"{where()}: {who}: N={N} needs {k} chunks of {vec} per thread with {g} threads per row; "
            f"at most {max_k} fit in registers (N <= {max_n} with the default plan)")
    if threads is None:
        g = min(g, _round_threads(-(-nvec // k)))  # drop idle threads; K stays the same
    if rows is None:
        r = max(1, min_block // g) if g < min_block else 1
    else:
        r = _pos_int(rows, "rows", who)
    if r > 1 and g & (g - 1):
        raise ConfigError(f"{where()}: {who}: several rows per CTA need a power-of-two threads per row, got {g}")
    if g * r > 1024 or (g < WARP and (g * r) % WARP):
        raise ConfigError(
            f"{where()}: {who}: {r} rows of {g} threads make a CTA of {g * r} threads; it must be at most "
            f"1024 and, with fewer than 32 threads per row, a multiple of 32")
    return RowPlan(B, N, dtype, vec, g, k, r)


def persistent_plan(B: int, N: int, dtype: PtxType, *, who: str, elems: int,
                    chunks: int | None = None, threads: int | None = None,
                    rows: int | None = None) -> RowPlan:
    """Launch shape of a persistent row kernel: ``plan_rows`` aiming at ``elems`` values per
    thread instead of 64 bytes, so two row register sets and the held weights fit in 64
    registers (two 512-thread CTAs or one of 1024 per SM; ``elems`` is the kernel's measured
    budget). ``N`` is limited to ``1024 * elems``: past that a 1024-thread CTA would need more
    values per thread than fit and ptxas spills. Overrides as in ``plan_rows``."""
    return plan_rows(B, N, dtype, who=who, chunks=chunks, threads=threads, rows=rows,
                     max_n=1024 * elems, target_bytes=elems * dtype.bytes)


def persistent_ctas(plan: RowPlan, ctas: Any, who: str) -> int:
    """Grid of a persistent row kernel: ``ctas`` CTAs, but never more than there are row
    groups (``ceil(B/R)``), so every CTA has at least one."""
    return min(_pos_int(ctas, "ctas", who), plan.grid[0])


def reg_cap(plan: RowPlan) -> int:
    """``.maxnreg`` for a CTA of the plan: what one CTA may use, at most 128.

    Without it ptxas caps 512-thread CTAs at 64 registers and spills the backward kernels.
    """
    return max(24, min(128, 65536 // plan.block[0] // 8 * 8))


def bwd_ctas(plan: RowPlan, ctas: int | None) -> int:
    """CTAs of a persistent backward stage: ``ctas``, else ~16 row groups per CTA but at
    least 264 CTAs (two per SM of an H100), never more than there are row groups."""
    groups = plan.grid[0]
    if ctas is not None:
        return max(1, min(_pos_int(ctas, "ctas", "bwd_ctas"), groups))
    return min(groups, max(264, -(-groups // 16)))
