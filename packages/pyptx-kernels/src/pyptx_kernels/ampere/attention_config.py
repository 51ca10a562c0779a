"""The Ampere flash-attention forward's plans: ``Sm80AttentionConfig`` (a validated, frozen
block plan for one head dim), ``for_head_dim`` (the plan ``attention`` uses) and
``SM80_ATTENTION_PLANS``, the candidates the benchmark times."""

from __future__ import annotations

import dataclasses

from pyptx.errors import ConfigError
from pyptx_kernels._common import where
from pyptx_kernels.ampere.gemm_config import SMEM_LIMIT

HEAD_DIMS = (64, 128)


@dataclasses.dataclass(frozen=True)
class Sm80AttentionConfig:
    """One valid plan of ``build_sm80_attention``; an invalid one raises ``ConfigError`` at
    construction, naming the caller's line.

    Head dim ``D`` (64 or 128); ``BQ`` query rows per CTA over ``warps`` warps (16 or 32 rows
    each); ``BKV`` keys per step (32, 64 or 128). The CTA keeps Q and a double-buffered K/V
    block in shared memory (at most ``SMEM_LIMIT`` bytes), each warp its rows' O, S and Q
    fragments in registers (at most 192 per thread)."""

    D: int = 128
    BQ: int = 64
    BKV: int = 64
    warps: int = 4

    def __post_init__(self):
        for name in ("D", "BQ", "BKV", "warps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                self._fail(f"{name} must be a positive int, got {v!r}")
        if self.D not in HEAD_DIMS:
            self._fail(f"D must be 64 or 128, got {self.D}")
        if self.warps not in (2, 4, 8):
            self._fail(f"warps must be 2, 4 or 8, got {self.warps}")
        if self.BQ % self.warps or self.rows_per_warp not in (16, 32):
            self._fail(f"BQ / warps must be 16 or 32 rows, got BQ={self.BQ} over "
                       f"{self.warps} warps")
        if self.BKV not in (32, 64, 128):
            self._fail(f"BKV must be 32, 64 or 128, got {self.BKV}")
        if self.registers > 192:
            self._fail(f"{self.rows_per_warp} rows per warp with D={self.D}, BKV={self.BKV} "
                       f"keep {self.registers} fragment registers per thread, over 192")
        if (self.threads // (self.D // 8)) % 8 or self.BKV % (self.threads // (self.D // 8)):
            self._fail(f"{self.threads} threads do not split a {self.BKV}x{self.D} block into "
                       "whole rows of 16-byte copies")
        if self.smem_bytes > SMEM_LIMIT:
            self._fail(f"BQ={self.BQ}, BKV={self.BKV}, D={self.D} needs {self.smem_bytes} "
                       f"bytes of shared memory, over {SMEM_LIMIT}")

    @staticmethod
    def _fail(msg):
        raise ConfigError(f"{where()}: Sm80AttentionConfig: {msg}")

    @property
    def threads(self) -> int:
        """Threads per CTA."""
        return 32 * self.warps

    @property
    def rows_per_warp(self) -> int:
        """Query rows each warp owns."""
        return self.BQ // self.warps

    @property
    def registers(self) -> int:
        """Fragment registers per thread: O and S accumulators, Q fragments."""
        mi = self.rows_per_warp // 16
        return mi * (self.D // 2 + self.BKV // 2 + self.D // 4)

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the Q tile, two K and two V blocks, 128 bytes of alignment."""
        return (self.BQ + 4 * self.BKV) * self.D * 2 + 128


def for_head_dim(D: int) -> Sm80AttentionConfig:
    """The plan for head dim ``D``: 64 query rows (16 per warp) and 64 keys per step at
    ``D=128``, 128 query rows (32 per warp) at ``D=64``."""
    return Sm80AttentionConfig(D=D, BQ=128 if D == 64 else 64, BKV=64)


SM80_ATTENTION_PLANS: tuple[tuple[str, Sm80AttentionConfig], ...] = (
    ("d64_q128_kv64_w4", Sm80AttentionConfig(D=64, BQ=128, BKV=64, warps=4)),
    ("d64_q128_kv64_w8", Sm80AttentionConfig(D=64, BQ=128, BKV=64, warps=8)),
    ("d64_q128_kv32_w4", Sm80AttentionConfig(D=64, BQ=128, BKV=32, warps=4)),
    ("d64_q64_kv64_w4", Sm80AttentionConfig(D=64, BQ=64, BKV=64, warps=4)),
    ("d128_q64_kv64_w4", Sm80AttentionConfig(D=128, BQ=64, BKV=64, warps=4)),
    ("d128_q128_kv64_w8", Sm80AttentionConfig(D=128, BQ=128, BKV=64, warps=8)),
    ("d128_q64_kv32_w4", Sm80AttentionConfig(D=128, BQ=64, BKV=32, warps=4)),
)
"""Named plans (all assemble for sm_80 without spills); the first of each head dim is
``for_head_dim``'s."""
