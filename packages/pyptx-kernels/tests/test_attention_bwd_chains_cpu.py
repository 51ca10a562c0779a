"""Several independent ordered-dQ chains per q block (``BackwardPlan(dq_chains=...)``,
``build_dkdv(dq_chains=...)``) on the CPU: ``ptxsim`` runs the prep, dK/dV (and conversion)
kernels' PTX against float64 with every output poisoned (DQACC too: a chain no kv block
reaches must never be read unzeroed): causal GQA, the rotated full-attention order, the
ascending one, q blocks with fewer adds than chains, a window, 128-row q blocks, the
in-grid converters (``dq_convert``, ``convert_lag``, ``stats_lead``, ``kv_split``) and the
conversion kernel. Plus what costs no simulation: one chain is the kernels of before, ptxas
keeps the kernel spill-free and its wgmma asynchronous, the families key the chains, bad
values fail at the caller's line.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from pyptx.errors import ConfigError

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import ptxsim  # noqa: E402
from test_attention_bwd_gqa_cpu import _check, _simulate  # noqa: E402
from test_family_reuse_bwd_cpu import _check_family  # noqa: E402
from test_sim_attention_fused import _reference  # noqa: E402

fab = importlib.import_module("pyptx_kernels.flash_attention.backward")
bwd_features = importlib.import_module("test_attention_bwd_features_cpu")
P = fab.BackwardPlan


def _build(S, Sk, Hq, Hkv, D, causal, plan, **kw):
    return fab.build_attention_backward(1, S, Hq, Hkv, D, Sk=Sk, causal=causal, plan=plan, **kw)


@pytest.mark.parametrize("S,Sk,Hq,Hkv,D,causal,plan", [
    # causal, 3 kv blocks: q blocks 4-5 get 3 adds (chain 0: two links), 0-1 one (chain 1
    # never written: the conversion kernel reads the prep's zeros)
    (384, 384, 2, 1, 64, True, P.ordered(dq_chains=2)),
    # ... converted in the grid (its converters load no unreached chain), split over 2
    (384, 384, 2, 1, 128, True, P.converted(num_sms=3, dq_chains=2, kv_split=2)),
    # ascending order (Sk > S): 6 adds per q block over 4 chains (chains 0-1: two links)
    (130, 700, 2, 1, 64, False, P.ordered(dq_chains=4)),
    (130, 700, 2, 2, 64, False, P.converted(num_sms=2, dq_chains=4)),
    # the rotated order (ceil(S/64) == 2 ceil(Sk/128)): with as many chains as kv blocks no
    # CTA waits for a later one, so it runs one CTA after another (with one chain: never)
    (256, 256, 2, 1, 64, False, P.converted(num_sms=3, dq_chains=2)),
    # 128-row q blocks (D=128): q block 0 has one add, its chain 1 is the prep's zeros
    (256, 256, 2, 1, 128, True, P.ordered(dkdv_bq=128, dq_chains=2)),
])
def test_chains_match_float64(S, Sk, Hq, Hkv, D, causal, plan):
    inputs, grads = _reference(1, S, Sk, Hq, Hkv, D, causal, S + Sk + D + plan.dq_chains)
    bwd = _build(S, Sk, Hq, Hkv, D, causal, plan)
    assert f"_ordered_c{plan.dq_chains}" in bwd.dkdv_kernel.name
    _check(_simulate(bwd, inputs), grads)


def test_convert_lag_and_stats_lead_with_chains():
    """The producer warps' converters (``convert_lag``) wait for each chain's count and load
    none of a chain past the kv blocks (2 kv blocks, 4 chains: chains 2 and 3 unread); the
    stats writers (``stats_lead``) keep their flag in chain 0's counters. Four kv heads."""
    B, S, Hq, Hkv, D = 2, 130, 4, 2, 128
    inputs, grads = _reference(B, S, S, Hq, Hkv, D, False, 37)
    plan = P.converted(num_sms=3, convert_lag=1, stats_lead=1, kv_split=2, dq_chains=4)
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, D, plan=plan)
    assert bwd.dkdv_kernel.name.endswith("_lag1_lead1_split2") and "_c4" in bwd.dkdv_kernel.name
    assert bwd.kernels[0].specialize().out_shapes[2] == (4 * B, Hq, 3, 2)
    _check(_simulate(bwd, inputs), grads)


