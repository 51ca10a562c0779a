"""After a problem's first default call the library compiles, on a background thread, the
plans a default call takes at the problem's other sizes (``gemm.host.warm_siblings``, the row
builders' ``warm_siblings``), so a later size in another bucket launches without ptxas."""

import threading

import pytest
from pyptx_kernels import _family
from pyptx_kernels.gemm import host
from pyptx_kernels.gemm.config import GemmConfig
from pyptx_kernels.gemm.kernel import build_gemm
from pyptx_kernels.rows.rms_norm import build_rms_norm_fast

from pyptx import jit
from pyptx.types import bf16

KEY = tuple(sorted(dict(dtype="bf16", out_dtype="bf16", a_major="K", b_major="K", bias=False,
                        alpha=1.0, activation=None, KB=4096, NB=4096).items()))


@pytest.fixture
def assembled(monkeypatch):
    monkeypatch.setenv("PYPTX_CACHE_DIR", "off")
    _family.clear()
    seen = []
    monkeypatch.setattr(jit, "cubin_for", lambda text, arch, name, locs=None: seen.append(name))
    return seen


def test_gemm_siblings_cover_every_plan_a_default_call_takes(assembled):
    plans = host.sibling_plans(4096, 4096, KEY)
    assert len(plans) >= 2                      # M 1 and M 4096 take different tiles
    host.warm_siblings(4096, 4096, KEY)
    assert len(assembled) == len(plans)
    traced = _family.stats()["traced"]
    for M in (7, 300, 1533, 5000):             # any M: its plan's family is warm
        name, _ = host.PLANNER.choose({"M": M, "N": 4096, "K": 4096, **dict(KEY)})
        assert name in plans
        build_gemm(M, 4096, 4096, **dict(KEY), config=GemmConfig.of(name))
    assert _family.stats()["traced"] == traced


def test_gemm_siblings_of_an_mn_major_a(assembled):
    """A weight gradient's ``g.T`` (A ``(K, M)``, MN-major): the small-M siblings are built
    at M rounded up to 8, as a call pads them (M = 1 was a 2-byte TMA stride)."""
    key = tuple(sorted(dict(KEY, a_major="MN", b_major="MN", KB=8192, NB=2048).items()))
    plans = host.sibling_plans(2048, 8192, key)
    host.warm_siblings(2048, 8192, key)
    assert len(assembled) == sum(1 for n in plans if not n.endswith("_st"))


def test_row_siblings_are_assembled(assembled):
    build_rms_norm_fast.warm_siblings(4096, bf16, (1e-6,), "sm_90a")
    assert len(assembled) >= 2 and all(n.startswith("rms_norm") for n in assembled)


def test_background_jobs_run_in_order_and_failures_are_dropped(monkeypatch):
    from pyptx import driver

    monkeypatch.setattr(driver, "cuda", lambda: object())
    done, ran = threading.Event(), []

    def boom():
        raise RuntimeError("a failed warm-up")

    _family.in_background(boom)
    _family.in_background(lambda: ran.append(1))
    _family.in_background(done.set)
    assert _family.wait_idle(10) and done.is_set() and ran == [1]


def test_no_gpu_no_background_work(monkeypatch):
    from pyptx import driver

    monkeypatch.setattr(driver, "cuda", lambda: None)
    ran = []
    _family.in_background(lambda: ran.append(1))
    assert ran == [] and not any(j for j in _family._jobs)


def test_grouped_siblings_cover_every_plan_a_default_call_takes(assembled):
    from pyptx_kernels.grouped_gemm import host as grouped
    from pyptx_kernels.grouped_gemm.config import GROUPED_CONFIGS
    from pyptx_kernels.grouped_gemm.kernel import build_grouped

    plans = grouped.sibling_plans(2048, 2048, 8, "MN")
    assert len(plans) >= 2                      # a short problem takes 64-row tiles
    grouped.warm_siblings(2048, 2048, 8, "MN", "bf16")
    assert len(assembled) == len(plans)
    traced = _family.stats()["traced"]
    by_name = {c.name: c for c in GROUPED_CONFIGS}
    for M in (333, 1000, 4101, 8190):          # any total rows: its plan's family is warm
        name, _ = grouped.PLANNER.choose({"M": M, "N": 2048, "K": 2048, "G": 8, "b_major": "MN"})
        assert name in plans
        build_grouped(M, 2048, 2048, 8, b_major="MN", out_dtype="bf16", config=by_name[name])
    assert _family.stats()["traced"] == traced
