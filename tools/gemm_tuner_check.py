"""Does the tuner rank GEMM configs as do_bench does? For each shape: the tuner's own timings
(from its disk record), then TorchTimer.measure per config and do_bench per config, each in
interleaved rounds.

    python tools/gemm_tuner_check.py 8192x8192x28672 --dtype f16
"""
import argparse
import json
import os
import statistics
from pathlib import Path

import torch
from triton.testing import do_bench

from pyptx.autotune import TorchTimer
from pyptx.testing import load_module

gemm = load_module(Path(__file__).resolve().parents[1] / "examples/hopper/gemm.py", "gemm_tc")
p = argparse.ArgumentParser()
p.add_argument("shapes", nargs="+")
p.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
p.add_argument("--configs", default=None, help="JSON list of build_gemm keyword dicts "
               "(default: GEMM_CONFIGS)")
a = p.parse_args()
dt = {"bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
configs = (json.loads(a.configs) if a.configs else [c.kwargs for c in gemm.GEMM_CONFIGS])
for s in a.shapes:
    M, N, K = (int(v) for v in s.split("x")) if "x" in s else (int(s),) * 3
    fl = 2.0 * M * N * K
    x = torch.randn(M, K, device="cuda", dtype=dt)
    w = torch.randn(K, N, device="cuda", dtype=dt)
    gemm.matmul(x, w)   # tunes (disk record below)
    torch.cuda.synchronize()
    rec_dir = Path(os.environ.get("PYPTX_CACHE_DIR", "")) / "autotune"
    for f in sorted(rec_dir.glob("*.json"), key=lambda f: f.stat().st_mtime)[-1:]:
        rec = json.loads(f.read_text())
        print(f"== {s} {a.dtype}: tuner record, picked {rec['config']}")
        for t in sorted(rec["timed"], key=lambda t: t["us"]):
            print(f"   {json.dumps(t['config']):>60} {fl / t['us'] / 1e6:7.1f} TFLOP/s")
    ks = [gemm.build_gemm(M, N, K, dtype=a.dtype, out_dtype=a.dtype, **c) for c in configs]
    timer = TorchTimer()
    one = [[] for _ in ks]
    for _ in range(3):
        for i, k in enumerate(ks):
            one[i].append(timer.measure(k, (x, w), {}))
    db = [[] for _ in ks]
    for _ in range(3):
        for i, k in enumerate(ks):
            db[i].append(do_bench(lambda k=k, x=x, w=w: k(x, w), rep=60, return_mode="median") * 1e3)
    cub = statistics.median(do_bench(lambda x=x, w=w: torch.matmul(x, w), rep=60, return_mode="median") * 1e3
                            for _ in range(3))
    print(f"   TFLOP/s: TorchTimer.measure x3 / do_bench x3 "
          f"(cuBLAS {fl / cub / 1e6:.1f})")
    for c, m, d in zip(configs, one, db):
        print(f"   {json.dumps(c):>60} {fl / statistics.median(m) / 1e6:7.1f} "
              f"{fl / statistics.median(d) / 1e6:7.1f}")
