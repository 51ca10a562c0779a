"""Device probe (issue 15): Nsight Compute metrics of a row kernel's default call beside its peers.

Launched twice by ``tools/rowwise_ncu.sh``: once plain (``--tune``: the default calls tune and
keep their winners on disk), then under ``ncu --profile-from-start off``. Under ncu it warms each
contender up, then profiles ``--reps`` launches of each with the profiler on, each launch after
do_bench's L2 flush (a 256 MB ``zero_``, so L2 holds dirty lines as under the benchmark's timer;
run ncu with ``--cache-control none --clock-control none`` to keep that). NVTX ranges name the
contender (``cell/who``).

    python tools/rowwise_ncu.py --cells layer_norm:f32:2048x8192 [--reps 3] [--tune]
    python tools/rowwise_ncu.py --summarize raw.csv     # a table per cell from ncu's --csv raw page
"""

from __future__ import annotations

import argparse
import csv
import functools
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from pyptx_kernels.rows import RowConfig

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]

#: the raw metrics the summary prints, with short labels
METRICS = {
    "gpu__time_duration.sum": "us",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
    "dram__bytes_read.sum": "rdMB",
    "dram__bytes_write.sum": "wrMB",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occ%",
    "launch__registers_per_thread": "regs",
    "launch__block_size": "block",
    "launch__grid_size": "grid",
    "sm__cycles_elapsed.avg.per_second": "GHz",
    "smsp__inst_executed.sum": "Minst",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "ldsec",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": "ldreq",
    "lts__t_sector_hit_rate.pct": "L2hit%",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "stall_lsb",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "stall_bar",
    "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio": "stall_membar",
}
TAG = re.compile(r"[a-z_]+:[a-z0-9]+:\d+x\d+/[a-z]+")
SCALE = {"gpu__time_duration.sum": 1e-3, "dram__bytes_read.sum": 1e-6,
         "dram__bytes_write.sum": 1e-6, "sm__cycles_elapsed.avg.per_second": 1e-9,
         "smsp__inst_executed.sum": 1e-6}


@functools.lru_cache(maxsize=1)
def _probe():
    """``tools/probe_rowwise.py`` and its example modules, loaded once."""
    probe = load_module(ROOT / "tools" / "probe_rowwise.py", "ncu_probe")
    return probe, probe.modules()


def _tuned_builder(cell: str):
    """``(op, dtype, builder args, the op's autotuned builder)`` of ``cell``."""
    probe, mods = _probe()
    op, dt, B, N = probe.parse_cell(cell)
    return op, dt, (B, N, dt) + ((probe.EPS[op],) if op in probe.EPS else ()), \
        probe.builder(mods, op)


def build(cell: str, **kw):
    """Our kernel at ``cell`` built with ``kw`` (a named variant: no tuning)."""
    _, _, args, tuned = _tuned_builder(cell)
    return tuned(*args, config=RowConfig(**kw))


def contenders(torch, mb, cell: str, compile_: bool):
    """``(inputs, {who: fn})`` at one cell: our default call, Triton, inductor, torch eager."""
    op, dt, args, tuned = _tuned_builder(cell)
    B, N = args[:2]
    inputs = mb.make_inputs(torch, op, B, N, torch.float32 if dt == "f32" else torch.bfloat16)
    fns = {"ours": tuned(*args)}
    triton = mb.make_triton(torch)
    if triton:
        fns["triton"] = triton[op]
    eager = mb.eager_fns(torch)[op]
    if compile_:
        fns["inductor"] = torch.compile(eager)
    fns["eager"] = eager
    return inputs, fns


def run(cells: list[str], reps: int, tune: bool, compile_: bool) -> int:
    import torch

    mb = load_module(ROOT / "benchmarks" / "memory_bound.py", "ncu_mb")
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    for cell in cells:
        inputs, fns = contenders(torch, mb, cell, compile_)
        for fn in fns.values():
            for _ in range(3):
                fn(*inputs)
        torch.cuda.synchronize()
        if tune:
            k = fns["ours"]
            print(f"{cell}: default call -> {k.choice.config.describe() if k.choice else '?'}")
            continue
        torch.cuda.profiler.start()
        for _ in range(reps):
            for who, fn in fns.items():
                flush.zero_()
                torch.cuda.nvtx.range_push(f"{cell}/{who}")
                fn(*inputs)
                torch.cuda.nvtx.range_pop()
                torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    return 0


def summarize(path: str) -> int:
    """One table per cell: the median of each metric over the reps, per contender."""
    rows = list(csv.reader(open(path, newline="")))
    head = next(i for i, r in enumerate(rows) if "ID" in r and "Kernel Name" in r)
    cols = rows[head]
    data = [dict(zip(cols, r)) for r in rows[head + 2:] if len(r) == len(cols)]
    nvtx = [c for c in cols if "Push/Pop" in c or "Range" in c]
    per: dict = defaultdict(lambda: defaultdict(list))
    names: dict = {}
    for d in data:
        found = [TAG.search(d[c]) for c in nvtx]
        found = [f.group(0) for f in found if f]
        if not found:  # the L2 flush between launches, outside every range
            continue
        tag = found[0]
        names[tag] = d["Kernel Name"][:60]
        for m in METRICS:
            if m in d:
                try:
                    per[tag][m].append(float(d[m].replace(",", "")) * SCALE.get(m, 1.0))
                except ValueError:
                    pass
    by_cell: dict = defaultdict(list)
    for tag in per:
        by_cell[tag.split("/")[0]].append(tag)
    for cell, tags in by_cell.items():
        print(f"\n## {cell}")
        labels = [METRICS[m] for m in METRICS]
        print("| who | " + " | ".join(labels) + " | kernel |")
        print("|---|" + "---:|" * len(labels) + "---|")
        for tag in sorted(tags):
            vals = [per[tag].get(m) for m in METRICS]
            cells = [f"{statistics.median(v):.3g}" if v else "-" for v in vals]
            print(f"| {tag.split('/', 1)[-1]} | " + " | ".join(cells) + f" | {names[tag]} |")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="layer_norm:f32:2048x8192")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tune", action="store_true", help="only tune the default calls")
    ap.add_argument("--no-compile", action="store_true", help="no inductor peer")
    ap.add_argument("--summarize", metavar="CSV", help="print tables from ncu's raw CSV")
    ap.add_argument("--metrics", action="store_true", help="print the metric names for ncu")
    a = ap.parse_args(argv)
    if a.metrics:
        print(",".join(METRICS))
        return 0
    if a.summarize:
        return summarize(a.summarize)
    return run(a.cells.split(","), a.reps, a.tune, not a.no_compile)


if __name__ == "__main__":
    sys.exit(main())
