"""CPU checks of the attention backward's sliding window and soft cap (``window=``,
``softcap=`` of ``build_attention_backward``: the forward's conventions).

* The transposed block plan (``masks.query_blocks``: the q blocks a kv block's window
  reaches) is checked exhaustively on small sizes: every query that sees a key of the block
  lies in a visited q block, and the unmasked q blocks hold only allowed pairs.
* The simulator (``ptxsim``) runs the pair's dQ and dK/dV kernels (and the unordered
  ``bulk()`` plan) on ragged sizes against float64 autograd (``bwd_reference.reference``)
  with every output poisoned: causal and full, windows left-only / both sides / with causal,
  soft caps with and without a window, GQA group 2, D 64 and 128.
* ptxas: no spills; plain attention's kernels keep their names (their PTX is unchanged:
  ``tools/ptx_snapshot.py --only attn_bwd``); the plans that do not take a window refuse
  it at the caller's line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from pyptx_kernels.flash_attention import backward as fab
from pyptx_kernels.flash_attention import bwd_reference, fwd_reference, masks

from pyptx.errors import ConfigError

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptxsim  # noqa: E402

_dev, _f64 = ptxsim.device_bits, ptxsim.host_f64
P = fab.BackwardPlan
TOL = {"bf16": 8e-3}    # rel. Frobenius error, as the other backward simulations


# ------------------------------------------------------------------ block plan
WINDOWS = [(-1, -1), (0, -1), (5, -1), (64, -1), (100, 30), (200, 0), (-1, 7), (130, 130)]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("BQ", [32, 64, 128])
def test_query_blocks_visit_exactly_the_queries_the_window_reaches(window, causal, BQ):
    for S, Sk in ((1, 1), (77, 77), (200, 333), (333, 200), (512, 512)):
        allowed = fwd_reference.allowed_keys(S, Sk, causal, window).numpy()
        for k0 in range(0, Sk, fab.BM):
            first, lo, hi, end = masks.query_blocks(k0, Sk, S, BQ, causal, fab.BM, window)
            cols = allowed[:, k0:k0 + fab.BM]
            queries = np.nonzero(cols.any(1))[0]
            if queries.size:
                assert first * BQ <= queries.min() and queries.max() < end * BQ
            for j in range(lo, hi):     # unmasked: every pair allowed, no query past S
                assert (j + 1) * BQ <= S and cols[j * BQ:(j + 1) * BQ].all(), (k0, j)


def test_window_skips_query_blocks():
    """A causal 512-key window over 4096 keys: each kv block visits at most 10 of 64 q
    blocks (64 rows), under a third of the causal plan's."""
    S = 4096
    win = [masks.query_blocks(k0, S, S, 64, True, 128, (512, -1)) for k0 in range(0, S, 128)]
    full = [masks.query_blocks(k0, S, S, 64, True, 128) for k0 in range(0, S, 128)]
    assert max(e - f for f, _, _, e in win) == 10
    assert sum(e - f for f, _, _, e in win) * 3 < sum(e - f for f, _, _, e in full)


# ------------------------------------------------------------------ simulation
def _inputs(B, S, Sk, Hq, Hkv, D, causal, window, softcap, seed, dt="bf16"):
    """Random ``dt`` inputs with the forward's ``o`` (``dt``) and ``lse`` (f32) from float64,
    and float64 ``(dq, dk, dv)`` of the rounded inputs."""
    rng = np.random.default_rng(seed)
    q, do = (_dev(rng.standard_normal((B, S, Hq, D)), dt) for _ in range(2))
    k, v = (_dev(rng.standard_normal((B, Sk, Hkv, D)), dt) for _ in range(2))
    t = [torch.from_numpy(_f64(x, dt)) for x in (q, k, v, do)]
    o, lse, dq, dk, dv = bwd_reference.reference(*t, causal=causal, window=window,
                                                 softcap=softcap)
    o_dev = _dev(o.numpy(), dt)
    return ((q, k, v, o_dev, lse.numpy().astype(np.float32), do),
            tuple(g.numpy() for g in (dq, dk, dv)))


