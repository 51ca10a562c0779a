"""Fixed cost against per-k-block cost of the small-N grouped forward, beside ``bmm``: times
``G x M x N x K`` for several K (do_bench, L2 flushed, interleaved rounds) so the intercept
(launch, start-up, epilogue) and the slope (the k-loop) of each contender can be compared.

    python tools/grouped_kscan.py [--shape 4x2048x256] [--ks 64 256 1024 2048]
"""
import argparse
from pathlib import Path

import torch

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
gg = load_module(ROOT / "examples/hopper/grouped_gemm.py", "grouped_gemm_kscan")
kscan = load_module(ROOT / "tools/gemm_kscan.py", "gemm_kscan_tool")   # its print_fit
CONFIGS = {
    "64x256 pf": dict(BM=64, BN=256, prefetch=True),
    "64x256 pf spec5": dict(BM=64, BN=256, prefetch=True, speculate=5),
    "128x128 c2 pf": dict(BM=128, BN=128, cluster=2, prefetch=True),
    "128x256": dict(BM=128, BN=256),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="4x2048x256")
    p.add_argument("--ks", type=int, nargs="+", default=[64, 256, 1024, 2048])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    G, Mg, N = (int(v) for v in a.shape.split("x"))
    M = G * Mg
    rows = {}
    for K in a.ks:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(G, K, N, device="cuda", dtype=torch.bfloat16)
        offs = gg.random_offsets([Mg] * G)
        x3 = x.view(G, Mg, K)
        fns = {"bmm": lambda x3=x3, w=w: torch.bmm(x3, w)}
        for name, cfg in CONFIGS.items():
            k = gg.build_grouped(M, N, K, G, b_major="MN", **cfg)
            fns[name] = lambda k=k, x=x, w=w, offs=offs: k(x, w, offs)
        ref = torch.bmm(x3.float(), w.float()).view(M, N)
        for name, fn in fns.items():
            err = ((fn().float().reshape(M, N) - ref).norm() / ref.norm()).item()
            assert err < 1e-2, f"K={K} {name}: rel err {err:.1e}"
        rows[K] = kscan.interleaved_us(fns, a.rounds, rep=50)
    kscan.print_fit(a.shape, rows, a.ks)

if __name__ == "__main__":
    main()
