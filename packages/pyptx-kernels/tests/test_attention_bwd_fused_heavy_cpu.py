"""The fused D=64 backward's causal grid run longest CTAs first (``BackwardPlan(fused_bq=128,
heavy_first=...)``, ``build_fused(heavy_first=...)``) on the CPU: ``ptxsim`` runs the prep,
fused and conversion kernels' PTX against float64 with every output poisoned, for the
ordered dQ (ascending kv blocks: the simulator runs CTAs in launch order, so a CTA waiting
for a later one would never finish) and dQ in any order, the lockstep, deferred and pingpong
schedules, ``kv_split``, several batches and kv heads (the launch order's mapping), ragged
lengths and kv blocks past S. Plus the ordered schedule's model (each CTA from the last q
block down, every kv block at a q block at the same step), ptxas (no spills, no C751x),
families, the ``"auto"`` rule and refusals at the caller's line.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from pyptx.errors import ConfigError

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from test_attention_bwd_gqa_cpu import _check, _simulate  # noqa: E402
from test_family_reuse_bwd_cpu import _check_family  # noqa: E402
from test_sim_attention_fused import _reference  # noqa: E402

fab = importlib.import_module("pyptx_kernels.flash_attention.backward")
fused_mod = importlib.import_module("pyptx_kernels.flash_attention.bwd_fused")
common = importlib.import_module("pyptx_kernels.flash_attention.bwd_common")
P = fab.BackwardPlan


def _heavy(plan, **changes):
    return P(**{**plan.options(), "heavy_first": True, **changes})


@pytest.mark.parametrize("B,S,Sk,Hq,Hkv,dt,plan", [
    # 3 kv blocks x 2 batches x 2 kv heads: q block 2 gets adds from kv blocks 0, 1, 2
    (2, 384, 384, 4, 2, "bf16", _heavy(P.fused(pingpong=1))),
    (1, 300, 300, 4, 1, "bf16", _heavy(P.fused(kv_split=2))),            # lockstep, ragged
    (2, 300, 300, 4, 2, "f16", _heavy(P.fused(pingpong=2, kv_split=2))),
    (3, 260, 260, 2, 1, "bf16", _heavy(P.fused(defer=True))),
    (1, 200, 300, 3, 1, "bf16", _heavy(P.fused(pingpong=1))),   # a kv block with no q block
    (1, 300, 200, 2, 1, "bf16", _heavy(P.fused())),             # q blocks past the last kv
    (2, 200, 200, 4, 2, "bf16", _heavy(P.fused(ordered=False, pingpong=1, kv_split=2))),
    (1, 300, 300, 2, 1, "bf16", _heavy(P.fused(ordered=False))),                # any order
])
def test_fused_heavy_first_matches_float64(B, S, Sk, Hq, Hkv, dt, plan):
    inputs, grads = _reference(B, S, Sk, Hq, Hkv, 64, True, 5 * S + Sk + Hq, dt)
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, 64, Sk=Sk, dtype=dt, causal=True,
                                       plan=plan)
    assert "_heavy" in bwd.dkdv_kernel.name
    _check(_simulate(bwd, inputs), grads, dt)


@pytest.mark.parametrize("B,Hkv,plan", [
    (2, 2, _heavy(P.fused(pingpong=1))),            # two groups of two kv heads
    (3, 1, _heavy(P.fused(ordered=False))),         # groups of 2 and 1 (a short last one)
])
def test_fused_heavy_groups_match_float64(B, Hkv, plan, monkeypatch):
    """Groups of kv heads one after another (two here: at 132 SMs these grids are one)."""
    monkeypatch.setattr(fused_mod, "heavy_groups", lambda heads, kv_ctas, num_sms=132: (
        heads // 2, heads % 2))
    S, Hq = 257 + B, 2 * Hkv
    inputs, grads = _reference(B, S, S, Hq, Hkv, 64, True, 11 * B + Hkv)
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, 64, causal=True, plan=plan)
    sizes = {n: v for n, _, v in bwd.dkdv_kernel.specialize().scalar_params}
    assert (sizes["heavy_base"], sizes["heavy_extra"]) == (B * Hkv // 2, B * Hkv % 2)
    _check(_simulate(bwd, inputs), grads)


@pytest.mark.parametrize("S,Sk", [(128, 128), (384, 384), (1000, 1000), (200, 300),
                                  (1000, 300)])
def test_fused_heavy_first_ordered_schedule(S, Sk):
    """``_FusedPlan.q_block`` / ``dq_rank`` of the ordered heavy-first kernel (which the
    simulator, running whole CTAs in ascending kv block order, cannot tell from another
    walk): kv block ``kb`` visits q blocks ``num_q - 1`` down to ``kb`` once each, the kv
    blocks adding into a q block hold ranks ``0..n-1`` by ascending kv block, and all of them
    reach it at the same step of their walks (no CTA waits a step for its predecessor)."""
    plan = fused_mod._FusedPlan(S, 2, 1, 64, Sk, common._dtype("bf16"), True, True, None,
                                heavy=True)
    assert not plan.reverse
    visits = {}                                 # q block -> [(walk step, kv block, rank)]
    for kb in range(plan.num_kv):
        seen = [plan.q_block(step, kb) for step in range(kb, plan.num_q)]
        assert seen == list(range(plan.num_q - 1, kb - 1, -1)), (kb, seen)
        for step, qb in zip(range(kb, plan.num_q), seen):
            visits.setdefault(qb, []).append((step - kb, kb, plan.dq_rank(qb, kb)))
    for qb, vs in visits.items():
        assert [r for _, _, r in sorted(vs, key=lambda v: v[1])] == list(range(len(vs)))
        assert len({t for t, _, _ in vs}) == 1, (qb, vs)


@pytest.mark.parametrize("B,S,Hq,Hkv,ordered", [
    (3, 3000, 12, 4, True),
    (2, 8192, 32, 8, True),
    (2, 8192, 32, 8, False),
])
def test_fused_heavy_first_assembles_without_spills(B, S, Hq, Hkv, ordered, assemble):
    """No spills, no wgmma serialisation (C751x) at the benchmark's D=64 shapes."""
    plan = _heavy(P.fused(ordered=ordered, pingpong=1, kv_split="auto"))
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, 64, causal=True, plan=plan)
    assert "_heavy" in bwd.dkdv_kernel.name
    log = assemble(bwd.dkdv_kernel.ptx())
    assert ", 0 bytes spill stores" in log and "C751" not in log, log


