"""CPU tests of the public attention API (``pyptx_kernels.flash_attention.api``).

* Every refused input raises ``ConfigError`` whose message starts with this file's line of
  the call.
* ``_kernels`` traces the forward and backward kernels of a call on meta tensors; ptxas
  assembles them.
* The custom ops' wiring (layouts, grouped-query heads, autograd through the backward op,
  varlen with an empty sequence) with the kernel launches replaced by float64 models of what
  the kernels compute: the forward ``softmax(scale q k^T) v`` and its lse, the backward dq,
  dk, dv from the formulas (P from the saved lse); gradients against torch autograd of a
  float64 reference.
* ``torch.compile(fullgraph=True)`` of a module calling ``attention``: one graph holding
  the op, the fake implementations traced by AOT autograd (forward and backward), results
  equal to eager; a first torch call inside ``torch.compile`` (fresh process) too.
"""

from __future__ import annotations

import importlib
import math
import subprocess
import sys

import pytest

from pyptx.errors import ConfigError

torch = pytest.importorskip("torch")

api = importlib.import_module("pyptx_kernels.flash_attention.api")
from pyptx_kernels.flash_attention import fwd_host
from pyptx_kernels.flash_attention import fwd_reference as fa

BF16 = torch.bfloat16


# ------------------------------------------------------------------ refused inputs
def _t(*shape, dtype=BF16, device="meta", grad=False):
    return torch.empty(*shape, dtype=dtype, device=device, requires_grad=grad)


def _cpu(x):
    return torch.empty_like(x, device="cpu")


def _raises_here(call):
    line = call.__code__.co_firstlineno
    with pytest.raises(ConfigError) as e:
        call()
    assert str(e.value).startswith(f"{__file__}:{line}:"), str(e.value)
    return str(e.value)


Q, KV = _t(2, 16, 4, 64), _t(2, 24, 2, 64)
DENSE_CASES = {
    "layout": (lambda: api.attention(Q, KV, KV, layout="sbhd"), "layout must be"),
    "layout type": (lambda: api.attention(Q, KV, KV, layout=None), "layout must be"),
    "not a tensor": (lambda: api.attention([1.0], KV, KV), "q must be a torch tensor"),
    "rank": (lambda: api.attention(Q[0], KV, KV), "q must be 4-D"),
    "dtype": (lambda: api.attention(Q.float(), KV.float(), KV.float()), "bfloat16 or float16"),
    "mixed dtypes": (lambda: api.attention(Q, KV.half(), KV.half()), "share one dtype"),
    "k v shapes": (lambda: api.attention(Q, KV, KV[:, :8]), "k and v must have one shape"),
    "batch": (lambda: api.attention(Q, KV[:1], KV[:1]), "same batch B and head dim D"),
    "head dim mismatch": (lambda: api.attention(Q, KV[..., :32], KV[..., :32]),
                          "same batch B and head dim D"),
    "groups": (lambda: api.attention(_t(2, 16, 3, 64), KV, KV), "multiple of the key/value"),
    "groups bhsd": (lambda: api.attention(_t(2, 3, 16, 64), _t(2, 2, 8, 64), _t(2, 2, 8, 64),
                                          layout="bhsd"), "multiple of the key/value"),
    "head dim": (lambda: api.attention(_t(1, 8, 2, 96), _t(1, 8, 2, 96), _t(1, 8, 2, 96)),
                 "head dim D must be one of"),
    "no backward": (lambda: api.attention(_t(1, 8, 2, 256, grad=True), _t(1, 8, 2, 256),
                                          _t(1, 8, 2, 256)), "forward only"),
    "empty": (lambda: api.attention(_t(2, 0, 4, 64), KV, KV), "empty input"),
    "cpu": (lambda: api.attention(_cpu(Q), _cpu(KV),
                                  _cpu(KV)), "must be CUDA tensors"),
    "devices": (lambda: api.attention(Q, _cpu(KV), KV), "different devices"),
    "causal": (lambda: api.attention(Q, KV, KV, causal="yes"), "causal must be a bool"),
    "scale type": (lambda: api.attention(Q, KV, KV, scale="0.1"), "scale must be"),
    "scale bool": (lambda: api.attention(Q, KV, KV, scale=True), "scale must be"),
    "scale inf": (lambda: api.attention(Q, KV, KV, scale=math.inf), "scale must be"),
}

