"""GPU tests of the Ampere kernels (``pyptx_kernels.ampere``): sm_80 PTX, run on whatever
device is there (an H200 runs it as sm_90). Fresh random inputs, outputs poisoned (NaN)
before each launch, so an element a kernel never writes fails; errors
``||out - ref|| / ||ref||`` against float64 of the same rounded inputs: 6e-3 for 16-bit
outputs, 1e-4 for f32 GEMM outputs; the attention LSE within 2e-3 (absolute).

    pytest -m gpu packages/pyptx-kernels/tests/test_ampere_gpu.py
"""

from __future__ import annotations

import math

import pytest
from pyptx_kernels.ampere import api, host

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),  # conftest.py: unwritten elements are NaN
]

TOL = {"bf16": 6e-3, "f16": 6e-3, "f32": 1e-4}
DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def rel_err(d, ref):
    assert not torch.isnan(d).any(), "unwritten (NaN-poisoned) or NaN elements"
    return ((d.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("M,N,K,trans_b,config", [
    (256, 512, 320, False, None),
    (1000, 520, 136, True, None),
    (129, 65, 1, False, None),                      # K padded to 8, N cropped
    (4095, 4097, 4100, False, None),
    (4095, 4097, 4100, True, "128x256x32_s3"),
    (777, 1500, 1000, False, "128x128x64_s3"),
    (64, 4096, 4096, True, "64x128x32_s4"),
    (2048, 2048, 2048, False, "128x256x32_s3"),
])
@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_gemm_matches_float64(M, N, K, trans_b, config, dt):
    torch.manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda").to(DT[dt])
    b = (torch.randn(N, K, device="cuda").to(DT[dt]).T if trans_b
         else torch.randn(K, N, device="cuda").to(DT[dt]))
    ref = a.double() @ b.double()
    d = host.matmul(a, b, config=config)
    assert d.shape == (M, N) and d.dtype == DT[dt]
    assert rel_err(d, ref) < TOL[dt]


@pytest.mark.parametrize("out_dtype", ["f32", "bf16"])
def test_gemm_output_dtypes_and_the_custom_op(out_dtype):
    a = torch.randn(3, 100, 256, device="cuda").to(torch.bfloat16)
    w = torch.randn(384, 256, device="cuda").to(torch.bfloat16)
    d = api.sm80_matmul(a, w.T, out_dtype=DT[out_dtype])
    assert d.shape == (3, 100, 384) and d.dtype == DT[out_dtype]
    assert rel_err(d, a.double() @ w.double().T) < TOL[out_dtype]


def attention_ref(q, k, v, causal, scale):
    """float64 ``(out, lse)`` for ``(B, S, H, D)`` inputs (kv head ``h // (Hq // Hkv)``)."""
    rep = q.shape[2] // k.shape[2]
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        S, Sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(S, Sk, dtype=torch.bool, device=s.device).triu(1),
                          float("-inf"))
    lse = torch.logsumexp(s, -1)
    return (torch.softmax(s, -1) @ v).transpose(1, 2), lse


@pytest.mark.parametrize("B,S,Sk,Hq,Hkv,D", [
    (2, 1000, 1000, 8, 2, 64), (1, 2048, 2048, 4, 4, 128), (2, 333, 777, 4, 1, 128),
    (1, 64, 64, 2, 2, 64), (4, 1024, 1024, 16, 16, 64),
])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_attention_matches_float64(B, S, Sk, Hq, Hkv, D, causal, dt):
    torch.manual_seed(S + Sk + D)
    q = torch.randn(B, S, Hq, D, device="cuda").to(DT[dt])
    k = torch.randn(B, Sk, Hkv, D, device="cuda").to(DT[dt])
    v = torch.randn(B, Sk, Hkv, D, device="cuda").to(DT[dt])
    scale = 1 / math.sqrt(D)
    out, lse = host.attention(q, k, v, causal=causal)
    ref, ref_lse = attention_ref(q, k, v, causal, scale)
    assert rel_err(out, ref) < TOL[dt]
    assert (lse.double() - ref_lse).abs().max().item() < 2e-3


def test_attention_bhsd_through_the_custom_op():
    q, k, v = (torch.randn(2, 4, 300, 128, device="cuda").to(torch.bfloat16) for _ in range(3))
    out = api.sm80_attention(q, k, v, causal=True, layout="bhsd", scale=0.1)
    ref, _ = attention_ref(*(x.transpose(1, 2) for x in (q, k, v)), True, 0.1)
    assert out.shape == q.shape
    assert rel_err(out, ref.transpose(1, 2)) < TOL["bf16"]
