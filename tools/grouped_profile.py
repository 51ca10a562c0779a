"""Nsight Compute view of the small-N grouped forward (4x2048x256x2048) beside torch.bmm on the
same data: duration, DRAM / L2 / SM throughput, bytes moved and the top warp stall reasons of
each kernel, to tell what bounds the 25 us kernel (issue 16's last row).

    ncu --clock-control none --set full -k "regex:grouped|gemm|nvjet|xmma|cutlass" -s 2 -c 4 \
        python3 tools/grouped_profile.py --no-time
    python3 tools/grouped_profile.py            # do_bench medians only
"""
import sys
from pathlib import Path

import torch

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
gg = load_module(ROOT / "examples/hopper/grouped_gemm.py", "grouped_example")

G, Mg, N, K = 4, 2048, 256, 2048
CONFIG = {"BM": 64, "BN": 256, "prefetch": True}  # the tuner's pick on the H100 (session 14)
torch.manual_seed(0)
a = torch.randn(G * Mg, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(G, K, N, device="cuda", dtype=torch.bfloat16)
offs = torch.arange(1, G + 1, device="cuda", dtype=torch.int32) * Mg
ours = lambda: gg.grouped_mm(a, b, offs, config=CONFIG)  # noqa: E731
peer = lambda: torch.bmm(a.view(G, Mg, K), b)  # noqa: E731
ref = peer().reshape(G * Mg, N).float()
err = ((ours().float() - ref).norm() / ref.norm()).item()
print(f"rel err vs bmm {err:.1e}")
if "--no-time" in sys.argv:
    for _ in range(3):  # ncu -s 2 skips the check's two launches
        ours()
        peer()
    torch.cuda.synchronize()
else:
    from triton.testing import do_bench
    for name, f in (("pyptx", ours), ("bmm", peer)) * 2:
        print(f"{name}: {1e3 * do_bench(f, rep=200):.2f} us")
