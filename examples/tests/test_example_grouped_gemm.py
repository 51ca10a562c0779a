"""The teaching grouped GEMM (``examples/hopper/grouped_gemm.py``) computes the right thing:
the PTX simulator runs it at ragged shapes against float64, and it refuses bad tiles."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pyptx import ConfigError
from pyptx.testing import load_module

TESTS = Path(__file__).resolve().parent
example = load_module(TESTS.parent / "hopper" / "grouped_gemm.py")


@pytest.fixture(scope="module")
def sim():
    pytest.importorskip("numpy")
    sys.path.insert(0, str(TESTS.parents[1] / "packages" / "pyptx-core" / "tests"))
    import ptxsim

    return ptxsim


def simulate(sim, sizes, N, K, **config):
    """Relative error of the simulated kernel against float64 of the same bf16 inputs."""
    import numpy as np

    rng = np.random.default_rng(len(sizes) * 31 + N + K)
    G, M = len(sizes), sum(sizes)
    a = sim.device_bits(rng.standard_normal((M, K)), "bf16")
    b = sim.device_bits(rng.standard_normal((G, K, N)), "bf16")
    offs = np.cumsum(sizes).astype(np.int32)
    (d,) = sim.run(example.build_grouped_gemm(M, N, K, G, **config).specialize(), [a, b, offs])
    a64, b64 = sim.host_f64(a, "bf16"), sim.host_f64(b, "bf16")
    ref = np.concatenate([a64[e - n:e] @ b64[g] for g, (n, e) in enumerate(zip(sizes, offs))])
    got = sim.host_f64(d, "bf16")
    assert got.shape == ref.shape
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


# empty groups, groups smaller than a tile and crossing tile edges, N and K not tile
# multiples; K spans more k-blocks than the ring has stages, so the ring wraps
@pytest.mark.parametrize("sizes,N,K,config", [
    ([0, 37, 130, 5], 72, 200, dict(BN=64, stages=2)),
    ([70, 0, 1, 64], 136, 104, dict(BN=128)),
])
def test_simulated_grouped_gemm_matches_float64(sim, sizes, N, K, config):
    assert simulate(sim, sizes, N, K, **config) < 8e-3


def test_rows_past_the_last_group_are_not_written(sim):
    """offs[-1] < M: the tail rows keep the simulator's poison; the groups are still right."""
    import numpy as np

    sizes, M, N, K = [30, 0, 70], 160, 64, 72
    rng = np.random.default_rng(1)
    a = sim.device_bits(rng.standard_normal((M, K)), "bf16")
    b = sim.device_bits(rng.standard_normal((3, K, N)), "bf16")
    offs = np.cumsum(sizes).astype(np.int32)
    k = example.build_grouped_gemm(M, N, K, 3, BN=64).specialize()
    (d,) = sim.run(k, [a, b, offs], scratch=(0,))
    assert (d[100:] == 0x7FC1).all()  # the poison bf16 NaN, never overwritten
    a64, b64 = sim.host_f64(a, "bf16"), sim.host_f64(b, "bf16")
    ref = np.concatenate([a64[:30] @ b64[0], a64[30:100] @ b64[2]])
    got = sim.host_f64(d[:100], "bf16")
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 8e-3


@pytest.mark.parametrize("kw", [dict(BN=96), dict(stages=0)])
def test_bad_tiles_are_refused(kw):
    with pytest.raises(ConfigError, match="build_grouped_gemm"):
        example.build_grouped_gemm(256, 128, 128, 2, **kw)


def test_bad_shapes_are_refused():
    with pytest.raises(ConfigError, match="multiples of 8"):
        example.build_grouped_gemm(256, 100, 128, 2)
