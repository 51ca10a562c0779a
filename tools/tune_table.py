"""Regenerate this GPU's shipped tuning table (``pyptx_kernels/tuning/<device>.json``).

Times (``pyptx.autotune``, as ``PYPTX_AUTOTUNE=1`` does) every op's candidates on the
benchmark shapes plus a sweep of size buckets, through the public functions, and writes each
winner under its op and bucket (``pyptx_kernels._tuning.bucket_key``). Only kernels whose tuned
builder plans through ``pyptx_kernels._tuning.planned`` are recorded; the others are listed at
the end. Entries of other buckets and ops already in the file are kept; a bucket timed twice
keeps the later shape (the benchmark shapes run last). Winners saved on disk for an exact
shape (an earlier run, ``tune()``) count as timed.

    python tools/tune_table.py --quick        # the benchmark shapes, bf16: < 5 min on an H200
    python tools/tune_table.py [--ops matmul grouped_mm scaled_mm attention rms_norm]
                               [--out FILE.json]

``--quick`` also times with a shorter burst per candidate (``TorchTimer(rep_ms=40)``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

GEMM_BENCH = [(2048, 2048, 2048), (4096, 4096, 4096), (6144, 6144, 6144), (8192, 8192, 8192),
              (8192, 28672, 8192), (8192, 8192, 28672), (128, 8192, 8192), (4095, 4097, 4100)]
"""``benchmarks/gemm.py``'s shapes (``a @ b``, b row-major)."""
GEMM_SWEEP = [(M, N, K) for M in (1, 64, 512, 2048, 8192)
              for N, K in ((2048, 2048), (512, 2048), (5632, 2048), (2048, 5632), (4096, 4096),
                           (14336, 4096))]
"""Buckets of linear layers (``x @ w.T``): decode to prefill token counts x Llama widths."""
GROUPED_BENCH = [(8, 2048, 4096, 4096), (4, 2048, 256, 2048), (64, 128, 4096, 2048)]
"""``benchmarks/grouped_gemm.py``'s equal-group shapes, ``G x M x N x K``."""
FP8_BENCH = [(4096, 4096, 4096), (8192, 8192, 8192)]
ATTENTION_BENCH = [(S, D, causal) for S in (4096, 8192) for D in (64, 128)
                   for causal in (False, True)]
"""``benchmarks/attention.py``'s cases (B * S = 32768 tokens, H * D = 2048)."""
ROW_BENCH = [(256, 4096), (1024, 8192), (2048, 8192), (8192, 8192)]

Call = tuple[str, Callable[[], object]]


def matmul_calls(torch, quick: bool) -> Iterator[Call]:
    import pyptx_kernels

    dtypes = (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16)
    sweep = [] if quick else [(s, True) for s in GEMM_SWEEP]
    for (M, N, K), linear in sweep + [(s, False) for s in GEMM_BENCH]:
        for dt in dtypes:
            a = torch.randn(M, K, device="cuda", dtype=dt)
            b = torch.randn(N, K, device="cuda", dtype=dt)
            b = b.T if linear else b.T.contiguous()
            yield f"matmul {M}x{N}x{K} {dt}", lambda a=a, b=b: pyptx_kernels.matmul(a, b)


def grouped_calls(torch, quick: bool) -> Iterator[Call]:
    import pyptx_kernels
    from pyptx_kernels.grouped_gemm.reference import random_offsets

    for G, M, N, K in GROUPED_BENCH:
        a = torch.randn(G * M, K, device="cuda", dtype=torch.bfloat16, requires_grad=not quick)
        b = torch.randn(G, K, N, device="cuda", dtype=torch.bfloat16, requires_grad=not quick)
        offs = random_offsets([M] * G)

        def call(a=a, b=b, offs=offs):
            y = pyptx_kernels.grouped_mm(a, b, offs)
            if y.requires_grad:
                y.backward(torch.ones_like(y))
        yield f"grouped_mm {G}x{M}x{N}x{K}", call


def fp8_calls(torch, quick: bool) -> Iterator[Call]:
    import pyptx_kernels
    from pyptx_kernels.fp8_gemm.testing import make_inputs

    for kind in ("tensor", "row", "block"):
        for M, N, K in FP8_BENCH:
            a, w, sa, sb = make_inputs(M, N, K, kind, seed=0)
            b = w.t()
            fn = pyptx_kernels.scaled_mm_blockwise if kind == "block" else pyptx_kernels.scaled_mm
            yield (f"scaled_mm {kind} {M}x{N}x{K}",
                   lambda fn=fn, a=a, b=b, sa=sa, sb=sb: fn(a, b, sa, sb))


