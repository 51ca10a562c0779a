"""The forward's correctness checks on the GPU, one PASS/FAIL line each:
``python -m pyptx_kernels.flash_attention.fwd_check [simple|overlap|pingpong] [persistent]
[pin_overlap] [rescale_threshold=T|none]``."""

from __future__ import annotations

import sys

from pyptx_kernels.flash_attention.fwd_config import SCHEDULES, ForwardConfig
from pyptx_kernels.flash_attention.fwd_host import (
    attention_forward,
    attention_varlen,
    attention_varlen_forward,
)
from pyptx_kernels.flash_attention.fwd_reference import check, reference, reference_varlen


def check_varlen_backward(q, k, v, cu_q, cu_k, max_q, max_k, causal, tol=2e-2):
    """``(ok, errors)``: ``(dq, dk, dv)`` of ``attention_varlen`` by torch autograd (a random
    ``do``) against float64 autograd of ``reference_varlen``; each error is ``max |g - ref|
    / max(1, max |ref|)`` (a tensor-wide scale, since single gradients can be tiny)."""
    import torch

    xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    do = torch.randn_like(q)
    attention_varlen(*xs, cu_q, cu_k, max_q, max_k, causal=causal).backward(do)
    refs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o_ref, _ = reference_varlen(*refs, cu_q, cu_k, causal)
    o_ref.backward(do.double())
    errs = {}
    for name, x, r in zip(("dq", "dk", "dv"), xs, refs):
        g, gr = x.grad.double(), r.grad
        errs[name] = ((g - gr).abs().max() / gr.abs().max().clamp(min=1.0)).item()
    return all(e <= tol for e in errs.values()), errs


MAIN_CASES = [
    # B, S, Sk, Hq, Hkv, D, causal, dtype
    (1, 128, 128, 1, 1, 64, False, "bf16"),
    (2, 77, 77, 4, 2, 64, True, "bf16"),
    (2, 200, 200, 4, 4, 128, False, "bf16"),
    (2, 333, 333, 4, 1, 128, True, "bf16"),
    (1, 1, 1, 2, 2, 128, True, "f16"),
    (1, 256, 333, 2, 2, 128, False, "f16"),
    (1, 1000, 1000, 2, 1, 64, True, "f16"),
    (1, 300, 300, 2, 2, 256, True, "bf16"),
]


def main(argv=None) -> int:
    """Correctness checks on the GPU, one PASS/FAIL line each; arguments: schedules to run
    (default: the default schedule), ``persistent`` for the persistent kernel, and the
    tuning options ``pin_overlap`` and ``rescale_threshold=T``."""
    import torch

    torch.manual_seed(0)
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}
    fails = 0
    args = argv or sys.argv[1:]
    schedules = [s for s in args if s in SCHEDULES] or [None]
    persistent = "persistent" in args
    opts = {"pin_overlap": True} if "pin_overlap" in args else {}
    for a in args:
        if a.startswith("rescale_threshold="):
            value = a.split("=", 1)[1]
            opts["rescale_threshold"] = None if value == "none" else float(value)
    otag = "".join(f" {k}={v}" for k, v in opts.items())
    for schedule in schedules:
        for (B, S, Sk, Hq, Hkv, D, causal, dname) in MAIN_CASES:
            q = torch.randn(B, S, Hq, D, device="cuda", dtype=dt[dname])
            k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt[dname])
            v = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt[dname])
            try:
                plan = ForwardConfig(schedule=schedule, persistent=persistent and D <= 128,
                                     **opts)
                o, lse = attention_forward(q, k, v, causal=causal, config=plan)
                torch.cuda.synchronize()
                ok, eo, el = check(o, lse, *reference(q, k, v, causal), dname)
            except Exception as e:  # report and go on: one line per case
                ok, eo, el = False, float("nan"), float("nan")
                print(f"  {type(e).__name__}: {e}"[:400])
            fails += not ok
            tag = (" persistent" if persistent and D <= 128 else "") + otag
            print(f"{schedule or 'default'}{tag} B{B} S{S} Sk{Sk} H{Hq}/{Hkv} D{D} {'causal' if causal else 'full'} "
                  f"{dname}: o err {eo:.2e} lse err {el:.2e} {'PASS' if ok else 'FAIL'}",
                  flush=True)
        for causal in (False, True):
            lens_q, lens_k = [77, 1, 200, 128], [77, 5, 333, 128]
            cu_q = torch.tensor([0] + list(_cumsum(lens_q)), device="cuda", dtype=torch.int32)
            cu_k = torch.tensor([0] + list(_cumsum(lens_k)), device="cuda", dtype=torch.int32)
            Hq, Hkv, D = 4, 2, 128
            q = torch.randn(sum(lens_q), Hq, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(sum(lens_k), Hkv, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(sum(lens_k), Hkv, D, device="cuda", dtype=torch.bfloat16)
            try:
                o, lse = attention_varlen_forward(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                  causal=causal,
                                                  config=ForwardConfig(schedule=schedule, **opts))
                torch.cuda.synchronize()
                ok, eo, el = check(o, lse, *reference_varlen(q, k, v, cu_q, cu_k, causal), "bf16")
            except Exception as e:
                ok, eo, el = False, float("nan"), float("nan")
                print(f"  {type(e).__name__}: {e}"[:400])
            fails += not ok
            print(f"{schedule or 'default'}{otag} varlen {lens_q}/{lens_k} H{Hq}/{Hkv} D{D} "
                  f"{'causal' if causal else 'full'}: o err {eo:.2e} lse err {el:.2e} "
                  f"{'PASS' if ok else 'FAIL'}", flush=True)
            try:    # the backward through autograd against float64 autograd
                ok, errs = check_varlen_backward(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                 causal)
            except Exception as e:
                ok, errs = False, {}
                print(f"  {type(e).__name__}: {e}"[:400])
            fails += not ok
            print(f"{schedule or 'default'}{otag} varlen backward {lens_q}/{lens_k} H{Hq}/{Hkv} D{D} "
                  f"{'causal' if causal else 'full'}: "
                  + " ".join(f"{n} err {x:.2e}" for n, x in errs.items())
                  + f" {'PASS' if ok else 'FAIL'}", flush=True)
    print("all PASS" if not fails else f"{fails} FAIL")
    return 1 if fails else 0


def _cumsum(xs):
    t = 0
    for x in xs:
        t += x
        yield t


if __name__ == "__main__":
    sys.exit(main())
