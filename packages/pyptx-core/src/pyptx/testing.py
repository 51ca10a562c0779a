"""``pyptx.testing``: the ``__main__`` logic every example shares, and a loader for example files.

Check on a GPU, else print a ptxas report:

``run_example`` launches the kernel on fresh random inputs and compares it with
a float64 reference when torch with CUDA and the pyptx-torch plugin are there;
otherwise (or when this build cannot launch) it prints the kernel's launch
geometry and what ptxas says about it for sm_90a. ``load_module`` imports a Python file
by path (an example beside the caller) without touching ``sys.path``.
``paired_times`` times contenders call by call, interleaved, for A/B ratios that the
GPU's clock drifts do not move.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import CompileError, RuntimeUnavailableError, ToolchainError
from .kernel import Kernel
from .ptxas import check

__all__ = ["parse_args", "run_example", "report", "load_module", "build_row_scale"]


def parse_args(description: str, argv: Sequence[str] | None = None, **defaults: Any) -> dict:
    """Read each parameter positionally or as ``--name value``; ``defaults`` give order and type."""
    ap = argparse.ArgumentParser(description=description, allow_abbrev=False)
    for name, value in defaults.items():
        ap.add_argument(f"_{name}", nargs="?", type=type(value), metavar=name,
                        help=f"(default {value})")
    for name, value in defaults.items():
        ap.add_argument(f"--{name}", type=type(value), dest=name)
    ns = vars(ap.parse_args(argv))
    out = {}
    for name, value in defaults.items():
        flag, pos = ns[name], ns[f"_{name}"]
        out[name] = flag if flag is not None else pos if pos is not None else value
    return out


def _cuda_torch() -> Any:
    """torch, if it is installed with a usable GPU and the pyptx-torch plugin; else None."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("pyptx_torch") is None:
        return None
    import torch

    return torch if torch.cuda.is_available() else None


def report(kernel: Kernel) -> int:
    """Print launch geometry and the ptxas resource report; 1 if ptxas rejects the PTX."""
    spec = kernel.specialize()
    lines = spec.ptx().count("\n")
    print(f"{spec.name}: grid {spec.grid}, block {spec.block}, "
          f"{spec.static_smem} B static smem, {lines} PTX lines")
    try:
        result = check(spec)
    except ToolchainError as e:
        print(f"(no ptxas report: {e})")
        return 0
    except CompileError as e:
        print(f"FAIL: {e}")
        return 1
    for e in result.entries:
        print(f"ptxas {e.arch} {e.name}: {e.registers} registers, {e.barriers} barriers, "
              f"{e.smem} B smem, {e.stack} B stack, {e.spill_stores} B spill stores, "
              f"{e.spill_loads} B spill loads")
    for w in result.warnings:
        print(w)
    return 0


def run_example(
    kernel: Kernel,
    make_inputs: Callable[[Any], Sequence[Any]],
    reference: Callable[..., Any],
    *,
    atol: float,
    rtol: float,
) -> int:
    """Launch and check ``kernel`` on a GPU, or print its ptxas report; return the exit status.

    ``make_inputs(torch)`` returns the CUDA input tensors. ``reference`` gets
    them as nested lists of Python floats and returns the expected output the
    same way (a tuple of them for several outputs). Passes when every element
    has ``|out - ref| <= atol + rtol * |ref|``.
    """
    torch = _cuda_torch()
    if torch is None:
        return report(kernel)
    inputs = make_inputs(torch)
    try:
        out = kernel(*inputs)
    except RuntimeUnavailableError as e:
        print(f"cannot launch here: {e}")
        return report(kernel)
    torch.cuda.synchronize()
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    ref = reference(*[t.double().cpu().tolist() for t in inputs])
    refs = tuple(ref) if len(kernel.out_specs) > 1 else (ref,)
    ok = True
    for i, (got, want) in enumerate(zip(outs, refs)):
        want = torch.tensor(want, dtype=torch.float64, device=got.device)
        err = (got.double() - want).abs()
        bad = int((err > atol + rtol * want.abs()).sum())
        print(f"output {i}: shape {tuple(got.shape)}, max abs error {err.max().item():.3e}, "
              f"{bad} elements outside atol={atol:g} rtol={rtol:g}")
        ok = ok and bad == 0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def build_row_scale(B: int, N: int) -> Kernel:
    """``y[b, n] = x[b, n] * w[n]`` in f32 (``x`` ``(B, N)``, ``w`` ``(N,)``, ``N`` a multiple
    of 32): one warp per row, the smallest kernel with a broadcast operand, for the runtimes'
    tests (streams, graphs, devices, ``torch.compile``, export)."""
    from . import ptx, reg
    from .kernel import kernel
    from .specs import Tile
    from .types import f32, u32

    if N % 32:
        from .errors import ConfigError
        from .source import where

        raise ConfigError(f"{where()}: build_row_scale: N must be a multiple of 32, got {N}")

    @kernel(in_specs=(Tile(B, N, f32), Tile(N, f32)), out_specs=(Tile(B, N, f32),),
            grid=(B, 1, 1), block=(32, 1, 1))
    def row_scale(X, W, Y):
        px, pw, py = ptx.global_ptrs(X, W, Y)
        row = reg.from_(ptx.special.ctaid.x(), u32) * (N * 4)
        tid = reg.from_(ptx.special.tid.x(), u32)
        for i in range(N // 32):
            col = (tid + i * 32) * 4
            x, w = reg.scalar(f32), reg.scalar(f32)
            ptx.inst.ld.global_.f32(x, ptx.addr(px + row + col))
            ptx.inst.ld.global_.f32(w, ptx.addr(pw + col))
            ptx.inst.st.global_.f32(ptx.addr(py + row + col), x * w)
        ptx.ret()

    return row_scale


def load_module(path: str | Path, name: str | None = None) -> Any:
    """Import the Python file at ``path`` as module ``name`` (default: its stem), once.

    For examples that use a sibling file: ``load_module(Path(__file__).with_name("rms_norm.py"))``.
    """
    path = Path(path).resolve()
    name = name or path.stem
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__file__", None) == str(path):
        return mod
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def paired_times(fns: dict[str, Callable[[], Any]], pairs: int) -> dict[str, list[float]]:
    """``{name: [ms per round]}`` for zero-argument GPU calls (torch): ``pairs`` rounds, each
    one call of every function in rotated order, each call timed alone (CUDA events around
    it, the L2 flushed before it). Neighbouring calls share the GPU's clock level, so the
    per-round ratios of two contenders cancel the slow drifts that move whole
    ``do_bench`` bursts by several percent; report their median beside ``do_bench``'s."""
    import torch

    flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda")
    names, timed = list(fns), []
    for i in range(pairs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            flush.zero_()
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            fns[name]()
            end.record()
            timed.append((i, name, start, end))
    torch.cuda.synchronize()
    out = {name: [0.0] * pairs for name in names}
    for i, name, start, end in timed:
        out[name][i] = start.elapsed_time(end)
    return out


def paired_ratio(times: dict[str, list[float]], base: str, other: str) -> tuple[float, float, float]:
    """``(median, lower quartile, upper quartile)`` of the per-round speed of ``other`` over
    ``base`` (``base`` ms / ``other`` ms) in a ``paired_times`` result."""
    r = sorted(a / b for a, b in zip(times[base], times[other]))
    return r[len(r) // 2], r[len(r) // 4], r[3 * len(r) // 4]
