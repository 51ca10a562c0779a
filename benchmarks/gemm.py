"""GEMM TFLOP/s: pyptx (``pyptx_kernels.gemm.host.matmul``, default call) beside cuBLAS
(``torch.matmul``) and an autotuned Triton matmul written here, bf16 and f16.

Two pyptx columns: "pyptx" is the table-driven default call (the shipped table's or the
heuristic's plan, nothing timed; saved winners ignored), "tuned" the per-shape-tuned one (the
plans timed for the exact shape, as ``PYPTX_AUTOTUNE=1`` or ``pyptx_kernels.tune`` does);
"table / tuned" is their paired ratio and "plans" names both (``=`` where they agree).

Timing: ``triton.testing.do_bench`` (L2 flushed between calls), median of ``--rounds``
per-round medians; the three contenders of a row are timed interleaved in one process, in
rotated order (each leads once per cycle: under the H100's power cap a burst inherits the SM
clock its predecessor left). ``--shapes`` narrows the set; ``--out FILE.md`` writes the table.

The "paired" column is pyptx over cuBLAS from ``pyptx.testing.paired_times``: ``--pairs``
rounds of one call of each, interleaved, L2 flushed before each, the median of the
per-round ratios. Neighbouring calls share the clock level, so it does not move with the
few-percent drifts between do_bench bursts; at the power cap each kernel's own draw sets
the clock only in do_bench's bursts and the sustained table.

``--sustained`` adds a second table beside it for the shapes whose launch lasts 1 ms or more:
each contender back to back for ``--seconds`` (no flush), two interleaved rounds, median
TFLOP/s: the power-capped steady state that long training GEMMs run in, where each kernel's
SM clock follows its own power draw.

    python benchmarks/gemm.py [--dtypes bf16 f16] [--shapes 4096 8192x28672x8192] [--sustained]
                              [--out t.md]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_timing.py

from _plans import table_and_tuned  # noqa: E402
from _timing import gpu_missing, rotated  # noqa: E402

from pyptx.testing import paired_ratio, paired_times  # noqa: E402

SHAPES = [(2048, 2048, 2048), (4096, 4096, 4096), (6144, 6144, 6144), (8192, 8192, 8192),
          (8192, 28672, 8192), (8192, 8192, 28672), (128, 8192, 8192), (4095, 4097, 4100)]


def _back_to_back(fn, seconds):
    """Launches per second of ``fn`` run back to back for about ``seconds``."""
    import torch

    fn()
    torch.cuda.synchronize()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            fn()
        n += 10
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def load_gemm():
    """The GEMM example as a module."""

    return importlib.import_module("pyptx_kernels.gemm.host")


def triton_matmul():
    """An autotuned Triton matmul (persistent-free, grouped ordering), written here."""
    import triton
    import triton.language as tl

    configs = [triton.Config({"BM": bm, "BN": bn, "BK": bk, "G": 8}, num_stages=s, num_warps=w)
               for bm, bn, bk, s, w in [(128, 256, 64, 3, 8), (128, 128, 64, 4, 8),
                                        (256, 128, 64, 3, 8), (64, 256, 64, 4, 4),
                                        (128, 128, 128, 3, 8), (64, 128, 64, 4, 4)]]

    @triton.autotune(configs=configs, key=["M", "N", "K"])
    @triton.jit
    def kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, G: tl.constexpr):
        pid = tl.program_id(0)
        nm, nn = tl.cdiv(M, BM), tl.cdiv(N, BN)
        width = G * nn
        group = pid // width
        first = group * G
        rows = min(nm - first, G)
        pm = first + (pid % width) % rows
        pn = (pid % width) // rows
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        pa = a + rm[:, None] * sam + rk[None, :] * sak
        pb = b + rk[:, None] * sbk + rn[None, :] * sbn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            ka = k * BK + rk
            x = tl.load(pa, mask=(rm[:, None] < M) & (ka[None, :] < K), other=0.0)
            y = tl.load(pb, mask=(ka[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(x, y, acc)
            pa += BK * sak
            pb += BK * sbk
        pc = c + rm[:, None] * scm + rn[None, :] * scn
        tl.store(pc, acc.to(c.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))

    def run(a, b):
        import torch

        M, K = a.shape
        N = b.shape[1]
        c = torch.empty(M, N, device=a.device, dtype=a.dtype)
        grid = lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)  # noqa: E731
        kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                     c.stride(0), c.stride(1))
        return c

    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", nargs="+", default=["bf16", "f16"])
    p.add_argument("--shapes", nargs="+", default=None,
                   help="MxNxK or N (cube); default: the issue's list")
    p.add_argument("--rep", type=int, default=200, help="do_bench rep (ms)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved do_bench rounds")
    p.add_argument("--pairs", type=int, default=20, help="paired rounds (0: no paired column)")
    p.add_argument("--sustained", action="store_true",
                   help="also time launches of 1 ms or more back to back (power-capped)")
    p.add_argument("--seconds", type=float, default=2.0, help="--sustained: seconds a burst")
    p.add_argument("--no-triton", action="store_true")
    p.add_argument("--config", default=None, help="JSON GemmConfig fields for ours (its plan)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    why = gpu_missing("gemm.py")
    if why:
        print(why, file=sys.stderr)
        return 2
    import torch
    from triton.testing import do_bench
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) if "x" in s else (int(s),) * 3
                  for s in args.shapes]
    gemm = load_gemm()
    tri = None if args.no_triton else triton_matmul()
    cfg = json.loads(args.config) if args.config else None
    rows = []
    dev = torch.cuda.get_device_name()
    print(f"# GEMM TFLOP/s on {dev}, do_bench median (L2 flushed)")
    head = ("| dtype | M x N x K | pyptx | tuned | cuBLAS | Triton | pyptx / cuBLAS | paired | "
            "table / tuned | plans (table / tuned) | rel err |")
    rule = "|---|---|---|---|---|---|---|---|---|---|---|"
    print(head)
    print(rule)
    lines = [head, rule]
    sustained = []
    for dname in args.dtypes:
        dt = {"bf16": torch.bfloat16, "f16": torch.float16}[dname]
        for M, N, K in shapes:
            torch.manual_seed(0)
            a = torch.randn(M, K, device="cuda", dtype=dt)
            b = torch.randn(K, N, device="cuda", dtype=dt)
            ours = gemm.matmul(a, b, config=cfg)
            ref = torch.matmul(a.float(), b.float())
            err = ((ours.float() - ref).norm() / ref.norm()).item()
            if cfg is None:
                table, tuned, plans = table_and_tuned(lambda a=a, b=b: gemm.matmul(a, b))
            else:
                table = tuned = lambda a=a, b=b: gemm.matmul(a, b, config=cfg)  # noqa: E731
                plans = "--config"
            fns = {"pyptx": table, "tuned": tuned, "cuBLAS": lambda a=a, b=b: torch.matmul(a, b)}
            if tri is not None:
                fns["Triton"] = lambda a=a, b=b: tri(a, b)
            flops = 2.0 * M * N * K
            t = {k: [] for k in fns}
            for r in range(args.rounds):  # interleaved rounds, rotated order
                for k in rotated(list(fns), r):
                    t[k].append(do_bench(fns[k], rep=args.rep, return_mode="median"))
            tf = {k: flops / (statistics.median(v) * 1e-3) / 1e12 for k, v in t.items()}
            if args.sustained and min(statistics.median(v) for v in t.values()) >= 1.0:
                st = {k: [] for k in fns}
                for r in range(2):
                    for k in rotated(list(fns), r):
                        st[k].append(flops * _back_to_back(fns[k], args.seconds) / 1e12)
                sustained.append(f"| {dname} | {M}x{N}x{K} | "
                                 + " | ".join(f"{statistics.median(st[k]):.0f}" for k in fns)
                                 + (" | -" if "Triton" not in fns else "")
                                 + f" | {statistics.median(st['pyptx']) / statistics.median(st['cuBLAS']):.3f} |")
            tri_s = f"{tf['Triton']:.0f}" if "Triton" in tf else "-"
            paired = vs_tuned = "-"
            if args.pairs:
                per = paired_times({k: fns[k] for k in ("pyptx", "tuned", "cuBLAS")}, args.pairs)
                paired = f"{paired_ratio(per, 'cuBLAS', 'pyptx')[0]:.3f}"
                vs_tuned = f"{paired_ratio(per, 'tuned', 'pyptx')[0]:.3f}"
            line = (f"| {dname} | {M}x{N}x{K} | {tf['pyptx']:.0f} | {tf['tuned']:.0f} | "
                    f"{tf['cuBLAS']:.0f} | {tri_s} | {tf['pyptx'] / tf['cuBLAS']:.3f} | {paired} | "
                    f"{vs_tuned} | {plans} | {err:.1e} |")
            print(line, flush=True)
            lines.append(line)
            rows.append(dict(dtype=dname, shape=(M, N, K), tflops=tf, err=err, plans=plans,
                             table_vs_tuned=vs_tuned))
    if sustained:
        sustained = ["", f"Sustained (each contender back to back for {args.seconds:g} s, no L2 "
                     "flush, median of 2 interleaved rounds; launches of 1 ms or more):", "",
                     "| dtype | M x N x K | pyptx | tuned | cuBLAS | Triton | pyptx / cuBLAS |",
                     "|---|---|---|---|---|---|---|"] + sustained
        print("\n".join(sustained), flush=True)
        lines += sustained
    if args.out:
        Path(args.out).write_text(f"GEMM TFLOP/s on {dev}\n\n" + "\n".join(lines) + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
