"""Is a GEMM configuration's speed stable? Times cuBLAS and several configurations of the
pyptx GEMM in interleaved rounds of one process (do_bench medians, L2 flushed) and prints
every round, so a configuration whose speed flips between runs (session 8: cluster 2 measured
768 TFLOP/s at 8192^3 in one process and lost to cluster 1 in the tuner of another) shows it.

    python tools/gemm_variance.py 8192 8192x28672x8192 --dtype f16 --rounds 6
    python tools/gemm_variance.py 4096 8192 --configs candidates   # CANDIDATE_CONFIGS
"""
import argparse
import json
import statistics

import torch
from triton.testing import do_bench

from pyptx.testing import load_module, paired_ratio, paired_times

gemm = load_module(__import__("pathlib").Path(__file__).resolve().parents[1]
                   / "examples/hopper/gemm.py", "gemm_example")
p = argparse.ArgumentParser()
p.add_argument("shapes", nargs="+")
p.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
p.add_argument("--rounds", type=int, default=6)
p.add_argument("--rep", type=int, default=60)
p.add_argument("--pairs", type=int, default=0, help="paired rounds against cuBLAS (0: none)")
p.add_argument("--no-default", action="store_true", help="skip the tuned default (no tuning)")
p.add_argument("--configs", default='[{"cluster": 2}, {"cluster": 1}, {"cluster": 2, "epilogue": "st"}, '
               '{"cluster": 1, "epilogue": "st"}]')
a = p.parse_args()
dt = {"bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
# "candidates": the example's CANDIDATE_CONFIGS (opt-in schedules under evaluation)
configs = (dict(gemm.CANDIDATE_CONFIGS) if a.configs == "candidates"
           else {json.dumps(c): c for c in json.loads(a.configs)})
for s in a.shapes:
    M, N, K = (int(v) for v in s.split("x")) if "x" in s else (int(s),) * 3
    x = torch.randn(M, K, device="cuda", dtype=dt)
    w = torch.randn(K, N, device="cuda", dtype=dt)
    fl = 2.0 * M * N * K
    fns = {"cuBLAS": lambda x=x, w=w: torch.matmul(x, w)}
    for name, c in configs.items():
        fns[name] = lambda c=c, x=x, w=w: gemm.matmul(x, w, config=c)
    if not a.no_default:
        fns["default (tuned)"] = lambda x=x, w=w: gemm.matmul(x, w)
    ref = torch.matmul(x.float(), w.float())
    for name, fn in fns.items():
        err = ((fn().float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, f"{s} {name}: rel err {err:.1e}"
    tf = {n: [] for n in fns}
    for _ in range(a.rounds):
        for n, fn in fns.items():
            tf[n].append(fl / do_bench(fn, rep=a.rep, return_mode="median") / 1e9)
    print(f"== {s} {a.dtype}: TFLOP/s per round, then the median")
    for n, v in tf.items():
        print(f"{n:>45}: " + " ".join(f"{t:6.1f}" for t in v) + f"   | {statistics.median(v):6.1f}")
    if a.pairs:
        per = paired_times(fns, a.pairs)
        print(f"== {s} {a.dtype}: paired over cuBLAS (median [quartiles] of {a.pairs} rounds)")
        for n in fns:
            if n != "cuBLAS":
                med, lo, hi = paired_ratio(per, "cuBLAS", n)
                print(f"{n:>45}: {med:.3f} [{lo:.3f}, {hi:.3f}]")
