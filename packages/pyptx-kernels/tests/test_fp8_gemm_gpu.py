"""GPU tests of the scaled FP8 GEMM (``pyptx_kernels.fp8_gemm``).

Inputs: fresh random fp8 matrices (normal samples x 2, rounded to e4m3/e5m2) and
random f32 scales in [0.5, 1.5); outputs are poisoned (NaN) before each launch, so an
element the kernel never writes fails. The reference is float64 of the dequantised
fp8 inputs (``fp8_gemm.reference``). Tolerances on ``||D - ref|| / ||ref||``:
8e-3 for bf16 output (its rounding, ~2**-9 per element), 3e-3 for f32 output (the
tensor core's fp8 accumulation inside one 128-K block; promoted every 128 K), also
at K = 16384; without promotion (``fast_accum``) 1e-2.

    pytest -m gpu packages/pyptx-kernels/tests/test_fp8_gemm_gpu.py
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),  # conftest.py: unwritten elements are NaN
]

from pyptx_kernels.fp8_gemm import Fp8GemmConfig, host, reference  # noqa: E402
from pyptx_kernels.fp8_gemm.testing import TOL, long_k_errors, make_inputs  # noqa: E402


def rel_err(d, ref):
    assert not torch.isnan(d).any(), "unwritten (NaN-poisoned) or NaN elements"
    return ((d.double() - ref).norm() / ref.norm()).item()


CASES = [
    # M, N, K, dtype, dtype_b, out, config
    (256, 512, 384, "e4m3", "e4m3", "bf16", None),
    (1000, 520, 400, "e4m3", "e4m3", "f32", None),
    (200, 328, 136, "e5m2", "e5m2", "bf16", Fp8GemmConfig(BN=128, cluster=1)),
    (129, 65, 16, "e4m3", "e5m2", "f32", None),
    (1, 1, 32, "e4m3", "e4m3", "f32", Fp8GemmConfig(BN=128, cluster=1)),
    (777, 1500, 1000, "e4m3", "e4m3", "bf16", Fp8GemmConfig(BN=256, cluster=2, num_sms=7)),
    (777, 1500, 1000, "e4m3", "e4m3", "bf16", Fp8GemmConfig(BN=64, cluster=2, stages=3)),
    (300, 700, 208, "e5m2", "e4m3", "bf16", Fp8GemmConfig(BN=128, cluster=2)),
    (4095, 4097, 4112, "e4m3", "e4m3", "bf16", None),
]


@pytest.mark.parametrize("M,N,K,da,db,out,config", CASES)
@pytest.mark.parametrize("kind", ["tensor", "row", "block"])
def test_scaled_mm(M, N, K, da, db, out, config, kind):
    a, w, sa, sb = make_inputs(M, N, K, kind, da, db, seed=M + N + K)
    d = host.scaled_mm(a, w.t(), sa, sb, out_dtype=out, config=config)
    assert d.shape == (M, N)
    assert d.dtype == (torch.bfloat16 if out == "bf16" else torch.float32)
    assert rel_err(d, reference(a, w, sa, sb, kind)) < TOL[out]


@pytest.mark.parametrize("kind", ["tensor", "row"])
@pytest.mark.parametrize("config", [None, Fp8GemmConfig(BN=192, cluster=1)])
def test_fast_accum(kind, config):
    a, w, sa, sb = make_inputs(500, 600, 1040, kind, seed=7)
    d = host.scaled_mm(a, w.t(), sa, sb, out_dtype="f32", fast_accum=True, config=config)
    assert rel_err(d, reference(a, w, sa, sb, kind)) < 1e-2


@pytest.mark.parametrize("positive", [False, True])
def test_long_k_promotion(positive):
    """At K = 16384 the promoted result stays within the f32-output tolerance, and is no
    worse than twice torch._scaled_mm's (use_fast_accum=False) where torch runs it."""
    errs = long_k_errors(positive=positive)
    print(errs)
    assert errs["pyptx (promoted)"] < TOL["f32"]
    if "torch._scaled_mm" in errs:
        assert errs["pyptx (promoted)"] <= 2 * errs["torch._scaled_mm"] + 1e-6


def test_row_major_b_is_transposed_first():
    a, w, sa, sb = make_inputs(200, 136, 256, "row", seed=11)
    b = w.t().contiguous()  # row-major (K, N)
    d = host.scaled_mm(a, b, sa, sb)
    assert rel_err(d, reference(a, w, sa, sb, "row")) < TOL["bf16"]


def test_matches_torch_scaled_mm():
    a, w, sa, sb = make_inputs(512, 768, 1024, "tensor", seed=12)
    d = host.scaled_mm(a, w.t(), sa, sb)
    t = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    assert ((d.double() - t.double()).norm() / t.double().norm()).item() < TOL["bf16"]


def test_torch_compile_and_cuda_graph():
    a, w, sa, sb = make_inputs(512, 384, 640, "block", seed=13)
    ref = reference(a, w, sa, sb, "block")
    f = torch.compile(lambda x, y, s, t: host.scaled_mm(x, y.t(), s, t))
    assert rel_err(f(a, w, sa, sb), ref) < TOL["bf16"]
    out = host.scaled_mm(a, w.t(), sa, sb)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        host.scaled_mm(a, w.t(), sa, sb)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        out = host.scaled_mm(a, w.t(), sa, sb)
    a2, w2, sa2, sb2 = make_inputs(512, 384, 640, "block", seed=14)
    a.copy_(a2)
    sa.copy_(sa2)
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(out, reference(a, w, sa, sb, "block")) < TOL["bf16"]


def test_jax_jit():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax has no GPU")
    import numpy as np

    for kind in ("tensor", "row", "block"):
        a, w, sa, sb = make_inputs(300, 200, 272, kind, device="cpu", seed=15)
        ja = jnp.asarray(a.float().numpy()).astype(jnp.float8_e4m3fn)
        jw = jnp.asarray(w.float().numpy()).astype(jnp.float8_e4m3fn)
        jsa, jsb = jnp.asarray(sa.numpy()), jnp.asarray(sb.numpy())
        d = jax.jit(lambda x, y, s, t: host.scaled_mm(x, y, s, t, trans_b=True, out_dtype="f32"))(
            ja, jw, jsa, jsb)
        ref = reference(a, w, sa, sb, kind).numpy()
        err = np.linalg.norm(np.asarray(d, np.float64) - ref) / np.linalg.norm(ref)
        assert d.shape == (300, 200) and err < TOL["f32"], (kind, err)