@pytest.mark.parametrize("S,Sk,Hq,Hkv,D,causal,window,plan", [
    (300, 300, 2, 1, 64, True, (100, -1), P.converted(num_sms=3, dq_chains=2)),
    (260, 70, 2, 2, 64, False, (0, -1), P.ordered(dq_chains=2)),  # q blocks with no adds
])
def test_chains_with_a_window_match_float64(S, Sk, Hq, Hkv, D, causal, window, plan):
    """A window's q blocks count the kv blocks ``window_kv_range`` reaching them (none, past
    the keys' end: every chain unwritten, the converters store zeros)."""
    inputs, grads = bwd_features._inputs(1, S, Sk, Hq, Hkv, D, causal, window, 0.0, S + Sk)
    bwd = _build(S, Sk, Hq, Hkv, D, causal, plan, window=window)
    assert "_c2" in bwd.dkdv_kernel.name
    bwd_features._check(bwd_features._simulate(bwd, inputs), grads)


def test_two_chains_are_one_chain_to_rounding_and_their_converters_agree():
    """dK and dV do not depend on the chains (bit for bit one chain's); dQ sums the chains in
    a fixed order (to rounding one chain's); the converter CTAs' sums are bit for bit the
    conversion kernel's over the same accumulator (unreached chains zeroed)."""
    S, Hq, Hkv, D = 384, 2, 1, 64
    inputs, grads = _reference(1, S, S, Hq, Hkv, D, True, 61)
    q, k, v, o, lse, do = inputs
    one = _simulate(_build(S, S, Hq, Hkv, D, True, P.converted(num_sms=3)), inputs)
    prep, dkdv = _build(S, S, Hq, Hkv, D, True, P.converted(num_sms=3, dq_chains=2)).kernels
    stats, acc, sem = ptxsim.run(prep.specialize(), [o, lse, do], scratch=(1,))
    dk, dv, dq = ptxsim.run(dkdv.specialize(), [q, k, v, do, stats, acc, sem], inplace=True)
    assert np.array_equal(dk, one[1]) and np.array_equal(dv, one[2])
    assert not np.array_equal(dq, one[0])      # another association of the same adds
    _check((dq, dk, dv), grads)
    bits = acc.view(np.uint32)
    assert (bits == 0x7FC00001).any()          # q blocks 0-1's chain 1: never written
    acc = np.where(bits == 0x7FC00001, 0, bits).view(np.float32)
    convert = fab.build_convert(1, S, Hq, D, width=fab.dq_accumulator_width(D, True), chains=2)
    assert np.array_equal(ptxsim.run(convert.specialize(), [acc])[0], dq)


def test_one_chain_is_the_kernels_of_before():
    """``dq_chains=1`` (and ``"auto"``, ``default_dq_chains``' 1) builds the same cached
    kernels as no option (their PTX: ``tools/ptx_snapshot.py --check``); attention()'s D=128
    plan takes ``"auto"``."""
    assert fab.default_dq_chains(16384, 16384, 16, 4, 128, True) == 1
    assert P.for_eager(128).dq_chains == "auto" and P.for_eager(64).dq_chains == 1
    base = fab.build_attention_backward(1, 1024, 8, 2, 128, causal=True, plan=P.converted())
    for chains in (1, "auto"):
        same = fab.build_attention_backward(1, 1024, 8, 2, 128, causal=True,
                                            plan=P.converted(dq_chains=chains))
        assert same is base
    lagged = fab.build_attention_backward(1, 1024, 8, 2, 128, causal=True, plan=P.lagged())
    assert not re.search(r"_c\d", lagged.dkdv_kernel.name) and len(lagged.kernels) == 2
    assert fab.parse_options("dq_chains=2,dq_ordered=1") == {"dq_chains": 2, "dq_ordered": True}
    assert fab.parse_options("dq_chains=auto") == {"dq_chains": "auto"}