TQ, TK = _t(20, 4, 64), _t(30, 2, 64)
CU = torch.zeros(3, dtype=torch.int32, device="meta")
VARLEN_CASES = {
    "rank": (lambda: api.attention_varlen(Q, TK, TK, CU, CU, 8, 8), "q must be 3-D"),
    "cu rank": (lambda: api.attention_varlen(TQ, TK, TK, CU[None], CU, 8, 8),
                "cu_seqlens_q must be 1-D"),
    "cu dtype": (lambda: api.attention_varlen(TQ, TK, TK, CU.long(), CU, 8, 8), "int32"),
    "cu lengths": (lambda: api.attention_varlen(TQ, TK, TK, CU, CU[:2], 8, 8), "B + 1"),
    "no sequence": (lambda: api.attention_varlen(TQ, TK, TK, CU[:1], CU[:1], 8, 8), "B + 1"),
    "max seqlen": (lambda: api.attention_varlen(TQ, TK, TK, CU, CU, 0, 8), "max_seqlen_q"),
    "max seqlen type": (lambda: api.attention_varlen(TQ, TK, TK, CU, CU, 8, 8.0),
                        "max_seqlen_k"),
    "groups": (lambda: api.attention_varlen(_t(20, 3, 64), TK, TK, CU, CU, 8, 8),
               "multiple of the key/value"),
    "head dim": (lambda: api.attention_varlen(TQ, TK[..., :32], TK[..., :32], CU, CU, 8, 8),
                 "same head dim"),
    "dtype": (lambda: api.attention_varlen(TQ.half(), TK, TK, CU, CU, 8, 8), "share one dtype"),
    "cpu": (lambda: api.attention_varlen(TQ, TK, TK, _cpu(CU), CU, 8, 8),
            "different devices"),
    "scale": (lambda: api.attention_varlen(TQ, TK, TK, CU, CU, 8, 8, scale=[1]), "scale"),
}


@pytest.fixture
def meta_ok(monkeypatch):
    """Meta tensors pass the device check (nothing launches on them), so each case reaches
    the check it is about."""


@pytest.mark.parametrize("case", DENSE_CASES)
def test_attention_refuses_bad_input_at_the_callers_line(meta_ok, case):
    call, words = DENSE_CASES[case]
    assert words in _raises_here(call)


@pytest.mark.parametrize("case", VARLEN_CASES)
def test_attention_varlen_refuses_bad_input_at_the_callers_line(meta_ok, case):
    call, words = VARLEN_CASES[case]
    assert words in _raises_here(call)


def test_jax_arrays_are_checked_too():
    jnp = pytest.importorskip("jax.numpy")
    q = jnp.zeros((1, 8, 4, 64), jnp.bfloat16)
    assert "multiple of the key/value" in _raises_here(
        lambda: api.attention(q, q[:, :, :3], q[:, :, :3]))
    assert "mix torch tensors and JAX" in _raises_here(
        lambda: api.attention(q, _t(1, 8, 4, 64), q))
    assert "_kernels" in _raises_here(lambda: api._kernels("attn", q, q, q))


# ------------------------------------------------------------------ the kernels of a call
@pytest.mark.parametrize("B,S,Hq,Hkv,D,causal", [(2, 1000, 8, 2, 128, True),
                                                (1, 513, 4, 4, 64, False)])
def test_kernels_of_a_call_trace_and_assemble(assemble, B, S, Hq, Hkv, D, causal):
    q, kv = _t(B, S, Hq, D), _t(B, S, Hkv, D)
    kernels = api._kernels("attention", q, kv, kv, causal=causal)
    names = [k.name for k in kernels]
    assert names[0].startswith(f"flash_fwd_bf16_d{D}_") and ("_causal" in names[0]) == causal
    assert any("bwd" in n for n in names[1:]), names
    # the bhsd layout of the same call builds the same kernels
    bhsd = [k.transpose(1, 2) for k in (q, kv, kv)]
    assert [k.name for k in api._kernels("attention", *bhsd, causal=causal,
                                         layout="bhsd")] == names
    for k in kernels:
        assert "0 bytes spill stores" in assemble(k.ptx()), k.name


