"""The Ampere kernels (``pyptx_kernels.ampere``) on the CPU: ``ptxsim`` runs their sm_80 PTX
(``cp.async`` rings into swizzled shared memory, ``ldmatrix``, ``mma.sync``) against float64 on
small shapes with every output poisoned; ptxas for sm_80 assembles them without spills; bad
plans and shapes fail at the caller's line.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from pyptx_kernels.ampere.attention_config import (
    SM80_ATTENTION_PLANS,
    Sm80AttentionConfig,
    for_head_dim,
)
from pyptx_kernels.ampere.attention_kernel import build_sm80_attention
from pyptx_kernels.ampere.gemm_config import SM80_GEMM_CONFIGS, Sm80GemmConfig
from pyptx_kernels.ampere.gemm_kernel import build_sm80_gemm

from pyptx.errors import ConfigError

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import ptxsim  # noqa: E402

_dev, _f64 = ptxsim.device_bits, ptxsim.host_f64
TOL = {"bf16": 8e-3, "f16": 1e-3, "f32": 1e-5}
SMALL = Sm80GemmConfig(BM=64, BN=64, BK=32, warps_m=2, warps_n=2, stages=3, group_m=2)


def run_gemm(M, N, K, *, dtype="bf16", out_dtype="bf16", b_major="MN", config=SMALL, seed=0):
    """Relative error of the simulated GEMM against float64 of the same rounded inputs."""
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    a, b = _dev(A, dtype), _dev(B if b_major == "MN" else B.T, dtype)
    k = build_sm80_gemm(M, N, K, dtype=dtype, out_dtype=out_dtype, b_major=b_major,
                        config=config)
    (d,) = ptxsim.run(k.specialize(), [a, b])
    b64 = _f64(b, dtype) if b_major == "MN" else _f64(b, dtype).T
    ref = _f64(a, dtype) @ b64
    got = _f64(d, out_dtype)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("b_major", ["MN", "K"])
@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
def test_gemm_ragged_edges(b_major, out_dtype):
    # M, N past a tile edge, K past a k-step, and more k-steps (4) than stages (3): refills
    assert run_gemm(72, 80, 104, b_major=b_major, out_dtype=out_dtype) < TOL[out_dtype]


def test_gemm_f16_whole_tiles_and_grouped_order():
    # 3 x 2 tiles in bands of 2 tile rows, BK=64 (128-byte rows), f16 in and out
    cfg = Sm80GemmConfig(BM=32, BN=64, BK=64, warps_m=1, warps_n=2, stages=2, group_m=2)
    assert run_gemm(96, 128, 128, dtype="f16", out_dtype="f16", config=cfg) < TOL["f16"]


def test_gemm_fewer_k_steps_than_stages():
    assert run_gemm(64, 64, 32, config=SMALL, out_dtype="f32") < TOL["f32"]


@pytest.mark.parametrize("name,cfg", SM80_GEMM_CONFIGS, ids=[n for n, _ in SM80_GEMM_CONFIGS])
@pytest.mark.parametrize("b_major", ["MN", "K"])
def test_gemm_plans_assemble_without_spills(name, cfg, b_major, assemble):
    k = build_sm80_gemm(1000, 1016, 1000, b_major=b_major, config=cfg)
    log = assemble(k.ptx(), arch="sm_80")
    assert re.search(r"0 bytes spill stores, 0 bytes spill loads", log), log


@pytest.mark.parametrize("kw,msg", [
    (dict(BK=16), "BK must be 32 or 64, got 16"),
    (dict(BN=96, warps_n=2), "BN must be a multiple of 64"),
    (dict(BM=128, warps_m=1, BN=256, warps_n=2), "needs 512 f32 accumulators per thread"),
    (dict(warps_m=1, warps_n=1), "warps_m * warps_n must be 2, 4 or 8, got 1"),
    (dict(stages=7), "stages must be 2..6"),
    (dict(BN=256, warps_n=4, BK=64, stages=4), "needs 196736 bytes of shared memory"),
    (dict(BM=0), "every field must be a positive int"),
])
def test_bad_plans_fail_at_the_caller_line(kw, msg):
    with pytest.raises(ConfigError) as ei:
        Sm80GemmConfig(**kw)
    assert str(ei.value).startswith(f"{__file__}:"), str(ei.value)
    assert msg in str(ei.value)


@pytest.mark.parametrize("args,kw,msg", [
    ((64, 64, 60), {}, "K and N must be multiples of 8"),
    ((64, 60, 64), {}, "K and N must be multiples of 8"),
    ((64, 64, 64), {"dtype": "f32"}, "dtype must be one of bf16, f16, got 'f32'"),
    ((64, 64, 64), {"b_major": "N"}, "b_major must be 'MN' or 'K'"),
    ((0, 64, 64), {}, "M must be a positive int, got 0"),
    ((64, 64, 64), {"config": "nope"}, "no plan named 'nope'"),
])
def test_bad_gemm_calls_fail_at_the_caller_line(args, kw, msg):
    with pytest.raises(ConfigError) as ei:
        build_sm80_gemm(*args, **kw)
    assert str(ei.value).startswith(f"{__file__}:"), str(ei.value)
    assert msg in str(ei.value)


# ------------------------------------------------------------------ attention forward
SMALL_ATTN = {64: Sm80AttentionConfig(D=64, BQ=32, BKV=32, warps=2),
              128: Sm80AttentionConfig(D=128, BQ=64, BKV=32, warps=4)}


def attention_reference(q, k, v, causal, scale):
    """float64 ``(out, lse)`` of ``(B, S, H, D)`` inputs (kv head ``h // (Hq // Hkv)``)."""
    B, S, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    kk, vv = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if causal:
        s = np.where(np.arange(Sk)[None, :] <= np.arange(S)[:, None], s, -np.inf)
    mx = s.max(-1, keepdims=True)
    p = np.exp(s - mx)
    lse = (np.log(p.sum(-1)) + mx[..., 0])
    out = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), vv)
    return out, lse


