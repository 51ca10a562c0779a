"""CPU checks of the packed variable-length attention backward (``build_dq_varlen``,
``build_dkdv_varlen``, ``build_attention_backward_varlen`` in
``pyptx_kernels.flash_attention.bwd_varlen``):

* ptxas accepts both kernels for D 64/128, bf16/f16, causal/full, GQA, both schedules;
* the PTX simulator (``ptxsim``) runs the pair on ragged packed batches (an empty q
  sequence, an empty k sequence, lengths that are not multiples of the blocks, different
  q and k lengths, GQA) against float64 autograd-free math per sequence: outputs poisoned
  (every row of dQ/dK/dV must be written, by its own sequence's CTAs only), the STATS
  scratch poisoned (the rows between and after sequences are never written: the kernels
  must select them away, not multiply them by zero);
* bad inputs are ``ConfigError`` whose message starts with this file's ``path:line``.

Tolerance: relative Frobenius error < 8e-3 (bf16) / 2e-3 (f16) against float64, the
simulator tests' own (``test_tensorcore_sim.py``); the largest seen here is ~4e-3.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from pyptx.errors import ConfigError

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import ptxsim  # noqa: E402

fab = importlib.import_module("pyptx_kernels.flash_attention.backward")
from pyptx_kernels.flash_attention import fwd_host, fwd_kernel

TOL = {"bf16": 8e-3, "f16": 2e-3}


_dev, _f64 = ptxsim.device_bits, ptxsim.host_f64


def _cu(lens):
    return np.array([0] + list(np.cumsum(lens)), np.int32)


def reference(Q, K, V, dO, cu_q, cu_k, causal, scale):
    """float64 ``(o, lse, dq, dk, dv)`` of packed attention, sequence by sequence (causal:
    top-left aligned; a query with no keys: o = 0, lse = -inf, no gradient)."""
    Tq, Hq, D = Q.shape
    Hkv = K.shape[1]
    g = Hq // Hkv
    o, dq = np.zeros_like(Q), np.zeros_like(Q)
    dk, dv = np.zeros_like(K), np.zeros_like(K)
    lse = np.full((Hq, Tq), -np.inf)
    for b in range(len(cu_q) - 1):
        a, e, ka, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if e == a or ke == ka:
            continue
        q, do = Q[a:e], dO[a:e]
        k, v = np.repeat(K[ka:ke], g, 1), np.repeat(V[ka:ke], g, 1)
        s = np.einsum("qhd,khd->hqk", q, k) * scale
        if causal:
            s = s + np.triu(np.full((e - a, ke - ka), -np.inf), 1)
        mx = s.max(-1, keepdims=True)
        mx = np.where(np.isfinite(mx), mx, 0.0)
        ex = np.exp(s - mx)
        sm = ex.sum(-1, keepdims=True)
        p = np.where(sm > 0, ex / np.where(sm > 0, sm, 1.0), 0.0)
        with np.errstate(divide="ignore"):
            lse[:, a:e] = (np.log(sm) + mx)[..., 0]
        ob = np.einsum("hqk,khd->qhd", p, v)
        o[a:e] = ob
        dp = np.einsum("qhd,khd->hqk", do, v)
        delta = (do * ob).sum(-1).T[..., None]
        ds = p * (dp - delta) * scale
        dq[a:e] = np.einsum("hqk,khd->qhd", ds, k)
        split = (ke - ka, Hkv, g, D)
        dk[ka:ke] = np.einsum("hqk,qhd->khd", ds, q).reshape(split).sum(2)
        dv[ka:ke] = np.einsum("hqk,qhd->khd", p, do).reshape(split).sum(2)
    return o, lse, dq, dk, dv


def _rel(got, ref):
    n = np.linalg.norm(ref)
    return float(np.linalg.norm(got - ref) / n) if n else float(np.abs(got).max())


def run_pair(lens_q, lens_k, Hq, Hkv, D, causal, dtype="bf16", seed=0, **options):
    """Simulate the varlen pair on random inputs (o and lse from the float64 forward, o
    rounded like the forward's output); ``(errors, outputs)``."""
    rng = np.random.default_rng(seed)
    Tq, Tk = sum(lens_q), sum(lens_k)
    q = _dev(rng.standard_normal((Tq, Hq, D)), dtype)
    k = _dev(rng.standard_normal((Tk, Hkv, D)), dtype)
    v = _dev(rng.standard_normal((Tk, Hkv, D)), dtype)
    do = _dev(rng.standard_normal((Tq, Hq, D)), dtype)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    scale = 1 / np.sqrt(D)
    o64, lse, *_ = reference(*(_f64(x, dtype) for x in (q, k, v, do)), cu_q, cu_k, causal, scale)
    o = _dev(o64, dtype)
    lse32 = lse.astype(np.float32)
    _, _, dq_r, dk_r, dv_r = reference(*(_f64(x, dtype) for x in (q, k, v, do)), cu_q, cu_k,
                                       causal, scale)
    bwd = fab.build_attention_backward_varlen(Tq, Tk, len(lens_q), Hq, Hkv, D, max(lens_q),
                                              max(lens_k), dtype=dtype, causal=causal, **options)
    dq, stats = ptxsim.run(bwd.dq_kernel.specialize(), [q, k, v, cu_q, cu_k, o, lse32, do],
                           scratch=(1,))
    dk, dv = ptxsim.run(bwd.dkdv_kernel.specialize(), [q, k, v, cu_q, cu_k, do, stats])
    errs = {n: _rel(_f64(got, dtype), ref)
            for n, got, ref in (("dq", dq, dq_r), ("dk", dk, dk_r), ("dv", dv, dv_r))}
    return errs, (dq, dk, dv)


@pytest.mark.parametrize("D,dtype,causal,Hq,Hkv,options", [
    (64, "bf16", False, 4, 2, {}),
    (64, "f16", True, 2, 1, {}),
    (128, "bf16", True, 8, 1, {}),
    (128, "f16", False, 2, 2, {}),
    (64, "bf16", True, 4, 4, dict(safe=True)),
    (128, "bf16", False, 4, 1, dict(dkdv_bq=32)),
])
def test_ptxas_accepts_the_varlen_pair(D, dtype, causal, Hq, Hkv, options, assemble):
    bwd = fab.build_attention_backward_varlen(700, 900, 3, Hq, Hkv, D, 333, 400, dtype=dtype,
                                              causal=causal, **options)
    for k in bwd.kernels:
        log = assemble(k.ptx())
        assert options.get("safe") or "0 bytes spill stores" in log, log


SIM_CASES = [
    # lens_q, lens_k, Hq, Hkv, D, causal, dtype
    ([0, 70, 129, 5], [0, 70, 129, 5], 2, 1, 64, False, "bf16"),
    ([0, 70, 129, 5], [0, 70, 129, 5], 2, 1, 64, True, "bf16"),
    ([0, 70, 129, 5], [33, 0, 200, 64], 4, 2, 64, True, "f16"),
    ([0, 70, 129, 5], [33, 0, 200, 64], 4, 2, 128, False, "bf16"),
    ([0, 70, 129, 5], [0, 70, 129, 5], 2, 2, 128, True, "bf16"),
    ([3, 130, 1, 66], [200, 7, 1, 131], 4, 1, 128, True, "f16"),
]


@pytest.mark.parametrize("lens_q,lens_k,Hq,Hkv,D,causal,dtype", SIM_CASES)
def test_varlen_pair_matches_float64(lens_q, lens_k, Hq, Hkv, D, causal, dtype):
    errs, _ = run_pair(lens_q, lens_k, Hq, Hkv, D, causal, dtype, seed=D + 7 * causal)
    assert all(e < TOL[dtype] for e in errs.values()), errs


@pytest.mark.parametrize("lens_q,lens_k,options", [
    ([0, 70, 129, 5], [33, 0, 200, 64], dict(safe=True)),
    ([5, 300], [300, 5], dict(safe=True)),   # odd Tq: each q head's STATS rows 16-byte aligned
    ([0, 70, 129, 5], [33, 0, 200, 64], dict(dkdv_bq=32, dq_bkv=64)),
])
def test_varlen_pair_other_schedules(lens_q, lens_k, options):
    """The safe schedule (every block masked, stats from global memory with 16-byte loads,
    which the simulator checks for alignment: the per-sequence STATS base and the per-head
    row count must keep them aligned; the fast schedule's bulk copies need the same) and
    32-row dK/dV q blocks."""
    errs, _ = run_pair(lens_q, lens_k, 4, 2, 64, True, seed=3, **options)
    assert all(e < TOL["bf16"] for e in errs.values()), errs


@pytest.mark.parametrize("Tq,B", [(305, 2), (204, 4), (1, 1), (700, 3)])
def test_stats_rows_are_16_byte_aligned(Tq, B):
    """Every (q head, sequence) STATS start is a multiple of two rows (16 bytes), for odd and
    even starts and row counts: the bulk copies of the fast schedule need it and the
    simulator does not check their alignment."""
    Sp = fab.padded_varlen(Tq, B)
    assert Sp % 2 == 0
    starts = np.linspace(0, Tq, B + 1).astype(int)
    for b, start in enumerate(starts[:-1]):
        base = start + (start & 1) + 2 * b
        assert base % 2 == 0 and base + (Tq - start) + 64 <= Sp


def test_stats_written_only_inside_sequences():
    """The dQ kernel writes a sequence's STATS rows only (rows past its end are the next
    sequence's, or padding): every other row keeps the poison. The simulator runs sequences
    in order, so a CTA overwriting its neighbour's rows would go unseen in the gradients."""
    lens_q, lens_k, Hq, Hkv, D = [0, 70, 129, 5], [3, 9, 200, 64], 2, 1, 64
    rng = np.random.default_rng(5)
    Tq, Tk, B = sum(lens_q), sum(lens_k), len(lens_q)
    q, o, do = (_dev(rng.standard_normal((Tq, Hq, D)), "bf16") for _ in range(3))
    k, v = (_dev(rng.standard_normal((Tk, Hkv, D)), "bf16") for _ in range(2))
    lse = rng.standard_normal((Hq, Tq)).astype(np.float32)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    bwd = fab.build_attention_backward_varlen(Tq, Tk, B, Hq, Hkv, D, max(lens_q), max(lens_k))
    _, stats = ptxsim.run(bwd.dq_kernel.specialize(), [q, k, v, cu_q, cu_k, o, lse, do],
                          scratch=(1,))
    written = np.zeros(fab.padded_varlen(Tq, B), bool)
    for b in range(B):
        base = cu_q[b] + (cu_q[b] & 1) + 2 * b
        assert base % 2 == 0
        written[base:base + lens_q[b]] = True
    poison = stats.view(np.uint32) == 0x7FC00001
    assert poison[:, ~written].all(), "STATS rows outside the sequences were written"
    assert not poison[:, written].any()
    want = lse * np.float32(fab.LOG2E)
    for b in range(B):
        base = cu_q[b] + (cu_q[b] & 1) + 2 * b
        got = stats[:, base:base + lens_q[b], 0].view(np.float32)
        np.testing.assert_allclose(got, want[:, cu_q[b]:cu_q[b + 1]], rtol=1e-6)


def test_backward_object_is_kernel_like():
    """``differentiable_kernel`` accepts the varlen pair as the varlen forward's backward
    (saved q, k, v, cu_q, cu_k; saved o, lse; gradients of o and lse; three gradients)."""
    from pyptx.autodiff import differentiable_kernel

    fwd = fwd_kernel.build_attention_varlen(700, 900, 3, 4, 2, 64, 333)
    bwd = fab.build_attention_backward_varlen(700, 900, 3, 4, 2, 64, 333, 400)
    op = differentiable_kernel(fwd, bwd, save_for_backward=[0, 1, 2, 3, 4],
                               save_outputs=[0, 1], num_grad_inputs=3)
    assert op.num_grad_inputs == 3 and len(bwd.in_specs) == 9
    assert [s.dims for s in bwd.out_specs] == [s.dims for s in fwd.in_specs[:3]]


def test_bad_inputs_raise_config_error_at_this_line():
    here = f"{HERE}:"
    cases = [
        (lambda: fab.build_attention_backward_varlen(700, 900, 3, 4, 2, 64, 333, 400,
                                                     atomic_dq=True), "atomic_dq"),
        (lambda: fab.build_attention_backward_varlen(700, 900, 3, 4, 2, 64, 333, 400,
                                                     dq_bulk=True, dq_ordered=True), "dq_bulk"),
        (lambda: fab.build_attention_backward_varlen(700, 900, 3, 4, 2, 64, 333, 400,
                                                     fused_bq=128), "fused_bq"),
        (lambda: fab.build_attention_backward_varlen(700, 900, 3, 4, 3, 64, 333, 400),
         "multiple of Hkv"),
        (lambda: fab.build_attention_backward_varlen(700, 900, 3, 4, 2, 256, 333, 400),
         "64 or 128"),
        (lambda: fab.build_attention_backward_varlen(700, 900, 3, 4, 2, 64, 0, 400),
         "max_seqlen"),
        (lambda: fab.build_attention_backward_varlen(700, 900, 3, 4, 2, 64, 333, 400,
                                                     dkdv_bq=128), "BQ must be 32 or 64"),
        (lambda: fab.build_attention_backward_varlen(700, 900, 3, 4, 2, 64, 333, 400,
                                                     bogus=1), "unknown options"),
    ]
    for fn, text in cases:
        with pytest.raises(ConfigError) as e:
            fn()
        msg = str(e.value)
        assert msg.startswith(here) and text in msg, msg


def test_bad_attention_varlen_calls_name_this_line():
    """``attention_varlen``'s checks (torch CPU tensors: they fail before any launch)."""
    torch = pytest.importorskip("torch")
    q = torch.zeros(20, 4, 64, dtype=torch.bfloat16)
    k = torch.zeros(20, 3, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 5, 20], dtype=torch.int32)
    cases = [
        (lambda: fwd_host.attention_varlen(q, q, q, cu, cu[:2], 15, 15), "B + 1 entries"),
        (lambda: fwd_host.attention_varlen(q, k, k, cu, cu, 15, 15), "do not match"),
        (lambda: fwd_host.attention_varlen(q, q, q, cu.long(), cu, 15, 15), "int32"),
        (lambda: fwd_host.attention_varlen(q, q, q, cu[None], cu, 15, 15), "1-D"),
        (lambda: fwd_host.attention_varlen(q, q, q, cu, cu, 15, 0), "max_seqlen_k"),
        (lambda: fwd_host.attention_varlen(q, q, q, cu, cu, 15, None), "max_seqlen_k"),
        (lambda: fwd_host.attention_varlen(q, q.half(), q.half(), cu, cu, 15, 15), "one dtype"),
    ]
    for fn, text in cases:
        with pytest.raises(ConfigError) as e:
            fn()
        msg = str(e.value)
        assert msg.startswith(f"{HERE}:") and text in msg, msg


