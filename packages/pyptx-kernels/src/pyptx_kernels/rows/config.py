"""The row kernels' configuration: ``RowConfig`` (a frozen, validated plan), each op's tuned
table of them, ``default_plan`` (the plan chosen without timing where the shipped table of
``pyptx_kernels._tuning`` has none), the target architectures (``ARCHS``, ``for_arch``,
``device_arch``) and ``tuned``, the wiring shared by the four ops' builders (``config=None``:
a ``pyptx.autotune.TunedKernel`` that takes a saved winner, the table's or the heuristic's
plan, timing only when asked; a ``RowConfig``: exactly that plan)."""

from __future__ import annotations

import dataclasses
import functools
import inspect

from pyptx._dataclass import dataclass
from pyptx.errors import ConfigError, SpecError
from pyptx_kernels._common import _ARCH_OF_DEVICE, _capability_arch, device_arch, where  # noqa: F401

_INTS = ("chunks", "threads", "rows", "ctas", "stages", "maxnreg")
_BOOLS = ("bulk_store", "bulk", "welford", "pdl", "pdl_prefetch")
_HINTS = {"l2_load": "l2_load", "l2_store": "l2_store", "store_cache": "store",
          "pdl_prefetch": "pdl_prefetch", "load_cache": "load"}  # field -> pyptx.rows.Hints


#: code objects that are the library's though outside its files (``RowConfig.__init__``)


