"""GPU tests of the flash-attention forward example from JAX: ``jax.jit`` of ``attention``
(dense, causal, grouped-query) and of ``attention_varlen``, against float64 numpy on fresh
random bf16 inputs with ragged lengths. Tolerances (``check`` in the example): max
|o - ref| / max(1, |ref|) <= 2e-2 for bf16 output, lse relative error <= 1e-3."""

from __future__ import annotations

import math
import os

import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
np = pytest.importorskip("numpy")


pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("jax_gpu")]  # conftest.py: skip without one

from pyptx_kernels.flash_attention import fwd_host as fa


def _ref(q, k, v, causal):
    """float64 (o, lse) of one sequence: q (S, Hq, D), k/v (Sk, Hkv, D)."""
    S, Hq, D = q.shape
    Sk, Hkv, _ = k.shape
    g = Hq // Hkv
    o = np.zeros((S, Hq, D))
    lse = np.full((Hq, S), -np.inf)
    if Sk == 0:
        return o, lse
    for h in range(Hq):
        s = q[:, h] @ k[:, h // g].T / math.sqrt(D)
        if causal:
            s = np.where(np.arange(Sk)[None, :] > np.arange(S)[:, None], -np.inf, s)
        mx = s.max(axis=1, keepdims=True)
        e = np.exp(s - mx)
        lse[h] = np.log(e.sum(axis=1)) + mx[:, 0]
        o[:, h] = (e / e.sum(axis=1, keepdims=True)) @ v[:, h // g]
    return o, lse


def _close(o, lse, ro, rl):
    o = np.asarray(o, np.float64)
    lse = np.asarray(lse, np.float64)
    assert not np.isnan(o).any()
    assert (np.abs(o - ro) / np.maximum(np.abs(ro), 1)).max() <= 2e-2
    fin = np.isfinite(rl)
    assert (np.isfinite(lse) == fin).all()
    assert (np.abs(lse[fin] - rl[fin]) / np.maximum(np.abs(rl[fin]), 1)).max() <= 1e-3


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_jit_dense(D, causal):
    rng = np.random.default_rng(D)
    B, S, Hq, Hkv = 2, 200, 4, 2
    q = jnp.asarray(rng.standard_normal((B, S, Hq, D)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((B, S, Hkv, D)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((B, S, Hkv, D)), jnp.bfloat16)
    o, lse = jax.jit(lambda a, b, c: fa.attention_forward(a, b, c, causal=causal))(q, k, v)
    o2 = jax.jit(lambda a, b, c: fa.attention(a, b, c, causal=causal))(q, k, v)
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    for bi in range(B):
        ro, rl = _ref(q64[bi], k64[bi], v64[bi], causal)
        _close(o[bi], lse[bi], ro, rl)
        o2b = np.asarray(o2[bi], np.float64)
        assert (np.abs(o2b - ro) / np.maximum(np.abs(ro), 1)).max() <= 2e-2


@pytest.mark.parametrize("causal", [False, True])
def test_jit_varlen(causal):
    rng = np.random.default_rng(1)
    lens_q = [77, 1, 200, 128]
    lens_k = lens_q if causal else [77, 5, 333, 128]
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = jnp.asarray(rng.standard_normal((cq[-1], 4, 128)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((ck[-1], 2, 128)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((ck[-1], 2, 128)), jnp.bfloat16)
    f = jax.jit(lambda a, b, c, d, e: fa.attention_varlen_forward(
        a, b, c, d, e, max(lens_q), max(lens_k), causal=causal))
    o, lse = f(q, k, v, jnp.asarray(cq), jnp.asarray(ck))
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    o, lse = np.asarray(o, np.float64), np.asarray(lse, np.float64)
    for bi in range(len(lens_q)):
        a, e, ka, ke = cq[bi], cq[bi + 1], ck[bi], ck[bi + 1]
        ro, rl = _ref(q64[a:e], k64[ka:ke], v64[ka:ke], causal)
        _close(o[a:e], lse[:, a:e], ro, rl)


def _ref_grads(q, k, v, do, cq, ck, causal):
    """float64 numpy ``(dq, dk, dv)`` of packed attention, sequence by sequence (causal: top
    left; a query with no keys gets no gradient)."""
    Hq, D, Hkv = q.shape[1], q.shape[2], k.shape[1]
    g = Hq // Hkv
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for bi in range(len(cq) - 1):
        a, e, ka, ke = cq[bi], cq[bi + 1], ck[bi], ck[bi + 1]
        if e == a or ke == ka:
            continue
        kr, vr = np.repeat(k[ka:ke], g, 1), np.repeat(v[ka:ke], g, 1)
        s = np.einsum("qhd,khd->hqk", q[a:e], kr) / math.sqrt(D)
        if causal:
            s = s + np.triu(np.full((e - a, ke - ka), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", p, vr)
        dp = np.einsum("qhd,khd->hqk", do[a:e], vr)
        ds = p * (dp - (do[a:e] * o).sum(-1).T[..., None]) / math.sqrt(D)
        dq[a:e] = np.einsum("hqk,khd->qhd", ds, kr)
        dk[ka:ke] = np.einsum("hqk,qhd->khd", ds, q[a:e]).reshape(ke - ka, Hkv, g, D).sum(2)
        dv[ka:ke] = np.einsum("hqk,qhd->khd", p, do[a:e]).reshape(ke - ka, Hkv, g, D).sum(2)
    return dq, dk, dv


@pytest.mark.parametrize("D,causal", [(64, True), (128, False)])
def test_grad_varlen(D, causal):
    """``jax.grad`` through ``attention_varlen`` (the varlen backward pair) on ragged
    lengths with an empty q and an empty k sequence, GQA: against float64 numpy, per
    gradient ``||g - ref|| / ||ref||`` < 1e-2 (bf16; test_flash_attention_bwd_gpu.py's)."""
    rng = np.random.default_rng(D + causal)
    lens_q, lens_k = [0, 70, 129, 5], [33, 0, 200, 64]
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q, do = (jnp.asarray(rng.standard_normal((cq[-1], 4, D)), jnp.bfloat16) for _ in range(2))
    k, v = (jnp.asarray(rng.standard_normal((ck[-1], 2, D)), jnp.bfloat16) for _ in range(2))

    def loss(a, b, c):
        o = fa.attention_varlen(a, b, c, jnp.asarray(cq), jnp.asarray(ck), max(lens_q),
                                max(lens_k), causal=causal)
        return (o.astype(jnp.float32) * do.astype(jnp.float32)).sum()

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    refs = _ref_grads(*(np.asarray(x, np.float64) for x in (q, k, v, do)), cq, ck, causal)
    for name, g, r in zip(("dq", "dk", "dv"), got, refs):
        g = np.asarray(g, np.float64)
        assert not np.isnan(g).any(), name
        assert np.linalg.norm(g - r) / np.linalg.norm(r) < 1e-2, name


def test_grad_at_head_dim_256_raises_config_error():
    """No backward at head dim 256: ``jax.grad`` raises ``ConfigError`` naming it."""
    from pyptx.errors import ConfigError

    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.standard_normal((1, 64, 2, 256)), jnp.bfloat16)
    with pytest.raises(ConfigError, match="head dim 256"):
        jax.grad(lambda a: fa.attention(a, a, a).astype(jnp.float32).sum())(q)
