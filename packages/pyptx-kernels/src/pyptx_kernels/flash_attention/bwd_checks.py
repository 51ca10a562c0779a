"""GPU self-checks of the backward: a probe of the register-A wgmma operand form the kernels use,
and PASS/FAIL per gradient against float64 for each plan (``python -m
pyptx_kernels.flash_attention.bwd_checks [--fast] [--safe] [--atomic] [--options k=v,...]``)."""

from __future__ import annotations

import sys

from pyptx import Tile, kernel, ptx, reg, smem
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.types import b32, f32, u32, u64
from pyptx.warpspec import ring_base
from pyptx_kernels.flash_attention.bwd_common import _dtype
from pyptx_kernels.flash_attention.bwd_host import attention_backward
from pyptx_kernels.flash_attention.bwd_plan import parse_options
from pyptx_kernels.flash_attention.bwd_reference import reference


def build_register_a_probe(N=128, K=64, dtype="bf16"):
    """One warpgroup computes ``D = A @ B`` with A ``(64, K)`` taken from registers in the
    packing the kernels use (register ``m`` = accumulator elements ``2m, 2m+1``) and B
    ``(K, N)`` an MN-major shared tile: the operand forms of ``P^T dO`` / ``dS K``."""
    from pyptx.types import b64

    dt = _dtype(dtype)
    b = OperandTile(N, K, dt, major="MN")

    @kernel(in_specs=(Tile(64, K, dt), Tile(K, N, dt)), out_specs=(Tile(64, N, f32),),
            block=(128, 1, 1), smem=b.nbytes + 1024, tma={"Bm": b.tma_options()},
            name=f"attn_bwd_probe_{dt.name}_n{N}_k{K}")
    def probe(A, Bm, Dm):
        pa, pd = ptx.global_ptrs(A, Dm)
        buf = ring_base("tiles")
        bar = smem.alloc(b64, 1, align=8, name="bar")
        tid = reg.from_(ptx.special.tid.x(), u32)
        with ptx.if_(tid == 0):
            ptx.mbarrier.init(bar, 1)
        ptx.bar_sync(0)
        with ptx.if_(tid == 0):
            ptx.mbarrier.arrive_expect_tx(bar, b.nbytes)
            b.load(buf, Bm, 0, 0, bar)
        frag = Accumulator(K)                       # A's 64 x K elements, accumulator layout
        row, col = frag.thread_origin(tid)
        a_pack = reg.array(b32, K // 4)
        first = reg.from_(row * K + col, u64) * 2 + pa
        for m in range(K // 4):
            r, c = Accumulator.coord(2 * m)
            ptx.inst.ld.global_.b32(a_pack[m], ptx.addr(first, (r * K + c) * 2))
        ptx.mbarrier.wait(bar, 0)
        acc = Accumulator(N)
        db = b.descriptor(buf)
        ptx.wgmma.fence()
        for kk in range(K // 16):
            ptx.wgmma.mma_async(acc.regs, list(a_pack)[4 * kk:4 * kk + 4], b.advance(db, kk),
                                n=N, dtype_ab=dt.name, scale_d=0 if kk == 0 else 1,
                                trans_b=b.trans)
        ptx.wgmma.commit_group()
        ptx.wgmma.wait_group(0)
        out = reg.from_(row * N + col, u64) * 4 + pd
        for i in range(len(acc)):
            r, c = Accumulator.coord(i)
            ptx.inst.st.global_.f32(ptx.addr(out, (r * N + c) * 4), acc[i])
        ptx.ret()

    return probe


def check_probe() -> int:
    """PASS/FAIL of the register-A probe (D 64 and 128); returns the failures."""
    import torch

    fails = 0
    for N in (64, 128):
        a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
        bm = torch.randn(64, N, device="cuda", dtype=torch.bfloat16)
        d = build_register_a_probe(N, 64)(a, bm)
        ref = a.double() @ bm.double()
        err = ((d.double() - ref).norm() / ref.norm()).item()
        ok = err < 1e-5
        fails += not ok
        print(f"probe: A from registers x MN-major B, n{N}: rel err {err:.1e} "
              f"{'PASS' if ok else 'FAIL'}")
    return fails


CHECKS = [  # (B, S, Hq, Hkv, D, dtype, causal): ragged, GQA/MQA, both dtypes and head dims
    (1, 128, 1, 1, 64, "bf16", False),
    (2, 200, 4, 2, 64, "bf16", False),
    (2, 200, 4, 2, 64, "bf16", True),
    (1, 333, 4, 1, 128, "f16", True),
    (2, 256, 2, 2, 128, "bf16", False),
    (2, 513, 8, 2, 128, "bf16", True),
]
FUSED_CHECKS = [  # fused_bq: f16, ring refills, chains of adds over many kv blocks, rotation
    (1, 300, 4, 2, 64, "f16", True),
    (2, 1000, 4, 2, 64, "bf16", False),
    (2, 1000, 4, 2, 64, "bf16", True),
    (1, 1024, 2, 2, 64, "bf16", False),
]
BQ128_CHECKS = [  # dkdv_bq=128 (D=128): f16, refills, long chains, rotation (full, S = Sk)
    (1, 300, 4, 2, 128, "f16", True),
    (2, 1000, 4, 2, 128, "bf16", False),
    (2, 1000, 4, 2, 128, "bf16", True),
    (1, 1024, 2, 2, 128, "bf16", False),
]


def check(cases=CHECKS, safe=False, atomic_dq=False, **options) -> int:
    """One PASS/FAIL line per gradient against float64 autograd; returns the failures.
    ``options``: ``dkdv_bq`` / ``dkdv_overlap`` (named in each line); with ``fused_bq`` the
    cases of other head dims than 64 are skipped (one line each) and ``FUSED_CHECKS`` added,
    with ``dkdv_bq=128`` those of D=64 and ``BQ128_CHECKS`` added; with ``convert_lag`` the
    causal and D=64 cases are skipped."""
    import torch

    fails = 0
    dts = {"bf16": torch.bfloat16, "f16": torch.float16}
    tol = {"bf16": 1e-2, "f16": 4e-3}
    only, why = ((64, "fused_bq") if options.get("fused_bq") else
                 (128, "dkdv_bq=128") if options.get("dkdv_bq") == 128 else (None, None))
    if only and cases is CHECKS:
        cases = CHECKS + (FUSED_CHECKS if only == 64 else BQ128_CHECKS)
    for B, S, Hq, Hkv, D, dtn, causal in cases:
        if only and D != only:
            print(f"B{B} S{S} H{Hq}/{Hkv} D{D} {dtn}: skipped ({why} is for D={only})")
            continue
        if options.get("convert_lag") not in (None, 0, "auto") and (causal or D != 128):
            print(f"B{B} S{S} H{Hq}/{Hkv} D{D} {dtn}: skipped (convert_lag is for full "
                  f"attention at D=128)")
            continue
        torch.manual_seed(0)
        dt = dts[dtn]
        q = torch.randn(B, S, Hq, D, device="cuda", dtype=dt)
        k = torch.randn(B, S, Hkv, D, device="cuda", dtype=dt)
        v = torch.randn(B, S, Hkv, D, device="cuda", dtype=dt)
        do = torch.randn(B, S, Hq, D, device="cuda", dtype=dt)
        o, lse, rq, rk, rv = reference(q, k, v, do, causal)
        mode = "atomic" if atomic_dq else "safe" if safe else "fast"
        mode += "".join(f" {n}={v if isinstance(v, str) else int(v)}"
                        for n, v in sorted(options.items()))
        tag = f"{mode} B{B} S{S} H{Hq}/{Hkv} D{D} {dtn} {'causal' if causal else 'full'}"
        try:
            got = attention_backward(q, k, v, o.to(dt), lse.float(), do, causal=causal, safe=safe,
                                     atomic_dq=atomic_dq, **options)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - report and go on to the next case
            print(f"{tag}: {type(e).__name__}: {str(e)[:300]} FAIL")
            fails += 3
            continue
        for nm, g, r in zip(("dq", "dk", "dv"), got, (rq, rk, rv)):
            bad = torch.isnan(g).any().item()
            err = ((g.double() - r).norm() / r.norm()).item()
            worst = ((g.double() - r).abs().max() / r.abs().max()).item()
            ok = not bad and err < tol[dtn] and worst < 0.1
            fails += not ok
            print(f"{tag} {nm}: rel err {err:.2e} max err/max {worst:.2e}"
                  f"{' NaN' if bad else ''} {'PASS' if ok else 'FAIL'}")
    return fails


def main(argv=None) -> int:
    """``python -m pyptx_kernels.flash_attention.bwd_checks [--fast] [--safe] [--atomic] [--options
    k=v,...]``: the probe, then PASS/FAIL per gradient of each schedule (all three by
    default; ``--options``: with the opt-in options)."""
    argv = sys.argv[1:] if argv is None else argv
    opts = parse_options(argv[argv.index("--options") + 1]) if "--options" in argv else {}
    atomic = opts.pop("atomic_dq", False)   # --options atomic_dq=1,...: every mode adds dQ
    fails = check_probe()
    # --fast / --safe / --atomic: only those schedules (safe: the simplest, to bisect a
    # failure; atomic: dQ added by the dK/dV kernel with f32 atomics, not deterministic)
    modes = [m for m in ("--fast", "--safe", "--atomic") if m in argv] or ["--fast", "--safe",
                                                                          "--atomic"]
    for m in modes:
        n = check(safe=m == "--safe", atomic_dq=m == "--atomic" or atomic, **opts)
        print(f"{m[2:]} schedule: {f'{n} FAIL' if n else 'all PASS'}")
        fails += n
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