@dataclass(frozen=True)
class RowConfig:
    """One plan of a row kernel; ``plan`` names it, and only valid plans can be made.

    * ``"row"`` (the default): one row per thread group, all of it in registers; ``chunks``
      (16-byte vectors per thread), ``threads`` (per row) and ``rows`` (per CTA) override the
      shape ``pyptx.rows.plan_rows`` picks (SwiGLU: ``threads`` per CTA, default 256).
    * ``"persistent"`` (``ctas=P``): ``P`` CTAs walk the rows, the next row's loads in flight.
    * ``"ring"`` (``ctas=P, stages=S``, ``S >= 2``): rows streamed into ``S`` shared-memory
      slots by ``cp.async.bulk`` (RMSNorm, LayerNorm); ``bulk_store`` writes back through them.
    * ``"bulk"`` (``bulk=True``, SwiGLU): each CTA's slices copied in by ``cp.async.bulk``;
      ``bulk_store`` writes its output slice back the same way.

    ``welford`` (LayerNorm, row or persistent plan): one all-reduce of (mean, m2) pairs.
    ``maxnreg`` adds ``.maxnreg``; ``pdl`` launches with programmatic dependent launch. The
    cache hints ``l2_load``, ``l2_store``, ``store_cache``, ``load_cache`` and ``pdl_prefetch``
    are ``hints`` (``pyptx.rows.Hints``). A bad value or combination raises a ``PyptxError``
    at the caller's line; what a plan cannot do at a shape, the builder refuses.
    """

    chunks: int | None = None
    threads: int | None = None
    rows: int | None = None
    ctas: int | None = None
    stages: int | None = None
    bulk_store: bool = False
    bulk: bool = False
    welford: bool = False
    maxnreg: int | None = None
    pdl: bool = True
    l2_load: str = ""
    l2_store: str = ""
    store_cache: str = ""
    pdl_prefetch: bool = True
    load_cache: str = ""

    def __post_init__(self) -> None:
        for name in _INTS:
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise SpecError(f"{where()}: RowConfig: {name} must be a positive int, got {v!r}")
        for name in _BOOLS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{where()}: RowConfig: {name} must be True or False, got "
                                  f"{getattr(self, name)!r}")
        if self.stages is not None:
            if self.ctas is None:
                self._refuse("stages=S is the TMA ring, which needs ctas=P too")
            if self.stages < 2:  # each reduction slot is rewritten one step later
                self._refuse(f"a TMA ring needs stages >= 2, got {self.stages}")
            if self.welford:
                self._refuse("welford=True is a variant of the one-row and persistent kernels; "
                             "drop stages")
            if self.rows is not None:
                self._refuse("the TMA ring takes one row per CTA step; drop rows")
        if self.bulk and (self.ctas is not None or self.rows is not None or self.welford):
            self._refuse("bulk=True is SwiGLU's bulk-copy kernel; drop ctas, rows and welford")
        if self.bulk_store and self.stages is None and not self.bulk:
            self._refuse("bulk_store=True writes back through the TMA ring (ctas, stages) or "
                         "SwiGLU's bulk copy (bulk=True)")
        try:
            self.hints  # noqa: B018 - checks the hint values
        except ConfigError as e:
            raise ConfigError(f"{where()}: RowConfig: {str(e).split(': ', 1)[-1]}") from None

    def _refuse(self, why: str):
        raise ConfigError(f"{where()}: {self!r}: {why}")

    @property
    def plan(self) -> str:
        """``"row"``, ``"persistent"``, ``"ring"`` or ``"bulk"`` (see the class)."""
        if self.stages is not None:
            return "ring"
        if self.ctas is not None:
            return "persistent"
        return "bulk" if self.bulk else "row"

    @property
    def hints(self):
        """The cache hints as ``pyptx.rows.Hints``."""
        from pyptx import rows as rw

        return rw.Hints(**{h: getattr(self, f) for f, h in _HINTS.items()})

    @property
    def kwargs(self) -> dict:
        """The fields that differ from the defaults, in field order (``RowConfig(**kwargs)``
        is this config; a ``pyptx.autotune.Config`` of them names it to the tuner)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}

    def describe(self) -> str:
        """``ctas=264 stages=4``, or ``defaults``."""
        return " ".join(f"{k}={v}" for k, v in self.kwargs.items()) or "defaults"

    def __repr__(self) -> str:
        return "RowConfig(" + ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items()) + ")"



#: The default plan: the planner's one-row kernel with PDL and no hints.
DEFAULT = RowConfig()

#: The fields each builder takes (the others must keep their defaults).
_SHAPE = ("chunks", "threads", "rows")
_HINT_FIELDS = tuple(_HINTS)
FIELDS = {
    "rms_norm": (*_SHAPE, "ctas", "stages", "bulk_store", "maxnreg", "pdl", *_HINT_FIELDS),
    "layer_norm": (*_SHAPE, "ctas", "stages", "bulk_store", "maxnreg", "pdl", "welford",
                   *_HINT_FIELDS),
    "softmax": (*_SHAPE, "ctas", "maxnreg", "pdl", *_HINT_FIELDS),
    "swiglu": ("chunks", "threads", "bulk", "bulk_store", "pdl", *_HINT_FIELDS),
    "swiglu_backward": ("chunks", "threads", "pdl", *_HINT_FIELDS),
    "backward": (*_SHAPE, "ctas"),
}


def check(config, who: str, op: str) -> RowConfig:
    """``config`` if it is a ``RowConfig`` whose fields ``op``'s builder takes (``FIELDS``)."""
    if not isinstance(config, RowConfig):
        raise ConfigError(f"{where()}: {who}: config must be a RowConfig, got {config!r}")
    extra = [k for k in config.kwargs if k not in FIELDS[op]]
    if extra:
        raise ConfigError(f"{where()}: {who}: {config!r} sets {', '.join(extra)}, which this "
                          f"kernel does not take (it takes {', '.join(FIELDS[op])})")
    return config


# ----------------------------------------------------------------------------- tuned tables
def _table(*configs: dict) -> tuple[RowConfig, ...]:
    return tuple(RowConfig(**c) for c in configs)


#: The plans shared by the three row ops: the one-row kernel (the planner's shape first: the
#: choice when tuning is off) and every other chunks per thread, each with and without PDL,
#: and persistent at two CTAs per SM of an H100 (264 CTAs; one per SM never won a cell).
_ROW_PLANS = (
    {}, dict(chunks=1), dict(chunks=2), dict(chunks=8), dict(pdl=False),
    dict(chunks=1, pdl=False), dict(chunks=2, pdl=False), dict(chunks=8, pdl=False),
    dict(ctas=264, pdl=False),
)
#: ... and the norms' TMA ring at two CTAs per SM.
_RING_PLANS = (dict(ctas=264, stages=3), dict(ctas=264, stages=4),
               dict(ctas=264, stages=4, bulk_store=True))

