"""What ``mma.sync`` can reach on this device, and the Ampere kernels' TFLOP/s against it.

The ceiling: ``ceiling_kernel`` is a loop of ``mma.sync.m16n8k16`` bf16 (f32 accumulators)
alone, ``CHAINS`` independent accumulators per warp so the tensor pipe never waits on one
result, no memory traffic but the final store; FLOPs ``2 * 16 * 8 * 16`` per instruction.
Then ``pyptx_kernels.ampere`` GEMM (``host.matmul``) beside ``torch.matmul`` (cuBLAS), and
the Ampere flash-attention forward (``host.attention``) beside SDPA's flash backend, each
with its fraction of the ceiling. sm_80 PTX runs on sm_80/86/89/90 devices (on an H200 the
ceiling is sm_90's ``mma.sync`` rate, below its wgmma peak).
Timing: ``triton.testing.do_bench`` (L2 flushed), median of ``--rounds`` interleaved rounds.
``--plans`` also times every named plan (``SM80_GEMM_CONFIGS``, ``SM80_ATTENTION_PLANS``)
and prints the fastest beside the default.

    python benchmarks/mma_sync_ceiling.py [--rounds 3] [--plans] [--out t.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_timing.py

from _timing import gpu_missing, markdown_table, rotated  # noqa: E402

CHAINS = 8
"""Independent accumulators per warp in the ceiling loop."""
WARPS = 8
"""Warps per CTA of the ceiling kernel (two per SM sub-partition)."""
FLOPS_PER_MMA = 2 * 16 * 8 * 16
ONES = 0x3F803F80
"""Two bf16 1.0 values in one 32-bit word: the ceiling kernel's operand."""

GEMM_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (4096, 14336, 4096))
ATTN_CASES = ((64, False), (64, True), (128, False), (128, True))   # (head dim, causal)
ATTN_TOKENS, ATTN_HD, ATTN_S = 32768, 2048, 4096                    # B*S, H*D, S


def ceiling_kernel(ctas: int, iters: int):
    """``ctas`` CTAs of ``WARPS`` warps, each warp running ``iters`` rounds of ``CHAINS``
    independent ``mma.sync`` m16n8k16 bf16 on register operands: every A and B register is
    the one s32 word ``X[0]`` (a bf16 pair; ``ONES`` is (1.0, 1.0)); each thread stores the
    sum of its accumulators to ``Out[tid]`` (so nothing is dead code)."""
    from pyptx import Tile, kernel, ptx, reg
    from pyptx.types import b32, f32, s32, u32, u64

    threads = 32 * WARPS

    @kernel(in_specs=(Tile(1, s32),), out_specs=(Tile(ctas * threads, f32),),
            grid=(ctas, 1, 1), block=(threads, 1, 1), arch="sm_80",
            name=f"mma_sync_ceiling_{iters}")
    def ceiling(X, Out):
        px, po = ptx.global_ptrs(X, Out)
        tid = reg.from_(ptx.special.tid.x(), u32)
        word = reg.scalar(b32)
        ptx.inst.ld.global_.b32(word, ptx.addr(px))
        a, b = reg.array(b32, 4), reg.array(b32, 2)
        for r in (*a, *b):
            ptx.inst.mov.b32(r, word)
        acc = [reg.array(f32, 4) for _ in range(CHAINS)]
        for c in acc:
            for r in c:
                ptx.inst.mov.f32(r, 0.0)
        for _ in ptx.loop(0, iters, unroll=False):
            for c in acc:
                ptx.mma_sync(c, a, b, c)
        total = reg.scalar(f32, init=0.0)
        for c in acc:
            for r in c:
                ptx.inst.add.f32(total, total, r)
        cta = reg.from_(ptx.special.ctaid.x(), u32)
        off = reg.scalar(u64)
        ptx.inst.mul.wide.u32(off, cta * threads + tid, 4)
        ptx.inst.st.global_.f32(ptx.addr(po + off), total)
        ptx.ret()

    return ceiling


def ceiling_flops(ctas: int, iters: int) -> float:
    """FLOPs of one ``ceiling_kernel(ctas, iters)`` launch."""
    return float(ctas * WARPS * iters * CHAINS * FLOPS_PER_MMA)


def timed(fns: dict, rounds: int, do_bench) -> dict:
    """{name: median ms} over ``rounds`` interleaved do_bench rounds."""
    t = {k: [] for k in fns}
    for r in range(rounds):
        for k in rotated(list(fns), r):
            t[k].append(do_bench(fns[k], rep=100, return_mode="median"))
    return {k: statistics.median(v) for k, v in t.items()}


