"""Host (Python) time of the differentiable pyptx calls, measured on the CPU with no GPU.

Every kernel launch is replaced by a no-op that returns outputs of the right shape and
dtype (the kernel's own specialization says which; the storage is allocated once per
signature and handed out as a fresh tensor object each call, like the caching allocator),
so what is left is the Python path around the launches: argument checks, padding,
builder caches, ``differentiable_kernel``'s autograd glue, the ``TunedKernel`` dispatch
and the backward's kernel calls. Tuned kernels run their device fast path (``_hot``): the
CPU tensors are given a fake device name and ``PYPTX_AUTOTUNE=0`` picks the first config.

Not included: the launch itself (the C++ fast path's checks, allocation and
``cuLaunchKernel``, a few microseconds per kernel on the device) and the hand-off of
``.backward()`` to the autograd engine's CUDA worker thread.

Steps per case (median and min of ``--rounds`` rounds of ``--iters`` calls, microseconds per call):

* ``fwd``: the call without gradients;
* ``fwd+bwd``: the benchmark's loop body: ``x.grad = None; f(x...).backward(dy)``;
* for grouped_mm also ``op lookup`` (``grouped_op(...)`` cache hit), ``fwd kernel`` (the
  tuned forward called directly) and ``bwd kernels`` (``GroupedBackward`` called directly).

    python tools/host_overhead.py [--cases grouped attention] [--iters 500] [--rounds 7]
        [--profile] [--out host.md]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAKE_DEVICE = "cpu (host_overhead no-op launches)"


class _Patch:
    """Plain ``setattr``/``setenv`` (pytest's ``monkeypatch`` has the same two methods)."""

    setattr = staticmethod(setattr)

    @staticmethod
    def setenv(name, value):
        os.environ[name] = value


def install_noop_launches(patch=None, record=None):
    """Replace every kernel launch of the torch runtime by a no-op returning outputs of the
    right shape/dtype, and let tuned kernels take their device fast path on CPU tensors.
    ``patch``: pytest's ``monkeypatch`` (undone after the test); default: for good.
    ``record``: a list that gets ``(kernel, args)`` of every launch.
    Returns the launch counter (a dict: kernel name -> calls)."""
    patch = patch or _Patch()
    patch.setenv("PYPTX_AUTOTUNE", "0")
    import torch

    from pyptx.autotune import TorchTimer
    from pyptx.kernel import Kernel
    from pyptx_torch.dtypes import torch_dtype_of

    counts: dict[str, int] = {}
    outs_by_sig: dict[tuple, tuple] = {}

    def noop_launch(kernel, args, kwargs):
        sig = (id(kernel), tuple(tuple(a.shape) for a in args), tuple(sorted(kwargs.items())))
        bases = outs_by_sig.get(sig)
        if bases is None:
            spec = kernel.specialize([tuple(a.shape) for a in args], **kwargs)
            bases = tuple(torch.empty(s, dtype=torch_dtype_of(o.dtype))
                          for s, o in zip(spec.out_shapes, kernel.out_specs))
            outs_by_sig[sig] = bases
        counts[kernel.name] = counts.get(kernel.name, 0) + 1
        if record is not None:
            record.append((kernel, args))
        outs = tuple(b.detach() for b in bases)
        return outs[0] if len(outs) == 1 else outs

    def launcher(self, runtime):
        return noop_launch

    patch.setattr(Kernel, "launcher", launcher)
    real_name = TorchTimer.device_name

    def device_name(self, args):
        for a in args:
            if isinstance(a, torch.Tensor):
                return FAKE_DEVICE if a.device.type == "cpu" else real_name(self, args)
        return None

    patch.setattr(TorchTimer, "device_name", device_name)
    return counts


def timed(fn, iters, rounds):
    """(median, min) over ``rounds`` of the mean microseconds of ``iters`` calls of ``fn``
    (the min is the steadier number on a shared machine)."""
    for _ in range(max(3, iters // 10)):
        fn()
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        per.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(per), min(per)


def profile(fn, iters, top=18):
    """cProfile of ``iters`` calls of ``fn``: the ``top`` functions by own time."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(iters):
        fn()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def grouped_case(shape):
    """Callables of the grouped GEMM steps at ``shape`` = ``"GxMxNxK"`` (CPU tensors)."""
    import torch


    gg = importlib.import_module("pyptx_kernels.grouped_gemm.host")
    G, Mg, N, K = (int(x) for x in shape.split("x"))
    M = G * Mg
    a = torch.randn(M, K).to(torch.bfloat16).requires_grad_(True)
    b = torch.randn(G, K, N).to(torch.bfloat16).requires_grad_(True)
    offs = torch.arange(1, G + 1, dtype=torch.int32) * Mg
    dy = torch.randn(M, N).to(torch.bfloat16)
    op = gg.grouped_op(M, N, K, G, "MN", "bf16", None, None)
    ad, bd = a.detach(), b.detach()

    def fwd():
        with torch.no_grad():
            gg.grouped_mm(a, b, offs)

    def fwd_bwd():
        a.grad = b.grad = None
        gg.grouped_mm(a, b, offs).backward(dy)

    steps = {
        "op lookup": lambda: gg.grouped_op(M, N, K, G, "MN", "bf16", None, None),
        "fwd kernel": lambda: op.forward_kernel(ad, bd, offs),
        "bwd kernels": lambda: op.backward_kernel(ad, bd, offs, dy),
        "fwd": fwd,
        "fwd+bwd": fwd_bwd,
    }
    return f"grouped_mm {shape}", steps


def attention_case(shape, causal=False):
    """Callables of attention() at ``shape`` = ``"BxSxHxD"`` (CPU tensors)."""
    import torch
    from pyptx_kernels.flash_attention import fwd_host as fa
    B, S, H, D = (int(x) for x in shape.split("x"))
    q, k, v = (torch.randn(B, S, H, D).to(torch.bfloat16).requires_grad_(True)
               for _ in range(3))
    dy = torch.randn(B, S, H, D).to(torch.bfloat16)

    def fwd():
        with torch.no_grad():
            fa.attention(q, k, v, causal)

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        fa.attention(q, k, v, causal).backward(dy)

    return f"attention {shape}{' causal' if causal else ''}", {"fwd": fwd, "fwd+bwd": fwd_bwd}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=["grouped", "attention"],
                   choices=["grouped", "attention"])
    p.add_argument("--grouped-shapes", nargs="+", default=["4x2048x256x2048"])
    p.add_argument("--attention-shapes", nargs="+", default=["4x2048x16x128"])
    p.add_argument("--iters", type=int, default=500)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--profile", action="store_true", help="cProfile each fwd+bwd step")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    counts = install_noop_launches()
    import torch

    torch.set_num_threads(1)
    cases = []
    if "grouped" in args.cases:
        cases += [grouped_case(s) for s in args.grouped_shapes]
    if "attention" in args.cases:
        cases += [attention_case(s) for s in args.attention_shapes]
    lines = [f"# host time per call, no-op launches (python {sys.version.split()[0]}, "
             f"torch {torch.__version__})", "", "| case | step | host us / call (median) | min |",
             "|---|---|---:|---:|"]
    profiles = []
    for name, steps in cases:
        for step, fn in steps.items():
            counts.clear()
            fn()
            launched = sum(counts.values())
            med, low = timed(fn, args.iters, args.rounds)
            lines.append(f"| {name} | {step} ({launched} launches) | {med:.1f} | {low:.1f} |")
            print(lines[-1], flush=True)
            if args.profile and step == "fwd+bwd":
                profiles.append(f"## {name} {step}\n\n```\n{profile(fn, args.iters)}```")
    text = "\n".join(lines + [""] + profiles) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print("\n".join(profiles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
