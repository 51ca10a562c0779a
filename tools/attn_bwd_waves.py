"""Is the head-dim-128 backward's full-attention gap a tail effect? Its dK/dV kernel runs one
CTA per 128-key block and SM: B*H*S/128 CTAs, 4096 at the benchmark's rows = 31.03 waves of
132, so the last wave holds 4 CTAs. This times the backward (ours, deterministic default and
``deterministic=False``, and cuDNN's) at the benchmark's shape and at other head counts,
interleaved, TFLOP/s by do_bench median. At B*H = 132 (32 whole waves) the ordered mode's
rotated rings straddle the waves (docs/dev/attention-backward.md, session 20), so compare
head counts just under and just over a whole wave count instead (``--shapes 1x123,1x124``:
29.8 and 30.06 waves).

    python tools/attn_bwd_waves.py [--seq 4096] [--shapes 8x16,1x123,1x124]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from attention import _time, backward_fn, load_attention, sdpa_call  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--seq", type=int, default=4096)
p.add_argument("--dim", type=int, default=128)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--shapes", default=None, help="BxH,BxH,... (default: the benchmark's and "
               "four whole-wave ones)")
a = p.parse_args()
fa = load_attention()
S, D = a.seq, a.dim
base_h = 2048 // D
shapes = ([tuple(int(x) for x in t.split("x")) for t in a.shapes.split(",")] if a.shapes
          else [(32768 // S, base_h), (12, 11), (4, 33), (6, 22)])
for B, H in shapes:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 2.5 * 4.0 * B * H * S * S * D
    fns = {"pyptx": backward_fn(lambda x, y, z: fa.attention(x, y, z), q, k, v),
           "any order": backward_fn(lambda x, y, z: fa.attention(x, y, z, deterministic=False),
                                    q, k, v),
           "cuDNN": backward_fn(sdpa_call("cuDNN", False), q, k, v)}
    tf = {n: flops / (ms * 1e-3) / 1e12 for n, ms in _time(fns, 100, a.rounds).items()}
    ctas = B * H * (-(-S // 128))
    print(f"B={B} H={H} S={S} D={D}: {ctas} kv CTAs = {ctas / 132:.2f} waves; TFLOP/s pyptx "
          f"{tf['pyptx']:.0f} any order {tf['any order']:.0f} cuDNN {tf['cuDNN']:.0f} ratios "
          f"{tf['pyptx'] / tf['cuDNN']:.3f} / {tf['any order'] / tf['cuDNN']:.3f}",
          flush=True)
    del q, k, v, fns
    torch.cuda.empty_cache()
