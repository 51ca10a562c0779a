"""A/B of the grouped GEMM's opt-in configurations (``CANDIDATE_CONFIGS`` in
``examples/hopper/grouped_gemm.py``) against the tuned defaults, and where the
fwd+bwd time goes, in one device run. See ``docs/dev/grouped-gemm.md`` for how to read it.

Per shape (``GxMxNxK`` or ``uneven``, the benchmark's set by default):

1. ``check``: every candidate kernel against float64 on fresh random inputs, outputs
   poisoned (one line each ending in PASS or FAIL); a failing candidate is not timed.
2. ``kernels``: each kernel kind (fwd, dgrad = dA, wgrad = dB) alone, the tuned default
   and its candidates timed interleaved (``do_bench``, L2 flushed, median of rounds).
3. ``host``: CPU time to enqueue a call while the GPU is held busy by a long sleep kernel
   (so nothing waits on the GPU): the forward, the two backward kernels called directly, the
   autograd fwd+bwd, and torch's autograd through ``_grouped_mm``.
4. ``chain``: fwd + dA + dB called directly (no autograd) and the same three launches
   replayed from a CUDA graph, beside the autograd fwd+bwd: if the graph is much faster
   than the autograd call, the gap is host time, not kernel time.
5. ``e2e``: autograd fwd+bwd with each wgrad candidate (``config={"wgrad_...": ...}``)
   against the default and torch, interleaved.

    python tools/grouped_ab.py [--shapes 4x2048x256x2048 ...] [--steps check kernels ...]
        [--out ab.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("check", "kernels", "host", "chain", "e2e")
SHAPES = ["4x2048x256x2048", "8x2048x4096x4096", "64x128x4096x2048", "uneven"]


def main(argv=None) -> int:
    import torch
    from triton.testing import do_bench

    import pyptx_torch.eager as eager
    from pyptx.testing import load_module

    gg = load_module(ROOT / "examples/hopper/grouped_gemm.py", "grouped_gemm_ab")
    bench = load_module(ROOT / "benchmarks/grouped_gemm.py", "grouped_gemm_bench")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=SHAPES)
    p.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    p.add_argument("--candidates", nargs="*", default=None,
                   help="names from CANDIDATE_CONFIGS (default: all)")
    p.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    names = list(gg.CANDIDATE_CONFIGS) if args.candidates is None else args.candidates
    cands = {n: dict(gg.CANDIDATE_CONFIGS[n]) for n in names}
    peer, why = bench.peer_grouped_mm(torch)
    dev = torch.cuda.get_device_name()
    lines = [f"# grouped GEMM A/B on {dev}, torch {torch.__version__}"]
    fails = 0

    def say(s):
        print(s, flush=True)
        lines.append(s)

    if why:
        say(f"# {why}")

    def timed(fns):
        """Median ms of each function, interleaved over rounds (the order rotates)."""
        t = {k: [] for k in fns}
        keys = list(fns)
        for r in range(args.rounds):
            for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                t[k].append(do_bench(fns[k], rep=args.rep, return_mode="median"))
        return {k: statistics.median(v) for k, v in t.items()}

    def rel(got, want_blocks):
        """||got - ref|| / ||ref|| over (got_block, ref_block) pairs; NaN -> inf."""
        num = den = 0.0
        for g, r in want_blocks:
            if torch.isnan(g).any():
                return float("inf")
            num += (g.double() - r).pow(2).sum().item()
            den += r.pow(2).sum().item()
        return (num / max(den, 1e-300)) ** 0.5

    def host_us(fn, n=10):
        """Median CPU microseconds to enqueue fn() while the GPU sleeps (nothing blocks);
        a value near the sleep (~30 ms) means the call waited for the GPU."""
        fn()
        torch.cuda.synchronize()
        out = []
        for _ in range(n):
            torch.cuda._sleep(50_000_000)  # ~30 ms at H100 clocks: the GPU stays busy
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
        return statistics.median(out)

    def one_shape(shape):
        """Every step for one shape; returns the number of failed checks."""
        fails = 0
        label, sizes, N, K = bench.parse(shape)
        M, G = sum(sizes), len(sizes)
        flops = 2.0 * M * N * K
        say(f"\n## {label}: M={M} N={N} K={K} G={G}")
        torch.manual_seed(0)
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(G, K, N, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        offs = gg.random_offsets(sizes)
        starts = [0] + offs.tolist()[:-1]
        ends = offs.tolist()
        # the tuned defaults, as grouped_op builds them (b (G, K, N): MN-major)
        kinds = {"fwd": (gg.grouped_tuned(M, N, K, G, b_major="MN"), (a, b, offs)),
                 # dA reads the same (G, K, N) memory K-major: (G, N', K') with N' = K
                 "dgrad": (gg.grouped_tuned(M, K, N, G, b_major="K"), (dy, b, offs)),
                 "wgrad": (gg.wgrad_tuned(M, K, N, G), (a, dy, offs))}

        def build(kind, cfg):
            kw = {k: v for k, v in cfg.items() if k != "kernel"}
            if kind == "fwd":
                return gg.build_grouped(M, N, K, G, b_major="MN", **kw)
            if kind == "dgrad":
                return gg.build_grouped(M, K, N, G, b_major="K", **kw)
            return gg.build_wgrad_split(M, K, N, G, **kw)

        def refs(kind, out):
            blocks = []
            for g, (s, e) in enumerate(zip(starts, ends)):
                if kind == "fwd" and e > s:
                    blocks.append((out[s:e], a[s:e].double() @ b[g].double()))
                elif kind == "dgrad" and e > s:
                    blocks.append((out[s:e], dy[s:e].double() @ b[g].double().T))
                elif kind == "wgrad":
                    blocks.append((out[g], a[s:e].double().T @ dy[s:e].double()))
            return blocks

        ok = {}
        built = {}
        if "check" in args.steps or "kernels" in args.steps or "e2e" in args.steps:
            saved = eager.POISON
            eager.set_poison(True)
            for name, cfg in cands.items():
                kind = cfg["kernel"]
                try:
                    k = build(kind, cfg)
                    out = k(*kinds[kind][1])
                    torch.cuda.synchronize()
                    err = rel(out, refs(kind, out))
                except Exception as e:  # noqa: BLE001 - one line per candidate, go on
                    say(f"check {label} {name}: {type(e).__name__}: {e} FAIL")
                    fails += 1
                    ok[name] = False
                    continue
                ok[name] = err < 6e-3
                fails += not ok[name]
                built[name] = k
                say(f"check {label} {name}: rel err {err:.2e} {'PASS' if ok[name] else 'FAIL'}")
            eager.set_poison(saved)

        if "kernels" in args.steps:
            for kind, (default, kargs) in kinds.items():
                fns = {"default": lambda k=default, x=kargs: k(*x)}
                for name, cfg in cands.items():
                    if cfg["kernel"] == kind and ok.get(name):
                        fns[name] = lambda k=built[name], x=kargs: k(*x)
                if kind == "fwd":   # the benchmark's peers, interleaved with the rest
                    if peer is not None:
                        fns["_grouped_mm"] = lambda: peer(a, b, offs)
                    if len(set(sizes)) == 1:
                        a3 = a.view(G, M // G, K)
                        fns["bmm"] = lambda a3=a3: torch.bmm(a3, b)
                ms = timed(fns)
                ch = getattr(default, "choice", None)
                say(f"kernels {label} {kind} (default {ch.config.describe() if ch else '?'}): "
                    + ", ".join(f"{k} {v * 1e3:.1f} us {flops / (v * 1e-3) / 1e12:.0f} TF/s "
                                f"({ms['default'] / v:.3f}x)" for k, v in ms.items()))

        aa = a.clone().requires_grad_(True)
        bb = b.clone().requires_grad_(True)

        def fwd_bwd(cfg=None):
            def f():
                aa.grad = bb.grad = None
                gg.grouped_mm(aa, bb, offs, config=cfg).backward(dy)
            return f

        def peer_bwd():
            aa.grad = bb.grad = None
            peer(aa, bb, offs).backward(dy)

        op = gg.grouped_op(M, N, K, G, "MN", "bf16")

        def bwd_direct():
            op.backward_kernel(a, b, offs, dy)

        def chain():
            kinds["fwd"][0](a, b, offs)
            op.backward_kernel(a, b, offs, dy)

        if "host" in args.steps:
            probes = {"fwd kernel direct": lambda: kinds["fwd"][0](a, b, offs),
                      "fwd op (autograd Function)": lambda: op(a, b, offs),
                      "fwd grouped_mm": lambda: gg.grouped_mm(a, b, offs),
                      "bwd kernels direct": bwd_direct, "fwd+bwd autograd": fwd_bwd()}
            if peer is not None:
                probes["torch fwd+bwd autograd"] = peer_bwd
            say(f"host {label}: " + ", ".join(f"{k} {host_us(f):.0f} us" for k, f in probes.items()))

        if "chain" in args.steps:
            fns = {"autograd": fwd_bwd(), "direct": chain}
            try:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    chain()
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    chain()
                fns["graph"] = graph.replay
            except Exception as e:  # noqa: BLE001
                say(f"# chain {label}: CUDA graph capture failed: {type(e).__name__}: {e}")
            if peer is not None:
                fns["torch autograd"] = peer_bwd
            ms = timed(fns)
            say(f"chain {label} (fwd+dA+dB): " + ", ".join(
                f"{k} {v * 1e3:.1f} us {3 * flops / (v * 1e-3) / 1e12:.0f} TF/s" for k, v in ms.items()))

        if "e2e" in args.steps:
            fns = {"default": fwd_bwd()}
            for name, cfg in cands.items():
                if cfg["kernel"] == "wgrad" and ok.get(name):
                    wc = {f"wgrad_{k}": v for k, v in cfg.items() if k != "kernel"}
                    fns[name] = fwd_bwd(wc)
            if peer is not None:
                fns["torch"] = peer_bwd
            ms = timed(fns)
            say(f"e2e {label} fwd+bwd: " + ", ".join(
                f"{k} {3 * flops / (v * 1e-3) / 1e12:.0f} TF/s ({ms['default'] / v:.3f}x default"
                + (f", {ms['torch'] / v:.3f}x torch)" if "torch" in ms else ")")
                for k, v in ms.items()))
        return fails

    for shape in args.shapes:
        fails += one_shape(shape)
        torch.cuda.empty_cache()

    say("all PASS" if not fails else f"{fails} FAIL")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
