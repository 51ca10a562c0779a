"""Timing and table helpers shared by the benchmarks (``dispatch.py``, ``memory_bound.py``,
``cold_start.py``): host µs per call, interleaved rounds, summary statistics, markdown tables.

GPU timers that need torch or Triton (CUDA graphs, ``do_bench``) stay in the benchmark that
uses them; nothing here imports a framework.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any


def _timed_calls(fn: Callable[[], Any], finish: Callable[[Any], Any],
                 calls: int) -> tuple[float, float, float]:
    """``calls`` back-to-back calls of ``fn``, then ``finish`` of the last result, with the
    collector off: the clock before the calls, after them, and after ``finish``."""
    gc.collect()
    gc.disable()
    try:
        r = None
        t0 = time.perf_counter()
        for _ in range(calls):
            r = fn()
        t_loop = time.perf_counter()
        finish(r)
        t1 = time.perf_counter()
    finally:
        gc.enable()
    return t0, t_loop, t1


def host_us_per_call(fn: Callable[[], Any], finish: Callable[[Any], Any],
                     calls: int) -> tuple[float, float]:
    """Host µs per call of ``calls`` back-to-back calls, the final wait included, and the
    share of the loop spent in that final wait (large when the GPU, not the host, set the pace)."""
    t0, t_loop, t1 = _timed_calls(fn, finish, calls)
    return (t1 - t0) / calls * 1e6, (t1 - t_loop) / (t1 - t0)


def enqueue_us_per_call(fn: Callable[[], Any], finish: Callable[[Any], Any], calls: int) -> float:
    """Host µs per call of a short burst from an idle device, the final wait excluded: the
    pure dispatch cost, even for a path whose kernel outlasts its dispatch (the burst stays
    under the launch queue's depth, so the host never waits for the GPU)."""
    t0, t_loop, _ = _timed_calls(fn, finish, calls)
    return (t_loop - t0) / calls * 1e6


def rotated(names: list, r: int) -> list:
    """Round ``r``'s timing order: ``names`` rotated left by ``r`` (each leads once per cycle)."""
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def interleaved(time_ms: Callable[[Any], float], fns: dict, rounds: int) -> dict:
    """{name: [ms per round]}: ``time_ms(fn)`` for every entry of ``fns`` in each of ``rounds``
    rounds, in ``rotated`` order."""
    out: dict = {name: [] for name in fns}
    for r in range(rounds):
        for name in rotated(list(fns), r):
            out[name].append(time_ms(fns[name]))
    return out


def median_min_max(vals: list[float]) -> tuple[float, float, float] | None:
    """``(median, min, max)`` of ``vals``, or None when there are none."""
    return (statistics.median(vals), min(vals), max(vals)) if vals else None


def markdown_table(head: list[str], body: list[list[str]]) -> list[str]:
    """Lines of a markdown table whose columns are padded to a common width."""
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(b) for b in body]


def gpu_missing(script: str, triton: bool = True) -> str | None:
    """Why ``script`` cannot time anything on this machine (no CUDA torch, no visible GPU,
    or, with ``triton``, no Triton for ``do_bench``), or None when it can. Imports torch."""
    try:
        import torch
    except ImportError:
        return f"{script} needs torch built with CUDA (torch is not installed)"
    if not torch.cuda.is_available():
        return (f"{script} times GPU kernels and needs a CUDA GPU: torch.cuda.is_available() "
                f"is False (torch {torch.__version__})")
    if triton:
        try:
            import triton.testing  # noqa: F401
        except ImportError:
            return f"{script} needs Triton: triton.testing.do_bench times every contender"
    return None
