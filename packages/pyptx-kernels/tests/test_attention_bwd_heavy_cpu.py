"""The causal dK/dV grid run longest CTAs first (``BackwardPlan(heavy_first=...)``,
``build_dkdv(heavy_first=...)``) on the CPU: ``ptxsim`` runs the prep, dK/dV (and conversion)
kernels' PTX against float64 with every output poisoned, for the ordered dQ (ascending kv
blocks, each CTA from the last q block down, q steps over every head: the simulator runs CTAs
in launch order, so a CTA waiting for a later one would never finish), with chains,
``kv_split``, the in-grid converters, 128-row q blocks, several batches and kv heads (the
launch order's mapping), kv blocks past S, and dQ added in any order. Plus ptxas (no spills,
no C751x), families, the ``"auto"`` rule and refusals at the caller's line.
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
P = fab.BackwardPlan


def _heavy(plan, **changes):
    return P(**{**plan.options(), "heavy_first": True, **changes})


@pytest.mark.parametrize("B,S,Sk,Hq,Hkv,D,plan", [
    # 3 kv blocks x 2 batches x 2 kv heads: q block 5 gets adds from kv blocks 0, 1, 2
    (2, 384, 384, 4, 2, 64, _heavy(P.ordered())),
    (1, 384, 384, 4, 1, 128, _heavy(P.converted(num_sms=3, kv_split=2))),
    (2, 384, 384, 2, 1, 64, _heavy(P.ordered(dq_chains=2))),
    (1, 300, 300, 2, 1, 128, _heavy(P.converted(num_sms=2, dq_chains=4))),
    (1, 256, 256, 2, 1, 128, _heavy(P.ordered(dkdv_bq=128))),
    (1, 100, 300, 4, 2, 128, _heavy(P.ordered(kv_split=2))),     # kv blocks with no q block
    (2, 200, 200, 4, 2, 64, _heavy(P.bulk())),                   # any order
    # num_sms 2: groups of two waves, 4 CTAs: 2 kv heads of 3 kv blocks (two groups; three
    # batches of one kv head: groups of 2 and 1)
    (2, 384, 384, 4, 2, 64, _heavy(P.ordered(num_sms=2))),
    (3, 384, 384, 2, 1, 128, _heavy(P.converted(num_sms=2))),
    (3, 300, 300, 4, 1, 64, _heavy(P(atomic_dq=True, dq_bulk=True, num_sms=2))),
])
def test_heavy_first_matches_float64(B, S, Sk, Hq, Hkv, D, plan):
    inputs, grads = _reference(B, S, Sk, Hq, Hkv, D, True, 3 * S + Sk + D + Hq)
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, D, Sk=Sk, causal=True, plan=plan)
    assert "_heavy" in bwd.dkdv_kernel.name
    sizes = dict((n, v) for n, _, v in bwd.dkdv_kernel.specialize().scalar_params)
    groups = {(2, 2): (2, 0), (3, 1): (1, 1)}.get((B, Hkv)) if plan.num_sms == 2 else None
    assert (sizes["heavy_base"], sizes["heavy_extra"]) == (groups or (B * Hkv, 0)), sizes
    _check(_simulate(bwd, inputs), grads)


def test_heavy_groups_hold_two_waves():
    """``heavy_groups``: as few groups as hold two waves of CTAs each, sizes within one."""
    common = importlib.import_module("pyptx_kernels.flash_attention.bwd_common")
    # (kv heads, CTAs per head) -> (base, extra): 128 x 16 -> 8 groups of 16; 16 x 64 -> 4
    # of 4; 3 x 24 at D=64 -> one of 3; 12 x 24 -> 2 of 6; 16 x 128 -> 6: four of 3, two of 2
    cases = {(128, 16): (16, 0), (16, 64): (4, 0), (3, 24): (3, 0), (12, 24): (6, 0),
             (16, 128): (2, 4), (4, 256): (2, 0), (5, 300): (1, 0)}
    assert {k: common.heavy_groups(*k) for k in cases} == cases
    assert common.heavy_groups(3, 3, num_sms=2) == (1, 1)


@pytest.mark.parametrize("S,Hq,Hkv,plan", [
    (16384, 16, 4, _heavy(P.lagged())),
    (4096, 32, 4, _heavy(P.lagged())),
    (16384, 16, 4, _heavy(P.lagged(dq_chains=2))),
    (8192, 32, 8, _heavy(P.bulk())),
    (4096, 16, 16, _heavy(P.ordered(dkdv_bq=128))),
    (4096, 32, 8, _heavy(P())),
])
def test_heavy_first_assembles_without_spills(S, Hq, Hkv, plan, assemble):
    """No spills, no wgmma serialisation (C751x) at the benchmark's shapes (D=128)."""
    bwd = fab.build_attention_backward(32768 // S, S, Hq, Hkv, 128, causal=True, plan=plan)
    log = assemble(bwd.dkdv_kernel.ptx())
    assert ", 0 bytes spill stores" in log and "C751" not in log, log


def test_heavy_first_keys_its_family(monkeypatch):
    """A kernel of another size reuses the heavy-first trace (never the other order's)."""
    monkeypatch.setenv("PYPTX_CACHE_DIR", "off")
    sizes = [(2, 1000, 1000), (1, 2048, 2048), (3, 77, 77)]
    kw = dict(atomic_dq=True, dq_bulk=True, dq_ordered=True, heavy_first=True, causal=True)
    _check_family(lambda s: fab.build_dkdv(s[0], s[1], 8, 2, 128, Sk=s[2], **kw), sizes)
    _check_family(lambda s: fab.build_dkdv(s[0], s[1], 8, 2, 128, Sk=s[2], dq_convert=True,
                                           kv_split=2, **kw), sizes)
    plain = fab.build_dkdv(1, 1000, 8, 2, 128, **dict(kw, heavy_first=False))
    heavy = fab.build_dkdv(1, 1000, 8, 2, 128, **kw)
    assert heavy.name == plain.name.replace("_ordered", "_ordered_heavy")
    assert heavy.ptx() != plain.ptx()


def test_auto_is_the_causal_dkdv_grid():
    """``"auto"`` (``lagged()``'s): the causal dK/dV grid without a window at 8 query heads
    per kv head, or 4 from S 8192; elsewhere the kernels of before."""
    auto = P.lagged()
    assert auto.heavy_first == "auto"
    causal = fab.build_attention_backward(1, 1024, 8, 1, 128, causal=True, plan=auto)
    assert "_heavy" in causal.dkdv_kernel.name         # G 8
    long = fab.build_attention_backward(1, 8192, 8, 2, 128, causal=True, plan=auto)
    assert "_heavy" in long.dkdv_kernel.name           # G 4 at S 8192
    for S, Hkv in ((4096, 2), (8192, 8)):               # G 4 at S 4096, G 1
        short = fab.build_attention_backward(1, S, 8, Hkv, 128, causal=True, plan=auto)
        assert "_heavy" not in short.dkdv_kernel.name, (S, Hkv)
    full = fab.build_attention_backward(1, 1024, 8, 1, 128, causal=False, plan=auto)
    assert "_heavy" not in full.dkdv_kernel.name
    window = fab.build_attention_backward(1, 1024, 8, 1, 128, causal=True, plan=auto,
                                          window=(256, 0))
    assert "_heavy" not in window.dkdv_kernel.name
    fused = P(**{**P.fused().options(), "heavy_first": "auto"})
    fused_bwd = fab.build_attention_backward(1, 1024, 8, 2, 64, causal=True, plan=fused)
    assert "_heavy" not in fused_bwd.dkdv_kernel.name
    assert fab.parse_options("heavy_first=1") == {"heavy_first": True}
    assert fab.parse_options("heavy_first=auto") == {"heavy_first": "auto"}
    assert not fab.default_heavy_first(True, stats_lead=3)


@pytest.mark.parametrize("make,match", [
    (lambda: P(heavy_first="x"), "heavy_first must be a bool or 'auto'"),
    (lambda: P(heavy_first=2), "heavy_first must be a bool or 'auto'"),
    (lambda: P(fused_bq=128, dq_ordered=True, dq_chains=2, heavy_first=True),
     "takes dq_ordered but not dq_chains$"),
    (lambda: fab.build_dkdv(1, 256, 2, 1, 128, heavy_first=True),
     "heavy_first is the causal grid's order"),
    (lambda: fab.build_dkdv(1, 256, 2, 1, 64, causal=True, window=(64, 0), heavy_first=True),
     "heavy_first is the causal grid's order"),
    (lambda: fab.build_dkdv(1, 256, 2, 1, 128, causal=True, atomic_dq=True, dq_bulk=True,
                            dq_ordered=True, stats_lead=1, heavy_first=True),
     "heavy_first takes no convert_lag or stats_lead"),
    (lambda: fab.build_attention_backward(1, 256, 2, 1, 128, causal=False,
                                          plan=_heavy(P.ordered())),
     "heavy_first is the causal grid's order"),
])
def test_heavy_first_is_refused_where_it_does_not_apply(make, match):
    with pytest.raises(ConfigError, match=match) as e:
        make()
    assert str(e.value).startswith(__file__)