def _simulate(bwd, inputs):
    """The backward's kernels in the simulator (outputs poisoned): ``(dq, dk, dv)`` bits."""
    q, k, v, o, lse, do = (np.ascontiguousarray(x) for x in inputs)
    if not bwd.atomic_dq:
        dq_k, dkdv = bwd.kernels
        dq, stats = ptxsim.run(dq_k.specialize(), [q, k, v, o, lse, do])
        dk, dv = ptxsim.run(dkdv.specialize(), [q, k, v, do, stats])
        return dq, dk, dv
    prep, dkdv, *convert = bwd.kernels
    ordered, lead = "SEM" in dkdv.arg_names, "OUT" in dkdv.arg_names
    # stats_lead: the dK/dV grid writes most STATS; ordered: DQACC's first add stores it
    stats, acc, *sem = ptxsim.run(prep.specialize(), [o, lse, do],
                                  scratch=(0, 1) if lead else (1,) if ordered else ())
    extra = [o, lse] if lead else []
    got = ptxsim.run(dkdv.specialize(), [q, k, v, do, stats, acc, *sem, *extra], inplace=True)
    if not convert:         # dq_convert: the dK/dV grid converts dQ
        dk, dv, dq = got
        return dq, dk, dv
    (dq,) = ptxsim.run(convert[0].specialize(), [acc])
    return dq, *got


def _check(got, grads, dt="bf16"):
    for name, g, ref in zip(("dq", "dk", "dv"), got, grads):
        g64 = _f64(g, dt)
        assert np.isfinite(g64).all(), name
        err = np.linalg.norm(g64 - ref) / max(np.linalg.norm(ref), 1e-30)
        assert err < TOL[dt], (name, err)


CASES = [   # S, Sk, Hq, Hkv, D, causal, window, softcap
    (200, 200, 2, 1, 64, False, (64, -1), 0.0),      # left only, ragged, GQA 2
    (200, 200, 2, 1, 64, True, (70, -1), 0.0),       # causal window (right = 0)
    (300, 260, 2, 2, 64, False, (100, 30), 0.0),     # both sides, Sk < S
    (130, 330, 2, 1, 128, False, (-1, 40), 0.0),     # right only, Sk > S
    (200, 200, 2, 1, 128, True, (-1, -1), 5.0),      # soft cap, causal
    (260, 200, 2, 1, 64, False, (-1, -1), 3.0),      # soft cap, full
    (200, 200, 2, 2, 128, False, (50, 50), 4.0),     # soft cap with a window
]


@pytest.mark.parametrize("S,Sk,Hq,Hkv,D,causal,window,softcap", CASES)
def test_pair_with_window_and_softcap_matches_float64(S, Sk, Hq, Hkv, D, causal, window,
                                                      softcap):
    inputs, grads = _inputs(1, S, Sk, Hq, Hkv, D, causal, window, softcap, S + D + Sk)
    bwd = fab.build_attention_backward(1, S, Hq, Hkv, D, Sk=Sk, causal=causal,
                                       window=window, softcap=softcap)
    _check(_simulate(bwd, inputs), grads)


@pytest.mark.parametrize("plan", ["bulk", "atomic"])
def test_unordered_atomic_plans_take_a_window_and_softcap(plan):
    """``bulk()`` (attention()'s ``deterministic=False`` plan at D=128) and ``atomic()``:
    dQ added by the dK/dV kernel over the window's q blocks only."""
    S, causal, window, softcap = 200, True, (60, -1), 4.0
    inputs, grads = _inputs(1, S, S, 2, 1, 128, causal, window, softcap, 5)
    bwd = fab.build_attention_backward(1, S, 2, 1, 128, causal=causal, window=window,
                                       softcap=softcap, plan=getattr(P, plan)())
    _check(_simulate(bwd, inputs), grads)


@pytest.mark.parametrize("S,Sk,Hq,Hkv,D,causal,window,softcap,plan", [
    (300, 300, 2, 1, 128, True, (100, -1), 4.0, "lagged"),     # attention()'s D=128 plan
    (300, 260, 2, 2, 128, False, (100, 30), 0.0, "converted"),  # both sides, Sk < S
    (300, 260, 2, 1, 128, False, (100, 30), 2.0, "lagged"),    # full: stats_lead too
    (260, 70, 2, 2, 128, False, (0, -1), 0.0, "converted"),    # q blocks no kv block reaches
    (260, 70, 2, 2, 64, False, (0, -1), 0.0, "ordered"),       # ... zeroed by the prep
    (200, 330, 4, 2, 64, False, (-1, 40), 3.0, "ordered"),     # right only, GQA 2
])
def test_ordered_plans_with_window_match_float64(S, Sk, Hq, Hkv, D, causal, window, softcap,
                                                 plan):
    """Ordered dQ with a window: descending kv blocks, each q block counting the kv blocks
    that reach it (the converters wait for that count; none: zeros)."""
    inputs, grads = _inputs(1, S, Sk, Hq, Hkv, D, causal, window, softcap, 3 * S + Sk)
    make = {"lagged": lambda: P.lagged(num_sms=3), "converted": lambda: P.converted(num_sms=3),
            "ordered": P.ordered}[plan]
    bwd = fab.build_attention_backward(1, S, Hq, Hkv, D, Sk=Sk, causal=causal, window=window,
                                       softcap=softcap, plan=make())
    assert "_ordered" in bwd.dkdv_kernel.name
    _check(_simulate(bwd, inputs), grads)


