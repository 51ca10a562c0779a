"""GPU tests of the attention forward's runtime sizes, in-place ``(B, H, S, D)`` inputs, sliding
window and soft cap (dense and packed).

Inputs are fresh random bf16/f16 tensors; outputs are poisoned (NaN) before each launch, so
an element the kernel never writes fails. Reference: float64 attention on the same (rounded)
inputs (``fwd_reference.reference``, window and soft cap included), tolerances of
``fwd_reference.check`` (max |o - ref| / max(1, |ref|) <= 2e-2 bf16 / 1e-2 f16, lse
relative <= 1e-3, -inf exactly where a row has no key).

    pytest -m gpu packages/pyptx-kernels/tests/test_attention_features_gpu.py
"""

from __future__ import annotations

from itertools import accumulate

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),  # conftest.py: unwritten elements are NaN
]

from pyptx_kernels.flash_attention import api, fwd_host, fwd_reference  # noqa: E402
from pyptx_kernels.flash_attention.fwd_config import ForwardConfig  # noqa: E402

DT = {"bf16": torch.bfloat16, "f16": torch.float16}


def _rand(*shape, dtype="bf16", seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=DT[dtype], generator=g)


def _assert_close(o, lse, ref, dtype):
    ok, eo, el = fwd_reference.check(o, lse, *ref, dtype)
    assert ok, f"max |o err| {eo:.3e}, lse rel err {el:.3e}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_one_kernel_serves_every_length(D, causal):
    """S = 1000, 1001, 1500 (and Sk != S) of one plan: one PTX, every output right; and the
    default call (its plan chosen without timing) right at each."""
    texts = set()
    for i, (B, S, Sk) in enumerate(((2, 1000, 1000), (1, 1001, 1001), (3, 1500, 1700))):
        q = _rand(B, S, 8, D, seed=3 * i)
        k, v = _rand(B, Sk, 2, D, seed=3 * i + 1), _rand(B, Sk, 2, D, seed=3 * i + 2)
        ref = fwd_reference.reference(q, k, v, causal)
        for config in (ForwardConfig(), None):
            o, lse = fwd_host.attention_forward(q, k, v, causal=causal, config=config)
            _assert_close(o, lse, ref, "bf16")
        texts.add(fwd_host.forward_kernel(B, S, 8, 2, D, Sk, "bf16", causal, D ** -0.5,
                                          ForwardConfig()).ptx())
    assert len(texts) == 1


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("D", [64, 128])
def test_bhsd_inputs_are_read_in_place(D, dtype):
    """Hugging Face's q (a ``(B, S, H, D)`` projection viewed ``(B, H, S, D)``) and
    contiguous ``(B, H, S, D)`` k, v: the output matches float64 in SDPA's layout."""
    B, S, Hq, Hkv = 2, 777, 8, 2
    q = _rand(B, S, Hq * D, dtype=dtype, seed=1).view(B, S, Hq, D).transpose(1, 2)
    k, v = _rand(B, Hkv, S, D, dtype=dtype, seed=2), _rand(B, Hkv, S, D, dtype=dtype, seed=3)
    with torch.no_grad():
        out = api.attention(q, k, v, causal=True, layout="bhsd")
    o, lse = fwd_host.attention_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                        causal=True)
    ref = fwd_reference.reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True)
    _assert_close(o, lse, ref, dtype)
    assert out.shape == (B, Hq, S, D)
    torch.testing.assert_close(out.transpose(1, 2), o, rtol=0, atol=0)


@pytest.mark.parametrize("causal,window,softcap", [
    (True, (256, -1), 0.0), (False, (300, 200), 0.0), (False, (-1, 100), 0.0),
    (False, (-1, -1), 5.0), (True, (512, -1), 30.0), (True, (0, -1), 0.0)])
@pytest.mark.parametrize("D", [64, 128])
def test_window_and_softcap_match_float64(D, causal, window, softcap):
    B, S, Sk, Hq, Hkv = 2, 1500, 1300, 4, 2
    q = _rand(B, S, Hq, D, seed=11) * 2        # larger scores: the cap bites
    k, v = _rand(B, Sk, Hkv, D, seed=12), _rand(B, Sk, Hkv, D, seed=13)
    o, lse = fwd_host.attention_forward(q, k, v, causal=causal, window=window, softcap=softcap)
    _assert_close(o, lse, fwd_reference.reference(q, k, v, causal, None, window, softcap),
                  "bf16")
    with torch.no_grad():
        out = api.attention(q, k, v, causal=causal, window=window, softcap=softcap)
    torch.testing.assert_close(out, o, rtol=0, atol=0)


@pytest.mark.parametrize("causal,window,softcap", [
    (True, (100, -1), 0.0), (False, (64, 64), 20.0), (False, (-1, -1), 4.0)])
def test_varlen_window_and_softcap_match_float64(causal, window, softcap):
    lens_q, lens_k = [0, 700, 1, 333, 1024], [5, 700, 40, 333, 1024]
    cu_q = torch.tensor([0, *accumulate(lens_q)], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *accumulate(lens_k)], dtype=torch.int32, device="cuda")
    q = _rand(int(cu_q[-1]), 8, 128, seed=21) * 2
    k, v = _rand(int(cu_k[-1]), 2, 128, seed=22), _rand(int(cu_k[-1]), 2, 128, seed=23)
    o, lse = fwd_host.attention_varlen_forward(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                               causal=causal, window=window, softcap=softcap)
    ref = fwd_reference.reference_varlen(q, k, v, cu_q, cu_k, causal, None, window, softcap)
    _assert_close(o, lse, ref, "bf16")


def test_a_window_costs_about_its_share_of_full_attention():
    """A causal 4k window over 32k tokens (about an eighth of the score matrix): at most 0.2x
    the time of full attention (forward, CUDA events, median of 10)."""
    q = _rand(1, 32768, 16, 128, seed=31)
    k, v = _rand(1, 32768, 4, 128, seed=32), _rand(1, 32768, 4, 128, seed=33)

    def median_ms(**kw):
        fwd_host.attention_forward(q, k, v, **kw)
        times = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fwd_host.attention_forward(q, k, v, **kw)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return sorted(times)[5]

    full, windowed = median_ms(), median_ms(causal=True, window=(4096, -1))
    assert windowed <= 0.2 * full, (windowed, full)
