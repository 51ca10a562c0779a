"""GPU tests of ``build_swiglu_backward`` and of ``pyptx_kernels.swiglu``'s autograd through it.

Fresh random inputs, outputs poisoned (NaN) so an element the kernel never writes fails,
compared with float64 by ``||out - ref|| / ||ref||``: below 1e-5 for f32, 1e-2 for bf16 (the
reference takes the same bf16 inputs).

    pytest -m gpu packages/pyptx-kernels/tests/test_swiglu_backward_gpu.py
"""

from __future__ import annotations

import pytest
from pyptx_kernels.rows import api as rows_api
from pyptx_kernels.rows.config import SWIGLU_BACKWARD_CONFIGS
from pyptx_kernels.rows.swiglu import build_swiglu_backward

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),
]

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
TOL = {"f32": 1e-5, "bf16": 1e-2}


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite output: an element was not written"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def inputs(B, N, dt, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed + B * 7919 + N)
    dy, u = (torch.randn(B, N, device="cuda", generator=gen).to(DTYPES[dt]) for _ in range(2))
    g = (torch.randn(B, N, device="cuda", generator=gen) * 3).to(DTYPES[dt])
    return dy, g, u


def reference(dy, g, u):
    dy, g, u = dy.double(), g.double(), u.double()
    s = torch.sigmoid(g)
    return dy * u * s * (1 + g * (1 - s)), dy * g * s


def check(kernel, B, N, dt, seed=0):
    dy, g, u = inputs(B, N, dt, seed)
    dg, du = kernel(dy, g, u)
    assert dg.dtype == du.dtype == DTYPES[dt] and dg.shape == du.shape == (B, N)
    rg, ru = reference(dy, g, u)
    assert rel_err(dg, rg) < TOL[dt], ("dG", B, N, dt)
    assert rel_err(du, ru) < TOL[dt], ("dU", B, N, dt)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B", [1, 7, 8192])
@pytest.mark.parametrize("N", [5632, 1000, 37, 4096])
def test_default_call(B, N, dt):
    check(build_swiglu_backward(B, N, dt), B, N, dt)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,N", [(7, 1000), (3, 37), (4096, 5632)])
def test_every_plan_of_the_table(B, N, dt):
    for c in SWIGLU_BACKWARD_CONFIGS:
        check(build_swiglu_backward(B, N, dt, config=c), B, N, dt)


@pytest.mark.parametrize("dt", DTYPES)
def test_one_kernel_object_serves_several_row_counts(dt):
    for B in (8192, 1, 7, 33):
        check(build_swiglu_backward(B, 1000, dt), B, 1000, dt, seed=B)


@pytest.mark.parametrize("dt", DTYPES)
def test_saturated_sigmoid_stays_finite(dt):
    dy, g, u = inputs(3, 1000, dt)
    g[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -30.0])
    dg, du = build_swiglu_backward(3, 1000, dt)(dy, g, u)
    rg, ru = reference(dy, g, u)
    assert rel_err(dg, rg) < TOL[dt] and rel_err(du, ru) < TOL[dt]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", [(8192, 5632), (2, 37, 1000), (7, 4096)])
def test_autograd_matches_torch(shape, dt):
    import pyptx_kernels as pk

    gen = torch.Generator(device="cuda").manual_seed(sum(shape))
    g = (torch.randn(shape, device="cuda", generator=gen) * 3).to(DTYPES[dt]).requires_grad_()
    u = torch.randn(shape, device="cuda", generator=gen).to(DTYPES[dt]).requires_grad_()
    dy = torch.randn(shape, device="cuda", generator=gen).to(DTYPES[dt])
    assert rows_api._swiglu_kernel_takes(dy, g, u)
    dg, du = torch.autograd.grad(pk.swiglu(g, u), (g, u), dy)
    g64, u64 = (t.detach().double().requires_grad_() for t in (g, u))
    rg, ru = torch.autograd.grad(torch.nn.functional.silu(g64) * u64, (g64, u64), dy.double())
    assert dg.dtype == du.dtype == DTYPES[dt]
    assert rel_err(dg, rg) < TOL[dt] and rel_err(du, ru) < TOL[dt]


@pytest.mark.parametrize("dt", DTYPES)
def test_autograd_through_halves_of_one_tensor(dt):
    """gate and up as views of one (B, 2N) projection, as a Llama MLP's fused gate_up is."""
    import pyptx_kernels as pk

    gen = torch.Generator(device="cuda").manual_seed(5)
    h = (torch.randn(7, 2 * 5632, device="cuda", generator=gen) * 2).to(DTYPES[dt])
    h.requires_grad_()
    dy = torch.randn(7, 5632, device="cuda", generator=gen).to(DTYPES[dt])
    (dh,) = torch.autograd.grad(pk.swiglu(*h.chunk(2, -1)), h, dy)
    h64 = h.detach().double().requires_grad_()
    g64, u64 = h64.chunk(2, -1)
    (ref,) = torch.autograd.grad(torch.nn.functional.silu(g64) * u64, h64, dy.double())
    assert rel_err(dh, ref) < TOL[dt]
