"""The dense, FP8 and grouped GEMMs are M-generic: what depends on M (the rows, the cluster
rows of tiles, the tile count; the dense GEMM's k-block count too) is a kernel parameter, so
every M of an ``(N, K)`` family traces to one PTX (one cubin in ``pyptx.jit``'s content-hash cache) and only the grid and
the parameter values differ. One PTX of each is simulated at two M's against float64; the
dense split-tail plan (chosen per shape) stays M-specific."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptxsim  # noqa: E402
from pyptx_kernels import fp8_gemm, grouped_gemm  # noqa: E402
from pyptx_kernels.gemm.config import GEMM_CONFIGS, GemmConfig  # noqa: E402
from pyptx_kernels.gemm.kernel import build_gemm  # noqa: E402
from pyptx_kernels.gemm.scheduler import SplitTailGemm  # noqa: E402

MS = (1000, 1001, 5000, 8192)
PLAIN = [c for c in GEMM_CONFIGS if not c.split_tail]


def _digest(k):
    return hashlib.sha256(k.ptx().encode()).hexdigest()


@pytest.mark.parametrize("config", PLAIN, ids=lambda c: c.name)
def test_every_plan_has_one_ptx_for_every_m(config):
    kernels = [build_gemm(M, 2048, 2048, config=config) for M in MS]
    assert len({_digest(k) for k in kernels}) == 1
    specs = [k.specialize() for k in kernels]
    params = [dict((n, v) for n, _, v in s.scalar_params) for s in specs]
    assert [p["M"] for p in params] == list(MS)
    assert params[0]["tiles"] < params[2]["tiles"] < params[3]["tiles"]
    assert len({s.grid for s in specs}) > 1 or config.num_sms // config.cluster <= params[0]["tiles"]


def test_k_is_generic_too():
    """A weight gradient's K is the token count: the k-block count is a parameter as well."""
    assert len({_digest(build_gemm(M, 2048, K, a_major="MN")) for M, K in
                ((1000, 1000), (1000, 8192), (4096, 1016), (8192, 4104))}) == 1


@pytest.mark.parametrize("kw", [dict(residual=True), dict(activation="swiglu"),
                                dict(bias=True, activation="gelu_tanh", alpha=0.5),
                                dict(a_major="MN", b_major="K", out_dtype="f32"),
                                dict(KB=2056, NB=2056)],
                         ids=["residual", "swiglu", "bias_gelu", "mn_k_f32", "padded_b"])
