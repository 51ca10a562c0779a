"""The GEMM's plans: ``GemmConfig`` (a validated, frozen tile and schedule plan), the
shared-memory budget it must fit, ``GEMM_CONFIGS``, the plans the tuner times, and the
epilogue's activations (``ACTIVATIONS``, ``GATE_BLOCK``: here, so a host that builds a kernel
from its family's stored code imports no tracing code)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping

from pyptx._dataclass import dataclass
from pyptx.errors import ConfigError
from pyptx_kernels._common import where

H100_SMS = 132
SMEM_LIMIT = 227 * 1024 - 256  # less the static barriers
EPI_BUFS = 2
MAX_STAGES = 10
ACTIVATIONS = (None, "relu", "silu", "gelu_tanh", "swiglu")
"""The epilogue's activations (``epilogue.activate``; ``"swiglu"`` is the gated form)."""
GATE_BLOCK = 64
"""Columns of a gate (or up) block of the gated epilogue's interleaved B (``pack_gated``)."""


def smem_bytes(BM, BN, BK, stages, out_bytes=2, consumers=None, epi_bufs=EPI_BUFS):
    """Dynamic shared memory of a configuration: the ring, the epilogue buffers
    (``epi_bufs`` 64-row by 128-byte slabs per consumer warpgroup, ``BM // 64`` of them
    unless ``consumers`` says otherwise) and 1024 bytes of alignment slack."""
    consumers = BM // 64 if consumers is None else consumers
    return stages * (BM + BN) * BK * 2 + consumers * epi_bufs * 64 * 128 + 1024


