"""Device probe for issue 6: code-generation variants of our row kernels, timed side by side.

Every variant is a ``pdl=True`` kernel built with some of ``examples/hopper/_rowwise``'s
code-generation switches changed (L2 prefetch in the PDL prologue, load and store cache
hints, a register cap), checked against torch eager, and timed with
``benchmarks/memory_bound.py``'s CUDA-graph timer beside Triton and inductor. Rounds
alternate the variants, so drift hits them all alike; the table gives the median GB/s over
rounds. The copy is timed at 512 MiB and at each cell's own byte count.

    python tools/probe_variants.py [--ops rms_norm,...] [--sizes 2048x8192,...] [--rounds 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: name -> (switches of _rowwise, builder kwargs)
VARIANTS = {
    "default": ({}, {}),
    "nreg56": ({}, {"maxnreg": 56}),
    "nreg48": ({}, {"maxnreg": 48}),
    "nreg40": ({}, {"maxnreg": 40}),
    "rows2": ({}, {"rows": 2}),
    "ld": ({"PDL_PREFETCH": False, "STREAM": ""}, {}),
    "ld+nreg64": ({"PDL_PREFETCH": False, "STREAM": ""}, {"maxnreg": 64}),
    "pf+ld+nreg64": ({"STREAM": ""}, {"maxnreg": 64}),
    "ld+c8": ({"PDL_PREFETCH": False, "STREAM": ""}, {"chunks": 8}),
    "ld+c2": ({"PDL_PREFETCH": False, "STREAM": ""}, {"chunks": 2}),
    "persist+ld": ({"PDL_PREFETCH": False, "STREAM": "", "PINNED": ""}, {"ctas": 264}),
    "pdl": ({"PDL_PREFETCH": False}, {}),
    "pdl+pf": ({}, {}),
    "pf+st.cs": ({"STORE": ".cs"}, {}),
    "pf+ld": ({"STREAM": ""}, {}),
    "pf+ld.L1na": ({"STREAM": ".L1::no_allocate"}, {}),
    "pf+ld.nc": ({"STREAM": ".nc"}, {}),
    "pf+L2_256": ({"STREAM": ".nc.L1::no_allocate.L2::256B"}, {}),
    "pf+maxnreg64": ({}, {"maxnreg": 64}),
    # swiglu launch shapes: threads per CTA x 16-byte vectors per thread and input
    "t128": ({}, {"threads": 128}),
    "t128c2": ({}, {"threads": 128, "chunks": 2}),
    "t512": ({}, {"threads": 512}),
    "t1024": ({}, {"threads": 1024}),
    "t64": ({}, {"threads": 64}),
    # TMA ring (rms_norm / layer_norm only): ctas = CTAs per SM x 132 SMs
    "ring2": ({}, {"stages": 2, "ctas": 264}),
    "ring3": ({}, {"stages": 3, "ctas": 264}),
    "ring4": ({}, {"stages": 4, "ctas": 264}),
    "ring5": ({}, {"stages": 5, "ctas": 264}),
    "ring6": ({}, {"stages": 6, "ctas": 264}),
    "ring2x3": ({}, {"stages": 2, "ctas": 396, "maxnreg": 80}),
    "ring4x1": ({}, {"stages": 4, "ctas": 132}),
    "ring8x1": ({}, {"stages": 8, "ctas": 132}),
    "ring2-nopf": ({"PDL_PREFETCH": False}, {"stages": 2, "ctas": 264}),
    "ring4-nopf": ({"PDL_PREFETCH": False}, {"stages": 4, "ctas": 264}),
    "ring4-nopdl": ({}, {"stages": 4, "ctas": 264, "pdl": False}),
    "ring4-bulk": ({}, {"stages": 4, "ctas": 264, "bulk_store": True}),
    "ring6-bulk": ({}, {"stages": 6, "ctas": 264, "bulk_store": True}),
    "ring8x1-bulk": ({}, {"stages": 8, "ctas": 132, "bulk_store": True}),
    # L2 eviction priority (createpolicy + .L2::cache_hint) of streamed loads / of stores
    "ldef": ({"L2_LOAD": "evict_first"}, {}),
    "stef": ({"L2_STORE": "evict_first"}, {}),
    "stel": ({"L2_STORE": "evict_last"}, {}),
    "ldef+stel": ({"L2_LOAD": "evict_first", "L2_STORE": "evict_last"}, {}),
    "t512+ldef": ({"L2_LOAD": "evict_first"}, {"threads": 512}),
    "t512+stef": ({"L2_STORE": "evict_first"}, {"threads": 512}),
    "t512+stel": ({"L2_STORE": "evict_last"}, {"threads": 512}),
    # swiglu: slices of G and U by cp.async.bulk into shared memory (and Y back out)
    "bulk": ({}, {"bulk": True}),
    "bulk512": ({}, {"bulk": True, "threads": 512}),
    "bulk512c2": ({}, {"bulk": True, "threads": 512, "chunks": 2}),
    "bulk512c4": ({}, {"bulk": True, "threads": 512, "chunks": 4}),
    "bulk512-nopf": ({"PDL_PREFETCH": False}, {"bulk": True, "threads": 512}),
    "bulk1024": ({}, {"bulk": True, "threads": 1024}),
    "bulk1024c2": ({}, {"bulk": True, "threads": 1024, "chunks": 2}),
    "bulk1024+stcs": ({"STORE": ".cs"}, {"bulk": True, "threads": 1024}),
    "bulk1024-nopf": ({"PDL_PREFETCH": False}, {"bulk": True, "threads": 1024}),
    "bulk256c2": ({}, {"bulk": True, "threads": 256, "chunks": 2}),
    "bulk128c4": ({}, {"bulk": True, "threads": 128, "chunks": 4}),
    "bulk128c8": ({}, {"bulk": True, "threads": 128, "chunks": 8}),
    "bulk512+stef": ({"L2_STORE": "evict_first"}, {"bulk": True, "threads": 512}),
    "bulk512+stcs": ({"STORE": ".cs"}, {"bulk": True, "threads": 512}),
    "bulkst512": ({}, {"bulk": True, "bulk_store": True, "threads": 512}),
    "bulkst512c4": ({}, {"bulk": True, "bulk_store": True, "threads": 512, "chunks": 4}),
}


def load(rel: str, name: str):
    path = ROOT / rel
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="rms_norm,layer_norm,softmax,swiglu")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--sizes", default="2048x8192,8192x8192")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()

    import torch

    mb = load("benchmarks/memory_bound.py", "probe_mb")
    rw = load("examples/hopper/_rowwise.py", "_rowwise")
    sys.modules["_rowwise"] = rw
    mods = {m: load(f"examples/hopper/{m}.py", f"probe_{m}")
            for m in ("rms_norm", "layer_norm", "softmax", "swiglu")}
    from pyptx.types import bf16, f32

    timer = mb.Timer(torch, "graph")
    triton_fns = mb.make_triton(torch)
    eager = mb.eager_fns(torch)
    dts = {"f32": (f32, torch.float32), "bf16": (bf16, torch.bfloat16)}
    builders = {
        "rms_norm": lambda B, N, dt, **kw: mods["rms_norm"].build_rms_norm_fast(B, N, dt, mb.RMS_EPS, **kw),
        "layer_norm": lambda B, N, dt, **kw: mods["layer_norm"].build_layer_norm(B, N, dt, mb.LN_EPS, **kw),
        "softmax": lambda B, N, dt, **kw: mods["softmax"].build_softmax_fast(B, N, dt, **kw),
        "swiglu": lambda B, N, dt, **kw: mods["swiglu"].build_swiglu(B, N, dt, **kw),
    }
    names = [v for v in a.variants.split(",") if v]
    copy512 = mb.measure_copy(torch, timer)[1]
    print(f"copy 512 MiB: {copy512:.0f} GB/s", flush=True)
    results = []
    for op in a.ops.split(","):
        for dname in a.dtypes.split(","):
            dt, tdt = dts[dname]
            for size in a.sizes.split(","):
                B, N = (int(v) for v in size.split("x"))
                nbytes = mb.traffic(op, B, N, dt.bytes)
                inputs = mb.make_inputs(torch, op, B, N, tdt)
                want = eager[op](*[t.double() for t in inputs])
                pool, _ = timer.pool(inputs)
                fns = {}
                for v in names:
                    switches, kw = VARIANTS[v]
                    saved = {k: getattr(rw, k) for k in switches}
                    try:
                        for k, val in switches.items():
                            setattr(rw, k, val)
                        k = builders[op](B, N, dt, **{"pdl": True, **kw})
                        got = k(*inputs)  # traced and compiled under the switches
                        err = mb.rel_err(torch, got, want)
                    except Exception as e:  # noqa: BLE001
                        print(f"  {op} {dname} {size} {v}: {type(e).__name__}: {e}", flush=True)
                        continue
                    finally:
                        for k2, val in saved.items():
                            setattr(rw, k2, val)
                    if err > (1e-5 if dname == "f32" else 1e-2):
                        print(f"  {op} {dname} {size} {v}: WRONG rel err {err:.2e}", flush=True)
                        continue
                    fns[v] = k
                if triton_fns is not None:
                    fns["triton"] = triton_fns[op]
                if not a.no_compile:
                    fns["inductor"] = torch.compile(eager[op], dynamic=False)
                    fns["inductor"](*inputs)
                gbs = {name: [] for name in fns}
                for _ in range(a.rounds):
                    for name, fn in fns.items():
                        t = timer.ms(fn, pool)
                        gbs[name].append(nbytes / t.ms / 1e6)
                # a copy of this cell's bytes (half read, half written)
                half = nbytes // 2 // 4 * 4
                src = torch.randn(half // 4, device="cuda")
                cpool = [(src, torch.empty_like(src))] + [
                    (s := src.clone(), torch.empty_like(s)) for _ in range(max(1, len(pool)) - 1)]
                ct = timer.ms(lambda s, d: torch.mul(s, 1.0, out=d), cpool)
                row = {"op": op, "dtype": dname, "B": B, "N": N, "copy_same_bytes": 2 * half / ct.ms / 1e6,
                       **{n: statistics.median(v) for n, v in gbs.items()}}
                results.append(row)
                peer = max((row[p] for p in ("triton", "inductor") if p in row), default=0.0)
                cells = "  ".join(f"{n} {row[n]:.0f}" for n in fns)
                print(f"{op:10s} {dname:4s} {size:9s} {cells}  | best peer {peer:.0f}, copy@bytes "
                      f"{row['copy_same_bytes']:.0f}", flush=True)
                del pool, inputs, want, cpool, src
                torch.cuda.empty_cache()
    if a.out:
        Path(a.out).write_text(json.dumps({"copy_512MiB": copy512, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
