"""A small ragged GEMM for compute-sanitizer (memcheck, racecheck, synccheck): both
cluster sizes, both B layouts, bias + activation, every output checked; a split tail (on 4 and 8 SMs: partial sums through the workspace, flags)."""
import importlib
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
gemm = importlib.import_module("pyptx_kernels.gemm.host")
from pyptx_kernels.gemm.config import GemmConfig  # noqa: E402
from pyptx_kernels.gemm.reference import reference  # noqa: E402

bad = 0
for cfg in (dict(cluster=1, BN=128), dict(cluster=2, BN=256),
            dict(cluster=1, BN=128, split_tail=True),
            dict(cluster=2, BN=64, split_tail=True, num_sms=8),
            dict(cluster=1, BM=64, BN=128, epi_bufs=1)):
    for tb in (False, True):
        M, N, K = 200, 328, 136
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).T if tb else \
            torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(N, device="cuda")
        d = gemm.matmul(a, b, bias=bias, activation="relu", config=GemmConfig(**dict(dict(num_sms=4), **cfg)))
        ref = reference(a, b, bias=bias, activation="relu")
        err = ((d.double() - ref).norm() / ref.norm()).item()
        bad += not err < 1e-2
        print(cfg, "b.T" if tb else "b", f"rel err {err:.1e}")
torch.cuda.synchronize()
print("FAIL" if bad else "all PASS")
sys.exit(1 if bad else 0)