def _user_line():
    """``file:line`` of the user's call: past this package's frames and the dataclass's
    generated ``__init__`` (``<string>``); ``<torch.compile>`` while dynamo traces."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.compiler.is_compiling():
        return "<torch.compile>"
    return where()


@dataclass(frozen=True)
class GemmConfig:
    """One valid tile and schedule plan of ``build_gemm``; an invalid combination raises
    ``ConfigError`` at construction, naming the caller's line.

    Tile: ``BM`` (64/128/192/256) x ``BN`` (64..256, a multiple of 64) x ``BK`` (64/128),
    ``stages`` ring buffers (None: the deepest ring that fits; stored resolved).
    Schedule: the consumer warpgroups split each tile, ``wg_rows`` 64 or 128 rows each (128
    needs ``BN <= 128``); ``split_tail`` cuts the partial last wave's tiles along K over all
    ``num_sms`` SMs.
    Grid: ``cluster`` (1/2) CTAs along M sharing a B tile, ``group_m`` cluster rows per band
    of the persistent order over ``num_sms`` SMs. Epilogue: ``epi_bufs`` (1/2) 64-row slab buffers per warpgroup,
    ``epilogue`` ``"stmatrix"`` or ``"st"`` for 16-bit outputs.
    Cluster switches: ``multicast`` (B copied once per cluster), ``split`` (``"rows"`` of
    every slab or whole ``"slabs"`` per CTA), ``remote_sem`` (ordering of remote releases),
    ``wait_scope`` (acquire scope of barrier waits)."""

    BM: int = 128
    BN: int = 256
    BK: int = 64
    stages: int | None = None
    wg_rows: int = 64
    split_tail: bool = False
    cluster: int = 2
    group_m: int = 8
    num_sms: int = H100_SMS
    epi_bufs: int = EPI_BUFS
    epilogue: str = "stmatrix"
    multicast: bool = True
    split: str = "rows"
    remote_sem: str = "release.cta"
    wait_scope: str | None = None

    def __post_init__(self):
        BM, BN, BK = self.BM, self.BN, self.BK
        if BM not in (64, 128, 192, 256) or BN % 64 or not 64 <= BN <= 256 or BK % 64 or BK > 128:
            self._fail(f"unsupported tile {BM}x{BN}x{BK}")
        if self.cluster not in (1, 2):
            self._fail(f"cluster must be 1 or 2, got {self.cluster!r}")
        if self.split not in ("rows", "slabs"):
            self._fail(f"split must be 'rows' or 'slabs', got {self.split!r}")
        if self.epilogue not in ("stmatrix", "st"):
            self._fail(f"epilogue must be 'stmatrix' or 'st', got {self.epilogue!r}")
        if self.epi_bufs not in (1, 2):
            self._fail(f"epi_bufs must be 1 or 2, got {self.epi_bufs!r}")
        if not isinstance(self.split_tail, bool):
            self._fail(f"split_tail must be True or False, got {self.split_tail!r}")
        wg = self.wg_rows
        if wg not in (64, 128) or BM % wg or (wg == 128 and BN > 128):
            self._fail(f"wg_rows must be 64 or 128, BM a multiple of it, and 128 needs "
                       f"BN <= 128 (two accumulators of BN columns per thread), got "
                       f"wg_rows={wg!r} for {BM}x{BN}")
        if not isinstance(self.num_sms, int) or self.num_sms < 1 or self.group_m < 1:
            self._fail(f"num_sms and group_m must be positive, got {self.num_sms!r}, "
                       f"{self.group_m!r}")
        stages = self.stages
        if stages is None:  # the deepest ring that fits beside the epilogue tiles
            fixed = self.smem_bytes(0)
            stages = max(2, min(MAX_STAGES, (SMEM_LIMIT - fixed) // (self.smem_bytes(1) - fixed)))
            object.__setattr__(self, "stages", stages)
        if self.smem_bytes() > SMEM_LIMIT:
            self._fail(f"{BM}x{BN}x{BK} with {stages} stages needs {self.smem_bytes()} bytes "
                       f"of shared memory, over {SMEM_LIMIT}")

    @staticmethod
    def _fail(msg):
        raise ConfigError(f"{_user_line()}: GemmConfig: {msg}")

    @property
    def consumers(self) -> int:
        """Consumer warpgroups per CTA."""
        return self.BM // self.wg_rows

    @property
    def bands(self) -> int:
        """64-row accumulators per consumer warpgroup."""
        return self.wg_rows // 64

    def smem_bytes(self, stages=None) -> int:
        """Dynamic shared memory with ``stages`` ring buffers (default: the plan's)."""
        return smem_bytes(self.BM, self.BN, self.BK, self.stages if stages is None else stages,
                          consumers=self.consumers, epi_bufs=self.epi_bufs)

    @property
    def name(self) -> str:
        """A short unique name: the tile, stages and cluster, then what differs from the
        defaults (``128x128x64_s6_c1_st``)."""
        base = (f"{self.BM}x{self.BN}x{self.BK}_s{self.stages}_c{self.cluster}"
                f"{'_w128' if self.wg_rows == 128 else ''}{'_st' if self.split_tail else ''}"
                f"{'_e1' if self.epi_bufs == 1 else ''}")
        skip = {"BM", "BN", "BK", "stages", "cluster", "wg_rows", "split_tail", "epi_bufs"}
        extra = [f"_{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                 if f.name not in skip and getattr(self, f.name) != f.default]
        return base + "".join(extra)

    @classmethod
    def of(cls, config) -> GemmConfig:
        """``config`` as a ``GemmConfig``: itself, the tuned plan of that ``name``, a mapping of
        fields, or None (the default plan)."""
        if config is None:
            return DEFAULT
        if isinstance(config, cls):
            return config
        if isinstance(config, str):
            plan = PLANS.get(config)
            if plan is None:
                cls._fail(f"no tuned plan is named {config!r}; the plans: {sorted(PLANS)}")
            return plan
        if isinstance(config, Mapping):
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(config) - names)
            if unknown:
                cls._fail(f"unknown fields {unknown}; the fields: {sorted(names)}")
            return cls(**config)
        cls._fail(f"config must be a GemmConfig, a plan name or a mapping, got {config!r}")


DEFAULT = GemmConfig()
"""The default plan: 128x256x64 tiles in clusters of two, the deepest ring that fits."""

# Why each plan is in the table (H100/H200 TFLOP/s, cuBLAS in brackets):
GEMM_CONFIGS = (
    DEFAULT,
    GemmConfig(BM=128, BN=256, cluster=1),
    GemmConfig(BM=128, BN=128, cluster=1),
    GemmConfig(BM=64, BN=256, cluster=1),
    GemmConfig(BM=128, BN=64, cluster=1),
    GemmConfig(BM=192, BN=192, cluster=1),     # 6144^3: 713 (688)
    GemmConfig(BM=192, BN=192, cluster=2),     # 8192x28672x8192: 758 (724)
    GemmConfig(BM=256, BN=128, cluster=1, wg_rows=128),   # 2048^3: 627 (608)
    GemmConfig(BM=128, BN=128, cluster=1, split_tail=True),  # 1024x1024x16384: 614 vs 460
    GemmConfig(BM=64, BN=128, cluster=1, epi_bufs=1),     # 128x8192x8192: 386-390 (389-392)
)
"""The plans the tuner times per shape (``gemm_tuned``); the first is the default when
``PYPTX_AUTOTUNE=0``. A split-tail plan on a shape it does not apply to builds the plain
kernel, which the tuner skips as a duplicate."""

PLANS = {c.name: c for c in GEMM_CONFIGS}
"""``GEMM_CONFIGS`` by ``GemmConfig.name`` (how the tuner's ``Config`` names a plan)."""


def default_plan(M: int, N: int, K: int) -> str:
    """The ``GEMM_CONFIGS`` name a default call takes where the shipped tuning table has no
    bucket for ``M x N x K`` (or no table ships for the GPU), from the tuner's recorded picks
    (``docs/performance.md``): 64 x 128 tiles with one epilogue buffer for skinny products
    (M <= 192: B streams from memory), the split tail for at most a wave of 128 x 128 tiles
    over a long K (1024 x 1024 x 16384), 256 x 128 tiles for about one wave of square
    products up to 2048^2, 192 x 192 tiles in pairs for long-N training shapes
    (8192 x 28672 x 8192), 128 x 128 tiles where 128 x 256 ones would fill less than half the
    SMs; over a long K (>= 8192: weight gradients, whose K is the tokens) the plan
    ``_long_k_plan`` rates best by its waves; else the default 128 x 256 tiles in pairs."""
    sms = H100_SMS
    tiles = -(-M // 128) * -(-N // 256)             # 128 x 256 tiles
    if M <= 192:
        plan = GemmConfig(BM=64, BN=128, cluster=1, epi_bufs=1)
    elif -(-M // 128) * -(-N // 128) <= sms and K >= 8192 and K >= 4 * max(M, N):
        plan = GemmConfig(BM=128, BN=128, cluster=1, split_tail=True)
    elif M * N <= 2048 * 2048 and -(-M // 256) * -(-N // 128) >= sms * 3 // 4:
        plan = GemmConfig(BM=256, BN=128, cluster=1, wg_rows=128)
    elif N >= 16384 and M >= 4096:
        plan = GemmConfig(BM=192, BN=192, cluster=2)
    elif tiles < sms // 2:
        plan = GemmConfig(BM=128, BN=128, cluster=1)
    elif K >= LONG_K:
        plan = _long_k_plan(M, N, K, sms)
    else:
        plan = DEFAULT
    return plan.name


LONG_K = 8192
"""The K from which ``default_plan`` rates plans by their waves (``_long_k_plan``); the plan
then depends on M within a bucket, so ``host.sibling_plans`` compiles every candidate."""

#: TFLOP/s of a plan's full waves over a long K (H100, 700 W; ``docs/performance.md``):
#: each candidate of ``_long_k_plan`` is rated at this times the fraction of the SMs its
#: waves keep busy on useful tile area
LONG_K_RATES = {"128x256 pairs": 745.0, "192x192": 765.0, "128x128": 700.0,
                "128x128 split tail": 720.0, "256x128": 765.0}


def _busy(M: int, N: int, BM: int, BN: int, sms: int) -> float:
    """The useful share of ``BM x BN`` tile waves over ``M x N``: tiles over whole waves,
    times the output area over the tiles' area."""
    mt, nt = -(-M // BM), -(-N // BN)
    return (mt * nt / (-(-mt * nt // sms) * sms)) * (M * N / (mt * BM * nt * BN))


def _long_k_plan(M: int, N: int, K: int, sms: int) -> GemmConfig:
    """The plan with the best rated throughput (``LONG_K_RATES`` x ``_busy``) for a long-K
    product: 128 x 256 tiles in pairs, 192 x 192 tiles, 128 x 128 tiles, for at most
    ``3072 x 4096`` outputs over ``K >= 8192`` 128 x 128 tiles with the split tail (which
    fills the last wave), and for ``N >= 4096`` up to ``6144 x 4096`` outputs 256 x 128 tiles.
    11264 x 2048 x 8192: 192 x 192 (726 vs 665 TFLOP/s); 3072 x 2048 x 8192: 128 x 128 (718
    vs 578); 2048 x 5632 x 8192: the split tail (721 vs 688); 6144 x 4096 x 8192: 256 x 128
    (744-750 vs 714)."""
    rated = long_k_rates(M, N, sms)
    return max(rated, key=rated.get)


def long_k_rates(M: int, N: int, sms: int = H100_SMS) -> dict:
    """``{plan: rated TFLOP/s}`` of ``_long_k_plan``'s candidates for ``M x N`` outputs
    (``K >= LONG_K``)."""
    rated = {
        DEFAULT: LONG_K_RATES["128x256 pairs"] * _busy(M, N, 128, 256, sms),
        GemmConfig(BM=192, BN=192, cluster=1): LONG_K_RATES["192x192"] * _busy(M, N, 192, 192,
                                                                              sms),
        GemmConfig(BM=128, BN=128, cluster=1): LONG_K_RATES["128x128"] * _busy(M, N, 128, 128,
                                                                              sms),
    }
    if M * N <= 3072 * 4096:
        rated[GemmConfig(BM=128, BN=128, cluster=1, split_tail=True)] = \
            LONG_K_RATES["128x128 split tail"]
    if N >= 4096 and M * N <= 6144 * 4096:
        rated[GemmConfig(BM=256, BN=128, cluster=1, wg_rows=128)] = \
            LONG_K_RATES["256x128"] * _busy(M, N, 256, 128, sms)
    return rated
