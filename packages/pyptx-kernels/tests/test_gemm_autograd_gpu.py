"""GPU tests of the dense GEMM's gradients (``pyptx_kernels.gemm``: ``matmul`` with
``loss.backward()`` in torch and ``jax.grad``).

Fresh random bf16/f16 operands in every layout (``x @ w.T`` included), ragged sizes, bias,
alpha and the fused activations;
outputs poisoned (NaN) before each launch. Gradients against float64 autograd on the same
rounded inputs: ``||g - ref|| / ||ref|| < 1e-2`` (the incoming gradient is rounded to the
input type and each gradient GEMM rounds its output, about 2**-9 per element each).

    pytest -m gpu packages/pyptx-torch/tests/test_gemm_autograd_gpu.py
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),  # conftest.py: unwritten elements are NaN
]

gemm = importlib.import_module("pyptx_kernels.gemm.host")
TOL = 1e-2
DT = {"bf16": torch.bfloat16, "f16": torch.float16}


@pytest.fixture(autouse=True)
def _first_config(monkeypatch):
    """The default tile configuration: every gradient shape here is new, and tuning each
    would cost minutes; the tuned configurations' numerics are test_gemm_gpu.py's."""
    monkeypatch.setenv("PYPTX_AUTOTUNE", "0")


def _err(got, ref):
    assert got is not None and got.shape == ref.shape
    assert not torch.isnan(got).any(), "unwritten (NaN-poisoned) or NaN elements"
    return ((got.double() - ref).norm() / ref.norm()).item()


ACT = {None: lambda z: z, "relu": torch.relu, "silu": torch.nn.functional.silu,
       "gelu_tanh": lambda z: torch.nn.functional.gelu(z, approximate="tanh")}


def _case(M, N, K, ta, tb, dt, bias, alpha, out_dtype=None, activation=None):
    a = torch.randn(*((K, M) if ta else (M, K)), device="cuda").to(DT[dt]).requires_grad_()
    b = torch.randn(*((N, K) if tb else (K, N)), device="cuda").to(DT[dt]).requires_grad_()
    c = torch.randn(N, device="cuda").requires_grad_() if bias else None
    dy = torch.randn(M, N, device="cuda")
    out = gemm.matmul(a.T if ta else a, b.T if tb else b, bias=c, alpha=alpha,
                      out_dtype=out_dtype, activation=activation)
    out.backward(dy.to(out.dtype))
    a64, b64 = (x.detach().double().requires_grad_() for x in (a, b))
    c64 = c.detach().double().requires_grad_() if bias else None
    ref = alpha * ((a64.T if ta else a64) @ (b64.T if tb else b64))
    if bias:
        ref = ref + c64
    ref = ACT[activation](ref)
    assert _err(out.detach(), ref.detach()) < TOL
    ref.backward(dy.to(out.dtype).double())
    for got, want in ((a.grad, a64.grad), (b.grad, b64.grad)) + (
            ((c.grad, c64.grad),) if bias else ()):
        assert _err(got, want) < TOL


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("M,N,K", [(256, 384, 320), (300, 130, 77), (1, 8, 2000)])
def test_gradients_every_layout(M, N, K, ta, tb):
    _case(M, N, K, ta, tb, "bf16", bias=False, alpha=1.0)


@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_gradients_with_bias_alpha_and_f32_output(dt):
    _case(520, 264, 392, False, True, dt, bias=True, alpha=0.75)
    _case(200, 136, 96, True, False, dt, bias=True, alpha=-1.5, out_dtype="f32")


@pytest.mark.parametrize("activation", ["relu", "silu", "gelu_tanh"])
def test_gradients_through_the_fused_activation(activation):
    _case(264, 200, 136, False, True, "bf16", bias=True, alpha=0.5, activation=activation)


def test_gradients_deterministic_and_in_a_cuda_graph():
    """Two backward passes give bitwise the same gradients; forward + backward captured in
    a CUDA graph replays right on new inputs."""
    x = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grads = []
    for _ in range(2):
        x.grad = w.grad = None
        gemm.matmul(x, w.T).float().square().sum().backward()
        grads.append((x.grad.clone(), w.grad.clone()))
    assert all(torch.equal(p, q) for p, q in zip(*grads))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            x.grad = w.grad = None
            gemm.matmul(x, w.T).sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    x.grad = w.grad = None
    with torch.cuda.graph(g):
        gemm.matmul(x, w.T).sum().backward()
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
        w.copy_(torch.randn_like(w))
    g.replay()
    torch.cuda.synchronize()
    ones = torch.ones(384, 512, device="cuda", dtype=torch.float64)
    assert _err(x.grad, ones @ w.detach().double()) < TOL
    assert _err(w.grad, ones.T @ x.detach().double()) < TOL


def test_torch_compile_backward():
    x = torch.randn(200, 160, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(96, 160, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    f = torch.compile(lambda x, w: gemm.matmul(x, w.T).float().sum())
    f(x, w).backward()
    ones = torch.ones(200, 96, device="cuda", dtype=torch.float64)
    assert _err(x.grad, ones @ w.detach().double()) < TOL
    assert _err(w.grad, ones.T @ x.detach().double()) < TOL


def test_jax_grad():
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax has no GPU")
    import numpy as np

    jnp = jax.numpy
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((300, 200)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((136, 200)), jnp.bfloat16)
    dy = rng.standard_normal((300, 136))

    def loss(x, w):
        return (gemm.matmul(x, w, trans_b=True).astype(jnp.float32) * dy).sum()

    gx, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    dyr = np.asarray(jnp.asarray(dy, jnp.bfloat16), np.float64)
    for got, ref in ((gx, dyr @ w64), (gw, dyr.T @ x64)):
        got = np.asarray(got, np.float64)
        assert got.shape == ref.shape and not np.isnan(got).any()
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < TOL


def test_batch_of_sequences_times_weight():
    """``(B, S, K) @ w.T`` with a bias: one ``(B*S, K)`` product, gradients to all three."""
    x = torch.randn(3, 100, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(136, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    c = torch.randn(136, device="cuda", requires_grad=True)
    out = gemm.matmul(x, w.T, bias=c)
    assert out.shape == (3, 100, 136)
    dy = torch.randn(3, 100, 136, device="cuda").to(torch.bfloat16)
    out.backward(dy)
    x64, w64, c64 = (t.detach().double().requires_grad_() for t in (x, w, c))
    ref = x64 @ w64.T + c64
    assert _err(out.detach(), ref.detach()) < TOL
    ref.backward(dy.double())
    for got, want in ((x.grad, x64.grad), (w.grad, w64.grad), (c.grad, c64.grad)):
        assert _err(got, want) < TOL
