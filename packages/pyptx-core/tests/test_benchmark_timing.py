"""benchmarks/_timing.py, the helpers the benchmarks share: tables, statistics, host timing,
and that dispatch.py, memory_bound.py and cold_start.py use them rather than copies."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"


def _load(name: str):
    path = BENCH / f"{name}.py"
    if not path.is_file():
        pytest.skip("benchmarks/ is not in this checkout (installed package tests)")
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def timing():
    return _load("_timing")


def test_markdown_table_pads_every_column_to_its_widest_cell(timing):
    lines = timing.markdown_table(["a", "long head"], [["xyz", "1"], ["", "22"]])
    assert lines == ["| a   | long head |", "|-----|-----------|", "| xyz | 1         |",
                     "|     | 22        |"]
    assert timing.markdown_table(["h"], []) == ["| h |", "|---|"]


def test_median_min_max(timing):
    assert timing.median_min_max([3.0, 1.0, 2.0, 10.0]) == (2.5, 1.0, 10.0)
    assert timing.median_min_max([]) is None


def test_host_timers_count_calls_and_the_final_wait(timing):
    calls = []
    per_call, wait = timing.host_us_per_call(lambda: calls.append(1) or len(calls), lambda r: r, 50)
    assert len(calls) == 50 and per_call > 0 and 0 <= wait < 1
    assert timing.enqueue_us_per_call(lambda: None, lambda r: None, 10) > 0


def test_benchmarks_use_the_shared_helpers(timing):
    for name, shared in (("dispatch", ("host_us_per_call", "enqueue_us_per_call", "markdown_table")),
                         ("memory_bound", ("interleaved", "rotated")),
                         ("cold_start", ("markdown_table", "median_min_max"))):
        mod = _load(name)
        for fn in shared:
            assert getattr(mod, fn).__module__ == "_timing", (name, fn)


def test_paired_ratio_is_the_median_of_per_round_ratios():
    """``pyptx.testing.paired_ratio``: base ms over other ms per round, then the median and
    quartiles: one slow round of both (a clock drop) does not move it."""
    from pyptx.testing import paired_ratio

    times = {"base": [2.0, 2.0, 2.2, 4.0, 2.0], "other": [1.0, 1.0, 1.0, 2.0, 1.0]}
    mid, lo, hi = paired_ratio(times, "base", "other")
    assert (mid, lo, hi) == (2.0, 2.0, 2.0)
    assert paired_ratio(times, "other", "base")[0] == 0.5


TENSOR_CORE_BENCHMARKS = ["gemm", "gemm_backward", "grouped_gemm", "fp8_gemm", "attention",
                          "attention_varlen"]


@pytest.mark.parametrize("name", TENSOR_CORE_BENCHMARKS)
def test_gpu_benchmarks_explain_a_missing_gpu(name, capsys):
    """Without a GPU each tensor-core benchmark says why in one line and exits 2 (not a
    traceback); its --help works anywhere."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    mod = _load(name)
    try:
        assert mod.main([]) == 2
        err = capsys.readouterr().err
        assert f"{name}.py" in err and "needs a CUDA GPU" in err and len(err.splitlines()) == 1
        with pytest.raises(SystemExit) as e:
            mod.main(["--help"])
        assert e.value.code == 0 and "usage" in capsys.readouterr().out
    finally:
        sys.modules.pop(f"bench_{name}", None)


def test_gpu_missing_names_triton(timing, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton fails
    monkeypatch.setitem(sys.modules, "triton.testing", None)
    assert "needs Triton" in timing.gpu_missing("x.py")
    assert timing.gpu_missing("x.py", triton=False) is None