@pytest.mark.parametrize("S,Sk,Hq,Hkv,causal,window,softcap,ordered,pingpong", [
    (300, 300, 2, 1, True, (100, -1), 4.0, True, 1),    # attention()'s D=64 plan
    (300, 260, 2, 2, False, (100, 30), 0.0, True, 0),   # both sides: descending kv blocks
    (260, 130, 2, 2, False, (0, -1), 2.0, True, 1),     # q blocks no kv block reaches
    (200, 330, 4, 2, False, (-1, 40), 0.0, False, 1),   # any order, right only, GQA 2
])
def test_fused_with_window_matches_float64(S, Sk, Hq, Hkv, causal, window, softcap, ordered,
                                           pingpong):
    inputs, grads = _inputs(1, S, Sk, Hq, Hkv, 64, causal, window, softcap, 5 * S + Sk)
    bwd = fab.build_attention_backward(1, S, Hq, Hkv, 64, Sk=Sk, causal=causal, window=window,
                                       softcap=softcap,
                                       plan=P.fused(ordered=ordered, pingpong=pingpong))
    assert "attn_bwd_fused" in bwd.dkdv_kernel.name
    _check(_simulate(bwd, inputs), grads)


def test_rows_without_keys_get_zero_gradients():
    """A right-only window past the keys' end leaves the last queries without keys
    (``lse = -inf``): their dQ is 0, nothing NaN."""
    S, Sk, window = 260, 70, (0, -1)    # query i sees key i only: rows >= 70 none
    inputs, grads = _inputs(1, S, Sk, 2, 2, 64, False, window, 0.0, 11)
    bwd = fab.build_attention_backward(1, S, 2, 2, 64, Sk=Sk, window=window)
    got = _simulate(bwd, inputs)
    _check(got, grads)
    assert not _f64(got[0], "bf16")[0, Sk:].any()


# ------------------------------------------------------------------ ptxas, plans
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal,window,softcap", [(True, (4096, -1), 0.0),
                                                   (False, (1024, 1024), 30.0),
                                                   (False, (-1, -1), 30.0)])
@pytest.mark.parametrize("plan", ["pair", "eager"])
def test_window_and_softcap_kernels_assemble_without_spills(D, causal, window, softcap, plan,
                                                            assemble):
    """The pair and attention()'s eager plan (``for_eager``: the fused kernel at D=64,
    ``lagged()`` at D=128)."""
    p = P() if plan == "pair" else P.for_eager(D)
    bwd = fab.build_attention_backward(2, 8192, 8, 2, D, causal=causal, window=window,
                                       softcap=softcap, plan=p)
    for k in bwd.kernels:
        log = assemble(k.ptx())
        assert "0 bytes spill stores" in log and "C751" not in log, (k.name, log)


def test_plain_attention_keeps_its_kernels():
    """Without a window or cap the kernels are the ones of before (same names; the PTX is
    checked by ``tools/ptx_snapshot.py --only attn_bwd``); a window renames them."""
    plain = fab.build_attention_backward(1, 300, 4, 2, 64, causal=True)
    same = fab.build_attention_backward(1, 300, 4, 2, 64, causal=True, window=(-1, -1),
                                        softcap=0.0)
    assert [k.ptx() for k in plain.kernels] == [k.ptx() for k in same.kernels]
    win = fab.build_attention_backward(1, 300, 4, 2, 64, causal=True, window=(128, -1))
    assert all("_causal_w128_n" in k.name for k in win.kernels), win


@pytest.mark.parametrize("plan", [P.ordered(dkdv_bq=128)])
def test_plans_without_window_support_refuse_at_the_callers_line(plan):
    with pytest.raises(ConfigError, match=r"test_attention_bwd_features_cpu\.py:\d+: .*"
                                          r"not taken yet by the ordered plan"):
        fab.build_attention_backward(1, 256, 2, 2, 128, causal=True, window=(64, -1),
                                     plan=plan)


