"""Device probe (issue 15): the row kernels' candidate variants side by side under do_bench.

For each cell (op, dtype, B x N; default: the cells where the default call trailed the best
peer in session 7's do_bench table) it

* makes the default call (``build_rms_norm_fast(B, N, dtype)``, ...): ``pyptx.autotune``
  tunes it at its first launch with its L2-flushed timer, and the probe prints the winner
  and the tuner's own time of every config it timed;
* builds every candidate of ``variants``: all of the builder's autotune configs (``cfg``)
  plus shapes outside the list (``extra``): the PDL launch without its L2 prefetch, two rows
  per CTA at small row counts, ``.cs`` stores; identical kernels are timed once;
* checks each against float64 (relative L2 error below 1e-5 f32, 1e-2 bf16: a wrong
  variant is reported and not timed);
* times the default call, every variant and the peers (torch eager, inductor, the Triton
  kernels of ``benchmarks/memory_bound.py``) with ``triton.testing.do_bench`` (256 MB L2
  flush before each launch, median), in ``--rounds`` interleaved rounds (rotated order),
  and prints the medians sorted, with the ratio to the best peer.

One line per cell starts with ``CELL`` (best peer, the default call, the best variant, the
best config-list variant: each with its ratio to the best peer, and PASS/FAIL for the default
call); the JSON (``--out``) holds every number.

    python tools/probe_rowwise.py [--cells rms_norm:bf16:256x4096,...] [--rounds 3]
        [--no-compile] [--out $OUT/probe_rowwise.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from pyptx_kernels._modules import kernel_module

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
#: session 7's do_bench table: the cells where the default call was under 1.0x the best peer
LOSING = ["rms_norm:f32:1024x8192", "rms_norm:f32:2048x8192", "rms_norm:bf16:256x4096",
          "rms_norm:bf16:8192x8192", "layer_norm:f32:256x4096", "layer_norm:bf16:256x4096",
          "softmax:f32:256x4096", "softmax:f32:1024x8192", "softmax:f32:2048x8192",
          "softmax:bf16:256x4096", "softmax:bf16:2048x8192", "swiglu:f32:256x4096",
          "swiglu:f32:8192x8192", "swiglu:bf16:1024x8192", "swiglu:bf16:2048x8192"]
BUILDERS = {"rms_norm": ("rms_norm", "build_rms_norm_fast", "RMS_NORM_CONFIGS"),
            "layer_norm": ("layer_norm", "build_layer_norm", "LAYER_NORM_CONFIGS"),
            "softmax": ("softmax", "build_softmax_fast", "SOFTMAX_CONFIGS"),
            "swiglu": ("swiglu", "build_swiglu", "SWIGLU_CONFIGS")}
EPS = {"rms_norm": 1e-6, "layer_norm": 1e-5}


def modules() -> dict:
    """The example modules, by op."""
    return {op: kernel_module(f) for op, (f, _, _) in BUILDERS.items()}


def builder(mods: dict, op: str):
    """The op's builder (``config=None``: tuned; a ``RowConfig``: that plan)."""
    return getattr(mods[op], BUILDERS[op][1])


def parse_cell(cell: str) -> tuple[str, str, int, int]:
    """``rms_norm:bf16:256x4096`` -> ``("rms_norm", "bf16", 256, 4096)``."""
    op, dt, shape = cell.split(":")
    B, N = (int(v) for v in shape.split("x"))
    if op not in BUILDERS or dt not in ("f32", "bf16"):
        raise ValueError(f"bad cell {cell!r}: expected op:dtype:BxN with op in {list(BUILDERS)}")
    return op, dt, B, N


def _label(kw: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in kw.items()) or "defaults"


#: ``--hints``: L2 eviction priorities and store modifiers tried on a few launch shapes
HINTS = [{"l2_load": "evict_first"}, {"l2_store": "evict_first"},
         {"l2_load": "evict_first", "l2_store": "evict_first"}, {"store_cache": ".cs"},
         {"l2_load": "evict_first", "store_cache": ".cs"}]


