"""Choosing a plan without timing: the device key, size buckets, the shipped tables
(``pyptx_kernels/tuning/<device>.json``) and each op's heuristic behind them.

A default call of a library op settles its plan as ``pyptx.autotune`` does for a builder
with a ``default=`` plan: the winner saved on disk for the exact shape (``tune()`` or
``PYPTX_AUTOTUNE=1`` put it there), else the shipped table's plan for the shape's bucket on
this device (``lookup``), else the op's heuristic (``Planner.heuristic``), else the first
config. Nothing is timed.

A table file::

    {"device": "h200",
     "ops": {"matmul": {"source": "how the entries were measured",
                        "buckets": {"K=4096,M=4096,N=4096": "128x256x64_s4_c2", ...}}}}

A bucket names each size by the smallest value of the series 1, 2, 3, 4, 6, 8, 12, 16, ...
(powers of two and their halfway points ``3 * 2**k``) at or above it, clamped to
``MAX_BUCKET``; text and flags (dtypes, layouts, scale kinds) are kept as they are. Op names
and their size keys are shared with the other ops' plans: ``"matmul"`` (M, N, K),
``"grouped_mm"`` (M, N, K, G, b_major), ``"grouped_mm_wgrad"`` (M, KX, NY, G),
``"scaled_mm"`` (M, N, K, scale), ``"attention_fwd"``, ``"attention_bwd"``, ``"rms_norm"``, ...
``tools/tune_table.py`` regenerates a device's table on that device.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pyptx._dataclass import dataclass

TABLES = Path(__file__).with_name("tuning")
"""Where the shipped tables live (package data)."""

MAX_BUCKET = 1 << 20
"""The largest bucket of a size: larger sizes share it."""

KNOWN = {"h100": ("H100",), "h200": ("H200", "GH200")}
"""Device keys with a shipped table, and the device-name fragments that map to them."""


def device_key(name: str | None = None) -> str:
    """The table key of a device name: ``"h100"`` for any H100, ``"h200"`` for an H200 or
    GH200, otherwise the name in lower case with runs of other characters as ``_``
    (``"nvidia_b200"``; no table ships for it: the heuristic decides). ``name=None``: the
    current GPU's name (torch's current CUDA device, else JAX's default device, whichever
    is imported and sees a GPU), else ``"other"``."""
    if name is None:
        name = _current_device_name()
        if name is None:
            return "other"
    return _key_of(name)


@functools.lru_cache(maxsize=16)
def _key_of(name: str) -> str:
    upper = name.upper()
    for key, marks in KNOWN.items():
        if any(re.search(rf"(^|[^A-Z]){m}([^0-9]|$)", upper) for m in marks):
            return key
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "other"


def _current_device_name() -> str | None:
    """The name a launch's timer gives the current GPU (``pyptx.autotune``'s ``TorchTimer``:
    torch's device name; ``JaxTimer``: the default device's ``device_kind``), from the
    framework already imported; None without one or without a GPU."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return torch.cuda.get_device_name()
        except Exception:  # a CPU build, no driver: no device to name
            pass
    jax = sys.modules.get("jax")
    if jax is not None:
        try:
            dev = jax.devices()[0]
            return dev.device_kind if dev.platform == "gpu" else None
        except Exception:  # no backend: no device to name
            return None
    return None


def bucket(n: int) -> int:
    """The bucket of size ``n``: the smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (``2**k``
    and ``3 * 2**k``) that is at least ``n``, clamped to 1..``MAX_BUCKET``."""
    n = max(1, min(int(n), MAX_BUCKET))
    p = 1 << (n - 1).bit_length()           # the power of two at or above n
    half = 3 * p // 4
    return half if p >= 4 and n <= half else p


def bucket_key(sizes: Mapping[str, Any]) -> str:
    """The table key of ``sizes``: ``name=value`` sorted by name and joined by commas, each
    int as its ``bucket``, anything else (dtype names, layouts, flags) as ``str``."""
    parts = []
    for name in sorted(sizes):
        v = sizes[name]
        if isinstance(v, int) and not isinstance(v, bool):
            v = bucket(v)
        parts.append(f"{name}={v}")
    return ",".join(parts)


