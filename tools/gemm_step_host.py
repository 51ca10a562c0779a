"""Host time of a GEMM training step (``matmul(x, w.T)`` + ``backward``) against torch
autograd of ``x @ w.T``: back-to-back calls, synchronised at the end, median of rounds;
the forward alone beside it; then a cProfile of ours (top entries by own time, then by cumulative time).

    python tools/gemm_step_host.py [--size 2048] [--calls 200]
"""
import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]


def contenders(gemm, torch, n):
    """Zero-argument calls at ``n``: a step of each side, and each side's forward alone."""
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    xd, wd = x.detach(), w.detach()

    def step(mm):
        x.grad = w.grad = None
        mm(x, w).backward(dy)

    return {"pyptx step": lambda: step(lambda p_, q_: gemm.matmul(p_, q_.T)),
            "torch step": lambda: step(lambda p_, q_: p_ @ q_.T),
            "pyptx fwd": lambda: gemm.matmul(xd, wd.T),
            "torch fwd": lambda: xd @ wd.T}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, nargs="+", default=[2048, 512])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    import torch

    gemm = load_module(ROOT / "examples/hopper/gemm.py", "gemm_step_host")
    for n in a.size:
        fns = contenders(gemm, torch, n)
        for f in fns.values():
            for _ in range(10):
                f()
        torch.cuda.synchronize()
        t = {k: [] for k in fns}
        for _ in range(a.rounds):
            for k, f in fns.items():
                torch.cuda.synchronize()
                s = time.perf_counter()
                for _ in range(a.calls):
                    f()
                torch.cuda.synchronize()
                t[k].append((time.perf_counter() - s) / a.calls * 1e6)
        print(f"n={n}: " + "  ".join(f"{k} {statistics.median(v):.1f} us" for k, v in t.items()),
              flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.calls):
        fns["pyptx step"]()
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(35)
    return 0


if __name__ == "__main__":
    sys.exit(main())