def variants(mods: dict, op: str, B: int, hints: bool = False) -> list[tuple[str, str, dict]]:
    """``(kind, label, kwargs)`` of the candidates at a cell: ``cfg`` for every config of the
    builder's autotune list (the tuner's choices), ``extra`` for shapes outside it (with
    ``hints``, also ``HINTS`` on the default shape and two chunkings, with and without PDL)."""
    out = [("cfg", _label(c.kwargs), dict(c.kwargs)) for c in getattr(mods[op], BUILDERS[op][2])]
    extra: list[dict] = []
    if op == "swiglu":
        for threads in (128, 256, 512):
            for chunks in (1, 2, 4):
                for pdl in (True, False):
                    extra.append({"threads": threads, "chunks": chunks, "pdl": pdl})
        extra.append({"chunks": 2, "pdl": True, "pdl_prefetch": False})
    else:
        for chunks in (None, 1, 2, 8):
            shape = {} if chunks is None else {"chunks": chunks}
            extra.append({**shape, "pdl": True, "pdl_prefetch": False})
            extra.append({**shape, "pdl": False, "store_cache": ".cs"})
        if op == "layer_norm":  # one all-reduce of (mean, m2) pairs, at every chunking
            for chunks in (1, 2, 4):
                for pdl in (True, False):
                    extra.append({"welford": True, "chunks": chunks, "pdl": pdl})
            for threads in (128, 512):
                extra.append({"welford": True, "threads": threads, "pdl": False})
                extra.append({"threads": threads, "pdl": False})
        if B <= 512:  # few rows: two rows per CTA of 128-thread rows (half the CTAs)
            for pdl in (True, False):
                extra.append({"threads": 128, "rows": 2, "pdl": pdl})
    if hints:
        shapes = [{"threads": 128}, {"threads": 128, "chunks": 2}] if op == "swiglu" else \
            [{}, {"chunks": 2}, {"chunks": 8}]
        extra += [{**shape, **h, "pdl": pdl} for shape in shapes for h in HINTS
                  for pdl in (True, False)]
    have = {_label(kw) for _, _, kw in out}
    out += [("extra", _label(kw), kw) for kw in extra if _label(kw) not in have]
    return out


def _rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    if not bool(a.isfinite().all()):
        return math.inf
    return float((a - b).norm() / b.norm())


def _tuner_record(k, device: str) -> dict | None:
    """The tuner's record of a default call on ``device`` (winner, every timed config), if any."""
    try:
        from pyptx.autotune import _read_choice

        return _read_choice(k._disk_key(device))
    except Exception:  # noqa: BLE001 - a record is a bonus
        return None


def _regs(k) -> str:
    """Registers per thread from ptxas ('' without ptxas)."""
    try:
        from pyptx.ptxas import check

        kk = getattr(k, "kernels", [k])
        return "/".join(str(check(x.specialize()).entries[0].registers) for x in kk)
    except Exception:  # noqa: BLE001
        return ""


