"""GEMM forward + backward TFLOP/s: ``matmul(x, w.T)`` of ``pyptx_kernels.gemm.host`` with
``loss.backward()`` (three tuned pyptx GEMMs: the forward, dX = dY W and dW = dYᵀ X, each in
the layout its operand is stored in) beside torch autograd of ``x @ w.T`` (cuBLAS), bf16.

FLOPs: ``3 * 2 * M * N * K`` per step. Timing: ``triton.testing.do_bench`` (L2 flushed
between calls) of one step (forward and backward, gradients reset), median of ``--rounds``
interleaved rounds in rotated order; "paired" is ours over torch by
``pyptx.testing.paired_times`` (one step of each per round, L2 flushed before each).

    python benchmarks/gemm_backward.py [--shapes 4096 8192x28672x8192] [--out t.md]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_timing.py

from _timing import gpu_missing, rotated  # noqa: E402

from pyptx.testing import paired_ratio, paired_times  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 28672, 8192), (16384, 4096, 4096)]


def _steps(gemm, x, w, dy):
    """One training step of each contender: ``y = x @ w.T``, ``y.backward(dy)``."""

    def step(mm):
        x.grad = w.grad = None
        mm(x, w).backward(dy)

    return {"pyptx": lambda: step(lambda a, b: gemm.matmul(a, b.T)),
            "torch": lambda: step(lambda a, b: a @ b.T)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=None, help="MxNxK or N (cube)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    why = gpu_missing("gemm_backward.py")
    if why:
        print(why, file=sys.stderr)
        return 2
    import torch
    from triton.testing import do_bench

    shapes = SHAPES if not args.shapes else [
        tuple(int(v) for v in s.split("x")) if "x" in s else (int(s),) * 3 for s in args.shapes]
    gemm = importlib.import_module("pyptx_kernels.gemm.host")
    dev = torch.cuda.get_device_name()
    head = ["| M x N x K (x @ w.T) | pyptx fwd+bwd | torch autograd (cuBLAS) | pyptx / torch "
            "| paired | rel diff to torch (dx, dw) |", "|---|---|---|---|---|---|"]
    print(f"# GEMM forward + backward TFLOP/s on {dev}, bf16, do_bench median\n")
    print("\n".join(head), flush=True)
    lines = list(head)
    for M, N, K in shapes:
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)

        fns = _steps(gemm, x, w, dy)
        grads = {}
        for k, fn in fns.items():
            fn()
            grads[k] = (x.grad.float(), w.grad.float())
        err = max(((a - b).norm() / b.norm()).item() for a, b in zip(grads["pyptx"],
                                                                      grads["torch"]))
        t = {k: [] for k in fns}
        for r in range(args.rounds):
            for k in rotated(list(fns), r):
                t[k].append(do_bench(fns[k], return_mode="median"))
        flops = 6.0 * M * N * K
        tf = {k: flops / (statistics.median(v) * 1e-3) / 1e12 for k, v in t.items()}
        paired = "-"
        if args.pairs:
            paired = f"{paired_ratio(paired_times(fns, args.pairs), 'torch', 'pyptx')[0]:.3f}"
        line = (f"| {M}x{N}x{K} | {tf['pyptx']:.0f} | {tf['torch']:.0f} | "
                f"{tf['pyptx'] / tf['torch']:.3f} | {paired} | {err:.1e} |")
        print(line, flush=True)
        lines.append(line)
    if args.out:
        Path(args.out).write_text(f"GEMM forward + backward TFLOP/s on {dev} (bf16, do_bench "
                                  f"median)\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
