"""Small ragged FP8 GEMMs for compute-sanitizer (memcheck, racecheck, synccheck): each
scale kind, both cluster sizes, every output checked against float64. ``--variants``:
the opt-in main loops instead (pingpong, promote_kb=2, scale_prefetch)."""
import importlib
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
fp8 = importlib.import_module("pyptx_kernels.fp8_gemm.kernel")

bad = 0
variants = "--variants" in sys.argv
M, N, K = 200, 328, 1168 if variants else 400   # 10 k-blocks: a chain and a tail
CONFIGS = [dict(BN=128, cluster=1), dict(BN=256, cluster=2)]
VARIANTS = {"tensor": [dict(BN=128, cluster=2, pingpong=4), dict(BN=128, cluster=1, promote_kb=2)],
            "block": [dict(BN=128, cluster=2, pingpong=4), dict(BN=256, cluster=2, scale_prefetch=True)]}
VARIANTS["row"] = VARIANTS["tensor"]
for kind in ("tensor", "row", "block"):
    for cfg in VARIANTS[kind] if variants else CONFIGS:
        for out in ("bf16", "f32"):
            a, w, sa, sb = fp8.make_inputs(M, N, K, kind, seed=1)
            d = fp8.scaled_mm(a, w.t(), sa, sb, out_dtype=out, config=dict(cfg, num_sms=4))
            err = fp8.rel_err(d, fp8.reference(a, w, sa, sb, kind))
            ok = err < fp8.TOL[out]
            bad += not ok
            print(kind, cfg, out, f"rel err {err:.1e}", "PASS" if ok else "FAIL", flush=True)
torch.cuda.synchronize()
print("FAIL" if bad else "all PASS")
sys.exit(1 if bad else 0)
