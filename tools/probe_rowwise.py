"""Device probe for issue 6: our RMSNorm/softmax beside Triton's, same shapes.

Writes Triton's PTX and cubin for each case under ``$OUT/probe`` (disassemble
them on the CPU machine), times ours (planner default, and with a register cap
that raises CTAs per SM) beside Triton with ``do_bench``, and with ``--ncu``
launches each kernel exactly once for Nsight Compute:

    python tools/probe_rowwise.py
    ncu --clock-control none -k regex:rms --section SpeedOfLight ... python tools/probe_rowwise.py --ncu
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CASES = [("rms_norm", "f32", 256, 4096), ("rms_norm", "f32", 2048, 8192),
         ("rms_norm", "bf16", 2048, 8192), ("rms_norm", "bf16", 256, 4096),
         ("softmax", "f32", 2048, 8192)]


def load(rel: str, name: str):
    path = ROOT / rel
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    import triton
    from triton.testing import do_bench

    from pyptx.types import bf16, f32

    ncu = "--ncu" in sys.argv
    out = Path(os.environ.get("OUT", "/tmp/out")) / "probe"
    out.mkdir(parents=True, exist_ok=True)
    mb = load("benchmarks/memory_bound.py", "mb")
    mods = {"rms_norm": load("examples/hopper/rms_norm.py", "p_rms"),
            "softmax": load("examples/hopper/softmax.py", "p_sm")}
    tri = mb.make_triton(torch)
    for op, dname, B, N in CASES:
        dt, tdt = (f32, torch.float32) if dname == "f32" else (bf16, torch.bfloat16)
        args = mb.make_inputs(torch, op, B, N, tdt)
        nbytes = mb.traffic(op, B, N, args[0].element_size())
        variants = []
        for cap in (None, 40, 32):
            k = (mods[op].build_rms_norm_fast(B, N, dt, mb.RMS_EPS) if op == "rms_norm"
                 else mods[op].build_softmax_fast(B, N, dt))
            k._maxnreg = cap
            variants.append((f"ours maxnreg={cap}", k))
        ref = tri[op](*args)
        for name, k in variants:
            try:
                y = k(*args)
            except Exception as e:  # noqa: BLE001 - a cap ptxas rejects
                print(f"{op} {dname} {B}x{N} {name}: {type(e).__name__}: {e}")
                continue
            err = ((y.double() - ref.double()).norm() / ref.double().norm()).item()
            if err > (1e-5 if dname == "f32" else 1e-2):
                print(f"{op} {dname} {B}x{N} {name}: WRONG rel err {err:.2e}")
        torch.cuda.synchronize()
        if ncu:  # the check above launched Triton and every variant exactly once
            continue
        # Triton's code for this case
        blk = triton.next_power_of_2(N)
        kern, warps = tri[op].kernel, tri[op].warps(blk)
        extra = (N, mb.RMS_EPS) if op == "rms_norm" else (N,)
        h = kern.warmup(*args, torch.empty_like(args[0]), *extra, BLOCK=blk, num_warps=warps,
                        grid=(B,))
        tag = f"{op}_{dname}_{B}x{N}"
        (out / f"triton_{tag}.ptx").write_text(h.asm["ptx"])
        (out / f"triton_{tag}.cubin").write_bytes(h.asm["cubin"])
        print(tag, "triton regs", h.n_regs, "spills", h.n_spills, "warps", warps, flush=True)
        row = [f"{op} {dname} {B}x{N}"]
        ms = do_bench(lambda op=op, args=args: tri[op](*args), return_mode="median")
        row.append(f"triton {nbytes / ms / 1e6:.0f}")
        for name, k in variants:
            try:
                ms = do_bench(lambda k=k, args=args: k(*args), return_mode="median")
                row.append(f"{name} {nbytes / ms / 1e6:.0f}")
            except Exception:  # noqa: BLE001
                row.append(f"{name} n/a")
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
