"""Device probe (issue 15): where a row kernel's do_bench time goes, beside its peers.

do_bench times ``flush; record; fn(); record`` with CUDA events. This probe runs that loop
under ``torch.profiler`` (CUPTI) and splits each contender's time into the kernel's own
duration and the gap between the L2 flush's end and the kernel's start, for two flushes:

* ``dirty``: do_bench's own, a 256 MB ``zero_`` (L2 left full of dirty lines);
* ``clean``: a 256 MB read (``sum``; L2 left full of clean lines).

Each loop is interleaved over the contenders (ours, Triton, inductor) in rotated order.
Printed: per flush, median kernel µs, median gap µs and do_bench's own median, per contender.

    python tools/rowwise_gap.py --cells layer_norm:f32:2048x8192 [--iters 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]


def profile_loop(torch, fns: dict, inputs, flush, iters: int, rounds: int) -> dict:
    """``{who: (kernel µs list, gap µs list)}`` from CUPTI over ``rounds`` x ``iters`` calls."""
    from torch.profiler import ProfilerActivity, profile

    names = list(fns)
    out: dict = defaultdict(lambda: ([], []))
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for who in order:
            fn = fns[who]
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(iters):
                    flush()
                    fn(*inputs)
                torch.cuda.synchronize()
            spans = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                            if e.device_type.name == "CUDA"), key=lambda s: s[1])
            ks, gs = split_trace(spans, lambda name: flush.tag in name)
            out[who][0].extend(ks)
            out[who][1].extend(gs)
    return out


def split_trace(spans: list, is_flush) -> tuple[list, list]:
    """``(busy, gaps)`` per iteration of a ``flush; fn()`` loop from its device spans
    ``(name, start, end)`` in start order: ``busy`` sums the durations of the kernels after a
    flush (up to the next flush), ``gaps`` is the first one's start minus the flush's end
    (negative when a PDL launch began before the flush ended). Spans before the first flush
    and flushes followed by nothing are left out."""
    busy: list = []
    gaps: list = []
    prev_end = first = None
    total = 0.0
    for name, start, end in list(spans) + [(None, None, None)]:
        if name is None or is_flush(name):
            if first is not None:
                busy.append(total)
                gaps.append(first - prev_end)
            prev_end, total, first = end, 0.0, None
        elif prev_end is not None:
            first = start if first is None else first
            total += end - start
    return busy, gaps


class Flush:
    """A callable L2 flush with a name its kernels carry (to find them in the trace)."""

    def __init__(self, torch, mode: str):
        self.buf = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
        self.mode = mode
        self.sink = torch.empty((), device="cuda")
        self.tag = {"dirty": "FillFunctor", "clean": "reduce_kernel"}[mode]

    def __call__(self):
        if self.mode == "dirty":
            self.buf.zero_()
        elif self.mode == "clean":
            self.sink = self.buf.sum()


def dump_triton(torch, fn, cell: str, out: Path) -> None:
    """Write the PTX Triton compiled for ``fn``'s kernel (at this cell's launch) to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for entry in getattr(fn.kernel, "device_caches", {}).values():
        for compiled in (entry[0] if isinstance(entry, tuple) else entry).values():
            (out / f"triton_{cell.replace(':', '_')}.ptx").write_text(compiled.asm["ptx"])
            return
    print(f"{cell}: no compiled Triton kernel found to dump")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="layer_norm:f32:2048x8192")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flushes", default="dirty,clean")
    ap.add_argument("--variants", default="",
                    help="our other builds, ';'-separated keyword sets: 'pdl=False;chunks=8'")
    ap.add_argument("--dump-triton", metavar="DIR", help="write the Triton peer's PTX here")
    a = ap.parse_args(argv)
    import torch
    from triton.testing import do_bench

    mb = load_module(ROOT / "benchmarks" / "memory_bound.py", "gap_mb")
    ncu = load_module(ROOT / "tools" / "rowwise_ncu.py", "gap_ncu")
    for cell in a.cells.split(","):
        inputs, fns = ncu.contenders(torch, mb, cell, True)
        fns.pop("eager", None)
        for spec in filter(None, a.variants.split(";")):
            kw = {k: eval(v) for k, v in (kv.split("=") for kv in spec.split(","))}  # noqa: S307
            try:
                fns[f"ours[{spec}]"] = ncu.build(cell, **kw)
            except Exception as e:  # noqa: BLE001 - a variant this cell refuses
                print(f"{cell}: {spec}: {type(e).__name__}: {e}")
        for fn in fns.values():
            for _ in range(3):
                fn(*inputs)
        torch.cuda.synchronize()
        if a.dump_triton and "triton" in fns:
            dump_triton(torch, fns["triton"], cell, Path(a.dump_triton))
        k = fns["ours"]
        print(f"\n## {cell} (ours: {k.choice.config.describe() if k.choice else '?'})")
        db: dict = defaultdict(list)
        names = list(fns)
        for r in range(a.rounds):
            for who in names[r % len(names):] + names[:r % len(names)]:
                db[who].append(do_bench(lambda f=fns[who], xs=inputs: f(*xs)))
        for mode in a.flushes.split(","):
            flush = Flush(torch, mode)
            res = profile_loop(torch, fns, inputs, flush, a.iters, a.rounds)
            print(f"flush={mode}")
            print("| who | kernel us | gap us | kernel/ours |")
            print("|---|---:|---:|---:|")
            base = statistics.median(res["ours"][0]) if res["ours"][0] else float("nan")
            for who, (ks, gs) in res.items():
                km = statistics.median(ks) if ks else float("nan")
                gm = statistics.median(gs) if gs else float("nan")
                print(f"| {who} | {km:.2f} | {gm:.2f} | {km / base:.3f} |")
        peers = [statistics.median(v) for w, v in db.items() if not w.startswith("ours")]
        print("do_bench medians (us): " + ", ".join(
            f"{w} {statistics.median(v) * 1e3:.2f}" for w, v in db.items()) + "  (best peer / "
            f"ours {min(peers) / statistics.median(db['ours']):.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
