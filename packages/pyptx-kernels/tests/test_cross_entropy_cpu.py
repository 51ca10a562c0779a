"""CPU tests of ``linear_cross_entropy``'s chunk loop and its f32 weight-gradient sum
(``cross_entropy.host._weight_grad``): the first of several chunks' GEMM writes f32, a
middle chunk's GEMM adds the running sum in its epilogue (``gemm.host._matmul_residual``),
the last chunk's GEMM adds it too and writes bf16 (the sum rounded once); no zeroed buffer,
no separate conversion.

* the call sequence with each launch a float64 model (which GEMM, which output dtype, the
  running sum handed on), the result against float64 autograd;
* ``_matmul_residual``'s host plan (``g.T`` read MN-major, no copy; padded and cropped where
  the vocabulary is not a multiple of 8) with the real residual GEMM in ``ptxsim``;
* the whole chunk loop with every GEMM and the row kernel in ``ptxsim``.
"""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
import ptxsim as sim  # noqa: E402  (conftest puts core's tests on the path)
import pyptx_kernels as pk  # noqa: E402
from pyptx_kernels import _common  # noqa: E402
from pyptx_kernels.cross_entropy import host as ce_host  # noqa: E402
from pyptx_kernels.cross_entropy import reference as ce_ref  # noqa: E402
from pyptx_kernels.cross_entropy.config import CrossEntropyConfig  # noqa: E402
from pyptx_kernels.gemm import api as gemm_api  # noqa: E402
from pyptx_kernels.gemm import host as gemm_host  # noqa: E402
from pyptx_kernels.gemm.config import GemmConfig  # noqa: E402
from pyptx_kernels.gemm.kernel import build_gemm  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-300)).item()


def _rows_model(logits, target, scale, ignore_index, eps, z, grad, threads, unroll):
    """A float64 model of the row kernel: ``(loss, lse)``, the scaled gradient in place."""
    x = logits.double()
    V = x.shape[1]
    lse = torch.logsumexp(x, -1)
    valid = target != ignore_index
    at = target.clamp(0, V - 1)
    xt = x.gather(1, at[:, None])[:, 0]
    loss = torch.where(valid, lse - (1 - eps) * xt - eps * x.mean(-1) + z * lse * lse, 0.0)
    if grad:
        g = torch.exp(x - lse[:, None]) * (1 + 2 * z * lse[:, None]) - eps / V
        g[torch.arange(x.shape[0]), at] -= 1 - eps
        g = g * float(scale[0]) * valid[:, None]
        logits.copy_(g.to(logits.dtype))
    return loss.float(), lse.float()


@pytest.fixture
def recorded(monkeypatch):
    """The GEMMs as float64 models that record ``(kind, a's shape, out dtype, residual)``."""
    calls = []

    def mm(a, b, bias, out, trans_b=False):
        d = a.double() @ b.double()
        d = (d if bias is None else d + bias.double()).to(_common.torch_dtype(out))
        calls.append(("mm", tuple(a.shape), out, None, d))
        return d

    def mm_residual(a, b, residual, out_dtype=None, config=None):
        out = out_dtype or _common.dtype_name(residual.dtype)
        d = (a.double() @ b.double() + residual.double()).to(_common.torch_dtype(out))
        calls.append(("residual", tuple(a.shape), out, residual, d))
        return d

    monkeypatch.setattr(_common, "check_devices", lambda *a: None)
    monkeypatch.setattr(gemm_api, "_mm", mm)
    monkeypatch.setattr(gemm_host, "_matmul_residual", mm_residual)
    monkeypatch.setattr(ce_host, "rows", _rows_model)
    return calls