@functools.lru_cache(maxsize=16)
def table(device: str) -> Mapping[str, Any]:
    """The shipped table of device key ``device`` (``{"ops": {op: {"buckets": ...}}}``), or an
    empty one when none ships or it cannot be read."""
    try:
        data = json.loads((TABLES / f"{device}.json").read_text())
    except (OSError, ValueError):
        return {"ops": {}}
    return data if isinstance(data.get("ops"), dict) else {"ops": {}}


def lookup(op: str, sizes: Mapping[str, Any], device: str | None = None) -> str | None:
    """The plan name the shipped table of ``device`` (a key, ``device_key()`` of the current
    device when None) gives ``op`` at ``sizes``' bucket, or None where it has none."""
    entry = table(device or device_key()).get("ops", {}).get(op)
    if not isinstance(entry, Mapping):
        return None
    plan = entry.get("buckets", {}).get(bucket_key(sizes))
    return plan if isinstance(plan, str) else None


@dataclass(frozen=True)
class Planner:
    """An op's choice without timing, as a ``pyptx.autotune`` ``default=`` plan: the table's
    plan for the call's bucket, else ``heuristic``'s.

    ``op``: the table's op name; ``sizes``: the sizes the table keys on, from the tuned
    builder's key values (``keyvals -> {name: value}``); ``plans``: every plan name and the
    tuner ``Config`` that runs it; ``heuristic``: ``sizes -> plan name`` (frozen logic in the
    op's ``config.py``)."""

    op: str
    sizes: Callable[[Mapping[str, Any]], dict]
    plans: Mapping[str, Any]
    heuristic: Callable[..., str]

    def choose(self, keyvals: Mapping[str, Any], device: str | None = None) -> tuple[str, str]:
        """``(plan name, "table" or "heuristic")`` a default call takes for these key values
        on ``device`` (a device name; None: the current device)."""
        sizes = self.sizes(keyvals)
        key = device_key(device) if device is not None else device_key()
        name = lookup(self.op, sizes, key)
        if name in self.plans:
            return name, "table"
        return self.heuristic(**sizes), "heuristic"

    def name_of(self, config: Any) -> str | None:
        """The plan name of a tuner ``Config`` (None: not one of ``plans``)."""
        return next((n for n, c in self.plans.items() if c == config), None)

    def __call__(self, keyvals: Mapping[str, Any], device: str | None) -> Any:
        return self.plans.get(self.choose(keyvals, device)[0])


PLANNERS: dict[str, Planner] = {}
"""Planners by the ident of the tuned builder they plan (``tools/tune_table.py`` maps each
timed winner to its op, bucket and plan name through them)."""


def planned(tuned: Any, planner: Planner) -> Any:
    """``tuned`` (a ``pyptx.autotune.TunedBuilder``) choosing through ``planner`` when no
    winner is saved, registered in ``PLANNERS``."""
    PLANNERS[tuned.ident] = planner
    return tuned.with_default(planner)


def tuning_requested() -> bool:
    """Whether launches time their candidates now (``PYPTX_AUTOTUNE=1`` or inside
    ``tune()``): ops that choose outside ``pyptx.autotune`` ask this."""
    from pyptx.autotune import TUNE, mode

    return mode() is TUNE


def tune(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with every tuned kernel it launches timed for these exact
    shapes (unless a winner is already saved for them) and the winners kept on disk, so this
    process's and later processes' default calls on these shapes run them. Returns ``fn``'s
    result. Timing is on for the whole process while ``fn`` runs (autograd's backward thread
    included). The candidates run many times on these arguments: ``fn`` must not update its
    inputs in place."""
    from pyptx.autotune import tuning
    from pyptx.errors import ConfigError
    from pyptx_kernels._common import fail

    if not callable(fn):
        raise fail(ConfigError, "tune", f"fn must be a callable (a pyptx_kernels function, a "
                   f"model, a training step), got {type(fn).__name__}")
    with tuning():
        return fn(*args, **kwargs)
