"""A/B of the varlen attention forward's tile options (``attention_varlen_forward`` keywords)
against its defaults, on the cases of ``benchmarks/attention_varlen.py``: each option's
output is checked against the default's, then all are timed interleaved (do_bench median of
rotated rounds, L2 flushed), bf16.

    python tools/attn_varlen_ab.py [--configs '[{}, {"stages": 3}]'] [--dims 64 128]
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from attention import _time  # noqa: E402
from attention_varlen import flops, seq_lengths  # noqa: E402

from pyptx.testing import load_module  # noqa: E402

CONFIGS = [{}, {"stages": 3}, {"BN": 64}, {"BN": 176}, {"schedule": "overlap"},
           {"consumers": 2}]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=json.dumps(CONFIGS))
    p.add_argument("--dims", nargs="+", type=int, default=[64, 128])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    import torch

    fa = load_module(ROOT / "examples/hopper/flash_attention.py", "attn_varlen_ab")
    configs = json.loads(a.configs)
    for D in a.dims:
        H = 2048 // D
        for kind in ("uniform", "ragged"):
            lengths = seq_lengths(kind, 32768, 4096)
            T, m = sum(lengths), max(lengths)
            cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))],
                              device="cuda", dtype=torch.int32)
            q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (False, True):
                base = fa.attention_varlen_forward(q, k, v, cu, cu, m, m, causal=causal)[0]
                fns = {}
                for c in configs:
                    name = json.dumps(c)
                    try:
                        o = fa.attention_varlen_forward(q, k, v, cu, cu, m, m, causal=causal, **c)[0]
                        d = (o.float() - base.float()).abs().max().item()
                    except Exception as ex:  # noqa: BLE001
                        print(f"  {name}: {type(ex).__name__}: {ex}"[:200])
                        continue
                    if d > 0.05:
                        print(f"  {name}: max diff to the default {d:.2e}: FAIL")
                        continue
                    args = (q, k, v, cu, cu, m, m)
                    fns[name] = (lambda c=c, args=args, causal=causal:
                                 fa.attention_varlen_forward(*args, causal=causal, **c))
                fl = flops(lengths, H, D, causal)
                cells = "  ".join(f"{n} {fl / ms / 1e9:.0f}"
                                  for n, ms in _time(fns, 100, a.rounds).items())
                print(f"D={D} {kind} {'causal' if causal else 'full'}: {cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
