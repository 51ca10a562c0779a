"""Test helpers of the FP8 GEMM (torch): random fp8 inputs and scales, the tolerances, the
long-K error comparison, and ``main`` (the GPU checks of ``python -m
pyptx_kernels.fp8_gemm.kernel [simple]``)."""

from __future__ import annotations

import json
import os
import sys

from pyptx_kernels.fp8_gemm.host import env_config, scaled_mm
from pyptx_kernels.fp8_gemm.reference import reference
from pyptx_kernels.fp8_gemm.scales import SCALE_BLOCK, SCALES

TOL = {"bf16": 8e-3, "f32": 3e-3}
"""Tolerances on ``||D - ref|| / ||ref||``: bf16 output rounding (~2**-9 per element),
f32 output: the tensor core's fp8 accumulation inside one 128-K block."""


def make_inputs(M, N, K, kind, dtype="e4m3", dtype_b=None, device="cuda", seed=0,
                positive=False):
    """Random fp8 ``a`` (M, K), ``w`` (N, K) (normal, or uniform [0, 1) with ``positive``,
    times 2) and f32 scales of ``kind`` (torch)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    tdt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}

    def rnd(*shape):
        return torch.rand(*shape, generator=g) if positive else torch.randn(*shape, generator=g)

    a = (rnd(M, K) * 2).to(tdt[dtype]).to(device)
    w = (rnd(N, K) * 2).to(tdt[dtype_b or dtype]).to(device)
    return (a, w) + make_scales(M, N, K, kind, device=device, generator=g)


def make_scales(M, N, K, kind, *, device="cuda", generator=None):
    """Random f32 scales in [0.5, 1.5) of ``kind``'s shapes (torch)."""
    import torch

    ks, ns = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    shapes = {"tensor": ((), ()), "row": ((M, 1), (1, N)), "block": ((M, ks), (ns, ks))}[kind]
    sa = (torch.rand(shapes[0], generator=generator) + 0.5).to(device)
    sb = (torch.rand(shapes[1], generator=generator) + 0.5).to(device)
    return sa, sb


def rel_err(d, ref):
    """``||d - ref|| / ||ref||`` in float64; NaN (poisoned, unwritten) elements give inf."""
    import torch

    if torch.isnan(d).any():
        return float("inf")
    return ((d.double() - ref).norm() / ref.norm()).item()


def long_k_errors(M=256, N=256, K=16384, positive=False, seed=1):
    """Errors against float64 at long K (per-tensor scales, f32 output): ours promoted,
    ours without promotion, ``torch._scaled_mm`` (exact and fast accumulation)."""
    import torch

    a, w, sa, sb = make_inputs(M, N, K, "tensor", seed=seed, positive=positive)
    ref = reference(a, w, sa, sb, "tensor")
    out = {"pyptx (promoted)": scaled_mm(a, w.t(), sa, sb, out_dtype="f32"),
           "pyptx fast_accum": scaled_mm(a, w.t(), sa, sb, out_dtype="f32", fast_accum=True)}
    for fast in (False, True):
        try:
            out[f"torch._scaled_mm{' fast' if fast else ''}"] = torch._scaled_mm(
                a, w.t(), scale_a=sa, scale_b=sb,
                out_dtype=torch.float32, use_fast_accum=fast)
        except Exception as e:  # noqa: BLE001 - report what this torch lacks
            print(f"torch._scaled_mm(use_fast_accum={fast}) unavailable: {e}")
    return {k: rel_err(v, ref) for k, v in out.items()}


def main(argv=None) -> int:
    """The GPU checks against float64 (``simple``: every call with the 128 x 128 plan)."""
    from pyptx_kernels.fp8_gemm.config import Fp8GemmConfig

    argv = sys.argv[1:] if argv is None else argv
    if "simple" in argv:
        os.environ["PYPTX_FP8_CONFIG"] = json.dumps({"BN": 128, "cluster": 1})
    cfg = env_config()
    if cfg:
        print(f"config fixed: {cfg}")
    fails = 0

    def check(label, d, ref, tol):
        nonlocal fails
        err = rel_err(d, ref)
        ok = err < tol
        fails += not ok
        print(f"{label}: rel err {err:.2e} (tol {tol:.0e}) {'PASS' if ok else 'FAIL'}", flush=True)

    cases = [(256, 512, 384, "e4m3", "e4m3", "bf16"), (1000, 520, 400, "e4m3", "e4m3", "f32"),
             (200, 328, 136, "e5m2", "e5m2", "bf16"), (129, 65, 16, "e4m3", "e5m2", "f32"),
             (4095, 4097, 4112, "e4m3", "e4m3", "bf16")]
    for kind in SCALES:
        for M, N, K, da, db, out in cases:
            a, w, sa, sb = make_inputs(M, N, K, kind, da, db)
            ref = reference(a, w, sa, sb, kind)
            d = scaled_mm(a, w.t(), sa, sb, out_dtype=out)
            check(f"{kind} {M}x{N}x{K} {da}x{db} -> {out}", d, ref, TOL[out])
            if kind != "block" and M < 4000:
                d = scaled_mm(a, w.t(), sa, sb, out_dtype=out, fast_accum=True)
                check(f"{kind} {M}x{N}x{K} {da}x{db} -> {out} fast_accum", d, ref, TOL[out])
    for explicit in (Fp8GemmConfig(BN=128, cluster=1), Fp8GemmConfig(BN=256, cluster=2),
                     Fp8GemmConfig(BN=64, cluster=2)):
        a, w, sa, sb = make_inputs(777, 1500, 1000, "block")
        d = scaled_mm(a, w.t(), sa, sb, config=explicit)
        check(f"block 777x1500x1000 config {explicit.name}", d,
              reference(a, w, sa, sb, "block"), TOL["bf16"])
    for positive in (False, True):  # long K: promotion against the tensor core's accumulation
        errs = long_k_errors(positive=positive)
        print(f"K=16384 {'uniform[0,1)' if positive else 'normal'} inputs, f32 out, rel err vs "
              f"float64: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
        ok = errs["pyptx (promoted)"] < TOL["f32"]
        fails += not ok
        print(f"K=16384 promoted rel err {errs['pyptx (promoted)']:.2e} {'PASS' if ok else 'FAIL'}")
    print("all PASS" if not fails else f"{fails} FAIL")
    return 1 if fails else 0
