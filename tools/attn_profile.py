"""Run one attention case a few times so that ``ncu`` can profile one launch of each kernel:
``python tools/attn_profile.py fwd|bwd D S [causal] [key=value ...]`` (bf16, B*S = 32768
tokens, H*D = 2048: the benchmark's rows). Forward options (``BN=176``, ``stages=3``,
``pin_overlap=1``...) pass through to ``attention_forward``. Used by
``tools/device_profile.sh``; prints the kernel time under do_bench for reference."""
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
fa = load_module(ROOT / "examples/hopper/flash_attention.py", "fa_profile")
fab = load_module(ROOT / "examples/hopper/flash_attention_bwd.py", "fab_profile")

kind, D, S = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
causal = "causal" in sys.argv[4:]
opts = {}
for a in sys.argv[4:]:
    if "=" in a:
        key, val = a.split("=", 1)
        opts[key] = None if val == "none" else (float(val) if "." in val else int(val))
B, H = 32768 // S, 2048 // D
q, k, v, do = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
flops = 4 * B * H * S * S * D / (2 if causal else 1)
if kind == "fwd":
    def step():
        return fa.attention_forward(q, k, v, causal=causal, **opts)
else:
    o, lse = fa.attention_forward(q, k, v, causal=causal)
    bwd = fab.build_attention_backward(B, S, H, H, D, dtype="bf16", causal=causal, **opts)
    flops *= 2.5

    def step():
        return bwd(q, k, v, o, lse, do)
for _ in range(3):
    step()
torch.cuda.synchronize()
if "--no-time" not in sys.argv:
    ms = do_bench(step, return_mode="median")
    print(f"{kind} D={D} S={S} causal={causal} {opts}: {ms * 1e3:.1f} us {flops / ms / 1e9:.0f} TFLOP/s")
