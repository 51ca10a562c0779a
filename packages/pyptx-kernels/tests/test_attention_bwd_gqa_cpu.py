"""The grouped-query dK/dV kernel split over a cluster (``BackwardPlan(kv_split=...)``,
``build_dkdv(kv_split=...)``) on the CPU: ``ptxsim`` runs the prep, dK/dV (and conversion)
kernels' PTX, the cluster's CTAs together, against float64 with every output poisoned; dQ is
bit for bit the unsplit kernel's (the same adds in the same order). Plus what costs no
simulation: ptxas keeps the kernel spill-free and its wgmma asynchronous, the plan resolves
``"auto"`` by the group size, bad splits fail at the caller's line.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from pyptx.errors import ConfigError

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import ptxsim  # noqa: E402
from test_sim_attention_fused import _reference  # noqa: E402
from test_tensorcore_sim import TOL, _f64  # noqa: E402

fab = importlib.import_module("pyptx_kernels.flash_attention.backward")
P = fab.BackwardPlan


def _simulate(bwd, inputs):
    """The backward's kernels in the simulator (the atomic-dQ plans): ``(dq, dk, dv)`` bits."""
    q, k, v, o, lse, do = inputs
    prep, dkdv, *convert = bwd.kernels
    ordered, lead = "SEM" in dkdv.arg_names, "OUT" in dkdv.arg_names
    # DQACC: each tile's first add stores it; stats_lead: the dK/dV grid writes most STATS
    stats, acc, *sem = ptxsim.run(prep.specialize(), [o, lse, do],
                                  scratch=(0, 1) if lead else (1,) if ordered else ())
    extra = [np.ascontiguousarray(o), np.ascontiguousarray(lse)] if lead else []
    got = ptxsim.run(dkdv.specialize(), [q, k, v, do, stats, acc, *sem, *extra], inplace=True)
    if convert:
        (dq,) = ptxsim.run(convert[0].specialize(), [acc])
        return (dq,) + tuple(got)
    dk, dv, dq = got
    return dq, dk, dv


def _check(got, grads, dt="bf16"):
    for name, g, ref in zip(("dq", "dk", "dv"), got, grads):
        err = np.linalg.norm(_f64(g, dt) - ref) / np.linalg.norm(ref)
        assert err < TOL[dt], (name, err)


@pytest.mark.parametrize("D,S,Sk,Hq,Hkv,causal,split,plan", [
    (128, 200, 200, 2, 1, True, 2, "converted"),    # causal chain, 2 kv blocks x 2 ranks
    (64, 130, 130, 4, 1, False, 4, "ordered"),      # a chunk = half of dK or of dV; ragged S
    (128, 130, 130, 8, 1, False, 8, "ordered"),     # a chunk = a quarter of dK or of dV
    (128, 100, 300, 4, 2, True, 2, "ordered"),      # Sk > S: kv blocks with no q block
])
def test_split_backward_matches_float64_and_the_unsplit_dq(D, S, Sk, Hq, Hkv, causal, split,
                                                           plan):
    """The split kernel's dK and dV against float64 (each CTA sums its chunk of the
    cluster's partials in rank order); dQ bit for bit the unsplit kernel's."""
    inputs, grads = _reference(1, S, Sk, Hq, Hkv, D, causal, 7 * D + split)
    make = {"converted": lambda s: P.converted(num_sms=3, kv_split=s),
            "ordered": lambda s: P.ordered(kv_split=s)}[plan]
    bwd = fab.build_attention_backward(1, S, Hq, Hkv, D, Sk=Sk, causal=causal,
                                       plan=make(split))
    assert bwd.dkdv_kernel.name.endswith(f"_split{split}")
    spec = bwd.dkdv_kernel.specialize()
    assert spec.cluster == (split, 1, 1) and spec.grid[0] % split == 0
    got = _simulate(bwd, inputs)
    _check(got, grads)
    base = fab.build_attention_backward(1, S, Hq, Hkv, D, Sk=Sk, causal=causal, plan=make(1))
    assert np.array_equal(got[0], _simulate(base, inputs)[0])


@pytest.mark.parametrize("S,Sk,Hq,Hkv,causal,ordered,pingpong,split", [
    (200, 200, 2, 1, True, True, 1, 2),     # attention()'s D=64 plan, split over 2
    (130, 260, 4, 1, False, True, 0, 4),    # ascending order, lockstep, a half per CTA
    (200, 200, 4, 2, True, False, 1, 2),    # any order, two kv heads
])
def test_split_fused_matches_float64_and_the_unsplit_dq(S, Sk, Hq, Hkv, causal, ordered,
                                                         pingpong, split):
    """The fused D=64 kernel split over a cluster: dK, dV against float64; ordered, dQ bit
    for bit the unsplit kernel's. (Full attention with S == Sk takes the rotated order,
    which the simulator's one-cluster-at-a-time run cannot finish.)"""
    inputs, grads = _reference(1, S, Sk, Hq, Hkv, 64, causal, 53 + S + split)
    make = lambda s: P.fused(ordered=ordered, pingpong=pingpong, kv_split=s)  # noqa: E731
    bwd = fab.build_attention_backward(1, S, Hq, Hkv, 64, Sk=Sk, causal=causal,
                                       plan=make(split))
    assert bwd.dkdv_kernel.name.endswith(f"_split{split}")
    assert bwd.dkdv_kernel.specialize().cluster == (split, 1, 1)
    got = _simulate(bwd, inputs)
    _check(got, grads)
    if ordered:
        base = fab.build_attention_backward(1, S, Hq, Hkv, 64, Sk=Sk, causal=causal,
                                            plan=make(1))
        assert np.array_equal(got[0], _simulate(base, inputs)[0])


