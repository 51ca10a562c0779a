"""The two default calls the GEMM benchmarks time side by side: the table-driven one (each
tuned kernel on its shipped-table or heuristic plan, saved winners ignored:
``pyptx.autotune.tuning("table")``) and the per-shape-tuned one (each kernel's timed winner
for the exact shape: ``tuning("tune")``, which times the candidates at its first call unless
a winner is saved). Nothing here imports a framework."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def table_and_tuned(call: Callable[[], Any]) -> tuple[Callable[[], Any], Callable[[], Any], str]:
    """``(table_call, tuned_call, plans)`` for a zero-argument ``call`` of a library op:
    both settled here (the tuned one times its candidates now), and ``plans`` naming each
    kernel's table plan and tuned winner (``"128x256x64_s4_c2 / 192x192x64_s3_c1"``, one pair
    per tuned kernel, ``=`` where they agree)."""
    from pyptx.autotune import TABLE, TUNE, tuning

    with tuning(TUNE) as tuned_log:
        call()
    with tuning(TABLE) as table_log:
        call()

    def table_call():
        with tuning(TABLE):
            return call()

    def tuned_call():
        with tuning(TUNE):
            return call()

    tuned = {id(k): c.config for k, c in tuned_log}
    pairs = []
    for k, c in table_log:
        a, b = plan_name(k, c.config), plan_name(k, tuned.get(id(k), c.config))
        pairs.append(f"{a} =" if a == b else f"{a} / {b}")
    return table_call, tuned_call, "; ".join(pairs) or "-"


def plan_name(kernel: Any, config: Any) -> str:
    """The plan name of a tuner ``config`` of tuned ``kernel`` (its op's ``Planner``), else
    the config's own description."""
    from pyptx_kernels._tuning import PLANNERS

    planner = PLANNERS.get(kernel.tuner.ident)
    name = planner.name_of(config) if planner is not None else None
    return name or config.describe()