def test_fused_heavy_first_keys_its_family(monkeypatch):
    """A kernel of another size reuses the heavy-first trace (never the other order's)."""
    monkeypatch.setenv("PYPTX_CACHE_DIR", "off")
    sizes = [(2, 1000, 1000), (1, 2048, 2048), (3, 77, 77), (1, 200, 300)]
    kw = dict(ordered=True, pingpong=1, heavy_first=True, causal=True)
    _check_family(lambda s: fab.build_fused(s[0], s[1], 8, 2, 64, Sk=s[2], **kw), sizes)
    _check_family(lambda s: fab.build_fused(s[0], s[1], 8, 2, 64, Sk=s[2], kv_split=2,
                                            **dict(kw, ordered=False)), sizes)
    plain = fab.build_fused(1, 1000, 8, 2, 64, **dict(kw, heavy_first=False))
    heavy = fab.build_fused(1, 1000, 8, 2, 64, **kw)
    assert heavy.name == plain.name.replace("_ordered", "_ordered_heavy")
    assert heavy.ptx() != plain.ptx()


def test_fused_auto_keeps_the_kernel_of_before():
    """``"auto"`` leaves the fused kernel's order as it was (heavy_first there is opt-in)."""
    auto = _heavy(P.fused(pingpong=1), heavy_first="auto")
    causal = fab.build_attention_backward(1, 1024, 8, 1, 64, causal=True, plan=auto)
    assert "_heavy" not in causal.dkdv_kernel.name
    assert not fab.default_heavy_first(True, fused=True)
    assert not P.fused().heavy_first and not P.for_eager(64).heavy_first


@pytest.mark.parametrize("make,match", [
    (lambda: fab.build_fused(1, 256, 2, 1, 64, heavy_first=True),
     "build_fused: heavy_first is the causal grid's order"),
    (lambda: fab.build_fused(1, 256, 2, 1, 64, causal=True, window=(64, 0), heavy_first=True),
     "build_fused: heavy_first is the causal grid's order"),
    (lambda: fab.build_attention_backward(1, 256, 2, 1, 64, causal=False,
                                          plan=_heavy(P.fused())),
     "build_fused: heavy_first is the causal grid's order"),
    (lambda: fab.build_attention_backward(1, 256, 2, 1, 64, causal=True, window=(64, 0),
                                          plan=_heavy(P.fused(pingpong=1))),
     "build_fused: heavy_first is the causal grid's order"),
])
def test_fused_heavy_first_is_refused_where_it_does_not_apply(make, match):
    with pytest.raises(ConfigError, match=match) as e:
        make()
    assert str(e.value).startswith(__file__)
