"""CPU tests of benchmarks/attention_varlen.py's helpers: the batches it builds, its FLOP
count, its float64 reference, and its command line without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks" / "attention_varlen.py"


@pytest.fixture(scope="module")
def av():
    if not BENCH.is_file():
        pytest.skip("benchmarks/ is not in this checkout (installed package tests)")
    return load_module(BENCH, "bench_attention_varlen")


def test_uniform_lengths(av):
    assert av.seq_lengths("uniform", 32768, 4096) == [4096] * 8
    assert av.seq_lengths("uniform", 1000, 4096) == [4096]


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_ragged_lengths_sum_to_the_tokens(av, seed):
    lengths = av.seq_lengths("ragged", 32768, 4096, seed)
    assert sum(lengths) == 32768 and all(1 <= s <= 8192 for s in lengths)
    assert len(set(lengths)) > 1
    assert lengths == av.seq_lengths("ragged", 32768, 4096, seed)  # fixed by the seed


def test_flops_count_every_sequence(av):
    assert av.flops([4, 2], H=3, D=8, causal=False) == 4.0 * 3 * 8 * (16 + 4)
    # causal: s * (s + 1) / 2 kept scores per head, 4 FLOPs per score and head dim
    assert av.flops([4], H=1, D=1, causal=True) == 4.0 * (4 * 5 / 2)


@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_a_row_by_row_softmax(av, causal):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    S, rows, H, D = 7, 3, 2, 4
    q, k, v = (torch.randn(n, H, D, generator=g) for n in (rows, S, S))
    out = av.reference(q, k, v, causal)
    assert out.shape == (rows, H, D) and out.dtype == torch.float64
    for i in range(rows):
        for h in range(H):
            keys = i + 1 if causal else S
            w = (k[:keys, h].double() @ q[i, h].double() / D ** 0.5).softmax(0)
            torch.testing.assert_close(out[i, h], w @ v[:keys, h].double())


def test_help_without_gpu():
    r = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 0 and "--lengths" in r.stdout
