"""The attention backward's kernels of a new size reuse their family's traced code
(``pyptx_kernels._family``): the reused specialization equals a fresh trace of that size in
everything a launch uses (PTX, scalar parameters, grid, block, shared memory, tensor shapes
and maps), for the dQ, dK/dV (every dQ mode), fused, prep, convert and varlen kernels; and
``build_attention_backward`` for a new size traces nothing."""

import time

import pytest
from pyptx_kernels import _family
from pyptx_kernels.flash_attention.backward import (
    BackwardPlan,
    build_attention_backward,
    build_attention_backward_varlen,
    build_convert,
    build_dkdv,
    build_dkdv_varlen,
    build_dq,
    build_dq_varlen,
    build_fused,
    build_prep,
)


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch):
    """Fresh traces here are traces: the families' disk cache is off."""
    monkeypatch.setenv("PYPTX_CACHE_DIR", "off")


def _spec(k):
    return getattr(k, "kernel", k).specialize()


def _launch_view(spec):
    return (spec.ptx(), [(n, t.name, v) for n, t, v in spec.scalar_params], spec.grid,
            spec.block, spec.cluster, spec.smem, spec.static_smem, spec.in_shapes,
            spec.out_shapes, spec.tma_maps, spec.name)


def _check_family(build, sizes):
    """``build(size)`` for each size after the first reuses the first one's trace, and equals
    a fresh trace of that size."""
    _family.clear()
    first = _spec(build(sizes[0]))
    for size in sizes[1:]:
        before = _family.stats()["reused"]
        reused = _spec(build(size))
        assert _family.stats()["reused"] == before + 1, f"{size}: traced, not reused"
        assert reused.module is first.module
        _family.clear()
        fresh = _spec(build(size))
        assert fresh.module is not first.module
        assert _launch_view(reused) == _launch_view(fresh), size
        _family.clear()
        first = _spec(build(sizes[0]))


# (B, S, Sk): equal lengths keep full attention's rotated ordered-dQ order (a family choice)
SIZES = [(2, 1000, 1000), (2, 1001, 1001), (1, 2048, 2048), (4, 4096, 4096), (3, 77, 77)]
RAGGED = [(2, 1000, 1000), (1, 1001, 3000), (4, 4096, 2000)]


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_dq_sizes_are_runtime(D, causal):
    _check_family(lambda s: build_dq(s[0], s[1], 8, 2, D, Sk=s[2], causal=causal),
                  SIZES[:4] + RAGGED[1:])


def test_dq_window_softcap():
    _check_family(lambda s: build_dq(s[0], s[1], 8, 2, 64, Sk=s[2], window=(256, 64),
                                     softcap=30.0, BKV=128), SIZES[:4] + RAGGED[1:])


DKDV_MODES = {
    "pair": {},
    "atomic": dict(atomic_dq=True),
    "bulk": dict(atomic_dq=True, dq_bulk=True),
    "ordered": dict(atomic_dq=True, dq_bulk=True, dq_ordered=True),
    "ordered_split2": dict(atomic_dq=True, dq_bulk=True, dq_ordered=True, kv_split=2),
    "converted": dict(atomic_dq=True, dq_bulk=True, dq_ordered=True, dq_convert=True),
}


@pytest.mark.parametrize("mode", list(DKDV_MODES))
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_dkdv_sizes_are_runtime(mode, D, causal):
    kw = DKDV_MODES[mode]
    _check_family(lambda s: build_dkdv(s[0], s[1], 8, 2, D, Sk=s[2], causal=causal, **kw),
                  SIZES if not causal else SIZES[:3] + RAGGED[1:])


def test_dkdv_wide_ordered_and_features():
    _check_family(lambda s: build_dkdv(s[0], s[1], 8, 2, 128, Sk=s[2], BQ=128, causal=True,
                                       atomic_dq=True, dq_bulk=True, dq_ordered=True),
                  SIZES[:3] + RAGGED[1:])
    _check_family(lambda s: build_dkdv(s[0], s[1], 8, 2, 64, Sk=s[2], window=(256, 64),
                                       softcap=30.0), SIZES[:4] + RAGGED[1:])
    _check_family(lambda s: build_dkdv(s[0], s[1], 8, 2, 128, Sk=s[2], causal=True,
                                       window=(256, 0), atomic_dq=True, dq_bulk=True,
                                       dq_ordered=True), SIZES[:4])


