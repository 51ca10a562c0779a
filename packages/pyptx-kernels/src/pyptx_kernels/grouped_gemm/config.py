"""The grouped GEMM's plans: ``GroupedConfig`` (the forward and dA kernel), ``WgradConfig``
(the dB kernel), their tuned tables and the shared-memory budget both are checked against.

A plan is validated when it is made: an invalid combination raises ``ConfigError`` at the
line that made it, so a builder given a plan only checks the problem (shapes, dtypes)."""

from __future__ import annotations

import dataclasses

from pyptx._dataclass import dataclass
from pyptx.errors import ConfigError
from pyptx.types import bf16, f32
from pyptx_kernels._common import where

H100_SMS = 132
SMEM_LIMIT = 227 * 1024 - 256  # less the static barriers
EPI_BUFS = 2
STORES = ("auto", "masked")
L2_HINTS = (None, "stream_b")
MAX_SPLITS = 8


def error(msg):
    """A ``ConfigError`` whose message starts with the ``file:line`` of the user's call."""
    return ConfigError(f"{where()}: {msg}")


def out_type(name):
    """The ``pyptx.types`` type of an output dtype name (``"bf16"`` or ``"f32"``)."""
    table = {"bf16": bf16, "f32": f32, bf16: bf16, f32: f32}
    if name not in table:
        raise error(f"grouped GEMM: out_dtype must be 'bf16' or 'f32', got {name!r}")
    return table[name]


