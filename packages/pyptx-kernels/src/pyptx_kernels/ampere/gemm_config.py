"""The Ampere GEMM's plans: ``Sm80GemmConfig`` (a validated, frozen tile and ring plan) and
``SM80_GEMM_CONFIGS``, the plans ``matmul`` may choose from on sm_80/sm_86 devices."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pyptx.errors import ConfigError
from pyptx_kernels._common import where

SMEM_LIMIT = 99 * 1024
"""Dynamic shared memory one CTA may use on every Ampere part (sm_86's opt-in limit)."""


@dataclasses.dataclass(frozen=True)
class Sm80GemmConfig:
    """One valid plan of ``build_sm80_gemm``; an invalid combination raises ``ConfigError``
    at construction, naming the caller's line.

    Tile ``BM x BN x BK`` (``BK`` 32 or 64), split over ``warps_m x warps_n`` warps, each
    computing a ``BM / warps_m x BN / warps_n`` block (multiples of 16, at most 128 f32
    accumulators per thread); ``stages`` cp.async ring buffers (2..6) of A and B tiles in
    shared memory, at most ``SMEM_LIMIT`` bytes; ``group_m`` tile rows per band of the
    CTA order (neighbouring CTAs share A and B tiles in L2)."""

    BM: int = 128
    BN: int = 128
    BK: int = 32
    warps_m: int = 2
    warps_n: int = 2
    stages: int = 4
    group_m: int = 8

    def __post_init__(self):
        ints = (self.BM, self.BN, self.BK, self.warps_m, self.warps_n, self.stages, self.group_m)
        if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in ints):
            self._fail(f"every field must be a positive int, got {self!r}")
        if self.BK not in (32, 64):
            self._fail(f"BK must be 32 or 64, got {self.BK}")
        if self.BM % (16 * self.warps_m) or self.BN % (16 * self.warps_n):
            self._fail(f"each warp's block must be a multiple of 16 rows and columns: "
                       f"BM={self.BM} over warps_m={self.warps_m}, BN={self.BN} over "
                       f"warps_n={self.warps_n}")
        if self.BN % 64:
            self._fail(f"BN must be a multiple of 64 (128-byte B rows), got {self.BN}")
        if self.warps not in (2, 4, 8):
            self._fail(f"warps_m * warps_n must be 2, 4 or 8, got {self.warps}")
        if self.accumulators > 128:
            self._fail(f"a warp's {self.BM // self.warps_m}x{self.BN // self.warps_n} block "
                       f"needs {self.accumulators} f32 accumulators per thread, over 128")
        if not 2 <= self.stages <= 6:
            self._fail(f"stages must be 2..6, got {self.stages}")
        for rows, cols, what in ((self.BM, self.BK, "A"), (self.BK, self.BN, "B"),
                                 (self.BN, self.BK, "B")):
            step = self.threads // (cols // 8) if self.threads % (cols // 8) == 0 else 0
            if not step or step % 8 or rows % step:
                self._fail(f"the {what} tile ({rows}x{cols}) does not split into whole rows "
                           f"of 16-byte copies over {self.threads} threads")
        if self.smem_bytes > SMEM_LIMIT:
            self._fail(f"{self.BM}x{self.BN}x{self.BK} with {self.stages} stages needs "
                       f"{self.smem_bytes} bytes of shared memory, over {SMEM_LIMIT}")

    @staticmethod
    def _fail(msg):
        raise ConfigError(f"{where()}: Sm80GemmConfig: {msg}")

    @property
    def warps(self) -> int:
        """Warps per CTA."""
        return self.warps_m * self.warps_n

    @property
    def threads(self) -> int:
        """Threads per CTA."""
        return 32 * self.warps

    @property
    def accumulators(self) -> int:
        """f32 accumulator registers per thread."""
        return (self.BM // self.warps_m) * (self.BN // self.warps_n) // 32

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the ring of A and B tiles, plus 128 bytes of alignment."""
        return self.stages * (self.BM + self.BN) * self.BK * 2 + 128

    @classmethod
    def of(cls, value) -> Sm80GemmConfig:
        """``value`` as a config: a ``Sm80GemmConfig``, the name of one of
        ``SM80_GEMM_CONFIGS`` or a mapping of its fields (None: the default)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            for name, cfg in SM80_GEMM_CONFIGS:
                if name == value:
                    return cfg
            names = ", ".join(n for n, _ in SM80_GEMM_CONFIGS)
            raise ConfigError(f"{where()}: Sm80GemmConfig: no plan named {value!r}; the "
                              f"plans are {names}")
        if isinstance(value, Mapping):
            return cls(**value)
        raise ConfigError(f"{where()}: Sm80GemmConfig: config must be a Sm80GemmConfig, a "
                          f"plan name or a mapping of its fields, got {value!r}")


SM80_GEMM_CONFIGS: tuple[tuple[str, Sm80GemmConfig], ...] = (
    ("128x128x32_s4", Sm80GemmConfig()),
    ("128x256x32_s3", Sm80GemmConfig(BN=256, warps_n=4, stages=3)),
    ("128x128x64_s3", Sm80GemmConfig(BK=64, stages=3)),
    ("64x128x32_s4", Sm80GemmConfig(BM=64, warps_m=1, warps_n=4)),
)
"""Named plans: the default 128x128x32 4-stage ring (64 KiB, 4 warps), a 256-wide tile for
large N (8 warps), a 64-deep k-step and a 64-row tile for small M."""


def pick(M: int, N: int) -> Sm80GemmConfig:
    """The plan for an ``M x N`` product: 64-row tiles where 128-row ones would leave most
    SMs idle, else the default."""
    tiles = -(-M // 128) * -(-N // 128)
    return SM80_GEMM_CONFIGS[3][1] if tiles < 64 and M <= 64 else SM80_GEMM_CONFIGS[0][1]