def test_dkdv_convert_lag_and_stats_lead():
    # in the code: convert_lag's share of q blocks per CTA, the rotated order, and with
    # stats_lead S and its rows per CTA; the batch is read at run time
    _check_family(lambda s: build_dkdv(s[0], s[1], 4, 4, 128, atomic_dq=True, dq_bulk=True,
                                       dq_ordered=True, dq_convert=True, convert_lag=9,
                                       stats_lead=6),
                  [(2, 4096, 4096), (1, 4096, 4096), (8, 4096, 4096)])
    _check_family(lambda b: build_dkdv(b, 1000, 8, 2, 128, atomic_dq=True, dq_bulk=True,
                                       dq_ordered=True, dq_convert=True, stats_lead=3),
                  [2, 1, 4, 7])


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(ordered=True),
                                dict(ordered=True, pingpong=1, kv_split=2, causal=True),
                                dict(ordered=True, causal=True, window=(128, 0), softcap=20.0)],
                         ids=str)
def test_fused_sizes_are_runtime(kw):
    _check_family(lambda s: build_fused(s[0], s[1], 8, 2, 64, Sk=s[2], **kw), SIZES[:4])


def test_prep_and_convert_sizes_are_runtime():
    sizes = [(2, 1000), (2, 1001), (1, 2048), (4, 4096)]
    _check_family(lambda s: build_prep(s[0], s[1], 8, 128), sizes)
    _check_family(lambda s: build_prep(s[0], s[1], 8, 64, counters=True, width=128), sizes)
    _check_family(lambda s: build_prep(s[0], s[1], 8, 128, counters=True, lead=3, Hkv=2),
                  sizes)
    _check_family(lambda s: build_convert(s[0], s[1], 8, 64, width=128), sizes)
    _check_family(lambda s: build_convert(s[0], s[1], 8, 128), sizes)


@pytest.mark.parametrize("kw", [dict(), dict(causal=True, window=(128, 0), softcap=10.0)],
                         ids=str)
def test_varlen_totals_are_runtime(kw):
    sizes = [(1000, 2, 512), (1001, 3, 1001), (4096, 4, 2048)]
    _check_family(lambda s: build_dq_varlen(s[0], s[0], s[1], 8, 2, 128, s[2], **kw), sizes)
    _check_family(lambda s: build_dkdv_varlen(s[0], s[0] + 7, s[1], 8, 2, 64, s[2], **kw),
                  sizes)


@pytest.mark.parametrize("plan", [BackwardPlan(), BackwardPlan.for_eager(64),
                                  BackwardPlan.for_eager(128), BackwardPlan.atomic()],
                         ids=lambda p: p.name)
def test_backward_of_a_new_size_traces_nothing(plan):
    D = 64 if plan.fused_bq else 128
    _family.clear()
    build_attention_backward(2, 1000, 8, 2, D, causal=True, plan=plan)
    traced = _family.stats()["traced"]
    start = time.perf_counter()
    bwd = build_attention_backward(3, 1001, 8, 2, D, causal=True, plan=plan)
    for k in bwd.kernels:
        _spec(k)
    elapsed = time.perf_counter() - start
    assert _family.stats()["traced"] == traced
    assert elapsed < 0.25, f"{elapsed * 1e3:.1f} ms"   # a trace of these takes 20-150 ms


def test_varlen_backward_of_a_new_size_traces_nothing():
    _family.clear()
    build_attention_backward_varlen(3000, 3000, 4, 8, 2, 128, 1024, 1024, causal=True)
    traced = _family.stats()["traced"]
    bwd = build_attention_backward_varlen(3001, 2999, 5, 8, 2, 128, 900, 1100, causal=True)
    for k in bwd.kernels:
        _spec(k)
    assert _family.stats()["traced"] == traced
