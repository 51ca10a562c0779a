"""Device probe for issue 5: one-kernel CUDA-graph replay of RMSNorm 32x1024 variants vs torch.add.

For each variant: host µs per replay of a captured one-call graph (2000 back-to-back
replays, final sync included, median of rounds that alternate the variants), and the
GPU µs per call inside one graph of 100 chained calls (CUDA events), which is the
kernel's own duration once launch costs are gone. Every variant is checked against a
float64 reference first.

    python tools/probe_graph.py [--rounds 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
B, N, EPS = 32, 1024, 1e-6

#: name -> build_rms_norm_fast kwargs
VARIANTS = {
    "default": {},
    "pdl=False": {"pdl": False},
    "rows=1": {"rows": 1},
    "chunks=1": {"chunks": 1},
    "chunks=2": {"chunks": 2},
    "pdl=False,rows=1": {"pdl": False, "rows": 1},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch

    sys.path.insert(0, str(ROOT / "examples" / "hopper"))
    spec = importlib.util.spec_from_file_location("probe_rms", ROOT / "examples/hopper/rms_norm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def sync():
        torch.cuda.synchronize()

    x = torch.randn(B, N, device="cuda")
    w = torch.randn(N, device="cuda") * 0.1 + 1
    y = torch.randn(B, N, device="cuda")
    x64, w64 = x.double(), w.double()
    ref = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + EPS) * w64

    calls = {"torch.add": lambda: torch.add(x, y)}
    for name, kw in VARIANTS.items():
        k = mod.build_rms_norm_fast(B, N, eps=EPS, **kw)
        out = k(x, w)
        err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
        if err > 1e-5:
            print(f"{name}: WRONG rel err {err:.2e}")
            continue
        calls[name] = (lambda k=k: k(x, w))

    def capture(fn, n):
        fn()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(n):
                fn()
        sync()
        return g

    one = {n: capture(f, 1) for n, f in calls.items()}
    many = {n: capture(f, 100) for n, f in calls.items()}
    host = {n: [] for n in calls}
    gpu = {n: [] for n in calls}
    eager = {n: [] for n in calls}
    for _ in range(a.rounds):
        for n in calls:
            g = one[n]
            sync()
            t0 = time.perf_counter()
            for _ in range(2000):
                g.replay()
            sync()
            host[n].append((time.perf_counter() - t0) / 2000 * 1e6)
            f = calls[n]
            t0 = time.perf_counter()
            for _ in range(2000):
                f()
            sync()
            eager[n].append((time.perf_counter() - t0) / 2000 * 1e6)
            g = many[n]
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            g.replay()
            e0.record()
            for _ in range(20):
                g.replay()
            e1.record()
            sync()
            gpu[n].append(e0.elapsed_time(e1) * 1e3 / 2000)
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {B}x{N} f32, "
             f"median of {a.rounds} rounds",
             f"{'variant':<20} {'graph replay us':>16} {'GPU us/call (100-call graph)':>30} "
             f"{'eager us/call':>14}"]
    for n in calls:
        lines.append(f"{n:<20} {statistics.median(host[n]):>16.2f} "
                     f"{statistics.median(gpu[n]):>30.2f} {statistics.median(eager[n]):>14.2f}")
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
