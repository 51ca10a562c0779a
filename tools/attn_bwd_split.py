"""Where the attention backward's time goes: do_bench medians (L2 flushed) of the whole
default backward and of each of its kernels alone, at the benchmark's rows (bf16, B*S = 32768
tokens, H*D = 2048). ``python tools/attn_bwd_split.py [D ...] [--options dq_bkv=64]``."""
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
fa = load_module(ROOT / "examples/hopper/flash_attention.py", "fa_split")
fab = load_module(ROOT / "examples/hopper/flash_attention_bwd.py", "fab_split")

args = sys.argv[1:]
opts = fab.parse_options(args[args.index("--options") + 1]) if "--options" in args else {}
dims = [int(a) for a in args if a.isdigit()] or [64, 128]
print(f"# backward split on {torch.cuda.get_device_name()}, options {opts}: us (TFLOP/s of the whole)")
print("| D | S | causal | whole | dQ kernel | dK/dV kernel | sum | whole - sum |")
print("|---|---|---|---|---|---|---|---|")
for D in dims:
    for S in (4096, 8192):
        for causal in (False, True):
            B, H = 32768 // S, 2048 // D
            q, k, v, do = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
                           for _ in range(4))
            o, lse = fa.attention_forward(q, k, v, causal=causal)
            bwd = fab.build_attention_backward(B, S, H, H, D, causal=causal, **opts)
            flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
            if bwd.atomic_dq:
                print(f"| {D} | {S} | {causal} | (atomic dQ: no split) |")
                continue
            dq, stats = bwd.kernels[0](q, k, v, o, lse, do)
            a = (q, k, v, o, lse, do)
            t_all = do_bench(lambda b=bwd, a=a: b(*a), return_mode="median")
            t_dq = do_bench(lambda b=bwd, a=a: b.kernels[0](*a), return_mode="median")
            t_kv = do_bench(lambda b=bwd, a=(q, k, v, do, stats): b.kernels[1](*a),
                            return_mode="median")
            print(f"| {D} | {S} | {causal} | {t_all * 1e3:.0f} ({flops / t_all / 1e9:.0f}) | "
                  f"{t_dq * 1e3:.0f} | {t_kv * 1e3:.0f} | {(t_dq + t_kv) * 1e3:.0f} | "
                  f"{(t_all - t_dq - t_kv) * 1e3:.0f} |", flush=True)
