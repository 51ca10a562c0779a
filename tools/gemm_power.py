"""Clocks and power while a long GEMM runs back to back: ours (the tuned default) and cuBLAS,
each for a few seconds, nvidia-smi sampled every 100 ms. A kernel that draws more power per
FLOP is clocked down further under the 700 W cap, which shows in long kernels first.

    python tools/gemm_power.py 8192x28672x8192 [--dtype f16] [--seconds 3]
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gemm import _back_to_back, load_gemm  # noqa: E402  (benchmarks/gemm.py)

gemm = load_gemm()
p = argparse.ArgumentParser()
p.add_argument("shapes", nargs="+")
p.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
p.add_argument("--seconds", type=float, default=3.0)
p.add_argument("--configs", default=None, help="JSON list of build_gemm keyword dicts, timed too")
a = p.parse_args()
dt = {"bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]


def sampled(fn, seconds):
    """(launches per second, median SM clock MHz, median power W) of ``fn`` run back to back."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True)
    rate = _back_to_back(fn, seconds)
    smi.terminate()
    rows = [r.split(",") for r in smi.communicate()[0].strip().splitlines() if "," in r]
    rows = rows[len(rows) // 3:]            # the settled part
    clk = statistics.median(float(r[0]) for r in rows) if rows else float("nan")
    pw = statistics.median(float(r[1]) for r in rows) if rows else float("nan")
    return rate, clk, pw


extra = json.loads(a.configs) if a.configs else []
for s in a.shapes:
    M, N, K = (int(v) for v in s.split("x")) if "x" in s else (int(s),) * 3
    x = torch.randn(M, K, device="cuda", dtype=dt)
    w = torch.randn(K, N, device="cuda", dtype=dt)
    fl = 2.0 * M * N * K
    fns = {"pyptx (tuned)": lambda x=x, w=w: gemm.matmul(x, w),
           "cuBLAS": lambda x=x, w=w: torch.matmul(x, w)}
    for c in extra:
        fns[json.dumps(c)] = lambda c=c, x=x, w=w: gemm.matmul(x, w, config=c)
    for rnd in range(2):
        for name, fn in fns.items():
            rate, clk, pw = sampled(fn, a.seconds)
            print(f"{s} {a.dtype} round {rnd} {name:>40}: {fl * rate / 1e12:6.1f} TFLOP/s sustained, "
                  f"SM clock {clk:.0f} MHz, {pw:.0f} W, {fl * rate / 1e12 / pw:.3f} TFLOP/s per W",
                  flush=True)
