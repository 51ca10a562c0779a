"""CPU tests of the dense GEMM's gradients (``pyptx_kernels.gemm.host``: ``matmul`` through
``pyptx.differentiable_kernel`` and ``GemmBackward``).

The kernel launch is replaced by a float64 model of what the traced kernel computes on its
stored operands (``D = alpha * A @ B + bias`` over the logical ``M x N x K``; operand bytes
past a stored extent read as zero, as the tensor copies' bounds give), so every layout,
the 16-byte padding of ragged sizes and the bias gradient are checked against torch's own
autograd in float64 without a GPU. The GPU tests run the real kernels
(``packages/pyptx-torch/tests/test_gemm_autograd_gpu.py``).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
from pyptx_kernels.gemm.config import GemmConfig

from pyptx.errors import ConfigError

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve()
gemm = importlib.import_module("pyptx_kernels.gemm.host")


def _crop_pad(x, rows, cols):
    out = torch.zeros(rows, cols, dtype=torch.float64)
    r, c = min(rows, x.shape[0]), min(cols, x.shape[1])
    out[:r, :c] = x[:r, :c].double()
    return out


class ModelKernel:
    """Kernel-like stand-in for one GEMM build: the traced kernel's specs, a float64 model
    of its result rounded to the output type. Counts its launches."""

    calls = 0

    def __init__(self, M, N, K, key):
        self.M, self.N, self.K, self.kw = M, N, K, dict(key)
        built = gemm.build_gemm(M, N, K, **self.kw)
        self.in_specs, self.out_specs = built.in_specs, built.out_specs
        self.name, self.arg_names = built.name, built.arg_names

    def __call__(self, a, b, bias=None):
        ModelKernel.calls += 1
        # the kernel reads raw storage: matmul must hand it each operand stored in its layout
        assert a.is_contiguous() and b.is_contiguous(), "an operand reached the kernel as a view"
        kw = self.kw
        al = a.T if kw["a_major"] == "MN" else a
        bl = b.T if kw["b_major"] == "K" else b
        d = kw["alpha"] * (_crop_pad(al, self.M, self.K) @ _crop_pad(bl, self.K, self.N))
        if bias is not None:
            d = d + bias.double()[:self.N]
        d = ACT[kw["activation"]](d)
        out = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
        return d.to(out[kw["out_dtype"]])


ACT = {None: lambda z: z, "relu": torch.relu, "silu": torch.nn.functional.silu,
       "gelu_tanh": lambda z: torch.nn.functional.gelu(z, approximate="tanh")}


@pytest.fixture
def model(monkeypatch):
    made = {}

    def cached(M, N, K, key, config):
        return made.setdefault((M, N, K, key), ModelKernel(M, N, K, key))

    monkeypatch.setattr(gemm, "_cached", cached)
    gemm._differentiable.cache_clear()
    yield made
    gemm._differentiable.cache_clear()


def _operands(M, N, K, ta, tb, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(K, M, generator=g) if ta else torch.randn(M, K, generator=g)
    b = torch.randn(N, K, generator=g) if tb else torch.randn(K, N, generator=g)
    a, b = a.to(dtype).requires_grad_(), b.to(dtype).requires_grad_()
    return a, b, (a.T if ta else a), (b.T if tb else b)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("M,N,K", [(16, 24, 32), (5, 13, 7), (9, 3, 17)])
def test_gradients_match_float64_autograd(model, ta, tb, M, N, K):
    """Every layout pair (``x @ w.T`` included), ragged sizes that ``matmul`` pads to 16-byte
    rows, bias and alpha: dA, dB and dbias against torch autograd in float64."""
    dtype = torch.bfloat16
    a, b, a_l, b_l = _operands(M, N, K, ta, tb, dtype, 1000 * M + 10 * N + K + 2 * ta + tb)
    bias = torch.randn(N, generator=torch.Generator().manual_seed(7)).requires_grad_()
    dy = torch.randn(M, N, generator=torch.Generator().manual_seed(8)).to(dtype)
    out = gemm.matmul(a_l, b_l, bias=bias, alpha=0.5)
    assert out.shape == (M, N) and out.grad_fn is not None
    out.backward(dy)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    bias64 = bias.detach().double().requires_grad_()
    ref = 0.5 * ((a64.T if ta else a64) @ (b64.T if tb else b64)) + bias64
    ref.backward(dy.double())
    for got, want in ((a.grad, a64.grad), (b.grad, b64.grad), (bias.grad, bias64.grad)):
        assert got.shape == want.shape
        err = ((got.double() - want).norm() / want.norm()).item()
        assert err < 1e-2, err


def test_grad_without_bias_and_f32_output(model):
    a, b, a_l, b_l = _operands(12, 40, 24, False, True, torch.float16, 3)
    out = gemm.matmul(a_l, b_l, out_dtype="f32")
    assert out.dtype == torch.float32
    out.sum().backward()   # an expanded (stride 0) f32 gradient, rounded to f16 for the GEMMs
    ones = torch.ones(12, 40, dtype=torch.float64)
    assert torch.allclose(a.grad.double(), ones @ b.detach().double(), rtol=1e-2, atol=1e-2)
    assert torch.allclose(b.grad.double(), (a.detach().double().T @ ones).T, rtol=1e-2,
                          atol=1e-2)


def test_no_grad_calls_skip_autograd(model):
    a, b = torch.randn(8, 16).to(torch.bfloat16), torch.randn(16, 8).to(torch.bfloat16)
    out = gemm.matmul(a, b)
    assert out.grad_fn is None
    assert gemm._differentiable.cache_info().currsize == 0
    with torch.no_grad():
        a.requires_grad_()
        assert gemm.matmul(a, b).grad_fn is None
    assert gemm._differentiable.cache_info().currsize == 0


@pytest.mark.parametrize("activation", ["relu", "silu", "gelu_tanh"])
@pytest.mark.parametrize("ta,tb", [(False, True), (True, False)])
def test_activation_gradients(model, activation, ta, tb):
    """The fused activation's gradient (the pre-activation recomputed by one more GEMM in
    f32) against torch's own derivative of the activation in float64."""
    M, N, K = 11, 20, 24
    a, b, a_l, b_l = _operands(M, N, K, ta, tb, torch.bfloat16, 5 + ta)
    bias = torch.randn(N, generator=torch.Generator().manual_seed(9)).requires_grad_()
    dy = torch.randn(M, N, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    gemm.matmul(a_l, b_l, bias=bias, alpha=1.25, activation=activation).backward(dy)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    bias64 = bias.detach().double().requires_grad_()
    ACT[activation](1.25 * ((a64.T if ta else a64) @ (b64.T if tb else b64))
                    + bias64).backward(dy.double())
    for got, want in ((a.grad, a64.grad), (b.grad, b64.grad), (bias.grad, bias64.grad)):
        err = ((got.double() - want).norm() / want.norm()).item()
        assert err < 2e-2, (activation, err)


def test_activation_grad_matches_torch_derivatives():
    z = torch.linspace(-6, 6, 241, dtype=torch.float64).requires_grad_()
    for name in ("relu", "silu", "gelu_tanh"):
        (want,) = torch.autograd.grad(ACT[name](z).sum(), z)
        got = gemm.activation_grad(z.detach(), name, torch)
        assert torch.allclose(got, want, atol=1e-12), name


def test_bad_activation_still_raises_at_the_callers_line(model):
    a = torch.randn(8, 16).to(torch.bfloat16).requires_grad_()
    with pytest.raises(ConfigError) as e:
        gemm.matmul(a, torch.randn(16, 8).to(torch.bfloat16), activation="tanh")
    assert str(e.value).startswith(f"{HERE}:")


def test_leading_batch_dimensions(model):
    """``(B, S, K) @ w.T`` is one ``(B*S, K)`` product, returned as ``(B, S, N)``, with
    gradients back to the 3-D input."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 5, 24, generator=g).to(torch.bfloat16).requires_grad_()
    w = torch.randn(16, 24, generator=g).to(torch.bfloat16).requires_grad_()
    out = gemm.matmul(x, w.T)
    assert out.shape == (2, 5, 16)
    ref = x.detach().double() @ w.detach().double().T
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2
    out.float().sum().backward()
    assert x.grad.shape == x.shape
    want = torch.ones(2, 5, 16, dtype=torch.float64) @ w.detach().double()
    assert ((x.grad.double() - want).norm() / want.norm()).item() < 1e-2
    with pytest.raises(ConfigError) as e:
        gemm.matmul(x, torch.randn(2, 24, 16).to(torch.bfloat16))
    assert str(e.value).startswith(f"{HERE}:") and "2-D b" in str(e.value)


def test_split_tail_kernel_is_differentiable():
    """A split-tail build (a ``SplitTailGemm``, which hides its flag input) is kernel-like
    enough for ``differentiable_kernel``: JAX calls always go through it."""
    key = tuple(sorted(dict(dtype="bf16", out_dtype="bf16", a_major="K", b_major="K",
                            bias=False, alpha=1.0, activation=None, KB=1000, NB=640).items()))
    cfg = GemmConfig(BM=128, BN=128, cluster=1, num_sms=6, split_tail=True)
    assert type(gemm._cached(512, 640, 1000, key, cfg)).__name__ == "SplitTailGemm"
    op = gemm._differentiable(512, 640, 1000, key, cfg, (512, 640, 1000, False, True, 1.0, None))
    assert op.backward_kernel.arg_names == ("A", "B", "dD", "dA", "dB")
    assert op.forward_kernel.arg_names == ("A", "B", "D")


@pytest.mark.parametrize("activation", [None, "silu"])
def test_jax_branch_of_the_backward(monkeypatch, activation):
    """``GemmBackward`` on JAX arrays (what ``jax.grad`` hands it), the GEMMs it launches
    swapped for a jnp model: the gradients of ``act(alpha * x @ w.T + bias)`` against
    ``jax.vjp`` of the same math in f32."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def model_matmul(a, b, *, bias=None, alpha=1.0, activation=None, out_dtype=None,
                     trans_a=False, trans_b=False, config=None):
        A = (a.T if trans_a else a).astype(jnp.float32)
        B = (b.T if trans_b else b).astype(jnp.float32)
        d = alpha * (A @ B) + (0 if bias is None else bias)
        return d.astype({"f32": jnp.float32, None: a.dtype}[out_dtype])

    monkeypatch.setattr(gemm, "matmul", model_matmul)
    M, N, K = 24, 16, 32
    key = tuple(sorted(dict(dtype="bf16", out_dtype="bf16", a_major="K", b_major="K",
                            bias=True, alpha=0.5, activation=activation, KB=K, NB=N).items()))
    fwd = gemm.build_gemm(M, N, K, **dict(key))
    bwd = gemm.GemmBackward(fwd, (M, N, K, False, True, 0.5, activation))
    rng = np.random.default_rng(3)
    x, w = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in ((M, K), (N, K)))
    c = jnp.asarray(rng.standard_normal(N), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((M, N)), jnp.bfloat16)
    dx, dw, dc = bwd(x, w, c, dy)
    act = (lambda z: z) if activation is None else jax.nn.silu

    def f(x, w, c):
        return act(0.5 * x.astype(jnp.float32) @ w.astype(jnp.float32).T + c)

    _, vjp = jax.vjp(f, x, w, c)
    for got, want in zip((dx, dw, dc), vjp(dy.astype(jnp.float32))):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        assert got.shape == want.shape
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-2


