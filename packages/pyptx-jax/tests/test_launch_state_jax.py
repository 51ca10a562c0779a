"""The JAX launch state is a bounded LRU (issue 18 item 1: alternating shapes do not thrash,
many shapes do not pile up), checked without a GPU through jit lowering."""

from __future__ import annotations

import re

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import pyptx_jax.launch as jl  # noqa: E402
from pyptx import Tile, kernel, ptx  # noqa: E402
from pyptx.types import f32  # noqa: E402


def make_kernel():
    @kernel(in_specs=(Tile("B", "N", f32),), out_specs=(Tile("B", "N", f32),),
            grid=lambda B: (B, 1, 1), block=(32, 1, 1))
    def copy_rows(X, Y):
        ptx.ret()

    return copy_rows


def handle_of(k, b):
    traced = jax.jit(lambda a: k(a)).trace(jax.ShapeDtypeStruct((b, 64), jnp.float32))
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    return int(re.search(r"cubin_handle = (\d+) : ui64", text).group(1))


def test_plans_are_a_bounded_lru(monkeypatch):
    monkeypatch.setattr(jl, "PLAN_SLOTS", 2)
    k = make_kernel()
    state = k.launcher("jax").state
    first = [handle_of(k, b) for b in (1, 2)]
    assert len(state.plans) == 2
    assert handle_of(k, 1) == first[0]  # a hit: B=1 becomes the most recent
    handle_of(k, 3)  # drops B=2, the least recently used
    assert len(state.plans) == 2
    kept = {plan.handle for plan in state.plans.values()}
    assert first[0] in kept and first[1] not in kept
    assert handle_of(k, 2) == first[1]  # planned again: the same record by content hash
