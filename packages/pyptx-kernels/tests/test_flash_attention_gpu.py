"""GPU tests of the flash-attention forward example (``examples/hopper/flash_attention.py``).

Inputs are fresh random bf16/f16 tensors (``randn``); outputs are poisoned (NaN) before
each launch, so an element the kernel never writes fails. Reference: float64 attention on
the same (rounded) inputs. Tolerances (``check`` in the example): max |o - ref| / max(1,
|ref|) <= 2e-2 for bf16 output (P rounded to bf16 before P V: 2**-9 of max |v| <~ 5, plus
the output rounding, 2**-9 relative), 1e-2 for f16 (2**-11 each); lse relative error
<= 1e-3 (f32 softmax state, ex2/lg2.approx ~2**-22).
Both the default schedule and the simple one (``schedule="simple"``) are checked, so a
failure of the overlapped schedules alone is visible; the tuning options
(``pin_overlap``, ``rescale_threshold``) are checked with the same tolerances.

    pytest -m gpu packages/pyptx-torch/tests/test_flash_attention_gpu.py
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

from pyptx_kernels.flash_attention import fwd_config, fwd_host, fwd_kernel, fwd_reference
from pyptx_kernels.flash_attention.fwd_config import ForwardConfig

DT = {"bf16": torch.bfloat16, "f16": torch.float16}


def _inputs(B, S, Sk, Hq, Hkv, D, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = DT[dtype]
    q = torch.randn(B, S, Hq, D, device="cuda", dtype=t, generator=g)
    k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=t, generator=g)
    v = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=t, generator=g)
    return q, k, v


def _assert_close(o, lse, ref, dtype):
    ok, eo, el = fwd_reference.check(o, lse, *ref, dtype)
    assert ok, f"max |o err| {eo:.3e}, lse rel err {el:.3e}"


CASES = [
    # B, S, Sk, Hq, Hkv, D
    (1, 1, 1, 1, 1, 64),
    (2, 77, 77, 4, 2, 64),
    (2, 128, 128, 2, 2, 128),
    (1, 200, 200, 4, 1, 128),
    (2, 333, 333, 4, 4, 64),
    (1, 256, 333, 2, 2, 128),
    (1, 333, 100, 2, 1, 128),
    (1, 1024, 1024, 2, 2, 128),
]


@pytest.mark.parametrize("schedule", [None, "simple"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,S,Sk,Hq,Hkv,D", CASES)
def test_forward(B, S, Sk, Hq, Hkv, D, causal, dtype, schedule):
    q, k, v = _inputs(B, S, Sk, Hq, Hkv, D, dtype)
    plan = None if schedule is None else ForwardConfig(schedule=schedule)   # None: tuned
    o, lse = fwd_host.attention_forward(q, k, v, causal=causal, config=plan)
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == (B, Hq, S)
    _assert_close(o, lse, fwd_reference.reference(q, k, v, causal), dtype)


@pytest.mark.parametrize("schedule", fwd_config.SCHEDULES)
@pytest.mark.parametrize("D", [64, 128, 256])
def test_every_schedule_and_head_dim(schedule, D):
    q, k, v = _inputs(2, 300, 300, 4, 2, D, "bf16", seed=D)
    for causal in (False, True):
        o, lse = fwd_host.attention_forward(q, k, v, causal=causal, config=ForwardConfig(schedule=schedule))
        _assert_close(o, lse, fwd_reference.reference(q, k, v, causal), "bf16")


@pytest.mark.parametrize("schedule", fwd_config.SCHEDULES)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_persistent(schedule, D, causal):
    """The persistent kernel over 8 CTAs: each walks many tiles (Q reloads, O staging reuse,
    the ping-pong turns carried across tiles), ragged S, grouped-query heads."""
    q, k, v = _inputs(3, 333, 333, 4, 2, D, "bf16", seed=D + causal)
    kern = fwd_kernel.build_attention(3, 333, 4, 2, D, causal=causal, config=ForwardConfig(schedule=schedule, persistent=True, num_sms=8))
    o, lse = kern(q, k, v)
    _assert_close(o, lse, fwd_reference.reference(q, k, v, causal), "bf16")
    o, lse = fwd_host.attention_forward(q, k, v, causal=causal, config=ForwardConfig(schedule=schedule, persistent=True))
    _assert_close(o, lse, fwd_reference.reference(q, k, v, causal), "bf16")


@pytest.mark.parametrize("D,BN,stages", [(64, 64, 2), (64, 64, 4), (64, 128, 3), (64, 192, 2),
                                         (128, 176, 2), (128, 128, 3), (128, 64, 4)])
def test_block_shapes(D, BN, stages):
    q, k, v = _inputs(1, 500, 500, 2, 1, D, "f16", seed=BN)
    o, lse = fwd_host.attention_forward(q, k, v, causal=True, config=ForwardConfig(BN=BN, stages=stages))
    _assert_close(o, lse, fwd_reference.reference(q, k, v, True), "f16")


@pytest.mark.parametrize("schedule", fwd_config.SCHEDULES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,S,Sk,Hq,Hkv,D,kw", [
    (2, 333, 333, 4, 2, 64, {}), (1, 1, 1, 1, 1, 64, {}), (1, 500, 700, 2, 1, 64, dict(BN=64)),
    (3, 400, 400, 4, 2, 64, dict(persistent=True)), (1, 450, 450, 2, 2, 128, dict(BN=64)),
    (2, 333, 333, 4, 1, 128, {}), (1, 700, 500, 2, 2, 128, dict(stages=3)),
])
def test_three_consumers(B, S, Sk, Hq, Hkv, D, kw, causal, schedule):
    """``consumers=3``: 192-row query blocks (a whole one and a ragged one at S=333, several
    masked key blocks per block when causal), at 160 registers per consumer thread."""
    q, k, v = _inputs(B, S, Sk, Hq, Hkv, D, "bf16", seed=S + causal)
    o, lse = fwd_host.attention_forward(q, k, v, causal=causal, config=ForwardConfig(schedule=schedule, consumers=3, **kw))
    _assert_close(o, lse, fwd_reference.reference(q, k, v, causal), "bf16")


@pytest.mark.parametrize("schedule", fwd_config.SCHEDULES)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("persistent", [False, True])
def test_two_consumers(schedule, D, persistent):
    """``consumers=2`` (128-row blocks; the default at head dim 256 and for a BN three cannot
    hold) at the head dims whose default is three."""
    q, k, v = _inputs(2, 333, 333, 4, 2, D, "bf16", seed=D + persistent)
    for causal in (False, True):
        o, lse = fwd_host.attention_forward(q, k, v, causal=causal, config=ForwardConfig(schedule=schedule, consumers=2, persistent=persistent))
        _assert_close(o, lse, fwd_reference.reference(q, k, v, causal), "bf16")


def test_three_consumers_varlen():
    lens = [77, 1, 200, 400]
    cu = torch.tensor(list(accumulate(lens, initial=0)), device="cuda", dtype=torch.int32)
    g = torch.Generator(device="cuda").manual_seed(31)
    q, k, v = (torch.randn(sum(lens), 4, 64, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    for causal in (False, True):
        o, lse = fwd_host.attention_varlen_forward(q, k, v, cu, cu, max(lens), max(lens), causal=causal, config=ForwardConfig(consumers=3))
        _assert_close(o, lse, fwd_reference.reference_varlen(q, k, v, cu, cu, causal), "bf16")


TUNING = [dict(pin_overlap=True), dict(rescale_threshold=None), dict(rescale_threshold=0),
          dict(rescale_threshold=16), dict(pin_overlap=True, rescale_threshold=None)]


@pytest.mark.parametrize("opts", TUNING, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("schedule", fwd_config.SCHEDULES)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_tuning_options(opts, schedule, D, causal):
    """The tuning options (``pin_overlap``, ``rescale_threshold``; the default is the lazy
    rescale at 8) give the same tolerances as the default kernel; q and k scaled by 2 so
    row maxima keep moving across key blocks (the lazy rescale's skipped and taken paths
    both run). ``rescale_threshold=0`` only skips multiplications by exactly 1, so it must
    equal the exact schedule (``None``) bit for bit."""
    q, k, v = _inputs(2, 700, 700, 4, 2, D, "bf16", seed=D + causal)
    q, k = 2 * q, 2 * k                          # exact in bf16; scores of std ~4
    o, lse = fwd_host.attention_forward(q, k, v, causal=causal, config=ForwardConfig(schedule=schedule, **opts))
    _assert_close(o, lse, fwd_reference.reference(q, k, v, causal), "bf16")
    if opts == dict(rescale_threshold=0):
        o0, lse0 = fwd_host.attention_forward(q, k, v, causal=causal, config=ForwardConfig(schedule=schedule, rescale_threshold=None))
        assert torch.equal(o, o0) and torch.equal(lse, lse0)


@pytest.mark.parametrize("kw", [dict(BN=176), dict(stages=3), dict(persistent=True)])
def test_tuning_options_with_block_shapes(kw):
    q, k, v = _inputs(2, 1000, 1000, 4, 2, 128, "bf16", seed=11)
    for causal in (False, True):
        o, lse = fwd_host.attention_forward(q, k, v, causal=causal, config=ForwardConfig(pin_overlap=True, rescale_threshold=8, **kw))
        _assert_close(o, lse, fwd_reference.reference(q, k, v, causal), "bf16")


def test_tuning_options_varlen():
    lens_q, lens_k = [77, 1, 200, 128, 300], [77, 5, 333, 128, 300]
    cu_q = torch.tensor(list(accumulate(lens_q, initial=0)), device="cuda", dtype=torch.int32)
    cu_k = torch.tensor(list(accumulate(lens_k, initial=0)), device="cuda", dtype=torch.int32)
    g = torch.Generator(device="cuda").manual_seed(12)
    q = torch.randn(sum(lens_q), 4, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(sum(lens_k), 2, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(sum(lens_k), 2, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    o, lse = fwd_host.attention_varlen_forward(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), config=ForwardConfig(pin_overlap=True, rescale_threshold=8))
    _assert_close(o, lse, fwd_reference.reference_varlen(q, k, v, cu_q, cu_k, False), "bf16")


def test_scale():
    q, k, v = _inputs(1, 190, 190, 2, 2, 128, "bf16", seed=3)
    o, lse = fwd_host.attention_forward(q, k, v, scale=0.3)
    _assert_close(o, lse, fwd_reference.reference(q, k, v, False, scale=0.3), "bf16")


def test_as_accurate_as_sdpa():
    """Our error against float64 is at most 1.5x that of SDPA's default backend (+1e-3)."""
    q, k, v = _inputs(2, 512, 512, 4, 4, 128, "bf16", seed=5)
    o = fwd_host.attention(q, k, v, causal=True)
    sd = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    ref, _ = fwd_reference.reference(q, k, v, True)
    ours = (o.double() - ref).abs().max().item()
    theirs = (sd.double() - ref).abs().max().item()
    assert ours <= 1.5 * theirs + 1e-3, (ours, theirs)


