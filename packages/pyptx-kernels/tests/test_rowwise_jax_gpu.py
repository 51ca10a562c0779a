"""GPU tests of the row-wise memory-bound examples under ``jax.jit`` (``pytest -m gpu``).

RMSNorm, LayerNorm, softmax and SwiGLU, f32 and bf16 storage, regular and
ragged N, against float64 numpy references on the same (bf16-rounded) inputs:
relative L2 error below 1e-5 (f32) / 1e-2 (bf16). Before each launch the
allocator's free blocks are filled with NaN so an unwritten element shows.
"""

from __future__ import annotations

import os
import re

import pytest
from pyptx_kernels._modules import kernel_module

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
np = pytest.importorskip("numpy")



def _gpus():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _gpus(), reason="needs a GPU for JAX")]

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
TOL = {"f32": 1e-5, "bf16": 1e-2}
SIZES = [(3, 7), (5, 1000), (3, 4097), (64, 8192)]

_mods: dict[str, object] = {}


def load(name: str):
    mod = _mods.get(name)
    if mod is None:
        mod = _mods[name] = kernel_module(name)
    return mod


def f64(a):
    return np.asarray(jnp.asarray(a).astype(jnp.float32), np.float64)


def rel_err(out, ref):
    out = f64(out)
    assert np.isfinite(out).all(), "non-finite output: an element was not written"
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def poison(shape):
    jnp.full(shape, jnp.nan, jnp.float32).block_until_ready()


def rand(key, shape, dt, scale=1.0, shift=0.0):
    return (jax.random.normal(key, shape, jnp.float32) * scale + shift).astype(DTYPES[dt])


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,N", SIZES)
def test_rms_norm(B, N, dt):
    k = load("rms_norm").build_rms_norm_fast(B, N, dt)
    kx, kw = jax.random.split(jax.random.key(B * N + 1))
    x, w = rand(kx, (B, N), dt, 2.0, 0.3), rand(kw, (N,), dt, 0.1, 1.0)
    poison((B, N))
    y = jax.jit(lambda x, w: k(x, w))(x, w)
    assert y.shape == (B, N) and y.dtype == DTYPES[dt]
    x64, w64 = f64(x), f64(w)
    ref = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w64
    assert rel_err(y, ref) < TOL[dt]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,N", SIZES)
def test_layer_norm(B, N, dt):
    k = load("layer_norm").build_layer_norm(B, N, dt)
    kx, kw, kb = jax.random.split(jax.random.key(B * N + 2), 3)
    x = rand(kx, (B, N), dt, 2.0, 0.5)
    w, b = rand(kw, (N,), dt, 0.1, 1.0), rand(kb, (N,), dt, 0.1)
    poison((B, N))
    y = jax.jit(lambda x, w, b: k(x, w, b))(x, w, b)
    x64 = f64(x)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    ref = (x64 - mu) / np.sqrt(var + 1e-5) * f64(w) + f64(b)
    assert rel_err(y, ref) < TOL[dt]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,N", SIZES)
def test_softmax(B, N, dt):
    k = load("softmax").build_softmax_fast(B, N, dt)
    x = rand(jax.random.key(B * N + 3), (B, N), dt, 3.0)
    poison((B, N))
    y = jax.jit(lambda x: k(x))(x)
    x64 = f64(x)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    assert rel_err(y, e / e.sum(-1, keepdims=True)) < TOL[dt]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,N", SIZES)
def test_swiglu(B, N, dt):
    k = load("swiglu").build_swiglu(B, N, dt)
    kg, ku = jax.random.split(jax.random.key(B * N + 4))
    g, u = rand(kg, (B, N), dt, 3.0), rand(ku, (B, N), dt)
    poison((B, N))
    y = jax.jit(lambda g, u: k(g, u))(g, u)
    g64 = f64(g)
    assert rel_err(y, g64 / (1.0 + np.exp(-g64)) * f64(u)) < TOL[dt]


def test_ops_compose_under_one_jit():
    B, N = 32, 4096
    rms = load("rms_norm").build_rms_norm_fast(B, N, "bf16")
    glu = load("swiglu").build_swiglu(B, N, "bf16")
    kx, kw, ku = jax.random.split(jax.random.key(5), 3)
    x, w, u = rand(kx, (B, N), "bf16"), rand(kw, (N,), "bf16", 0.1, 1.0), rand(ku, (B, N), "bf16")
    y = jax.jit(lambda x, w, u: glu(rms(x, w), u))(x, w, u)
    x64 = f64(x)
    h = f64(jnp.asarray(x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * f64(w),
                        jnp.bfloat16))
    assert rel_err(y, h / (1.0 + np.exp(-h)) * f64(u)) < 2e-2


def test_eager_call_tunes_and_jit_uses_the_winner(tmp_path, monkeypatch, capsys):
    """With timing asked for (``PYPTX_AUTOTUNE=1``), an eager call on jax arrays times the
    variants (pyptx.autotune, wall clock); a later jit trace, which cannot time, takes that
    winner."""
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PYPTX_AUTOTUNE", "1")
    B, N = 256, 4096
    k = load("rms_norm").build_rms_norm_fast(B, N, "bf16", 1e-6)
    kx, kw = jax.random.split(jax.random.key(9))
    x, w = rand(kx, (B, N), "bf16", 2.0, 0.3), rand(kw, (N,), "bf16", 0.1, 1.0)
    y = k(x, w)
    assert k.choice is not None and k.choice.source == "timed" and k.choice.us > 0
    # the tuner's one line for this builder and key (then the target, device, winner, time)
    assert re.search(r"^pyptx\.autotune: build_rms_norm_fast\(B=256, N=4096, dtype=bf16[,)].*"
                     r" on .+: .+ us \(", capsys.readouterr().err, re.M)
    assert list((tmp_path / "autotune").glob("*.json"))
    x64, w64 = f64(x), f64(w)
    ref = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w64
    assert rel_err(y, ref) < TOL["bf16"]
    assert rel_err(jax.jit(lambda x, w: k(x, w))(x, w), ref) < TOL["bf16"]
    assert k.kernel is k.choose(x, w)
