"""The FP8 GEMM's tile and schedule plan (``Fp8GemmConfig``), its shared-memory budget and
the tuned plans (``FP8_CONFIGS``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pyptx.errors import ConfigError
from pyptx_kernels._common import where

H100_SMS = 132
SMEM_LIMIT = 227 * 1024 - 256
EPI_BUFS = 2          # epilogue slab buffers per consumer warpgroup
BK = 128              # fp8 elements per k-block: one 128-byte swizzle span per row
MAX_STAGES = 8        # the default ring depth is as many stages as fit, at most this


def smem_bytes(BM, BN, stages):
    """Dynamic shared memory: the ring (``BK`` bytes per row of A and B), two 64 x 128-byte
    epilogue slabs per consumer warpgroup and 1024 bytes of alignment slack."""
    return stages * (BM + BN) * BK + (BM // 64) * EPI_BUFS * 64 * 128 + 1024


def partial_columns(BN, fast_accum=False):
    """Columns of the partial (tensor-core) accumulator: the whole tile without promotion,
    else at most 128 (a 192- or 256-column tile runs in two halves per k-block)."""
    return BN if fast_accum or BN <= 128 else BN // 2


def _bad(msg):
    """A ``ConfigError`` at the line that built the plan."""
    return ConfigError(f"{where()}: Fp8GemmConfig: {msg}")


def _count(v, low=1):
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


@dataclass(frozen=True)
class Fp8GemmConfig:
    """One valid tile plan of ``build_fp8_gemm``; invalid fields raise ``ConfigError``.

    ``BM``: 128 (two consumer warpgroups of 64 rows) or 64 (one); ``BN``: 64, 128, 192 or
    256 columns (block scales: not 192); ``stages``: ring buffers, None for as many as fit
    in shared memory (2 to ``MAX_STAGES``); ``cluster``: 1, or 2 CTAs along M sharing B
    by multicast; ``group_m``: cluster rows per band of the grouped tile order;
    ``num_sms``: persistent CTAs at most. The default is the first tuned plan.
    """

    BM: int = 128
    BN: int = 256
    stages: int | None = None
    cluster: int = 2
    group_m: int = 8
    num_sms: int = H100_SMS

    def __post_init__(self):
        if self.BM not in (64, 128) or self.BN not in (64, 128, 192, 256) \
                or isinstance(self.BM, bool) or isinstance(self.BN, bool):
            raise _bad(f"unsupported tile {self.BM}x{self.BN}: BM must be "
                       f"64 or 128, BN 64, 128, 192 or 256")
        if self.cluster not in (1, 2) or isinstance(self.cluster, bool):
            raise _bad(f"cluster must be 1 or 2, got {self.cluster!r}")
        for name in ("group_m", "num_sms"):
            if not _count(getattr(self, name)):
                raise _bad(f"{name} must be a positive int, got "
                           f"{getattr(self, name)!r}")
        if self.stages is not None and not _count(self.stages):
            raise _bad(f"stages must be None or a positive int, got "
                       f"{self.stages!r}")
        need = smem_bytes(self.BM, self.BN, self.ring_stages)
        if need > SMEM_LIMIT:
            raise _bad(f"{self.BM}x{self.BN} with {self.ring_stages} stages "
                       f"needs {need} bytes of shared memory, over {SMEM_LIMIT}")

    @property
    def ring_stages(self) -> int:
        """``stages``, or the most that fit in shared memory (2 to ``MAX_STAGES``)."""
        if self.stages is not None:
            return self.stages
        per_stage = (self.BM + self.BN) * BK
        fit = (SMEM_LIMIT - smem_bytes(self.BM, self.BN, 0)) // per_stage
        return max(2, min(MAX_STAGES, fit))

    @property
    def name(self) -> str:
        """A short unique name of the plan (``"128x256_s4_c2_g8_n132"``)."""
        s = "auto" if self.stages is None else self.stages
        return f"{self.BM}x{self.BN}_s{s}_c{self.cluster}_g{self.group_m}_n{self.num_sms}"

    def kwargs(self) -> dict:
        """The fields as a dict (for JSON and ``Fp8GemmConfig(**d)``)."""
        return asdict(self)


FP8_CONFIGS = (
    Fp8GemmConfig(BN=256, cluster=2),
    Fp8GemmConfig(BN=256, cluster=1),
    Fp8GemmConfig(BN=128, cluster=1),
    Fp8GemmConfig(BN=128, cluster=2),
)
"""The plans the tuner times per shape (BM = 128: two consumer warpgroups); the first is
the default (``Fp8GemmConfig()``, and the pick when ``PYPTX_AUTOTUNE=0``)."""


def default_plan(M: int, N: int, K: int, scale: str = "tensor") -> str:
    """The ``FP8_CONFIGS`` name a default call takes where the shipped tuning table has no
    bucket for ``M x N x K`` (or no table ships for the GPU): 128 x 128 tiles alone where
    128 x 256 tiles would fill less than half the SMs, 128 x 256 tiles alone where they fill
    less than one wave, else the default 128 x 256 tiles in clusters of two (the pick of the
    benchmark's 4096^3 and 8192^3 rows). Every scale kind takes the same tiles."""
    tiles = -(-M // 128) * -(-N // 256)
    if tiles < H100_SMS // 2:
        plan = Fp8GemmConfig(BN=128, cluster=1)
    elif tiles < H100_SMS:
        plan = Fp8GemmConfig(BN=256, cluster=1)
    else:
        plan = Fp8GemmConfig()
    return plan.name
