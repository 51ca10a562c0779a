"""Trace + emit time of the examples (pure Python, no GPU).

Each row builds the kernel object fresh (no specialization cache hit) and
times ``builder(**params).ptx()``: tracing the body and printing the PTX.
Prints the median and best of several repeats.

    python benchmarks/trace.py [--repeats 21]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    ("examples/hopper/rms_norm.py", "build_rms_norm", {"B": 2048, "N": 8192}),
    ("examples/hopper/rms_norm.py", "build_rms_norm", {"B": 16, "N": 512}),
    ("examples/vector_add.py", "build_vector_add", {"N": 1 << 20}),
    ("examples/block_reduce.py", "build_block_sum", {"B": 1024, "N": 8192}),
    ("examples/transpose.py", "build_transpose", {"M": 4096, "N": 4096}),
    ("examples/hopper/softmax.py", "build_softmax", {"B": 2048, "N": 8192}),
    # tensor-core kernels (issue 15's target: the GEMM under 10 ms)
    ("examples/hopper/gemm.py", "build_gemm", {"M": 8192, "N": 8192, "K": 8192}),
    ("examples/hopper/grouped_gemm.py", "build_grouped", {"M": 16384, "N": 4096, "K": 4096, "G": 8}),
    ("examples/hopper/flash_attention.py", "build_attention",
     {"B": 4, "S": 8192, "Hq": 16, "Hkv": 16, "D": 128, "causal": True}),
]


def _load(rel: str):
    path = ROOT / rel
    spec = importlib.util.spec_from_file_location(path.stem + "_bench", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    spec.loader.exec_module(mod)
    return mod


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
    for rel, name, params in CASES:
        if not (ROOT / rel).exists():
            continue
        builder = getattr(_load(rel), name)
        med, best, lines = time_case(builder, params, args.repeats)
        label = f"{Path(rel).stem}({', '.join(f'{k}={v}' for k, v in params.items())})"
        rows.append((label, lines, med, best))
        print(f"{label:<40} {lines:>9} {med:>10.2f} {best:>8.2f}")
    largest = max(rows, key=lambda r: r[1])
    print(f"\nlargest example: {largest[0]}, {largest[1]} PTX lines, median {largest[2]:.2f} ms")
    print(f"target: RMSNorm B=2048 N=8192 under 15 ms -> {rows[0][2]:.2f} ms")
    gemm = [r for r in rows if r[0].startswith("gemm(")]
    if gemm:
        print(f"target: GEMM 8192^3 (default configuration) under 10 ms -> {gemm[0][2]:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
