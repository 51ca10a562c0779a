"""Launches for an ncu comparison of the small-N grouped forward and ``torch.bmm``: each
contender twice after a warm-up (profile with ``--launch-skip`` past the warm-ups).
``--flush``: a 256 MB zero fill before each launch, as do_bench does (profile with
``--cache-control none`` and ``-k regex:'grouped|nvjet'`` to see the kernels in the state
do_bench leaves L2 in: full of dirty lines).

    ncu --metrics ... python tools/grouped_ncu.py [--shape 4x2048x256x2048] [--flush]
"""
import argparse
import json
from pathlib import Path

import torch

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
gg = load_module(ROOT / "examples/hopper/grouped_gemm.py", "grouped_gemm_ncu")

p = argparse.ArgumentParser()
p.add_argument("--shape", default="4x2048x256x2048")
p.add_argument("--flush", action="store_true")
p.add_argument("--configs", default='[{"BM": 64, "BN": 256, "prefetch": true}]',
               help="JSON list of build_grouped keywords, each profiled beside bmm")
a = p.parse_args()
G, Mg, N, K = (int(v) for v in a.shape.split("x"))
M = G * Mg
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
w = torch.randn(G, K, N, device="cuda", dtype=torch.bfloat16)
offs = gg.random_offsets([Mg] * G)
ks = [gg.build_grouped(M, N, K, G, b_major="MN", **c) for c in json.loads(a.configs)]
x3 = x.view(G, Mg, K)
cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")


def flush():
    if a.flush:
        cache.zero_()


for _ in range(2):          # warm-up (compile, cuBLAS heuristics)
    for k in ks:
        k(x, w, offs)
    torch.bmm(x3, w)
torch.cuda.synchronize()
for _ in range(2):
    for k in ks:
        flush()
        k(x, w, offs)
    flush()
    torch.bmm(x3, w)
torch.cuda.synchronize()
print("done")
