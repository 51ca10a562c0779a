"""Packed variable-length attention TFLOP/s: pyptx's ``attention_varlen`` (forward, and the
deterministic varlen backward pair) beside ``torch.nn.attention.varlen.varlen_attn`` (torch's
flash-attention varlen kernels) and beside pyptx's dense ``attention`` on the same tokens when
every sequence has one length (the cost of reading lengths on the device), bf16.

Cases: head dim 64 and 128 (H * D = 2048), causal and full, ``--tokens`` packed tokens in
sequences of one length (``uniform``: ``--seq`` each) or of random lengths (``ragged``: a
fixed seed, lengths 1 .. 2 * ``--seq``, the last one cut so they sum to ``--tokens``). FLOPs:
``4 * H * D * sum(S_b^2)`` forward (``2 * H * D * S_b * (S_b + 1)`` causal), 2.5x that
backward. Timing: ``triton.testing.do_bench`` (L2 flushed between calls), median of
``--rounds`` interleaved rounds in rotated order; the backward rows time
``torch.autograd.grad`` after one forward (as ``benchmarks/attention.py``). "paired":
pyptx over torch's varlen by ``pyptx.testing.paired_times``. A contender whose output is off
the float64 reference of the first sequence's first 256 rows by more than ``ERR_LIMIT`` prints FAIL and is
not timed.

    python benchmarks/attention_varlen.py [--dims 64 128] [--lengths uniform ragged] [--out t.md]
"""

from __future__ import annotations

import argparse
import inspect
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_timing.py

from _timing import gpu_missing, markdown_table  # noqa: E402
from attention import _time, backward_fn  # noqa: E402

from pyptx.testing import paired_ratio, paired_times  # noqa: E402

ERR_LIMIT = 0.05