#: What ``build_rms_norm_fast(B, N, dtype)`` tunes over, per shape and device.
RMS_NORM_CONFIGS = _table(*_ROW_PLANS, *_RING_PLANS)
#: What ``build_layer_norm(B, N, dtype)`` tunes over: the norms' plans and the one-pass
#: (``welford``) kernel, for short rows (the tuner skips it where N leaves a partial chunk).
LAYER_NORM_CONFIGS = _table(
    *_ROW_PLANS, *_RING_PLANS,
    dict(welford=True), dict(welford=True, pdl=False), dict(welford=True, chunks=1, pdl=False),
    dict(welford=True, ctas=264, pdl=False))
#: What ``build_softmax_fast(B, N, dtype)`` tunes over.
SOFTMAX_CONFIGS = _table(*_ROW_PLANS)
#: What ``build_swiglu(B, N, dtype)`` tunes over: 256 threads x 1 vector first, more vectors
#: or threads per CTA, with and without PDL (among them Triton's launch shape, 256 threads x
#: 16 elements, and inductor's 128 x 8), and the bulk-copy kernel at 512 and 1024 threads,
#: loads only or stores too (sizes whose bytes are not a multiple of 16 skip it).
SWIGLU_CONFIGS = _table(
    {}, dict(chunks=2), dict(chunks=4), dict(threads=512), dict(pdl=False),
    dict(chunks=2, pdl=False), dict(chunks=4, pdl=False),
    dict(threads=128), dict(threads=128, pdl=False), dict(threads=128, chunks=2),
    dict(threads=128, chunks=2, pdl=False),
    dict(bulk=True, threads=512), dict(bulk=True, threads=1024),
    dict(bulk=True, threads=512, bulk_store=True))
#: What ``build_swiglu_backward(B, N, dtype)`` tunes over: the forward's one-pass plans.
SWIGLU_BACKWARD_CONFIGS = tuple(c for c in SWIGLU_CONFIGS if c.plan == "row")


# ----------------------------------------------------------------------------- architectures
#: The targets the row builders take: Ampere, Hopper, Blackwell.
ARCHS = ("sm_80", "sm_90a", "sm_100a")
#: The builders' default target.
DEFAULT_ARCH = "sm_90a"
#: Targets with the Hopper steps the plans may use: PDL (``griddepcontrol``), the bulk copy
#: engine (``cp.async.bulk``, its L2 prefetch, mbarrier ``expect_tx``); Blackwell keeps them.
_HOPPER_STEPS = ("sm_90a", "sm_100a")


def check_arch(arch, who: str) -> str:
    """``arch`` if it is one of ``ARCHS``."""
    if arch not in ARCHS:
        raise ConfigError(f"{where()}: {who}: arch must be one of {', '.join(ARCHS)}, got "
                          f"{arch!r}")
    return arch


def for_arch(config: RowConfig, arch: str, who: str) -> RowConfig:
    """``config`` as it builds for ``arch``: on a target without PDL and the bulk copy engine
    (sm_80) PDL and its L2 prefetch are off, and the plans that need the copy engine (``ring``,
    ``bulk``) are refused with a ``ConfigError``."""
    if arch in _HOPPER_STEPS:
        return config
    if config.plan in ("ring", "bulk"):
        raise ConfigError(f"{where()}: {who}: {config!r} is the {config.plan!r} plan, which "
                          f"copies rows with cp.async.bulk; {arch} has no bulk copy engine "
                          f"(plans there: row, persistent)")
    if not config.pdl:
        return config
    return dataclasses.replace(config, pdl=False)


def persistent_maxnreg(config: RowConfig, plan, arch: str) -> int | None:
    """``.maxnreg`` of a persistent row kernel: the config's; on sm_80 without one,
    ``pyptx.rows.reg_cap(plan)`` (sm_80's ptxas otherwise settles on 56 registers and spills
    the two register sets of f32 1000-element rows)."""
    if config.maxnreg is not None or arch != "sm_80":
        return config.maxnreg
    from pyptx import rows as rw

    return rw.reg_cap(plan)


# ----------------------------------------------------------------------------- plan, untimed
#: CTAs of the persistent plans in the shipped heuristic: two per SM of an H100/H200 (132).
_H_CTAS = 264


