"""CPU tests of the fused-epilogue GEMMs' host side (``pyptx_kernels.gemm.fused``): the weight
packing, the custom ops' shapes on meta tensors, and the gradients against float64 autograd
with the kernel launches replaced by float64 models (the kernels themselves are simulated in
``test_tensorcore_sim.py``: ``test_gated_gemm``, ``test_residual_gemm``)."""

from __future__ import annotations

import pytest

from pyptx.errors import ShapeError, SpecError

torch = pytest.importorskip("torch")

from pyptx_kernels.gemm import fused  # noqa: E402


def _swiglu_ref(x, wg, wu):
    return torch.nn.functional.silu(x @ wg.T) * (x @ wu.T)


@pytest.fixture
def float64_kernels(monkeypatch):
    """Launches as float64 models of the traced kernels; the backward's GEMMs as torch's."""
    from pyptx_kernels.gemm import api

    def launch(x, w, *, activation=None, residual=None):
        h = x.double() @ w.double().T
        if activation == "swiglu":
            b = h.reshape(h.shape[0], -1, 2, 64)
            h = (torch.nn.functional.silu(b[:, :, 0]) * b[:, :, 1]).reshape(h.shape[0], -1)
        if residual is not None:
            h = h + residual.double()
        return h.to(residual.dtype if residual is not None else x.dtype)

    monkeypatch.setattr(fused, "_launch", launch)
    monkeypatch.setattr(fused._common, "check_devices", lambda *a: None)
    monkeypatch.setattr(api, "linear", lambda x, w, b=None: (x.double() @ w.double().T).to(x.dtype))
    monkeypatch.setattr(api, "matmul", lambda a, b, **k: (a.double() @ b.double()).to(a.dtype))


def test_pack_and_unpack_are_inverse():
    wg, wu = torch.randn(192, 64), torch.randn(192, 64)
    packed = fused.pack_gated(wg, wu)
    assert packed.shape == (384, 64)
    assert torch.equal(packed[:64], wg[:64]) and torch.equal(packed[64:128], wu[:64])
    g, u = fused.unpack_gated(packed)
    assert torch.equal(g, wg) and torch.equal(u, wu)
    with pytest.raises(ShapeError, match="multiple of 64"):
        fused.pack_gated(torch.randn(100, 64), torch.randn(100, 64))


def test_swiglu_linear_gradients(float64_kernels):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16, requires_grad=True)
    wg, wu = (torch.randn(128, 64, dtype=torch.bfloat16) * 0.1 for _ in range(2))
    w = fused.pack_gated(wg, wu).requires_grad_()
    y = fused.swiglu_linear(x, w)
    assert y.shape == (2, 5, 128)
    gy = torch.randn_like(y)
    y.backward(gy)
    x64 = x.detach().double().requires_grad_()
    wg64, wu64 = (t.double().requires_grad_() for t in (wg, wu))
    ref = _swiglu_ref(x64, wg64, wu64)
    ref.backward(gy.double())
    assert torch.allclose(y.double(), ref, rtol=2e-2, atol=2e-2)
    dwg, dwu = fused.unpack_gated(w.grad.double())
    for got, want in ((x.grad.double(), x64.grad), (dwg, wg64.grad), (dwu, wu64.grad)):
        assert ((got - want).norm() / want.norm()).item() < 2e-2


def test_linear_residual_gradients(float64_kernels):
    torch.manual_seed(1)
    x = torch.randn(3, 4, 64, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(96, 64, dtype=torch.bfloat16) * 0.1).requires_grad_()
    r = torch.randn(3, 4, 96, dtype=torch.bfloat16, requires_grad=True)
    y = fused.linear_residual(x, w, r)
    gy = torch.randn_like(y)
    y.backward(gy)
    x64, w64, r64 = (t.detach().double().requires_grad_() for t in (x, w, r))
    (x64 @ w64.T + r64).backward(gy.double())
    for got, want in ((x.grad, x64.grad), (w.grad, w64.grad), (r.grad, r64.grad)):
        assert ((got.double() - want).norm() / want.norm()).item() < 2e-2


def test_meta_shapes_and_refusals():
    x = torch.empty(2, 7, 128, dtype=torch.bfloat16, device="meta")
    w = torch.empty(256, 128, dtype=torch.bfloat16, device="meta")
    assert fused.swiglu_linear(x, w).shape == (2, 7, 128)
    r = torch.empty(2, 7, 256, dtype=torch.float32, device="meta")
    out = fused.linear_residual(x, w, r)
    assert out.shape == (2, 7, 256) and out.dtype == torch.float32
    with pytest.raises(ShapeError, match="residual must have shape") as e:
        fused.linear_residual(x, w, r[:, :3])
    assert str(e.value).startswith(__file__)
    with pytest.raises(ShapeError, match="multiple of 128"):
        fused.swiglu_linear(x, w[:192])
    with pytest.raises(SpecError, match="bfloat16 or float16"):
        fused.swiglu_linear(x.float(), w.float())
