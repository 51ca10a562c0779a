"""GPU tests of the packed variable-length attention backward: torch autograd through
``attention_varlen`` (examples/hopper/flash_attention.py; the varlen pair of
examples/hopper/flash_attention_bwd.py, ``build_attention_backward_varlen``).

Inputs are fresh random q, k, v, do (never zeros) with ragged lengths: empty q and k
sequences, lengths that are not multiples of the blocks, different q and k lengths, GQA
and MQA, D 64/128, bf16/f16, causal (top-left per sequence) and full. Outputs (dQ, dK, dV
and the STATS scratch, whose rows between sequences the kernels must mask, not use) are
poisoned (NaN) before each launch. Reference: float64 autograd of ``reference_varlen`` on
the same (rounded) inputs. Tolerances, as in test_flash_attention_bwd_gpu.py: per gradient
``||g - ref|| / ||ref||`` < 1e-2 for bf16 and 4e-3 for f16 (P and dS rounded to the input
type before their products; our forward's rounded ``o`` feeds ``delta``), and no element off
by more than ``0.1 * max|ref|``. Also: two backward runs are bitwise equal, forward +
backward captured in a CUDA graph replay the eager gradients bit for bit (also after new
lengths are copied into the captured ``cu_seqlens``: no host sync), and head dim 256 with
``requires_grad`` raises ``ConfigError`` at the call.

    pytest -m gpu packages/pyptx-torch/tests/test_flash_attention_varlen_bwd_gpu.py
"""

from __future__ import annotations

import pytest

from pyptx.errors import ConfigError

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),  # conftest.py: unwritten elements are NaN
]

from pyptx_kernels.flash_attention import fwd_host, fwd_reference

DT = {"bf16": torch.bfloat16, "f16": torch.float16}
TOL = {"bf16": 1e-2, "f16": 4e-3}


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                        device="cuda")


def _inputs(lens_q, lens_k, Hq, Hkv, D, dtn, seed=0):
    torch.manual_seed(seed)
    dt = DT[dtn]
    q = torch.randn(sum(lens_q), Hq, D, device="cuda", dtype=dt)
    k = torch.randn(sum(lens_k), Hkv, D, device="cuda", dtype=dt)
    v = torch.randn(sum(lens_k), Hkv, D, device="cuda", dtype=dt)
    do = torch.randn(sum(lens_q), Hq, D, device="cuda", dtype=dt)
    return q, k, v, do, _cu(lens_q), _cu(lens_k)


def _grads(q0, k0, v0, do, cu_q, cu_k, max_q, max_k, causal):
    q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
    fwd_host.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal).backward(do)
    return q.grad, k.grad, v.grad


def _reference(q, k, v, do, cu_q, cu_k, causal):
    xs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o, _ = fwd_reference.reference_varlen(*xs, cu_q, cu_k, causal)
    o.backward(do.double())
    return [x.grad for x in xs]


def _check(got, refs, dtn):
    for name, g, r in zip(("dq", "dk", "dv"), got, refs):
        assert not torch.isnan(g).any(), f"{name}: unwritten (NaN-poisoned) or NaN elements"
        err = ((g.double() - r).norm() / r.norm()).item()
        worst = ((g.double() - r).abs().max() / r.abs().max()).item()
        assert err < TOL[dtn] and worst < 0.1, (name, err, worst)


CASES = [
    # lens_q, lens_k, Hq, Hkv, D, dtype, causal
    ([0, 70, 129, 5], [0, 70, 129, 5], 4, 2, 64, "bf16", False),
    ([0, 70, 129, 5], [0, 70, 129, 5], 4, 2, 64, "bf16", True),
    ([0, 70, 129, 5], [33, 0, 200, 64], 4, 2, 128, "f16", True),
    ([0, 70, 129, 5], [33, 0, 200, 64], 2, 2, 128, "bf16", False),
    ([300, 1, 513, 0, 1000], [300, 1, 513, 7, 1000], 8, 1, 128, "bf16", True),
    ([257, 128, 0, 77], [100, 128, 9, 300], 4, 1, 64, "f16", False),
    ([1000, 3, 640], [1000, 3, 640], 4, 4, 64, "bf16", True),
    ([1000, 3, 640], [1000, 3, 640], 2, 1, 128, "f16", False),
]


