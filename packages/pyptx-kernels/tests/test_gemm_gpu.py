"""GPU tests of the tensor-core layer and the Hopper GEMM example.

Inputs are fresh random bf16/f16 matrices; outputs are poisoned (NaN) before each
launch, so an element the kernel never writes fails. Tolerances on
``||out - ref|| / ||ref||`` against float64 on the same (rounded) inputs: 1e-5 for
the f32 one-tile check, 1e-4 for f32 GEMM output (f32 accumulation over K), 6e-3
for bf16/f16 output (the output rounding, about 2**-9 per element).

    pytest -m gpu packages/pyptx-torch/tests/test_gemm_gpu.py
"""

from __future__ import annotations

import importlib

import pytest
from pyptx_kernels._modules import kernel_module
from pyptx_kernels.gemm.reference import reference

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),  # conftest.py: unwritten elements are NaN
]

TOL = {"bf16": 6e-3, "f16": 6e-3, "f32": 1e-4}
DT = {"bf16": torch.bfloat16, "f16": torch.float16}


def _load(name):
    """A library kernel module."""
    return kernel_module(name)


gemm = importlib.import_module("pyptx_kernels.gemm.host")   # matmul with a plan
_common = importlib.import_module("pyptx_kernels._common")


def rel_err(d, ref):
    assert not torch.isnan(d).any(), "unwritten (NaN-poisoned) or NaN elements"
    return ((d.double() - ref).norm() / ref.norm()).item()


CASES = [
    # M, N, K, trans_a, trans_b, config
    (256, 512, 320, False, False, None),
    (1000, 520, 136, False, True, None),
    (129, 65, 1, False, False, None),
    (300, 700, 200, True, False, dict(cluster=1, BN=128)),
    (300, 700, 200, True, True, dict(cluster=2, BN=256)),
    (777, 1500, 1000, False, False, dict(cluster=2, BN=128, stages=3)),
    (4095, 4097, 4100, False, False, None),
    (4095, 4097, 4100, False, True, None),
    (128, 8192, 1024, False, True, None),
    (2048, 2048, 2048, False, False, dict(BM=64, BN=256, cluster=1)),
    # 192 x 192 tiles (three consumer warpgroups): ragged edges, odd slab counts, a cluster
    (777, 1500, 1000, False, False, dict(BM=192, BN=192, cluster=2)),
    (4095, 4097, 4100, True, True, dict(BM=192, BN=192, cluster=1, num_sms=16)),
    # two 64-row accumulators per consumer warpgroup (opt-in wg_rows=128)
    (777, 1500, 1000, False, False, dict(BM=256, BN=128, cluster=2, wg_rows=128)),
    (300, 700, 200, True, True, dict(BM=256, BN=128, cluster=1, wg_rows=128, num_sms=3)),
    # split tail (the partial wave's tiles cut along K; the last chunk adds the others'):
    # one round of pieces, several rounds (2048^3 on 100 SMs: 7 chunks, 196 pieces), a
    # cluster, two bands, and shapes where it does not apply (the plain kernel)
    (4095, 4097, 4100, False, True, dict(split_tail=True)),
    (777, 1500, 1000, False, False, dict(BN=256, cluster=2, num_sms=10, split_tail=True)),
    (4095, 4097, 4100, True, True, dict(BM=256, BN=128, wg_rows=128, cluster=1, num_sms=100,
                                        split_tail=True)),
    (2048, 2048, 2048, False, False, dict(cluster=1, num_sms=100, split_tail=True)),
    (1000, 520, 1000, True, True, dict(BM=128, BN=128, cluster=1, num_sms=3, split_tail=True)),
    (129, 65, 1, False, False, dict(BM=64, BN=64, cluster=1, num_sms=4, split_tail=True)),
    # one epilogue buffer per warpgroup, 9 stages (the skinny-product config)
    (128, 8192, 1000, False, False, dict(BM=64, BN=128, cluster=1, epi_bufs=1)),
    (777, 1500, 1000, True, True, dict(BM=64, BN=128, cluster=1, epi_bufs=1, num_sms=7)),
]


@pytest.mark.parametrize("M,N,K,ta,tb,config", CASES)
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_gemm(M, N, K, ta, tb, config, dtype):
    t = DT[dtype]
    a = torch.randn(K, M, device="cuda", dtype=t).T if ta else torch.randn(M, K, device="cuda", dtype=t)
    b = torch.randn(N, K, device="cuda", dtype=t).T if tb else torch.randn(K, N, device="cuda", dtype=t)
    d = gemm.matmul(a, b, config=config)
    assert d.shape == (M, N) and d.dtype == t
    assert rel_err(d, reference(a, b)) < TOL[dtype]


@pytest.mark.parametrize("activation", [None, "relu", "silu", "gelu_tanh"])
@pytest.mark.parametrize("out", ["f32", "bf16"])
def test_gemm_epilogue(activation, out):
    M, N, K = 333, 520, 272
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).T
    bias = torch.randn(N, device="cuda", dtype=torch.float32)
    d = gemm.matmul(a, b, bias=bias, alpha=0.25, activation=activation, out_dtype=out)
    ref = reference(a, b, bias=bias, alpha=0.25, activation=activation)
    assert d.dtype == (torch.float32 if out == "f32" else torch.bfloat16)
    assert rel_err(d, ref) < (2e-3 if activation else TOL[out])


