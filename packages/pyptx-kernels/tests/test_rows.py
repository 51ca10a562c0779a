"""``pyptx.rows`` as a library: its settings are arguments, checked, and part of the kernel.

The row kernels' numerics and resources are in ``test_rowwise_kernels.py`` and their
byte-identical PTX in ``test_rowwise_golden.py``; here: ``Hints`` validation, every hint
reaching the PTX of a builder's kernel through its ``RowConfig``, no module-level switch, and
``RowConfig`` naming only valid plans.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from pyptx_kernels.rows import RowConfig

from pyptx import ConfigError
from pyptx import rows as rw


def rms():
    return importlib.import_module("pyptx_kernels.rows.rms_norm")


def test_hints_are_checked_where_they_are_made():
    assert rw.Hints() == rw.Hints(l2_load="", l2_store="", store="", pdl_prefetch=True, load="")
    with pytest.raises(ConfigError, match=r"test_rows\.py:\d+: l2_load must be '' or one of "
                                          r"\('evict_first'"):
        rw.Hints(l2_load="evict_soon")
    with pytest.raises(ConfigError, match=r"test_rows\.py:\d+: store must be one of .*got '\.zz'"):
        rw.Hints(store=".zz")
    with pytest.raises(ConfigError, match=r"load must be '' or ld\.global modifiers"):
        rw.Hints(load="nc")
    with pytest.raises(ConfigError, match="pdl_prefetch must be True or False"):
        rw.Hints(pdl_prefetch=1)
    with pytest.raises(ConfigError, match=r"test_rows\.py:\d+: RowConfig: l2_store must be"):
        RowConfig(l2_store="evict")


@pytest.mark.parametrize(("kw", "present", "absent"), [
    ({"load_cache": ".nc.L1::no_allocate"}, "ld.global.nc.L1::no_allocate.v4.f32", None),
    ({"store_cache": ".cs"}, "st.global.cs.v4.f32", None),
    ({"l2_load": "evict_first"}, "createpolicy.fractional.L2::evict_first.b64", None),
    ({"l2_store": "evict_last"}, "createpolicy.fractional.L2::evict_last.b64", None),
    ({"pdl_prefetch": False}, "griddepcontrol.wait", "cp.async.bulk.prefetch"),
])
def test_each_hint_is_a_config_field_and_changes_the_ptx(kw, present, absent):
    build = rms().build_rms_norm_fast
    plain = build(256, 4096, "f32", config=RowConfig()).ptx()
    hinted = build(256, 4096, "f32", config=RowConfig(**kw)).ptx()
    assert hinted != plain and present in hinted
    if absent:
        assert absent in plain and absent not in hinted
    assert build(256, 4096, "f32", config=RowConfig()).ptx() == plain  # nothing global changed


def test_no_module_switches_and_not_imported_by_pyptx():
    for name in ("L2_LOAD", "L2_STORE", "STORE", "PDL_PREFETCH"):
        assert not hasattr(rw, name), name
        for mod in (rw.access, rw.view, rw.ring, rw.pdl):
            assert not hasattr(mod, name), (mod.__name__, name)
    code = "import sys, pyptx; assert 'pyptx.rows' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plan_errors_name_the_callers_line():
    with pytest.raises(Exception, match=r"test_rows\.py:\d+: t: N=40000 is not supported"):
        rw.plan_rows(2, 40000, rw.dtype_of("f32", "t"), who="t")


def test_row_config_names_valid_plans_only():
    assert [RowConfig(**kw).plan for kw in ({}, dict(ctas=8), dict(ctas=8, stages=2),
                                            dict(bulk=True))] == ["row", "persistent", "ring",
                                                                  "bulk"]
    assert RowConfig(chunks=2, pdl=False).kwargs == {"chunks": 2, "pdl": False}
    assert RowConfig(**RowConfig(ctas=4, stages=3).kwargs) == RowConfig(ctas=4, stages=3)
    assert RowConfig(store_cache=".cs").hints == rw.Hints(store=".cs")
    for kw, why in [(dict(stages=3), "needs ctas=P too"), (dict(ctas=2, stages=1), "stages >= 2"),
                    (dict(bulk_store=True), "bulk_store=True writes back"),
                    (dict(ctas=2, stages=2, welford=True), "drop stages"),
                    (dict(ctas=2, stages=2, rows=2), "drop rows"),
                    (dict(bulk=True, ctas=2), "drop ctas"), (dict(pdl=1), "True or False")]:
        with pytest.raises(ConfigError, match=rf"test_rows\.py:\d+: .*{why}"):
            RowConfig(**kw)
    for kw in (dict(ctas=0), dict(chunks=True), dict(threads=2.0)):
        with pytest.raises(Exception, match=r"test_rows\.py:\d+: RowConfig: .* must be a positive"):
            RowConfig(**kw)
    with pytest.raises(AttributeError):
        RowConfig().ctas = 2  # frozen


def test_builders_refuse_fields_their_kernel_does_not_take():
    sm = importlib.import_module("pyptx_kernels.rows.softmax")
    with pytest.raises(ConfigError, match=r"test_rows\.py:\d+: build_softmax_fast: "
                                          r"RowConfig\(ctas=2, stages=2\) sets stages"):
        sm.build_softmax_fast(4, 64, "f32", config=RowConfig(ctas=2, stages=2))
    with pytest.raises(ConfigError, match="build_rms_norm_bwd: .* sets pdl"):
        rms().build_rms_norm_bwd(4, 64, "f32", config=RowConfig(pdl=False))
    with pytest.raises(ConfigError, match="config must be a RowConfig"):
        rms().build_rms_norm_fast(4, 64, "f32", config={"ctas": 2})


def test_package_exports_config_and_builders_not_functions():
    import pyptx_kernels.rows as rows

    assert rows.RowConfig is RowConfig
    assert rows.build_rms_norm_fast is rms().build_rms_norm_fast
    for op in ("rms_norm", "layer_norm", "softmax", "swiglu"):
        importlib.import_module(f"pyptx_kernels.rows.{op}")
        assert type(getattr(rows, op)).__name__ == "module", op  # never the api function
    code = ("import sys, pyptx_kernels.rows.api; "
            "assert 'pyptx_kernels.rows.rms_norm' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
