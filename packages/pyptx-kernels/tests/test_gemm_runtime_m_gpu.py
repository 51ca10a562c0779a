"""GPU tests of the M-generic GEMMs: one cubin serves every M (and K) of an N
(the PTX of every M is one text, so ``pyptx.jit``'s content-hash cache hands the first M's
cubin to the others) and each M is right against float64 on fresh random inputs with
NaN-poisoned outputs; a default ``matmul`` at a new M in a warm process runs no ptxas.

    pytest -m gpu packages/pyptx-kernels/tests/test_gemm_runtime_m_gpu.py -s
"""

from __future__ import annotations

import statistics
import time

import pytest
from pyptx_kernels.gemm import host
from pyptx_kernels.gemm.config import GemmConfig
from pyptx_kernels.gemm.kernel import build_gemm
from pyptx_kernels.gemm.reference import reference

from pyptx import ptxas, registry

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),  # conftest.py: unwritten elements are NaN
]

MS = (1, 127, 1000, 1001, 5000, 8192)


def rel_err(d, ref):
    assert not torch.isnan(d).any(), "unwritten (NaN-poisoned) or NaN elements"
    return ((d.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("config", [GemmConfig(), GemmConfig(BM=128, BN=128, cluster=1),
                                    GemmConfig(BM=192, BN=192, cluster=2),
                                    GemmConfig(BM=64, BN=128, cluster=1, epi_bufs=1)],
                         ids=lambda c: c.name)
def test_one_cubin_serves_every_m(config):
    """Every M (and K: a weight gradient's K is the token count) of one N."""
    N = 2048
    cubins = set()
    for M, K in zip(MS, (1024, 1024, 8, 4104, 1024, 3000)):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        k = build_gemm(M, N, K, config=config)
        d = k(a, b)
        assert rel_err(d, reference(a, b)) < 6e-3, M
        rec = registry.record_for(k.specialize([tuple(a.shape), tuple(b.shape)]))
        cubins.add(rec.cubin_bytes)
    assert len(cubins) == 1


def test_residual_and_gated_at_two_m():
    N, K = 1024, 512
    for M in (333, 4097):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        r = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        d = build_gemm(M, N, K, residual=True)(a, b, r)
        assert rel_err(d, reference(a, b) + r.double()) < 6e-3, M
        z = reference(a, b).reshape(M, N // 128, 2, 64)
        ref = (torch.nn.functional.silu(z[:, :, 0]) * z[:, :, 1]).reshape(M, N // 2)
        d = build_gemm(M, N, K, activation="swiglu")(a, b)
        assert rel_err(d, ref) < 6e-3, M


def test_new_m_runs_no_ptxas(monkeypatch):
    """A default call at M's never seen (same plan bucket) takes the cubin of the first: ptxas
    is not run; prints the host time of each first call."""
    N, K = 2048, 2048
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    host.matmul(torch.randn(8192, K, device="cuda", dtype=torch.bfloat16), b)   # warm
    torch.cuda.synchronize()

    def refuse(*args, **kwargs):
        raise AssertionError("ptxas ran for a new M")

    monkeypatch.setattr(ptxas, "assemble", refuse)
    times = []
    for M in (8000, 8001, 8100, 8150, 8191):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        d = host.matmul(a, b)
        times.append((time.perf_counter() - t0) * 1e3)
        assert rel_err(d, reference(a, b)) < 6e-3, M
    print(f"first default matmul at a new M: median {statistics.median(times):.2f} ms "
          f"({', '.join(f'{t:.2f}' for t in times)})")
    assert statistics.median(times) < 20.0, times


def test_fp8_and_grouped_at_two_m():
    from pyptx_kernels.fp8_gemm.kernel import build_fp8_gemm
    from pyptx_kernels.grouped_gemm.kernel import build_grouped

    N, K = 1024, 512
    w = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
    for M in (200, 3000):
        a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
        sa = torch.rand(M, device="cuda") + 0.5
        sb = torch.rand(N, device="cuda") + 0.5
        d = build_fp8_gemm(M, N, K, scale="row")(a, w, sa, sb)
        ref = (a.double() @ w.double().T) * sa.double()[:, None] * sb.double()[None, :]
        assert rel_err(d, ref) < 6e-3, M
    G = 4
    bg = torch.randn(G, K, N, device="cuda", dtype=torch.bfloat16)
    for sizes in ([0, 37, 500, 90], [1000, 1, 0, 2000]):
        M = sum(sizes)
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
        d = build_grouped(M, N, K, G)(a, bg, offs)
        ref = torch.cat([a[e - n:e].double() @ bg[g].double()
                         for g, (n, e) in enumerate(zip(sizes, offs.tolist()))])
        assert rel_err(d, ref) < 6e-3, M
