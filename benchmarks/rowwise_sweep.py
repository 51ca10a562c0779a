"""Experiment: RMSNorm launch shapes and cache modifiers against Triton and the copy rate.

A probe for issue 6's gap (see docs/dev/memory-bound.md): for RMSNorm f32 and
bf16 at a few sizes it times variants of our kernel (threads per row, the
``ld.global`` cache modifiers of x and w, output stores with ``.cs``) beside
the Triton row kernel of ``memory_bound.py`` and a device-to-device copy, all
with ``memory_bound.py``'s timer (default ``graph``: CUDA graphs of back-to-back
launches over an input pool > 4x L2; ``do_bench``/``events``: L2 flushed before
each launch).

    python benchmarks/rowwise_sweep.py [--timer graph|do_bench|events]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from pyptx_kernels.rows import RowConfig

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]


def load(rel: str, name: str):
    return load_module(ROOT / rel, name)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timer", choices=("graph", "do_bench", "events"), default="graph")
    a = ap.parse_args(argv)

    from pyptx.types import bf16, f32

    mb = load("benchmarks/memory_bound.py", "mb")
    timer = mb.Timer(torch, a.timer)
    from pyptx_kernels.rows import rms_norm as rms
    tri = mb.make_triton(torch)
    copy = mb.measure_copy(torch, timer)[1]
    print(f"timer: {mb.timer_desc(timer.method)}\ncopy {copy:.0f} GB/s")
    loads = {"nc.L1::no_allocate": ".nc.L1::no_allocate", "plain": "", "L1::no_allocate":
             ".L1::no_allocate", "nc": ".nc", "L1::evict_first": ".L1::evict_first"}
    for dt, tdt in ((f32, torch.float32), (bf16, torch.bfloat16)):
        for B, N in ((256, 4096), (2048, 8192), (8192, 8192)):
            x = torch.randn(B, N, device="cuda", dtype=tdt)
            w = torch.randn(N, device="cuda", dtype=tdt)
            nbytes = (2 * B * N + N) * x.element_size()
            pool = timer.pool((x, w))[0]

            def ms(fn, pool=pool):
                t = timer.ms(fn, pool)
                if t.error:
                    print(f"  graph capture failed ({t.error}): {t.method} time, not comparable")
                return t.ms

            ref = tri["rms_norm"](x, w) if isinstance(tri, dict) else None
            rows = []
            if isinstance(tri, dict):
                rows.append(("triton", ms(tri["rms_norm"])))
            for lname, lmod in loads.items():
                for threads in (None, 128, 256, 1024):
                    try:  # a config names the variant: the builder does not autotune
                        k = rms.build_rms_norm_fast(B, N, dt, config=RowConfig(
                            threads=threads, load_cache=lmod))
                    except Exception as e:  # noqa: BLE001 - a shape the planner refuses
                        print(f"  skip {lname} threads={threads}: {type(e).__name__}")
                        continue
                    y = k(x, w)
                    if ref is not None and not torch.allclose(y.float(), ref.float(), atol=2e-2,
                                                              rtol=2e-2):
                        print(f"  WRONG {lname} threads={threads}")
                        continue
                    rows.append((f"x {lname}, threads {threads or 'plan'}"
                                 f" ({k.plan.describe()})", ms(k)))
            best = min(t for _, t in rows)
            print(f"\nrms_norm {dt.name} {B}x{N}")
            for name, t in sorted(rows, key=lambda r: r[1]):
                gbs = nbytes / t / 1e6
                print(f"  {gbs:7.0f} GB/s {gbs / copy:6.1%} of copy {best / t:5.2f}x best  {name}")


if __name__ == "__main__":
    main()
