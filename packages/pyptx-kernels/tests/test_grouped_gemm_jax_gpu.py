"""GPU tests of the grouped GEMM example from JAX: ``jax.jit`` forward and ``jax.grad``
through ``differentiable_kernel``, against float64 numpy on fresh random bf16 inputs with
ragged group sizes (an empty group included). Tolerance on ``||out - ref|| / ||ref||``:
6e-3 (bf16 output and bf16 gradients). The split weight gradient (opt-in ``WgradConfig(splits=2)``)
runs through the same checks."""

from __future__ import annotations

import importlib
import os

import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
np = pytest.importorskip("numpy")


pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("jax_gpu")]  # conftest.py: skip without one

gg = importlib.import_module("pyptx_kernels.grouped_gemm.host")
TOL = 6e-3
SIZES = [0, 37, 130, 64]


def _ref(a, b, sizes):
    out = np.zeros((a.shape[0], b.shape[-1]))
    s = 0
    for g, n in enumerate(sizes):
        out[s:s + n] = a[s:s + n] @ b[g]
        s += n
    return out


def _err(x, ref):
    x = np.asarray(x, np.float64)
    assert not np.isnan(x).any()
    return np.linalg.norm(x - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("wgrad", [None, dict(splits=2, BM=64, BN=64)],
                         ids=["tuned", "split-wgrad"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_jit_forward_and_grad(trans_b, wgrad):
    wcfg = None if wgrad is None else gg.WgradConfig(**wgrad)
    rng = np.random.default_rng(0)
    M, K, N, G = sum(SIZES), 96, 136, len(SIZES)
    a = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((G, K, N)), jnp.bfloat16)
    bt = jnp.swapaxes(b, 1, 2) if trans_b else b
    offs = jnp.asarray(np.cumsum(SIZES), jnp.int32)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    f = jax.jit(lambda x, y, o: gg.grouped_mm(x, y, o, trans_b=trans_b, wgrad_config=wcfg))
    assert _err(f(a, bt, offs), _ref(a64, b64, SIZES)) < TOL

    dy = rng.standard_normal((M, N))
    dyj = jnp.asarray(dy, jnp.float32)

    def loss(x, y):
        return jnp.sum(gg.grouped_mm(x, y, offs, trans_b=trans_b, wgrad_config=wcfg)
                       .astype(jnp.float32) * dyj)

    da, db = jax.jit(jax.grad(loss, argnums=(0, 1)))(a, bt)
    dy_b = np.asarray(jnp.asarray(dy, jnp.bfloat16), np.float64)  # the kernels see bf16 dY
    da_ref = np.zeros_like(a64)
    db_ref = np.zeros_like(b64)
    s = 0
    for g, n in enumerate(SIZES):
        da_ref[s:s + n] = dy_b[s:s + n] @ b64[g].T
        db_ref[g] = a64[s:s + n].T @ dy_b[s:s + n]
        s += n
    assert _err(da, da_ref) < TOL
    db = np.swapaxes(np.asarray(db, np.float64), 1, 2) if trans_b else np.asarray(db, np.float64)
    assert _err(db, db_ref) < TOL
    assert not db[0].any()
