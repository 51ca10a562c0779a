"""FP8 GEMM TFLOP/s: pyptx (``pyptx_kernels.fp8_gemm``, autotuned default call) beside
``torch._scaled_mm`` (cuBLASLt), per-tensor, per-row and block scales, bf16 output.

Peers per row: per-tensor against ``_scaled_mm`` per-tensor; per-row against
``_scaled_mm`` rowwise (where this torch runs it) and per-tensor; block against
``_scaled_mm`` per-tensor (the issue's reference figure; target >= 0.9x).
Timing: ``triton.testing.do_bench`` (L2 flushed between calls), median of three
interleaved rounds in one process. Then the long-K error table: errors against
float64 at K = 16384 (f32 output) of ours and ``_scaled_mm``.

Two pyptx columns: "pyptx" is the table-driven default call (the shipped table's or the
heuristic's plan, nothing timed, saved winners ignored), "tuned" the per-shape-tuned one (as
``PYPTX_AUTOTUNE=1`` or ``pyptx_kernels.tune``); "table / tuned" is their paired ratio
(``pyptx.testing.paired_times``, ``--pairs`` rounds) and "plans" names both.

    python benchmarks/fp8_gemm.py [--shapes 4096 8192] [--scales tensor row block] [--out t.md]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmarks/_timing.py

from _plans import table_and_tuned  # noqa: E402
from _timing import gpu_missing  # noqa: E402

from pyptx.testing import paired_ratio, paired_times  # noqa: E402


def load_fp8():
    """The FP8 GEMM's test helpers (inputs, ``scaled_mm``, ``reference``, errors)."""

    return importlib.import_module("pyptx_kernels.fp8_gemm.testing")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["4096", "8192"],
                   help="MxNxK or N (cube)")
    p.add_argument("--scales", nargs="+", default=["tensor", "row", "block"])
    p.add_argument("--rep", type=int, default=200, help="do_bench rep (ms)")
    p.add_argument("--pairs", type=int, default=20, help="paired rounds of table vs tuned")
    p.add_argument("--config", default=None,
                   help="JSON Fp8GemmConfig fields fixing our plan (default: tuned)")
    p.add_argument("--fast-accum", action="store_true", help="also time fast_accum=True")
    p.add_argument("--no-errors", action="store_true", help="skip the K=16384 error table")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    why = gpu_missing("fp8_gemm.py")
    if why:
        print(why, file=sys.stderr)
        return 2
    import torch
    from triton.testing import do_bench
    shapes = [tuple(int(v) for v in s.split("x")) if "x" in s else (int(s),) * 3
              for s in args.shapes]
    fp8 = load_fp8()
    from pyptx_kernels.fp8_gemm import Fp8GemmConfig

    cfg = Fp8GemmConfig(**json.loads(args.config)) if args.config else None
    dev = torch.cuda.get_device_name()
    head = ("| scale | M x N x K | pyptx | tuned | _scaled_mm tensor | _scaled_mm rowwise | "
            "pyptx / peer | table / tuned | plans (table / tuned) | rel err |")
    lines = [f"# FP8 GEMM TFLOP/s on {dev}, do_bench median (L2 flushed), bf16 out", "",
             head, "|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    rows = []
    for kind in args.scales:
        for M, N, K in shapes:
            a, w, sa, sb = fp8.make_inputs(M, N, K, kind, seed=0)
            b = w.t()
            ta, tb = fp8.make_scales(M, N, K, "tensor")
            ra, rb = fp8.make_scales(M, N, K, "row")
            ours = fp8.scaled_mm(a, b, sa, sb, config=cfg)
            ref = fp8.reference(a[:2048], w, sa[:2048] if kind != "tensor" else sa, sb, kind)
            err = fp8.rel_err(ours[:2048], ref)
            mm = functools.partial(torch._scaled_mm, a, b, out_dtype=torch.bfloat16)
            call = functools.partial(fp8.scaled_mm, a, b, sa, sb, config=cfg)
            table, tuned, plans = ((call, call, "--config") if cfg is not None
                                   else table_and_tuned(call))
            fns = {"pyptx": table, "tuned": tuned,
                   "tensor": functools.partial(mm, scale_a=ta, scale_b=tb)}
            if args.fast_accum and kind != "block":
                fns["pyptx fast"] = functools.partial(fp8.scaled_mm, a, b, sa, sb, config=cfg,
                                                      fast_accum=True)
            try:
                mm(scale_a=ra, scale_b=rb)
                fns["rowwise"] = functools.partial(mm, scale_a=ra, scale_b=rb)
            except Exception as e:  # noqa: BLE001 - this torch may lack rowwise scaling
                print(f"_scaled_mm rowwise unavailable: {str(e).splitlines()[0]}")
            flops = 2.0 * M * N * K
            t = {k: [] for k in fns}
            for _ in range(3):
                for k, fn in fns.items():
                    t[k].append(do_bench(fn, rep=args.rep, return_mode="median"))
            tf = {k: flops / (sorted(v)[1] * 1e-3) / 1e12 for k, v in t.items()}
            peer = tf["rowwise"] if kind == "row" and "rowwise" in tf else tf["tensor"]
            row_s = f"{tf['rowwise']:.0f}" if "rowwise" in tf else "-"
            fast = f" (fast_accum {tf['pyptx fast']:.0f})" if "pyptx fast" in tf else ""
            vs_tuned = "-"
            if args.pairs:
                per = paired_times({k: fns[k] for k in ("pyptx", "tuned")}, args.pairs)
                vs_tuned = f"{paired_ratio(per, 'tuned', 'pyptx')[0]:.3f}"
            line = (f"| {kind} | {M}x{N}x{K} | {tf['pyptx']:.0f}{fast} | {tf['tuned']:.0f} | "
                    f"{tf['tensor']:.0f} | {row_s} | {tf['pyptx'] / peer:.3f} | {vs_tuned} | "
                    f"{plans} | {err:.1e} |")
            print(line, flush=True)
            lines.append(line)
            rows.append(dict(scale=kind, shape=(M, N, K), tflops=tf, err=err, plans=plans,
                             table_vs_tuned=vs_tuned))
    if not args.no_errors:
        lines += ["", "## Error against float64 at K = 16384 (256 x 256, per-tensor, f32 out)", "",
                  "| inputs | " + " | ".join(["pyptx (promoted)", "pyptx fast_accum",
                                               "torch._scaled_mm", "torch._scaled_mm fast"]) + " |",
                  "|---|---|---|---|---|"]
        for positive in (False, True):
            errs = fp8.long_k_errors(positive=positive)
            cells = [f"{errs[k]:.2e}" if k in errs else "-" for k in
                     ("pyptx (promoted)", "pyptx fast_accum", "torch._scaled_mm",
                      "torch._scaled_mm fast")]
            lines.append(f"| {'uniform [0, 1) x 2' if positive else 'normal x 2'} | "
                         + " | ".join(cells) + " |")
            rows.append(dict(long_k=True, positive=positive, errs=errs))
        print("\n".join(lines[-4:]), flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
