"""Bad input to the JAX runtime, checkable without a GPU: each case raises a ``PyptxError``
whose message starts with this file and the line of the kernel call (never a frame inside
``pyptx_jax`` or JAX). Cases under ``jax.jit`` are traced only, never run."""

from __future__ import annotations

import os

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from pyptx import Tile, kernel, ptx  # noqa: E402
from pyptx.errors import PyptxError, ShapeError, SpecError  # noqa: E402
from pyptx.types import f32  # noqa: E402

HERE = os.path.abspath(__file__)


@kernel(in_specs=(Tile("B", "N", f32), Tile("N", f32)), out_specs=(Tile("B", "N", f32),),
        grid=lambda B: (B, 1, 1), block=(32, 1, 1))
def rowscale(X, W, Y):
    ptx.ret()


def sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def traced(fn, *args):
    return jax.jit(fn).trace(*args)


CASES = [
    (lambda: traced(lambda x, w: rowscale(x, w), sds((4, 64), jnp.float16), sds((64,))), SpecError, "argument 'X': expected dtype f32"),
    (lambda: traced(lambda x, w: rowscale(x, w), sds((4, 64)), sds((64,), jnp.int32)), SpecError, "argument 'W': expected dtype f32"),
    (lambda: traced(lambda x, w: rowscale(x, w), sds((4, 64)), sds((65,))), ShapeError, "argument 'W' dim 0 ('N'): expected 64"),
    (lambda: traced(lambda x, w: rowscale(x, w), sds((4, 64, 1)), sds((64,))), ShapeError, "argument 'X': expected rank 2"),
    (lambda: traced(lambda x, w: rowscale(x, w, N=32), sds((4, 64)), sds((64,))), ShapeError, "expected 32"),
    (lambda: traced(lambda x, w: rowscale(x, w, Q=1), sds((4, 64)), sds((64,))), SpecError, "unknown keyword 'Q'"),
    (lambda: traced(lambda x: rowscale(x), sds((4, 64))), SpecError, "takes 2 input tensors (X, W), got 1"),
    (lambda: traced(lambda x, w: rowscale(x, w, x), sds((4, 64)), sds((64,))), SpecError, "takes 2 input tensors"),
    (lambda: rowscale(jnp.ones((4, 64)), jnp.ones(64)), SpecError, "argument 'X' is on cpu"),
    (lambda: rowscale(jnp.ones((4, 64)), jnp.ones(64, dtype=jnp.int32)), SpecError, ""),
]


@pytest.mark.parametrize("case, exc, text", CASES, ids=[f"L{c.__code__.co_firstlineno}" for c, *_ in CASES])
def test_jax_mistake_is_reported_at_the_callers_line(case, exc, text):
    with pytest.raises(exc) as ei:
        case()
    msg = str(ei.value)
    assert isinstance(ei.value, PyptxError)
    assert msg.startswith(f"{HERE}:{case.__code__.co_firstlineno}: "), msg
    assert text in msg, msg
