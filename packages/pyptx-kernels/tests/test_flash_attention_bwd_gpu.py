"""GPU tests of the flash-attention backward (examples/hopper/flash_attention_bwd.py).

Inputs are fresh random q, k, v, do (never zeros); ``o`` and ``lse`` come from a float64
torch reference (``o`` rounded to the input dtype, ``lse`` float32), so the backward
kernels are tested on their own. Outputs are poisoned (NaN) before each launch, so an
unwritten element fails. Reference: float64 autograd of plain attention on the same
(rounded) inputs. Tolerance on ``||g - ref|| / ||ref||`` per gradient: 1e-2 for bf16 and
4e-3 for f16 (P and dS are rounded to the input type before their products; the CPU model
of the same tiling measures ~3e-3 and ~5e-4), plus no element off by more than
``0.1 * max|ref|`` (catches a wrong block that a norm would average away).

    pytest -m gpu packages/pyptx-torch/tests/test_flash_attention_bwd_gpu.py
"""

from __future__ import annotations

import importlib
import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),  # conftest.py: unwritten elements are NaN
]

fab = importlib.import_module("pyptx_kernels.flash_attention.backward")
DT = {"bf16": torch.bfloat16, "f16": torch.float16}
TOL = {"bf16": 1e-2, "f16": 4e-3}


def _inputs(B, S, Hq, Hkv, D, dtn, Sk=None, seed=0):
    torch.manual_seed(seed)
    dt = DT[dtn]
    Sk = S if Sk is None else Sk
    q = torch.randn(B, S, Hq, D, device="cuda", dtype=dt)
    k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt)
    v = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt)
    do = torch.randn(B, S, Hq, D, device="cuda", dtype=dt)
    return q, k, v, do


def _check(got, refs, dtn):
    for name, g, r in zip(("dq", "dk", "dv"), got, refs):
        assert not torch.isnan(g).any(), f"{name}: unwritten (NaN-poisoned) or NaN elements"
        err = ((g.double() - r).norm() / r.norm()).item()
        worst = ((g.double() - r).abs().max() / r.abs().max()).item()
        assert err < TOL[dtn] and worst < 0.1, (name, err, worst)


@pytest.mark.parametrize("B,S,Hq,Hkv,D,dtn,causal", [
    (1, 128, 1, 1, 64, "bf16", False),
    (2, 200, 4, 2, 64, "bf16", False),
    (2, 200, 4, 2, 64, "bf16", True),
    (1, 333, 4, 1, 64, "f16", True),
    (2, 256, 2, 2, 128, "bf16", False),
    (1, 333, 4, 1, 128, "f16", True),
    (1, 77, 3, 1, 128, "bf16", True),
    (2, 513, 8, 2, 128, "bf16", True),
])
def test_backward_matches_float64_autograd(B, S, Hq, Hkv, D, dtn, causal):
    q, k, v, do = _inputs(B, S, Hq, Hkv, D, dtn)
    o, lse, *refs = fab.reference(q, k, v, do, causal)
    got = fab.attention_backward(q, k, v, o.to(q.dtype), lse.float(), do, causal=causal)
    _check(got, refs, dtn)


@pytest.mark.parametrize("causal", [False, True])
def test_safe_schedule(causal):
    """The bisecting schedule (every block masked, no overlap, stats from global memory)."""
    q, k, v, do = _inputs(2, 200, 4, 2, 128, "bf16")
    o, lse, *refs = fab.reference(q, k, v, do, causal)
    got = fab.attention_backward(q, k, v, o.to(q.dtype), lse.float(), do, causal=causal, safe=True)
    _check(got, refs, "bf16")


@pytest.mark.parametrize("D,causal,Hkv", [(64, True, 2), (128, False, 1), (128, True, 4)])
def test_atomic_dq_mode(D, causal, Hkv):
    """The optional mode: dQ added by the dK/dV kernel with f32 atomics (same tolerances)."""
    q, k, v, do = _inputs(2, 200, 4, Hkv, D, "bf16")
    o, lse, *refs = fab.reference(q, k, v, do, causal)
    got = fab.attention_backward(q, k, v, o.to(q.dtype), lse.float(), do, causal=causal,
                                 atomic_dq=True)
    _check(got, refs, "bf16")


