"""The tensor-core kernels' numerics on the CPU: ``ptxsim`` runs their PTX (tile copies into
swizzled shared memory, ``wgmma`` through matrix descriptors, mbarrier rings, named barriers,
``stmatrix`` epilogues, tile stores) one CTA at a time against a float64 reference.

The cooperative GEMM's results on the GPU are known good, so it pins the simulator's layout
model (every operand major order); the same model then checks schedules that have not run on
a GPU yet, such as the ping-pong one, whose hand-over a mutant without it shows is needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pyptx import ptx
from pyptx.testing import load_module

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import ptxsim  # noqa: E402

gemm = load_module(HERE.parents[3] / "examples" / "hopper" / "gemm.py", "tc_sim_gemm")


def _dev(x, dtype):
    """Host values as the device's bits: bf16 (round to nearest even) or f16."""
    x = np.asarray(x, np.float32)
    return ptxsim._bf16_rne(x) if dtype == "bf16" else x.astype(np.float16).view(np.uint16)


def _f64(bits, dtype):
    if dtype == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "f16":
        return bits.view(np.float16).astype(np.float64)
    return bits.view(np.float32).astype(np.float64)


def run_gemm(M, N, K, *, dtype="bf16", out_dtype=None, bias=False, alpha=1.0, activation=None,
             seed=0, **config):
    """Simulate ``build_gemm(M, N, K, **config)`` on random inputs; the relative error against
    float64 of the same (rounded) inputs."""
    rng = np.random.default_rng(seed)
    a_major, b_major = config.get("a_major", "K"), config.get("b_major", "MN")
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    a = _dev(A if a_major == "K" else A.T, dtype)
    b = _dev(B if b_major == "MN" else B.T, dtype)
    args = [a, b]
    bias_v = None
    if bias:
        bias_v = rng.standard_normal(N).astype(np.float32)
        args.append(bias_v)
    out_dtype = out_dtype or dtype
    k = gemm.build_gemm(M, N, K, dtype=dtype, out_dtype=out_dtype, bias=bias, alpha=alpha,
                        activation=activation, **config)
    (d,) = ptxsim.run(k.specialize(), args)
    a64 = _f64(a, dtype) if a_major == "K" else _f64(a, dtype).T
    b64 = _f64(b, dtype) if b_major == "MN" else _f64(b, dtype).T
    ref = (a64 @ b64) * alpha
    if bias:
        ref = ref + bias_v
    if activation == "relu":
        ref = np.maximum(ref, 0)
    elif activation == "silu":
        ref = ref / (1 + np.exp(-ref))
    got = _f64(d, out_dtype)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


TOL = {"bf16": 8e-3, "f16": 1e-3, "f32": 1e-5}


# every K extent below spans more k-blocks than the ring has stages (refills), and num_sms
# gives each CTA several tiles (the persistent walk)
@pytest.mark.parametrize("a_major", ["K", "MN"])
@pytest.mark.parametrize("b_major", ["K", "MN"])
def test_cooperative_gemm_every_layout(a_major, b_major):
    err = run_gemm(256, 264, 456, cluster=1, BN=128, num_sms=2, stages=3, a_major=a_major,
                   b_major=b_major)
    assert err < TOL["bf16"], err


@pytest.mark.parametrize("config", [
    dict(BM=128, BN=256), dict(BM=64, BN=256), dict(BM=128, BN=64, stages=2),
])
def test_cooperative_gemm_tiles_ragged(config):
    assert run_gemm(200, 328, 136, cluster=1, num_sms=3, **config) < TOL["bf16"]


def test_cooperative_gemm_f16_epilogue_f32_out():
    err = run_gemm(130, 200, 72, dtype="f16", out_dtype="f32", bias=True, alpha=0.5,
                   activation="silu", cluster=1, BN=128, num_sms=2)
    assert err < 1e-5, err


@pytest.mark.parametrize("config", [
    dict(BM=128, BN=128, num_sms=2),                        # several tiles per warpgroup
    dict(BM=128, BN=128, num_sms=3, stages=2),              # the ring wraps every k-block
    dict(BM=64, BN=256, num_sms=2, a_major="MN", b_major="K"),
    dict(BM=128, BN=128, num_sms=1),                        # one tile: warpgroup 1 idles
])
def test_pingpong_gemm(config):
    M, N, K = (129, 72, 8) if config["num_sms"] == 1 else (384, 520, 200)
    assert run_gemm(M, N, K, cluster=1, schedule="pingpong", **config) < TOL["bf16"]


def test_pingpong_gemm_epilogue():
    err = run_gemm(300, 136, 136, out_dtype="f32", bias=True, alpha=0.25, activation="relu",
                   cluster=1, schedule="pingpong", BM=128, BN=128, num_sms=2)
    assert err < 1e-5, err


def test_pingpong_without_its_hand_over_reads_the_wrong_stages(monkeypatch):
    """A mutant without the named-barrier hand-over lets warpgroup 1 wait on a ring position a
    whole phase ahead: a parity wait cannot tell, so it computes on another tile's operands."""
    real_sync = ptx.bar_sync

    def sync(bar, threads=None, **kw):
        if threads != 256:
            real_sync(bar, threads, **kw)

    monkeypatch.setattr(ptx, "bar_sync", sync)
    monkeypatch.setattr(ptx, "bar_arrive", lambda *a, **k: None)
    err = run_gemm(512, 256, 512, cluster=1, schedule="pingpong", BM=128, BN=128, num_sms=2,
                   stages=3)
    assert err > 0.1, err


def test_simulator_refuses_clusters():
    k = gemm.build_gemm(256, 256, 64, cluster=2)
    with pytest.raises(ptxsim.SimError, match="clusters"):
        ptxsim.run(k.specialize(), [np.zeros((256, 64), np.uint16), np.zeros((64, 256), np.uint16)])