def default_plan(op: str, rows: int, N: int, dtype, arch: str = DEFAULT_ARCH) -> RowConfig:
    """The plan a default call takes where the shipped table has none, chosen without timing.

    From the recorded do_bench winners (``docs/benchmarks/memory_bound.md``: H100 and H200,
    256x4096 ... 8192x8192; where the two disagree, the H200's, and the top configs of a
    cell are within ~1.5% of each other): rows shorter than a wave of a full GPU (under 512)
    run without PDL (do_bench charges a PDL launch 2-3 us); f32 norms and softmax take 8
    chunks per thread (256 threads per 8192-element row); bf16 RMSNorm at 512-4095 rows the
    persistent plan (two CTAs per SM) and 2 chunks from 4096 rows; SwiGLU 128-thread CTAs
    (its backward, ``swiglu_backward``, takes the forward's choice).
    ``sm_80`` takes the one-row plans without PDL; ``sm_100a`` the Hopper choice with the
    one-row plan in place of the persistent one (its CTA count is the H100's). ``op`` is
    ``rms_norm``, ``layer_norm``, ``softmax``, ``swiglu`` or ``swiglu_backward``; ``dtype``
    f32 or bf16 (any name ``pyptx.rows.dtype_of`` takes)."""
    from pyptx import rows as rw

    if op not in FIELDS or op == "backward":
        raise ConfigError(f"{where()}: default_plan: op must be one of rms_norm, layer_norm, "
                          f"softmax, swiglu, swiglu_backward, got {op!r}")
    check_arch(arch, "default_plan")
    bf16 = rw.dtype_of(dtype, "default_plan").name == "bf16"
    few = rows < 512
    if op in ("swiglu", "swiglu_backward"):
        elems = rows * N
        if bf16:
            c = dict(threads=128, chunks=2) if elems < 2**21 else dict(threads=128, pdl=False)
        else:
            c = dict(pdl=False) if elems < 2**21 else dict(threads=128)
    elif not bf16:
        c = (dict(chunks=2, pdl=False) if op == "rms_norm" else dict(pdl=False)) if few \
            else dict(chunks=8)
    elif op == "rms_norm":
        if few:
            c = {}
        elif rows < 4096 and N <= 16384 and arch == "sm_90a":
            c = dict(ctas=_H_CTAS, pdl=False)
        elif rows < 4096:
            c = dict(pdl=False)
        else:
            c = dict(chunks=2)
    elif op == "layer_norm":
        c = dict(chunks=2, pdl=False) if few else {}
    else:
        c = dict(chunks=2, pdl=False) if few else {}
    config = RowConfig(**c)
    return config if arch in _HOPPER_STEPS else dataclasses.replace(config, pdl=False)


def _planner(op: str, table: tuple[RowConfig, ...]):
    """The ``pyptx_kernels._tuning.Planner`` of ``op``: the shipped table's plan for the
    call's bucket (sizes ``rows``, ``N``, ``dtype``, ``arch``), else ``default_plan``'s; plans
    are named by ``RowConfig.describe()``."""
    from pyptx import rows as rw
    from pyptx.autotune import Config
    from pyptx_kernels import _tuning

    def sizes(keyvals):
        return {"rows": keyvals["B"], "N": keyvals["N"],
                "dtype": rw.dtype_of(keyvals["dtype"], op).name, "arch": keyvals["arch"]}

    def heuristic(rows, N, dtype, arch):
        return default_plan(op, rows, N, dtype, arch).describe()

    return _tuning.Planner(op, sizes, {c.describe(): Config(**c.kwargs) for c in table},
                           heuristic)


# ----------------------------------------------------------------------------- builders
def one_trace(kernel, problem, B):
    """``kernel`` (a row builder's, for ``B`` rows) specialized from the code of its family's
    first trace (``pyptx_kernels._family``): the row count is the ``nrows`` kernel parameter,
    so the family is the builder's ``problem`` (name, ``N``, dtype, other arguments, plan,
    arch) and the launch shape bar ``B`` (its ``plan``, where whether the last CTA has rows
    past ``B`` changes the code, or its ``geometry`` bar the grid). A kernel with neither is
    traced per size."""
    from pyptx import Kernel
    from pyptx_kernels import _family

    plan, geometry = getattr(kernel, "plan", None), getattr(kernel, "geometry", None)
    if not isinstance(kernel, Kernel) or (plan is None and geometry is None):
        return kernel
    shape = ((plan.vec, plan.threads, plan.chunks, plan.rows, plan.ragged_rows) if plan
             else tuple(sorted((k, v) for k, v in geometry.items() if k != "grid")))
    return _family.specialized(kernel, ("rows", kernel.name, *problem, shape), {"nrows": B})


