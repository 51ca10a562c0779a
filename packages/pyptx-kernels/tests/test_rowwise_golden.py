"""The row kernels emit the recorded PTX, byte for byte.

``golden/rowwise/`` holds the PTX of each case (``manifest.json``: builder, shape, dtype,
keywords, and the old module switches that were set: ``L2_LOAD``, ``L2_STORE``, ``STORE``,
``PDL_PREFETCH``), first recorded from ``examples/hopper``'s old ``_rowwise.py`` and
re-recorded once for the runtime row count (the ``nrows`` kernel parameter, the persistent
loops striding by ``%nctaid.x``: PTX that does not depend on ``B``). Each case is rebuilt
with its keywords and switches as the fields of a ``RowConfig`` (none: ``RowConfig()``, the
one-row plan). After an intended PTX change, ``PYPTX_UPDATE_GOLDEN=1`` rewrites the files.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest
from pyptx_kernels.rows import RowConfig

GOLDEN = Path(__file__).resolve().parent / "golden" / "rowwise"
CASES = json.loads((GOLDEN / "manifest.json").read_text())
#: the old module switches -> the RowConfig fields
SWITCHES = {"L2_LOAD": "l2_load", "L2_STORE": "l2_store", "STORE": "store_cache",
            "PDL_PREFETCH": "pdl_prefetch"}


def builders():
    rms = importlib.import_module("pyptx_kernels.rows.rms_norm")
    ln = importlib.import_module("pyptx_kernels.rows.layer_norm")
    sm = importlib.import_module("pyptx_kernels.rows.softmax")
    sw = importlib.import_module("pyptx_kernels.rows.swiglu")
    return {"rms_norm": rms.build_rms_norm_fast, "layer_norm": ln.build_layer_norm,
            "softmax": sm.build_softmax_fast, "swiglu": sw.build_swiglu,
            "rms_norm_bwd": rms.build_rms_norm_bwd, "layer_norm_bwd": ln.build_layer_norm_bwd}


def case_id(c):
    kw = ",".join(f"{k}={v}" for k, v in {**c["kwargs"], **c["globals"]}.items())
    return f"{c['builder']}-{c['dtype']}-{c['B']}x{c['N']}" + (f"-{kw}" if kw else "")


def test_manifest_covers_every_builder_and_variant():
    assert len(CASES) >= 150
    assert {c["builder"] for c in CASES} == set(builders())
    seen = {tuple(sorted(c["kwargs"])) for c in CASES}
    for variant in (("ctas",), ("ctas", "stages"), ("bulk_store", "ctas", "stages"),
                    ("bulk", "threads"), ("chunks",), ("pdl",)):
        assert variant in seen, variant
    assert {k for c in CASES for k in c["globals"]} == set(SWITCHES)


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_ptx_is_byte_identical(case):
    build = builders()[case["builder"]]
    kwargs = dict(case["kwargs"])
    kwargs.update({SWITCHES[k]: v for k, v in case["globals"].items()})
    built = build(case["B"], case["N"], case["dtype"], config=RowConfig(**kwargs))
    kernels = list(built.kernels) if hasattr(built, "kernels") else [built]
    assert len(kernels) == len(case["files"])
    for k, name in zip(kernels, case["files"]):
        got = k.ptx()
        if os.environ.get("PYPTX_UPDATE_GOLDEN") == "1":
            (GOLDEN / name).write_text(got)
        want = (GOLDEN / name).read_text()
        assert got == want, f"{name}: PTX differs from the golden file ({case_id(case)})"
