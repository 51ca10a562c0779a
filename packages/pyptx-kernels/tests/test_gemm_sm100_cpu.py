"""The Blackwell (sm_100a) bf16 GEMM on the CPU (untested on hardware): the simulator
(``ptxsim``, which runs ``tcgen05`` with tensor memory) against float64 on small shapes with
ragged M/N/K edges, every operand layout, bf16 and f32 outputs, the 1-CTA and 2-CTA
(``cta_group::2``) plans; ptxas for sm_100a with no spills; and the plan's refusals."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from pyptx_kernels.gemm_sm100 import kernel as sm100
from pyptx_kernels.gemm_sm100.config import SM100_GEMM_CONFIGS, Sm100GemmConfig

from pyptx.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptxsim  # noqa: E402

TOL = {"bf16": 8e-3, "f32": 1e-5}


def run_sm100(M, N, K, *, a_major="K", b_major="MN", out_dtype="bf16", seed=0, **config):
    """Simulate the GEMM on fresh random inputs (outputs poisoned); the relative error
    against float64 of the same bf16 inputs."""
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    a = ptxsim.device_bits(A if a_major == "K" else A.T, "bf16")
    b = ptxsim.device_bits(B if b_major == "MN" else B.T, "bf16")
    k = sm100.build_gemm_sm100(M, N, K, out_dtype=out_dtype, a_major=a_major,
                               b_major=b_major, config=Sm100GemmConfig(**config))
    (d,) = ptxsim.run(k.specialize(), [a, b])
    a64 = ptxsim.host_f64(a, "bf16") if a_major == "K" else ptxsim.host_f64(a, "bf16").T
    b64 = ptxsim.host_f64(b, "bf16") if b_major == "MN" else ptxsim.host_f64(b, "bf16").T
    ref = a64 @ b64
    got = ptxsim.host_f64(d, out_dtype)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


# ragged in M (not a multiple of 128), N (not of BN) and K (not of BK), with more k-blocks
# than the ring has stages (refills)
@pytest.mark.parametrize("a_major", ["K", "MN"])
@pytest.mark.parametrize("b_major", ["K", "MN"])
def test_one_cta_every_layout_ragged(a_major, b_major):
    err = run_sm100(200, 136, 200, a_major=a_major, b_major=b_major, BN=64, stages=2)
    assert err < TOL["bf16"], err


def test_one_cta_f32_out_wide_tile():
    err = run_sm100(136, 264, 72, out_dtype="f32", BN=256, stages=2)
    assert err < TOL["f32"] * 100, err  # f32 out: only the bf16 inputs' products round


@pytest.mark.parametrize("b_major", ["K", "MN"])
def test_two_cta_pair_ragged(b_major):
    err = run_sm100(264, 136, 200, b_major=b_major, BN=128, stages=2, cta_group=2)
    assert err < TOL["bf16"], err


def _spills(log):
    return [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]


@pytest.mark.parametrize("config", SM100_GEMM_CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
def test_assembles_for_sm_100a_without_spills(assemble, config, out_dtype):
    k = sm100.build_gemm_sm100(4096, 4096, 4096, out_dtype=out_dtype, config=config)
    log = assemble(k.specialize().ptx(), arch="sm_100a")
    assert _spills(log) and not any(_spills(log)), log


def test_kernel_targets_sm_100a():
    k = sm100.build_gemm_sm100(256, 256, 128)
    text = k.specialize().ptx()
    assert ".target sm_100a" in text and "tcgen05.mma.cta_group::1.kind::f16" in text


@pytest.mark.parametrize("kw,fragment", [
    (dict(BN=96), "BN must be 64, 128 or 256, got 96"),
    (dict(BK=128), "BK must be 64"),
    (dict(stages=1), "stages must be an int in 2..8, got 1"),
    (dict(cta_group=3), "cta_group must be 1 or 2, got 3"),
    (dict(BN=256, stages=8), "8 stages of 128x256x64 need 394240 bytes of shared memory, over 232192"),
])
def test_config_refusals(kw, fragment):
    with pytest.raises(ConfigError) as ei:
        Sm100GemmConfig(**kw)
    msg = str(ei.value)
    assert msg.startswith(f"{__file__}:"), msg
    assert fragment in msg, msg


@pytest.mark.parametrize("args,kw,fragment", [
    ((100, 130, 64), {}, "N=130: must be multiples of 8"),
    ((100, 128, 60), {}, "K=60: must be multiples of 8"),
    ((100, 128, 64), dict(out_dtype="f16"), "out_dtype must be 'bf16' or 'f32', got 'f16'"),
    ((100, 128, 64), dict(b_major="T"), "a_major and b_major must be 'K' or 'MN'"),
    ((0, 128, 64), {}, "M must be a positive int, got 0"),
    ((100, 128, 64), dict(config="fast"), "config must be an Sm100GemmConfig"),
])
def test_builder_refusals(args, kw, fragment):
    with pytest.raises(ConfigError) as ei:
        sm100.build_gemm_sm100(*args, **kw)
    msg = str(ei.value)
    assert msg.startswith(f"{__file__}:"), msg
    assert fragment in msg, msg


@pytest.mark.parametrize("trans_a,trans_b,shape", [(False, False, (72, 60, 44)),
                                                   (True, True, (60, 72, 36))])
def test_host_layouts_and_padding(monkeypatch, trans_a, trans_b, shape):
    """``matmul_sm100`` reads row-major operands and transposed views in place, pads rows to
    16 bytes and crops the result: its kernel call simulated on CPU tensors."""
    torch = pytest.importorskip("torch")
    from pyptx_kernels.gemm_sm100 import host

    def simulated(*build):
        k = host.build_gemm_sm100(*build[:3], out_dtype=build[3], a_major=build[4],
                                  b_major=build[5], config=build[6])

        def call(a, b):
            bits = [x.contiguous().view(torch.int16).numpy().view(np.uint16) for x in (a, b)]
            assert all(x.is_contiguous() or x.T.is_contiguous() for x in (a, b))
            (d,) = ptxsim.run(k.specialize(), bits)
            return torch.from_numpy(d.view(np.int16)).view(torch.bfloat16)
        return call

    monkeypatch.setattr(host, "_cached", simulated)
    monkeypatch.setattr(host, "check_devices", lambda *a: None)
    M, N, K = shape
    g = torch.Generator().manual_seed(1)
    a = torch.randn(M, K, generator=g).bfloat16()
    b = torch.randn(K, N, generator=g).bfloat16()
    if trans_a:
        a = a.T.contiguous().T
    if trans_b:
        b = b.T.contiguous().T
    d = host.matmul_sm100(a, b)
    ref = a.double() @ b.double()
    assert d.shape == (M, N)
    assert ((d.double() - ref).norm() / ref.norm()).item() < TOL["bf16"]
