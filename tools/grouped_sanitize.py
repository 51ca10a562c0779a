"""A small ragged grouped GEMM for compute-sanitizer (memcheck, racecheck, synccheck):
G=3 with sizes [0, 37, 130], N=72, K=100 (K padded to 104), forward (bf16 and f32 out,
both B layouts, both epilogues) and backward (dA, dB, and dB split three ways: the opt-in
``WgradConfig(splits=3)``), every output checked. ``--defaults``: without the opt-in
configurations; ``--only i``: the i-th configuration of ``CONFIGS`` alone."""
import importlib
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
gg = importlib.import_module("pyptx_kernels.grouped_gemm")
host = importlib.import_module("pyptx_kernels.grouped_gemm.host")
P, W = gg.GroupedConfig, gg.WgradConfig

bad = 0


def check(name, got, ref, tol=1e-2):
    global bad
    err = ((got.double() - ref).norm() / ref.norm()).item()
    ok = err < tol and not torch.isnan(got).any().item()
    bad += not ok
    print(f"{name}: rel err {err:.1e} {'PASS' if ok else 'FAIL'}", flush=True)


sizes, N, K = [0, 37, 130], 72, 100
torch.manual_seed(0)
offs = gg.random_offsets(sizes)
a = torch.randn(sum(sizes), K, device="cuda", dtype=torch.bfloat16)
# (forward plan, weight-gradient plan or None)
CONFIGS = [(P(BM=128, BN=128, num_sms=4), None),
           (P(BM=64, BN=64, num_sms=2, store="masked"), None),
           # the opt-in L2 hints and split weight gradient (3 splits: runs of the 37-row group empty)
           (P(BM=128, BN=128, num_sms=4, l2_hint="stream_b"), W(splits=3, BM=64, BN=64, num_sms=3)),
           (P(BM=128, BN=128, num_sms=4, cluster=2), None),  # 2-CTA clusters sharing A
           # opt-in prefetches: tensor maps + group ends, L2 prefetch of a guessed first tile
           (P(BM=128, BN=128, num_sms=4, cluster=2, prefetch=True, warm=4), None),
           # speculative first tiles (every guess misses here: the stages go back unread)
           (P(BM=64, BN=64, num_sms=5, prefetch=True, speculate=2), None),
           # clusters along m sharing B (4 CTAs: some past their group's end)
           (P(BM=64, BN=64, num_sms=8, cluster=4, cluster_along="m"), None)]
if len(sys.argv) > 1 and sys.argv[1] == "--defaults":  # the configurations measured before
    CONFIGS = CONFIGS[:2]
elif len(sys.argv) > 2 and sys.argv[1] == "--only":    # --only 5: that configuration alone
    CONFIGS = [CONFIGS[int(sys.argv[2])]]
for cfg, wcfg in CONFIGS:
    for tb in (False, True):
        w = torch.randn(len(sizes), N, K, device="cuda", dtype=torch.bfloat16)
        b = w.transpose(-2, -1) if tb else w.transpose(-2, -1).contiguous()
        ref = gg.reference(a, b, offs)
        tag = f"{cfg} {wcfg} {'b.T' if tb else 'b'}"
        check(f"fwd bf16 {tag}", host.grouped_mm(a, b, offs, config=cfg), ref)
        check(f"fwd f32 {tag}", host.grouped_mm(a, b, offs, out_dtype="f32", config=cfg), ref)
        aa = a.clone().requires_grad_(True)
        leaf = (w if tb else b).clone().requires_grad_(True)
        y = host.grouped_mm(aa, leaf.transpose(-2, -1) if tb else leaf, offs, config=cfg,
                            wgrad_config=wcfg)
        dy = torch.randn_like(y)
        (y.float() * dy.float()).sum().backward()
        a64 = a.double().requires_grad_(True)
        b64 = b.double().requires_grad_(True)
        (gg.reference(a64, b64, offs) * dy.double()).sum().backward()
        check(f"dA {tag}", aa.grad, a64.grad)
        check(f"dB {tag}", leaf.grad, b64.grad.transpose(-2, -1) if tb else b64.grad)
torch.cuda.synchronize()
print("FAIL" if bad else "all PASS")
sys.exit(1 if bad else 0)