def _inputs(T, H, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(BF).requires_grad_()
    w = (torch.randn(V, H, generator=g) * 0.5).to(BF).requires_grad_()
    target = torch.randint(0, V, (T,), generator=g)
    target[1] = -100
    return x, w, target


def _check_against_float64(x, w, target, loss, tol=1e-2, **kw):
    gx, gw = torch.autograd.grad(loss * 1.5, (x, w))
    xd, wd = (t.detach().double().requires_grad_() for t in (x, w))
    ref = ce_ref.linear_cross_entropy(xd, wd, target, **kw)
    rgx, rgw = torch.autograd.grad(ref * 1.5, (xd, wd))
    assert abs(loss.item() - ref.item()) < 1e-3 * max(1.0, abs(ref.item()))
    assert gx.dtype == BF and gw.dtype == BF and gw.shape == w.shape
    assert _rel(gx, rgx) < tol and _rel(gw, rgw) < tol
    return gw, rgw


@pytest.mark.parametrize("T,chunk,V", [(24, 24, 40), (24, 12, 40), (24, 8, 40), (26, 7, 40),
                                       (26, 5, 40), (26, 5, 41)])
def test_weight_gradient_sum_call_sequence(recorded, T, chunk, V):
    """1 to 6 chunks: per chunk the logits' and x's GEMMs in bf16, then the weight
    gradient's: alone in bf16; of several, the first in f32, each later one with the
    previous chunk's result as its residual, f32 out (middle) or bf16 (last). A vocabulary
    not a multiple of 8 (the residual would be padded and the result cropped): the later
    chunks' products in bf16, added to the f32 sum by torch."""
    H = 16
    x, w, target = _inputs(T, H, V)
    loss = pk.linear_cross_entropy(x, w, target, config=CrossEntropyConfig(chunk_tokens=chunk))
    n = -(-T // chunk)
    dw = [c for c in recorded if c[1][0] == V]   # g.T (V, C): the weight gradient's GEMMs
    assert len(recorded) == 3 * n and len(dw) == n
    if n == 1:
        assert [c[:3] for c in dw] == [("mm", (V, T), "bf16")]
    else:
        kinds = [(c[0], c[2]) for c in dw]
        middle = ("residual", "f32") if V % 8 == 0 else ("mm", "bf16")
        last = ("residual", "bf16") if V % 8 == 0 else ("mm", "bf16")
        assert kinds == [("mm", "f32")] + [middle] * (n - 2) + [last]
        if V % 8 == 0:
            for before, now in zip(dw, dw[1:]):   # the running sum handed on, not a copy
                assert now[3] is before[4]
    _check_against_float64(x, w, target, loss)


def test_weight_gradient_sum_stays_f32(recorded):
    """Many chunks of one token each: the sum is f32 until the last add (a bf16 running sum
    would lose ~2**-9 of itself per chunk); the result is float64's rounded to bf16."""
    T, H, V = 64, 16, 24
    x, w, target = _inputs(T, H, V, seed=3)
    loss = pk.linear_cross_entropy(x, w, target, reduction="sum",
                                   config=CrossEntropyConfig(chunk_tokens=1))
    gw, rgw = _check_against_float64(x, w, target, loss, reduction="sum")
    # within bf16's rounding of the result plus the logits' gradient's (per chunk) bf16
    assert _rel(gw, rgw) < 5e-3


# ------------------------------------------------------------------------ simulated GEMM
def _np(t):
    t = t.detach().contiguous()
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype is BF else t.numpy()


def _torch(a, dtype):
    a = np.ascontiguousarray(a)
    return torch.from_numpy(a.view(np.int16)).view(BF) if dtype is BF else torch.from_numpy(
        a.view(np.float32)).clone()


SMALL = GemmConfig(BM=128, BN=128, cluster=1, num_sms=2)


def _simulated_cached(M, N, K, key, config):
    """``gemm.host._cached`` as the kernel of that key on a small plan, run in ``ptxsim``."""
    k = build_gemm(M, N, K, **dict(key), config=SMALL)
    spec = k.specialize()
    dt = BF if dict(key)["out_dtype"] == "bf16" else F32
    seen = dict(key)

    def run(*args):
        for t in args:
            assert t.is_contiguous()
        _simulated_cached.keys.append(seen)
        (d,) = sim.run(spec, [_np(t) for t in args])
        return _torch(d, dt).reshape(M, N)
    return run


_simulated_cached.keys = []


@pytest.mark.parametrize("C,V,H", [(24, 136, 64), (7, 100, 64)])
def test_matmul_residual_on_the_simulated_kernel(monkeypatch, C, V, H):
    """``g.T @ x + r`` with ``g (C, V)`` contiguous: A read MN-major with no copy (a ragged
    ``V`` zero-padded, the residual padded and the result cropped), f32 out."""
    monkeypatch.setattr(gemm_host, "_cached", _simulated_cached)
    _simulated_cached.keys.clear()
    gen = torch.Generator().manual_seed(C + V)
    g = torch.randn(C, V, generator=gen).to(BF)
    x = torch.randn(C, H, generator=gen).to(BF)
    r = torch.randn(V, H, generator=gen) * 4
    plan = gemm_host._plan(g.T, x, None, 1.0, None, "f32", False, False, None, "torch")
    assert plan.swap_a and not plan.copy_a and not plan.copy_b
    assert plan.pad_a == (V % 8 != 0) and plan.crop == (V % 8 != 0)
    d = gemm_host._matmul_residual(g.T, x, r)
    (key,) = _simulated_cached.keys
    assert key["residual"] and key["a_major"] == "MN" and key["b_major"] == "MN"
    assert key["out_dtype"] == "f32"
    assert d.dtype == F32 and d.shape == (V, H) and d.is_contiguous()
    ref = g.double().T @ x.double() + r.double()
    assert _rel(d, ref) < 1e-5


def test_matmul_residual_refuses_a_mismatched_residual():
    from pyptx.errors import ConfigError

    g, x = torch.zeros(8, 16, dtype=BF), torch.zeros(8, 24, dtype=BF)
    with pytest.raises(ConfigError, match="residual must be"):
        gemm_host._matmul_residual(g.T, x, torch.zeros(16, 8))
    with pytest.raises(ConfigError, match="residual must be"):
        gemm_host._matmul_residual(g.T, x, torch.zeros(16, 24, dtype=torch.float16))


def test_chunk_loop_on_the_simulated_kernels(monkeypatch):
    """Three chunks with every GEMM (logits, x's and the weight's gradients, the residual
    one) and the row kernel in ``ptxsim``."""
    monkeypatch.setattr(_common, "check_devices", lambda *a: None)
    monkeypatch.setattr(gemm_host, "_cached", _simulated_cached)
    rows = ce_host._row_kernel

    def simulated_rows(*a):
        spec = rows(*a).specialize()

        def run(logits, target, scale):
            arrays = [_np(logits), target.numpy(), scale.numpy()]
            loss, lse = sim.run(spec, arrays, inplace=True)
            logits.copy_(_torch(arrays[0], BF).reshape(logits.shape))
            return _torch(loss, F32), _torch(lse, F32)
        return run

    monkeypatch.setattr(ce_host, "_row_kernel", simulated_rows)
    _simulated_cached.keys.clear()
    x, w, target = _inputs(18, 64, 72, seed=5)
    cfg = CrossEntropyConfig(chunk_tokens=7, threads=32, unroll=1)
    loss = pk.linear_cross_entropy(x, w, target, config=cfg)
    dw = [k for k in _simulated_cached.keys if k["a_major"] == "MN"]
    assert [(k["out_dtype"], k.get("residual", False)) for k in dw] == [
        ("f32", False), ("f32", True), ("bf16", "f32")]
    _check_against_float64(x, w, target, loss, tol=2e-2)


@pytest.mark.parametrize("out,residual", [("f32", False), ("f32", True), ("bf16", "f32")])
def test_weight_gradient_gemms_assemble_without_spills(ptxas_path, out, residual):
    """The first, middle and last chunks' GEMMs at 128256 x 2048 x 4096 (g.T MN-major, x_c
    MN-major) on the plan a default call takes there."""
    from pyptx.ptxas import check

    M, N, K = 128256, 2048, 4096
    plan, _ = gemm_host.PLANNER.choose({"M": M, "N": N, "K": K})
    k = build_gemm(M, N, K, dtype="bf16", out_dtype=out, a_major="MN", b_major="MN",
                   residual=residual, config=plan)
    spec = k.specialize()
    e = check(spec).entries[0]
    # the last chunk's f32 residual beside a bf16 output: ptxas hoists a slab's 32 f32
    # residual loads above the 128 accumulators and keeps one register in local memory
    allowed = 4 if residual == "f32" else 0
    assert e.spill_stores <= allowed and e.spill_loads <= allowed, (spec.name, e)


@pytest.mark.parametrize("need", [(True, True, True), (True, False, False), (False, True, True),
                                  (False, False, False)])
def test_backward_scales_the_saved_gradients_by_the_incoming_one(need):
    """The autograd backward multiplies the gradients the forward formed by the incoming
    gradient (an f32 scalar), rounded to each gradient's dtype as ``(grad * g).to(dtype)``;
    the ones not asked for stay None."""
    from types import SimpleNamespace

    from pyptx_kernels.cross_entropy import api as ce_api

    gen = torch.Generator().manual_seed(7)
    saved = (torch.randn(37, 64, generator=gen).to(BF), torch.randn(300, 64, generator=gen).to(BF),
             torch.randn(300, generator=gen))
    grad = torch.tensor(0.37)
    ctx = SimpleNamespace(saved_tensors=saved, need=need)
    out = ce_api._backward(ctx, grad, None, None, None)
    assert len(out) == 14 and out[2] is None and all(o is None for o in out[4:])
    for got, g, n in zip((out[0], out[1], out[3]), saved, need):
        if not n:
            assert got is None
            continue
        assert got.dtype == g.dtype and torch.equal(got, (grad * g).to(g.dtype))
