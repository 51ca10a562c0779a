"""One GEMM configuration on its own (for a time-boxed device check of a new tile shape):
its error against float32 at a small ragged and a large shape, then do_bench TFLOP/s beside
cuBLAS at the given shapes.

    timeout 60 python tools/gemm_try.py '{"BM": 192, "BN": 192, "cluster": 1}' 8192x28672x8192
    PYPTX_GEMM_DTYPE=f16 timeout 60 python tools/gemm_try.py '{...}' 6144    # f16 inputs
"""
import json
import os
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

from pyptx.testing import load_module

gemm = load_module(Path(__file__).resolve().parents[1] / "examples/hopper/gemm.py", "gemm_try")
cfg = json.loads(sys.argv[1])
dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[os.environ.get("PYPTX_GEMM_DTYPE", "bf16")]
for s in ["1000x1500x520"] + sys.argv[2:]:
    M, N, K = (int(v) for v in s.split("x")) if "x" in s else (int(s),) * 3
    x = torch.randn(M, K, device="cuda", dtype=dtype)
    w = torch.randn(K, N, device="cuda", dtype=dtype)
    d = gemm.matmul(x, w, config=cfg)
    torch.cuda.synchronize()
    ref = torch.matmul(x.float(), w.float())
    err = ((d.float() - ref).norm() / ref.norm()).item()
    line = f"{cfg} {dtype} {s}: rel err {err:.1e}"
    if s != "1000x1500x520":
        fl = 2.0 * M * N * K
        ours_fn = lambda x=x, w=w: gemm.matmul(x, w, config=cfg)  # noqa: E731
        cub_fn = lambda x=x, w=w: torch.matmul(x, w)  # noqa: E731
        ours = [fl / do_bench(ours_fn, rep=60) / 1e9 for _ in range(3)]
        cub = [fl / do_bench(cub_fn, rep=60) / 1e9 for _ in range(3)]
        line += f", TFLOP/s ours {sorted(ours)[1]:.0f} cuBLAS {sorted(cub)[1]:.0f}"
    print(line, flush=True)
