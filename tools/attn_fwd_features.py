"""Time the attention forward's new paths on the GPU (~2 minutes on an H200).

1. Head dim 64 at a short sequence (``--shape``, default B 8, S 1024, H 16, D 64, full and
   causal): every ``ATTENTION_CONFIGS`` plan, the default call (its plan chosen without
   timing) and SDPA's cuDNN / flash / efficient backends, paired (``pyptx.testing``), as
   TFLOP/s and the ratio over the best SDPA backend.
2. The sliding window: B 1, S 32768, Hq 16 / Hkv 4, D 128: full, causal, and causal with a
   4096-key window; the window's time over full attention's (target <= 0.2).
3. ``(B, H, S, D)`` inputs read in place: ``attention(layout="bhsd")`` on contiguous
   ``(B, H, S, D)`` tensors beside ``layout="bshd"`` (equal times: no copies).
4. The host time of a first call at a new sequence length in a warm process.

    python tools/attn_fwd_features.py [--pairs 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def _median(times):
    return statistics.median(times)


def short_sequence(B, S, H, D, pairs):
    import torch
    from attention import sdpa_call  # benchmarks/attention.py
    from pyptx_kernels.flash_attention import fwd_config, fwd_host

    from pyptx.errors import PyptxError
    from pyptx.testing import paired_ratio, paired_times

    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for causal in (False, True):
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        fns = {"default": partial(fwd_host.attention_forward, q, k, v, causal=causal)}
        for plan in fwd_config.ATTENTION_CONFIGS:
            try:
                fwd_host.attention_forward(q, k, v, causal=causal, config=plan)
            except PyptxError:
                continue
            fns[plan.name] = partial(fwd_host.attention_forward, q, k, v, causal=causal,
                                     config=plan)
        peers = []
        for be in ("cuDNN", "flash", "efficient"):
            f = sdpa_call(be, causal)
            try:
                f(q, k, v)
                torch.cuda.synchronize()
            except RuntimeError:
                continue
            fns[be] = partial(f, q, k, v)
            peers.append(be)
        times = paired_times(fns, pairs)
        best = min(peers, key=lambda n: _median(times[n]))
        chosen = fwd_host.PLANNER.choose(dict(B=B, S=S, Hq=H, D=D, causal=causal))
        print(f"\nB {B}, S {S}, H {H}, D {D}, {'causal' if causal else 'full'} "
              f"(default call's plan: {chosen[0]}, from the {chosen[1]}); best SDPA: {best}")
        for name in fns:
            ms = _median(times[name])
            r, lo, hi = paired_ratio(times, best, name)
            print(f"  {name:18s} {ms * 1e3:8.1f} us  {flops / ms / 1e9:6.1f} TFLOP/s  "
                  f"{r:.3f}x [{lo:.3f}, {hi:.3f}] over {best}")


def window(pairs):
    import torch
    from pyptx_kernels.flash_attention import fwd_host

    from pyptx.testing import paired_times

    S = 32768
    q = torch.randn(1, S, 16, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, S, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    fns = {"full": lambda: fwd_host.attention_forward(q, k, v),
           "causal": lambda: fwd_host.attention_forward(q, k, v, causal=True),
           "causal, window 4096": lambda: fwd_host.attention_forward(q, k, v, causal=True,
                                                                    window=(4096, -1)),
           "window (2048, 2048)": lambda: fwd_host.attention_forward(q, k, v,
                                                                    window=(2048, 2048))}
    for f in fns.values():
        f()
    times = paired_times(fns, max(5, pairs // 3))
    full = _median(times["full"])
    print(f"\nsliding window, S {S}, Hq 16 / Hkv 4, D 128 (target: window <= 0.2x full)")
    for name in fns:
        ms = _median(times[name])
        print(f"  {name:22s} {ms:8.3f} ms  {ms / full:.3f}x full")


def layouts(pairs):
    import torch
    from pyptx_kernels.flash_attention import attention

    from pyptx.testing import paired_times

    B, S, H, D = 4, 4096, 16, 128
    bshd = [torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    bhsd = [torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    with torch.no_grad():
        fns = {"bshd": lambda: attention(*bshd, causal=True),
               "bhsd (in place)": lambda: attention(*bhsd, causal=True, layout="bhsd"),
               "bhsd copied": lambda: attention(*(x.transpose(1, 2).contiguous() for x in bhsd),
                                                causal=True)}
        for f in fns.values():
            f()
        times = paired_times(fns, pairs)
    print(f"\nlayouts, B {B}, S {S}, H {H}, D {D}, causal (torch op, no grad)")
    for name in fns:
        print(f"  {name:16s} {_median(times[name]):8.3f} ms")


def first_calls():
    import torch
    from pyptx_kernels.flash_attention import fwd_host

    print("\nhost time of a call (warm process; the first length compiles the family)")
    for S in (1000, 1001, 1500, 1000):
        q = torch.randn(2, S, 16, 128, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        t = time.perf_counter()
        fwd_host.attention_forward(q, q, q, causal=True)
        host = time.perf_counter() - t
        torch.cuda.synchronize()
        print(f"  S {S}: {host * 1e3:8.2f} ms")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--shape", type=int, nargs=4, default=[8, 1024, 16, 64],
                   metavar=("B", "S", "H", "D"))
    a = p.parse_args()
    short_sequence(*a.shape, a.pairs)
    window(a.pairs)
    layouts(a.pairs)
    first_calls()


if __name__ == "__main__":
    main()