def test_head_dim_256_requires_grad_is_refused_at_the_call():
    """No backward at D=256: torch inputs that require grad raise ``ConfigError`` at the
    ``attention``/``attention_varlen`` call (this line), naming head dim 256, the supported
    64 and 128, and the ways out; under ``torch.no_grad()`` the check passes (the launch
    then needs a GPU). The backward attached to the D=256 forward raises the same error
    when called (what ``jax.grad`` reaches), at the latest call's line."""
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 16, 2, 256, dtype=torch.bfloat16, requires_grad=True)
    qv = torch.zeros(16, 2, 256, dtype=torch.bfloat16, requires_grad=True)
    cu = torch.tensor([0, 16], dtype=torch.int32)
    for fn in (lambda: fwd_host.attention(q, q, q), lambda: fwd_host.attention_varlen(qv, qv, qv, cu, cu, 16, 16)):
        with pytest.raises(ConfigError) as e:
            fn()
        msg = str(e.value)
        assert msg.startswith(f"{HERE}:"), msg
        for text in ("head dim 256", "64 and 128", "attention_forward", "torch.no_grad()"):
            assert text in msg, msg
    sc = 1.0 / 16
    op = fwd_host._differentiable_varlen(16, 16, 1, 2, 2, 256, 16, 16, "bf16", False, sc)
    assert isinstance(op.backward_kernel, fwd_host.NoBackward)
    op.backward_kernel.where = f"{HERE}:1"
    with pytest.raises(ConfigError, match="no backward at head dim 256"):
        op.backward_kernel(*([None] * len(op.backward_kernel.in_specs)))
    dense = fwd_host._differentiable(1, 16, 2, 2, 256, 16, "bf16", False, sc)
    assert isinstance(dense.backward_kernel, fwd_host.NoBackward)
    assert len(dense.backward_kernel.in_specs) == 7 and len(op.backward_kernel.in_specs) == 9


