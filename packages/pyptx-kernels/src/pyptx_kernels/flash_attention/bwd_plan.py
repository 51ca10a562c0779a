"""The plan of the dense attention backward: which kernels run and how they add dQ.

A ``BackwardPlan`` is a frozen, validated choice among the valid plans (its named
constructors), replacing a bag of keywords whose combinations depend on each other:

* ``default()``: the deterministic pair, the dQ kernel (which also writes the stats) then the
  dK/dV kernel; ``safe_pair()``: the same with the simplest schedule, to bisect a failure;
* ``atomic()``: a prep kernel (stats, zeroed f32 dQ), the dK/dV kernel adding dQ with f32
  atomics, a conversion kernel (not deterministic; torch eager only);
* ``bulk()``: dQ tiles added by TMA tile reductions; ``ordered()``: in a fixed order
  (deterministic; ``dkdv_bq=128`` at D=128, ``stats_lead``);
* ``converted()``: ordered, with dQ converted inside the dK/dV grid (``convert_lag``,
  ``stats_lead``, ``dq_chains``); ``lagged()``: converted with them ``"auto"`` (attention()'s
  D=128 plan);
* ``fused()``: one kernel at D=64 (``ordered``, ``pingpong``, ``defer``).

``for_eager(D, deterministic)`` is the plan attention() runs for torch eager calls.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from pyptx.errors import ConfigError
from pyptx_kernels._common import where
from pyptx_kernels.flash_attention.bwd_common import BM, FUSED_BQ, _fail, safe_default


def early_convert_share(S, Sk, Hq, Hkv, kv_split=1):
    """``convert_lag``: the 64-row q blocks each dK/dV CTA's producer warps convert (the kv
    head's ``(Hq / Hkv) * ceil(S / 64)`` blocks over its ``kv_split * ceil(Sk / 128)``
    CTAs)."""
    return -(-(Hq // Hkv) * -(-S // 64) // (kv_split * -(-Sk // BM)))


def default_convert_lag(Sk, num_sms=132, kv_split=1):
    """A ``convert_lag`` whose kv heads finished long before: two waves of them, counted in
    kv heads of ``kv_split * ceil(Sk / 128)`` CTAs."""
    return -(-2 * num_sms // (kv_split * -(-Sk // BM)))


def default_stats_lead(Sk, num_sms=132, kv_split=1):
    """A ``stats_lead`` whose kv heads start a whole CTA time after the CTAs that compute their
    stats: a wave of kv heads of ``kv_split * ceil(Sk / 128)`` CTAs, plus one."""
    return -(-num_sms // (kv_split * -(-Sk // BM))) + 1


def default_kv_split(G, causal=True):
    """``kv_split`` for ``G`` query heads per kv head: 2 when causal and ``G`` is even (a kv
    head's CTAs double, each with half the group: the grid of the same FLOPs without
    grouping is the faster one, H200 profile 1.641 vs 1.315 ms at 2x4096x32/8 vs 32/32; a
    list-scheduling model of the causal grid's uneven CTAs on 132 SMs: 0.90x the span at
    2x4096x32/8, 0.87x at 1x16384x16/4), 1 otherwise (full attention's CTAs are equal: no
    tail to shorten, the reduction would cost)."""
    return 2 if causal and G % 2 == 0 else 1


def resolve_stats_lead(fn, stats_lead, Sk, num_sms, dq_ordered, safe, BQ, causal,
                       fail=None, kv_split=1):
    """``stats_lead`` as an int: ``"auto"`` is ``default_stats_lead`` where it applies (the
    ordered bulk-dQ dK/dV kernel, 64-row q blocks, not safe) and pays (full attention: the
    causal grid's short CTAs idle their SMs until their share of stats is done; H100,
    paired A/B, 0.991x at S=4096) and 0 elsewhere; an int is refused (``ConfigError``)
    where it does not apply."""
    applies = dq_ordered and not safe and BQ in (None, 64)
    if stats_lead == "auto":
        return default_stats_lead(Sk, num_sms, kv_split) if applies and not causal else 0
    if stats_lead and not (isinstance(stats_lead, int) and not isinstance(stats_lead, bool)
                           and stats_lead > 0 and applies):
        raise (fail or _fail)(
            f"{fn}: stats_lead (a positive int or 'auto') needs the ordered bulk-dQ dK/dV "
            f"kernel (atomic_dq, dq_bulk, dq_ordered) with 64-row q blocks, not safe; got "
            f"stats_lead={stats_lead!r}, dq_ordered={dq_ordered!r}, safe={safe!r}, BQ={BQ!r}")
    return int(stats_lead or 0)


def default_dq_chains(S, Sk, Hq, Hkv, D, causal):
    """``dq_chains`` of the ordered dK/dV kernel at these sizes: 1 (one chain of adds per q
    block; H100, with and without ``heavy_first``: 2 chains slower on every GQA row)."""
    return 1


def default_heavy_first(causal, window=(-1, -1), fused=False, stats_lead=0, G=8, S=8192):
    """``heavy_first`` at these options: the causal dK/dV grid without a window or
    ``stats_lead``, with ``G`` query heads per kv head of 8 or more, or 4 or more at ``S`` of
    8192 or more (H100: +7 to +23% there; G 4 at S 4096 even, G 1 -2 to -7%); not the fused
    kernel (unmeasured in groups)."""
    return (bool(causal) and tuple(window) == (-1, -1) and not fused and not stats_lead
            and (G >= 8 or G >= 4 and S >= 8192))


def check_dq_chains(fn, dq_chains, dq_ordered, fail=None, auto=False):
    """``ConfigError`` (naming ``fn``) unless ``dq_chains`` is one of ``DQ_CHAINS`` (or, with
    ``auto``, ``"auto"``), above 1 only with ``dq_ordered``."""
    if auto and dq_chains == "auto":
        return
    if (not isinstance(dq_chains, int) or isinstance(dq_chains, bool)
            or dq_chains not in DQ_CHAINS or dq_chains > 1 and not dq_ordered):
        raise (fail or _fail)(f"{fn}: dq_chains must be one of {DQ_CHAINS}"
                              f"{' or auto' if auto else ''}, above 1 only with dq_ordered, "
                              f"got dq_chains={dq_chains!r}, dq_ordered={dq_ordered!r}")


def _check_dq_modes(fn, atomic_dq, dq_bulk, dq_ordered, fail=None):
    """``ConfigError`` (naming ``fn``) for a dQ mode without the one it builds on."""
    if dq_bulk and not atomic_dq:
        raise (fail or _fail)(f"{fn}: dq_bulk=True needs atomic_dq=True")
    if dq_ordered and not dq_bulk:
        raise (fail or _fail)(f"{fn}: dq_ordered=True needs dq_bulk=True")


def _check_num_sms(fn, num_sms, fail=None):
    """``ConfigError`` (naming ``fn``) unless ``num_sms`` is a positive int."""
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1:
        raise (fail or _fail)(f"{fn}: num_sms must be a positive int, got {num_sms!r}")


def default_dq_bkv(D):
    """The pair's dQ kernel's keys per block: 128 at D=64 (its two products get 128 columns;
    H100 A/B over the four benchmark shapes: +1 to +4%, identical results), 64 otherwise."""
    return 128 if D == 64 else 64


OPTIONS = ("dkdv_bq", "dkdv_overlap", "atomic_dq", "dq_bulk", "dq_ordered",
           "dq_bkv", "fused_bq", "fused_defer", "fused_pingpong",
           "num_sms", "dq_convert", "convert_lag", "stats_lead",
           "kv_split", "dq_chains", "heavy_first")  # BackwardPlan's, parse_options'
INT_OPTIONS = ("dkdv_bq", "dq_bkv", "fused_bq", "fused_pingpong", "num_sms", "convert_lag",
               "stats_lead", "kv_split", "dq_chains")
AUTO_OPTIONS = ("convert_lag", "stats_lead", "kv_split", "dq_chains",
                "heavy_first")  # these also take "auto"
KV_SPLITS = (1, 2, 4, 8)    # kv_split: CTAs of a cluster (along x) sharing a kv block
DQ_CHAINS = (1, 2, 4)       # dq_chains: independent ordered chains of adds per q block


def parse_options(text):
    """``"dkdv_bq=32,dkdv_overlap=0"`` -> ``{"dkdv_bq": 32, "dkdv_overlap": False}`` (empty
    text or ``default``: ``{}``), for the command lines of the example and its tools."""
    out = {}
    for item in filter(None, (text or "").replace("default", "").split(",")):
        name, _, value = item.partition("=")
        if name in AUTO_OPTIONS and value == "auto":
            out[name] = value
            continue
        if name not in OPTIONS or not value.isdigit():
            raise _fail(f"attention backward options: expected name=int with name in "
                              f"{OPTIONS} (or {'/'.join(AUTO_OPTIONS)}=auto), got {item!r}")
        out[name] = int(value) if name in INT_OPTIONS else bool(int(value))
    return out


def _plan_fail(msg):
    """A ``ConfigError`` at the line that built the plan."""
    return ConfigError(f"{where()}: {msg}")


@dataclass(frozen=True)
class BackwardPlan:
    """A valid plan of the dense backward (see the module docstring; build it with a named
    constructor). Fields, each the option of the same name:

    ``safe`` (``None``: ``PYPTX_ATTN_BWD_SAFE``): every block masked and waited for.
    ``atomic_dq``: dQ added by the dK/dV kernel; ``dq_bulk`` (with it): by TMA tile
    reductions; ``dq_ordered`` (with ``dq_bulk``, or ``fused_bq``): in a fixed order;
    ``dq_convert`` (ordered, 64-row q blocks): converted by ``num_sms`` converter CTAs of the
    dK/dV grid; ``convert_lag`` (with ``dq_convert``; int or ``"auto"``): the dK/dV CTAs'
    idle producer warps convert the kv head that many heads earlier; ``stats_lead`` (ordered,
    64-row q blocks, not safe; int or ``"auto"``): they compute the stats of the kv head
    that many heads later. ``dq_bkv`` (32, 64 or 128, the pair only; ``None``:
    ``default_dq_bkv``): keys per block of the dQ kernel. ``dkdv_bq`` (32 or 64; 128 for the
    ordered kernel at D=128) and ``dkdv_overlap`` (``None``: per head dim): the dK/dV
    kernel's q rows per block and overlapped schedule. ``fused_bq=128`` (D=64): the fused
    kernel, with its schedules ``fused_defer`` or ``fused_pingpong`` (1 or 2). ``kv_split``
    (1, 2, 4 or 8, or ``"auto"``: ``default_kv_split`` of the group size; the dK/dV kernel
    with 64-row q blocks, or the fused kernel): a kv block's CTAs, a cluster, each taking ``G / kv_split`` of
    its group's query heads, their dK/dV partial sums added in rank order through
    distributed shared memory (deterministic). ``dq_chains`` (1, 2 or 4, or ``"auto"``:
    ``default_dq_chains``; above 1 with ``dq_ordered``, not the fused kernel): independent
    ordered chains of adds per q block (the kv block of rank ``r`` in chain ``r mod
    dq_chains``, each with its own accumulator and counter), summed in chain order by the
    conversion (deterministic). ``heavy_first`` (the dK/dV or the fused kernel, causal, no
    window or ``stats_lead``; ``"auto"``: ``default_heavy_first``): its grid runs kv block 0
    of every head first, then block 1, ... (the longest causal CTAs first); ordered, a q
    block's adds come in ascending kv block order, each CTA walking its q blocks from the
    last down.

    ``__post_init__`` raises ``ConfigError`` at the user's line for a combination outside
    the valid plans; checks that need the sizes (head dim, sequence lengths) are the
    kernels' builders'."""

    safe: bool | None = None
    atomic_dq: bool = False
    dq_bulk: bool = False
    dq_ordered: bool = False
    dq_convert: bool = False
    convert_lag: int | str = 0
    stats_lead: int | str = 0
    num_sms: int = 132
    dq_bkv: int | None = None
    dkdv_bq: int | None = None
    dkdv_overlap: bool | None = None
    fused_bq: int | None = None
    fused_defer: bool = False
    fused_pingpong: int = 0
    kv_split: int | str = 1
    dq_chains: int | str = 1
    heavy_first: bool | str = False

    def __post_init__(self):
        for name in ("atomic_dq", "dq_bulk", "dq_ordered", "dq_convert", "fused_defer"):
            object.__setattr__(self, name, bool(getattr(self, name)))
        for name in ("safe", "dkdv_overlap"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, bool(getattr(self, name)))
        if self.convert_lag and self.convert_lag != "auto" and not self.dq_convert:
            raise _plan_fail(f"BackwardPlan: convert_lag needs dq_convert, got convert_lag="
                             f"{self.convert_lag!r}, dq_convert={self.dq_convert!r}")
        if self.dq_convert and (not (self.atomic_dq and self.dq_bulk and self.dq_ordered)
                                or self.fused_bq or self.dkdv_bq not in (None, 64)):
            raise _plan_fail(f"BackwardPlan: dq_convert is for the ordered bulk-dQ dK/dV kernel "
                             f"(atomic_dq, dq_bulk and dq_ordered; 64-row q blocks; not "
                             f"fused_bq), got "
                             f"atomic_dq={self.atomic_dq!r}, dq_bulk={self.dq_bulk!r}, "
                             f"dq_ordered={self.dq_ordered!r}, dkdv_bq={self.dkdv_bq!r}, "
                             f"fused_bq={self.fused_bq!r}")
        _check_num_sms("BackwardPlan", self.num_sms, _plan_fail)
        if (self.fused_defer or self.fused_pingpong) and self.fused_bq is None:
            raise _plan_fail("BackwardPlan: fused_defer and fused_pingpong are schedules of "
                             "fused_bq=128")
        if self.fused_pingpong not in (0, 1, 2) or (self.fused_pingpong and self.fused_defer):
            raise _plan_fail(f"BackwardPlan: fused_pingpong must be 0, 1 or 2 and not with "
                             f"fused_defer, got {self.fused_pingpong!r}")
        if self.kv_split != "auto" and (self.kv_split not in KV_SPLITS
                                        or isinstance(self.kv_split, bool)):
            raise _plan_fail(f"BackwardPlan: kv_split must be one of {KV_SPLITS} or 'auto', "
                             f"got {self.kv_split!r}")
        if self.kv_split not in (1, "auto") and self.dkdv_bq not in (None, 64):
            raise _plan_fail(f"BackwardPlan: kv_split is for the fused kernel and the dK/dV "
                             f"kernel with 64-row q blocks, got kv_split={self.kv_split!r}, "
                             f"dkdv_bq={self.dkdv_bq!r}")
        check_dq_chains("BackwardPlan", self.dq_chains, self.dq_ordered, _plan_fail, auto=True)
        if self.heavy_first != "auto":
            if self.heavy_first not in (0, 1):
                raise _plan_fail(f"BackwardPlan: heavy_first must be a bool or 'auto', got "
                                 f"{self.heavy_first!r}")
            object.__setattr__(self, "heavy_first", bool(self.heavy_first))
        if self.fused_bq is not None:
            self._check_fused()
            return
        if self.dkdv_bq not in (None, 32, 64, 128):
            raise _plan_fail(f"BackwardPlan: dkdv_bq must be 32, 64 or 128, got {self.dkdv_bq!r}")
        if self.dq_bkv not in (None, 32, 64, 128) or (self.dq_bkv is not None
                                                      and self.atomic_dq):
            raise _plan_fail(f"BackwardPlan: dq_bkv must be 32, 64 or 128, and only for the "
                             f"pair (not atomic_dq), got {self.dq_bkv!r}")
        _check_dq_modes("BackwardPlan", self.atomic_dq, self.dq_bulk, self.dq_ordered,
                        _plan_fail)
        if self.stats_lead != "auto":
            resolve_stats_lead("BackwardPlan", self.stats_lead, 1, self.num_sms,
                               self.dq_ordered, bool(self.safe), self.dkdv_bq, False, _plan_fail)

    def _check_fused(self):
        """The fused kernel replaces the pair and has one schedule: ``fused_bq`` comes alone
        (or with ``dq_ordered``, ``kv_split``, ``heavy_first`` and its schedules)."""
        if self.fused_bq != FUSED_BQ:
            raise _plan_fail(f"BackwardPlan: fused_bq must be {FUSED_BQ}, got {self.fused_bq!r}")
        given = [n for n in ("safe", "atomic_dq", "dkdv_bq", "dkdv_overlap", "dq_bulk",
                             "dq_bkv") if getattr(self, n) not in (None, False)]
        given += [n for n in ("convert_lag", "stats_lead") if getattr(self, n) not in (0, "auto")]
        given += ["dq_chains"] if self.dq_chains not in (1, "auto") else []
        if given:
            raise _plan_fail(f"BackwardPlan: fused_bq={self.fused_bq} is a kernel of its own; "
                             f"it takes dq_ordered but not {', '.join(given)}")

    # ---------------------------------------------------------------- the valid plans
    @classmethod
    def default(cls, *, dq_bkv=None, dkdv_bq=None, dkdv_overlap=None, safe=None):
        """The deterministic dQ / dK-dV pair (``BackwardPlan()``)."""
        return cls(safe=safe, dq_bkv=dq_bkv, dkdv_bq=dkdv_bq, dkdv_overlap=dkdv_overlap)

    @classmethod
    def safe_pair(cls, *, dq_bkv=None, dkdv_bq=None, dkdv_overlap=None):
        """The pair with the simplest schedule (every block masked, stats read from global
        memory, each block's products waited for): a bisecting aid."""
        return cls.default(dq_bkv=dq_bkv, dkdv_bq=dkdv_bq, dkdv_overlap=dkdv_overlap, safe=True)

    @classmethod
    def atomic(cls, *, dkdv_bq=None, dkdv_overlap=None, safe=None):
        """Prep, the dK/dV kernel adding dQ with ``red.global.add``, conversion: no second pass
        over K and V; not deterministic; torch eager only."""
        return cls(safe=safe, atomic_dq=True, dkdv_bq=dkdv_bq, dkdv_overlap=dkdv_overlap)

    @classmethod
    def bulk(cls, *, dkdv_overlap=None, safe=None):
        """``atomic()`` with dQ tiles added by TMA tile reductions (in any order)."""
        return cls(safe=safe, atomic_dq=True, dq_bulk=True, dkdv_overlap=dkdv_overlap)

    @classmethod
    def ordered(cls, *, dkdv_bq=None, dkdv_overlap=None, safe=None, stats_lead=0, num_sms=132,
                kv_split=1, dq_chains=1):
        """``bulk()`` adding each dQ tile in a fixed order: deterministic. ``dkdv_bq=128``:
        128-row q blocks (D=128); ``dq_chains``: that many independent orders per q block."""
        return cls(safe=safe, atomic_dq=True, dq_bulk=True, dq_ordered=True, dkdv_bq=dkdv_bq,
                   dkdv_overlap=dkdv_overlap, stats_lead=stats_lead, num_sms=num_sms,
                   kv_split=kv_split, dq_chains=dq_chains)

    @classmethod
    def converted(cls, *, convert_lag=0, stats_lead=0, num_sms=132, dkdv_overlap=None,
                  kv_split=1, dq_chains=1, heavy_first=False):
        """``ordered()`` with dQ converted by the dK/dV grid itself (``num_sms`` converter
        CTAs; ``convert_lag``: earlier heads converted by its CTAs' idle producer warps)."""
        return cls(atomic_dq=True, dq_bulk=True, dq_ordered=True, dq_convert=True,
                   convert_lag=convert_lag, stats_lead=stats_lead, num_sms=num_sms,
                   dkdv_overlap=dkdv_overlap, kv_split=kv_split, dq_chains=dq_chains,
                   heavy_first=heavy_first)

    @classmethod
    def lagged(cls, *, num_sms=132, kv_split="auto", dq_chains="auto", heavy_first="auto"):
        """``converted()`` with ``convert_lag``, ``stats_lead``, ``kv_split``, ``dq_chains``
        and ``heavy_first`` ``"auto"``."""
        return cls.converted(convert_lag="auto", stats_lead="auto", num_sms=num_sms,
                             kv_split=kv_split, dq_chains=dq_chains, heavy_first=heavy_first)

    @classmethod
    def fused(cls, *, ordered=True, pingpong=0, defer=False, kv_split=1):
        """The one-kernel backward at D=64 (128-row q blocks, dQ by bulk reductions, in a fixed
        order with ``ordered``); ``pingpong`` 1 or 2: warpgroup 1 half a block behind
        warpgroup 0; ``defer``: a block's dK product issued after the next block's S and dP;
        ``kv_split``: a group's q heads over a cluster's CTAs."""
        return cls(fused_bq=FUSED_BQ, dq_ordered=ordered, fused_pingpong=pingpong,
                   fused_defer=defer, kv_split=kv_split)

    @classmethod
    def for_eager(cls, D, deterministic=True):
        """The fastest plan for torch eager calls at head dim ``D``: ``fused(pingpong=1,
        kv_split="auto")`` at 64
        (any order unless ``deterministic``), ``lagged()`` at 128 (a group's query heads
        split over a cluster's CTAs: ``kv_split="auto"``), ``bulk()`` when not
        ``deterministic``; the pair with ``PYPTX_ATTN_BWD_SAFE=1``. A size it refuses runs the
        pair (``AttentionBackward.with_fallback``)."""
        safe = safe_default()
        if D == 64 and not safe:
            return cls.fused(ordered=deterministic, pingpong=1, kv_split="auto")
        if not deterministic:
            return cls.bulk()
        if D == 128 and not safe:
            return cls.lagged()
        return cls()

    @classmethod
    def from_options(cls, **options):
        """The plan of ``build_attention_backward``'s option keywords (``parse_options``'
        dict): ``ConfigError`` for a name that is not a field."""
        unknown = sorted(set(options) - {f.name for f in fields(cls)})
        if unknown:
            raise _plan_fail(f"BackwardPlan: unknown options {', '.join(unknown)}")
        return cls(**options)

    @property
    def name(self) -> str:
        """The plan's name: ``fused``, ``converted``, ``ordered``, ``bulk``, ``atomic``,
        ``safe`` or ``pair``."""
        return ("fused" if self.fused_bq else "converted" if self.dq_convert
                else "ordered" if self.dq_ordered else "bulk" if self.dq_bulk
                else "atomic" if self.atomic_dq else "safe" if self.safe else "pair")

    def resolved(self) -> BackwardPlan:
        """This plan with ``safe`` taken from ``PYPTX_ATTN_BWD_SAFE`` where it is ``None``
        (checked again)."""
        return self if self.safe is not None else replace(self, safe=safe_default())

    def options(self) -> dict:
        """The fields that differ from ``BackwardPlan()``'s, as option keywords."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != f.default}


