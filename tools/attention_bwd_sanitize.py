"""A small ragged attention backward for compute-sanitizer (memcheck, racecheck,
synccheck): GQA, causal and full, both head dims, every gradient checked. Each case
runs more blocks than the rings have stages (4), so stages are refilled: the write-after-read
hazard racecheck found on a refilled dK/dV stage needs that. ``--options k=v,...`` runs
the opt-in options (e.g. ``dkdv_bq=32``, ``kv_split=2``; see ``parse_options``). ``--varlen``
runs the packed variable-length pair instead (``attention_varlen``'s backward through torch
autograd: empty q and k sequences, ragged lengths, GQA, both head dims, causal and full;
dK/dV rings refilled: a 300-row sequence has 5 q blocks per q head, 2 q heads per kv head)."""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
from pyptx_kernels.flash_attention.bwd_checks import check  # noqa: E402
from pyptx_kernels.flash_attention.bwd_plan import parse_options  # noqa: E402


def check_varlen():
    """The varlen cases against float64 autograd of ``reference_varlen``; failures counted."""
    from pyptx_kernels.flash_attention import fwd_host, fwd_reference
    fails = 0
    for lens_q, lens_k, Hq, Hkv, D, dtn, causal in [
            ([0, 70, 300, 5], [33, 0, 300, 64], 4, 2, 64, "bf16", True),
            ([129, 0, 300, 1], [129, 9, 300, 0], 2, 1, 128, "f16", False)]:
        torch.manual_seed(0)
        dt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtn]
        cu_q, cu_k = (torch.tensor([0] + torch.tensor(x).cumsum(0).tolist(), dtype=torch.int32,
                                   device="cuda") for x in (lens_q, lens_k))
        q = torch.randn(sum(lens_q), Hq, D, device="cuda", dtype=dt)
        k, v = (torch.randn(sum(lens_k), Hkv, D, device="cuda", dtype=dt) for _ in range(2))
        do = torch.randn_like(q)
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        fwd_host.attention_varlen(*xs, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal).backward(do)
        refs = [x.double().requires_grad_() for x in (q, k, v)]
        fwd_reference.reference_varlen(*refs, cu_q, cu_k, causal)[0].backward(do.double())
        errs = [((x.grad.double() - r.grad).norm() / r.grad.norm()).item() for x, r in zip(xs, refs)]
        ok = all(e < (1e-2 if dtn == "bf16" else 4e-3) for e in errs)
        fails += not ok
        print(f"varlen {lens_q}/{lens_k} H{Hq}/{Hkv} D{D} {dtn} {'causal' if causal else 'full'}: "
              f"dq/dk/dv err {' '.join(f'{e:.2e}' for e in errs)} {'PASS' if ok else 'FAIL'}",
              flush=True)
    return fails


if "--varlen" in sys.argv:
    fails = check_varlen()
    torch.cuda.synchronize()
    print("FAIL" if fails else "all PASS")
    sys.exit(1 if fails else 0)

opts = parse_options(sys.argv[sys.argv.index("--options") + 1]) if "--options" in sys.argv else {}
# dK/dV: 2 heads x 5 q blocks = 10 fills of 4 stages; dQ: up to 9 kv blocks
# kv_split (a group's q heads over a cluster) needs groups it divides: 2 q heads per kv head
fails = check([(1, 300, 2, 1, 64, "bf16", True),
               (1, 550, 4, 2, 128, "f16", False) if opts.get("kv_split", 1) != 1 else
               (1, 550, 2, 2, 128, "f16", False)], **opts)
torch.cuda.synchronize()
print("FAIL" if fails else "all PASS")
sys.exit(1 if fails else 0)
