"""The Blackwell GEMM's plans: ``Sm100GemmConfig``, a validated frozen tile plan (untested on
hardware), and ``SM100_GEMM_CONFIGS``, the plans shipped."""

from __future__ import annotations

import dataclasses

from pyptx.errors import ConfigError
from pyptx_kernels._common import where

SMEM_LIMIT = 227 * 1024 - 256  # less the static barriers and the TMEM slot


@dataclasses.dataclass(frozen=True)
class Sm100GemmConfig:
    """One tile plan of ``build_gemm_sm100``; an invalid one raises ``ConfigError`` naming the
    caller's line.

    ``cta_group``: 1 (one CTA computes a ``128 x BN`` tile with ``tcgen05.mma.cta_group::1``)
    or 2 (a 2-CTA cluster computes a ``256 x BN`` tile with ``cta_group::2``: each CTA loads
    its 128 rows of A and ``BN / 2`` rows of B, the even CTA issues the MMAs, each CTA's
    tensor memory holds its 128 rows of D). ``BN``: 64, 128 or 256 (a multiple of 32 for the
    epilogue's 32-column loads; with ``cta_group=2`` at least 64). ``BK``: 64 (one 128-byte
    swizzled slab of bf16). ``stages``: depth of the TMA ring (2..8), fitting shared memory.
    """

    BN: int = 128
    BK: int = 64
    stages: int = 4
    cta_group: int = 1

    def __post_init__(self):
        if self.cta_group not in (1, 2):
            self._fail(f"cta_group must be 1 or 2, got {self.cta_group!r}")
        if self.BN not in (64, 128, 256):
            self._fail(f"BN must be 64, 128 or 256, got {self.BN!r}")
        if self.BK != 64:
            self._fail(f"BK must be 64 (one 128-byte swizzled bf16 slab), got {self.BK!r}")
        if isinstance(self.stages, bool) or not isinstance(self.stages, int) \
                or not 2 <= self.stages <= 8:
            self._fail(f"stages must be an int in 2..8, got {self.stages!r}")
        if self.smem_bytes() > SMEM_LIMIT:
            self._fail(f"{self.stages} stages of {self.BM}x{self.BN}x{self.BK} need "
                       f"{self.smem_bytes()} bytes of shared memory, over {SMEM_LIMIT}")

    def _fail(self, msg):
        raise ConfigError(f"{where()}: Sm100GemmConfig: {msg}")

    @property
    def BM(self) -> int:
        """Rows of the tile: 128 per CTA."""
        return 128 * self.cta_group

    @property
    def b_rows(self) -> int:
        """Rows of B (N) each CTA loads: ``BN``, or half of it with ``cta_group=2``."""
        return self.BN // self.cta_group

    @property
    def tmem_columns(self) -> int:
        """TMEM columns each CTA allocates: the f32 accumulator's ``BN`` (a power of 2)."""
        return self.BN

    def stage_bytes(self) -> int:
        """Shared bytes of one ring stage in one CTA: its A rows and B rows."""
        return (128 + self.b_rows) * self.BK * 2

    def smem_bytes(self) -> int:
        """Dynamic shared memory: the ring plus 1024 bytes of alignment slack."""
        return self.stages * self.stage_bytes() + 1024

    @property
    def name(self) -> str:
        """A short name of the plan."""
        return f"sm100_{self.BM}x{self.BN}x{self.BK}_s{self.stages}_cg{self.cta_group}"


SM100_GEMM_CONFIGS = (
    Sm100GemmConfig(BN=256, stages=4, cta_group=1),
    Sm100GemmConfig(BN=128, stages=6, cta_group=1),
    Sm100GemmConfig(BN=256, stages=5, cta_group=2),
)
"""The plans shipped (untimed: no Blackwell GPU was lent); the first is the default."""
