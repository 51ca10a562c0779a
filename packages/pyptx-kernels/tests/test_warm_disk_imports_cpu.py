"""A first call in a new process whose family code is on disk (issue 46's warm-disk first call)
loads no tracing code: ``pyptx.reg``, ``pyptx.smem``, the ``pyptx.ptx`` helpers and the
kernel bodies' modules are imported only by a trace. Each case runs the public op twice, in
fresh processes on one ``PYPTX_CACHE_DIR`` (the first traces and stores the family), on CPU
tensors with the library's CUDA check lifted, up to pyptx's placement check at the launch
(as ``tools/cold_start.py`` does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

# ``pyptx.operand`` is not here: the GEMM builders read their operand tiles' geometry and
# tensor-map options at build time, and it imports the tracing layer (reg, smem) only in the
# methods that emit code.
TRACING = ("pyptx.reg", "pyptx.smem", "pyptx.imm", "pyptx.ptx", "pyptx.warpspec",
           "pyptx.pipeline", "pyptx.fragment", "pyptx.rows.access",
           "pyptx_kernels.flash_attention.fwd_mainloop", "pyptx_kernels.flash_attention.masks",
           "pyptx_kernels.flash_attention.fwd_scheduler", "pyptx_kernels.gemm.mainloop",
           "pyptx_kernels.gemm.epilogue", "pyptx_kernels.grouped_gemm.epilogue",
           "pyptx_kernels.fp8_gemm.mainloop", "pyptx_kernels.fp8_gemm.epilogue")

CHILD = textwrap.dedent("""
    import json, sys
    import torch
    import pyptx_kernels as pk
    from pyptx_kernels import _common, _family

    _common.check_devices = lambda *a, **k: None
    _common.EAGER_DEVICES = ("cuda", "cpu")
    bf = torch.bfloat16
    op = sys.argv[1]
    if op == "rms_norm":
        args, kw = (torch.empty(100, 1024, dtype=bf), torch.empty(1024, dtype=bf)), {}
    elif op == "matmul":
        args, kw = (torch.empty(200, 256, dtype=bf), torch.empty(512, 256, dtype=bf).T), {}
    elif op == "grouped_mm":
        offs = torch.tensor([100, 256], dtype=torch.int32)
        args, kw = (torch.empty(256, 128, dtype=bf), torch.empty(2, 128, 256, dtype=bf),
                    offs), {}
    elif op == "scaled_mm":
        one = torch.ones(1)
        args = (torch.empty(200, 256, dtype=torch.float8_e4m3fn),
                torch.empty(512, 256, dtype=torch.float8_e4m3fn).T, one, one)
        kw = {}
    else:
        q = torch.empty(1, 256, 4, 128, dtype=bf)
        args, kw = (q, q.clone(), q.clone()), {"causal": True}
    try:
        getattr(pk, op)(*args, **kw)
        why = "no error"
    except Exception as e:  # pyptx's placement check, at the launch
        why = str(e)
    print("RESULT " + json.dumps(dict(why=why, family=_family.stats(),
                                      loaded=sorted(m for m in sys.modules if m in TRACING))))
""")


def _run(op: str, cache: str) -> dict:
    env = dict(os.environ, PYPTX_CACHE_DIR=cache)
    code = f"TRACING = {TRACING!r}\n{CHILD}"
    out = subprocess.run([sys.executable, "-c", code, op], env=env, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.split("RESULT ", 1)[1])


@pytest.mark.parametrize("op", ["rms_norm", "attention", "matmul", "grouped_mm", "scaled_mm"])
def test_a_warm_disk_first_call_loads_no_tracing_code(op, tmp_path):
    first = _run(op, str(tmp_path))
    assert first["family"]["traced"] >= 1 and "on cpu" in first["why"], first
    warm = _run(op, str(tmp_path))
    assert warm["family"]["traced"] == 0 and warm["family"]["loaded"] >= 1, warm
    assert "on cpu" in warm["why"], warm   # it got as far as the launch
    assert warm["loaded"] == [], warm