def test_varlen_kernels_trace_and_assemble(assemble):
    q, kv = _t(300, 4, 64), _t(280, 2, 64)
    cu = torch.zeros(4, dtype=torch.int32, device="meta")
    kernels = api._kernels("attention_varlen", q, kv, kv, cu, cu, 200, 180, causal=True)
    assert [k.name.split("_")[:3] for k in kernels][0] == ["flash", "fwd", "varlen"]
    assert len(kernels) == 3
    for k in kernels:
        assert "0 bytes spill stores" in assemble(k.ptx()), k.name


def test_no_backward_kernels_at_head_dim_256():
    q = _t(1, 200, 2, 256)
    (fwd,) = api._kernels("attention", q, q, q)
    assert "_d256_" in fwd.name


# ------------------------------------------------------------------ float64 models
def _heads(x, G):
    return x.double().transpose(1, 2).repeat_interleave(G, dim=1)


def _probs(q, k, lse, causal, scale):
    """P = exp(scale q k^T - lse) (B, H, S, Sk) in float64, with the causal mask."""
    G = q.shape[2] // k.shape[2]
    s = (_heads(q, 1) @ _heads(k, G).transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(q.shape[1])[:, None]
        s = s.masked_fill(torch.arange(k.shape[1])[None, :] > i, -math.inf)
    return torch.exp(s - lse.double()[..., None])


NO_FEATURES = ((-1, -1), 0.0)


def model_forward(q, k, v, causal, scale, features=NO_FEATURES):
    xs, layouts = fwd_host.memory_layouts(q, k, v)    # what the kernel gets, as _launch_forward
    for x, lay in zip(xs, layouts):   # (B, S, H, D) or (B, H, S, D) storage, read in place
        assert x.is_contiguous() and lay in ("bshd", "bhsd")
        MODEL["ptrs"].append(x.data_ptr())
    o, lse = fa.reference(q, k, v, causal, scale, *features)
    MODEL["fwd"] += 1
    return o.to(q.dtype).contiguous(), lse.float()


def model_backward(q, k, v, o, lse, do, causal, scale, features=NO_FEATURES):
    assert features == NO_FEATURES
    xs, _ = fwd_host.memory_layouts(q, k, v)    # (B, S, H, D) or (B, H, S, D): read in place
    assert all(x.data_ptr() == y.data_ptr() for x, y in zip(xs, (q, k, v)))
    B, S, Hq, D = q.shape
    Hkv, Sk, G = k.shape[2], k.shape[1], Hq // k.shape[2]
    p = _probs(q, k, lse, causal, scale)
    dod = _heads(do, 1)
    dv = p.transpose(-1, -2) @ dod
    dp = dod @ _heads(v, G).transpose(-1, -2)
    ds = p * (dp - (dod * _heads(o, 1)).sum(-1, keepdim=True))
    dq = scale * ds @ _heads(k, G)
    dk = scale * ds.transpose(-1, -2) @ _heads(q, 1)

    def kv_grad(g):
        return g.view(B, Hkv, G, Sk, D).sum(2).transpose(1, 2).to(k.dtype).contiguous()

    MODEL["bwd"] += 1
    return dq.transpose(1, 2).to(q.dtype).contiguous(), kv_grad(dk), kv_grad(dv)


def _sequences(cu_q, cu_k):
    cq, ck = cu_q.tolist(), cu_k.tolist()
    return [(cq[b], cq[b + 1], ck[b], ck[b + 1]) for b in range(len(cq) - 1)]


def model_varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, features=NO_FEATURES):
    assert all(e - a <= max_q for a, e, _, _ in _sequences(cu_q, cu_k))
    o, lse = fa.reference_varlen(q, k, v, cu_q, cu_k, causal, scale, *features)
    MODEL["fwd"] += 1
    return o.to(q.dtype), lse.float()


