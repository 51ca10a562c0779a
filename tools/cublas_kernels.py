"""The kernel cuBLAS launches for ``torch.matmul`` at each GEMM benchmark shape (bf16), by
the torch profiler: its name spells the tile, stage count and cluster shape.

    python tools/cublas_kernels.py [4096 8192x28672x8192 ...]
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

SHAPES = ["2048", "4096", "6144", "8192", "8192x28672x8192", "8192x8192x28672", "128x8192x8192"]
for s in sys.argv[1:] or SHAPES:
    M, N, K = (int(v) for v in s.split("x")) if "x" in s else (int(s),) * 3
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    torch.matmul(x, w)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.matmul(x, w)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    print(f"{s}: {names}", flush=True)