def test_epilogues_and_layouts_have_one_ptx_for_every_m(kw):
    # A stored (K, M) needs 16-byte rows: matmul pads M to a multiple of 8 there
    ms = [-(-M // 8) * 8 for M in MS] + [1016] if kw.get("a_major") == "MN" else MS
    assert len({_digest(build_gemm(M, 2048, 2048, **kw)) for M in ms}) == 1


def test_split_tail_stays_m_specific():
    """The split tail's plan is host arithmetic per shape: its kernel keeps constants, and
    at a shape it does not apply to the plan builds the plain (generic) kernel."""
    st = next(c for c in GEMM_CONFIGS if c.split_tail)
    k1, k2 = (build_gemm(M, 1024, 16384, config=st) for M in (1024, 1000))
    assert isinstance(k1, SplitTailGemm)
    assert "num_mc" not in k1.ptx()
    plain = build_gemm(8192, 1024, 16384, config=st)
    assert not isinstance(plain, SplitTailGemm)
    assert _digest(plain) == _digest(build_gemm(
        8000, 1024, 16384, config=GemmConfig(BM=128, BN=128, cluster=1)))


def _simulate(k, M, N, K, residual, rng):
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    a, b = ptxsim.device_bits(A, "bf16"), ptxsim.device_bits(B, "bf16")
    args = [a, b]
    ref = ptxsim.host_f64(a, "bf16") @ ptxsim.host_f64(b, "bf16")
    if residual:
        r = ptxsim.device_bits(rng.standard_normal((M, N)), "bf16")
        args.append(r)
        ref = ref + ptxsim.host_f64(r, "bf16")
    (d,) = ptxsim.run(k.specialize(), args)
    got = ptxsim.host_f64(d, "bf16")
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


# four clusters walk several tiles each at the larger M (10 tiles); at the smaller (2 tiles)
# the grid has two clusters of one tile each, and the constant stride (4) ends their walk;
# ragged M clips the stores and the residual's loads
@pytest.mark.parametrize("cluster,residual", [(1, True), (2, False)], ids=["c1_residual", "c2"])
def test_one_ptx_simulates_two_m(cluster, residual):
    cfg = GemmConfig(BM=64, BN=64, stages=2, cluster=cluster, num_sms=4 * cluster, group_m=2)
    N = 128
    kernels = {(M, K): build_gemm(M, N, K, residual=residual, config=cfg)
               for M, K in ((64 * cluster - 7, 328), (5 * 64 * cluster - 3, 136))}
    assert len({_digest(k) for k in kernels.values()}) == 1
    assert [k.specialize().grid[0] // cluster for k in kernels.values()] == [2, 4]
    rng = np.random.default_rng(0)
    for (M, K), k in kernels.items():
        err = _simulate(k, M, N, K, residual, rng)
        assert err < 8e-3, (M, K, err)


@pytest.mark.parametrize("config", fp8_gemm.FP8_CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("scale", ["tensor", "row", "block"])
def test_fp8_gemm_has_one_ptx_for_every_m(config, scale):
    ms = [-(-M // 16) * 16 for M in MS]
    assert len({_digest(fp8_gemm.build_fp8_gemm(M, 2048, 2048, scale=scale, config=config))
                for M in ms}) == 1


@pytest.mark.parametrize("config", grouped_gemm.GROUPED_CONFIGS, ids=lambda c: c.name)
def test_grouped_forward_has_one_ptx_for_every_m(config):
    assert len({_digest(grouped_gemm.build_grouped(M, 2048, 2048, 8, config=config))
                for M in (64, *MS)}) == 1


@pytest.mark.parametrize("config", grouped_gemm.WGRAD_CONFIGS, ids=lambda c: f"{c.BM}x{c.BN}")
def test_grouped_wgrad_has_one_ptx_for_every_m(config):
    assert len({_digest(grouped_gemm.build_grouped_wgrad(M, 2048, 2048, 8, config=config))
                for M in (64, *MS)}) == 1


def test_one_fp8_ptx_simulates_two_m():
    """Row scales: the scale loads are predicated on the runtime M."""
    N, K = 136, 256
    cfg = fp8_gemm.Fp8GemmConfig(BN=128, cluster=1, num_sms=2)
    kernels = {M: fp8_gemm.build_fp8_gemm(M, N, K, scale="row", config=cfg) for M in (72, 328)}
    assert len({_digest(k) for k in kernels.values()}) == 1
    rng = np.random.default_rng(1)
    table = ptxsim._to_float(np.arange(256, dtype=np.uint8), "e4m3")
    finite = np.isfinite(table) & (np.abs(table) < 8)
    codes = np.arange(256, dtype=np.uint8)[finite]
    for M, k in kernels.items():
        a, w = rng.choice(codes, (M, K)), rng.choice(codes, (N, K))
        sa, sb = (rng.uniform(0.5, 2, n).astype(np.float32) for n in (M, N))
        (d,) = ptxsim.run(k.specialize(), [a, w, sa, sb])
        ref = (table[a].astype(np.float64) @ table[w].T) * sa[:, None] * sb[None, :]
        got = ptxsim.host_f64(d, "bf16")
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        assert err < 8e-3, (M, err)


def test_one_grouped_ptx_simulates_two_m():
    """Speculative first tiles guess from the runtime M (``uniform_guess`` on registers):
    right at even groups, wrong at ragged ones."""
    N, K = 256, 256
    cfg = grouped_gemm.GroupedConfig(BM=128, BN=128, num_sms=3, speculate=2)
    cases = ([128] * 4, [0, 37, 130, 90])
    kernels = [grouped_gemm.build_grouped(sum(sz), N, K, 4, config=cfg) for sz in cases]
    assert len({_digest(k) for k in kernels}) == 1
    rng = np.random.default_rng(2)
    for sizes, k in zip(cases, kernels):
        M = sum(sizes)
        a = ptxsim.device_bits(rng.standard_normal((M, K)), "bf16")
        b = ptxsim.device_bits(rng.standard_normal((4, K, N)), "bf16")
        offs = np.cumsum(sizes).astype(np.int32)
        (d,) = ptxsim.run(k.specialize(), [a, b, offs])
        A, B = ptxsim.host_f64(a, "bf16"), ptxsim.host_f64(b, "bf16")
        ref = np.concatenate([A[e - n:e] @ B[g] for g, (n, e) in enumerate(zip(sizes, offs))])
        err = float(np.linalg.norm(ptxsim.host_f64(d, "bf16") - ref) / np.linalg.norm(ref))
        assert err < 8e-3, (M, err)


def test_a_linear_layers_forward_and_backward_have_one_ptx_for_every_m():
    """``linear``'s three GEMMs (x @ w.T, dx = g @ w, dw = g.T @ x, whose K is the token
    count) at three token counts of one plan bucket: the same three PTX texts."""
    torch = pytest.importorskip("torch")
    import pyptx_kernels as pk

    def texts(M):
        x = torch.empty(M, 2048, dtype=torch.bfloat16, device="meta").requires_grad_()
        w = torch.empty(4096, 2048, dtype=torch.bfloat16, device="meta").requires_grad_()
        return pk.ptx(pk.linear, x, w)

    first = texts(5000)
    assert len(first) == 3
    for M in (5001, 6100):
        assert texts(M) == first
