"""Choose a kernel builder's configuration per shape: a saved winner, a default plan, or by
timing the candidates on the device when asked.

``@autotune(configs=[...], key=[...], default=...)`` decorates a *kernel builder*: a function
of shape parameters and keyword options that returns a ``Kernel`` (or any kernel-like
callable with ``in_specs``/``out_specs``)::

    @pyptx.autotune(configs=[Config(), Config(threads=512), Config(ctas=264)],
                    key=["B", "N", "dtype"])
    def build_rms_norm_fast(B, N, dtype, *, threads=None, ctas=None): ...

    k = build_rms_norm_fast(2048, 8192, "bf16")   # a TunedKernel; nothing is timed
    y = k(x, w)                                   # a saved winner, else the default plan

Which config a launch runs is settled once per device (``PYPTX_AUTOTUNE`` is read at each
call):

* unset (the default): the winner saved on disk for this exact key and device, else
  ``default(keyvals, device)`` (the builder's plan without timing: a shipped table, a
  heuristic; None or a config that does not build falls through), else the first config that
  builds. **Nothing is timed.**
* ``PYPTX_AUTOTUNE=1`` (``on``/``true``/``yes``), or inside ``with tuning():``: the saved
  winner, else the candidates are timed on the call's own arguments and the fastest is kept
  on disk; later default calls of this process and later processes use it.
* ``PYPTX_AUTOTUNE=0`` (``off``/``false``/``no``): the first config that builds, without
  disk or timing.
* ``with tuning("table"):`` (benchmarks, tools): the default plan, ignoring saved winners.

A timing builds every config (a config the builder refuses with a ``PyptxError`` is skipped,
and so is one whose kernel is the same launch as an earlier config's), assembles each with
ptxas and skips any that ptxas rejects or that spills registers, launches the rest on the
call's own arguments and times them (``Timer``: CUDA events for torch, wall clock
after ``block_until_ready`` for jax; warm-up, then the median; a timer with ``rounds``
times every config once per round, interleaved, and the tuner takes the median of the
rounds), and keeps the fastest. The tuner *re-runs the kernel* on the caller's arguments many
times: the kernels it is meant for write fresh outputs and leave their inputs alone; a kernel
that updates an input in place must not be tuned this way (pass its config
explicitly). The winner is written beside the compiled-kernel cache
(``pyptx.cache.cache_dir() / "autotune"``), keyed by the builder's name, the key
values, the device name, the pyptx version and the config list. One line on stderr reports
each timing.

* Passing any config keyword explicitly (``build(..., threads=512)``) calls the
  builder directly: no choice, the builder's own result.
* Where no device can be named (inside ``jax.jit`` or ``torch.compile``, or on CPU arrays)
  the last choice of this process is used, else the default plan for the current device
  (``PYPTX_AUTOTUNE=0``: the first config that builds).
* Only the configs a launch or a timing takes are built: the builder call itself builds the
  plan a launch on the current device takes (so arguments no config takes fail there).
* After an eager torch call, the next call on the same device goes straight to the
  chosen kernel (one type check, one device comparison and one mode check).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import math
import os
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ._dataclass import dataclass
from .errors import ConfigError, PyptxError, ToolchainError
from .source import where

__all__ = ["autotune", "Config", "TunedBuilder", "TunedKernel", "Timer", "AutotuneError",
           "Choice", "timer_for", "set_timer", "tuning", "mode"]

ENV = "PYPTX_AUTOTUNE"
#: builder calls (argument tuples) whose ``TunedKernel`` a decorated builder keeps
MEMO_SIZE = 256
_SCALARS = (int, float, str, bool, type(None))


_ENV_DATA = getattr(os.environ, "_data", None)   # os.environ's own dict (encoded keys)
_ENV_KEY = os.environ.encodekey(ENV) if _ENV_DATA is not None else None

#: The modes a launch settles its config in (``mode()``); compared by identity on the hot path.
OFF, PLAN, TUNE, TABLE = "off", "plan", "tune", "table"
MODES = (OFF, PLAN, TUNE, TABLE)
_ENV_MODES: dict[Any, str] = {}
#: ``tuning()``'s mode and log while one is open. Process-wide, not per thread: torch runs a
#: CUDA backward on its own autograd thread, and ``tune(fn)`` must reach those launches too.
_FORCED: str | None = None
_LOG: list | None = None


def mode() -> str:
    """How a launch settles its config now: ``"plan"`` (the default: saved winner, else the
    builder's default plan, never timing), ``"tune"`` (``PYPTX_AUTOTUNE=1`` or inside
    ``tuning()``: saved winner, else timing), ``"off"`` (``PYPTX_AUTOTUNE=0``: the first
    config) or ``"table"`` (inside ``tuning("table")``: the default plan, no saved winners).

    Read at each call: it is on every tuned launch, so the raw variable is looked up in
    ``os.environ``'s own dict (~20x cheaper than ``os.environ.get``) and its meaning is
    remembered per raw value."""
    forced = _FORCED
    if forced is not None:
        return forced
    raw = _ENV_DATA.get(_ENV_KEY) if _ENV_DATA is not None else os.environ.get(ENV)
    m = _ENV_MODES.get(raw)
    if m is None:
        text = os.environ.get(ENV, "").strip().lower()
        m = OFF if text in ("0", "off", "false", "no") else (
            TUNE if text in ("1", "on", "true", "yes") else PLAN)
        _ENV_MODES[raw] = m
    return m


def _switched_off() -> bool:
    """True while ``PYPTX_AUTOTUNE`` is 0/off/false/no (and no ``tuning()`` overrides it)."""
    return mode() is OFF


@contextlib.contextmanager
def tuning(how: str = TUNE) -> Iterator[list]:
    """Inside, every tuned launch settles its config in mode ``how`` whatever
    ``PYPTX_AUTOTUNE`` says: ``"tune"`` (the default: time the candidates for the exact key
    unless a winner is saved, and save the winner) or ``"table"`` (the builder's default
    plan, saved winners ignored: what a default call runs on a never-tuned shape), ``"plan"``
    or ``"off"``. Yields a list that receives ``(TunedKernel, Choice)`` for every config
    settled inside (tools read the winners from it). The mode holds for the whole process
    while the block runs (autograd's backward threads included); blocks nest."""
    if how not in MODES:
        raise AutotuneError(f"{where()}: tuning() mode must be one of {MODES}, got {how!r}")
    how = MODES[MODES.index(how)]   # the constant itself: modes are compared by identity
    global _FORCED, _LOG
    log: list = []
    outer = _FORCED, _LOG
    _FORCED, _LOG = how, log
    try:
        yield log
    finally:
        _FORCED, _LOG = outer


class AutotuneError(ConfigError):
    """A bad ``Config``/``key``, or no config of a tuning could be built, assembled and run."""


# ----------------------------------------------------------------------------- configs
class Config:
    """One candidate: the keyword arguments the builder gets on top of the call's own.

    Values are plain scalars (int, float, str, bool, None) so a winner can be kept on disk.
    """

    __slots__ = ("kwargs",)

    def __init__(self, **kwargs: Any) -> None:
        for name, value in kwargs.items():
            if not isinstance(value, _SCALARS) or (isinstance(value, float)
                                                   and not math.isfinite(value)):
                raise AutotuneError(
                    f"{where()}: Config({name}=...) must be an int, float, str, bool or None "
                    f"(kept on disk as JSON), got {value!r}")
        object.__setattr__(self, "kwargs", dict(kwargs))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Config is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and other.kwargs == self.kwargs

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.kwargs.items(), key=lambda kv: kv[0])))

    def describe(self) -> str:
        """``threads=512 ctas=264``, or ``defaults`` for an empty config."""
        return " ".join(f"{k}={v}" for k, v in self.kwargs.items()) or "defaults"

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items()) + ")"