@pytest.mark.parametrize("schedule", [None, "simple"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_varlen(D, causal, schedule):
    lens_q, lens_k = [77, 1, 200, 128, 300], [77, 5, 333, 128, 300]
    if causal:
        lens_k = lens_q
    cu_q = torch.tensor(list(accumulate(lens_q, initial=0)), device="cuda", dtype=torch.int32)
    cu_k = torch.tensor(list(accumulate(lens_k, initial=0)), device="cuda", dtype=torch.int32)
    g = torch.Generator(device="cuda").manual_seed(D)
    q = torch.randn(sum(lens_q), 4, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(sum(lens_k), 2, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(sum(lens_k), 2, D, device="cuda", dtype=torch.bfloat16, generator=g)
    o, lse = fwd_host.attention_varlen_forward(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, config=ForwardConfig(schedule=schedule))
    assert o.shape == q.shape and lse.shape == (4, sum(lens_q))
    _assert_close(o, lse, fwd_reference.reference_varlen(q, k, v, cu_q, cu_k, causal), "bf16")


def test_varlen_empty_key_sequence():
    """A sequence with no keys gives o = 0 and lse = -inf (the contract)."""
    cu_q = torch.tensor([0, 50, 80], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, 0, 40], device="cuda", dtype=torch.int32)
    q = torch.randn(80, 2, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(40, 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(40, 2, 64, device="cuda", dtype=torch.bfloat16)
    o, lse = fwd_host.attention_varlen_forward(q, k, v, cu_q, cu_k, 50, 40)
    assert (o[:50] == 0).all() and torch.isneginf(lse[:, :50]).all()
    _assert_close(o, lse, fwd_reference.reference_varlen(q, k, v, cu_q, cu_k), "bf16")


@pytest.mark.parametrize("entry", ["attention_forward", "attention"])
def test_torch_compile_and_cuda_graph(entry):
    """``attention_forward`` (the bare kernel) and ``attention`` (through
    ``differentiable_kernel`` when the backward is there) under torch.compile and in a
    CUDA graph replayed on new inputs."""
    fn = getattr(fwd_host, entry)

    def out(*a):
        r = fn(*a, causal=True)
        return r[0] if entry == "attention_forward" else r
    q, k, v = _inputs(2, 256, 256, 4, 2, 128, "bf16", seed=7)
    f = torch.compile(out)
    o = f(q, k, v)
    ref_o, ref_l = fwd_reference.reference(q, k, v, True)
    _assert_close(o, ref_l.float(), (ref_o, ref_l), "bf16")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out(q, k, v)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = out(q, k, v)
    q.copy_(torch.randn_like(q))
    g.replay()
    torch.cuda.synchronize()
    ref_o, ref_l = fwd_reference.reference(q, k, v, True)
    _assert_close(o, ref_l.float(), (ref_o, ref_l), "bf16")


def test_autograd_when_backward_is_available():
    """``attention`` is differentiable once the backward kernels and ``save_outputs`` exist;
    gradients vs float64 autograd: max |g - ref| / max(1, |ref|) <= 5e-2 (bf16 dq/dk/dv,
    each a sum over up to 200 rounded products)."""
    q, k, v = _inputs(1, 200, 200, 4, 2, 64, "bf16", seed=9)
    plan = ForwardConfig(BN=fwd_config.default_bn(64))
    fn = fwd_host._differentiable(1, 200, 4, 2, 64, 200, "bf16", True, 0.125, plan)
    if not hasattr(fn, "backward_kernel"):
        pytest.skip("backward kernels / differentiable_kernel(save_outputs=) not available yet")
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    o = fwd_host.attention(qs, ks, vs, causal=True)
    do = torch.randn_like(o)
    o.backward(do)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    ref, _ = fwd_reference.reference(q64, k64, v64, True)
    ref.backward(do.double())
    for got, want in ((qs.grad, q64.grad), (ks.grad, k64.grad), (vs.grad, v64.grad)):
        assert ((got.double() - want).abs() / want.abs().clamp(min=1)).max().item() < 5e-2