def probe_cell(torch, mb, mods, peers, cell: str, rounds: int, log, hints: bool = False) -> dict:
    """Tune the default call, check and time every variant and the peers at one cell."""
    from pyptx.autotune import Config

    interleaved = load_module(ROOT / "benchmarks" / "_timing.py", "probe_timing").interleaved

    op, dt, B, N = parse_cell(cell)
    tdt = torch.float32 if dt == "f32" else torch.bfloat16
    nbytes = mb.traffic(op, B, N, 4 if dt == "f32" else 2)
    inputs = mb.make_inputs(torch, op, B, N, tdt)
    want = mb.eager_fns(torch)[op](*[t.double() for t in inputs])
    tol = 1e-5 if dt == "f32" else 1e-2
    tb = builder(mods, op)
    shape_args = (B, N, dt) + ((EPS[op],) if op in EPS else ())
    timer = mb.Timer(torch, "do_bench")

    def gbs(ms: float) -> float:
        return nbytes / ms / 1e6

    res: dict = {"cell": cell, "bytes": nbytes, "variants": [], "peers": {}}
    default = tb(*shape_args)
    t0 = time.time()
    got = default(*inputs)  # tunes here (the tuner's TorchTimer flushes L2 like do_bench)
    res["tune_s"] = time.time() - t0
    res["default_err"] = _rel_err(got, want)
    choice = default.choice
    res["default_choice"] = choice.config.describe() if choice else "?"
    rec = _tuner_record(default, torch.cuda.get_device_name(0)) or {}
    tuned = {Config(**t["config"]).describe(): t["us"] for t in rec.get("timed", [])}
    res["tuner_us"] = tuned
    fns = {"default": default} if res["default_err"] < tol else {}
    if not fns:
        log(f"  {cell} default call WRONG: rel err {res['default_err']:.2e}")
    seen: dict = {}
    for kind, label, kw in variants(mods, op, B, hints):
        v = {"kind": kind, "label": label, "kwargs": kw}
        res["variants"].append(v)
        try:
            k = tb(*shape_args, config=mods[op].RowConfig(**kw))
            kk = getattr(k, "kernels", [k])
            ident = tuple((x.specialize().ptx(), x.specialize().grid, x.specialize().block,
                           x.specialize().pdl) for x in kk)
            if ident in seen:
                v["same_as"] = seen[ident]
                continue
            seen[ident] = label
            v["plan"] = mb.describe(k)
            v["regs"] = _regs(k)
            v["err"] = _rel_err(k(*inputs), want)
        except Exception as e:  # noqa: BLE001 - a shape this size refuses: say so, go on
            v["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
            continue
        if v["err"] >= tol:
            log(f"  {cell} {label}: WRONG rel err {v['err']:.2e}")
            continue
        fns[f"v:{label}"] = k
    for name, fn in peers.items():
        try:
            fn(*inputs)
            fns[f"p:{name}"] = fn
        except Exception as e:  # noqa: BLE001
            log(f"  {cell} {name}: {type(e).__name__}: {e}")
    per = interleaved(lambda f: timer.ms(f, [inputs]).ms, fns, rounds)
    med = {n: gbs(statistics.median(v)) for n, v in per.items()}
    res["gbs"] = med
    res["rounds_gbs"] = {n: [gbs(ms) for ms in v] for n, v in per.items()}
    peer_gbs = {n[2:]: g for n, g in med.items() if n.startswith("p:")}
    best_peer = max(peer_gbs, key=peer_gbs.get) if peer_gbs else None
    bp = peer_gbs.get(best_peer, 0.0) if best_peer else 0.0
    res["peers"] = peer_gbs
    res["best_peer"] = best_peer

    def ratio(g: float) -> float:
        return g / bp if bp else math.inf

    by_label = {v["label"]: v for v in res["variants"]}
    lines = []
    for n, g in sorted(med.items(), key=lambda kv: -kv[1]):
        if n.startswith("v:"):
            v = by_label[n[2:]]
            us = tuned.get(v["label"])
            lines.append(f"    {g:6.0f} GB/s {ratio(g):6.3f}x  {v['kind']:5s} {v['label']:40s} "
                         f"regs {v.get('regs') or '?':>5s}"
                         + (f"  tuner {us:.2f} us" if us is not None else "")
                         + f"  [{v['plan']}]")
        elif n == "default":
            lines.append(f"    {g:6.0f} GB/s {ratio(g):6.3f}x  DEFAULT CALL (tuner chose "
                         f"{res['default_choice']})")
        else:
            lines.append(f"    {g:6.0f} GB/s {ratio(g):6.3f}x  peer  {n[2:]}")
    dups = [f"{v['label']} == {v['same_as']}" for v in res["variants"] if "same_as" in v]
    errs = [f"{v['label']}: {v['error']}" for v in res["variants"] if "error" in v]
    log(f"{cell}  (tuning {res['tune_s']:.1f} s; {len(fns)} timed x {rounds} rounds)")
    log("\n".join(lines))
    if dups:
        log("    same kernel: " + "; ".join(dups))
    if errs:
        log("    not built: " + "; ".join(errs))
    vs = [(g, n[2:]) for n, g in med.items() if n.startswith("v:")]
    cfg = [(g, lab) for g, lab in vs if by_label[lab]["kind"] == "cfg"]
    best_v = max(vs) if vs else (0.0, "-")
    best_c = max(cfg) if cfg else (0.0, "-")
    d = med.get("default", 0.0)
    res["summary"] = {"default": ratio(d), "best_variant": ratio(best_v[0]),
                      "best_variant_label": best_v[1], "best_config": ratio(best_c[0]),
                      "best_config_label": best_c[1]}
    log(f"CELL {cell}: best peer {best_peer} {bp:.0f} | default {d:.0f} {ratio(d):.3f}x "
        f"({res['default_choice']}) {'PASS' if ratio(d) >= 1.0 else 'FAIL'} | best variant "
        f"{best_v[0]:.0f} {ratio(best_v[0]):.3f}x ({best_v[1]}) | best config "
        f"{best_c[0]:.0f} {ratio(best_c[0]):.3f}x ({best_c[1]})")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default=",".join(LOSING),
                    help="op:dtype:BxN,... (default: session 7's losing cells)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="no inductor peer")
    ap.add_argument("--out", help="write every number as JSON here")
    ap.add_argument("--hints", action="store_true", help="also the HINTS variants")
    a = ap.parse_args(argv)
    cells = [c for c in a.cells.split(",") if c]
    for c in cells:
        parse_cell(c)

    import torch

    if not torch.cuda.is_available():
        print("probe_rowwise.py needs a CUDA GPU")
        return 2
    mb = load_module(ROOT / "benchmarks" / "memory_bound.py", "probe_mb")
    mods = modules()
    eager = mb.eager_fns(torch)
    tri = mb.make_triton(torch) or {}

    def log(*x):
        print(*x, flush=True)

    log(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}; timer: "
        f"{mb.timer_desc('do_bench')}; {a.rounds} interleaved rounds, medians")
    try:  # one graph per cell: keep dynamo from falling back to eager after a few shapes
        import torch._dynamo

        cfg = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(cfg, name):
                setattr(cfg, name, max(64, getattr(cfg, name)))
    except Exception:  # noqa: BLE001
        pass
    out = []
    t0 = time.time()
    for cell in cells:
        op = parse_cell(cell)[0]
        peers = {"eager": eager[op]}
        if not a.no_compile:
            peers["inductor"] = torch.compile(eager[op], dynamic=False)
        if op in tri:
            peers["triton"] = tri[op]
        out.append(probe_cell(torch, mb, mods, peers, cell, a.rounds, log, a.hints))
        log(f"  [{time.time() - t0:.0f} s]")
    log("\nSUMMARY (ratios to the best peer, do_bench medians)")
    for r in out:
        s = r["summary"]
        log(f"  {r['cell']:26s} default {s['default']:.3f}x ({r['default_choice']}) | best "
            f"variant {s['best_variant']:.3f}x ({s['best_variant_label']}) | best config "
            f"{s['best_config']:.3f}x ({s['best_config_label']})")
    n_pass = sum(r["summary"]["default"] >= 1.0 for r in out)
    log(f"  default call >= 1.0x best peer: {n_pass}/{len(out)}; a variant >= 1.0x: "
        f"{sum(r['summary']['best_variant'] >= 1.0 for r in out)}/{len(out)}")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(0),
                                           "rounds": a.rounds, "cells": out}, indent=1))
        log(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