def test_one_shape_in_every_layout_reuses_no_wrong_plan(model):
    """``matmul`` keeps a plan per shape, strides and options: operands of one shape given
    contiguous, as transposed views, and as strided slices that need a copy each get the
    right product, in any order, twice."""
    g = torch.Generator().manual_seed(11)
    base = torch.randn(24, 48, generator=g).to(torch.bfloat16)
    w = torch.randn(24, 24, generator=g).to(torch.bfloat16)
    forms = {"contiguous": base[:, :24].contiguous(), "transposed view": base[:, :24].T.contiguous().T,
             "strided slice": base[:, ::2], "offset slice": base[:, 24:]}
    for _ in range(2):
        for name, a in forms.items():
            want = a.double() @ w.double()
            got = gemm.matmul(a, w).double()
            assert ((got - want).norm() / want.norm()).item() < 1e-2, name
            got_t = gemm.matmul(w, a).double()
            want_t = w.double() @ a.double()
            assert ((got_t - want_t).norm() / want_t.norm()).item() < 1e-2, name


@pytest.mark.parametrize("a_shape,b_shape,dtypes,message", [
    ((8, 16), (24, 8), (torch.bfloat16, torch.bfloat16), "inner dimensions differ"),
    ((8, 16), (16, 8), (torch.bfloat16, torch.float16), "must both be bfloat16 or float16"),
    ((8, 16), (16, 8), (torch.float32, torch.float32), "must both be bfloat16 or float16"),
])
def test_bad_operands_raise_at_the_callers_line_every_time(model, a_shape, b_shape, dtypes,
                                                           message):
    a, b = torch.zeros(a_shape, dtype=dtypes[0]), torch.zeros(b_shape, dtype=dtypes[1])
    for _ in range(2):   # a refused layout leaves no plan behind
        with pytest.raises(ConfigError, match=message) as e:
            gemm.matmul(a, b)
        assert str(e.value).startswith(f"{__file__}:")
