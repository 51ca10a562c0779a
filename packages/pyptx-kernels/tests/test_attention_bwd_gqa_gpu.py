"""GPU tests of the grouped-query backward split over a cluster (``BackwardPlan(kv_split=)``):
float64 autograd on fresh random inputs (outputs NaN-poisoned), bit-for-bit repeat runs
(deterministic), and ``attention()``'s default backward for grouped heads.

    pytest -m gpu packages/pyptx-kernels/tests/test_attention_bwd_gqa_gpu.py
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
P = fab.BackwardPlan
TOL = {torch.bfloat16: 1e-2, torch.float16: 4e-3}


def _inputs(B, S, Hq, Hkv, D, dt=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(B, S, Hq, D, device="cuda", dtype=dt, generator=g) for _ in range(2))
    k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=dt, generator=g) for _ in range(2))
    return q, k, v, do


def _check(got, refs, dt):
    for name, g, r in zip(("dq", "dk", "dv"), got, refs):
        assert not torch.isnan(g).any(), f"{name}: unwritten (NaN-poisoned) or NaN elements"
        err = ((g.double() - r).norm() / r.norm()).item()
        worst = ((g.double() - r).abs().max() / r.abs().max()).item()
        assert err < TOL[dt] and worst < 0.1, (name, err, worst)


PLANS = {
    "lagged": lambda s: P.lagged(kv_split=s),
    "converted": lambda s: P.converted(kv_split=s),
    "ordered": lambda s: P.ordered(kv_split=s),
    "bulk": lambda s: P(atomic_dq=True, dq_bulk=True, kv_split=s),
    "pair": lambda s: P(kv_split=s),
    "fused": lambda s: P.fused(pingpong=1, kv_split=s),
}


@pytest.mark.parametrize("B,S,Hq,Hkv,D,causal,split,plan", [
    (2, 1000, 8, 2, 128, True, 2, "lagged"),
    (2, 1000, 8, 2, 128, False, 4, "lagged"),     # stats_lead and convert_lag with the split
    (1, 2048, 16, 2, 128, True, 8, "lagged"),
    (3, 777, 12, 3, 128, False, 2, "converted"),  # ragged S, B=3
    (2, 513, 8, 1, 64, True, 4, "ordered"),
    (2, 513, 8, 2, 64, False, 2, "bulk"),
    (2, 300, 4, 1, 64, True, 2, "pair"),          # the pair's dK/dV kernel (JAX, compile)
    (2, 1000, 8, 2, 64, True, 2, "fused"),        # attention()'s D=64 plan
    (1, 1024, 16, 2, 64, False, 8, "fused"),      # rotated order: 8 x 8 CTAs per head
    (2, 4096, 16, 2, 128, False, 4, "lagged"),    # 32 x 4 CTAs per head: ascending order
])
def test_split_matches_float64_and_repeats_bit_for_bit(B, S, Hq, Hkv, D, causal, split, plan):
    q, k, v, do = _inputs(B, S, Hq, Hkv, D, seed=S + split)
    o, lse, *refs = fab.reference(q, k, v, do, causal)
    o, lse = o.to(q.dtype), lse.float()
    p = PLANS[plan](split)
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, D, causal=causal, plan=p)
    assert f"_split{split}" in bwd.dkdv_kernel.name
    first = fab.attention_backward(q, k, v, o, lse, do, causal=causal, plan=p)
    _check(first, refs, q.dtype)
    if plan != "bulk":      # bulk adds dQ in any order: not deterministic by design
        for _ in range(3):
            again = fab.attention_backward(q, k, v, o, lse, do, causal=causal, plan=p)
            assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("B,S,Hq,Hkv,D,causal", [
    (2, 4096, 32, 8, 128, True), (1, 4096, 16, 4, 128, False), (2, 2048, 32, 4, 128, True),
    (2, 2048, 16, 4, 64, True), (1, 2048, 16, 2, 64, False),
])
def test_attention_default_backward_splits_grouped_heads(B, S, Hq, Hkv, D, causal):
    """``attention()``'s eager backward (``for_eager``: ``lagged()`` at D=128, ``fused()`` at
    64, kv_split "auto": 2)
    on benchmark-sized grouped shapes: float64 and deterministic."""
    from pyptx_kernels.flash_attention import attention

    q, k, v, do = _inputs(B, S, Hq, Hkv, D, seed=B * S)
    _, _, *refs = fab.reference(q, k, v, do, causal)
    grads = []
    for _ in range(2):
        qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
        attention(qq, kk, vv, causal=causal).backward(do)
        grads.append((qq.grad, kk.grad, vv.grad))
    _check(grads[0], refs, q.dtype)
    assert all(torch.equal(a, b) for a, b in zip(*grads))
