"""GPU tests of the attention backward with a sliding window and a soft cap: float64 autograd
(``bwd_reference.reference``) on fresh random inputs with every output NaN-poisoned, through
``attention_backward`` (the pair and ``bulk()``) and through ``attention()``'s autograd; and a
4k window over 32k keys whose backward costs at most 0.2x full attention's.

    pytest -m gpu packages/pyptx-kernels/tests/test_attention_bwd_features_gpu.py
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


def _inputs(B, S, Sk, Hq, Hkv, D, dt=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(B, S, Hq, D, device="cuda", dtype=dt, generator=g) for _ in range(2))
    k, v = (torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt, generator=g) for _ in range(2))
    return q, k, v, do


def _check(got, refs, dt):
    for name, g, r in zip(("dq", "dk", "dv"), got, refs):
        assert not torch.isnan(g).any(), f"{name}: unwritten (NaN-poisoned) or NaN elements"
        err = ((g.double() - r).norm() / r.norm()).item()
        worst = ((g.double() - r).abs().max() / r.abs().max()).item()
        assert err < TOL[dt] and worst < 0.1, (name, err, worst)


@pytest.mark.parametrize("B,S,Sk,Hq,Hkv,D,causal,window,softcap,plan,dt", [
    (2, 1000, 1000, 4, 2, 64, True, (256, -1), 0.0, "pair", torch.bfloat16),
    (1, 2048, 2048, 4, 4, 128, False, (300, 200), 0.0, "pair", torch.bfloat16),
    (2, 777, 1500, 4, 2, 128, False, (-1, 100), 0.0, "pair", torch.float16),   # Sk > S
    (1, 1500, 1500, 8, 2, 128, True, (-1, -1), 30.0, "pair", torch.bfloat16),
    (2, 1000, 900, 4, 4, 64, False, (-1, -1), 10.0, "pair", torch.bfloat16),
    (1, 2048, 2048, 4, 2, 128, True, (512, -1), 30.0, "bulk", torch.bfloat16),
    (1, 1024, 1024, 4, 4, 64, False, (128, 128), 5.0, "atomic", torch.bfloat16),
    (2, 2048, 2048, 8, 2, 128, True, (512, -1), 30.0, "lagged", torch.bfloat16),  # eager
    (1, 3000, 2000, 4, 2, 128, False, (700, 300), 0.0, "lagged", torch.bfloat16),
    (1, 1500, 400, 4, 4, 128, False, (0, -1), 0.0, "converted", torch.bfloat16),  # keyless
    (2, 1000, 1000, 4, 2, 64, True, (300, -1), 5.0, "ordered", torch.bfloat16),
    (2, 2048, 2048, 8, 2, 64, True, (512, -1), 30.0, "fused", torch.bfloat16),   # eager
    (1, 3000, 2000, 4, 4, 64, False, (700, 300), 0.0, "fused", torch.bfloat16),
    (1, 1500, 400, 4, 4, 64, False, (0, -1), 10.0, "fused", torch.float16),     # keyless
])
def test_backward_with_window_and_softcap_matches_float64(B, S, Sk, Hq, Hkv, D, causal,
                                                         window, softcap, plan, dt):
    q, k, v, do = _inputs(B, S, Sk, Hq, Hkv, D, dt, seed=S + D)
    o, lse, *refs = fab.reference(q, k, v, do, causal, window=window, softcap=softcap)
    o, lse = o.to(dt), lse.float()
    p = {"pair": P(), "bulk": P.bulk(), "atomic": P.atomic(), "lagged": P.lagged(),
         "converted": P.converted(), "ordered": P.ordered(), "fused": P.for_eager(64)}[plan]
    got = fab.attention_backward(q, k, v, o, lse, do, causal=causal, plan=p, window=window,
                                 softcap=softcap)
    _check(got, refs, dt)
    if plan in ("lagged", "converted", "ordered", "fused"):  # deterministic: same bits
        again = fab.attention_backward(q, k, v, o, lse, do, causal=causal, plan=p,
                                       window=window, softcap=softcap)
        assert all(torch.equal(a, b) for a, b in zip(got, again))


@pytest.mark.parametrize("D,causal,window,softcap,deterministic", [
    (64, True, (512, -1), 0.0, True), (128, True, (512, -1), 30.0, True),
    (128, False, (256, 256), 30.0, False), (64, False, (-1, -1), 20.0, True),
])
def test_attention_autograd_with_window_and_softcap(D, causal, window, softcap, deterministic):
    """attention()'s gradients (its forward's o and lse, the backward it picks) against
    float64 autograd (``fwd_host.attention``: the call that takes ``deterministic=``)."""
    from pyptx_kernels.flash_attention.fwd_host import attention

    q, k, v, do = _inputs(2, 1500, 1500, 8, 2, D, seed=D + causal)
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    o = attention(qs, ks, vs, causal=causal, window=window, softcap=softcap,
                  deterministic=deterministic)
    got = torch.autograd.grad(o, (qs, ks, vs), do)
    _o, _lse, *refs = fab.reference(q, k, v, do, causal, window=window, softcap=softcap)
    _check(got, refs, q.dtype)


@pytest.mark.parametrize("D", [64, 128])
def test_a_4k_window_over_32k_keys_costs_a_fifth_of_full_attention(D):
    """Causal ``window=(4096, 0)`` over 32768 keys visits ~1/8 of full attention's pairs:
    its backward must take at most 0.2x full attention's (both attention()'s plan,
    ``BackwardPlan.for_eager(D)``)."""
    from triton.testing import do_bench

    S, H = 32768, 2048 // D
    q, k, v, do = _inputs(1, S, S, H, H, D, seed=1)
    fa = importlib.import_module("pyptx_kernels.flash_attention.fwd_host")

    def bwd_time(**kw):
        o, lse = fa.attention_forward(q, k, v, **kw)
        plan = P.for_eager(D)
        run = lambda: fab.attention_backward(q, k, v, o, lse, do, plan=plan, **kw)  # noqa: E731
        run()
        return do_bench(run, rep=200, return_mode="median")

    window = bwd_time(causal=True, window=(4096, 0))
    full = bwd_time(causal=False)
    assert window <= 0.2 * full, (window, full)


def test_varlen_backward_with_window_and_softcap_matches_float64():
    """The packed pair with a window and a cap, sequence by sequence against float64."""
    lens_q, lens_k, Hq, Hkv, D = [700, 0, 1300], [900, 300, 1100], 4, 2, 128
    window, softcap = (256, 64), 20.0
    q, _, _, do = _inputs(1, sum(lens_q), 1, Hq, Hkv, D, seed=3)
    _, k, v, _ = _inputs(1, 1, sum(lens_k), Hq, Hkv, D, seed=4)
    q, do, k, v = q[0], do[0], k[0], v[0]
    cq = [0, *torch.tensor(lens_q).cumsum(0).tolist()]
    ck = [0, *torch.tensor(lens_k).cumsum(0).tolist()]
    o = torch.zeros_like(q)
    lse = torch.full((Hq, q.shape[0]), float("-inf"), device="cuda")
    refs = [torch.zeros_like(x, dtype=torch.float64) for x in (q, k, v)]
    for b in range(len(lens_q)):
        a, e, ka, ke = cq[b], cq[b + 1], ck[b], ck[b + 1]
        if e == a or ke == ka:
            continue
        ob, lb, *g = fab.reference(q[None, a:e], k[None, ka:ke], v[None, ka:ke], do[None, a:e],
                                   False, window=window, softcap=softcap)
        o[a:e], lse[:, a:e] = ob[0].to(q.dtype), lb[0].float()
        for dst, x, (lo, hi) in zip(refs, g, ((a, e), (ka, ke), (ka, ke))):
            dst[lo:hi] = x[0]
    cu_q, cu_k = (torch.tensor(c, dtype=torch.int32, device="cuda") for c in (cq, ck))
    bwd = fab.build_attention_backward_varlen(q.shape[0], k.shape[0], len(lens_q), Hq, Hkv, D,
                                              max(lens_q), max(lens_k), window=window,
                                              softcap=softcap)
    _check(bwd(q, k, v, cu_q, cu_k, o, lse, do), refs, q.dtype)
