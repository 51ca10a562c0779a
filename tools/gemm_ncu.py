"""Launches for an ncu comparison of the pyptx GEMM (its tuned default) and cuBLAS at a few
shapes: each twice after a warm-up; the kernel names ncu prints say which tile shape, stage
count and cluster cuBLAS picked.

    ncu --metrics ... -k regex:"gemm|nvjet|xmma" python tools/gemm_ncu.py 4096 8192x28672x8192
"""
import sys
from pathlib import Path

import torch

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
gemm = load_module(ROOT / "examples/hopper/gemm.py", "gemm_ncu")

for s in sys.argv[1:] or ["4096"]:
    M, N, K = (int(v) for v in s.split("x")) if "x" in s else (int(s),) * 3
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):          # warm-up: tuning, compile, cuBLAS heuristics
        gemm.matmul(x, w)
        torch.matmul(x, w)
    torch.cuda.synchronize()
    for _ in range(2):
        gemm.matmul(x, w)
        torch.matmul(x, w)
    torch.cuda.synchronize()
    print(s, "done", flush=True)