def attention_calls(torch, quick: bool) -> Iterator[Call]:
    import pyptx_kernels

    for S, D, causal in ATTENTION_BENCH:
        if quick and S != 4096:
            continue
        B, H = max(1, 32768 // S), 2048 // D
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))

        def call(q=q, k=k, v=v, causal=causal):
            o = pyptx_kernels.attention(q, k, v, causal=causal)
            o.backward(torch.ones_like(o))
        yield f"attention S={S} D={D} causal={causal}", call


def rms_norm_calls(torch, quick: bool) -> Iterator[Call]:
    import pyptx_kernels

    for B, N in ROW_BENCH:
        for dt in (torch.bfloat16,) if quick else (torch.bfloat16, torch.float32):
            x = torch.randn(B, N, device="cuda", dtype=dt)
            w = torch.ones(N, device="cuda", dtype=dt)
            yield f"rms_norm {B}x{N} {dt}", lambda x=x, w=w: pyptx_kernels.rms_norm(x, w)


OPS = {"matmul": matmul_calls, "grouped_mm": grouped_calls, "scaled_mm": fp8_calls,
       "attention": attention_calls, "rms_norm": rms_norm_calls}


def record(log, entries: dict, unplanned: set) -> list[str]:
    """Put the timed winners of one ``tuning()`` log into ``entries`` (op -> bucket -> plan);
    returns what it recorded, as lines."""
    from pyptx_kernels._tuning import PLANNERS, bucket_key

    done = []
    for kernel, choice in log:
        planner = PLANNERS.get(kernel.tuner.ident)
        if planner is None:
            unplanned.add(kernel.tuner.ident)
            continue
        name = planner.name_of(choice.config)
        if choice.source not in ("timed", "disk") or name is None:
            continue
        key = bucket_key(planner.sizes(kernel.keyvals))
        old = entries.setdefault(planner.op, {}).get(key)
        entries[planner.op][key] = name
        done.append(f"  {planner.op} {key}: {name} ({choice.source}"
                    + (f", {choice.us:.1f} us" if choice.us else "")
                    + (f"; replaces {old}" if old not in (None, name) else "") + ")")
    return done


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="the benchmark shapes only, bf16, shorter timing bursts")
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    p.add_argument("--out", default=None, help="default: pyptx_kernels/tuning/<device>.json "
                   "(a new --out file starts from the shipped table's entries)")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("tune_table.py times kernels on the GPU it regenerates the table of: no CUDA GPU",
              file=sys.stderr)
        return 2
    from pyptx_kernels import _tuning

    import pyptx.autotune as at

    if args.quick:
        at.set_timer("torch", at.TorchTimer(warmup_ms=10, rep_ms=40, rounds=2, settle_ms=50))
    name = torch.cuda.get_device_name()
    device = _tuning.device_key(name)
    shipped = _tuning.TABLES / f"{device}.json"
    out = Path(args.out) if args.out else shipped
    table = {}
    for start in (out, shipped):   # an --out file not yet written starts from the shipped one
        try:
            table = json.loads(start.read_text())
            break
        except (OSError, ValueError):
            continue
    table.setdefault("device", device)
    table.setdefault("ops", {})
    entries: dict = {}
    unplanned: set = set()
    t0 = time.perf_counter()
    for op in args.ops:
        for label, call in OPS[op](torch, args.quick):
            t = time.perf_counter()
            try:
                with at.tuning() as log:
                    call()
                    torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - one op failing must not lose the others
                print(f"{label}: FAILED {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
                continue
            lines = record(log, entries, unplanned)
            print(f"{label}: {time.perf_counter() - t:.1f} s", flush=True)
            print("\n".join(lines), flush=True)
            torch.cuda.empty_cache()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    how = "tools/tune_table.py" + (" --quick" if args.quick else "")
    for op, buckets in entries.items():
        entry = table["ops"].setdefault(op, {"source": "", "buckets": {}})
        entry.setdefault("buckets", {}).update(buckets)
        entry["source"] = f"{how} on {name}, {stamp} ({len(buckets)} buckets timed)"
        entry["buckets"] = dict(sorted(entry["buckets"].items()))
    table["generated_by"] = f"{how} on {name}, {stamp}"
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {out}: {sum(len(b) for b in entries.values())} buckets in "
          f"{time.perf_counter() - t0:.0f} s")
    if unplanned:
        print("not recorded (tuned builders without a planner): " + ", ".join(sorted(unplanned)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
