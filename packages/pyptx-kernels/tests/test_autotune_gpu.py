"""``pyptx.autotune`` on a GPU through torch: default calls time nothing, timing on request.

A default call (``PYPTX_AUTOTUNE`` unset) of ``matmul``, ``grouped_mm`` or a row builder
times nothing and logs nothing: a saved winner, else the shipped table's or the heuristic's
plan. With ``PYPTX_AUTOTUNE=1`` (or ``pyptx_kernels.tune``) a plain
``build_rms_norm_fast(B, N, dtype)`` (and LayerNorm, softmax, SwiGLU, the GEMM) times its
variants at the first launch with CUDA events, keeps the fastest, logs one line, writes the
choice to disk (reused by a fresh process's default call without timing), gives correct
results, and the winner assembles without spills; after tuning, calls go to the winner and
capture in a CUDA graph.

    pytest -m gpu packages/pyptx-kernels/tests/test_autotune_gpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from pyptx_kernels._modules import kernel_module

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

F = torch.nn.functional


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A fresh cache, timing asked for (the tests of the default call unset it)."""
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PYPTX_AUTOTUNE", "1")
    return tmp_path / "autotune"


@pytest.fixture
def fresh_tuners(monkeypatch):
    """No choice of an earlier test in this process: the row builders and the GEMM's tuned
    builders start with empty memos (a memoised ``TunedKernel`` remembers each device's
    choice, an earlier test's timed winner included), and the GEMM's kernel cache is empty.
    (Winners on disk are the ``cache`` fixture's: a fresh folder per test.)"""
    from pyptx_kernels.gemm import host

    rows = (mod("rms_norm").build_rms_norm_fast, mod("layer_norm").build_layer_norm,
            mod("softmax").build_softmax_fast, mod("swiglu").build_swiglu)
    for tuner in (*(b.tuner for b in rows), host.gemm_planned, host.gemm_tuned):
        monkeypatch.setattr(tuner, "_kernels", {})
    host._cached.cache_clear()
    yield
    host._cached.cache_clear()


@pytest.fixture
def no_timing(monkeypatch, fresh_tuners):
    """Default calls from a fresh start: ``PYPTX_AUTOTUNE`` unset, no earlier test's choice
    in the process, and any timing fails the test."""
    from pyptx.autotune import TorchTimer

    def refuse(self, *a, **k):
        raise AssertionError("a default call timed a kernel")

    monkeypatch.delenv("PYPTX_AUTOTUNE", raising=False)
    monkeypatch.setattr(TorchTimer, "measure", refuse)


def mod(name):
    return kernel_module(name)


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all()
    return ((out - ref).norm() / ref.norm()).item()


def rand(*shape, dt, scale=1.0, shift=0.0):
    return (torch.randn(*shape, device="cuda") * scale + shift).to(dt)


CASES = [(op, B, N, dt) for op in ("rms_norm", "layer_norm", "softmax", "swiglu")
         for B, N in ((256, 4096), (2048, 8192)) for dt in (torch.float32, torch.bfloat16)]


def call(op, B, N, dt):
    """(tuned kernel, inputs, float64 reference) of one op's default call."""
    if op == "rms_norm":
        k = mod("rms_norm").build_rms_norm_fast(B, N, dt, 1e-6)
        x, w = rand(B, N, dt=dt), rand(N, dt=dt, scale=0.1, shift=1.0)
        return k, (x, w), F.rms_norm(x.double(), (N,), w.double(), 1e-6)
    if op == "layer_norm":
        k = mod("layer_norm").build_layer_norm(B, N, dt, 1e-5)
        x, w, b = rand(B, N, dt=dt, shift=0.5), rand(N, dt=dt, shift=1.0), rand(N, dt=dt)
        return k, (x, w, b), F.layer_norm(x.double(), (N,), w.double(), b.double(), 1e-5)
    if op == "softmax":
        k = mod("softmax").build_softmax_fast(B, N, dt)
        x = rand(B, N, dt=dt, scale=3.0)
        return k, (x,), torch.softmax(x.double(), -1)
    k = mod("swiglu").build_swiglu(B, N, dt)
    g, u = rand(B, N, dt=dt, scale=3.0), rand(B, N, dt=dt)
    return k, (g, u), F.silu(g.double()) * u.double()


@pytest.mark.parametrize("op,B,N,dt", CASES)
def test_default_call_tunes_once_and_is_right(op, B, N, dt, cache, capsys):
    from pyptx.autotune import TunedKernel
    from pyptx.ptxas import check

    k, inputs, ref = call(op, B, N, dt)
    assert isinstance(k, TunedKernel)
    y = k(*inputs)
    tol = 1e-5 if dt == torch.float32 else 1e-2
    assert rel_err(y, ref) < tol
    c = k.choice
    assert c.source == "timed" and c.us > 0 and c.device == torch.cuda.get_device_name()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("pyptx.autotune")]
    assert len(lines) == 1 and f"(B={B}, N={N}" in lines[0] and f"{c.us:.1f} us" in lines[0]
    rec = json.loads(next(cache.glob("*.json")).read_text())
    assert rec["config"] == c.config.kwargs and len(rec["timed"]) >= 2
    assert min(t["us"] for t in rec["timed"]) == rec["us"]
    assert k(*inputs) is not None and capsys.readouterr().err == ""  # no second tuning
    for kk in (k.kernel.kernels if hasattr(k.kernel, "kernels") else [k.kernel]):
        for e in check(kk.specialize()).entries:
            assert e.spill_stores == e.spill_loads == 0, e