def model_varlen_backward(q, k, v, cu_q, cu_k, o, lse, do, max_q, max_k, causal, scale,
                          features=NO_FEATURES):
    assert features == NO_FEATURES
    dq, dk, dv = (torch.zeros(x.shape, dtype=torch.float64) for x in (q, k, v))
    calls = MODEL["bwd"]
    for a, e, ka, ke in _sequences(cu_q, cu_k):
        if e > a and ke > ka:
            g = model_backward(q[None, a:e], k[None, ka:ke], v[None, ka:ke], o[None, a:e],
                               lse[None, :, a:e].contiguous(), do[None, a:e], causal, scale)
            dq[a:e], dk[ka:ke], dv[ka:ke] = (x[0].double() for x in g)
    MODEL["bwd"] = calls + 1
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


MODEL = {"fwd": 0, "bwd": 0, "ptrs": []}


@pytest.fixture
def model(monkeypatch):
    """Launches replaced by the float64 models; CPU tensors accepted."""
    monkeypatch.setattr(api._common, "check_devices", lambda who, *xs: None)
    for name, fn in (("_launch_forward", model_forward), ("_launch_backward", model_backward),
                     ("_launch_varlen_forward", model_varlen_forward),
                     ("_launch_varlen_backward", model_varlen_backward)):
        monkeypatch.setattr(api, name, fn)
    MODEL.update(fwd=0, bwd=0, ptrs=[])
    return MODEL


