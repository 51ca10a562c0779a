"""Where the grouped GEMM's forward + backward spends its time at a small shape: GPU kernels
(torch profiler) and host (cProfile of back-to-back calls), ours beside torch autograd.

    python tools/grouped_bwd_host.py [--shape 4x2048x256x2048] [--before 8x2048x4096x4096]
        [--sequence ours,torch,ours,ours-nogc]

``--before`` runs forward + backward of both at other shapes first (the benchmark's state when
it reaches the small row); ``--sequence`` times the contenders in that order in one process
(``-nogc``: with the garbage collector off), to tell the order and the heap apart.
"""
import argparse
import cProfile
import gc
import pstats
import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from grouped_gemm import load_grouped, parse  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--shape", default="4x2048x256x2048")
p.add_argument("--before", nargs="*", default=[])
p.add_argument("--sequence", default="ours,torch")
a = p.parse_args()
gg = load_grouped()
for shape in a.before:
    _, sz, n, k = parse(shape)
    x = torch.randn(sum(sz), k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(len(sz), k, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    o, g = gg.random_offsets(sz), torch.randn(sum(sz), n, device="cuda", dtype=torch.bfloat16)
    for _ in range(20):
        gg.grouped_mm(x, w, o).backward(g)
        torch._grouped_mm(x, w, offs=o, out_dtype=torch.bfloat16).backward(g)
    torch.cuda.synchronize()
    print(f"ran {shape} forward + backward first; gc objects {len(gc.get_objects())}")
label, sizes, N, K = parse(a.shape)
M, G = sum(sizes), len(sizes)
torch.manual_seed(0)
aa = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
bb = torch.randn(G, K, N, device="cuda", dtype=torch.bfloat16, requires_grad=True)
offs = gg.random_offsets(sizes)
dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)


def ours():
    aa.grad = bb.grad = None
    gg.grouped_mm(aa, bb, offs).backward(dy)


def peer():
    aa.grad = bb.grad = None
    torch._grouped_mm(aa, bb, offs=offs, out_dtype=torch.bfloat16).backward(dy)


fns = {"ours": ours, "torch": peer}
for name in a.sequence.split(","):
    fn = fns[name.split("-")[0]]
    nogc = name.endswith("-nogc")
    if nogc:
        gc.disable()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    host = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(50):
            fn()
        host.append((time.perf_counter() - t) / 50 * 1e6)
        torch.cuda.synchronize()
    ms = do_bench(fn, return_mode="median")
    print(f"{name}: do_bench {ms * 1e3:.1f} us; host per call (50 back to back, median of 5) "
          f"{sorted(host)[2]:.1f} us")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    for e in prof.key_averages():
        print(f"   {e.device_time_total / e.count:8.1f} us x{e.count}  {e.key[:110]}")
    if nogc:
        gc.enable()
    print(f"   gc objects {len(gc.get_objects())}, collections {[s['collections'] for s in gc.get_stats()]}")
pr = cProfile.Profile()
pr.enable()
for _ in range(50):
    ours()
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
