"""Attention fwd+bwd with grouped KV heads on the GPU: default calls against the best SDPA backend
(do_bench), the first call's wall time, and the per-kernel split (torch profiler), ours and
cuDNN's (docs/performance.md). Run: python tools/attention_gqa_profile.py"""
# ruff: noqa: B023, E402  (a measurement script: closures over the loop's tensors, imports after setup)

import time

import pyptx_kernels as pk
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

dev = "cuda"
SHAPES = [
    (2, 4096, 32, 8, 128, True),
    (1, 16384, 16, 4, 128, True),
    (3, 3000, 12, 4, 64, True),
    (4, 2048, 32, 32, 128, True),
    (2, 4096, 32, 32, 128, True),
    (2, 4096, 8, 8, 128, True),
]


def flops(B, S, Hq, D, causal, bwd):
    f = 4 * B * Hq * S * S * D * (0.5 if causal else 1)
    return f * (2.5 if bwd else 1)


for B, S, Hq, Hkv, D, causal in SHAPES:
    torch.manual_seed(0)
    q = torch.randn(B, S, Hq, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, S, Hkv, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, S, Hkv, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(B, S, Hq, D, device=dev, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    o = pk.attention(q, k, v, causal=causal)
    o.backward(do)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0

    def ours():
        q.grad = k.grad = v.grad = None
        o = pk.attention(q, k, v, causal=causal)
        o.backward(do)

    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    dot = do.transpose(1, 2)

    def peer(be):
        def f():
            qt.grad = kt.grad = vt.grad = None
            with sdpa_kernel(be):
                o = F.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=causal, enable_gqa=Hq != Hkv
                )
            o.backward(dot)

        return f

    fw_ours = do_bench(lambda: pk.attention(q, k, v, causal=causal))
    t_ours = do_bench(ours)
    res = {}
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            peer(be)()
            res[name] = do_bench(peer(be))
        except Exception:
            res[name] = float("nan")
    best = min(v for v in res.values() if v == v)
    bw = flops(B, S, Hq, D, causal, True)
    print(
        f"\n## B{B} S{S} {Hq}/{Hkv} D{D} causal={causal}: first {first:.1f}s fwd {fw_ours:.3f} ms "
        f"fwd+bwd ours {t_ours:.3f} ms peers {res} -> ratio {best / t_ours:.3f}",
        flush=True,
    )
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            ours()
        torch.cuda.synchronize()
    tot = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0):
            tot[e.key] = (getattr(e, "self_device_time_total", 0) / 5 / 1000, e.count // 5)
    for k_, (t, c) in sorted(tot.items(), key=lambda x: -x[1][0])[:10]:
        print(f"   {t:8.3f} ms x{c}  {k_[:110]}")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for be in (SDPBackend.CUDNN_ATTENTION,):
            for _ in range(5):
                peer(be)()
        torch.cuda.synchronize()
    for e in sorted(prof.key_averages(), key=lambda e: -getattr(e, "self_device_time_total", 0))[
        :5
    ]:
        print(
            f"   cudnn {getattr(e, 'self_device_time_total', 0) / 5 / 1000:8.3f} ms  {e.key[:100]}"
        )
