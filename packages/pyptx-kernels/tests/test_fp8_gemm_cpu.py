"""CPU checks of the scaled FP8 GEMM (``pyptx_kernels.fp8_gemm``): every tuned
configuration assembles for sm_90a without spills, the builder and ``scaled_mm`` refuse
bad input with ``ConfigError``, and a numpy model of the kernel's exact work split
(persistent tile walk of ``tile_origin``, the accumulator fragment of every thread,
k-blocks of 128 with zero fill past K, the block-scale indices and predicates, the
row-scale epilogue over the padded ``sb``, store clipping) reproduces the float64
reference to 1e-12 and writes every output element exactly once.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyptx.errors import ConfigError
from pyptx.fragment import accumulator_coord

torch = pytest.importorskip("torch")

from pyptx_kernels.fp8_gemm import FP8_CONFIGS, Fp8GemmConfig, build_fp8_gemm, host, reference
from pyptx_kernels.fp8_gemm.config import BK
from pyptx_kernels.fp8_gemm.mainloop import partial_columns
from pyptx_kernels.fp8_gemm.scales import scale_kind
from pyptx_kernels.fp8_gemm.scheduler import Geometry, tile_origin
from pyptx_kernels.fp8_gemm.testing import TOL, make_inputs


# ---------------------------------------------------------------------- the PTX
@pytest.mark.parametrize("scale", ["tensor", "row", "block"])
def test_configs_assemble_without_spills(scale, assemble):
    kernels = [build_fp8_gemm(4096, 4096, 4096, scale=scale, config=c)
               for c in FP8_CONFIGS]
    kernels.append(build_fp8_gemm(1000, 520, 400, scale=scale, dtype="e5m2",
                                      dtype_b="e4m3", out_dtype="f32", ND=520,
                                  config=Fp8GemmConfig(BN=64)))
    if scale != "block":
        kernels.append(build_fp8_gemm(300, 200, 160, scale=scale, fast_accum=True,
                                          ND=200, config=Fp8GemmConfig(BN=192, cluster=1)))
        kernels.append(build_fp8_gemm(300, 200, 160, scale=scale, ND=200,
                                          config=Fp8GemmConfig(BN=192)))
    for k in kernels:
        text = k.ptx()
        assert "setmaxnreg.inc" in text and "cp.async.bulk.tensor" in text
        report = assemble(text)
        assert "0 bytes spill stores" in report, report


def test_promotion_uses_a_partial_accumulator_of_at_most_128_columns():
    text = build_fp8_gemm(4096, 4096, 4096).ptx()
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in text
    assert "m64n256k32" not in text
    assert text.count("add.f32") >= 128  # main += part, both halves
    fast = build_fp8_gemm(4096, 4096, 4096, fast_accum=True).ptx()
    assert "m64n256k32.f32.e4m3.e4m3" in fast
    block = build_fp8_gemm(4096, 4096, 4096, scale="block").ptx()
    assert block.count("fma.rn.f32") == 128
    assert "m64n96k32" in build_fp8_gemm(4096, 4096, 4096,
                                          config=Fp8GemmConfig(BN=192)).ptx()
    mixed = build_fp8_gemm(256, 256, 256, dtype="e5m2", dtype_b="e4m3").ptx()
    assert "k32.f32.e5m2.e4m3" in mixed


def test_builder_refuses_bad_configurations():
    with pytest.raises(ConfigError, match="multiple of 16"):
        build_fp8_gemm(64, 64, 100)
    with pytest.raises(ConfigError, match="block scales need BN"):
        build_fp8_gemm(64, 64, 128, scale="block", config=Fp8GemmConfig(BN=192))
    with pytest.raises(ConfigError, match="fast_accum"):
        build_fp8_gemm(64, 64, 128, scale="block", fast_accum=True)
    with pytest.raises(ConfigError, match="dtype"):
        build_fp8_gemm(64, 64, 128, dtype="bf16")
    with pytest.raises(ConfigError, match="scale must be"):
        build_fp8_gemm(64, 64, 128, scale="col")
    with pytest.raises(ConfigError, match="ND must be"):
        build_fp8_gemm(64, 65, 128, ND=65)
    with pytest.raises(ConfigError, match="must be an Fp8GemmConfig"):
        build_fp8_gemm(64, 64, 128, config={"BN": 128})


@pytest.mark.parametrize("fields,msg", [
    (dict(BM=96), "unsupported tile"), (dict(BN=320), "unsupported tile"),
    (dict(BN=True), "unsupported tile"), (dict(cluster=4), "cluster must be"),
    (dict(group_m=0), "group_m"), (dict(num_sms=2.0), "num_sms"), (dict(stages=0), "stages"),
    (dict(stages=8), "shared memory"),
])
def test_config_refuses_invalid_plans_at_the_callers_line(fields, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        Fp8GemmConfig(**fields)
    assert str(e.value).startswith(f"{__file__}:"), str(e.value)


def test_config_plans():
    assert FP8_CONFIGS[0] == Fp8GemmConfig() and len({c.name for c in FP8_CONFIGS}) == 4
    assert Fp8GemmConfig().ring_stages == 4 and Fp8GemmConfig(BN=128).ring_stages == 6
    assert Fp8GemmConfig(**Fp8GemmConfig(BN=64, stages=3).kwargs()) == Fp8GemmConfig(BN=64, stages=3)
    with pytest.raises(AttributeError):
        Fp8GemmConfig().BN = 128


# ---------------------------------------------------------------------- host side
def test_scale_kind_from_shapes():
    M, N, K = 300, 520, 400
    assert scale_kind((), (), M, N, K) == "tensor"
    assert scale_kind((1,), (1, 1), M, N, K) == "tensor"
    assert scale_kind((M, 1), (1, N), M, N, K) == "row"
    assert scale_kind((M, 4), (5, 4), M, N, K) == "block"
    assert scale_kind((M, 3), (5, 4), M, N, K) is None
    assert scale_kind((1, N), (M, 1), M, N, K) is None


def test_scaled_mm_refuses_bad_input():
    a = torch.randn(64, 128).to(torch.float8_e4m3fn)
    w = torch.randn(96, 128).to(torch.float8_e4m3fn)
    s = torch.ones(())
    with pytest.raises(ConfigError, match="inner dimensions"):
        host.scaled_mm(a, w[:, :64].t(), s, s)
    with pytest.raises(ConfigError, match="float8"):
        host.scaled_mm(a.float(), w.t(), s, s)
    with pytest.raises(ConfigError, match="fit no scale kind"):
        host.scaled_mm(a, w.t(), torch.ones(64, 2), torch.ones(1, 96))
    with pytest.raises(ConfigError, match="out_dtype"):
        host.scaled_mm(a, w.t(), s, s, out_dtype="f16")
    with pytest.raises(ConfigError, match="Fp8GemmConfig"):
        host.scaled_mm(a, w.t(), s, s, config={"BN": 128})


def test_k_padding_keeps_values():
    x = torch.randn(5, 40).to(torch.float8_e4m3fn)
    p = host.pad_k(x, "torch")
    assert p.shape == (5, 48) and p.dtype == x.dtype
    assert torch.equal(p[:, :40].float(), x.float()) and not p[:, 40:].float().any()


# ---------------------------------------------------------------------- numpy model
def model(M, N, K, kind, a, w, sa, sb, *, BM=128, BN=256, cluster=2, fast_accum=False,
          num_sms=132, ND=None):
    """The kernel's arithmetic, thread by thread, in float64 (see the module docstring)."""
    ND = ND or N
    g = Geometry(M, N, K, BM, BN, cluster, 8, num_sms)
    KS, NS = g.KS, g.NS
    sa_f = sa.reshape(-1)
    sb_f = sb.reshape(-1)
    NH = partial_columns(BN, fast_accum)
    W = np.arange(4)[:, None, None]
    L = np.arange(32)[None, :, None]
    Ij = np.arange(BN // 2)[None, None, :]
    row, col = np.broadcast_arrays(*accumulator_coord(Ij, W, L))  # (4, 32, BN/2) each
    row0 = 16 * W + L // 4                           # thread_origin
    assert (row - row0 == 8 * ((Ij // 2) % 2)).all()
    i_part = Ij % (NH // 2)                          # the register of the partial sum
    half = Ij // (NH // 2)
    out = np.full((M, ND), np.nan)
    writes = np.zeros((M, ND), dtype=int)
    seen = set()
    for cid in range(g.clusters):
        for rank in range(cluster):
            for t in range(cid, g.tiles, g.clusters):
                m0, n0 = tile_origin(t, rank, g)
                assert (m0, n0) not in seen
                seen.add((m0, n0))
                for wg in range(BM // 64):
                    r = m0 + wg * 64 + row
                    c = n0 + col
                    r0 = m0 + wg * 64 + row0
                    main = np.zeros(row.shape)
                    for kb in range(g.num_kb):
                        k0, k1 = kb * BK, min(K, (kb + 1) * BK)
                        ablk = np.zeros((64, BK))
                        wblk = np.zeros((BN, BK))
                        rows_a = a[m0 + wg * 64: m0 + wg * 64 + 64, k0:k1]
                        rows_w = w[n0: n0 + BN, k0:k1]
                        ablk[:rows_a.shape[0], :k1 - k0] = rows_a
                        wblk[:rows_w.shape[0], :k1 - k0] = rows_w
                        # the registers the halves' wgmma write; others stay 0
                        part = np.zeros(row.shape)
                        for h in range(BN // NH):
                            js = slice(h * (NH // 2), (h + 1) * (NH // 2))
                            part[..., js] = (ablk @ wblk.T)[row[..., js], col[..., js]]
                        if kind == "block":
                            ra = r0 * KS
                            sa0 = np.where(r0 < M, sa_f[np.minimum(ra + kb, sa_f.size - 1)], 0)
                            i1 = ra + kb + 8 * KS
                            sa1 = np.where(r0 + 8 < M, sa_f[np.minimum(i1, sa_f.size - 1)], 0)
                            nbk = (n0 + half * NH) >> 7
                            sbv = np.where(nbk < NS, sb_f[np.minimum(nbk * KS + kb, sb_f.size - 1)], 0)
                            s = np.where((i_part // 2) % 2, sa1, sa0) * sbv
                            main = main + part * s
                        else:
                            main = main + part
                    if kind == "tensor":
                        v = main * (sa_f[0] * sb_f[0])
                    elif kind == "row":
                        rs0 = np.where(r0 < M, sa_f[np.minimum(r0, M - 1)], 0)
                        rs1 = np.where(r0 + 8 < M, sa_f[np.minimum(r0 + 8, M - 1)], 0)
                        rs = np.where((Ij // 2) % 2, rs1, rs0)
                        cs = np.where(c < N, sb_f[np.minimum(c, N - 1)], 0)
                        v = main * rs * cs
                    else:
                        v = main
                    ok = (r < M) & (c < ND)
                    out[r[ok], c[ok]] = v[ok]
                    np.add.at(writes, (r[ok], c[ok]), 1)
    assert len(seen) == g.tiles * cluster
    return out, writes


MODEL_CASES = [
    # M, N, K, kind, config
    (200, 328, 400, "block", dict(BN=256, cluster=2, num_sms=4)),
    (200, 328, 400, "block", dict(BN=128, cluster=1, num_sms=3)),
    (129, 65, 16, "block", dict(BN=64, cluster=2, num_sms=132)),
    (300, 520, 272, "row", dict(BN=256, cluster=2, num_sms=2)),
    (129, 65, 16, "row", dict(BN=128, cluster=1, num_sms=5)),
    (300, 520, 272, "tensor", dict(BN=192, cluster=1, num_sms=7, fast_accum=True)),
    (513, 260, 144, "tensor", dict(BN=128, cluster=2, num_sms=6)),
    (300, 520, 272, "row", dict(BN=192, cluster=1, num_sms=5)),
    (300, 520, 272, "tensor", dict(BN=192, cluster=2, num_sms=132)),
]


@pytest.mark.parametrize("M,N,K,kind,cfg", MODEL_CASES)
def test_numpy_model_of_the_kernel_matches_the_reference(M, N, K, kind, cfg):
    a, w, sa, sb = make_inputs(M, N, K, kind, device="cpu", seed=3)
    ref = reference(a, w, sa, sb, kind).numpy()
    ND = N + (-N % 8)
    a64, w64 = a.double().numpy(), w.double().numpy()
    out, writes = model(M, N, K, kind, a64, w64, sa.double().numpy(), sb.double().numpy(),
                        ND=ND, **cfg)
    assert (writes == 1).all(), "every element of the padded output written exactly once"
    np.testing.assert_allclose(out[:, :N], ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    assert not out[:, N:].any(), "padding columns are zero"


def test_reference_block_scales_match_the_definition():
    M, N, K = 7, 130, 300
    a, w, sa, sb = make_inputs(M, N, K, "block", device="cpu", seed=5)
    ref = reference(a, w, sa, sb, "block")
    a64, w64 = a.double(), w.double()
    want = torch.zeros(M, N, dtype=torch.float64)
    for kb in range(3):
        ks = slice(kb * 128, min(K, kb * 128 + 128))
        partial = a64[:, ks] @ w64[:, ks].T
        want += partial * sa[:, kb].double()[:, None] * sb[torch.arange(N) // 128, kb].double()[None, :]
    torch.testing.assert_close(ref, want, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------- ptxas
@pytest.mark.parametrize("scale", ["tensor", "row", "block"])
def test_default_configs_keep_wgmma_asynchronous(scale, assemble):
    for c in FP8_CONFIGS:
        report = assemble(build_fp8_gemm(4096, 4096, 4096, scale=scale, config=c).ptx())
        assert "serialized" not in report, (c, report)



# ---------------------------------------------------------------------- accumulation model
def tensor_core_sum(a, w, m=14):
    """A model of one wgmma chain's fp8 accumulation: per k32 step the accumulator and the
    32 exact products are truncated (toward zero) to ``m`` fraction bits below the largest
    exponent among them, then added. With m = 14 it reproduces the H100 errors measured at
    K = 16384 (benchmarks/fp8_gemm.py, 256 x 256): normal inputs 3.15e-3 without promotion,
    1.27e-4 promoting every 128; uniform [0, 2) 2.49e-1 and 4.98e-4."""
    c = np.zeros((a.shape[0], w.shape[0]))
    for k in range(0, a.shape[1], 32):
        allv = np.concatenate([c[..., None], a[:, None, k:k + 32] * w[None, :, k:k + 32]], -1)
        e = np.frexp(np.abs(allv).max(-1))[1][..., None]
        q = np.ldexp(1.0, e - m)
        c = (np.trunc(allv / q) * q).sum(-1)
    return c


def promoted_error(positive, every, n=16, K=16384):
    g = torch.Generator().manual_seed(1)
    r = (lambda *s: torch.rand(*s, generator=g)) if positive else \
        (lambda *s: torch.randn(*s, generator=g))
    a = (r(n, K) * 2).to(torch.float8_e4m3fn).double().numpy()
    w = (r(n, K) * 2).to(torch.float8_e4m3fn).double().numpy()
    ref = a @ w.T
    out = sum(tensor_core_sum(a[:, k:k + every], w[:, k:k + every]) for k in range(0, K, every))
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def test_accumulation_model_and_promotion_interval():
    """The calibrated model matches the measured promoted errors (within 25%), and predicts
    promoting every 256 K worse than the kernel's every 128: about 1.7x the error for normal
    inputs, 3.4x for uniform ones (docs/dev/fp8-gemm.md)."""
    measured = {False: 1.27e-4, True: 4.98e-4}
    for positive in (False, True):
        e128 = promoted_error(positive, 128)
        e256 = promoted_error(positive, 256)
        assert abs(e128 / measured[positive] - 1) < 0.25, (positive, e128)
        assert e128 < e256 < TOL["f32"] / 1.5, (positive, e256)