def test_a_new_process_reuses_the_winner_without_timing(cache, monkeypatch):
    code = (
        "import sys, torch; import pyptx_kernels.rows.rms_norm as m; "
        "k = m.build_rms_norm_fast(512, 4096, torch.bfloat16); "
        "x = torch.randn(512, 4096, device='cuda', dtype=torch.bfloat16); "
        "w = torch.ones(4096, device='cuda', dtype=torch.bfloat16); k(x, w); "
        "torch.cuda.synchronize(); print(k.choice.source, k.choice.config)")
    env = dict(os.environ, PYPTX_CACHE_DIR=str(cache.parent))
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           check=True)
    env.pop("PYPTX_AUTOTUNE")   # the second process makes a default call
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, check=True)
    assert first.stdout.split()[0] == "timed" and "pyptx.autotune:" in first.stderr
    assert second.stdout.split()[0] == "disk" and "pyptx.autotune:" not in second.stderr
    assert first.stdout.split(None, 1)[1] == second.stdout.split(None, 1)[1]


def test_switched_off_runs_the_first_config(monkeypatch, capsys):
    monkeypatch.setenv("PYPTX_AUTOTUNE", "0")
    k, inputs, ref = call("rms_norm", 256, 4096, torch.bfloat16)
    assert rel_err(k(*inputs), ref) < 1e-2
    assert k.choice.source == "first" and k.choice.config.kwargs == {}
    assert "pyptx.autotune" not in capsys.readouterr().err


def test_tuned_kernel_is_captured_in_a_cuda_graph():
    k, inputs, ref = call("softmax", 1024, 8192, torch.bfloat16)
    k(*inputs)  # tunes outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = k(*inputs)
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(y, ref) < 1e-2


@pytest.mark.parametrize("op", ["rms_norm", "softmax"])
def test_a_default_row_call_times_nothing(op, no_timing, cache, capsys):
    k, inputs, ref = call(op, 256, 4096, torch.bfloat16)
    assert rel_err(k(*inputs), ref) < 1e-2
    assert k.choice.source in ("default", "first") and k.choice.us is None
    assert "pyptx.autotune" not in capsys.readouterr().err and not cache.exists()


def _gemm_inputs(M, N, K):
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    return x, w, x.double() @ w.double().T


def _gemm_kernel(x, w):
    """The TunedKernel ``matmul(x, w.T)`` launches."""
    from pyptx_kernels.gemm import host

    plan = host._plan(x, w.T, None, 1.0, None, None, False, False, None, "torch")
    return host._cached(*plan.build)


@pytest.mark.parametrize("shape", [(37, 4096, 4096), (1000, 4096, 4096), (128, 8192, 8192)])
def test_a_default_matmul_takes_the_table_or_heuristic_plan_untimed(shape, no_timing, cache,
                                                                     capsys, poison_outputs):
    import pyptx_kernels
    from pyptx_kernels.gemm import host

    x, w, ref = _gemm_inputs(*shape)
    y = pyptx_kernels.matmul(x, w.T)
    assert rel_err(y, ref) < 1e-2
    k = _gemm_kernel(x, w)
    name, _ = host.PLANNER.choose(k.keyvals, torch.cuda.get_device_name())
    assert k.choice.source == "default" and k.choice.config.kwargs == {"config": name}
    assert "pyptx.autotune" not in capsys.readouterr().err and not cache.exists()


def test_tune_times_a_matmul_once_and_default_calls_then_take_the_winner(cache, monkeypatch,
                                                                         capsys):
    import pyptx_kernels

    monkeypatch.delenv("PYPTX_AUTOTUNE")
    x, w, ref = _gemm_inputs(517, 1024, 768)
    assert rel_err(pyptx_kernels.tune(pyptx_kernels.matmul, x, w.T), ref) < 1e-2
    k = _gemm_kernel(x, w)
    assert k.choice.source == "timed"
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("pyptx.autotune")]
    assert len(lines) == 1 and "build_gemm(M=517, N=1024, K=768" in lines[0]
    winner = k.choice.config
    assert rel_err(pyptx_kernels.matmul(x, w.T), ref) < 1e-2
    assert k.choice.config == winner and capsys.readouterr().err == ""
    rec = json.loads(next(cache.glob("*.json")).read_text())
    assert rec["config"] == winner.kwargs


def test_a_default_grouped_mm_times_nothing(no_timing, cache, capsys, poison_outputs):
    import pyptx_kernels
    from pyptx_kernels.grouped_gemm.reference import random_offsets, reference

    torch.manual_seed(0)
    a = torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4, 512, 384, device="cuda", dtype=torch.bfloat16) / 512 ** 0.5
    offs = random_offsets([300, 0, 500, 224])
    assert rel_err(pyptx_kernels.grouped_mm(a, b, offs), reference(a, b, offs)) < 1e-2
    assert "pyptx.autotune" not in capsys.readouterr().err and not cache.exists()


def test_precompile_loads_every_kernel_of_a_module_without_timing(no_timing, cache, capsys):
    import pyptx_kernels

    lin = pyptx_kernels.nn.Linear(512, 256, bias=False, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    pyptx_kernels.precompile(lin, x, backward=True)
    assert lin.weight.grad is None
    assert "pyptx.autotune" not in capsys.readouterr().err
    assert any(cache.parent.rglob("*.cubin")) or any(cache.parent.iterdir())
    y = lin(x)
    assert rel_err(y, x.double() @ lin.weight.double().T) < 1e-2
