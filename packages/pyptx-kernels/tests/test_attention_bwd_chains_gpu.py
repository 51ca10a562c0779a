"""GPU tests of several ordered-dQ chains per q block (``BackwardPlan(dq_chains=)``): float64
autograd on fresh random inputs (outputs NaN-poisoned) and bit-for-bit repeat runs
(deterministic), over the orders (causal, rotated, ascending), windows, 128-row q blocks and
the in-grid converters.

    pytest -m gpu packages/pyptx-kernels/tests/test_attention_bwd_chains_gpu.py
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
ref_mod = importlib.import_module("pyptx_kernels.flash_attention.bwd_reference")
P = fab.BackwardPlan
TOL = 1e-2


@pytest.mark.parametrize("B,S,Sk,Hq,Hkv,D,causal,window,plan", [
    (1, 4096, 4096, 16, 4, 128, True, (-1, -1), P.lagged(dq_chains=2)),     # causal, split 2
    (1, 4096, 4096, 16, 4, 128, True, (-1, -1), P.lagged(dq_chains=4)),
    (2, 2048, 2048, 8, 8, 128, False, (-1, -1), P.lagged(dq_chains=2)),     # rotated, lag, lead
    (2, 1000, 3000, 8, 2, 128, False, (-1, -1), P.converted(dq_chains=4)),  # ascending
    (2, 1000, 1000, 8, 2, 64, True, (-1, -1), P.ordered(dq_chains=2)),      # D=64, convert kernel
    (2, 2048, 2048, 8, 2, 128, True, (300, -1), P.converted(dq_chains=2)),  # a window
    (2, 2048, 2048, 8, 2, 128, True, (-1, -1), P.ordered(dkdv_bq=128, dq_chains=2)),
])
def test_chains_match_float64_and_repeat_bit_for_bit(B, S, Sk, Hq, Hkv, D, causal, window,
                                                      plan):
    g = torch.Generator(device="cuda").manual_seed(S + Sk + plan.dq_chains)
    q, do = (torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
             for _ in range(2))
    k, v = (torch.randn(B, Sk, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    o, lse, *refs = ref_mod.reference(q, k, v, do, causal=causal, window=window)
    o, lse = o.to(q.dtype), lse.float()
    kw = dict(causal=causal, plan=plan, window=window)
    first = fab.attention_backward(q, k, v, o, lse, do, **kw)
    for name, got, ref in zip(("dq", "dk", "dv"), first, refs):
        assert not torch.isnan(got).any(), f"{name}: unwritten (NaN-poisoned) or NaN elements"
        err = ((got.double() - ref).norm() / ref.norm()).item()
        assert err < TOL, (name, err)
    for _ in range(3):
        again = fab.attention_backward(q, k, v, o, lse, do, **kw)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