@pytest.mark.parametrize("opts", [{"dq_bulk": True}, {"dq_bulk": True, "dq_ordered": True}])
@pytest.mark.parametrize("B,S,Hq,Hkv,D,dtn,causal", [
    (2, 513, 8, 2, 128, "bf16", True),
    (1, 1000, 4, 4, 128, "f16", False),    # 16 q blocks = 2 x 8 kv blocks: rotated order
    (2, 200, 4, 2, 64, "bf16", True),
    (1, 333, 2, 1, 64, "bf16", False),     # ascending order (6 q blocks, 3 kv blocks: no)
])
def test_bulk_dq_modes(B, S, Hq, Hkv, D, dtn, causal, opts):
    """dQ added by TMA tile reductions from the dK/dV kernel, unordered and ordered (a
    fixed order of adds per q block): float64 autograd, same tolerances; ordered runs are
    bitwise equal."""
    q, k, v, do = _inputs(B, S, Hq, Hkv, D, dtn)
    o, lse, *refs = fab.reference(q, k, v, do, causal)
    args = (q, k, v, o.to(q.dtype), lse.float(), do)
    got = fab.attention_backward(*args, causal=causal, atomic_dq=True, **opts)
    _check(got, refs, dtn)
    if opts.get("dq_ordered"):
        again = fab.attention_backward(*args, causal=causal, atomic_dq=True, **opts)
        assert all(torch.equal(x, y) for x, y in zip(got, again))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [128, 64])
def test_attention_default_backward_is_deterministic(causal, D):
    """``attention()``'s default backward (D=128: the ordered bulk-dQ dK/dV kernel; D=64: the
    fused kernel, ordered): float64 autograd, and two runs give bitwise-equal gradients."""
    from pyptx_kernels.flash_attention import fwd_host as fa
    q0, k0, v0, do = _inputs(2, 700, 4, 2, D, "bf16")
    _, _, *refs = fab.reference(q0, k0, v0, do, causal)
    grads = []
    for _ in range(2):
        q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
        fa.attention(q, k, v, causal=causal).backward(do)
        grads.append((q.grad, k.grad, v.grad))
    _check(grads[0], refs, "bf16")
    assert all(torch.equal(x, y) for x, y in zip(*grads))


def test_attention_default_backward_with_lag_and_lead():
    """At 48 kv heads of 8 CTAs (S=1024) the default D=128 full backward's early converters
    (``convert_lag``: 33 heads back) and stats writers (``stats_lead``: 18 heads ahead) both
    run: float64 autograd, bitwise-equal gradients over two runs."""
    from pyptx_kernels.flash_attention import fwd_host as fa
    B, S, H = 3, 1024, 16
    built = fab.build_attention_backward(B, S, H, H, 128, atomic_dq=True, dq_bulk=True,
                                         dq_ordered=True, dq_convert=True, convert_lag="auto",
                                         stats_lead="auto")
    assert built.kernels[1].name.endswith("_lag33_lead18")
    q0, k0, v0, do = _inputs(B, S, H, H, 128, "bf16", seed=5)
    _, _, *refs = fab.reference(q0, k0, v0, do, False)
    grads = []
    for _ in range(2):
        q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
        fa.attention(q, k, v).backward(do)
        grads.append((q.grad, k.grad, v.grad))
    _check(grads[0], refs, "bf16")
    assert all(torch.equal(x, y) for x, y in zip(*grads))


@pytest.mark.parametrize("D", [128, 64])
def test_attention_deterministic_false_gradients(D):
    """``attention(..., deterministic=False)`` through torch autograd: the bulk-dQ backward
    (D=64: the fused kernel, any order)."""
    from pyptx_kernels.flash_attention import fwd_host as fa
    q, k, v, do = _inputs(2, 300, 4, 2, D, "bf16")
    _, _, *refs = fab.reference(q, k, v, do, True)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    fa.attention(q, k, v, causal=True, deterministic=False).backward(do)
    _check((q.grad, k.grad, v.grad), refs, "bf16")


@pytest.mark.parametrize("opts", [{"dkdv_bq": 32}, {"dkdv_overlap": True},
                                  {"dkdv_overlap": False}, {"dkdv_bq": 32, "dkdv_overlap": False}])