def run_attention(B, S, Sk, Hq, Hkv, D, causal, dtype="bf16", config=None, seed=0):
    """Relative errors of the simulated forward's ``(out, lse)`` against float64."""
    rng = np.random.default_rng(seed)
    q, k, v = (_dev(rng.standard_normal(s), dtype) for s in
               ((B, S, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)))
    kern = build_sm80_attention(B, S, Hq, Hkv, D, Sk=Sk, dtype=dtype, causal=causal,
                                config=config or SMALL_ATTN[D])
    o, lse = ptxsim.run(kern.specialize(), [q, k, v])
    ref_o, ref_lse = attention_reference(*(_f64(x, dtype) for x in (q, k, v)), causal,
                                         1 / np.sqrt(D))
    got_o = _f64(o, dtype)
    got_lse = lse.view(np.float32).astype(np.float64)
    return (float(np.linalg.norm(got_o - ref_o) / np.linalg.norm(ref_o)),
            float(np.abs(got_lse - ref_lse).max()))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_ragged_gqa(causal):
    # 3 query blocks (the last ragged), 3 key blocks (the last ragged), 2 query heads per
    # kv head: unmasked and masked blocks, the prefetch across both loops
    err_o, err_lse = run_attention(1, 72, 72, 2, 1, 64, causal)
    assert err_o < TOL["bf16"] and err_lse < 1e-4, (err_o, err_lse)


def test_attention_d128_longer_keys_f16():
    err_o, err_lse = run_attention(1, 32, 96, 1, 1, 128, False, dtype="f16")
    assert err_o < 2e-3 and err_lse < 1e-4, (err_o, err_lse)


def test_gemm_fewer_rows_than_one_fragment():
    assert run_gemm(10, 40, 64, out_dtype="f32") < TOL["f32"]


@pytest.mark.parametrize("name,plan", SM80_ATTENTION_PLANS, ids=[n for n, _ in SM80_ATTENTION_PLANS])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_plans_assemble_without_spills(name, plan, causal, assemble):
    k = build_sm80_attention(2, 1000, 8, 2, plan.D, causal=causal, config=plan)
    log = assemble(k.ptx(), arch="sm_80")
    assert re.search(r"0 bytes spill stores, 0 bytes spill loads", log), log


def test_the_default_attention_plan_is_the_first_named_one():
    for D in (64, 128):
        assert next(p for _, p in SM80_ATTENTION_PLANS if p.D == D) == for_head_dim(D)


@pytest.mark.parametrize("kw,msg", [
    (dict(D=96), "D must be 64 or 128, got 96"),
    (dict(BQ=256), "BQ / warps must be 16 or 32 rows"),
    (dict(BKV=48), "BKV must be 32, 64 or 128"),
    (dict(D=64, BQ=128, BKV=128), "keep 224 fragment registers per thread, over 192"),
    (dict(BKV=128, BQ=128), "keep"),
    (dict(warps=3), "warps must be 2, 4 or 8"),
])
def test_bad_attention_plans_fail_at_the_caller_line(kw, msg):
    with pytest.raises(ConfigError) as ei:
        Sm80AttentionConfig(**kw)
    assert str(ei.value).startswith(f"{__file__}:"), str(ei.value)
    assert msg in str(ei.value)