def _rand(*shape, seed, dtype=BF16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_()


def _rel(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def reference(q, k, v, causal, scale, layout):
    """float64 attention by torch autograd, in the caller's layout."""
    if layout == "bhsd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    Hq, Hkv = q.shape[2], k.shape[2]
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    kd, vd = (x.repeat_interleave(Hq // Hkv, dim=1) for x in (kd, vd))
    s = (qd @ kd.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    o = torch.softmax(s, dim=-1) @ vd     # (B, H, S, D)
    return o if layout == "bhsd" else o.transpose(1, 2)


@pytest.mark.parametrize("B,S,Sk,Hq,Hkv,D,causal,layout,scale", [
    (2, 37, 37, 4, 2, 64, True, "bshd", None),
    (1, 29, 45, 6, 3, 128, False, "bshd", 0.2),
    (2, 33, 33, 4, 1, 64, True, "bhsd", None),
    (1, 20, 31, 2, 2, 128, False, "bhsd", 0.05),
])
def test_autograd_matches_float64(model, B, S, Sk, Hq, Hkv, D, causal, layout, scale):
    shape = (lambda s, h: (B, s, h, D)) if layout == "bshd" else (lambda s, h: (B, h, s, D))
    q, k, v = (_rand(*shape(s, h), seed=i) for i, (s, h) in
               enumerate(((S, Hq), (Sk, Hkv), (Sk, Hkv))))
    out = api.attention(q, k, v, causal=causal, scale=scale, layout=layout)
    assert out.shape == q.shape and out.dtype == q.dtype
    sc = 1 / math.sqrt(D) if scale is None else scale
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = reference(q64, k64, v64, causal, sc, layout)
    assert _rel(out, ref) < 1e-2
    assert model["ptrs"] == [x.data_ptr() for x in (q, k, v)], "the forward copied an input"
    do = _rand(*out.shape, seed=9).detach()
    out.backward(do)
    ref.backward(do.double())
    assert model["fwd"] == 1 and model["bwd"] == 1
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert got.shape == want.shape and got.dtype == BF16
        assert _rel(got, want) < 1e-2


def test_varlen_autograd_matches_float64(model):
    cu_q = torch.tensor([0, 17, 17, 40, 52], dtype=torch.int32)   # sequence 1 is empty
    cu_k = torch.tensor([0, 20, 25, 48, 60], dtype=torch.int32)
    Hq, Hkv, D = 4, 2, 64
    q, k, v = _rand(52, Hq, D, seed=1), _rand(60, Hkv, D, seed=2), _rand(60, Hkv, D, seed=3)
    out = api.attention_varlen(q, k, v, cu_q, cu_k, 23, 23, causal=True)
    assert out.shape == q.shape
    do = _rand(*out.shape, seed=4).detach()
    out.backward(do)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    parts = []
    for a, e, ka, ke in _sequences(cu_q, cu_k):
        if e > a:
            parts.append(reference(q64[None, a:e], k64[None, ka:ke], v64[None, ka:ke], True,
                                   1 / math.sqrt(D), "bshd")[0])
    ref = torch.cat(parts)
    assert _rel(out, ref) < 1e-2
    ref.backward(do.double())
    assert model["fwd"] == 1 and model["bwd"] == 1
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert _rel(got, want) < 1e-2
    assert (k.grad[20:25] == 0).all(), "keys of the empty sequence get no gradient"


def test_no_grad_call_runs_no_backward(model):
    q = _rand(1, 16, 2, 64, seed=0)
    with torch.no_grad():
        out = api.attention(q, q, q)
    assert out.grad_fn is None and model["fwd"] == 1 and model["bwd"] == 0


# ------------------------------------------------------------------ layouts, window, softcap
def test_hugging_face_views_reach_the_kernel_without_a_copy(model):
    """``view(B, S, H, D).transpose(1, 2)`` (HF's q) and contiguous ``(B, H, S, D)`` k, v
    (after rotary / the cache) reach the forward as they are; a sliced ``(B, S, 3, H, D)``
    projection is copied (its strides are neither order)."""
    B, S, H, D = 2, 24, 4, 64
    q = _rand(B, S, H * D, seed=1).detach().view(B, S, H, D).transpose(1, 2)
    k, v = (_rand(B, H, S, D, seed=s).detach() for s in (2, 3))
    with torch.no_grad():
        out = api.attention(q, k, v, layout="bhsd", causal=True)
    assert model["ptrs"] == [x.data_ptr() for x in (q, k, v)]
    ref = reference(*(x.double() for x in (q, k, v)), True, 1 / math.sqrt(D), "bhsd")
    assert out.shape == (B, H, S, D) and _rel(out, ref) < 1e-2
    qkv = _rand(B, S, 3, H, D, seed=4).detach()
    model["ptrs"].clear()
    with torch.no_grad():
        api.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
    assert all(p != qkv.data_ptr() for p in model["ptrs"])


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal,window,softcap", [
    (True, (8, -1), 0.0), (False, (5, 3), 0.0), (False, (-1, -1), 2.5), (True, (6, 0), 4.0)])
def test_window_and_softcap_reach_the_forward(model, layout, causal, window, softcap):
    B, S, H, D = 1, 30, 2, 64
    shape = (B, S, H, D) if layout == "bshd" else (B, H, S, D)
    q, k, v = (_rand(*shape, seed=s).detach() for s in range(3))
    with torch.no_grad():
        out = api.attention(q, k, v, causal=causal, layout=layout, window=window,
                            softcap=softcap)
    t = (lambda x: x) if layout == "bshd" else (lambda x: x.transpose(1, 2))
    ref, _ = fa.reference(*(t(x) for x in (q, k, v)), causal, None, window, softcap)
    assert _rel(t(out), ref) < 1e-2


def test_varlen_window_and_softcap_reach_the_forward(model):
    cu = torch.tensor([0, 20, 20, 45], dtype=torch.int32)
    q, k, v = (_rand(45, 2, 64, seed=s).detach() for s in range(3))
    with torch.no_grad():
        out = api.attention_varlen(q, k, v, cu, cu, 25, 25, causal=True, window=(7, -1),
                                   softcap=3.0)
    ref, _ = fa.reference_varlen(q, k, v, cu, cu, True, None, (7, -1), 3.0)
    assert _rel(out, ref) < 1e-2


def test_a_backward_without_window_keywords_refuses_at_the_callers_line():
    """The backward builder gets ``window``/``softcap`` only when they are not the defaults;
    one that does not take them yet makes ``ConfigError`` at the user's line."""
    seen = []

    def old_builder(*args, **kw):
        seen.append(kw)
        return "bwd"

    def new_builder(*args, window=(-1, -1), softcap=0.0, **kw):
        seen.append(dict(kw, window=window, softcap=softcap))
        return "bwd"

    assert fwd_host.build_backward(old_builder, 1, causal=True) == "bwd"
    assert seen[-1] == dict(causal=True)
    feats = ((16, -1), 2.0)
    assert fwd_host.build_backward(new_builder, 1, features=feats) == "bwd"
    assert seen[-1] == dict(window=(16, -1), softcap=2.0)
    with pytest.raises(ConfigError, match=r"test_attention_api_cpu\.py:\d+: .*window=\(16, -1\)"):
        fwd_host.build_backward(lambda *a, causal=False: None, 1, features=feats)


@pytest.mark.parametrize("kw", [dict(window=(-3, 0)), dict(window="all"), dict(softcap=-2.0),
                                dict(softcap=True)])
def test_bad_window_or_softcap_name_the_callers_line(model, kw):
    q = _rand(1, 16, 2, 64, seed=0).detach()
    with pytest.raises(ConfigError, match=r"test_attention_api_cpu\.py:\d+: "):
        api.attention(q, q, q, **kw)


# ------------------------------------------------------------------ torch.compile
class Block(torch.nn.Module):
    def forward(self, x, kv):
        q = x.view(*x.shape[:2], 4, 64) * 2
        o = api.attention(q, kv, kv, causal=True)
        o2 = api.attention(q.transpose(1, 2), kv.transpose(1, 2), kv.transpose(1, 2),
                           layout="bhsd").transpose(1, 2)
        return (o + o2).flatten(2)


def test_compile_fullgraph_one_graph_with_the_op(model):
    x, kv = _rand(2, 24, 256, seed=1), _rand(2, 24, 2, 64, seed=2)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager(gm, example_inputs)   # forward and backward traced with fake tensors

    explain = torch._dynamo.explain(Block())(x, kv)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(Block(), fullgraph=True, backend=record)
    y = compiled(x, kv)
    assert len(graphs) == 1
    ops = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.pyptx.attention) == 2
    y.sum().backward()
    gx, gkv = x.grad, kv.grad
    x.grad = kv.grad = None
    want = Block()(x, kv)
    want.sum().backward()
    assert torch.equal(y, want) and torch.equal(gx, x.grad) and torch.equal(gkv, kv.grad)


def test_varlen_compiles_fullgraph(model):
    cu = torch.tensor([0, 5, 5, 19], dtype=torch.int32)
    q, kv = _rand(19, 4, 64, seed=1), _rand(19, 2, 64, seed=2)

    def f(q, kv, cu):
        return api.attention_varlen(q * 1, kv, kv, cu, cu, 14, 14) * 2

    y = torch.compile(f, fullgraph=True, backend="aot_eager")(q, kv, cu)
    y.sum().backward()
    gq = q.grad
    q.grad = None
    want = f(q, kv, cu)
    want.sum().backward()
    assert torch.equal(y, want) and torch.equal(gq, q.grad)


def test_fake_shapes_of_the_ops():
    from torch._subclasses.fake_tensor import FakeTensorMode

    api._register()
    api._common.define_ops()
    with FakeTensorMode():
        q, kv = torch.empty(2, 40, 8, 128, dtype=BF16), torch.empty(2, 50, 2, 128, dtype=BF16)
        o, lse = torch.ops.pyptx.attention(q, kv, kv, True, 0.1)
        assert o.shape == q.shape and o.dtype == BF16 and lse.shape == (2, 8, 40)
        assert lse.dtype == torch.float32
        grads = torch.ops.pyptx.attention_backward(q, kv, kv, o, lse, o, True, 0.1)
        assert [g.shape for g in grads] == [q.shape, kv.shape, kv.shape]
        cu = torch.empty(4, dtype=torch.int32)
        o, lse = torch.ops.pyptx.attention_varlen(q[0], kv[0], kv[0], cu, cu, 9, 9, False, 0.1)
        assert o.shape == (40, 8, 128) and lse.shape == (8, 40)
        grads = torch.ops.pyptx.attention_varlen_backward(q[0], kv[0], kv[0], cu, cu, o, lse,
                                                          o, 9, 9, False, 0.1)
        assert [g.shape for g in grads] == [(40, 8, 128), (50, 2, 128), (50, 2, 128)]


def test_first_torch_call_inside_compile_registers_the_ops():
    """A fresh process whose first attention call is under torch.compile(fullgraph=True):
    the ops are defined at trace time, no graph break (the call fails only at the launch,
    which needs a GPU: fake CUDA inputs stop before it)."""
    code = (
        "import torch\n"
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "import pyptx_kernels.flash_attention.api as api\n"
        "with FakeTensorMode():\n"
        "    q = torch.empty(1, 64, 4, 64, dtype=torch.bfloat16, device='cuda')\n"
        "    k = torch.empty(1, 64, 2, 64, dtype=torch.bfloat16, device='cuda')\n"
        "    y = torch._dynamo.explain(lambda q, k: api.attention(q, k, k) * 2)(q, k)\n"
        "print(y.graph_count, y.graph_break_count, hasattr(torch.ops.pyptx, 'attention'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "0", "True"], out.stdout + out.stderr


def _fresh(code):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_plain_eager_call_defines_no_op():
    """A fresh process: the first eager call (launches replaced, CPU tensors taking the direct
    path) runs the implementation without defining any ``pyptx::attention*`` op; a meta call
    then defines ``attention`` and its backward, not the varlen ops; ``define_ops`` the rest."""
    code = (
        "import torch\n"
        "import pyptx_kernels.flash_attention.api as api\n"
        "from pyptx_kernels import _common\n"
        "_common.check_devices = lambda *a: None\n"
        "_common.EAGER_DEVICES = ('cuda', 'cpu')\n"
        "api._launch_forward = lambda q, k, v, *a: (q * 2, q.new_empty(q.shape[:3]))\n"
        "q = torch.ones(1, 8, 2, 64, dtype=torch.bfloat16)\n"
        "assert torch.equal(api.attention(q, q, q), q * 2)\n"
        "names = ['attention', 'attention_backward', 'attention_varlen',\n"
        "         'attention_varlen_backward']\n"
        "print(*(hasattr(torch.ops.pyptx, n) for n in names))\n"
        "m = torch.empty(1, 8, 2, 64, dtype=torch.bfloat16, device='meta')\n"
        "assert api.attention(m, m, m).shape == m.shape\n"
        "print(*(hasattr(torch.ops.pyptx, n) for n in names))\n"
        "_common.define_ops()\n"
        "print(*(hasattr(torch.ops.pyptx, n) for n in names))\n")
    assert _fresh(code) == ["False"] * 4 + ["True", "True", "False", "False"] + ["True"] * 4


def test_fresh_import_compiles_fullgraph():
    """A fresh process whose first attention call is ``torch.compile(fullgraph=True)`` with
    AOT autograd (forward and backward graphs through the fake implementations): the ops are
    defined at trace time, the result and gradient equal the eager call's."""
    code = (
        "import torch\n"
        "import pyptx_kernels.flash_attention.api as api\n"
        "from pyptx_kernels import _common\n"
        "_common.check_devices = lambda *a: None\n"
        "api._launch_forward = lambda q, k, v, *a: (q * 2, q.new_zeros(q.shape[0], q.shape[2],\n"
        "                                                           q.shape[1]).float())\n"
        "api._launch_backward = lambda q, k, v, o, lse, do, *a: (do * 2, do * 0, do * 0)\n"
        "def f(q):\n"
        "    return api.attention(q * 1, q, q, causal=True) * 3\n"
        "q = torch.ones(1, 8, 2, 64, dtype=torch.bfloat16, requires_grad=True)\n"
        "y = torch.compile(f, fullgraph=True, backend='aot_eager')(q)\n"
        "y.sum().backward()\n"
        "print(torch.equal(y, q.detach() * 6), torch.equal(q.grad, torch.full_like(q, 6)))\n")
    assert _fresh(code) == ["True", "True"]
