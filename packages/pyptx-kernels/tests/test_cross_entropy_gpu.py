"""GPU tests of ``linear_cross_entropy``'s f32 weight-gradient sum over token chunks: the
residual GEMM that adds the running sum in its epilogue (``gemm.host._matmul_residual``,
``g.T`` read MN-major) and the chunk loop with many middle chunks, against float64."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),
]

import pyptx_kernels as pk  # noqa: E402
from pyptx_kernels.cross_entropy import CrossEntropyConfig  # noqa: E402
from pyptx_kernels.cross_entropy.reference import linear_cross_entropy as lce_ref  # noqa: E402
from pyptx_kernels.gemm import host as gemm_host  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32


@pytest.fixture(autouse=True)
def _first_config(monkeypatch):
    monkeypatch.setenv("PYPTX_AUTOTUNE", "0")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-300)).item()


@pytest.mark.parametrize("C,V,H", [(2048, 128256, 2048), (384, 5003, 256), (256, 32000, 4096)])
def test_matmul_residual_weight_gradient_shape(C, V, H):
    """``g.T @ x + r`` in f32 at the weight gradient's shapes (a ragged vocabulary padded and
    cropped); every output element written (poisoned outputs), the residual left as it was."""
    g = (torch.randn(C, V, device="cuda") * 0.01).to(BF)
    x = torch.randn(C, H, device="cuda").to(BF)
    r = torch.randn(V, H, device="cuda") * 4
    r0 = r.clone()
    d = gemm_host._matmul_residual(g.T, x, r)
    assert d.dtype == F32 and d.shape == (V, H) and d.is_contiguous()
    assert d.data_ptr() != r.data_ptr() and torch.equal(r, r0)
    ref = g.double().T @ x.double() + r.double()
    assert torch.isfinite(d).all() and rel(d, ref) < 1e-5


@pytest.mark.parametrize("T,H,V,chunk", [
    (2048, 1024, 128256, 256),     # eight chunks: six residual GEMMs
    (1000, 512, 50257, 96),        # eleven, the last short; a vocabulary not a multiple of 8
])
def test_many_chunks_match_float64(T, H, V, chunk):
    x = torch.randn(T, H, device="cuda").to(BF).requires_grad_()
    w = (torch.randn(V, H, device="cuda") * H ** -0.5).to(BF).requires_grad_()
    target = torch.randint(0, V, (T,), device="cuda")
    target[::7] = -100
    loss = pk.linear_cross_entropy(x, w, target, config=CrossEntropyConfig(chunk_tokens=chunk))
    gx, gw = torch.autograd.grad(loss, (x, w))
    xd, wd = (t.detach().double().requires_grad_() for t in (x, w))
    ref = lce_ref(xd, wd, target)
    rgx, rgw = torch.autograd.grad(ref, (xd, wd))
    assert abs(loss.item() - ref.item()) < 2e-3 * abs(ref.item())
    for got, want in ((gx, rgx), (gw, rgw)):
        assert torch.isfinite(got).all() and rel(got, want) < 2e-2
