"""CPU tests of benchmarks/attention.py and attention_decode.py: the sections and rows a
command line picks, the window's work ratio, the written tables, and the exit without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def ab():
    if not (BENCH / "attention.py").is_file():
        pytest.skip("benchmarks/ is not in this checkout (installed package tests)")
    return load_module(BENCH / "attention.py", "bench_attention")


def test_no_flag_runs_every_section(ab):
    assert ab.parse_args([]).sections == ["dense", "gqa", "window"]
    assert ab.parse_args(["--gqa"]).sections == ["gqa"]
    args = ab.parse_args(["--window", "--dense"])
    assert args.sections == ["dense", "window"] and args.window == 4096
    assert ab.parse_args(["--window", "1024"]).window == 1024


def test_dense_rows_default_and_quick(ab):
    rows = ab.dense_cases(ab.parse_args([]))
    assert len(rows) == 8 and (8, 4096, 32, 32, 64, "full") in rows
    assert all(B * S == 32768 and H * D == 2048 for B, S, H, _, D, _ in rows)
    quick = ab.dense_cases(ab.parse_args(["--quick"]))
    assert quick == [(8, 4096, 16, 16, 128, "full"), (8, 4096, 16, 16, 128, "causal")]
    assert ab.dense_cases(ab.parse_args(["--quick", "--dims", "64"]))[0][4] == 64


def test_gqa_rows_cover_groups_4_and_8_over_2k_to_16k(ab):
    rows = ab.gqa_cases(ab.parse_args(["--gqa"]))
    grouped = {(S, H // Hkv) for B, S, H, Hkv, D, mask in rows if D == 128 and mask == "causal"}
    assert {(S, g) for S in (2048, 4096, 8192, 16384) for g in (4, 8)} <= grouped
    assert any(D == 64 and H // Hkv > 1 for _, _, H, Hkv, D, _ in rows)
    assert all(H % Hkv == 0 for _, _, H, Hkv, _, _ in rows)
    quick = ab.gqa_cases(ab.parse_args(["--gqa", "--quick"]))
    assert 1 <= len(quick) < len(rows) and {c[4] for c in quick} == {64, 128}
    assert ab.gqa_cases(ab.parse_args(["--gqa", "--only-d", "64"])) == [
        c for c in rows if c[4] == 64]
    args = ab.parse_args(["--quick"])
    assert (args.rounds, args.pairs) == (2, 10)
    args = ab.parse_args([])
    assert (args.rounds, args.pairs) == (3, 20)


def test_window_work_ratio(ab):
    def count(S, W, causal):
        inside = sum(min(i, W) + 1 for i in range(S))
        return inside / (S * (S + 1) / 2 if causal else S * S)
    for S, W in ((100, 10), (64, 63), (64, 64), (50, 100), (1000, 1)):
        for causal in (True, False):
            assert ab.window_work(S, W, causal) == pytest.approx(count(S, W, causal))
    # the judged row: 4096 keys of 32768, about 1/8 of full attention (target 0.2)
    assert ab.window_work(32768, 4096, causal=False) == pytest.approx(0.117, abs=1e-3)
    assert ab.QUICK_WINDOW == (32768,) and 32768 in ab.WINDOW_SEQS


def test_out_holds_every_section(ab, monkeypatch, tmp_path):
    import types

    monkeypatch.setattr(ab, "gpu_missing", lambda script: None)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_device_name=lambda: "FAKE")))
    seen = []

    def table(args, cases, gqa, dev):
        seen.append(("gqa" if gqa else "dense", cases))
        return f"t{gqa}", ["a", "b"], [["1", "2"]], [dict(section="gqa" if gqa else "dense")]

    def window(args, dims, seqs, dev):
        seen.append(("window", dims, seqs))
        return "win", ["w"], [["3"]]
    monkeypatch.setattr(ab, "table_section", table)
    monkeypatch.setattr(ab, "window_section", window)
    out = tmp_path / "a.md"
    assert ab.main(["--quick", "--out", str(out)]) == 0
    assert [s[0] for s in seen] == ["dense", "gqa", "window"]
    assert seen[2][1:] == ([128], (32768,))
    text = out.read_text()
    assert "tFalse" in text and "tTrue" in text and "win" in text and "| 3 |" in text
    assert '"section": "gqa"' in out.with_suffix(".json").read_text()


@pytest.mark.parametrize("script", ["attention.py", "attention_decode.py"])
def test_without_a_gpu_they_say_why_and_exit_2(script):
    if not (BENCH / script).is_file():
        pytest.skip("benchmarks/ is not in this checkout")
    try:
        import torch
    except ImportError:
        pass  # the script must still say why it cannot run
    else:
        if torch.cuda.is_available():
            pytest.skip("a GPU is visible")
    r = subprocess.run([sys.executable, str(BENCH / script), "--quick"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "needs a CUDA GPU" in r.stderr or "needs torch" in r.stderr


def test_decode_rows_cover_batches_lengths_and_paged_caches():
    path = BENCH / "attention_decode.py"
    if not path.is_file():
        pytest.skip("benchmarks/ is not in this checkout")
    ad = load_module(path, "bench_attention_decode")
    batches = {B for B, _ in ad.FULL}
    lengths = {Sk for _, Sk in ad.FULL}
    assert min(batches) == 1 and max(batches) == 128
    assert min(lengths) == 1024 and max(lengths) == 32768
    assert all(Sk % ad.PAGE == 0 for _, Sk in ad.FULL)   # the paged column's whole pages
    assert set(ad.QUICK) <= set(ad.FULL)