def _best(tf: dict, skip: tuple) -> str:
    """``name TFLOP/s`` of the fastest named plan in ``tf`` (``-`` without ``--plans``)."""
    plans = {k: v for k, v in tf.items() if k not in skip}
    if not plans:
        return "-"
    name = max(plans, key=plans.get)
    return f"{name} {plans[name]:.0f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=4096, help="ceiling loop rounds per warp")
    p.add_argument("--plans", action="store_true", help="also time every named plan")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    why = gpu_missing("mma_sync_ceiling.py")
    if why:
        print(why, file=sys.stderr)
        return 2
    import torch
    import torch.nn.functional as F
    from pyptx_kernels.ampere import host
    from pyptx_kernels.ampere.attention_config import SM80_ATTENTION_PLANS
    from pyptx_kernels.ampere.gemm_config import SM80_GEMM_CONFIGS
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    dev = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ctas = 4 * sms
    ceil_k = ceiling_kernel(ctas, args.iters)
    ones = torch.tensor([ONES], dtype=torch.int32, device="cuda")
    out = ceil_k(ones)
    torch.cuda.synchronize()
    want = float(args.iters * 16 * 4 * CHAINS)      # each element: iters * k16 * 1.0, x4 x CHAINS
    assert torch.allclose(out, torch.full_like(out, want)), "ceiling kernel: wrong sums"
    ms = timed({"ceiling": lambda: ceil_k(ones)}, args.rounds, do_bench)["ceiling"]
    ceiling = ceiling_flops(ctas, args.iters) / (ms * 1e-3) / 1e12
    lines = [f"# mma.sync ceiling and the Ampere kernels on {dev} ({sms} SMs), do_bench median",
             "", f"mma.sync m16n8k16 bf16 ceiling ({ctas} CTAs x {WARPS} warps x {CHAINS} chains): "
             f"**{ceiling:.0f} TFLOP/s**", ""]
    body = []
    for M, N, K in GEMM_SHAPES:
        torch.manual_seed(0)
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        d = host.matmul(a, b)
        ref = a.float() @ b.float()
        err = ((d.float() - ref).norm() / ref.norm()).item()
        fns = {"ours": lambda a=a, b=b: host.matmul(a, b),
               "cuBLAS": lambda a=a, b=b: torch.matmul(a, b)}
        if args.plans:
            fns.update({n: (lambda a=a, b=b, c=c: host.matmul(a, b, config=c))
                        for n, c in SM80_GEMM_CONFIGS})
        t = timed(fns, args.rounds, do_bench)
        tf = {k: 2.0 * M * N * K / (v * 1e-3) / 1e12 for k, v in t.items()}
        body.append([f"GEMM bf16 {M}x{N}x{K}", f"{tf['ours']:.0f}", f"{tf['cuBLAS']:.0f}",
                     f"{tf['ours'] / ceiling:.3f}", f"{tf['ours'] / tf['cuBLAS']:.3f}",
                     _best(tf, ("ours", "cuBLAS")), f"{err:.1e}"])
    for D, causal in ATTN_CASES:
        H, B = ATTN_HD // D, ATTN_TOKENS // ATTN_S
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, ATTN_S, H, D, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))

        def sdpa(q=q, k=k, v=v, causal=causal):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                      v.transpose(1, 2), is_causal=causal)

        o, _ = host.attention(q, k, v, causal=causal)
        err = (o.float() - sdpa().transpose(1, 2).float()).abs().max().item()
        fns = {"ours": lambda q=q, k=k, v=v, c=causal: host.attention(q, k, v, causal=c),
               "SDPA flash": sdpa}
        if args.plans:
            fns.update({n: (lambda q=q, k=k, v=v, c=causal, p=p:
                            host.attention(q, k, v, causal=c, config=p))
                        for n, p in SM80_ATTENTION_PLANS if p.D == D})
        t = timed(fns, args.rounds, do_bench)
        flops = 4.0 * B * H * ATTN_S * ATTN_S * D * (0.5 if causal else 1.0)
        tf = {k2: flops / (v2 * 1e-3) / 1e12 for k2, v2 in t.items()}
        body.append([f"attention fwd D={D} {'causal' if causal else 'full'} S={ATTN_S}",
                     f"{tf['ours']:.0f}", f"{tf['SDPA flash']:.0f}",
                     f"{tf['ours'] / ceiling:.3f}", f"{tf['ours'] / tf['SDPA flash']:.3f}",
                     _best(tf, ("ours", "SDPA flash")), f"{err:.1e} (max abs)"])
    lines += markdown_table(["case", "pyptx sm_80 TFLOP/s", "peer TFLOP/s", "of ceiling",
                             "ours / peer", "fastest plan (--plans)", "err"], body)
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
