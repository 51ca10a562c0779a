"""The examples on the GPU (``pytest -m gpu``), launched from torch eager and ``jax.jit``:
fresh random inputs against float64, outputs poisoned so an element never written fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyptx.testing import load_module

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),
]

EXAMPLES = Path(__file__).resolve().parents[1]


def example(rel: str):
    return load_module(EXAMPLES / rel, f"gpu_example_{Path(rel).stem}")


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    assert not torch.isnan(out).any(), "NaN in output: an element was not written"
    return ((out - ref).norm() / ref.norm()).item()


def rms_ref(x, w, eps=1e-6):
    x64, w64 = x.double(), w.double()
    return x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w64


@pytest.mark.parametrize("B,N", [(16, 512), (7, 1024), (64, 4096)])
def test_rms_norm(B, N):
    k = example("hopper/rms_norm.py").build_rms_norm(B, N)
    x = torch.randn(B, N, device="cuda") * 0.3
    w = torch.randn(N, device="cuda") * 0.1 + 1.0
    out = k(x, w)
    assert out.shape == (B, N) and out.dtype == torch.float32 and out.device == x.device
    assert rel_err(out, rms_ref(x, w)) < 1e-5


def test_vector_add_ragged():
    n = 100_003
    k = example("vector_add.py").build_vector_add(n)
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    assert rel_err(k(a, b), a.double() + b.double()) < 1e-7


def test_block_sum():
    B, N = 33, 5000
    k = example("block_reduce.py").build_block_sum(B, N)
    x = torch.randn(B, N, device="cuda")
    assert rel_err(k(x), x.double().sum(-1)) < 1e-5


def test_transpose_ragged():
    M, N = 100, 77
    k = example("transpose.py").build_transpose(M, N)
    x = torch.randn(M, N, device="cuda")
    assert torch.equal(k(x), x.t().contiguous())


@pytest.mark.parametrize("M,N,box", [(100, 68, 32), (256, 256, 64), (33, 4, 8)])
def test_tma_tile_copy(M, N, box):
    k = example("hopper/tma_copy.py").build_tma_copy(M, N, box)
    for _ in range(2):  # a second launch re-addresses the same tensor map
        x = torch.randn(M, N, device="cuda")
        assert torch.equal(k(x), x)


@pytest.mark.parametrize("swizzle", [128, 64, 32, None])
@pytest.mark.parametrize("a_major", ["K", "MN"])
@pytest.mark.parametrize("b_major", ["K", "MN"])
@pytest.mark.parametrize("n", [64, 128])
def test_operand_tile_layouts(swizzle, a_major, b_major, n):
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, n, device="cuda", dtype=torch.bfloat16)
    k = example("hopper/wgmma_tile.py").build_wgmma_tile(n, 64, a_major=a_major, b_major=b_major, swizzle=swizzle)
    d = k(a.contiguous() if a_major == "K" else a.T.contiguous(),
          b.T.contiguous() if b_major == "K" else b.contiguous())
    assert rel_err(d, a.double() @ b.double()) < 1e-5


@pytest.mark.parametrize("K", [128, 256])
def test_operand_tile_filled_by_the_3d_view(K):
    a = torch.randn(64, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, 64, device="cuda", dtype=torch.bfloat16)
    k = example("hopper/wgmma_tile.py").build_wgmma_tile(64, K, a_major="K", b_major="MN", a_view="3d")
    assert "cp.async.bulk.tensor.3d" in k.ptx()
    assert rel_err(k(a, b), a.double() @ b.double()) < 1e-5


def test_rms_norm_and_tma_copy_under_jax_jit():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax")
    import numpy as np

    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("needs a GPU for JAX")
    jnp = jax.numpy
    k = example("hopper/rms_norm.py").build_rms_norm(16, 512)
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (16, 512), jnp.float32) * 0.3
    w = jax.random.normal(kw, (512,), jnp.float32) * 0.1 + 1.0
    jnp.full((16, 512), jnp.nan, jnp.float32).block_until_ready()
    out = np.asarray(jax.jit(lambda x, w: k(x, w))(x, w), np.float64)
    ref = rms_ref(torch.from_numpy(np.asarray(x)), torch.from_numpy(np.asarray(w))).numpy()
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5
    copy = example("hopper/tma_copy.py").build_tma_copy(100, 68)
    y = jax.random.normal(jax.random.key(1), (100, 68), jnp.float32)
    jnp.full((100, 68), jnp.nan, jnp.float32).block_until_ready()
    assert np.array_equal(np.asarray(jax.jit(lambda a: copy(a))(y)), np.asarray(y))
