"""The GEMMs of a Llama training step, in the layouts autograd passes them, pyptx beside cuBLAS.

Every linear layer ``y = x @ W.T`` (x ``(T, in)``, W ``(out, in)``) runs three GEMMs:
forward ``x @ W.T`` (both operands K-major), the input gradient ``dy @ W`` (W read
row-major) and the weight gradient ``dy.T @ x`` (both operands transposed views). The
layers of a Llama-family block are the fused q/k/v projection (``out = (Hq + 2 Hkv) D``),
the output projection, the gate/up projection (``2 I``) and the down projection, and the LM
head (``vocab``). pyptx is ``pyptx_kernels.matmul`` on the same views as ``torch.matmul``
(default calls: the shipped table or the heuristic; nothing timed). Timing:
``triton.testing.do_bench`` (L2 flushed), median of ``--rounds`` interleaved rounds in
rotated order, plus the paired ratio (``pyptx.testing.paired_times``).

    python benchmarks/gemm_model.py [--model llama-2048] [--tokens 8192] [--out t.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_timing.py

from _timing import gpu_missing, rotated  # noqa: E402

from pyptx.testing import paired_ratio, paired_times  # noqa: E402

MODELS = {  # hidden, heads, kv heads, head dim, MLP width, vocabulary
    "llama-2048": (2048, 16, 4, 128, 5632, 32000),
    "llama3-8b": (4096, 32, 8, 128, 14336, 128256),
    "mistral-7b": (4096, 32, 8, 128, 14336, 32000),
}


def layers(model):
    """``(name, in, out)`` of each linear layer of one block and of the LM head."""
    hidden, hq, hkv, d, inter, vocab = MODELS[model]
    return [("qkv", hidden, (hq + 2 * hkv) * d), ("o", hq * d, hidden),
            ("gate_up", hidden, 2 * inter), ("down", inter, hidden), ("lm_head", hidden, vocab)]


def gemms(T, fan_in, fan_out, torch):
    """``{pass: (a, b)}`` of one layer's three GEMMs, as autograd hands them over."""
    x = torch.randn(T, fan_in, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(fan_out, fan_in, device="cuda", dtype=torch.bfloat16) * fan_in ** -0.5
    dy = torch.randn(T, fan_out, device="cuda", dtype=torch.bfloat16)
    return {"fwd": (x, w.T), "dgrad": (dy, w), "wgrad": (dy.T, x)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="llama-2048")
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per step (B * S)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--out", help="also write the table to this markdown file")
    a = ap.parse_args(argv)
    missing = gpu_missing("gemm_model.py")
    if missing:
        print(missing)
        return 2
    import pyptx_kernels as pk
    import torch
    from triton.testing import do_bench

    rows = [f"# GEMMs of a {a.model} step, {a.tokens} tokens, bf16 ({torch.cuda.get_device_name()})",
            "", "| layer | pass | M x N x K | pyptx TFLOP/s | cuBLAS TFLOP/s | ratio | paired |",
            "|---|---|---|---:|---:|---:|---:|"]
    print("\n".join(rows), flush=True)
    for name, fan_in, fan_out in layers(a.model):
        for kind, (x, y) in gemms(a.tokens, fan_in, fan_out, torch).items():
            M, K = x.shape
            N = y.shape[1]
            want = x.double() @ y.double()
            got = pk.matmul(x, y).double()
            err = ((got - want).norm() / want.norm()).item()
            fns = {"pyptx": lambda x=x, y=y: pk.matmul(x, y),
                   "cublas": lambda x=x, y=y: torch.matmul(x, y)}
            ms = {k: [] for k in fns}
            for r in range(a.rounds):
                for k in rotated(list(fns), r):
                    ms[k].append(do_bench(fns[k], warmup=10, rep=40))
            med = {k: statistics.median(v) for k, v in ms.items()}
            tflops = {k: 2 * M * N * K / (v * 1e-3) / 1e12 for k, v in med.items()}
            paired = paired_ratio(paired_times(fns, a.pairs), "cublas", "pyptx")[0]
            line = (f"| {name} | {kind} | {M}x{N}x{K} | {tflops['pyptx']:.0f} | "
                    f"{tflops['cublas']:.0f} | {med['cublas'] / med['pyptx']:.3f} | "
                    f"{paired:.3f} |" + ("" if err < 1e-2 else f" WRONG (rel err {err:.1e})"))
            print(line, flush=True)
            rows.append(line)
            del x, y, want, got
    if a.out:
        Path(a.out).write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
