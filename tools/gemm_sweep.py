"""Time GEMM tile configurations (ours only, plus cuBLAS once per shape) with do_bench,
to choose defaults and autotuning candidates. Prints TFLOP/s per (shape, config).

    python tools/gemm_sweep.py 4096 8192x28672x8192 --configs '[{"BN":256,"cluster":2}]'
"""
import argparse
import json
from pathlib import Path

import torch
from triton.testing import do_bench

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
gemm = load_module(ROOT / "examples/hopper/gemm.py", "gemm_example")

p = argparse.ArgumentParser()
p.add_argument("shapes", nargs="+")
p.add_argument("--configs", default="[null]")
p.add_argument("--rep", type=int, default=100)
p.add_argument("--trans-b", action="store_true")
a = p.parse_args()
configs = json.loads(a.configs)
for s in a.shapes:
    M, N, K = (int(v) for v in s.split("x")) if "x" in s else (int(s),) * 3
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).T if a.trans_b else \
        torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    fl = 2.0 * M * N * K
    cub = fl / do_bench(lambda x=x, w=w: torch.matmul(x, w), rep=a.rep, return_mode="median") / 1e9
    ref = torch.matmul(x.float(), w.float())
    for cfg in configs:
        try:
            d = gemm.matmul(x, w, config=cfg)
            err = ((d.float() - ref).norm() / ref.norm()).item()
            t = do_bench(lambda x=x, w=w, cfg=cfg: gemm.matmul(x, w, config=cfg), rep=a.rep, return_mode="median")
            print(f"{s:>16} {json.dumps(cfg):50} {fl / t / 1e9:7.1f} TF  cuBLAS {cub:6.1f}  "
                  f"x{fl / t / 1e9 / cub:.3f} err {err:.1e}", flush=True)
        except Exception as e:  # a config that does not build or launch
            print(f"{s:>16} {json.dumps(cfg):50} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
