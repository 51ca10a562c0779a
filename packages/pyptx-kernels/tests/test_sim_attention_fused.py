"""The fused attention backward (``fused_bq=128``: one kernel, 128-row q blocks, dQ added by
bulk tile reductions) on the CPU: ``ptxsim`` runs the prep, fused and conversion kernels'
PTX against float64, with every output poisoned (unwritten elements fail). Causal and full,
ragged lengths, grouped-query heads, ``Sk != S``, both dQ orders; and the checks that cost
no simulation: ptxas keeps its wgmma asynchronous and does not spill, bad options fail at
the caller's line.
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
from test_tensorcore_sim import TOL, _dev, _f64  # noqa: E402

fab = importlib.import_module("pyptx_kernels.flash_attention.backward")


def _reference(B, S, Sk, Hq, Hkv, D, causal, seed, dt="bf16"):
    """Random ``dt`` inputs, the forward's ``o`` (``dt``) and ``lse`` (f32), and float64
    ``(dq, dk, dv)`` of the same rounded inputs (top-left causal; kv head ``h // G``)."""
    rng = np.random.default_rng(seed)
    q, do = (_dev(rng.standard_normal((B, S, Hq, D)), dt) for _ in range(2))
    k, v = (_dev(rng.standard_normal((B, Sk, Hkv, D)), dt) for _ in range(2))
    Q, K, V, dO = (_f64(x, dt) for x in (q, k, v, do))
    g = Hq // Hkv
    Kr, Vr = np.repeat(K, g, 2), np.repeat(V, g, 2)
    s = np.einsum("bqhd,bkhd->bhqk", Q, Kr) / np.sqrt(D)
    if causal:
        s = s + np.triu(np.full((S, Sk), -np.inf), 1)
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - mx)
    lse = (np.log(e.sum(-1, keepdims=True)) + mx)[..., 0]
    p = e / e.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bkhd->bqhd", p, Vr)
    o_dev = _dev(o, dt)
    dp = np.einsum("bqhd,bkhd->bhqk", dO, Vr)
    delta = (dO * _f64(o_dev, dt)).sum(-1).transpose(0, 2, 1)[..., None]
    ds = p * (dp - delta) / np.sqrt(D)
    dq = np.einsum("bhqk,bkhd->bqhd", ds, Kr)
    split = (B, Sk, Hkv, g, D)
    dk = np.einsum("bhqk,bqhd->bkhd", ds, Q).reshape(split).sum(3)
    dv = np.einsum("bhqk,bqhd->bkhd", p, dO).reshape(split).sum(3)
    return (q, k, v, o_dev, lse.astype(np.float32), do), (dq, dk, dv)


def _simulate(bwd, inputs, ordered):
    """The three kernels of a fused backward in the simulator: ``(dq, dk, dv)`` bits."""
    q, k, v, o, lse, do = inputs
    prep, fused, convert = bwd.kernels
    # ordered: DQACC is left unwritten by prep (each tile's first add stores it)
    stats, acc, *sem = ptxsim.run(prep.specialize(), [o, lse, do], poison=not ordered)
    dk, dv = ptxsim.run(fused.specialize(), [q, k, v, do, stats, acc, *sem], inplace=True)
    (dq,) = ptxsim.run(convert.specialize(), [acc])
    return dq, dk, dv


@pytest.mark.parametrize("S,Sk,Hq,Hkv,causal,ordered,defer,dt,pingpong", [
    (300, 300, 2, 1, True, True, False, "bf16", 0),    # causal chain: from the diagonal down
    (300, 300, 2, 1, False, False, False, "bf16", 0),  # any order
    (300, 200, 2, 1, False, True, False, "bf16", 0),   # ascending order (a wavefront), Sk < S
    (200, 300, 3, 1, True, False, False, "bf16", 0),   # causal, a kv block with no q block (Sk > S)
    (130, 130, 2, 2, True, True, False, "f16", 0),
    (300, 300, 2, 1, True, True, True, "bf16", 0),     # fused_defer: dK a block late
    (200, 300, 3, 1, True, False, True, "bf16", 0),
    (300, 300, 2, 1, False, False, True, "f16", 0),
    (300, 300, 2, 1, True, True, False, "bf16", 1),    # fused_pingpong: warpgroup 1 behind
    (300, 300, 2, 1, False, False, False, "bf16", 1),
    (300, 200, 2, 1, False, True, False, "bf16", 1),
    (200, 300, 3, 1, True, False, False, "bf16", 1),   # a CTA with no block
    (130, 130, 2, 2, True, True, False, "f16", 1),
    (300, 300, 2, 1, True, True, False, "bf16", 2),
    (200, 300, 3, 1, True, False, False, "bf16", 2),
    (300, 200, 2, 1, False, False, False, "f16", 2),
])
def test_fused_backward_matches_float64(S, Sk, Hq, Hkv, causal, ordered, defer, dt, pingpong):
    """Ring refills (3 stages; a CTA runs up to Hq / Hkv * 3 blocks), ordered chains over
    several kv blocks, ragged ends on both sides."""
    B, D = 1, 64
    inputs, grads = _reference(B, S, Sk, Hq, Hkv, D, causal, S + Sk + causal, dt)
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, D, Sk=Sk, dtype=dt, causal=causal,
                                       fused_bq=128, dq_ordered=ordered, fused_defer=defer,
                                       fused_pingpong=pingpong)
    for name, got, ref in zip(("dq", "dk", "dv"), _simulate(bwd, inputs, ordered), grads):
        err = np.linalg.norm(_f64(got, dt) - ref) / np.linalg.norm(ref)
        assert err < TOL[dt], (name, err)


