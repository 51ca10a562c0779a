"""The forward kernel's plans: ``ForwardConfig`` (schedule, keys per block, ring stages,
consumer warpgroups, persistence, tuning options), the resources a plan needs (registers,
shared memory) and the tuned table ``ATTENTION_CONFIGS``.

A plan's fields left ``None`` take the default for the head dim (``ForwardConfig.resolve``):
three consumer warpgroups where a block of keys fits their registers (``default_consumers``),
``default_bn`` keys per block, the ``pingpong`` schedule (or ``$PYPTX_ATTN_SCHEDULE``).
"""

from __future__ import annotations

import dataclasses
import os

from pyptx._dataclass import dataclass
from pyptx.arch import register_budget
from pyptx.errors import ConfigError
from pyptx.types import bf16 as t_bf16
from pyptx.types import f16
from pyptx_kernels._common import where

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
BM = 128                    # query rows per CTA by default (64 per consumer warpgroup)
CONSUMERS = (2, 3)          # consumer warpgroups per CTA (``consumers=``): 128 or 192 rows
HEAD_DIMS = (64, 128, 256)
SMEM_LIMIT = 227 * 1024 - 256
H100_SMS = 132
SCHEDULES = ("simple", "overlap", "pingpong")
DEFAULT_SCHEDULE = "pingpong"
DEFAULT_PERSISTENT = False  # one CTA per query block (hardware-scheduled, longest first)
MAX_RESCALE_THRESHOLD = 16  # log2 units: P values stay <= 2**16, sums far from f32 overflow
#: The default ``rescale_threshold`` (log2 units); ``None`` rescales O whenever a row's max moves.
RESCALE_THRESHOLD = 8.0
#: Per consumer count: the most of ``3*BN/4`` (S and P) plus ``D/2`` (O) registers a thread
#: may hold, leaving the rest of ``consumer_regs`` for addresses and softmax state.
FRAGMENT_ROOM = {2: 200, 3: 128}


def _fail(msg):
    """A ``ConfigError`` whose message starts with the ``file:line`` of the user's call."""
    return ConfigError(f"{where()}: {msg}")


def _dtype(name):
    table = {"bf16": t_bf16, "f16": f16, "bfloat16": t_bf16, "float16": f16}
    key = str(name).replace("torch.", "")
    if key not in table:
        raise _fail(f"flash attention: dtype must be bf16 or f16, got {name!r}")
    return table[key]


def fits(D, BN, consumers):
    """Whether ``BN`` keys per block leave room for S, P and O in ``consumers``' registers."""
    return 3 * BN // 4 + D // 2 <= FRAGMENT_ROOM[consumers]


def default_bn(D, consumers=2):
    """Keys per KV block by default: with two consumer warpgroups 128, or 64 at head dim 256
    (the registers of O); with three the most that ``fits``, up to 128 (128 at head dim 64,
    80 at 128)."""
    if consumers == 2:
        return 64 if D > 128 else 128
    return max([bn for bn in range(64, 129, 16) if fits(D, bn, consumers)] or [64])


def default_consumers(D, BN=None):
    """The consumer warpgroups a plan gets when ``consumers`` is not given: 3 where a block
    of ``BN`` keys (of at least 64 when ``BN`` is not given) fits their registers (head dims
    64 and 128), else 2."""
    return 3 if fits(D, 64 if BN is None else BN, 3) else 2


def smem_bytes(D, BN, stages, persistent=False, consumers=2):
    """Dynamic shared memory: the Q block (64 rows per consumer warpgroup), ``stages`` K and
    V buffers, an O staging block when persistent (otherwise O is staged in Q's place),
    1024 B of alignment."""
    return 64 * consumers * D * 2 * (2 if persistent else 1) + 2 * stages * BN * D * 2 + 1024