def test_attention_varlen_is_differentiable_at_64_and_128():
    """``attention_varlen``'s wrapped kernel: the varlen forward, the varlen pair backward."""
    for D in (64, 128):
        op = fwd_host._differentiable_varlen(300, 400, 3, 4, 2, D, 129, 200, "f16", True, 0.1)
        assert type(op.backward_kernel).__name__ == "AttentionBackwardVarlen"
        assert op.saved == (0, 1, 2, 3, 4) and op.saved_outputs == (0, 1)
        assert "_causal" in op.backward_kernel.name and f"_d{D}_" in op.backward_kernel.name


def test_jax_grad_at_head_dim_256_raises_config_error():
    """``jax.grad`` reaches the D=256 forward's ``NoBackward`` while tracing (no launch:
    ``make_jaxpr``): ``ConfigError`` at the ``attention`` call's line, naming head dim 256."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    q = jnp.zeros((1, 64, 2, 256), jnp.bfloat16)

    def loss(a):
        return fwd_host.attention(a, a, a).astype(jnp.float32).sum()   # the line the error names

    with pytest.raises(ConfigError) as e:
        jax.make_jaxpr(jax.grad(loss))(q)
    assert str(e.value).startswith(f"{HERE}:") and "head dim 256" in str(e.value), str(e.value)
