"""f32 arithmetic on lists of registers that the row kernels share: trees, dot products,
scaling, ``rsqrt`` and the normalising factor of RMSNorm/LayerNorm."""

from __future__ import annotations

import math
from typing import Any

from .. import ptx, reg
from ..types import f32

__all__ = ["LOG2E", "NEG_INF", "tree", "dot", "mul_all", "rsqrt", "rstd"]

LOG2E = 1.0 / math.log(2.0)
NEG_INF = float("-inf")


def tree(vals: list, op: str) -> Any:
    """Combine ``vals`` pairwise with ``add``/``max`` (log depth); returns a register."""
    vals = list(vals)
    if len(vals) == 1:
        out = reg.scalar(f32)
        ptx.inst.mov.f32(out, vals[0])
        return out
    while len(vals) > 1:
        nxt = []
        for i in range(0, len(vals) - 1, 2):
            r = reg.scalar(f32)
            ptx.inst(f"{op}.f32")(r, vals[i], vals[i + 1])
            nxt.append(r)
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    return vals[0]


def dot(a: list, b: list, lanes: int = 4) -> Any:
    """sum(a[i] * b[i]) with ``lanes`` independent fma chains, then a tree."""
    lanes = min(lanes, len(a))
    acc = [reg.scalar(f32) for _ in range(lanes)]
    for i in range(lanes):
        ptx.inst.mul.f32(acc[i], a[i], b[i])
    for i in range(lanes, len(a)):
        ptx.inst.fma.rn.f32(acc[i % lanes], a[i], b[i], acc[i % lanes])
    return tree(acc, "add")


def mul_all(vals: list, s: Any) -> list:
    """``[v * s for v in vals]``, one ``mul.f32`` each."""
    out = []
    for v in vals:
        r = reg.scalar(f32)
        ptx.inst.mul.f32(r, v, s)
        out.append(r)
    return out


def rsqrt(x: Any) -> Any:
    """``rsqrt.approx.ftz.f32`` of ``x`` into a fresh register."""
    r = reg.scalar(f32)
    ptx.inst.rsqrt.approx.ftz.f32(r, x)
    return r


def rstd(total: Any, n: int, eps: float) -> Any:
    """``rsqrt(total / n + eps)``: the normalising factor of RMSNorm and LayerNorm."""
    ms = reg.scalar(f32)
    ptx.inst.fma.rn.f32(ms, total, 1.0 / n, eps)
    return rsqrt(ms)