def consumer_regs(consumers):
    """``(maxnreg, registers per consumer thread)`` of a CTA with ``consumers`` consumer
    warpgroups and a 24-register producer (``pyptx.warpspec.register_budget``)."""
    return register_budget(consumers, producer_regs=24)


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class ForwardConfig:
    """One plan of the forward kernel; every field is checked at construction
    (``ConfigError`` at the caller's line), the fit to a head dim by ``resolve``.

    * ``schedule``: ``"simple"`` waits for each GEMM; ``"overlap"`` issues block j's
      ``Q K^T`` with block j-1's ``P V`` so the softmax runs under the tensor cores;
      ``"pingpong"`` adds named barriers so the consumer warpgroups take turns issuing
      GEMMs. ``None``: ``$PYPTX_ATTN_SCHEDULE``, else ``DEFAULT_SCHEDULE``.
    * ``BN``: keys per KV block, a multiple of 16 in 64..256 whose S, P and O fit the
      consumers' registers (``fits``); ``None``: ``default_bn``.
    * ``stages``: depth of the K and V rings (shared memory bounds it: ``smem_bytes``).
    * ``consumers``: 2 or 3 consumer warpgroups of 64 query rows each; ``None``:
      ``default_consumers`` (3 where the block fits, else 2).
    * ``persistent``: ``num_sms`` CTAs walk the query blocks (dense batches, head dims 64
      and 128), loading the next Q while the previous block's O is stored.
    * ``pin_overlap``: a ``fence.acq_rel.cta`` keeps the exponentials above the wait for
      the previous ``P V`` (overlap schedules).
    * ``rescale_threshold``: the lazy rescale (log2 units, ``0..MAX_RESCALE_THRESHOLD``):
      a row keeps its max until a block raises it by more; ``None``: the exact rescale.
    """

    schedule: str | None = None
    BN: int | None = None
    stages: int = 2
    consumers: int | None = None
    persistent: bool = False
    num_sms: int = H100_SMS
    pin_overlap: bool = False
    rescale_threshold: float | None = RESCALE_THRESHOLD

    def __post_init__(self):
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise _fail(f"flash attention: schedule must be one of {SCHEDULES}, got "
                        f"{self.schedule!r}")
        if self.BN is not None and (not _is_int(self.BN) or self.BN % 16
                                    or not 64 <= self.BN <= 256):
            raise _fail(f"flash attention: BN={self.BN!r} keys per block: expected a multiple "
                        f"of 16 in 64..256")
        if not _is_int(self.stages) or self.stages < 1:
            raise _fail(f"flash attention: stages must be a positive int, got {self.stages!r}")
        if self.consumers is not None and (isinstance(self.consumers, bool)
                                           or self.consumers not in CONSUMERS):
            raise _fail(f"flash attention: consumers must be one of {CONSUMERS} (consumer "
                        f"warpgroups of 64 query rows each), got {self.consumers!r}")
        for name in ("persistent", "pin_overlap"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(f"flash attention: {name} must be True or False, got "
                            f"{getattr(self, name)!r}")
        if not _is_int(self.num_sms) or self.num_sms < 1:
            raise _fail(f"flash attention: num_sms must be a positive int, got {self.num_sms!r}")
        t = self.rescale_threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))
                              or not 0 <= t <= MAX_RESCALE_THRESHOLD):
            raise _fail(f"flash attention: rescale_threshold must be None or a number in "
                        f"0..{MAX_RESCALE_THRESHOLD} (log2 units), got {t!r}")
        object.__setattr__(self, "rescale_threshold", None if t is None else float(t))

    def resolve(self, D):
        """This plan at head dim ``D`` with every default filled in (``schedule``, ``BN``,
        ``consumers``), or ``ConfigError`` when it does not fit (registers, shared memory)."""
        if D not in HEAD_DIMS:
            raise _fail(f"flash attention: head dim must be 64, 128 or 256, got {D!r}")
        consumers = self.consumers or default_consumers(D, self.BN)
        BN = self.BN or default_bn(D, consumers)
        schedule = self.schedule or os.environ.get("PYPTX_ATTN_SCHEDULE") or DEFAULT_SCHEDULE
        if schedule not in SCHEDULES:
            raise _fail(f"flash attention: schedule must be one of {SCHEDULES}, got "
                        f"{schedule!r}")
        if not fits(D, BN, consumers):
            raise _fail(f"flash attention: BN={BN} keys per block does not fit head dim {D} "
                        f"with {consumers} consumer warpgroups: their registers (3*BN/4 for S "
                        f"and P, D/2 for O) must stay under {FRAGMENT_ROOM[consumers]} per "
                        f"thread")
        need = smem_bytes(D, BN, self.stages, self.persistent, consumers)
        if need > SMEM_LIMIT:
            raise _fail(f"flash attention: D={D}, BN={BN}, {self.stages} stages"
                        f"{', persistent' if self.persistent else ''}, {consumers} consumers "
                        f"need {need} bytes of shared memory, over {SMEM_LIMIT}")
        return dataclasses.replace(self, schedule=schedule, BN=BN, consumers=consumers)

    @property
    def bm(self):
        """Query rows per CTA (64 per consumer warpgroup) of a resolved plan."""
        return 64 * self.consumers

    def smem(self, D):
        """Dynamic shared memory of a resolved plan at head dim ``D``."""
        return smem_bytes(D, self.BN, self.stages, self.persistent, self.consumers)

    def name_tag(self):
        """Kernel-name suffix of the consumer count (empty for 2) and the tuning options
        (empty for the defaults) of a resolved plan."""
        tag = "" if self.consumers == 2 else f"_c{self.consumers}"
        tag += "_pinned" if self.pin_overlap else ""
        if self.rescale_threshold is None:
            tag += "_exact"
        elif self.rescale_threshold != RESCALE_THRESHOLD:
            tag += f"_rt{self.rescale_threshold:g}".replace(".", "p")
        return tag

    def changes(self):
        """The fields that differ from the default plan, as keywords (the tuner's ``Config``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}

    @property
    def name(self):
        """The plan's name in tuning tables: ``"default"``, or its ``changes()`` joined
        (``"BN64"``, ``"consumers2"``, ``"schedule_overlap"``, ``"BN96_stages3"``,
        ``"persistentTrue"``)."""
        parts = [f"{k}{v}" if not isinstance(v, str) else f"{k}_{v}"
                 for k, v in sorted(self.changes().items())]
        return "_".join(parts).replace(".", "p") or "default"


#: The plans ``attention()`` times per shape when asked (``PYPTX_AUTOTUNE=1``, ``tune()``;
#: the first is the one taken with ``PYPTX_AUTOTUNE=0``): ring ``stages``, ``BN`` keys per
#: block and the overlap schedule, each with ``default_consumers`` (so ``BN=176``/``192`` run
#: with two), two consumers with their default block, and, for head dim 64 at short
#: sequences, 96-key blocks in a three-deep ring and the persistent walk (three consumers;
#: the next tile's Q loads while this one's O is stored, no launch tail). A head dim a plan does not fit (``BN=192``
#: at 128, three stages at 256) is refused and skipped. Each is checked against float64 in
#: the CPU simulator (``test_tensorcore_sim.py``) and on the GPU
#: (``tools/attention_sanitize.py``).
ATTENTION_CONFIGS = (ForwardConfig(), ForwardConfig(stages=3), ForwardConfig(BN=64),
                     ForwardConfig(BN=176), ForwardConfig(BN=192),
                     ForwardConfig(schedule="overlap"), ForwardConfig(consumers=2),
                     ForwardConfig(BN=96, stages=3), ForwardConfig(persistent=True))

PLANS = {c.name: c for c in ATTENTION_CONFIGS}
"""``ATTENTION_CONFIGS`` by ``ForwardConfig.name`` (the names of tuning tables)."""

#: Per-row speed of three consumer warpgroups over two at equal waves (H200, paired over
#: cuDNN: 1.030-1.215x vs 0.954-1.131x); the wave rule of ``default_plan`` weighs it.
THREE_CONSUMER_GAIN = 1.06


def _waves(tiles, sms):
    return -(-tiles // sms)


def default_plan(head_dim, causal, batch_heads, seqlen, *, num_sms=H100_SMS):
    """The plan a default call takes without timing where no tuning table has its bucket
    (``_tuning.Planner``): the default plan (three consumers where they fit), except for
    full attention whose 192-row blocks leave the last wave so empty that two consumers'
    128-row blocks finish sooner (waves x rows, three consumers credited
    ``THREE_CONSUMER_GAIN``): one CTA per SM either way (their registers). Causal grids run
    longest rows first, so their waves even out: the default."""
    if head_dim not in HEAD_DIMS:
        raise _fail(f"flash attention: head dim must be 64, 128 or 256, got {head_dim!r}")
    if causal or default_consumers(head_dim) == 2:
        return ForwardConfig()
    three = _waves(batch_heads * -(-seqlen // 192), num_sms) * 192 / THREE_CONSUMER_GAIN
    two = _waves(batch_heads * -(-seqlen // 128), num_sms) * 128
    return ForwardConfig(consumers=2) if two < three else ForwardConfig()


# ------------------------------------------------------------------ the grid
# (here, not in fwd_scheduler: a kernel reused from its family's code needs its grid, not the
# scheduler's tracing code)
def query_blocks(S, bm):
    """Query blocks of ``bm`` rows covering ``S`` rows (an int, or a register)."""
    return (S + (bm - 1)) // bm


def dense_grid(B, S, Hq, plan):
    """``(grid, ctas)`` of a dense kernel: ``ctas`` (at most ``plan.num_sms``) persistent
    CTAs, or one CTA per query block (``ctas`` None)."""
    num_m = query_blocks(S, plan.bm)
    if plan.persistent:
        ctas = min(num_m * Hq * B, plan.num_sms)
        return (ctas, 1, 1), ctas
    return (num_m, Hq, B), None


def varlen_grid(B, max_seqlen_q, Hq, plan):
    """The grid of a packed kernel: ``max_seqlen_q`` rows of blocks per sequence and head."""
    return (query_blocks(max_seqlen_q, plan.bm), Hq, B)
