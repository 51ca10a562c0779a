"""Is the tuned default call slower than the same configuration named? Times, in one process,
the default call (``pyptx.autotune`` picks the config), the winner's kernel launched directly,
and the winner named explicitly, with do_bench (L2 flushed) in rotated rounds; prints each
path's host time per call (no sync), the CUDA kernels each launches (torch.profiler) and how
many times each synchronises.

    python tools/tuned_vs_named.py attention   # D=128 S=8192 full
    python tools/tuned_vs_named.py gemm        # 4096^3 bf16
"""
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
what = sys.argv[1] if len(sys.argv) > 1 else "attention"
if what == "attention":
    fa = load_module(ROOT / "examples/hopper/flash_attention.py", "flash_attention_example")
    B, S, H, D = 4, 8192, 16, 128
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4.0 * B * H * S * S * D
    args = (q, k, v)
    default = lambda: fa.attention_forward(q, k, v)  # noqa: E731
    default()
    tk = fa._forward(B, S, H, H, D, S, "bf16", False, 1.0 / math.sqrt(D), *fa._tuning(None, None, None),
                     fa._persistent(None, D), *fa._check_opts(False, fa.RESCALE_THRESHOLD))
    winner = tk.choose(*args)
    cfg = dict(tk.choice.config.kwargs) or {"stages": 2}
    named = lambda: fa.attention_forward(q, k, v, **cfg)  # noqa: E731
else:
    gm = load_module(ROOT / "examples/hopper/gemm.py", "gemm_example")
    M = N = K = 4096
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * M * N * K
    args = (x, w)
    default = lambda: gm.matmul(x, w)  # noqa: E731
    default()
    key = tuple(sorted(dict(dtype="bf16", out_dtype="bf16", a_major="K", b_major="MN", bias=False,
                            alpha=1.0, activation=None, KB=K, NB=N).items()))
    tk = gm._cached(M, N, K, key, None)
    winner = tk.choose(*args)
    cfg = dict(tk.choice.config.kwargs)
    named = lambda: gm.matmul(x, w, config=cfg)  # noqa: E731
direct = lambda: winner(*args)  # noqa: E731


def gm_or_fa_cache_info():
    return (fa._forward if what == 'attention' else gm._cached).cache_info()


print("tuned:", type(tk).__name__, tk.choice, gm_or_fa_cache_info(), flush=True)
print("config:", cfg, flush=True)
fns = {"default": default, "direct": direct, "named": named}
fns = {n: f for n, f in fns.items() if f is not None}
for f in fns.values():
    f()
torch.cuda.synchronize()
real_sync, count = torch.cuda.synchronize, [0]
for n, f in fns.items():
    count[0] = 0
    torch.cuda.synchronize = lambda *a, **kw: (count.__setitem__(0, count[0] + 1), real_sync(*a, **kw))[1]
    f()
    torch.cuda.synchronize = real_sync
    real_sync()
    t0 = time.perf_counter()
    for _ in range(20):
        f()
    t1 = time.perf_counter()
    real_sync()
    print(f"{n}: synchronize calls per call {count[0]}; host us per call (20 queued) "
          f"{(t1 - t0) / 20 * 1e6:.1f}", flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            f()
        real_sync()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6), flush=True)
tf = {n: [] for n in fns}
for r in range(5):
    names = list(fns)[r % len(fns):] + list(fns)[:r % len(fns)]
    for n in names:
        tf[n].append(flops / do_bench(fns[n], rep=100, return_mode="median") / 1e9)
for n, v in tf.items():
    print(f"{n:>8}: " + " ".join(f"{t:6.1f}" for t in v) + f" | {statistics.median(v):6.1f}")