@pytest.mark.parametrize("B,S,Hq,Hkv,D,dtn,causal", [
    (2, 513, 8, 2, 128, "bf16", True),     # many refills of the 4-stage ring
    (1, 333, 4, 1, 128, "f16", False),
    (2, 200, 4, 2, 64, "bf16", True),
    (1, 190, 2, 1, 64, "bf16", False),
])
def test_dkdv_speed_options(B, S, Hq, Hkv, D, dtn, causal, opts):
    """The dK/dV kernel's options (32-row q blocks; cross-block overlap on or off) against
    float64 autograd, same tolerances (rel. Frobenius < 1e-2 bf16 / 4e-3 f16, max error <
    0.1 of the largest gradient), outputs poisoned."""
    q, k, v, do = _inputs(B, S, Hq, Hkv, D, dtn)
    o, lse, *refs = fab.reference(q, k, v, do, causal)
    got = fab.attention_backward(q, k, v, o.to(q.dtype), lse.float(), do, causal=causal, **opts)
    _check(got, refs, dtn)


def test_cross_lengths_and_custom_scale():
    """Sk != S (top-left causal) and a non-default softmax scale."""
    q, k, v, do = _inputs(1, 190, 2, 1, 64, "bf16", Sk=300)
    for causal in (False, True):
        o, lse, *refs = fab.reference(q, k, v, do, causal, scale=0.2)
        got = fab.attention_backward(q, k, v, o.to(q.dtype), lse.float(), do, causal=causal,
                                     scale=0.2)
        _check(got, refs, "bf16")


def test_deterministic():
    """Two runs give bitwise-equal gradients (no atomics)."""
    q, k, v, do = _inputs(2, 300, 4, 2, 128, "bf16")
    o, lse, *_ = fab.reference(q, k, v, do, True)
    a = fab.attention_backward(q, k, v, o.to(q.dtype), lse.float(), do, causal=True)
    b = fab.attention_backward(q, k, v, o.to(q.dtype), lse.float(), do, causal=True)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_differentiable_kernel_with_saved_outputs():
    """``save_outputs``: a torch-side forward kernel-like returning (o, lse) paired with the
    backward pair; loss.backward() gives the reference gradients."""
    import pyptx

    B, S, Hq, Hkv, D = 1, 150, 2, 1, 64
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, D, causal=True)

    class Fwd:
        in_specs = bwd.in_specs[:3]
        out_specs = (bwd.in_specs[3], bwd.in_specs[4])
        arg_names = ("q", "k", "v", "o", "lse")
        name = "attn_fwd_reference"

        def __call__(self, q, k, v):
            o, lse, *_ = fab.reference(q, k, v, torch.zeros_like(q), True)
            return o.to(q.dtype), lse.float()

    op = pyptx.differentiable_kernel(Fwd(), bwd, save_for_backward=[0, 1, 2],
                                     save_outputs=[0, 1], num_grad_inputs=3)
    q, k, v, do = _inputs(B, S, Hq, Hkv, D, "bf16")
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    o, _ = op(q, k, v)
    o.backward(do)
    _, _, *refs = fab.reference(q, k, v, do, True)
    _check((q.grad, k.grad, v.grad), refs, "bf16")


def test_scale_default_is_inverse_sqrt_d():
    q, k, v, do = _inputs(1, 64, 1, 1, 128, "f16")
    o, lse, *refs = fab.reference(q, k, v, do, False, scale=1 / math.sqrt(128))
    _check(fab.attention_backward(q, k, v, o.to(q.dtype), lse.float(), do), refs, "f16")


def test_jax_gradients_match():
    """The same pair on JAX arrays (dlpack from the torch inputs)."""
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU here")
    import jax.numpy as jnp

    q, k, v, do = _inputs(1, 200, 4, 2, 64, "bf16")
    o, lse, *refs = fab.reference(q, k, v, do, True)
    args = [jnp.asarray(x.float().cpu().numpy()).astype(jnp.bfloat16) for x in (q, k, v, o, do)]
    jl = jnp.asarray(lse.float().cpu().numpy())
    qj, kj, vj, oj, doj = args
    got = fab.attention_backward(qj, kj, vj, oj, jl, doj, causal=True)
    got = [torch.from_numpy(__import__("numpy").asarray(g.astype(jnp.float32))).cuda() for g in got]
    _check(got, refs, "bf16")