@dataclass(frozen=True)
class Choice:
    """The outcome of one tuning: the winning config and its median time on ``device``."""

    config: Config
    us: float | None  # None: not timed
    device: str | None
    source: str       # "timed", "disk", "default" (the builder's default plan), "first"


# ----------------------------------------------------------------------------- timers
class Timer(Protocol):
    """How the tuner learns the device of a call and times a kernel on it."""

    def device_name(self, args: Sequence[Any]) -> str | None:
        """The name of the device the arrays in ``args`` live on (``"NVIDIA H100 80GB HBM3"``),
        or None when they cannot be launched on and timed (tracers, CPU arrays)."""

    def measure(self, kernel: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> float:
        """Median microseconds of ``kernel(*args, **kwargs)``, after warm-up."""


#: A launch at least this long (ms) gets ``TorchTimer.settle_ms`` of warm-up: see the class.
LONG_LAUNCH_MS = 1.0


class TorchTimer:
    """CUDA events around each launch, the L2 cleared before each (like ``triton.testing.do_bench``):
    about ``warmup_ms`` of warm-up, then about ``rep_ms`` of timed launches, median.

    Each config runs alone for its burst, as in ``do_bench``, not launch by launch beside the
    others: long tensor-core kernels run at the H100's power cap, where the SM clock follows
    each kernel's own draw (8192x28672x8192 bf16 GEMM, seconds back to back: 1365-1395 MHz
    at 700 W; 192x192 tiles 720 TFLOP/s, 128x256 700, cuBLAS 701), so a config's speed there
    is a property of the config alone. A launch of ``LONG_LAUNCH_MS`` or more is warmed up for
    ``settle_ms`` so the clock has settled to that config's draw before the timing starts."""

    def __init__(self, warmup_ms: float = 25.0, rep_ms: float = 100.0, rounds: int = 3,
                 settle_ms: float = 100.0) -> None:
        self.warmup_ms = warmup_ms
        self.settle_ms = settle_ms
        self.rep_ms = rep_ms
        #: The tuner times every config once per round, interleaved, and takes the median.
        self.rounds = rounds
        self._flush: dict[Any, Any] = {}

    def device_name(self, args: Sequence[Any]) -> str | None:
        """The CUDA device's name; None for CPU tensors, fake tensors and under compile."""
        import torch

        if torch.compiler.is_compiling():
            return None
        for a in args:
            if isinstance(a, torch.Tensor):
                if type(a).__name__ == "FakeTensor" or a.device.type != "cuda":
                    return None
                return torch.cuda.get_device_name(a.device)
        return None

    def measure(self, kernel: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> float:
        """Median microseconds of one launch, L2 cleared before each (see the class)."""
        import torch

        dev = next(a.device for a in args if isinstance(a, torch.Tensor))
        with torch.cuda.device(dev):
            kernel(*args, **kwargs)  # compile and load outside the timing
            torch.cuda.synchronize()
            flush = self._flush.get(dev)
            if flush is None:
                flush = self._flush[dev] = torch.empty(256 << 20, dtype=torch.int8, device=dev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                kernel(*args, **kwargs)
            end.record()
            torch.cuda.synchronize()
            est_ms = max(start.elapsed_time(end) / 5, 1e-3)
            warmup_ms = self.warmup_ms if est_ms < LONG_LAUNCH_MS else max(self.warmup_ms,
                                                                           self.settle_ms)
            for _ in range(max(1, int(warmup_ms / est_ms))):
                kernel(*args, **kwargs)
            reps = max(10, min(1000, int(self.rep_ms / est_ms)))
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(reps)]
            for s, e in events:
                flush.zero_()
                s.record()
                kernel(*args, **kwargs)
                e.record()
            torch.cuda.synchronize()
            return 1e3 * _median(s.elapsed_time(e) for s, e in events)


class JaxTimer:
    """Wall clock around ``jax.block_until_ready`` of each launch, median of ``reps``."""

    def __init__(self, warmup: int = 10, reps: int = 100) -> None:
        self.warmup = warmup
        self.reps = reps

    def device_name(self, args: Sequence[Any]) -> str | None:
        """The GPU's ``device_kind``; None for tracers and CPU arrays."""
        import jax

        for a in args:
            if isinstance(a, jax.core.Tracer):
                return None
            if isinstance(a, jax.Array):
                dev = next(iter(a.devices()))
                return dev.device_kind if dev.platform == "gpu" else None
        return None

    def measure(self, kernel: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> float:
        """Median microseconds of one launch and its ``block_until_ready``."""
        import jax

        for _ in range(self.warmup):
            jax.block_until_ready(kernel(*args, **kwargs))
        times = []
        for _ in range(self.reps):
            t0 = time.perf_counter()
            jax.block_until_ready(kernel(*args, **kwargs))
            times.append(time.perf_counter() - t0)
        return 1e6 * _median(times)


#: timers of the runtime plugins this repository ships, by plugin name; a plugin may instead
#: offer its own as ``autotune_timer()``.
_TIMERS: dict[str, Callable[[], Timer]] = {"torch": TorchTimer, "jax": JaxTimer}
_timer_cache: dict[str, Timer] = {}


def set_timer(runtime: str, timer: Timer | None) -> None:
    """Time the arrays of runtime plugin ``runtime`` (``"torch"``, ``"jax"``) with ``timer``
    from now on (tools: a quicker ``TorchTimer(rep_ms=...)``); None restores its own."""
    if timer is None:
        _timer_cache.pop(runtime, None)
    else:
        _timer_cache[runtime] = timer


def timer_for(args: Sequence[Any]) -> Timer | None:
    """The timer of the runtime plugin that owns the arrays in ``args``, or None (no plugin owns
    them, or it has no timer). The framework is imported by its plugin, not here."""
    from .runtimes import runtime_for

    try:
        rt = runtime_for(tuple(args))
    except PyptxError:
        return None
    t = _timer_cache.get(rt.name)
    if t is None:
        own = getattr(rt, "autotune_timer", None)
        make = own if own is not None else _TIMERS.get(rt.name)
        if make is None:
            return None
        t = _timer_cache[rt.name] = make()
    return t


# ----------------------------------------------------------------------------- disk
def _store_dir() -> Path | None:
    from .cache import cache_dir

    d = cache_dir()
    return None if d is None else d / "autotune"


def _read_choice(key: str) -> dict | None:
    d = _store_dir()
    if d is None:
        return None
    try:
        return json.loads((d / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def _write_choice(key: str, record: dict) -> None:
    d = _store_dir()
    if d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, d / f"{key}.json")
    except OSError:
        pass  # a read-only cache only costs a re-tune in the next process


def _key_value(value: Any) -> Any:
    """A key value as JSON: scalars as they are, dtypes by name (``torch.bfloat16`` -> ``bfloat16``)."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (tuple, list)):
        return [_key_value(v) for v in value]
    name = getattr(value, "name", None)
    if isinstance(name, str):
        return name
    return str(value).removeprefix("torch.")


# ----------------------------------------------------------------------------- the decorator
def autotune(configs: Iterable[Config], key: Sequence[str], *, timer: Timer | None = None,
             default: DefaultPlan | None = None
             ) -> Callable[[Callable[..., Any]], TunedBuilder]:
    """Decorate a kernel builder so a call without config keywords picks its config per key.

    ``configs``: the candidates, in order of preference (the first is the fallback and the
    pick when tuning is off). ``key``: names of the builder's parameters whose values select a
    choice (shape, dtype, ...); calls that differ only in other parameters share it.
    ``timer`` replaces the framework's ``Timer`` (tests use a fake one). ``default``: the
    plan of a call with no saved winner, without timing (``DefaultPlan``; None: the first
    config). Timing happens only when asked (``PYPTX_AUTOTUNE=1``, ``tuning()``).
    """
    at = where()
    configs = list(configs)
    if not configs or not all(isinstance(c, Config) for c in configs):
        raise AutotuneError(f"{at}: autotune(configs=...) must be a non-empty list of "
                            f"pyptx.autotune.Config, got {configs!r}")
    if isinstance(key, str) or not all(isinstance(k, str) for k in key):
        raise AutotuneError(f"{at}: autotune(key=...) must be a list of parameter names, "
                            f"got {key!r}")

    def wrap(builder: Callable[..., Any]) -> TunedBuilder:
        return TunedBuilder(builder, configs, list(key), timer, at, default)

    return wrap


class DefaultPlan(Protocol):
    """A builder's choice without timing: ``(keyvals, device) -> Config | None``.

    ``keyvals``: the call's key values as JSON scalars (dtypes by name); ``device``: the
    device name the launch runs on (``"NVIDIA H200"``), or None where none is known. A
    returned config must be one of the builder's configs; None (or one that does not build)
    falls back to the first config."""

    def __call__(self, keyvals: Mapping[str, Any], device: str | None) -> Config | None: ...


class TunedBuilder:
    """A builder decorated with ``@autotune``: calls return ``TunedKernel`` objects."""

    def __init__(self, builder: Callable[..., Any], configs: list[Config], key: list[str],
                 timer: Timer | None, at: str, default: DefaultPlan | None = None) -> None:
        self.builder = builder
        self.configs = configs
        self.key = key
        self.timer = timer
        #: The plan of a call with no saved winner (``DefaultPlan``), or None (first config).
        self.default = default
        self._at = at
        self.__wrapped__ = builder
        self.__doc__ = builder.__doc__
        self.__name__ = builder.__name__
        self.__qualname__ = builder.__qualname__
        self.signature = inspect.signature(builder)
        params = self.signature.parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for k in key:
            if k not in params:
                raise AutotuneError(f"{at}: autotune key {k!r} is not a parameter of "
                                    f"{builder.__qualname__}{self.signature}")
        for c in configs:
            for name in c.kwargs:
                if not takes_any and name not in params:
                    raise AutotuneError(f"{at}: {c!r} sets {name!r}, which is not a parameter of "
                                        f"{builder.__qualname__}{self.signature}")
        self.tuned_names = frozenset(n for c in configs for n in c.kwargs)
        stem = Path(builder.__code__.co_filename).stem if hasattr(builder, "__code__") else ""
        self.ident = f"{stem}.{builder.__qualname__}"
        self._kernels: dict[Any, TunedKernel] = {}
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A ``TunedKernel`` for these arguments, or, when a config keyword is given, the
        builder's own result."""
        if self.tuned_names.intersection(kwargs):
            return self.builder(*args, **kwargs)
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise AutotuneError(f"{where()}: {self.builder.__qualname__}: {e}") from None
        bound.apply_defaults()
        keyvals = {k: _key_value(bound.arguments[k]) for k in self.key}
        try:
            memo = (tuple(args), tuple(sorted(kwargs.items())))
            hash(memo)
        except TypeError:
            memo = None
        if memo is not None:
            hit = self._kernels.get(memo)
            if hit is not None:
                return hit
        k = TunedKernel(self, tuple(args), dict(kwargs), keyvals)
        # arguments no config takes fail here, with the builder's own error; what is built
        # is the plan a launch on the current device takes (no other kernel is built)
        k._untimed()
        if memo is not None:
            with self._lock:
                k = self._kernels.setdefault(memo, k)
                while len(self._kernels) > MEMO_SIZE:  # the oldest call's kernels go first
                    del self._kernels[next(iter(self._kernels))]
        return k

    def with_default(self, default: DefaultPlan | None) -> TunedBuilder:
        """This builder, configs and key with ``default`` as its plan without timing (a new
        ``TunedBuilder``; saved winners are shared, the ident being the builder's)."""
        return TunedBuilder(self.builder, self.configs, self.key, self.timer, self._at, default)

    def __repr__(self) -> str:
        return f"<autotuned {self.ident} ({len(self.configs)} configs, key={self.key})>"


class TunedKernel:
    """The kernel of one builder call; which config runs is settled per device at first launch.

    Attributes other than the ones below come from ``kernel``: the last launch's choice,
    or, before any, the plan a launch takes without timing (``PYPTX_AUTOTUNE=0``: the first
    config that builds; otherwise the ``default`` plan for the current device), so
    ``.ptx()``, ``.in_specs`` and ``.specialize()`` work on a machine without a GPU and
    describe the kernel a default launch runs. Only the configs a launch (or a timing)
    takes are built.
    """

    def __init__(self, tuner: TunedBuilder, args: tuple, kwargs: dict, keyvals: dict) -> None:
        self.tuner = tuner
        self.args = args
        self.kwargs = kwargs
        self.keyvals = keyvals
        self._built: dict[int, Any] = {}
        self._by_device: dict[tuple[str | None, bool], tuple[Any, Choice]] = {}
        self._last: tuple[Any, Choice] | None = None
        #: (array type, device, kernel) of the last eager torch call: the next call on the same
        #: device skips the device lookup (``__call__``'s fast path)
        self._hot: tuple[type, Any, Any] | None = None
        self._lock = threading.RLock()

    # -- building
    def build(self, config: Config) -> Any:
        """The builder's kernel for ``config`` (memoised, refusals too: a ``PyptxError``
        propagates)."""
        i = self.tuner.configs.index(config)
        hit = self._built.get(i)
        if hit is None:
            try:
                hit = self.tuner.builder(*self.args, **{**self.kwargs, **config.kwargs})
            except PyptxError as e:
                hit = e
            self._built[i] = hit
        if isinstance(hit, PyptxError):
            raise hit
        return hit

    def _first(self) -> tuple[Any, Config]:
        """The first config that builds and its kernel; if none does, the first config's
        error (the one a call of the untuned builder would raise)."""
        first: PyptxError | None = None
        for c in self.tuner.configs:
            try:
                return self.build(c), c
            except PyptxError as e:
                first = first or e
        assert first is not None
        raise first

    def default_config(self, device: str | None = None) -> Config:
        """The config a default call runs where no winner is saved: the builder's
        ``default`` plan for ``device`` if it names a config that builds, else the first
        config that builds."""
        return self._default(device)[1]

    def _default(self, device: str | None) -> tuple[Any, Config, str]:
        """``(kernel, config, source)`` of the default plan, ``source`` ``"default"``, or
        ``"first"`` where the builder has none or it falls through."""
        plan = self.tuner.default
        if plan is not None:
            cfg = plan(self.keyvals, device)
            if cfg is not None and cfg in self.tuner.configs:
                try:
                    return self.build(cfg), cfg, "default"
                except PyptxError:
                    pass
        return (*self._first(), "first")

    def _untimed(self) -> Any:
        """The kernel of a call that can name no device: the last choice, else the first
        config that builds under ``PYPTX_AUTOTUNE=0``, else the default plan for the current
        device (``default(keyvals, None)``), the plan a default launch on it takes where no
        winner is saved."""
        last = self._last
        if last is not None:
            return last[0]
        return self._first()[0] if mode() is OFF else self._default(None)[0]

    @property
    def kernel(self) -> Any:
        """The kernel attribute access goes to: the last choice, else ``_untimed``'s plan."""
        return self._untimed()

    @property
    def choice(self) -> Choice | None:
        """The last tuning's ``Choice`` (None before the first launch or ``choose``)."""
        return None if self._last is None else self._last[1]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("tuner", "args", "kwargs", "keyvals", "_built",
                                             "_by_device", "_last", "_hot", "_lock"):
            raise AttributeError(name)
        return getattr(self.kernel, name)

    # -- launching
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Launch the chosen kernel for the arguments' device (settled at the first call)."""
        hot = self._hot
        if (hot is not None and args and type(args[0]) is hot[0] and args[0].device == hot[1]
                and hot[3] is mode()):
            return hot[2](*args, **kwargs)
        return self.choose(*args, **kwargs)(*args, **kwargs)

    def choose(self, *args: Any, **kwargs: Any) -> Any:
        """The kernel to run on ``args``: settled on their device per mode (``mode()``) at the
        first call, then remembered.

        Where no device can be named (inside a trace), the last choice, else the plan of a
        default call on the current device (``PYPTX_AUTOTUNE=0``: the first config that
        builds); nothing is timed or stored."""
        timer = self.tuner.timer or timer_for(args)
        device = timer.device_name(args) if timer is not None else None
        if device is None:
            return self._untimed()
        how = mode()  # read at every call: a change takes effect at once
        hit = self._by_device.get((device, how))
        if hit is None:
            with self._lock:
                hit = self._by_device.get((device, how))
                if hit is None:
                    hit = self._settle(timer, device, how, args, kwargs)
                    self._by_device[(device, how)] = hit
                    if hit[1].source == "timed":   # later default calls take the winner
                        self._by_device[(device, PLAN)] = hit
                    log = _LOG
                    if log is not None:
                        log.append((self, hit[1]))
        self._last = hit
        if isinstance(timer, TorchTimer):
            self._hot = (type(args[0]), args[0].device, hit[0], how)
        return hit[0]

    def _disk_key(self, device: str) -> str:
        from . import __version__

        blob = json.dumps([self.tuner.ident, self.keyvals, device, __version__,
                           [c.kwargs for c in self.tuner.configs]], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def _settle(self, timer: Timer | None, device: str, how: str, args: Sequence[Any],
                kwargs: Mapping[str, Any]) -> tuple[Any, Choice]:
        if how is OFF:
            k, cfg = self._first()
            return k, Choice(cfg, None, device, "first")
        if how is not TABLE:
            rec = _read_choice(self._disk_key(device))
            if rec is not None:
                cfg = Config(**rec.get("config", {}))
                if cfg in self.tuner.configs:
                    try:
                        return self.build(cfg), Choice(cfg, rec.get("us"), device, "disk")
                    except PyptxError:
                        pass  # the builder changed: choose again
        if how is not TUNE or timer is None:
            k, cfg, source = self._default(device)
            return k, Choice(cfg, None, device, source)
        return self._tune(timer, device, args, kwargs)

    def _tune(self, timer: Timer, device: str, args: Sequence[Any],
              kwargs: Mapping[str, Any]) -> tuple[Any, Choice]:
        timed: list[tuple[float, int, Config, Any]] = []
        skipped: list[tuple[Config, str]] = []
        same: dict[tuple, Config] = {}
        for i, cfg in enumerate(self.tuner.configs):
            try:
                k = self.build(cfg)
            except PyptxError as e:
                skipped.append((cfg, f"not built: {_first_line(e)}"))
                continue
            try:
                specs = _specializations(k, args)
            except PyptxError as e:
                skipped.append((cfg, f"not traced: {_first_line(e)}"))
                continue
            if specs is not None:
                ident = _identity(specs)
                if ident in same:
                    skipped.append((cfg, f"same kernel as {same[ident].describe()}"))
                    continue
                same[ident] = cfg
                reason = _ptxas_verdict(specs)
                if reason is not None:
                    skipped.append((cfg, reason))
                    continue
            timed.append(([], i, cfg, k))
        # Interleaved rounds: a drift of the clocks over the tuning (heat, power) then
        # biases no config against the others.
        for _ in range(max(1, int(getattr(timer, "rounds", 1)))):
            for entry in list(timed):
                try:
                    entry[0].append(float(timer.measure(entry[3], args, kwargs)))
                except PyptxError as e:
                    skipped.append((entry[2], f"launch failed: {_first_line(e)}"))
                    timed.remove(entry)
        timed = [(_median(t), i, cfg, k) for t, i, cfg, k in timed]
        if not timed:
            why = "\n  ".join(f"{c.describe()}: {r}" for c, r in skipped)
            raise AutotuneError(f"{where()}: every config of {self.tuner.ident} was skipped for "
                                f"{self._describe_key()} on {device}:\n  {why}")
        us, _, cfg, k = min(timed, key=lambda t: (t[0], t[1]))
        line = (f"pyptx.autotune: {self.tuner.builder.__name__}({self._describe_key()}) on "
                f"{device}: {cfg.describe()} {us:.1f} us ({len(self.tuner.configs)} configs")
        if skipped:
            line += f", {len(skipped)} skipped: " + "; ".join(
                f"{c.describe()}: {r}" for c, r in skipped)
        print(line + ")", file=sys.stderr)
        _write_choice(self._disk_key(device), {
            "builder": self.tuner.ident, "key": self.keyvals, "device": device,
            "config": cfg.kwargs, "us": us,
            "timed": [{"config": c.kwargs, "us": t} for t, _, c, _ in timed],
            "skipped": [{"config": c.kwargs, "why": r} for c, r in skipped],
        })
        return k, Choice(cfg, us, device, "timed")

    def _describe_key(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.keyvals.items())

    def __repr__(self) -> str:
        return f"<TunedKernel {self.tuner.ident}({self._describe_key()})>"


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _kernels_of(k: Any) -> list:
    return list(k.kernels) if hasattr(k, "kernels") else [k]


def _specializations(k: Any, args: Sequence[Any]) -> list | None:
    """The traced specializations of every kernel of ``k`` for ``args`` (None when one of them
    is not a pyptx ``Kernel``); a ``PyptxError`` of the trace propagates."""
    from .errors import UnboundDimError

    specs = []
    for kk in _kernels_of(k):
        if not hasattr(kk, "specialize"):
            return None
        try:
            specs.append(kk.specialize())
        except UnboundDimError:
            specs.append(kk.specialize([tuple(a.shape) for a in args if hasattr(a, "shape")]))
    return specs


def _identity(specs: list) -> tuple:
    """What makes two configs' kernels the same launch: PTX and launch geometry."""
    return tuple((s.ptx(), s.grid, s.block, s.cluster, s.smem, s.pdl) for s in specs)


def _ptxas_verdict(specs: list) -> str | None:
    """None if ptxas assembles every specialization without spills (or there is no ptxas),
    else why the config is skipped."""
    from .errors import CompileError
    from .ptxas import check

    for spec in specs:
        try:
            report = check(spec)
        except ToolchainError:
            return None  # nothing to check with: time it
        except CompileError as e:
            return "ptxas rejects it: " + " ".join(str(e).split("\n")[:2])
        for e in report.entries:
            if e.spill_stores or e.spill_loads:
                return f"spills ({e.name}: {e.spill_stores} B stores, {e.spill_loads} B loads)"
    return None


class _CallableModule(types.ModuleType):
    """``pyptx.autotune`` is this module and the decorator at once: ``pyptx.autotune(...)``
    works whether or not ``pyptx.autotune`` was imported as a module first."""

    def __call__(self, configs: Iterable[Config], key: Sequence[str], *,
                 timer: Timer | None = None, default: DefaultPlan | None = None
                 ) -> Callable[[Callable[..., Any]], TunedBuilder]:
        return autotune(configs, key, timer=timer, default=default)


sys.modules[__name__].__class__ = _CallableModule


def _median(values: Iterable[float]) -> float:
    """``statistics.median`` (imported at the first timing: ``statistics`` and ``fractions``
    cost ~2 ms to import, and a default call times nothing)."""
    import statistics

    return statistics.median(values)
