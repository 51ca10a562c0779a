"""CPU tests of ``benchmarks/dispatch.py``'s issue-18 target lines and its no-GPU exit."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bench():
    return load_module(ROOT / "benchmarks" / "dispatch.py", "bench_dispatch_cpu_test")


def row(bench, name, samples, error=None):
    r = bench.Row(name)
    r.samples = list(samples)
    r.error = error
    return r


def test_a_target_passes_at_or_under_its_peer_and_fails_over_it(bench):
    peer = row(bench, "torch.add", [10.0, 11.0, 12.0])
    assert bench.Target("t", row(bench, "k", [9.0, 11.0, 13.0]), peer, 1.0).line().endswith("PASS")
    line = bench.Target("t", row(bench, "k", [11.0, 12.0, 13.0]), peer, 1.0).line()
    assert line.endswith("FAIL") and "12.00 vs 11.00 µs (1.09x; k vs torch.add)" in line
    assert bench.Target("t", row(bench, "k", [13.0]), peer, 1.2).line().endswith("PASS")


def test_an_unmeasured_target_says_why(bench):
    peer = row(bench, "torch.add", [10.0])
    broken = row(bench, "k", [], error="SpecError: no")
    assert bench.Target("t", broken, peer, 1.0).line() == "t: n/a (SpecError: no)"
    assert bench.Target("t", None, None, 1.0, "skipped").line() == "t: n/a (skipped)"


def test_without_a_gpu_nothing_is_measured(bench, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this checks the no-GPU exit")
    assert bench.main(["--targets", "--repeats", "7"]) == bench.EXIT_NO_GPU
    assert "no CUDA GPU" in capsys.readouterr().out
