"""GPU tests of the public functional API: every function on random inputs with leading
shapes such as ``(2, 37, N)`` against float64 torch references, forward and backward
(``||x - ref|| / ||ref||``: 1e-2 for bf16 GEMMs, 2e-2 for bf16 rows, 1e-5 for f32 rows), and
``torch.compile(fullgraph=True)`` of a small model on the GPU. Outputs are poisoned (NaN)
before each launch.

    pytest -m gpu packages/pyptx-kernels/tests/test_api_gpu.py
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import pyptx_kernels as pk  # noqa: E402
from pyptx_kernels.fp8_gemm import testing as fp8  # noqa: E402 (make_inputs, reference, TOL)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),
]

BF, F32 = torch.bfloat16, torch.float32
TOL = {BF: 2e-2, F32: 1e-5}
F = torch.nn.functional


def rel(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def leaf(*shape, dtype=BF, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed * 7919 + sum(shape))
    return (torch.randn(*shape, generator=g) * scale).to(dtype).cuda().requires_grad_()


def compare(ours, ref, inputs, tol, seed=3):
    """``ours(*inputs)`` and its input gradients for a random output gradient against
    ``ref`` in float64 on the same rounded inputs."""
    y = ours(*inputs)
    assert torch.isfinite(y).all()
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(y.dtype).cuda()
    xs = [x.detach().double().requires_grad_() for x in inputs]
    y_ref = ref(*xs)
    assert y.shape == y_ref.shape and rel(y, y_ref) < tol, rel(y, y_ref)
    g_ref = torch.autograd.grad(y_ref, xs, gy.double())
    g = torch.autograd.grad(y, inputs, gy)
    for i, (gi, ri, x) in enumerate(zip(g, g_ref, inputs)):
        assert gi.shape == x.shape and gi.dtype == x.dtype, i
        assert rel(gi, ri) < tol, (i, rel(gi, ri))


@pytest.mark.parametrize("lead,K,N", [((2, 37), 256, 512), ((3, 5, 7), 136, 520), ((64,), 72, 100)])
@pytest.mark.parametrize("transposed", [False, True])
def test_matmul(lead, K, N, transposed):
    w = leaf(N, K, seed=1) if transposed else leaf(K, N, seed=1)
    view = (lambda w: w.T) if transposed else (lambda w: w)
    compare(lambda a, w, b: pk.matmul(a, view(w), bias=b),
            lambda a, w, b: a @ view(w) + b, [leaf(*lead, K), w, leaf(N, dtype=F32, seed=2)],
            1e-2)


def test_matmul_out_dtype():
    a, b = leaf(2, 37, 128), leaf(128, 256, seed=1)
    y = pk.matmul(a, b, out_dtype=F32)
    assert y.dtype == F32 and rel(y, a.double() @ b.double()) < 1e-3


@pytest.mark.parametrize("lead,d_in,d_out", [((2, 37), 256, 384), ((5, 3), 200, 72)])
def test_linear(lead, d_in, d_out):
    compare(pk.linear, lambda x, w, b: F.linear(x, w, b),
            [leaf(*lead, d_in), leaf(d_out, d_in, seed=1), leaf(d_out, seed=2)], 1e-2)
    compare(lambda x, w: pk.linear(x, w), lambda x, w: x @ w.T,
            [leaf(*lead, d_in), leaf(d_out, d_in, seed=1)], 1e-2)


def grouped_ref(a, b, offs):
    out, start = [], 0
    for g, end in enumerate(offs.tolist()):
        out.append(a[start:end] @ b[g])
        start = end
    return torch.cat(out)


@pytest.mark.parametrize("K,N", [(256, 512), (100, 72)])
@pytest.mark.parametrize("k_major", [False, True])
def test_grouped_mm(K, N, k_major):
    offs = torch.tensor([64, 64, 200, 331], dtype=torch.int32, device="cuda")
    b = leaf(4, N, K, seed=1) if k_major else leaf(4, K, N, seed=1)
    view = (lambda b: b.transpose(1, 2)) if k_major else (lambda b: b)
    compare(lambda a, b: pk.grouped_mm(a, view(b), offs),
            lambda a, b: grouped_ref(a, view(b), offs), [leaf(331, K), b], 1e-2)


@pytest.mark.parametrize("kind", ["tensor", "row", "block"])
@pytest.mark.parametrize("out", [BF, F32])
def test_scaled_mm(kind, out):
    M, N, K = 300, 256, 512
    a, w, sa, sb = fp8.make_inputs(M, N, K, kind)
    ref = fp8.reference(a, w, sa, sb, kind)
    if kind == "block":
        d = pk.scaled_mm_blockwise(a, w.t(), sa, sb, out_dtype=out)
    else:
        if kind == "tensor":
            sa, sb = sa.reshape(1), sb.reshape(1)
        d = pk.scaled_mm(a, w.t(), sa, sb, out_dtype=out)
    assert d.dtype == out and d.shape == (M, N)
    assert rel(d, ref) < fp8.TOL["bf16" if out == BF else "f32"], rel(d, ref)


def test_scaled_mm_fast_accum():
    a, w, sa, sb = fp8.make_inputs(256, 256, 1024, "row")
    d = pk.scaled_mm(a, w.t(), sa, sb, use_fast_accum=True)
    assert rel(d, fp8.reference(a, w, sa, sb, "row")) < 2e-2


def rms_ref(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("dtype", [BF, F32])
@pytest.mark.parametrize("lead,N", [((2, 37), 1024), ((3, 4, 5), 384), ((7,), 4096)])
def test_rms_norm(dtype, lead, N):
    compare(lambda x, w: pk.rms_norm(x, w, eps=1e-5), lambda x, w: rms_ref(x, w, 1e-5),
            [leaf(*lead, N, dtype=dtype), leaf(N, dtype=dtype, seed=1)], TOL[dtype])


@pytest.mark.parametrize("dtype", [BF, F32])
@pytest.mark.parametrize("lead,N", [((2, 37), 1024), ((3, 4, 5), 384)])
def test_layer_norm(dtype, lead, N):
    compare(pk.layer_norm, lambda x, w, b: F.layer_norm(x, (N,), w, b, 1e-5),
            [leaf(*lead, N, dtype=dtype), leaf(N, dtype=dtype, seed=1),
             leaf(N, dtype=dtype, seed=2)], TOL[dtype])
    compare(lambda x, w: pk.layer_norm(x, w), lambda x, w: F.layer_norm(x, (N,), w, None, 1e-5),
            [leaf(*lead, N, dtype=dtype), leaf(N, dtype=dtype, seed=1)], TOL[dtype])


@pytest.mark.parametrize("dtype", [BF, F32])
@pytest.mark.parametrize("lead,N", [((2, 37), 1000), ((3, 4, 5), 4096)])
def test_softmax(dtype, lead, N):
    compare(pk.softmax, lambda x: torch.softmax(x, -1), [leaf(*lead, N, dtype=dtype, scale=3)],
            TOL[dtype])


@pytest.mark.parametrize("dtype", [BF, F32])
@pytest.mark.parametrize("lead,N", [((2, 37), 768), ((3, 4, 5), 4096)])
def test_swiglu(dtype, lead, N):
    compare(pk.swiglu, lambda g, u: F.silu(g) * u,
            [leaf(*lead, N, dtype=dtype), leaf(*lead, N, dtype=dtype, seed=1)], TOL[dtype])


class Tiny(torch.nn.Module):
    def __init__(self, d=256, hidden=512):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        p = lambda *s: torch.nn.Parameter((torch.randn(*s, generator=g) / 8).to(BF))  # noqa: E731
        self.norm, self.up, self.down = p(d), p(2 * hidden, d), p(d, hidden)
        self.bias, self.ln_w, self.ln_b = p(d), p(d), p(d)

    def forward(self, x, ops):
        h = ops["linear"](ops["rms_norm"](x, self.norm), self.up)
        h = ops["swiglu"](*h.chunk(2, dim=-1))
        h = ops["matmul"](h, self.down.T, bias=self.bias)
        return ops["softmax"](ops["layer_norm"](h, self.ln_w, self.ln_b))


PK = {n: getattr(pk, n) for n in ("linear", "rms_norm", "swiglu", "matmul", "softmax",
                                  "layer_norm")}


def _torch_ops():
    rms = lambda x, w: rms_ref(x.double(), w.double(), 1e-6)  # noqa: E731
    return {"linear": lambda x, w: x.double() @ w.double().T, "rms_norm": rms,
            "swiglu": lambda g, u: F.silu(g) * u,
            "matmul": lambda a, b, bias: a @ b.double() + bias.double(),
            "softmax": lambda x: torch.softmax(x, -1),
            "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w.double(),
                                                       b.double(), 1e-5)}


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_compile_fullgraph(backend):
    model = Tiny().cuda()
    x = leaf(2, 37, 256)
    compiled = torch.compile(lambda x: model(x, PK), fullgraph=True, backend=backend)
    y = compiled(x)
    y_ref = model(x.detach().double().requires_grad_(), _torch_ops())
    assert rel(y, y_ref) < 2e-2
    weights = torch.linspace(-1, 1, y.shape[-1], device="cuda")   # a softmax's sum is constant
    (y.float() * weights).sum().backward()
    assert torch.isfinite(x.grad).all() and all(
        torch.isfinite(p.grad).all() for p in model.parameters())
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (model(x.detach(), PK).float() * weights).sum().backward()
    for g, e in zip(eager_grads, (p.grad for p in model.parameters())):
        assert rel(g, e) < 1e-2
    torch._dynamo.reset()
