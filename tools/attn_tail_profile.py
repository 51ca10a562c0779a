"""Per-kernel CUDA times (torch.profiler, no L2 flush, mean of 10 calls) of the attention
backward at D=128, B*S = 32768, H = 16, for each option set given (``parse_options`` text):

    python tools/attn_tail_profile.py "atomic_dq=1,dq_bulk=1,dq_ordered=1" "...,dq_convert=1"
"""
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from pyptx.testing import load_module

fab = load_module(Path(__file__).resolve().parents[1] / "examples/hopper/flash_attention_bwd.py",
                  "flash_attention_bwd_profile")


def kernel_times(S, causal, opts, n=10):
    B, H, D = 32768 // S, 16, 128
    q, k, v, do, o = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
                      for _ in range(5))
    lse = fab._lse(q, k, causal)
    bwd = fab.build_attention_backward(B, S, H, H, D, causal=causal, **fab.parse_options(opts))
    for _ in range(3):
        bwd(q, k, v, o, lse, do)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            bwd(q, k, v, o, lse, do)
        torch.cuda.synchronize()
    t = defaultdict(float)
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t[e.name] += e.device_time / n
    return t


if __name__ == "__main__":
    for S, causal in ((4096, False), (8192, False), (8192, True)):
        for opts in sys.argv[1:]:
            t = kernel_times(S, causal, opts)
            print(f"S={S} causal={causal} {opts}: total {sum(t.values()):.0f} us; "
                  + "; ".join(f"{k} {v:.0f}" for k, v in sorted(t.items(), key=lambda kv: -kv[1])))
