"""Every ``GEMM_CONFIGS`` plan beside the default call and cuBLAS on the weight-gradient GEMMs
of Llama steps (``dY.T @ X``, both operands transposed views, K = the tokens) and issue 48's
shapes: what ``gemm.config._long_k_plan``'s rates come from (``docs/performance.md``).
do_bench medians of interleaved rounds in rotated order; a plan whose result is off by more
than 1e-2 relative is left out.

    python tools/gemm_plan_sweep.py [--tokens 8192] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

ISSUE_SHAPES = ((3000, 5000, 1000), (8192, 1024, 8192), (16384, 4096, 4096), (4096, 32000, 4096))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    import pyptx_kernels as pk
    import torch
    from gemm_model import gemms, layers
    from pyptx_kernels.gemm import host
    from pyptx_kernels.gemm.config import GEMM_CONFIGS, default_plan
    from triton.testing import do_bench

    cases = [(f"{m} {name} wgrad", gemms(a.tokens, fi, fo, torch)["wgrad"])
             for m in ("llama-2048", "llama3-8b") for name, fi, fo in layers(m)]
    for M, N, K in ISSUE_SHAPES:
        cases.append((f"issue {M}x{N}x{K}",
                      (torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                       torch.randn(K, N, device="cuda", dtype=torch.bfloat16))))
    print("| case | M x N x K | heuristic | cuBLAS | default | best plan | best | default / "
          "cuBLAS | best / cuBLAS | every plan |")
    print("|---|---|---|---:|---:|---|---:|---:|---:|---|", flush=True)
    for label, (x, y) in cases:
        M, K = x.shape
        N = y.shape[1]
        fns = {"default": lambda x=x, y=y: pk.matmul(x, y),
               "cuBLAS": lambda x=x, y=y: torch.matmul(x, y)}
        fns.update({c.name: (lambda c=c, x=x, y=y: host.matmul(x, y, config=c))
                    for c in GEMM_CONFIGS})
        want = x.float() @ y.float()
        for name in list(fns):
            out = fns[name]().float()
            if ((out - want).norm() / want.norm()).item() > 1e-2:
                del fns[name]
        names, ms = list(fns), {n: [] for n in fns}
        for r in range(a.rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                ms[n].append(do_bench(fns[n], warmup=10, rep=40))
        tf = {n: 2 * M * N * K / statistics.median(v) / 1e9 for n, v in ms.items()}
        plans = {n: v for n, v in tf.items() if n not in ("default", "cuBLAS")}
        best = max(plans, key=plans.get)
        every = " ".join(f"{n}={v:.0f}" for n, v in plans.items())
        print(f"| {label} | {M}x{N}x{K} | {default_plan(M, N, K)} | {tf['cuBLAS']:.0f} | "
              f"{tf['default']:.0f} | {best} | {tf[best]:.0f} | "
              f"{tf['default'] / tf['cuBLAS']:.3f} | {tf[best] / tf['cuBLAS']:.3f} | {every} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
