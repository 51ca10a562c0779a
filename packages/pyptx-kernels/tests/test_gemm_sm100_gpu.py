"""GPU test of the Blackwell GEMM (``matmul_sm100``): runs only on an sm_100 device (none is
lent here, so it is untested on hardware). Fresh random bf16 inputs, outputs poisoned, every
operand layout and plan, against float64.

    pytest -m gpu packages/pyptx-kernels/tests/test_gemm_sm100_gpu.py
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available()
                       or torch.cuda.get_device_capability()[0] != 10,
                       reason="needs a Blackwell (sm_100) GPU"),
    pytest.mark.usefixtures("poison_outputs"),
]


@pytest.mark.parametrize("config", [0, 1, 2])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True)])
@pytest.mark.parametrize("M,N,K", [(4096, 4096, 4096), (1000, 1096, 520)])
def test_matmul_sm100_against_float64(config, trans_a, trans_b, M, N, K):
    from pyptx_kernels.gemm_sm100.config import SM100_GEMM_CONFIGS
    from pyptx_kernels.gemm_sm100.host import matmul_sm100

    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    b = torch.randn(K, N, device="cuda", generator=g).bfloat16()
    if trans_a:
        a = a.T.contiguous().T
    if trans_b:
        b = b.T.contiguous().T
    for out_dtype, tol in (("bf16", 6e-3), ("f32", 1e-4)):
        d = matmul_sm100(a, b, out_dtype=out_dtype, config=SM100_GEMM_CONFIGS[config])
        ref = a.double() @ b.double()
        err = ((d.double() - ref).norm() / ref.norm()).item()
        assert err < tol, (out_dtype, err)
