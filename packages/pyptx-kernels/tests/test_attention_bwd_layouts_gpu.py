"""GPU tests of the attention backward reading ``(B, H, S, D)`` q, k, v in place: float64
autograd (``bwd_reference.reference``) with every output NaN-poisoned, bit for bit the
contiguous ``(B, S, H, D)`` call's gradients, through ``attention_backward`` (attention()'s
eager plans and the pair) and through ``attention(layout="bhsd")``'s autograd, whose kernels
get the caller's memory (their data pointers recorded).

    pytest -m gpu packages/pyptx-kernels/tests/test_attention_bwd_layouts_gpu.py
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

fab = importlib.import_module("pyptx_kernels.flash_attention.backward")
api = importlib.import_module("pyptx_kernels.flash_attention.api")
P = fab.BackwardPlan
TOL = {torch.bfloat16: 1e-2, torch.float16: 4e-3}


def _bhsd(B, H, S, D, dt, g):
    return torch.randn(B, H, S, D, device="cuda", dtype=dt, generator=g)


def _check(got, refs, dt):
    for name, g, r in zip(("dq", "dk", "dv"), got, refs):
        assert not torch.isnan(g).any(), f"{name}: unwritten (NaN-poisoned) or NaN elements"
        err = ((g.double() - r).norm() / r.norm()).item()
        worst = ((g.double() - r).abs().max() / r.abs().max()).item()
        assert err < TOL[dt] and worst < 0.1, (name, err, worst)


@pytest.mark.parametrize("B,S,Sk,Hq,Hkv,D,causal,plan,kv_bhsd,dt", [
    (2, 1000, 1000, 8, 2, 64, True, "eager", True, torch.bfloat16),     # fused, kv_split
    (1, 2048, 2048, 4, 4, 64, False, "eager", False, torch.bfloat16),
    (2, 1500, 1500, 8, 2, 128, True, "eager", True, torch.bfloat16),    # lagged, kv_split
    (1, 777, 1300, 4, 2, 128, False, "eager", True, torch.float16),     # Sk > S
    (2, 1000, 900, 4, 2, 64, False, "pair", True, torch.bfloat16),
    (1, 1024, 1024, 8, 8, 128, True, "pair", False, torch.bfloat16),
    (1, 1024, 1024, 4, 2, 128, True, "bulk", True, torch.bfloat16),     # deterministic=False
])
def test_bhsd_views_match_float64_and_the_contiguous_call(B, S, Sk, Hq, Hkv, D, causal, plan,
                                                          kv_bhsd, dt):
    g = torch.Generator(device="cuda").manual_seed(S + D)
    q = _bhsd(B, Hq, S, D, dt, g).transpose(1, 2)           # (B, S, H, D) views
    k, v = ((_bhsd(B, Hkv, Sk, D, dt, g).transpose(1, 2) if kv_bhsd else
             torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt, generator=g)) for _ in range(2))
    do = torch.randn(B, S, Hq, D, device="cuda", dtype=dt, generator=g)
    o, lse, *refs = fab.reference(q, k, v, do, causal)
    o, lse = o.to(dt).contiguous(), lse.float().contiguous()
    p = {"eager": P.for_eager(D), "pair": P(), "bulk": P.bulk()}[plan]
    got = fab.attention_backward(q, k, v, o, lse, do, causal=causal, plan=p)
    _check(got, refs, dt)
    if plan != "bulk":      # deterministic: the same bits as from contiguous inputs
        dense = fab.attention_backward(*(x.contiguous() for x in (q, k, v)), o, lse, do,
                                       causal=causal, plan=p)
        assert all(torch.equal(a, b) for a, b in zip(got, dense))


@pytest.mark.parametrize("D,causal,Hq,Hkv", [(64, True, 8, 2), (128, True, 8, 2),
                                             (128, False, 4, 4)])
def test_attention_bhsd_autograd_reads_the_callers_memory(D, causal, Hq, Hkv, monkeypatch):
    """``attention(layout="bhsd")`` on leaf ``(B, H, S, D)`` tensors: its backward kernels
    get their memory (the same data pointers, layouts ``bhsd``), the gradients match float64
    and the bshd call's bit for bit."""
    from pyptx_kernels import attention

    seen = []
    original = api._backward_kernel

    def recording(*args, **kw):
        bwd = original(*args, **kw)

        def run(q, k, v, o, lse, do):
            seen.append((getattr(bwd, "layouts", None), [x.data_ptr() for x in (q, k, v)]))
            return bwd(q, k, v, o, lse, do)
        return run
    monkeypatch.setattr(api, "_backward_kernel", recording)
    B, S = 2, 1200
    g = torch.Generator(device="cuda").manual_seed(D + Hq)
    q, k, v = (_bhsd(B, h, S, D, torch.bfloat16, g).requires_grad_() for h in (Hq, Hkv, Hkv))
    do = _bhsd(B, Hq, S, D, torch.bfloat16, g)
    out = attention(q, k, v, causal=causal, layout="bhsd")
    got = torch.autograd.grad(out, (q, k, v), do)
    assert seen == [(("bhsd",) * 3, [x.data_ptr() for x in (q, k, v)])]
    t = [x.detach().transpose(1, 2) for x in (q, k, v)]
    _o, _lse, *refs = fab.reference(*t, do.transpose(1, 2), causal)
    _check([x.transpose(1, 2) for x in got], refs, torch.bfloat16)
    qs, ks, vs = (x.contiguous().requires_grad_() for x in t)
    dense = torch.autograd.grad(attention(qs, ks, vs, causal=causal), (qs, ks, vs),
                                do.transpose(1, 2).contiguous())
    assert all(torch.equal(a.transpose(1, 2), b) for a, b in zip(got, dense))
