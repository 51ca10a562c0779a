"""Trace + emit time of the kernel library's builders (pure Python, no GPU).

Each row builds the kernel object fresh (no specialization cache hit) and
times ``builder(**params).ptx()``: tracing the body and printing the PTX.
Prints the median and best of several repeats.

    python benchmarks/trace.py [--repeats 21]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from pyptx_kernels.rows.config import RowConfig  # noqa: E402

CASES = [  # (module, builder, parameters)
    ("pyptx_kernels.rows.softmax", "build_softmax", {"B": 2048, "N": 8192}),
    ("pyptx_kernels.rows.rms_norm", "build_rms_norm_fast",
     {"B": 2048, "N": 8192, "config": RowConfig()}),
    ("pyptx_kernels.rows.layer_norm", "build_layer_norm",
     {"B": 2048, "N": 8192, "config": RowConfig()}),
    # tensor-core kernels (the GEMM's target: under 10 ms)
    ("pyptx_kernels.gemm", "build_gemm", {"M": 8192, "N": 8192, "K": 8192}),
    ("pyptx_kernels.grouped_gemm", "build_grouped", {"M": 16384, "N": 4096, "K": 4096, "G": 8}),
    ("pyptx_kernels.flash_attention", "build_attention",
     {"B": 4, "S": 8192, "Hq": 16, "Hkv": 16, "D": 128, "causal": True}),
]


def time_case(builder, params: dict, repeats: int) -> tuple[float, float, int]:
    """Median and best ms of ``builder(**params).ptx()``, and the PTX line count."""
    text = builder(**params).ptx()
    samples = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        builder(**params).ptx()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples), min(samples), text.count("\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()
    print(f"{'kernel':<40} {'PTX lines':>9} {'median ms':>10} {'best ms':>8}")
    rows = []
    for module, name, params in CASES:
        builder = getattr(importlib.import_module(module), name)
        med, best, lines = time_case(builder, params, args.repeats)
        label = f"{name}({', '.join(f'{k}={v}' for k, v in params.items())})"
        rows.append((label, lines, med, best))
        print(f"{label:<40} {lines:>9} {med:>10.2f} {best:>8.2f}")
    largest = max(rows, key=lambda r: r[1])
    print(f"\nlargest example: {largest[0]}, {largest[1]} PTX lines, median {largest[2]:.2f} ms")
    gemm = [r for r in rows if r[0].startswith("build_gemm(")]
    if gemm:
        print(f"target: GEMM 8192^3 (default configuration) under 10 ms -> {gemm[0][2]:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