SK = dict(BM=128, BN=128, cluster=1, num_sms=6, split_tail=True)   # 512 x 640: 20 tiles on 6


def test_gemm_split_tail_epilogue_and_repeats():
    """A split tail with bias, scale and activation; ten launches in a row on one stream reuse
    its flags, which every launch leaves zeroed."""
    M, N, K = 512, 640, 1000
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).T
    bias = torch.randn(N, device="cuda", dtype=torch.float32)
    ref = reference(a, b, bias=bias, alpha=0.5, activation="gelu_tanh")
    for _ in range(10):
        d = gemm.matmul(a, b, bias=bias, alpha=0.5, activation="gelu_tanh", out_dtype="f32",
                        config=SK)
    assert rel_err(d, ref) < 2e-3
    torch.cuda.synchronize()
    assert all(not f.any() for f in _common._ZEROED.values())


def test_gemm_split_tail_refuses_a_grid_larger_than_the_gpu():
    """A split tail's CTAs wait for each other: a grid built for more SMs than the GPU has is
    refused at the call (it could hang), and the tuner skips such a config."""
    from pyptx.errors import ConfigError

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    a = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ConfigError, match=f"this GPU has {sms} SMs"):
        gemm.matmul(a, b, config=dict(BM=128, BN=128, cluster=1, num_sms=2 * sms,
                                      split_tail=True))


def test_gemm_split_tail_on_two_streams():
    """Two streams at once: each has its own flags (a shared set would mix their partials)."""
    streams = [torch.cuda.Stream() for _ in range(2)]
    pairs = [(torch.randn(512, 1000, device="cuda", dtype=torch.bfloat16),
              torch.randn(1000, 640, device="cuda", dtype=torch.bfloat16)) for _ in streams]
    torch.cuda.synchronize()
    outs = []
    for s, (a, b) in zip(streams, pairs):
        with torch.cuda.stream(s):
            outs.append([gemm.matmul(a, b, config=SK) for _ in range(5)][-1])
    torch.cuda.synchronize()
    for d, (a, b) in zip(outs, pairs):
        assert rel_err(d, reference(a, b)) < TOL["bf16"]


def test_gemm_split_tail_torch_compile_graph_and_jax():
    a = torch.randn(512, 1000, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(640, 1000, device="cuda", dtype=torch.bfloat16)
    f = torch.compile(lambda x, y: gemm.matmul(x, y.T, config=SK))
    assert rel_err(f(a, w), reference(a, w.T)) < TOL["bf16"]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gemm.matmul(a, w.T, config=SK)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = gemm.matmul(a, w.T, config=SK)
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        g.replay()
        torch.cuda.synchronize()
        assert rel_err(out, reference(a, w.T)) < TOL["bf16"]
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax has no GPU")
    import numpy as np

    jnp = jax.numpy
    ja = jnp.asarray(a.float().cpu().numpy(), jnp.bfloat16)
    jw = jnp.asarray(w.float().cpu().numpy(), jnp.bfloat16)
    d = jax.jit(lambda x, y: gemm.matmul(x, y, trans_b=True, config=SK))(ja, jw)
    ref = np.asarray(ja, np.float64) @ np.asarray(jw, np.float64).T
    assert np.linalg.norm(np.asarray(d, np.float64) - ref) / np.linalg.norm(ref) < TOL["bf16"]


def test_gemm_on_a_thread_with_no_current_context():
    """A kernel loaded on the main thread, then called on a new thread where no CUDA context
    is current (torch's autograd engine runs backward kernels on such a thread): the shim
    makes the tensors' device's primary context current before it re-addresses the tensor
    maps (``cuTensorMapReplaceAddress`` failed with CUDA_ERROR_INVALID_CONTEXT before)."""
    import threading

    from pyptx import driver

    a = torch.randn(300, 200, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(260, 200, device="cuda", dtype=torch.bfloat16)
    gemm.matmul(a, w.T)                     # compiled, loaded and registered here
    torch.cuda.synchronize()
    seen = {}

    def worker():
        try:
            seen["ctx_before"] = driver.current_context()
            seen["out"] = gemm.matmul(a, w.T)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            seen["error"] = e

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert "error" not in seen, seen.get("error")
    if seen["ctx_before"]:
        pytest.skip("this torch build made a context current on the new thread")
    assert rel_err(seen["out"], reference(a, w.T)) < TOL["bf16"]


def test_gemm_torch_compile_and_graph():
    a = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(640, 384, device="cuda", dtype=torch.bfloat16)
    ref = reference(a, w.T)
    f = torch.compile(lambda x, y: gemm.matmul(x, y.T))
    assert rel_err(f(a, w), ref) < TOL["bf16"]
    out = gemm.matmul(a, w.T)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gemm.matmul(a, w.T)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        out = gemm.matmul(a, w.T)
    a.copy_(torch.randn_like(a))
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(out, reference(a, w.T)) < TOL["bf16"]


def test_gemm_jax_jit():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax has no GPU")
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 200)).astype(np.float32)
    w = rng.standard_normal((520, 200)).astype(np.float32)
    ja, jw = jnp.asarray(a, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)
    d = jax.jit(lambda x, y: gemm.matmul(x, y, trans_b=True))(ja, jw)
    ref = np.asarray(ja, np.float64) @ np.asarray(jw, np.float64).T
    err = np.linalg.norm(np.asarray(d, np.float64) - ref) / np.linalg.norm(ref)
    assert d.shape == (300, 520) and err < TOL["bf16"]