@pytest.mark.parametrize("lens_q,lens_k,Hq,Hkv,D,dtn,causal", CASES)
def test_varlen_backward_matches_float64_autograd(lens_q, lens_k, Hq, Hkv, D, dtn, causal):
    q, k, v, do, cu_q, cu_k = _inputs(lens_q, lens_k, Hq, Hkv, D, dtn)
    got = _grads(q, k, v, do, cu_q, cu_k, max(lens_q), max(lens_k), causal)
    _check(got, _reference(q, k, v, do, cu_q, cu_k, causal), dtn)


@pytest.mark.parametrize("D,causal", [(64, True), (128, False)])
def test_varlen_backward_is_deterministic(D, causal):
    lens_q, lens_k = [0, 300, 129, 5, 640], [17, 300, 0, 64, 640]
    q, k, v, do, cu_q, cu_k = _inputs(lens_q, lens_k, 8, 2, D, "bf16", seed=1)
    a = _grads(q, k, v, do, cu_q, cu_k, max(lens_q), max(lens_k), causal)
    b = _grads(q, k, v, do, cu_q, cu_k, max(lens_q), max(lens_k), causal)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("D", [64, 128])
def test_varlen_forward_backward_in_a_cuda_graph(D):
    """Forward + backward captured in one CUDA graph: the replay gives the eager gradients
    bit for bit; then new lengths (same totals) copied into the captured ``cu_seqlens`` and
    replayed give the eager gradients of those lengths (the kernels read the lengths on the
    device)."""
    lens_q, lens_k = [0, 70, 129, 5], [33, 0, 200, 64]
    q0, k0, v0, do, cu_q, cu_k = _inputs(lens_q, lens_k, 4, 2, D, "bf16", seed=2)
    max_q, max_k = 160, 220
    q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):       # warm up (compile, load) outside the capture
        for _ in range(2):
            o = fwd_host.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
            torch.autograd.grad(o, (q, k, v), do)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = fwd_host.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
        grads = torch.autograd.grad(o, (q, k, v), do)
    for new_q, new_k in ((lens_q, lens_k), ([100, 4, 0, 100], [150, 7, 140, 0])):
        cu_q.copy_(_cu(new_q))
        cu_k.copy_(_cu(new_k))
        g.replay()
        torch.cuda.synchronize()
        want = _grads(q0, k0, v0, do, cu_q.clone(), cu_k.clone(), max_q, max_k, True)
        assert all(torch.equal(x, y) for x, y in zip(grads, want)), (new_q, new_k)
        _check(grads, _reference(q0, k0, v0, do, cu_q, cu_k, True), "bf16")


def test_head_dim_256_with_grad_is_refused():
    """No backward at D=256: ``ConfigError`` at the call (this file's line) when q/k/v
    require grad; under ``torch.no_grad()`` the forward runs."""
    lens = [70, 0, 129]
    q, k, v, _, cu_q, cu_k = _inputs(lens, lens, 2, 2, 256, "bf16")
    qg = q.clone().requires_grad_()
    with pytest.raises(ConfigError) as e:
        fwd_host.attention_varlen(qg, k, v, cu_q, cu_k, 129, 129)
    assert str(e.value).startswith(f"{__file__}:") and "head dim 256" in str(e.value)
    qd = q[None, :128].clone().requires_grad_()
    with pytest.raises(ConfigError) as e:
        fwd_host.attention(qd, qd, qd)
    assert str(e.value).startswith(f"{__file__}:") and "attention_forward" in str(e.value)
    with torch.no_grad():
        o = fwd_host.attention_varlen(qg, k, v, cu_q, cu_k, 129, 129)
    ro, _ = fwd_reference.reference_varlen(q, k, v, cu_q, cu_k)
    assert ((o.double() - ro).abs().max() / ro.abs().max()).item() < 2e-2
