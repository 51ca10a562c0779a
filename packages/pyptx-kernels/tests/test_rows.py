"""``pyptx.rows`` as a library: its settings are arguments, checked, and part of the kernel.

The row kernels' numerics and resources are in ``test_rowwise_kernels.py`` and their
byte-identical PTX in ``test_rowwise_golden.py``; here: ``Hints`` validation, every hint
reaching the PTX of a builder's kernel through its keyword, and no module-level switch.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

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
    with pytest.raises(ConfigError, match=r"rms_norm\.py:\d+: l2_store must be"):  # Hints' caller
        rms().build_rms_norm_fast(64, 1024, "f32", l2_store="evict")


@pytest.mark.parametrize(("kw", "present", "absent"), [
    ({"load_cache": ".nc.L1::no_allocate"}, "ld.global.nc.L1::no_allocate.v4.f32", None),
    ({"store_cache": ".cs"}, "st.global.cs.v4.f32", None),
    ({"l2_load": "evict_first"}, "createpolicy.fractional.L2::evict_first.b64", None),
    ({"l2_store": "evict_last"}, "createpolicy.fractional.L2::evict_last.b64", None),
    ({"pdl_prefetch": False}, "griddepcontrol.wait", "cp.async.bulk.prefetch"),
])
def test_each_hint_is_a_builder_keyword_and_changes_the_ptx(kw, present, absent):
    build = rms().build_rms_norm_fast
    plain = build(256, 4096, "f32").ptx()
    hinted = build(256, 4096, "f32", **kw).ptx()
    assert hinted != plain and present in hinted
    if absent:
        assert absent in plain and absent not in hinted
    assert build(256, 4096, "f32").ptx() == plain  # nothing global was left changed


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
