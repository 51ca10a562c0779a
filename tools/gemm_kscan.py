"""Fixed cost against per-k-block cost of the GEMM beside cuBLAS: times ``M x N x K`` for
several K (do_bench, L2 flushed, interleaved rounds) and fits ``time = intercept + slope *
K/64``. The intercept holds what does not scale with K: launch, start-up, every tile's
pipeline fill and epilogue, and the last wave's idle SMs.

    python tools/gemm_kscan.py [--mn 4096x4096] [--ks 256 1024 4096] [--configs '[{...}]']
"""
import argparse
import json
import statistics
from pathlib import Path

import torch
from triton.testing import do_bench

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
gemm = load_module(ROOT / "examples/hopper/gemm.py", "gemm_kscan")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mn", default="4096x4096")
    p.add_argument("--ks", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--configs", default='[{"BM": 128, "BN": 256, "cluster": 2}]')
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    M, N = (int(v) for v in a.mn.split("x"))
    configs = json.loads(a.configs)
    rows = {}
    for K in a.ks:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        fns = {"cuBLAS": lambda x=x, w=w: torch.matmul(x, w)}
        for c in configs:
            fns[json.dumps(c)] = lambda c=c, x=x, w=w: gemm.matmul(x, w, config=c)
        ref = torch.matmul(x.float(), w.float())
        for name, fn in fns.items():
            err = ((fn().float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, f"K={K} {name}: rel err {err:.1e}"
        rows[K] = interleaved_us(fns, a.rounds, rep=60)
    print_fit(f"{M}x{N}xK bf16", rows, a.ks)


def interleaved_us(fns, rounds, rep):
    """Median microseconds of each function: ``do_bench`` medians over ``rounds`` rounds,
    the order rotating from round to round."""
    t = {n: [] for n in fns}
    keys = list(fns)
    for r in range(rounds):
        for n in keys[r % len(keys):] + keys[:r % len(keys)]:
            t[n].append(do_bench(fns[n], rep=rep, return_mode="median") * 1e3)
    return {n: statistics.median(v) for n, v in t.items()}


def print_fit(title, rows, ks):
    """A markdown table of ``rows[K][contender]`` (microseconds) with each contender's
    least-squares ``intercept + slope * K/64``."""
    print(f"# {title}: microseconds per call (do_bench median)")
    print("| contender | " + " | ".join(f"K={k}" for k in ks) + " | slope us/k-block | intercept us |")
    print("|---" * (len(ks) + 3) + "|")
    for n in rows[ks[0]]:
        ys = [rows[k][n] for k in ks]
        xs = [k / 64 for k in ks]
        mx, my = statistics.mean(xs), statistics.mean(ys)
        slope = sum((u - mx) * (v - my) for u, v in zip(xs, ys)) / sum((u - mx) ** 2 for u in xs)
        print(f"| {n} | " + " | ".join(f"{y:.1f}" for y in ys) + f" | {slope:.3f} | {my - slope * mx:.1f} |")


if __name__ == "__main__":
    main()