@pytest.mark.parametrize("causal", [False, True])
def test_split_pair_matches_float64(causal):
    """The pair's dK/dV kernel (JAX and ``torch.compile``'s backward; D=64: the overlapped
    schedule) split over 2: its dK and dV against float64."""
    q, k, v, o, lse, do = (np.ascontiguousarray(x) for x in
                           _reference(1, 200, 200, 4, 2, 64, causal, 41 + causal)[0])
    grads = _reference(1, 200, 200, 4, 2, 64, causal, 41 + causal)[1]
    dq_k, dkdv = fab.build_attention_backward(1, 200, 4, 2, 64, causal=causal,
                                              plan=P(kv_split=2)).kernels
    assert dkdv.name.endswith("_split2")
    dq, stats = ptxsim.run(dq_k.specialize(), [q, k, v, o, lse, do])
    dk, dv = ptxsim.run(dkdv.specialize(), [q, k, v, do, stats])
    _check((dq, dk, dv), grads)


def test_split_with_stats_lead_and_convert_lag():
    """The full-attention D=128 plan's helpers count CTAs per kv head as ``kv_split`` times
    the kv blocks: ``stats_lead`` rows shared by the four CTAs of a head, ``convert_lag``'s
    share halved. Four kv heads (B=2), G=2 split over 2."""
    B, S, Hq, Hkv, D = 2, 130, 4, 2, 128
    inputs, grads = _reference(B, S, S, Hq, Hkv, D, False, 31)
    plan = P.converted(num_sms=3, convert_lag=1, stats_lead=1, kv_split=2)
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, D, plan=plan)
    assert bwd.dkdv_kernel.name.endswith("_lag1_lead1_split2")
    _check(_simulate(bwd, inputs), grads)


@pytest.mark.parametrize("G,want", [(1, 1), (2, 2), (3, 1), (4, 2), (8, 2)])
def test_auto_split_follows_the_group_size(G, want):
    """``lagged()`` and ``fused()`` in attention()'s plans take ``kv_split="auto"``: 2 for
    even groups when causal, 1 otherwise (MHA's kernels and full attention's unchanged)."""
    bwd = fab.build_attention_backward(1, 4096, 4 * G, 4, 128, causal=True, plan=P.lagged())
    assert bwd.dkdv_kernel.name.endswith("_split2") == (want == 2)
    assert P.for_eager(128).kv_split == P.for_eager(64).kv_split == "auto"
    full = fab.build_attention_backward(1, 4096, 4 * G, 4, 128, plan=P.lagged())
    assert "_split" not in full.dkdv_kernel.name        # full attention: equal CTAs, no split
    fused = fab.build_attention_backward(1, 1024, 4 * G, 4, 64, causal=True, plan=P.for_eager(64))
    assert fused.dkdv_kernel.name.endswith("_split2") == (want == 2)


@pytest.mark.parametrize("S,Hq,Hkv,D,causal,split", [
    (4096, 32, 8, 128, True, 2), (4096, 32, 8, 128, False, 4), (16384, 16, 4, 128, True, 4),
    (2048, 32, 4, 64, False, 8), (2048, 32, 8, 64, True, 2),
    (2048, 32, 8, 64, True, -2), (2048, 32, 4, 64, False, -8), (3000, 12, 4, 64, True, -1),
])
def test_split_kernels_assemble_without_spills(S, Hq, Hkv, D, causal, split, assemble):
    """The benchmark's grouped shapes: no spills, no wgmma serialisation (C751x); a negative
    split: the fused D=64 kernel (attention()'s plan) split over ``-split``."""
    plan = P.lagged(kv_split=split) if split > 0 else P.fused(pingpong=1, kv_split=-split)
    bwd = fab.build_attention_backward(2, S, Hq, Hkv, D, causal=causal, plan=plan)
    log = assemble(bwd.dkdv_kernel.ptx())
    assert "0 bytes spill stores" in log and "C751" not in log, log


@pytest.mark.parametrize("kw,match", [
    (dict(kv_split=3), "kv_split must be one of"),
    (dict(kv_split=True), "kv_split must be one of"),
    (dict(kv_split=2, dkdv_bq=128, atomic_dq=True, dq_bulk=True, dq_ordered=True),
     "64-row q blocks"),
    (dict(kv_split=5, fused_bq=128), "kv_split must be one of"),
])
def test_bad_plans_name_the_callers_line(kw, match):
    with pytest.raises(ConfigError, match=match) as e:
        P(**kw)
    assert str(e.value).startswith(__file__)


def test_a_split_not_dividing_the_group_is_refused():
    with pytest.raises(ConfigError, match="divide the group size") as e:
        fab.build_attention_backward(1, 256, 6, 2, 128, plan=P.lagged(kv_split=2))
    assert str(e.value).startswith(__file__)
