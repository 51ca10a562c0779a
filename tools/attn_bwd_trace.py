"""Where the attention backward's dK/dV grid spends its time, from ``build_dkdv(trace=True)``:
per CTA its start and end (``%globaltimer``), its SM and the time its dQ writer waited for its
turn. Prints, per option set, the grid's span, the CTA times, the waits (and whether they sit
in heads whose CTAs started far apart, e.g. across a wave boundary), the SM time left idle
after each SM's last CTA, and the converters' timing (``dq_convert``).

    python tools/attn_bwd_trace.py                      # D=128, S=4096 and 8192 full, causal
    python tools/attn_bwd_trace.py --opts "atomic_dq=1,dq_bulk=1,dq_ordered=1"
    python tools/attn_bwd_trace.py --group 4 --shapes 4096:causal --opts \
        "atomic_dq=1,dq_bulk=1,dq_ordered=1,dq_convert=1" \
        "atomic_dq=1,dq_bulk=1,dq_ordered=1,dq_convert=1,kv_split=2"   # grouped heads
    python tools/attn_bwd_trace.py --group 4 --shapes 16384:causal --opts \
        "atomic_dq=1,dq_bulk=1,dq_ordered=1,dq_convert=1,dq_chains=2"  # two chains per q block

``summarize`` is pure numpy (tested on the CPU with a made-up trace).
"""
from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import numpy as np

from pyptx.errors import PyptxError

ROOT = Path(__file__).resolve().parents[1]
OPTS = ("atomic_dq=1,dq_bulk=1", "atomic_dq=1,dq_bulk=1,dq_ordered=1",
        "atomic_dq=1,dq_bulk=1,dq_ordered=1,dq_convert=1",
        "atomic_dq=1,dq_bulk=1,dq_ordered=1,dq_convert=1,convert_lag=auto",
        "atomic_dq=1,dq_bulk=1,dq_ordered=1,dq_convert=1,convert_lag=auto,stats_lead=auto")


def summarize(trace, n_main, per_head):
    """Numbers (µs) from a ``(CTAs, 4)`` int32 trace (start, end, SM, wait ns) whose first
    ``n_main`` rows are the dK/dV CTAs in launch order, ``per_head`` consecutive ones per kv
    head; the rest are converters."""
    t = trace.astype(np.int64) & 0xFFFFFFFF

    def since_first(x):     # ns after the first CTA's start, through the clock's wrap
        return ((x - t[0, 0] + 2**31) & 0xFFFFFFFF) - 2**31

    first = since_first(t[:, 0]).min()
    start = (since_first(t[:, 0]) - first) / 1e3
    end = (since_first(t[:, 1]) - first) / 1e3
    sm, wait = t[:, 2], t[:, 3] / 1e3
    main = slice(0, n_main)
    span = end.max()
    dur = end[main] - start[main]
    heads = n_main // per_head
    spread = (start[main].reshape(heads, per_head).max(1)
              - start[main].reshape(heads, per_head).min(1))
    head_wait = wait[main].reshape(heads, per_head).sum(1)
    far = spread > np.median(dur) / 2
    last_main = end[main].max()
    idle = sum(span - end[sm == s].max() for s in np.unique(sm))     # after each SM's last CTA
    out = {
        "span": span, "main_end": last_main, "ctas": n_main,
        "dur_p10": np.percentile(dur, 10), "dur_med": np.median(dur),
        "dur_p90": np.percentile(dur, 90), "dur_max": dur.max(),
        "wait_sum": wait[main].sum(), "wait_med": np.median(wait[main]),
        "wait_max": wait[main].max(), "wait_share": wait[main].sum() / dur.sum(),
        "far_heads": int(far.sum()), "heads": heads,
        "far_head_wait": head_wait[far].mean() if far.any() else 0.0,
        "near_head_wait": head_wait[~far].mean() if (~far).any() else 0.0,
        "tail_idle": idle, "sms": len(np.unique(sm)),
    }
    if len(t) > n_main:
        conv = slice(n_main, None)
        out.update(conv_first=start[conv].min(), conv_end=end[conv].max(),
                   conv_after_main=end[conv].max() - last_main, conv_wait=wait[conv].sum())
    return out