SIBLING_ROWS = (1, 3, 8, 33, 64, 65, 257, 1024, 1025, 4096, 4097, 16384, 16385, 65536)
"""Row counts whose plans a row builder compiles ahead after its first default call (both
parities of the larger ones: a last CTA with rows past ``B`` is another family)."""


def tuned(op: str, table: tuple[RowConfig, ...]):
    """Make ``build(B, N, dtype, *problem, config, arch)`` a row builder.

    ``config=None``: a ``pyptx.autotune.TunedKernel`` over ``table`` (key: ``B``, ``N``,
    ``dtype``, ``arch``) that settles its plan at the first launch on a device without timing
    (a winner saved for the exact shape, else the shipped table's plan for the bucket, else
    ``default_plan``: ``pyptx_kernels._tuning``), and times the table only when asked
    (``PYPTX_AUTOTUNE=1``, ``pyptx_kernels.tune``). A ``RowConfig``: that plan, checked
    against the fields ``op`` takes (``FIELDS``) and the arch (``for_arch``), built directly.
    ``arch`` (keyword, default ``sm_90a``) is one of ``ARCHS``."""
    from pyptx.autotune import Config, autotune
    from pyptx_kernels import _tuning

    def wrap(build):
        sig = inspect.signature(build)
        name = build.__name__

        def built(B, N, dtype, rest, config, arch):
            return one_trace(build(B, N, dtype, *rest, config=config, arch=arch),
                             (name, N, dtype, rest, config, arch), B)

        def variant(B, N, dtype, problem=(), arch=DEFAULT_ARCH, **fields):
            return built(B, N, dtype, tuple(problem), for_arch(RowConfig(**fields), arch, name),
                         arch)

        variant.__name__ = variant.__qualname__ = name
        tuner = autotune([Config(**c.kwargs) for c in table],
                         key=["B", "N", "dtype", "arch"])(variant)
        tuner.ident = f"{build.__module__.rsplit('.', 1)[-1]}.{name}"  # the on-disk winners' key
        planner = _planner(op, table)
        tuner = _tuning.planned(tuner, planner)
        warmed = set()

        def warm_siblings(N, dtype, rest, arch):
            """Trace (once per family) and assemble into the disk cache the kernel a default
            call takes at each of ``SIBLING_ROWS``, so a later row count of another plan
            launches without running ptxas."""
            from pyptx_kernels import _family

            for B in SIBLING_ROWS:
                plan = planner({"B": B, "N": N, "dtype": dtype, "arch": arch}, None)
                if plan is not None:
                    _family.assemble(variant(B, N, dtype, rest, arch, **plan.kwargs))

        @functools.wraps(build)
        def builder(*args, config=None, arch=DEFAULT_ARCH, **problem):
            try:
                bound = sig.bind(*args, config=config, arch=arch, **problem)
            except TypeError as e:
                raise ConfigError(f"{where()}: {name}: {e}") from None
            bound.apply_defaults()
            B, N, dtype, *rest = (v for k, v in bound.arguments.items()
                                  if k not in ("config", "arch"))
            arch = check_arch(arch, name)
            if config is None:
                if (N, dtype, tuple(rest), arch) not in warmed:
                    from pyptx_kernels import _family

                    warmed.add((N, dtype, tuple(rest), arch))
                    _family.in_background(
                        functools.partial(warm_siblings, N, dtype, tuple(rest), arch))
                return tuner(B, N, dtype, tuple(rest), arch)
            check(config, name, op)
            return built(B, N, dtype, tuple(rest), for_arch(config, arch, name), arch)

        builder.tuner = tuner
        builder.configs = table
        builder.warm_siblings = warm_siblings
        return builder

    return wrap


__all__ = ["RowConfig", "DEFAULT", "FIELDS", "check", "tuned", "RMS_NORM_CONFIGS", "LAYER_NORM_CONFIGS",
           "SOFTMAX_CONFIGS", "SWIGLU_CONFIGS", "SWIGLU_BACKWARD_CONFIGS", "ARCHS", "DEFAULT_ARCH",
           "check_arch", "for_arch", "device_arch", "default_plan", "persistent_maxnreg"]
