"""The D=128 ordered bulk-dQ backward with 128-row q blocks (``dkdv_bq=128, atomic_dq=1,
dq_bulk=1, dq_ordered=1``: ``build_dkdv(BQ=128)``, dS and the dQ slabs in the block's own
ring stage) on the CPU: ``ptxsim`` runs the prep, dK/dV and conversion kernels' PTX against
float64, with every output poisoned. Causal and full, ragged lengths, grouped-query heads,
``Sk != S``, both dtypes; and the checks that cost no simulation: ptxas keeps the wgmma
asynchronous and does not spill, bad options fail at the caller's line.
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
WIDE = dict(dkdv_bq=128, atomic_dq=True, dq_bulk=True, dq_ordered=True)


def _simulate(bwd, inputs):
    """The prep, dK/dV and conversion kernels in the simulator: ``(dq, dk, dv)`` bits."""
    q, k, v, o, lse, do = inputs
    prep, dkdv, convert = bwd.kernels
    # DQACC is left unwritten by prep (each tile's first add stores it): not poisoned
    stats, acc, sem = ptxsim.run(prep.specialize(), [o, lse, do], poison=False)
    dk, dv = ptxsim.run(dkdv.specialize(), [q, k, v, do, stats, acc, sem], inplace=True)
    (dq,) = ptxsim.run(convert.specialize(), [acc])
    return dq, dk, dv


@pytest.mark.parametrize("S,Sk,Hq,Hkv,causal,dt", [
    (300, 300, 2, 1, True, "bf16"),     # causal chain from the diagonal down, GQA, refills
    (300, 200, 2, 1, False, "bf16"),    # ascending order (a wavefront), Sk < S
    (200, 300, 3, 1, True, "bf16"),     # causal, a kv block with no q block (Sk > S)
    (200, 300, 2, 2, False, "f16"),     # ascending, Sk > S
    (130, 130, 2, 2, True, "f16"),
    (520, 260, 4, 1, False, "bf16"),    # 20 blocks per CTA through 2 stages
])
def test_bq128_backward_matches_float64(S, Sk, Hq, Hkv, causal, dt):
    """Ring refills (2 stages, each released by the dQ writer after its adds), ordered
    chains over several kv blocks, ragged ends on both sides."""
    B, D = 1, 128
    inputs, grads = _reference(B, S, Sk, Hq, Hkv, D, causal, S + Sk + causal, dt)
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, D, Sk=Sk, dtype=dt, causal=causal,
                                       **WIDE)
    assert bwd.dkdv_kernel.name.endswith("_ordered_bq128")
    for name, got, ref in zip(("dq", "dk", "dv"), _simulate(bwd, inputs), grads):
        err = np.linalg.norm(_f64(got, dt) - ref) / np.linalg.norm(ref)
        assert err < TOL[dt], (name, err)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("S", [4096, 8192])
def test_bq128_keeps_wgmma_asynchronous(S, causal, assemble):
    """At the benchmark's sizes ptxas neither serialises the kernel's wgmma nor injects
    fences (C751x notes), nor spills."""
    k = fab.build_attention_backward(32768 // S, S, 16, 16, 128, causal=causal,
                                     **WIDE).dkdv_kernel
    log = assemble(k.ptx())
    assert "(C751" not in log, log
    assert "0 bytes spill stores" in log, log


@pytest.mark.parametrize("kw,D,match", [
    (dict(WIDE, dq_ordered=False), 128, "BQ=128 is the D=128 ordered"),
    (WIDE, 64, "BQ=128 is the D=128 ordered"),
    (dict(dkdv_bq=128), 128, "BQ=128 is the D=128 ordered"),
    (dict(WIDE, safe=True), 128, "BQ=128 is the D=128 ordered"),
    (dict(WIDE, dkdv_bq=96), 128, "dkdv_bq must be 32, 64 or 128"),
])
def test_bq128_bad_options_name_the_callers_line(kw, D, match):
    with pytest.raises(ConfigError, match=match) as e:
        fab.build_attention_backward(1, 256, 2, 2, D, **kw)
    assert str(e.value).startswith(f"{__file__}:")


def test_bq128_is_an_option_of_the_command_lines():
    assert fab.parse_options("dkdv_bq=128,atomic_dq=1,dq_bulk=1,dq_ordered=1") == WIDE
