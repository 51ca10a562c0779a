"""The row-kernel device probes' bookkeeping, on the CPU: ``tools/rowwise_gap.py`` splits a
``flush; fn()`` trace into kernel time and launch gap, ``tools/rowwise_ncu.py`` turns ncu's raw
CSV into one table per cell (its NVTX ranges name the contender; the flush has none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def gap():
    return load_module(ROOT / "tools" / "rowwise_gap.py", "test_rowwise_gap")


@pytest.fixture(scope="module")
def ncu():
    return load_module(ROOT / "tools" / "rowwise_ncu.py", "test_rowwise_ncu")


def test_split_trace_sums_each_iterations_kernels_and_its_gap(gap):
    spans = [("warm", 0.0, 1.0),                      # before the first flush: not counted
             ("fill", 10.0, 20.0), ("ours", 21.5, 31.5),
             ("fill", 40.0, 50.0), ("a", 49.7, 52.0), ("b", 53.0, 55.0),   # PDL: starts early
             ("fill", 60.0, 70.0)]                    # nothing after it: not counted
    busy, gaps = gap.split_trace(spans, lambda n: n == "fill")
    assert busy == pytest.approx([10.0, 4.3])
    assert gaps == pytest.approx([1.5, -0.3])


def test_split_trace_of_a_trace_without_flushes_is_empty(gap):
    assert gap.split_trace([("ours", 0.0, 1.0)], lambda n: n == "fill") == ([], [])


def test_ncu_summary_medians_per_contender(ncu, tmp_path, capsys):
    head = ["ID", "Kernel Name", "thread Domain:Push/Pop_Range:PL_Type:PL_Value",
            "gpu__time_duration.sum", "launch__registers_per_thread"]
    units = ["", "", "", "nsecond", "register/thread"]
    rows = [["0", "vectorized_elementwise_kernel<FillFunctor>", "", "90000", "16"]]
    for i, (who, ns) in enumerate([("ours", 35000), ("triton", 34000), ("ours", 37000),
                                   ("triton", 36000), ("ours", 36000), ("triton", 35000)]):
        rows.append([str(i + 1), f"k_{who}", f"layer_norm:f32:2048x8192/{who}:none", str(ns),
                     "64"])
    path = tmp_path / "raw.csv"
    path.write_text("\n".join(",".join(f'"{c}"' for c in r) for r in [head, units] + rows))
    assert ncu.summarize(str(path)) == 0
    out = capsys.readouterr().out
    assert "## layer_norm:f32:2048x8192" in out
    ours = next(line for line in out.splitlines() if line.startswith("| ours |"))
    triton = next(line for line in out.splitlines() if line.startswith("| triton |"))
    assert ours.split("|")[2].strip() == "36" and triton.split("|")[2].strip() == "35"
    assert "FillFunctor" not in out
