"""A small ragged GEMM for compute-sanitizer (memcheck, racecheck, synccheck): both
cluster sizes, both B layouts, bias + activation, every output checked."""
import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples/hopper"))
spec = importlib.util.spec_from_file_location("gemm", ROOT / "examples/hopper/gemm.py")
gemm = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = gemm
spec.loader.exec_module(gemm)

bad = 0
for cfg in (dict(cluster=1, BN=128), dict(cluster=2, BN=256)):
    for tb in (False, True):
        M, N, K = 200, 328, 136
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).T if tb else \
            torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(N, device="cuda")
        d = gemm.matmul(a, b, bias=bias, activation="relu", config=dict(cfg, num_sms=4))
        ref = gemm.reference(a, b, bias=bias, activation="relu")
        err = ((d.double() - ref).norm() / ref.norm()).item()
        bad += not err < 1e-2
        print(cfg, "b.T" if tb else "b", f"rel err {err:.1e}")
torch.cuda.synchronize()
print("FAIL" if bad else "all PASS")
sys.exit(1 if bad else 0)
