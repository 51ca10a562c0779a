"""GPU tests of the fused-epilogue GEMMs (``pyptx_kernels.gemm.fused``) against float64 on
fresh random inputs, outputs poisoned: values and gradients."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),
]


def rel(got, want):
    assert not torch.isnan(got).any(), "unwritten (NaN-poisoned) elements"
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("lead,H,inter", [((2, 300), 512, 1408), ((7,), 256, 128), ((4096,), 2048, 5632)])
def test_swiglu_linear(lead, H, inter):
    from pyptx_kernels.gemm import fused

    x = torch.randn(*lead, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    wg, wu = (torch.randn(inter, H, device="cuda", dtype=torch.bfloat16) * H ** -0.5 for _ in range(2))
    w = fused.pack_gated(wg, wu).requires_grad_()
    y = fused.swiglu_linear(x, w)
    x64, wg64, wu64 = (t.detach().double().requires_grad_() for t in (x, wg, wu))
    ref = torch.nn.functional.silu(x64 @ wg64.T) * (x64 @ wu64.T)
    assert rel(y, ref) < 1e-2
    gy = torch.randn_like(y)
    y.backward(gy)
    ref.backward(gy.double())
    dwg, dwu = fused.unpack_gated(w.grad)
    assert rel(x.grad, x64.grad) < 2e-2
    assert rel(dwg, wg64.grad) < 2e-2 and rel(dwu, wu64.grad) < 2e-2


@pytest.mark.parametrize("rdtype", [torch.bfloat16, torch.float32])
def test_linear_residual(rdtype):
    from pyptx_kernels.gemm import fused

    x = torch.randn(3, 333, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(1000, 512, device="cuda", dtype=torch.bfloat16) * 0.05).requires_grad_()
    r = torch.randn(3, 333, 1000, device="cuda", dtype=rdtype, requires_grad=True)
    y = fused.linear_residual(x, w, r)
    assert y.dtype == rdtype
    x64, w64, r64 = (t.detach().double().requires_grad_() for t in (x, w, r))
    ref = x64 @ w64.T + r64
    assert rel(y, ref) < (1e-2 if rdtype == torch.bfloat16 else 1e-3)
    gy = torch.randn_like(y)
    y.backward(gy)
    ref.backward(gy.double())
    for got, want in ((x.grad, x64.grad), (w.grad, w64.grad), (r.grad, r64.grad)):
        assert rel(got, want) < 2e-2