@pytest.mark.parametrize("B,S,Hq,Hkv,D,dtn,causal", [
    (2, 513, 8, 2, 128, "bf16", True),
    (2, 1000, 4, 4, 128, "f16", False),    # the rotated order
    (1, 333, 4, 2, 64, "bf16", False),     # ascending order, GQA
    (3, 200, 2, 1, 64, "bf16", True),
])
def test_dq_convert(B, S, Hq, Hkv, D, dtn, causal):
    """``dq_convert``: the dK/dV grid's converter CTAs write dQ (poisoned), each q block once
    its counter holds every add: float64 autograd, and dQ bitwise equal to the conversion
    kernel's (the same ordered sums)."""
    q, k, v, do = _inputs(B, S, Hq, Hkv, D, dtn, seed=S)
    o, lse, *refs = fab.reference(q, k, v, do, causal)
    args = (q, k, v, o.to(q.dtype), lse.float(), do)
    mode = dict(causal=causal, atomic_dq=True, dq_bulk=True, dq_ordered=True)
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, D, dtype=dtn, dq_convert=True, **mode)
    assert len(bwd.kernels) == 2
    got = bwd(*args)
    _check(got, refs, dtn)
    plain = fab.build_attention_backward(B, S, Hq, Hkv, D, dtype=dtn, **mode)(*args)
    assert all(torch.equal(x, y) for x, y in zip(got, plain))


@pytest.mark.parametrize("B,S,H,dtn,lag", [
    (2, 1000, 4, "bf16", 1),     # the rotated order: 8 kv heads of 8 CTAs, two q blocks each
    (2, 1000, 4, "f16", 5),
    (3, 700, 2, "bf16", 2),      # ascending order, a ragged last q block
    (2, 1000, 4, "bf16", "auto"),  # two waves of heads: more than there are, no early blocks
])
def test_dq_convert_lag(B, S, H, dtn, lag):
    """``convert_lag``: the producer's idle warps convert earlier heads' q blocks, the
    converter CTAs the last ``lag`` heads': float64 autograd, dQ (poisoned) bitwise equal to
    the conversion kernel's, dK and dV to the plain ordered kernel's."""
    q, k, v, do = _inputs(B, S, H, H, 128, dtn, seed=S + 7)
    o, lse, *refs = fab.reference(q, k, v, do, False)
    args = (q, k, v, o.to(q.dtype), lse.float(), do)
    mode = dict(atomic_dq=True, dq_bulk=True, dq_ordered=True)
    got = fab.build_attention_backward(B, S, H, H, 128, dtype=dtn, dq_convert=True,
                                       convert_lag=lag, **mode)(*args)
    _check(got, refs, dtn)
    plain = fab.build_attention_backward(B, S, H, H, 128, dtype=dtn, **mode)(*args)
    assert all(torch.equal(x, y) for x, y in zip(got, plain))


@pytest.mark.parametrize("B,S,Hq,Hkv,D,dtn,causal,lead,extra", [
    (2, 1000, 4, 4, 128, "bf16", False, 1, dict(dq_convert=True, convert_lag=1)),  # rotated
    (3, 700, 2, 2, 128, "f16", True, 2, dict(dq_convert=True)),
    (2, 1000, 4, 2, 64, "bf16", True, 3, {}),   # two q heads per kv head, the conversion kernel
    (4, 1000, 4, 4, 128, "bf16", False, "auto", dict(dq_convert=True, convert_lag="auto")),
])
def test_stats_lead(B, S, Hq, Hkv, D, dtn, causal, lead, extra):
    """``stats_lead``: the prep writes the first heads' stats, the dK/dV CTAs' idle producer
    warps the rest, each head's producer waiting for its flag: float64 autograd, and the
    gradients bitwise equal to the plain ordered kernel's (the same stats)."""
    q, k, v, do = _inputs(B, S, Hq, Hkv, D, dtn, seed=S + 11)
    o, lse, *refs = fab.reference(q, k, v, do, causal)
    args = (q, k, v, o.to(q.dtype), lse.float(), do)
    mode = dict(causal=causal, atomic_dq=True, dq_bulk=True, dq_ordered=True)
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, D, dtype=dtn, stats_lead=lead, **mode,
                                       **extra)
    assert ("OUT" in bwd.dkdv_kernel.arg_names) == bool(lead)
    got = bwd(*args)
    _check(got, refs, dtn)
    plain = fab.build_attention_backward(B, S, Hq, Hkv, D, dtype=dtn, **mode)(*args)
    assert all(torch.equal(x, y) for x, y in zip(got, plain))
    again = bwd(*args)
    assert all(torch.equal(x, y) for x, y in zip(got, again))
