"""GPU tests of the public attention API (``pyptx_kernels.flash_attention.api``): the real kernels
through ``torch.ops.pyptx.attention`` / ``attention_varlen`` and their backward ops.

Random bf16 inputs, outputs poisoned (NaN) before each launch; every output and gradient must
be finite and match float64 torch autograd on the same rounded inputs: forward
``max |o - ref| / max(1, |ref|) <= 2e-2`` (the forward tests' bf16 bound), gradients
``|g - ref| / |ref| <= 2e-2`` (Frobenius norms).

    pytest -m gpu packages/pyptx-kernels/tests/test_attention_api_gpu.py
"""

from __future__ import annotations

import importlib
import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),
]

api = importlib.import_module("pyptx_kernels.flash_attention.api")


def _rand(*shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16).requires_grad_()


def reference(q, k, v, causal, scale, layout):
    """float64 attention by torch autograd, in the caller's layout."""
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    G = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    s = (qd @ kd.transpose(-1, -2)) * scale
    if causal:
        mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(mask, -math.inf)
    o = torch.softmax(s, dim=-1) @ vd
    return o if layout == "bhsd" else o.transpose(1, 2)


def _check(out, ref):
    assert torch.isfinite(out).all()
    err = ((out.double() - ref).abs() / ref.abs().clamp(min=1)).max().item()
    assert err <= 2e-2, err


def _check_grads(xs, refs):
    for x, r in zip(xs, refs):
        assert x.grad is not None and torch.isfinite(x.grad).all()
        err = ((x.grad.double() - r.grad).norm() / r.grad.norm()).item()
        assert err <= 2e-2, err


def _inputs(B, S, Sk, Hq, Hkv, D, layout):
    shape = (lambda s, h: (B, s, h, D)) if layout == "bshd" else (lambda s, h: (B, h, s, D))
    return [_rand(*shape(s, h), seed=i) for i, (s, h) in enumerate(((S, Hq), (Sk, Hkv),
                                                                     (Sk, Hkv)))]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_match_float64(layout, D, causal):
    B, S, Hq, Hkv = 2, 333, 8, 2
    q, k, v = _inputs(B, S, S, Hq, Hkv, D, layout)
    out = api.attention(q, k, v, causal=causal, layout=layout)
    assert out.shape == q.shape
    refs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = reference(*refs, causal, 1 / math.sqrt(D), layout)
    _check(out, ref)
    do = torch.randn_like(out)
    out.backward(do)
    ref.backward(do.double())
    _check_grads((q, k, v), refs)


def test_cross_attention_with_a_scale():
    q, k, v = _inputs(1, 200, 457, 4, 4, 128, "bshd")
    out = api.attention(q, k, v, scale=0.07)
    refs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = reference(*refs, False, 0.07, "bshd")
    _check(out, ref)
    out.sum().backward()
    ref.sum().backward()
    _check_grads((q, k, v), refs)


def test_head_dim_256_forward():
    q, k, v = (x.detach() for x in _inputs(1, 300, 300, 4, 2, 256, "bshd"))
    _check(api.attention(q, k, v, causal=True), reference(q, k, v, True, 1 / 16, "bshd"))


def test_torch_compile_fullgraph():
    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            return api.attention(q, k, v, causal=True, layout="bhsd")

    q, k, v = _inputs(2, 260, 260, 8, 2, 128, "bhsd")
    compiled = torch.compile(Block(), fullgraph=True)
    out = compiled(q, k, v)
    out.float().square().sum().backward()
    grads = [x.grad for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    want = Block()(q, k, v)
    want.float().square().sum().backward()
    assert torch.isfinite(out).all()
    assert torch.equal(out, want), "the compiled graph runs the same kernels"
    for g, x in zip(grads, (q, k, v)):
        assert torch.isfinite(g).all() and torch.equal(g, x.grad)


def test_varlen_ragged_with_an_empty_sequence():
    lens_q, lens_k = [130, 0, 77, 256], [100, 9, 77, 300]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")
    Hq, Hkv, D = 8, 2, 64
    q, k, v = (_rand(sum(lens_q), Hq, D, seed=1), _rand(sum(lens_k), Hkv, D, seed=2),
               _rand(sum(lens_k), Hkv, D, seed=3))
    for causal in (False, True):
        for x in (q, k, v):
            x.grad = None
        out = api.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
        refs = [x.detach().double().requires_grad_() for x in (q, k, v)]
        parts = []
        for b in range(len(lens_q)):
            a, e, ka, ke = cu_q[b].item(), cu_q[b + 1].item(), cu_k[b].item(), cu_k[b + 1].item()
            if e > a:
                parts.append(reference(refs[0][None, a:e], refs[1][None, ka:ke],
                                       refs[2][None, ka:ke], causal, 1 / 8, "bshd")[0])
        ref = torch.cat(parts)
        _check(out, ref)
        do = torch.randn_like(out)
        out.backward(do)
        ref.backward(do.double())
        _check_grads((q, k, v), refs)
        assert (k.grad[100:109] == 0).all(), "keys of the empty query sequence: no gradient"
