"""Host microseconds per call of the public ops beside their own layers and torch's op
(back-to-back calls, tiny shapes; docs/performance.md). Run: python tools/host_parts.py"""
# ruff: noqa: B023, E402  (a measurement script: closures over the loop's tensors, imports after setup)

import time

import pyptx_kernels as pk
import torch
from pyptx_kernels.flash_attention import fwd_host


def us(f, n=200):
    for _ in range(10):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return 1e6 * (t1 - t0) / n


B, S, H, D = 1, 128, 8, 128  # tiny: host-bound
q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
k, v = torch.randn_like(q), torch.randn_like(q)
name = "bf16"
kern = fwd_host.forward_kernel(B, S, H, H, D, S, name, True, D**-0.5)
print("kernel object:", type(kern).__name__)
print(
    f"forward_kernel lookup  {us(lambda: fwd_host.forward_kernel(B, S, H, H, D, S, name, True, D**-0.5)):.1f} us"
)
print(f"memory_layouts         {us(lambda: fwd_host.memory_layouts(q, k, v)):.1f} us")
print(f"kern(q,k,v)            {us(lambda: kern(q, k, v)):.1f} us")
inner = getattr(kern, "_hot", None)
print("hot:", None if inner is None else type(inner[2]).__name__)
real = kern.choose(q, k, v) if hasattr(kern, "choose") else kern
print(f"real kernel launch     {us(lambda: real(q, k, v)):.1f} us")
try:
    st = real.launcher("torch").state
    print("fast launchers:", len(st.fast), "plans:", len(st.plans))
except Exception as e:
    print("launcher state ?", e)
print(
    f"attention_forward      {us(lambda: fwd_host.attention_forward(q, k, v, causal=True)):.1f} us"
)
with torch.no_grad():
    print(f"pk.attention no_grad   {us(lambda: pk.attention(q, k, v, causal=True)):.1f} us")
x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
print(
    f"pk.matmul              {us(lambda: pk.matmul(x, w.T)):.1f} us   torch {us(lambda: torch.matmul(x, w.T)):.1f} us"
)
from pyptx_kernels.gemm import host

print(f"host.matmul            {us(lambda: host.matmul(x, w.T)):.1f} us")
xr = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
wr = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
print(
    f"pk.rms_norm            {us(lambda: pk.rms_norm(xr, wr, 1e-6)):.1f} us   torch {us(lambda: torch.nn.functional.rms_norm(xr, (1024,), wr, 1e-6)):.1f} us"
)
qg = q.clone().requires_grad_()
kg = k.clone().requires_grad_()
vg = v.clone().requires_grad_()
do = torch.randn_like(q)


def step():
    o = pk.attention(qg, kg, vg, causal=True)
    o.backward(do)


print(f"attention fwd+bwd step {us(step, 100):.1f} us")
import cProfile
import pstats

pr = cProfile.Profile()
pr.enable()
for _ in range(50):
    real(q, k, v)
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(12)
