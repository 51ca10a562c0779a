"""GPU tests of the fused kernels of a Llama training step: ``add_rms_norm``,
``apply_rotary``, ``linear_cross_entropy``, and ``transformers.apply`` with all of them.

Each op runs on fresh random inputs with its outputs poisoned (NaN) before each launch and
is compared with float64 torch on the same (bf16-rounded) inputs: relative L2 error below
1e-5 for f32 storage, 1e-2 for bf16 (the output rounding, 2**-9 relative), 2e-2 for bf16
gradients that pass through two roundings. The cross-entropy's loss is compared to 2e-3
relative: its logits are the GEMM's bf16 output.

    pytest -m gpu packages/pyptx-kernels/tests/test_fused_llama_gpu.py
"""

from __future__ import annotations

import copy
import importlib

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

BF, F32 = torch.bfloat16, torch.float32
TOL = {F32: 1e-5, BF: 1e-2}


@pytest.fixture(autouse=True)
def _first_config(monkeypatch):
    monkeypatch.setenv("PYPTX_AUTOTUNE", "0")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-300)).item()


def _leaf(*shape, dtype=BF, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype).requires_grad_()


@pytest.mark.parametrize("dtype", [F32, BF])
@pytest.mark.parametrize("shape", [(4, 2048, 2048), (3, 1000), (2, 7, 4096), (5, 130, 24)])
def test_add_rms_norm_matches_float64(shape, dtype):
    N = shape[-1]
    x, r, w = _leaf(*shape, dtype=dtype), _leaf(*shape, dtype=dtype), _leaf(N, dtype=dtype)
    y, h = pk.add_rms_norm(x, r, w, eps=1e-5)
    gy, gh = torch.randn_like(y), torch.randn_like(h)
    dx, dr, dw = torch.autograd.grad((y * gy).sum() + (h * gh).sum(), (x, r, w))
    xs = [t.detach().double().requires_grad_() for t in (x, r, w)]
    hd = xs[0] + xs[1]
    yd = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + 1e-5) * xs[2]
    refs = torch.autograd.grad((yd * gy.double()).sum() + (hd * gh.double()).sum(), xs)
    assert rel(h, hd) < TOL[dtype] and rel(y, yd) < TOL[dtype]
    gtol = 1e-5 if dtype is F32 else 2e-2
    for got, ref in zip((dx, dr, dw), refs):
        assert torch.isfinite(got).all() and rel(got, ref) < gtol
    assert torch.equal(dx, dr)


def _hf_rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


