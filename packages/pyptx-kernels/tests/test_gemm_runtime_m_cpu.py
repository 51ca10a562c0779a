"""The dense GEMM is M-generic: what depends on M (the rows, the cluster rows of tiles, the
tile count) is a kernel parameter, so every M of an ``(N, K)`` family traces to one PTX (one
cubin in ``pyptx.jit``'s content-hash cache) and only the grid and the parameter values
differ. One PTX is simulated at two M's against float64; the split-tail plan (chosen per
shape) stays M-specific."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptxsim  # noqa: E402
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


# two CTAs (clusters) walk several tiles each at the larger M, one tile each at the smaller
# (the constant loop stride past the tile count); ragged M clips the stores and the residual
@pytest.mark.parametrize("cluster,residual", [(1, True), (2, False)], ids=["c1_residual", "c2"])
def test_one_ptx_simulates_two_m(cluster, residual):
    cfg = GemmConfig(BM=64, BN=64, stages=2, cluster=cluster, num_sms=2 * cluster, group_m=2)
    N, K = 128, 192
    kernels = {M: build_gemm(M, N, K, residual=residual, config=cfg)
               for M in (64 * cluster - 7, 5 * 64 * cluster - 3)}
    assert len({_digest(k) for k in kernels.values()}) == 1
    rng = np.random.default_rng(0)
    for M, k in kernels.items():
        err = _simulate(k, M, N, K, residual, rng)
        assert err < 8e-3, (M, err)