def test_fused_rotated_order_is_a_chain_one_step_apart():
    """The ordered mode's schedule for full attention with ``ceil(S/128) == ceil(Sk/128)``
    (``_FusedPlan.q_block`` / ``dq_rank``, modelled here: the simulator runs one CTA after
    another, and in the rotated order the last kv block waits for block 0, launched last, so
    it cannot run it): the kv blocks adding into a q block hold ranks 0..n-1 and rank r + 1
    reaches it one step after rank r; causal ranks likewise (from the diagonal down)."""
    for n in (1, 2, 3, 32):
        for causal in (False, True):
            visits = {}                         # q block -> [(step, kv block)]
            for j in range(n):
                for step in range(j if causal else 0, n):
                    i = step if causal else (step + j) % n
                    visits.setdefault(i, []).append((step - (j if causal else 0), j))
            for i, vs in visits.items():
                rank = {j: (min(i, n - 1) - j) if causal else (i + n - j) % n for _, j in vs}
                assert sorted(rank.values()) == list(range(len(vs)))
                when = [t for t, _ in sorted(vs, key=lambda v: rank[v[1]])]
                assert all(b - a == 1 for a, b in zip(when, when[1:])), (n, causal, i, when)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("schedule", [{}, dict(fused_defer=True), dict(fused_pingpong=1),
                                      dict(fused_pingpong=2)])
def test_fused_keeps_wgmma_asynchronous(causal, ordered, schedule, assemble):
    """At the benchmark's sizes ptxas neither serialises the fused kernel's wgmma nor
    injects fences (C751x notes), nor spills."""
    k = fab.build_attention_backward(8, 4096, 32, 32, 64, causal=causal, fused_bq=128,
                                     dq_ordered=ordered, **schedule).dkdv_kernel
    log = assemble(k.ptx())
    assert "(C751" not in log, log
    assert "0 bytes spill stores" in log, log


@pytest.mark.parametrize("kw,match", [
    (dict(fused_bq=64), "fused_bq must be 128"),
    (dict(fused_bq=128, atomic_dq=True), "not atomic_dq"),
    (dict(fused_bq=128, dq_bkv=128), "not dq_bkv"),
    (dict(fused_bq=128, safe=True), "not safe"),
    (dict(fused_defer=True), "schedules of fused_bq"),
    (dict(fused_pingpong=1), "schedules of fused_bq"),
    (dict(fused_bq=128, fused_pingpong=3), "fused_pingpong must be 0, 1 or 2"),
    (dict(fused_bq=128, fused_pingpong=1, fused_defer=True), "not with fused_defer"),
])
def test_fused_bad_options_name_the_callers_line(kw, match):
    with pytest.raises(ConfigError, match=match) as e:
        fab.build_attention_backward(1, 256, 2, 2, 64, **kw)
    assert str(e.value).startswith(f"{__file__}:")


def test_fused_needs_head_dim_64():
    with pytest.raises(ConfigError, match="D must be 64") as e:
        fab.build_attention_backward(1, 256, 2, 2, 128, fused_bq=128)
    assert str(e.value).startswith(f"{__file__}:")


def test_fused_is_an_option_of_the_command_lines():
    assert fab.parse_options("fused_bq=128,dq_ordered=1") == {"fused_bq": 128, "dq_ordered": True}
    assert fab.parse_options("fused_bq=128,fused_pingpong=2") == {"fused_bq": 128,
                                                                  "fused_pingpong": 2}
