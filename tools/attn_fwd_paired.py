"""Paired A/B of the attention forward's tile configs against cuDNN: every config of
``ATTENTION_CONFIGS`` named, the tuned default call, ``persistent=True`` and SDPA's cuDNN
backend, timed call by call in rotated rounds (``pyptx.testing.paired_times``); prints each
one's speed over cuDNN (median of the per-round ratios, quartiles) beside one ``do_bench``
median. Says whether the tuner's pick (chosen from do_bench bursts) is the fastest config
in the paired measure.

    python tools/attn_fwd_paired.py [--dims 64] [--seqs 4096 8192] [--masks causal] [--pairs 15]
                                    [--extra '[{"consumers": 3}]']   (more configs, JSON)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from attention import load_attention, sdpa_fn  # noqa: E402

from pyptx.testing import paired_ratio, paired_times  # noqa: E402


def main(argv=None) -> int:
    import torch
    from triton.testing import do_bench

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", nargs="+", type=int, default=[64])
    p.add_argument("--seqs", nargs="+", type=int, default=[4096, 8192])
    p.add_argument("--masks", nargs="+", default=["causal", "full"])
    p.add_argument("--pairs", type=int, default=15)
    p.add_argument("--extra", type=json.loads, default=[],
                   help="a JSON list of further attention_forward keyword sets to time")
    a = p.parse_args(argv)
    fa = load_attention()
    print(f"# forward configs over cuDNN on {torch.cuda.get_device_name()}: paired median "
          f"[quartiles] of {a.pairs} rounds, and one do_bench median (TFLOP/s)")
    for D in a.dims:
        H = 2048 // D
        for S in a.seqs:
            B = 32768 // S
            for mask in a.masks:
                causal = mask == "causal"
                q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
                args = (q, k, v)
                fns = {"tuned default": lambda a=args, c=causal: fa.attention_forward(*a, causal=c)}
                extra = [fa.Config(**kw) for kw in a.extra]
                for cfg in fa.ATTENTION_CONFIGS + [fa.Config(persistent=True)] + extra:
                    kw = dict(cfg.kwargs)
                    kw.setdefault("schedule", fa.DEFAULT_SCHEDULE)
                    name = ",".join(f"{n}={v}" for n, v in kw.items())
                    try:
                        fa.attention_forward(q, k, v, causal=causal, **kw)
                    except Exception as e:  # noqa: BLE001 - a config this head dim refuses
                        print(f"<!-- {name}: {type(e).__name__} -->")
                        continue
                    fns[name] = (lambda kw=kw, a=args, c=causal:
                                 fa.attention_forward(*a, causal=c, **kw))
                fns["cuDNN"] = sdpa_fn("cuDNN", q, k, v, causal)
                for f in fns.values():
                    f()
                torch.cuda.synchronize()
                per = paired_times(fns, a.pairs)
                print(f"\n### D={D} S={S} {mask}\n| config | paired over cuDNN | do_bench TFLOP/s |\n"
                      "|---|---|---|")
                for n, f in fns.items():
                    mid, lo, hi = paired_ratio(per, "cuDNN", n)
                    tf = flops / do_bench(f, return_mode="median") / 1e9
                    print(f"| {n} | {mid:.3f} [{lo:.3f}, {hi:.3f}] | {tf:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
