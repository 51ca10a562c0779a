"""The public GEMM and attention pick their kernel family by arch: the device's by default
(``_common.device_arch``), or ``arch=``; sm_80 takes the Ampere kernels (forward only), an arch
without a family is refused at the caller's line. Shapes on meta tensors (the ops' fakes)."""

from __future__ import annotations

import pytest

from pyptx.errors import ConfigError

torch = pytest.importorskip("torch")

import pyptx_kernels as pk  # noqa: E402


def meta(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16, device="meta")


def test_sm80_matmul_linear_and_attention_shapes():
    a, w = meta(3, 5, 64), meta(96, 64)
    assert pk.matmul(a, w.T, arch="sm_80").shape == (3, 5, 96)
    assert pk.linear(a, w, arch="sm_80").shape == (3, 5, 96)
    q, kv = meta(2, 33, 8, 64), meta(2, 33, 2, 64)
    assert pk.attention(q, kv, kv, causal=True, arch="sm_80").shape == q.shape
    qh = q.transpose(1, 2)
    assert pk.attention(qh, kv.transpose(1, 2), kv.transpose(1, 2), layout="bhsd",
                        arch="sm_80").shape == qh.shape


def test_what_sm80_lacks_and_unknown_archs_are_refused():
    a, w = meta(4, 64), meta(64, 64)
    with pytest.raises(ConfigError, match="no GEMM for arch 'sm_120a'") as e:
        pk.matmul(a, w, arch="sm_120a")
    assert str(e.value).startswith(__file__)
    with pytest.raises(ConfigError, match="has no backward"):
        pk.linear(a.requires_grad_(), w, arch="sm_80")
    q = meta(1, 16, 4, 64)
    with pytest.raises(ConfigError, match="without window or soft cap"):
        pk.attention(q, q, q, window=(8, 0), arch="sm_80")
    with pytest.raises(ConfigError, match="no attention kernel for arch 'sm_75'"):
        pk.attention(q, q, q, arch="sm_75")
