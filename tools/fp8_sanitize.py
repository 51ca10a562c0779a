"""Small ragged FP8 GEMMs for compute-sanitizer (memcheck, racecheck, synccheck): each
scale kind, both cluster sizes, every output checked against float64."""
import sys

import torch
from pyptx_kernels.fp8_gemm import Fp8GemmConfig
from pyptx_kernels.fp8_gemm import testing as fp8

bad = 0
M, N, K = 200, 328, 400
CONFIGS = [Fp8GemmConfig(BN=128, cluster=1, num_sms=4), Fp8GemmConfig(BN=256, cluster=2, num_sms=4)]
for kind in ("tensor", "row", "block"):
    for cfg in CONFIGS:
        for out in ("bf16", "f32"):
            a, w, sa, sb = fp8.make_inputs(M, N, K, kind, seed=1)
            d = fp8.scaled_mm(a, w.t(), sa, sb, out_dtype=out, config=cfg)
            err = fp8.rel_err(d, fp8.reference(a, w, sa, sb, kind))
            ok = err < fp8.TOL[out]
            bad += not ok
            print(kind, cfg.name, out, f"rel err {err:.1e}", "PASS" if ok else "FAIL", flush=True)
torch.cuda.synchronize()
print("FAIL" if bad else "all PASS")
sys.exit(1 if bad else 0)