@pytest.mark.parametrize("args,kw,msg", [
    ((1, 64, 3, 2, 64), {}, "Hq must be a multiple of Hkv"),
    ((1, 64, 2, 2, 96), {}, "head dim D must be 64 or 128, got 96"),
    ((1, 64, 2, 2, 64), {"dtype": "f32"}, "dtype must be bf16 or f16"),
    ((1, 64, 2, 2, 64), {"causal": 1}, "causal must be True or False"),
    ((1, 64, 2, 2, 64), {"scale": -1.0}, "scale must be a positive number"),
    ((1, 64, 2, 2, 64), {"config": Sm80AttentionConfig(D=128)}, "with D=64"),
])
def test_bad_attention_calls_fail_at_the_caller_line(args, kw, msg):
    with pytest.raises(ConfigError) as ei:
        build_sm80_attention(*args, **kw)
    assert str(ei.value).startswith(f"{__file__}:"), str(ei.value)
    assert msg in str(ei.value)


# ------------------------------------------------------------------ the mma.sync ceiling loop
def test_ceiling_kernel_counts_every_mma(assemble):
    sys.path.insert(0, str(HERE.parents[3] / "benchmarks"))
    import mma_sync_ceiling as ceiling

    ones = np.array([ceiling.ONES], np.uint32)
    (out,) = ptxsim.run(ceiling.ceiling_kernel(2, 3).specialize(), [ones])
    # A and B all 1.0: each mma adds 16 to each of a thread's 4 x CHAINS accumulators
    assert np.unique(out.view(np.float32)).tolist() == [3 * 16 * 4 * ceiling.CHAINS]
    assert ceiling.ceiling_flops(2, 3) == 2 * ceiling.WARPS * 3 * ceiling.CHAINS * 4096
    log = assemble(ceiling.ceiling_kernel(528, 4096).ptx(), arch="sm_80")
    assert "0 bytes spill stores" in log


# ------------------------------------------------------------------ host plumbing
@pytest.fixture
def fake_launches(monkeypatch):
    """``host``'s kernels replaced by float64 models of what they compute (CPU tensors), with
    the arguments each launch got."""
    torch = pytest.importorskip("torch")
    from pyptx_kernels.ampere import host

    calls = []

    def gemm_kernel(M, N, K, dt, ot, b_major, cfg):
        def run(a, b):
            calls.append((M, N, K, b_major, tuple(a.shape), tuple(b.shape)))
            bb = b.double() if b_major == "MN" else b.double().T
            return (a.double() @ bb).to(torch.float32 if ot == "f32" else a.dtype)
        return run

    monkeypatch.setattr(host, "gemm_kernel", gemm_kernel)
    monkeypatch.setattr(host, "check_devices", lambda *a: None)
    return torch, host, calls


@pytest.mark.parametrize("weight", [False, True])
def test_matmul_layout_padding_and_crop(fake_launches, weight):
    torch, host, calls = fake_launches
    a = torch.randn(3, 10, 60).to(torch.bfloat16)
    b = torch.randn(50, 60).to(torch.bfloat16).T if weight else \
        torch.randn(60, 50).to(torch.bfloat16)
    d = host.matmul(a, b, out_dtype="f32")
    assert d.shape == (3, 10, 50) and d.dtype == torch.float32
    ref = a.double() @ b.double()
    assert torch.allclose(d.double(), ref, rtol=1e-5, atol=1e-5)
    M, N, K, b_major, ashape, bshape = calls[-1]
    assert (M, K, b_major, ashape) == (30, 64, "K" if weight else "MN", (30, 64))
    assert (N, bshape) == ((50, (50, 64)) if weight else (56, (64, 56)))


def test_host_refusals_name_the_caller_line(fake_launches):
    torch, host, _ = fake_launches
    a = torch.randn(4, 8).to(torch.bfloat16)
    with pytest.raises(ConfigError, match=r"^" + re.escape(__file__) + r":\d+: ampere.matmul: "
                       r"a and b must both be bfloat16 or both float16"):
        host.matmul(a, torch.randn(8, 8))
    with pytest.raises(ConfigError, match="expected a \\(..., K\\) and b \\(K, N\\)"):
        host.matmul(a, torch.randn(7, 8).to(torch.bfloat16))
    q = torch.randn(1, 8, 2, 96).to(torch.bfloat16)
    with pytest.raises(ConfigError, match="supports head dim 64 or 128, got 96"):
        host.attention(q, q, q)


def test_gemm_default_plan_one_tile():
    # the default 128x128x32 4-stage plan (64x64 per warp), a ragged corner, 5 k-steps
    assert run_gemm(120, 128, 160, config=None, b_major="K") < TOL["bf16"]