def seq_lengths(kind: str, tokens: int, seq: int, seed: int = 0) -> list[int]:
    """The batch's sequence lengths: ``tokens // seq`` of ``seq`` (uniform) or random ones."""
    if kind == "uniform":
        return [seq] * max(1, tokens // seq)
    rng, out = random.Random(seed), []
    while sum(out) < tokens:
        out.append(min(rng.randint(1, 2 * seq), tokens - sum(out)))
    return out


def flops(lengths: list[int], H: int, D: int, causal: bool) -> float:
    """Forward FLOPs of attention over the sequences (causal: the kept half and diagonal)."""
    return sum(2.0 * H * D * s * (s + 1) if causal else 4.0 * H * D * s * s for s in lengths)


def torch_varlen(causal: bool):
    """``f(q, k, v, cu, max_s)``: torch's varlen attention, causal by whichever keyword this
    torch has (``is_causal`` in 2.9, a ``(-1, 0)`` window from 2.10)."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    kw = ({} if not causal else {"is_causal": True} if "is_causal" in params
          else {"window_size": (-1, 0)})
    return lambda q, k, v, cu, m: varlen_attn(q, k, v, cu, cu, m, m, **kw)


def reference(q, k, v, causal: bool):
    """float64 attention of the first ``len(q)`` query rows of one sequence over its keys
    ``k, v``; ``(rows, H, D)`` in and out."""
    import torch

    qd, kd, vd = (x.double().transpose(0, 1) for x in (q, k, v))
    s = qd @ kd.transpose(1, 2) / q.shape[-1] ** 0.5
    if causal:
        hide = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(hide, float("-inf"))
    return (s.softmax(-1) @ vd).transpose(0, 1)


def run_case(fa, D: int, H: int, kind: str, lengths: list[int], causal: bool, args) -> list[str]:
    """One table row: check every contender against float64, then time forward and backward."""
    import torch

    T, max_s = sum(lengths), max(lengths)
    cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))],
                      device="cuda", dtype=torch.int32)
    torch.manual_seed(0)
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    tv = torch_varlen(causal)
    calls = {"pyptx": lambda a, b, c: fa.attention_varlen(a, b, c, cu, cu, max_s, max_s,
                                                          causal=causal),
             "torch varlen": lambda a, b, c: tv(a, b, c, cu, max_s)}
    if kind == "uniform":
        n, s = len(lengths), lengths[0]
        calls["pyptx dense"] = lambda a, b, c: fa.attention(
            *(x.view(n, s, H, D) for x in (a, b, c)), causal=causal).view(T, H, D)
    s0, rows = lengths[0], min(lengths[0], 256)
    ref = reference(q[:rows], k[:s0], v[:s0], causal)
    fwd, err = {}, 0.0
    for name, f in calls.items():
        try:
            with torch.no_grad():
                e = (f(q, k, v)[:rows].double() - ref).abs().max().item()
        except Exception as ex:  # noqa: BLE001 - print n/a and go on
            print(f"  {name}: {type(ex).__name__}: {ex}"[:300], flush=True)
            continue
        err = max(err, e)
        if not e <= ERR_LIMIT:
            print(f"  {name}: max |o - float64| {e:.2e} over {ERR_LIMIT}: FAIL", flush=True)
            continue
        fwd[name] = f
    fwd_calls = {n: (lambda f=f: f(q, k, v)) for n, f in fwd.items()}
    with torch.no_grad():
        ft = _time(fwd_calls, args.rep, args.rounds)
    bwd = {}
    for name, f in fwd.items():
        try:
            bwd[name] = backward_fn(f, q, k, v)
        except Exception as ex:  # noqa: BLE001
            print(f"  bwd {name}: {type(ex).__name__}: {ex}"[:300], flush=True)
    bt = _time(bwd, args.rep, args.rounds)
    fl = flops(lengths, H, D, causal)
    cells = [str(D), f"{kind} ({len(lengths)} seqs, max {max_s})", "causal" if causal else "full"]
    for times, mult, fns, grad in ((ft, 1.0, fwd_calls, False), (bt, 2.5, bwd, True)):
        tf = {n: mult * fl / (ms * 1e-3) / 1e12 for n, ms in times.items()}
        cells += [f"{tf[n]:.0f}" if n in tf else "n/a" for n in ("pyptx", "torch varlen", "pyptx dense")]
        both = "pyptx" in tf and "torch varlen" in tf
        cells.append(f"{tf['pyptx'] / tf['torch varlen']:.3f}" if both else "n/a")
        if both and args.pairs:
            with torch.set_grad_enabled(grad):
                pt = paired_times({n: fns[n] for n in ("pyptx", "torch varlen")}, args.pairs)
            cells.append(f"{paired_ratio(pt, 'torch varlen', 'pyptx')[0]:.3f}")
        else:
            cells.append("n/a")
    return cells + [f"{err:.1e}"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", nargs="+", type=int, default=[64, 128])
    p.add_argument("--lengths", nargs="+", default=["uniform", "ragged"],
                   choices=["uniform", "ragged"])
    p.add_argument("--causal", nargs="+", default=["full", "causal"], choices=["full", "causal"])
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--width", type=int, default=2048, help="H * D")
    p.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pairs", type=int, default=20, help="paired rounds (0: no paired column)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    why = gpu_missing("attention_varlen.py")
    if why:
        print(why, file=sys.stderr)
        return 2
    import torch
    from pyptx_kernels.flash_attention import fwd_host as fa
    head = ["D", "lengths", "mask", "fwd pyptx", "fwd torch varlen", "fwd pyptx dense",
            "fwd ours/torch", "fwd paired", "bwd pyptx", "bwd torch varlen", "bwd pyptx dense",
            "bwd ours/torch", "bwd paired", "max |o err|"]
    print(f"# varlen attention TFLOP/s on {torch.cuda.get_device_name()}, bf16, do_bench median")
    body = []
    for D in args.dims:
        for kind in args.lengths:
            for mask in args.causal:
                body.append(run_case(fa, D, args.width // D, kind,
                                     seq_lengths(kind, args.tokens, args.seq), mask == "causal",
                                     args))
                print("| " + " | ".join(body[-1]) + " |", flush=True)
    lines = markdown_table(head, body)
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(
            f"varlen attention TFLOP/s on {torch.cuda.get_device_name()} (bf16, do_bench median, "
            f"torch {torch.__version__})\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