@pytest.mark.parametrize("dtype", [F32, BF])
@pytest.mark.parametrize("B,Hq,Hk,S,D,stored", [
    (2, 16, 4, 2048, 128, "bshd"),   # the model's shape, as the projections' views come
    (1, 8, 8, 333, 64, "bhsd"),
    (3, 4, 2, 17, 80, "bshd"),
])
def test_apply_rotary_matches_float64(B, Hq, Hk, S, D, stored, dtype):
    ang = torch.randn(B, S, D // 2, device="cuda", dtype=torch.float64) * 3
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    if stored == "bshd":
        q0, k0 = _leaf(B, S, Hq, D, dtype=dtype), _leaf(B, S, Hk, D, dtype=dtype)
        q, k = q0.transpose(1, 2), k0.transpose(1, 2)
    else:
        q0, k0 = _leaf(B, Hq, S, D, dtype=dtype), _leaf(B, Hk, S, D, dtype=dtype)
        q, k = q0, k0
    qo, ko = pk.apply_rotary(q, k, cos, sin)
    c4, s4 = cos.double()[:, None], sin.double()[:, None]
    assert rel(qo, _hf_rope(q.double(), c4, s4)) < TOL[dtype]
    assert rel(ko, _hf_rope(k.double(), c4, s4)) < TOL[dtype]
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    dq, dk = torch.autograd.grad((qo * gq).sum() + (ko * gk).sum(), (q0, k0))
    xs = [t.detach().double().requires_grad_() for t in (q0, k0)]
    xv = [t.transpose(1, 2) for t in xs] if stored == "bshd" else xs
    ref = (_hf_rope(xv[0], c4, s4) * gq.double()).sum() + (_hf_rope(xv[1], c4, s4)
                                                           * gk.double()).sum()
    rdq, rdk = torch.autograd.grad(ref, xs)
    assert rel(dq, rdq) < TOL[dtype] and rel(dk, rdk) < TOL[dtype]


@pytest.mark.parametrize("T,H,V,kw,chunk", [
    (4096, 2048, 32000, {}, None),
    (1024, 2048, 128256, dict(z_loss=1e-4), 384),          # three chunks, the last short
    (777, 512, 256000, dict(label_smoothing=0.1), None),  # the largest vocabulary
    (300, 256, 5003, dict(reduction="sum", bias=True), 128),  # a vocabulary of odd size
])
def test_linear_cross_entropy_matches_float64(T, H, V, kw, chunk):
    kw = dict(kw)
    x, w = _leaf(T, H), _leaf(V, H, scale=H ** -0.5)
    b = _leaf(V, scale=0.1) if kw.pop("bias", False) else None
    target = torch.randint(0, V, (T,), device="cuda")
    target[::7] = -100
    cfg = None if chunk is None else CrossEntropyConfig(chunk_tokens=chunk)
    loss = pk.linear_cross_entropy(x, w, target, bias=b, config=cfg, **kw)
    ins = [t for t in (x, w, b) if t is not None]
    grads = torch.autograd.grad(loss, ins)
    ds = [t.detach().double().requires_grad_() for t in ins]
    ref = lce_ref(ds[0], ds[1], target, ds[2] if b is not None else None, **kw)
    rgrads = torch.autograd.grad(ref, ds)
    assert abs(loss.item() - ref.item()) < 2e-3 * abs(ref.item())
    for g, r in zip(grads, rgrads):
        assert torch.isfinite(g).all() and rel(g, r) < 2e-2


def test_linear_cross_entropy_never_holds_the_logits():
    """At 8192 tokens x 128256 entries the logits alone would be 2 GiB in bf16: the call's
    peak stays within one chunk's 1 GiB beside the gradients (bf16 dX and dW, dW's f32
    running sum: two chunks of 4096 tokens, the last adding the sum in its epilogue)."""
    T, H, V = 8192, 2048, 128256
    x, w = _leaf(T, H), _leaf(V, H, scale=H ** -0.5)
    target = torch.randint(0, V, (T,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = pk.linear_cross_entropy(x, w, target)
    loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    grads = x.numel() * 2 + w.numel() * (2 + 4)
    assert extra < grads + (1100 << 20), extra / 2**20


@pytest.mark.parametrize("fuse", [dict(swiglu_linear=False, linear_residual=False),
                                  dict(swiglu_linear=True, linear_residual=True)])
def test_apply_llama_training_step_bf16(fuse, monkeypatch):
    """A tiny bf16 Llama with every fused op against the unpatched model (SDPA, torch's ops),
    with and without the GEMM epilogues (``swiglu_linear``, ``linear_residual``): loss to
    1e-2 relative, gradient direction to a cosine of 0.99."""
    transformers = pytest.importorskip("transformers")
    ptf = importlib.import_module("pyptx_kernels.transformers")
    fused = importlib.import_module("pyptx_kernels.gemm.fused")
    calls = []
    for name in ("swiglu_linear", "linear_residual"):
        fn = getattr(fused, name)
        monkeypatch.setattr(fused, name, lambda *a, _n=name, _f=fn: calls.append(_n) or _f(*a))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   vocab_size=1000, max_position_embeddings=256)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    ref = ref.to("cuda", BF).train()
    model = ptf.apply(copy.deepcopy(ref), **fuse)
    ids = torch.randint(0, 1000, (2, 128), device="cuda")

    def step(m, fn=None):
        m.zero_grad(set_to_none=True)
        out = (m if fn is None else fn)(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        return out, torch.cat([p.grad.float().flatten() for p in m.parameters()])

    out, g = step(model)
    rout, rg = step(ref)
    assert calls.count("swiglu_linear") == 2 * fuse["swiglu_linear"]
    assert calls.count("linear_residual") == 2 * fuse["linear_residual"]
    assert out.logits is None
    assert abs(out.loss.item() - rout.loss.item()) < 1e-2 * rout.loss.item()
    assert torch.isfinite(g).all()
    assert torch.nn.functional.cosine_similarity(g, rg, dim=0) > 0.99
    cout, cg = step(model, torch.compile(model))
    assert abs(cout.loss.item() - rout.loss.item()) < 1e-2 * rout.loss.item()
    assert torch.nn.functional.cosine_similarity(cg, rg, dim=0) > 0.99