def smem_bytes(BM, BN, BK, stages):
    """Dynamic shared memory of a configuration: the ring, two 8 KiB epilogue slabs per
    consumer warpgroup and 1024 bytes of alignment slack."""
    return stages * (BM + BN) * BK * 2 + (BM // 64) * EPI_BUFS * 64 * 128 + 1024


def _int(value, lo, hi=None):
    return (not isinstance(value, bool) and isinstance(value, int) and value >= lo
            and (hi is None or value <= hi))


@dataclass(frozen=True)
class _Tile:
    """The tile and ring every grouped kernel has: ``BM`` (64 rows per consumer warpgroup: 64
    or 128) x ``BN`` (a multiple of 64 up to 256) x ``BK`` (64), ``stages`` ring buffers
    (None: as many as fit in shared memory, 2 to 8) over ``num_sms`` persistent CTAs."""

    BM: int = 128
    BN: int = 256
    BK: int = 64
    stages: int | None = None
    num_sms: int = H100_SMS

    def __post_init__(self):
        what = type(self).__name__
        BM, BN, BK = self.BM, self.BN, self.BK
        if BM not in (64, 128) or BN % 64 or not 64 <= BN <= 256 or BK != 64:
            raise error(f"{what}: unsupported tile {BM}x{BN}x{BK} (BM 64 or 128, BN a "
                        f"multiple of 64 up to 256, BK 64)")
        if self.stages is not None and not _int(self.stages, 1):
            raise error(f"{what}: stages must be an int >= 1 or None, got {self.stages!r}")
        if not _int(self.num_sms, 1):
            raise error(f"{what}: num_sms must be an int >= 1, got {self.num_sms!r}")
        if self.smem > SMEM_LIMIT:
            raise error(f"{what}: {BM}x{BN}x{BK} with {self.ring_stages} stages needs "
                        f"{self.smem} bytes of shared memory, over {SMEM_LIMIT}")

    @property
    def ring_stages(self) -> int:
        """The ring's depth: ``stages``, or as many as fit (2 to 8)."""
        if self.stages is not None:
            return self.stages
        per_stage = smem_bytes(self.BM, self.BN, self.BK, 1) - smem_bytes(self.BM, self.BN,
                                                                           self.BK, 0)
        fit = (SMEM_LIMIT - smem_bytes(self.BM, self.BN, self.BK, 0)) // per_stage
        return max(2, min(8, fit))

    @property
    def smem(self) -> int:
        """The kernel's dynamic shared memory in bytes."""
        return smem_bytes(self.BM, self.BN, self.BK, self.ring_stages)

    @property
    def name(self) -> str:
        """A short unique name of the plan: the tile, then every field off its default
        (``"64x256_prefetch=True_speculate=5"``; the tuning tables name plans so)."""
        kw = self.tuner_kwargs()
        return f"{kw.pop('BM')}x{kw.pop('BN')}" + "".join(f"_{k}={v}" for k, v in kw.items())

    def tuner_kwargs(self) -> dict:
        """The plan as ``pyptx.autotune.Config`` keywords: the tile and every field off its
        default (a tuned table is converted to the tuner's list at the edge)."""
        kw = {"BM": self.BM, "BN": self.BN}
        for f in dataclasses.fields(self):
            if f.name not in kw and getattr(self, f.name) != f.default:
                kw[f.name] = getattr(self, f.name)
        return kw


@dataclass(frozen=True)
class GroupedConfig(_Tile):
    """A plan of the forward (and dA) kernel ``build_grouped``: the tile and ring of
    ``_Tile`` plus, each off by default,

    * ``store="masked"``: every tile stored with predicated ``st.global`` (a debugging aid;
      ``"auto"`` uses bulk tensor stores where the 64 rows lie inside the group);
    * ``l2_hint="stream_b"``: B loaded L2 evict-first and A evict-last;
    * ``cluster=2`` (``cluster_along="n"``): two CTAs take neighbouring n-blocks of one m-block
      and share its A tile (multicast); ``cluster_along="m"`` (``cluster`` 2 or 4): the CTAs
      take neighbouring m-blocks of one n-block and share its B tile;
    * ``prefetch=True``: thread 0 prefetches the tensor maps and group ends first;
    * ``warm=n``: L2 prefetches of the first ``n`` k-blocks of the tile the CTA takes first
      if the groups were uniform (a hint);
    * ``speculate=n`` (no cluster, ``n`` up to the ring's stages): the producer copies those
      ``n`` k-blocks into the ring before it reads a group end; a miss hands them back unread.
    """

    store: str = "auto"
    l2_hint: str | None = None
    cluster: int = 1
    cluster_along: str = "n"
    prefetch: bool = False
    warm: int = 0
    speculate: int = 0

    def __post_init__(self):
        what = "GroupedConfig"
        if self.store not in STORES:
            raise error(f"{what}: store must be one of {STORES}, got {self.store!r}")
        if self.l2_hint not in L2_HINTS:
            raise error(f"{what}: l2_hint must be one of {L2_HINTS}, got {self.l2_hint!r}")
        if self.cluster_along not in ("n", "m"):
            raise error(f"{what}: cluster_along must be 'n' or 'm', got {self.cluster_along!r}")
        if self.cluster not in ((1, 2, 4) if self.cluster_along == "m" else (1, 2)):
            raise error(f"{what}: cluster must be 1 or 2 (or 4 along m), got {self.cluster!r} "
                        f"(cluster_along={self.cluster_along!r})")
        if not isinstance(self.prefetch, bool):
            raise error(f"{what}: prefetch must be a bool, got {self.prefetch!r}")
        if not _int(self.warm, 0):
            raise error(f"{what}: warm must be an int >= 0 (k-blocks to prefetch), got "
                        f"{self.warm!r}")
        super().__post_init__()
        stages = self.ring_stages
        if not _int(self.speculate, 0, stages) or self.speculate and self.cluster > 1:
            raise error(f"{what}: speculate must be an int from 0 to the {stages} stages, "
                        f"without a cluster, got {self.speculate!r} (cluster={self.cluster})")

    def dgrad(self) -> GroupedConfig:
        """The plan of the dA launch (the same kernel on B in the other major order): this one
        with bulk stores."""
        return dataclasses.replace(self, store="auto")

    def wgrad(self) -> WgradConfig:
        """The weight-gradient plan of the same tile and ring."""
        return WgradConfig(BM=self.BM, BN=self.BN, BK=self.BK, stages=self.stages,
                           num_sms=self.num_sms)


@dataclass(frozen=True)
class WgradConfig(_Tile):
    """A plan of the weight-gradient kernel ``build_grouped_wgrad``: the tile and ring of
    ``_Tile``, and ``splits`` (1..8): ``S > 1`` splits each group's row blocks into ``S``
    runs, one work unit each, written as f32 partial sums that ``build_split_reduce`` adds
    (``build_wgrad_split`` runs both)."""

    splits: int = 1

    def __post_init__(self):
        if not _int(self.splits, 1, MAX_SPLITS):
            raise error(f"WgradConfig: splits must be an int in 1..{MAX_SPLITS}, got "
                        f"{self.splits!r}")
        super().__post_init__()


WGRAD_CONFIGS = (WgradConfig(BM=128, BN=256), WgradConfig(BM=128, BN=128),
                 WgradConfig(BM=64, BN=256), WgradConfig(BM=64, BN=128))
"""The dB kernel's tuned plans (timed per shape on the device); the first is the default
when ``PYPTX_AUTOTUNE=0``."""

GROUPED_CONFIGS = tuple(GroupedConfig(BM=w.BM, BN=w.BN) for w in WGRAD_CONFIGS) + (
    GroupedConfig(BM=128, BN=256, l2_hint="stream_b"),
    GroupedConfig(BM=128, BN=128, cluster=2),
    GroupedConfig(BM=128, BN=256, cluster=2),
    GroupedConfig(BM=64, BN=256, prefetch=True),
    GroupedConfig(BM=64, BN=256, prefetch=True, speculate=5))
"""The forward and dA kernels' tuned plans: the dB kernel's tiles first (in its order), then
128x256 loading B evict-first, n-block pairs sharing A in a 2-CTA cluster, and 64x256 tiles
with prefetched tensor maps, also with a 5-stage speculative first tile."""


def default_plan(M: int, N: int, K: int, G: int, b_major: str = "MN") -> str:
    """The ``GROUPED_CONFIGS`` name a default forward (or dA) launch takes where the shipped
    tuning table has no bucket (or no table ships for the GPU): for a short kernel whose
    128 x 256 tiles (groups of ``M // G`` rows) fill less than a wave, 64 x 256 tiles with
    prefetched tensor maps and a 5-stage speculative first tile (+1-3% at the small-N
    benchmark shape, 4x2048x256x2048); else 128 x 256 tiles."""
    tiles = G * -(-max(1, M // max(G, 1)) // 128) * -(-N // 256)
    if tiles < H100_SMS:
        return GroupedConfig(BM=64, BN=256, prefetch=True, speculate=5).name
    return GroupedConfig(BM=128, BN=256).name


def wgrad_default_plan(M: int, KX: int, NY: int, G: int) -> str:
    """The ``WGRAD_CONFIGS`` name a default weight-gradient launch takes without a table
    bucket: 128 x 128 tiles where the ``G`` gradients' 128 x 256 tiles would fill less than
    half the SMs, else 128 x 256."""
    tiles = G * -(-KX // 128) * -(-NY // 256)
    return WgradConfig(BM=128, BN=128 if tiles < H100_SMS // 2 else 256).name