def report(name, s):
    """One markdown paragraph of ``summarize``'s numbers."""
    text = (f"- **{name}**: span {s['span']:.0f} µs (dK/dV CTAs end at {s['main_end']:.0f}); "
            f"{s['ctas']} CTAs on {s['sms']} SMs, duration p10/median/p90/max "
            f"{s['dur_p10']:.0f}/{s['dur_med']:.0f}/{s['dur_p90']:.0f}/{s['dur_max']:.0f} µs; "
            f"writer waits {s['wait_sum']:.0f} CTA·µs in all ({100 * s['wait_share']:.1f}% of CTA "
            f"time; median {s['wait_med']:.1f}, max {s['wait_max']:.0f}); heads whose CTAs "
            f"started over half a CTA apart: {s['far_heads']} of {s['heads']}, waiting "
            f"{s['far_head_wait']:.0f} µs per head against {s['near_head_wait']:.0f}; SM time "
            f"idle after each SM's last CTA {s['tail_idle']:.0f} SM·µs "
            f"({s['tail_idle'] / s['sms']:.1f} µs per SM)")
    if "conv_end" in s:
        text += (f"; converters from {s['conv_first']:.0f} to {s['conv_end']:.0f} µs "
                 f"({s['conv_after_main']:.0f} after the last dK/dV CTA), waiting "
                 f"{s['conv_wait']:.0f} CTA·µs")
    return text + "."


def run(S, causal, opts, D=128, tokens=32768, width=2048, group=1):
    """Trace one call (after three warm ones) of the backward with these options
    (``group`` q heads per kv head)."""
    import torch


    fab = importlib.import_module("pyptx_kernels.flash_attention.backward")
    B, H = tokens // S, width // D
    Hkv = H // group
    kw = fab.parse_options(opts)
    split = kw.get("kv_split", 1)
    q, do, o = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lse = importlib.import_module("pyptx_kernels.flash_attention.bwd_reference")._lse(
        q, k.repeat_interleave(group, 2), causal)
    ordered = kw.get("dq_ordered", False)
    if kw.get("dq_chains") == "auto":
        kw["dq_chains"] = fab.default_dq_chains(S, S, H, Hkv, D, causal) if ordered else 1
    chains = kw.get("dq_chains", 1)
    w = fab.dq_accumulator_width(D, True, chains)
    kw["stats_lead"] = fab.resolve_stats_lead("attn_bwd_trace", kw.get("stats_lead", 0), S,
                                              132, ordered, False, None, causal,
                                              kv_split=split)
    prep = fab.build_prep(B, S, H, D, counters=ordered, width=w, lead=kw["stats_lead"],
                          Hkv=Hkv, chains=chains)
    dkdv = fab.build_dkdv(B, S, H, Hkv, D, causal=causal, trace=True, **kw)
    extra = (o, lse) if kw["stats_lead"] else ()
    for _ in range(4):
        stats, acc, *sem = prep(o, lse, do)
        *_, trace = dkdv(q, k, v, do, stats, acc, *sem, *extra)
    torch.cuda.synchronize()
    num_kv = -(-S // fab.BM)
    return summarize(trace.cpu().numpy(), B * Hkv * num_kv * split, num_kv * split)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--opts", nargs="*", default=list(OPTS))
    p.add_argument("--shapes", nargs="*", default=["4096:full", "8192:full", "8192:causal"])
    p.add_argument("--group", type=int, default=1, help="q heads per kv head")
    a = p.parse_args(argv)
    for shape in a.shapes:
        S, mask = shape.split(":")
        print(f"\n### D=128 S={S} {mask}")
        for opts in a.opts:
            try:
                print(report(opts, run(int(S), mask == "causal", opts, group=a.group)),
                      flush=True)
            except PyptxError as e:     # an option set this shape refuses (convert_lag: causal)
                print(f"- **{opts}**: {str(e).splitlines()[0]}", flush=True)


if __name__ == "__main__":
    main()