@pytest.mark.parametrize("S,Hq,Hkv,causal,plan", [
    (16384, 16, 4, True, P.lagged(dq_chains=2)),      # the long-sequence GQA shape, split 2
    (4096, 16, 16, False, P.lagged(dq_chains=2)),     # full: convert_lag and stats_lead
    (16384, 16, 4, True, P.lagged(dq_chains=4)),
    (4096, 16, 16, False, P.lagged(dq_chains=4)),
    (8192, 16, 4, True, P.ordered(dq_chains=2)),
    (4096, 16, 16, True, P.ordered(dkdv_bq=128, dq_chains=2)),
])
def test_chains_assemble_without_spills(S, Hq, Hkv, causal, plan, assemble):
    """No spills, no wgmma serialisation (C751x) at the benchmark's shapes (D=128)."""
    bwd = fab.build_attention_backward(32768 // S, S, Hq, Hkv, 128, causal=causal, plan=plan)
    log = assemble(bwd.dkdv_kernel.ptx())
    assert ", 0 bytes spill stores" in log and "C751" not in log, log


def test_d64_chains_assemble_without_spills(assemble):
    bwd = fab.build_attention_backward(4, 4096, 32, 8, 64, causal=True,
                                       plan=P.converted(dq_chains=4))
    log = assemble(bwd.dkdv_kernel.ptx())
    assert ", 0 bytes spill stores" in log and "C751" not in log, log


def test_chains_key_their_families(monkeypatch):
    """A kernel of another size reuses its chains' trace (never one chain's)."""
    monkeypatch.setenv("PYPTX_CACHE_DIR", "off")
    sizes = [(2, 1000, 1000), (1, 2048, 2048), (3, 77, 77)]
    kw = dict(atomic_dq=True, dq_bulk=True, dq_ordered=True, dq_chains=2)
    _check_family(lambda s: fab.build_dkdv(s[0], s[1], 8, 2, 128, Sk=s[2], causal=True, **kw),
                  sizes)
    _check_family(lambda s: fab.build_dkdv(s[0], s[1], 4, 4, 128, Sk=s[2], dq_convert=True,
                                           convert_lag=3, **kw), sizes)
    _check_family(lambda s: fab.build_prep(s[0], s[1], 8, 64, counters=True, width=512,
                                           chains=4), sizes)
    _check_family(lambda s: fab.build_convert(s[0], s[1], 8, 64, width=128, chains=2), sizes)
    one = fab.build_dkdv(1, 1000, 8, 2, 128, causal=True, **dict(kw, dq_chains=1))
    two = fab.build_dkdv(1, 1000, 8, 2, 128, causal=True, **kw)
    assert two.name == one.name.replace("_ordered", "_ordered_c2") and one.ptx() != two.ptx()


@pytest.mark.parametrize("chains", [0, 3, True, "x", 2.0])
def test_bad_chains_name_the_callers_line(chains):
    with pytest.raises(ConfigError, match="BackwardPlan: dq_chains must be one of") as e:
        P.ordered(dq_chains=chains)
    assert str(e.value).startswith(__file__)
    with pytest.raises(ConfigError, match="build_dkdv: dq_chains must be one of") as e:
        fab.build_dkdv(1, 256, 2, 1, 128, atomic_dq=True, dq_bulk=True, dq_ordered=True,
                       dq_chains=chains)
    assert str(e.value).startswith(__file__)


@pytest.mark.parametrize("make,match", [
    (lambda: P(atomic_dq=True, dq_bulk=True, dq_chains=2), "above 1 only with dq_ordered"),
    (lambda: P(dq_chains=2), "above 1 only with dq_ordered"),
    (lambda: P(fused_bq=128, dq_ordered=True, dq_chains=2), "takes dq_ordered but not dq_chains"),
    (lambda: fab.build_dkdv(1, 256, 2, 1, 128, atomic_dq=True, dq_bulk=True, dq_chains=2),
     "above 1 only with dq_ordered"),
    (lambda: fab.build_prep(1, 256, 2, 128, chains=2), "build_prep: dq_chains"),
    (lambda: fab.build_attention_backward_varlen(300, 300, 2, 2, 1, 64, 200, 200,
                                                 plan=P.ordered(dq_chains=2)),
     "not available with packed"),
])
def test_chains_are_refused_where_they_do_not_apply(make, match):
    """Above 1 only with ordered dQ; not the fused D=64 kernel, not varlen."""
    with pytest.raises(ConfigError, match=match) as e:
        make()
    assert str(e.value).startswith(__file__)
