"""GPU tests of the causal dK/dV grid run longest CTAs first (``BackwardPlan(heavy_first=)``):
float64 autograd on fresh random inputs (outputs NaN-poisoned) and, ordered, bit-for-bit
repeat runs (deterministic), over the eager plans (in-grid converters, ``kv_split``), chains,
128-row q blocks, the fused D=64 kernel, several batches and kv heads, ragged lengths and dQ
in any order.

    pytest -m gpu packages/pyptx-kernels/tests/test_attention_bwd_heavy_gpu.py
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


def _heavy(plan, **changes):
    return P(**{**plan.options(), "heavy_first": True, **changes})


@pytest.mark.parametrize("B,S,Hq,Hkv,D,plan,deterministic", [
    (1, 4096, 16, 4, 128, _heavy(P.lagged()), True),               # split 2, converters
    (3, 1000, 32, 4, 128, _heavy(P.lagged()), True),               # G 8, ragged, 3 batches
    (1, 4096, 16, 4, 128, _heavy(P.lagged(dq_chains=2)), True),
    (2, 2048, 8, 2, 128, _heavy(P.ordered(dkdv_bq=128)), True),
    (2, 1500, 8, 2, 64, _heavy(P.ordered()), True),                # D=64, convert kernel
    (2, 2048, 32, 4, 128, _heavy(P.bulk()), False),                # any order
    (2, 1000, 8, 8, 128, _heavy(P()), True),                       # the pair's dK/dV kernel
    # the fused D=64 kernel (attention()'s eager plan): split 2, 3 batches, ragged
    (3, 3000, 12, 4, 64, _heavy(P.fused(pingpong=1, kv_split="auto")), True),
    (2, 2048, 32, 8, 64, _heavy(P.fused(pingpong=1, kv_split="auto")), True),
    (2, 2048, 32, 8, 64, _heavy(P.fused(ordered=False, pingpong=1, kv_split="auto")), False),
    (1, 1000, 4, 4, 64, _heavy(P.fused()), True),                  # lockstep, MHA
])
def test_heavy_first_matches_float64(B, S, Hq, Hkv, D, plan, deterministic):
    g = torch.Generator(device="cuda").manual_seed(S + Hq + D)
    q, do = (torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
             for _ in range(2))
    k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    o, lse, *refs = ref_mod.reference(q, k, v, do, causal=True)
    o, lse = o.to(q.dtype), lse.float()
    first = fab.attention_backward(q, k, v, o, lse, do, causal=True, plan=plan)
    for name, got, ref in zip(("dq", "dk", "dv"), first, refs):
        assert not torch.isnan(got).any(), f"{name}: unwritten (NaN-poisoned) or NaN elements"
        err = ((got.double() - ref).norm() / ref.norm()).item()
        assert err < TOL, (name, err)
    for _ in range(3 if deterministic else 0):
        again = fab.attention_backward(q, k, v, o, lse, do, causal=True, plan=plan)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
