"""A newcomer's first runs on a machine without a GPU: every tensor-core example's
``__main__`` prints the launch geometry and the ptxas report the examples README promises,
with torch missing or present, and no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
HOPPER = sorted((ROOT / "examples" / "hopper").glob("*.py"))

_NO_TORCH = ("import runpy, sys; sys.modules['torch'] = None; sys.modules['pyptx_torch'] = None; "
             "sys.argv = [sys.argv[1]]; runpy.run_path(sys.argv[0], run_name='__main__')")


@pytest.mark.parametrize("torch", ["present", "missing"])
@pytest.mark.parametrize("path", HOPPER, ids=lambda p: p.name)
def test_example_main_without_a_gpu_prints_the_ptxas_report(path, torch, ptxas_path):
    try:
        import torch as _t

        if torch == "present" and _t.cuda.is_available():
            pytest.skip("a GPU is present: the example launches instead")
    except ImportError:
        if torch == "present":
            pytest.skip("torch is not installed")
    cmd = [sys.executable, str(path)] if torch == "present" else \
        [sys.executable, "-c", _NO_TORCH, str(path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-2000:]
    assert "Traceback" not in out and "ptxas sm_90a" in out and "registers" in out, out[-2000:]