def test_bad_window_and_softcap_are_config_errors():
    with pytest.raises(ConfigError, match=r"test_attention_bwd_features_cpu\.py:\d+: .*window"):
        fab.build_attention_backward(1, 256, 2, 2, 64, window=(-2, 3))
    with pytest.raises(ConfigError, match=r"test_attention_bwd_features_cpu\.py:\d+: .*softcap"):
        fab.build_attention_backward(1, 256, 2, 2, 64, softcap=-1.0)


@pytest.mark.parametrize("D,deterministic,plan", [(64, True, "fused"), (128, True, "lagged"),
                                                  (128, False, "bulk")])
def test_attention_runs_the_windowed_backward(D, deterministic, plan):
    """attention()'s autograd op with a window and a soft cap has a backward (no longer
    ``NoBackward``): its eager plan (``fused`` at D=64, ``lagged()`` at D=128, ``bulk()``
    when not deterministic) with the pair as the fallback."""
    from pyptx_kernels.flash_attention import fwd_host

    op = fwd_host._differentiable(1, 256, 2, 2, D, 256, "bf16", True, 0.125, None,
                                  deterministic, ((64, -1), 2.0))
    bwd = op.backward_kernel
    assert isinstance(bwd, fab.AttentionBackward), bwd
    assert "_causal_w64_n_cap2" in bwd.dkdv_kernel.name, bwd
    assert ("_bulk" in bwd.dkdv_kernel.name) == (plan != "fused")
    assert ("_ordered" in bwd.dkdv_kernel.name) == (plan != "bulk")
    assert ("attn_bwd_fused" in bwd.dkdv_kernel.name) == (plan == "fused")


@pytest.mark.parametrize("lens_q,lens_k,D,causal,window,softcap", [
    ([130, 77, 200], [90, 200, 150], 64, True, (60, -1), 3.0),
    ([200, 0, 100], [130, 40, 60], 128, False, (40, 20), 0.0),   # empty, keyless rows
])
def test_varlen_pair_with_window_and_softcap_matches_float64(lens_q, lens_k, D, causal,
                                                             window, softcap):
    """The packed pair with a window per sequence (runtime lengths in the loop bounds and
    masks) against float64, sequence by sequence."""
    rng = np.random.default_rng(sum(lens_q) + D)
    Tq, Tk, Hq, Hkv = sum(lens_q), sum(lens_k), 2, 1
    q, do = (_dev(rng.standard_normal((Tq, Hq, D)), "bf16") for _ in range(2))
    k, v = (_dev(rng.standard_normal((Tk, Hkv, D)), "bf16") for _ in range(2))
    cu_q = np.array([0, *np.cumsum(lens_q)], np.int32)
    cu_k = np.array([0, *np.cumsum(lens_k)], np.int32)
    o = np.zeros((Tq, Hq, D))
    lse = np.full((Hq, Tq), -np.inf)
    grads = [np.zeros((Tq, Hq, D)), np.zeros((Tk, Hkv, D)), np.zeros((Tk, Hkv, D))]
    for b in range(len(lens_q)):
        a, e, ka, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if e == a or ke == ka:
            continue
        t = [torch.from_numpy(_f64(x, "bf16"))[None] for x in (q[a:e], k[ka:ke], v[ka:ke],
                                                              do[a:e])]
        ob, lb, *g = bwd_reference.reference(*t, causal=causal, window=window,
                                             softcap=softcap)
        o[a:e], lse[:, a:e] = ob[0].numpy(), lb[0].numpy()
        for dst, x, (lo, hi) in zip(grads, g, ((a, e), (ka, ke), (ka, ke))):
            dst[lo:hi] = x[0].numpy()
    bwd = fab.build_attention_backward_varlen(Tq, Tk, len(lens_q), Hq, Hkv, D, max(lens_q),
                                              max(lens_k), causal=causal, window=window,
                                              softcap=softcap)
    assert "_w" in bwd.dkdv_kernel.name
    o_dev = _dev(o, "bf16")
    dq, stats = ptxsim.run(bwd.dq_kernel.specialize(),
                           [q, k, v, cu_q, cu_k, o_dev, lse.astype(np.float32), do],
                           scratch=(1,))
    dk, dv = ptxsim.run(bwd.dkdv_kernel.specialize(), [q, k, v, cu_q, cu_k, do, stats])
    _check((dq, dk, dv), grads)
