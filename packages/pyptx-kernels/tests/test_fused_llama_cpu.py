"""The fused kernels of a Llama training step on the CPU: ``add_rms_norm``, ``apply_rotary``
and ``linear_cross_entropy``.

* the kernels' PTX assembles (ptxas) without spills at the model's sizes, and ``ptxsim``
  runs it against float64 on small ragged inputs;
* the host logic (layouts, chunks, scales, autograd) with each launch swapped for a float64
  model of what the kernel computes, against float64 torch;
* ``torch.compile(fullgraph=True)`` traces the custom ops on meta tensors;
* bad input raises a ``PyptxError`` at the caller's line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
import ptxsim as sim  # noqa: E402  (conftest puts core's tests on the path)
from pyptx_kernels.cross_entropy.config import CrossEntropyConfig  # noqa: E402
from pyptx_kernels.cross_entropy.kernel import build_cross_entropy_rows  # noqa: E402
from pyptx_kernels.rows.add_rms_norm import build_add_rms_norm, build_add_rms_norm_bwd  # noqa: E402
from pyptx_kernels.rows.rope import build_rope  # noqa: E402

from pyptx import PyptxError  # noqa: E402

DTS = ["f32", "bf16"]
TOL = {"f32": 1e-6, "bf16": 1e-2}


def to_dev(x, dt):
    x = np.asarray(x, np.float32)
    return x if dt == "f32" else sim._bf16_rne(x)


def f64(a, dt):
    if dt == "f32":
        return a.view(np.float32).astype(np.float64)
    return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


# ------------------------------------------------------------------------ PTX, ptxas
def _llama_kernels():
    yield build_add_rms_norm(8192, 2048, "bf16")
    yield from build_add_rms_norm_bwd(8192, 2048, "bf16").kernels
    yield build_add_rms_norm(3, 4097, "f32")
    yield build_rope(4, 16, 4, 2048, 128, "bf16", layout="bshd")
    yield build_rope(4, 16, 4, 2048, 128, "bf16", layout="bhsd", transpose=True, cos_batch=4)
    yield build_cross_entropy_rows(2048, 128256, "bf16", z_loss=1e-4, label_smoothing=0.1)
    yield build_cross_entropy_rows(8192, 32000, "bf16")
    yield build_cross_entropy_rows(8192, 32000, "bf16", grad=False)


def test_kernels_assemble_without_spills(ptxas_path):
    from pyptx.ptxas import check

    for k in _llama_kernels():
        spec = k.specialize()
        e = check(spec).entries[0]
        threads = spec.block[0] * spec.block[1] * spec.block[2]
        assert e.spill_stores == e.spill_loads == e.stack == 0, (spec.name, e)
        assert e.registers <= min(255, 65536 // threads), (spec.name, e)


# ------------------------------------------------------------------------ simulator
@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("B,N", [(5, 7), (130, 24), (3, 1000), (2, 4097)])
def test_add_rms_norm_in_simulator(B, N, dt):
    rng = np.random.default_rng(B + N)
    x, r = (to_dev(rng.standard_normal((B, N)), dt) for _ in range(2))
    w = to_dev(rng.standard_normal(N) * 0.1 + 1, dt)
    y, h = sim.run(build_add_rms_norm(B, N, dt).specialize(), [x, r, w])
    h64 = f64(x, dt) + f64(r, dt)
    assert rel(f64(h, dt), h64) < TOL[dt]
    ref = h64 / np.sqrt((h64 ** 2).mean(-1, keepdims=True) + 1e-6) * f64(w, dt)
    assert rel(f64(y, dt), ref) < TOL[dt]

    dy, dh = (to_dev(rng.standard_normal((B, N)), dt) for _ in range(2))
    k1, k2 = build_add_rms_norm_bwd(B, N, dt, config=None).kernels
    dx, part = sim.run(k1.specialize(), [h, w, dy, dh])
    (dw,) = sim.run(k2.specialize(), [part])
    H = f64(h, dt)
    g = f64(w, dt) * f64(dy, dt)
    rs = 1 / np.sqrt((H ** 2).mean(-1, keepdims=True) + 1e-6)
    ref_dx = rs * g - H * rs ** 3 * (g * H).mean(-1, keepdims=True) + f64(dh, dt)
    assert rel(f64(dx, dt), ref_dx) < 2 * TOL[dt]
    assert rel(f64(dw, dt), (f64(dy, dt) * H * rs).sum(0)) < 2 * TOL[dt]


def _rotate(x, c, s, transpose):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    if transpose:
        return np.concatenate([x1 * c[..., :h] + x2 * s[..., h:],
                               x2 * c[..., h:] - x1 * s[..., :h]], -1)
    return np.concatenate([x1 * c[..., :h] - x2 * s[..., :h], x2 * c[..., h:] + x1 * s[..., h:]],
                          -1)


@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("B,Hq,Hk,S,D,cb,layout,transpose", [
    (2, 3, 1, 5, 16, 1, "bhsd", False),
    (2, 4, 2, 3, 12, 2, "bshd", True),     # 3 threads per row: a non-power-of-two CTA
    (1, 2, 1, 7, 128, 1, "bshd", False),
    (2, 4, 2, 40, 16, 2, "bhsd", True),    # several CTAs per tensor, a ragged last one
])
def test_rope_in_simulator(B, Hq, Hk, S, D, cb, layout, transpose, dt):
    rng = np.random.default_rng(D + S)
    shape = (lambda H: (B, H, S, D)) if layout == "bhsd" else (lambda H: (B, S, H, D))
    q, k = to_dev(rng.standard_normal(shape(Hq)), dt), to_dev(rng.standard_normal(shape(Hk)), dt)
    ang = rng.standard_normal((cb, S, D // 2))
    ang = np.concatenate([ang, ang * 1.3], -1)   # unequal halves: the transpose is exact
    c, s = to_dev(np.cos(ang), dt), to_dev(np.sin(ang), dt)
    kern = build_rope(B, Hq, Hk, S, D, dt, cos_batch=cb, layout=layout, transpose=transpose)
    qo, ko = sim.run(kern.specialize(), [a.reshape(-1, D) for a in (q, k, c, s)])
    c64, s64 = f64(c, dt), f64(s, dt)
    cc, ss = (a[:, None] if layout == "bhsd" else a[:, :, None] for a in (c64, s64))
    for got, x in ((qo, q), (ko, k)):
        ref = _rotate(f64(x, dt), cc, ss, transpose)
        assert rel(f64(got, dt).reshape(ref.shape), ref) < TOL[dt]


def _ce_ref(x64, tg, eps, z, scale, ignore=-100):
    T, V = x64.shape
    m = x64.max(-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x64 - m).sum(-1))
    valid = tg != ignore
    at = np.clip(tg, 0, V - 1)
    xt = np.where(valid, x64[np.arange(T), at], 0)
    loss = np.where(valid, lse - (1 - eps) * xt - eps * x64.mean(-1) + z * lse * lse, 0)
    g = np.exp(x64 - lse[:, None]) * (1 + 2 * z * lse[:, None]) - eps / V
    g[np.arange(T), at] -= 1 - eps
    g *= scale
    g[~valid] = 0
    return loss, lse, g


@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("T,V,eps,z,threads,unroll", [
    (3, 7, 0.0, 0.0, 32, 1),          # one element per vector, most threads idle
    (4, 1000, 0.1, 1e-3, 64, 2),      # a ragged slab
    (2, 4104, 0.0, 1e-2, 128, 2),     # several slabs, the last ragged
    (3, 1024, 0.2, 0.0, 32, 4),       # whole slabs
])
def test_cross_entropy_rows_in_simulator(T, V, eps, z, threads, unroll, dt):
    rng = np.random.default_rng(V)
    x = to_dev(rng.standard_normal((T, V)) * 3, dt)
    tg = rng.integers(0, V, T).astype(np.int64)
    tg[1] = -100
    X = x.copy()
    k = build_cross_entropy_rows(T, V, dt, label_smoothing=eps, z_loss=z,
                                 config=CrossEntropyConfig(threads=threads, unroll=unroll))
    loss, lse = sim.run(k.specialize(), [X, tg, np.array([0.37], np.float32)], inplace=True)
    rl, rlse, rg = _ce_ref(f64(x, dt), tg, eps, z, 0.37)
    assert rel(loss.view(np.float32), rl) < 1e-6
    assert rel(lse.view(np.float32), rlse) < 1e-6
    assert rel(f64(X, dt), rg) < TOL[dt]
    X = x.copy()
    k = build_cross_entropy_rows(T, V, dt, label_smoothing=eps, z_loss=z, grad=False,
                                 config=CrossEntropyConfig(threads=threads, unroll=unroll))
    loss, _ = sim.run(k.specialize(), [X, tg, np.array([0.37], np.float32)], inplace=True)
    assert rel(loss.view(np.float32), rl) < 1e-6
    assert np.array_equal(X, x)   # forward only: the logits stay


def test_chunk_is_keyed_by_memory():
    c = CrossEntropyConfig()
    assert c.chunk(8192, 32000) == 8192
    assert c.chunk(8192, 128256) == 4096        # two chunks of 1 GiB of bf16 logits
    assert c.chunk(8192, 256000) == 2048
    assert c.chunk(100, 256000) == 100
    assert CrossEntropyConfig(chunk_tokens=300).chunk(1000, 10) == 300
    assert CrossEntropyConfig(logits_bytes=1).chunk(5000, 10) == 256


# ------------------------------------------------------------------------ host, autograd
torch = pytest.importorskip("torch")
import pyptx_kernels as pk  # noqa: E402
from pyptx_kernels import _common  # noqa: E402
from pyptx_kernels.cross_entropy import host as ce_host  # noqa: E402
from pyptx_kernels.cross_entropy import reference as ce_ref  # noqa: E402
from pyptx_kernels.gemm import api as gemm_api  # noqa: E402
from pyptx_kernels.gemm import host as gemm_host  # noqa: E402
from pyptx_kernels.rows import api as rows_api  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32


def _mm_model(a, b, bias, out):
    d = a.double() @ b.double()
    return (d if bias is None else d + bias.double()).to(_common.torch_dtype(out))


def _mm_residual_model(a, b, residual, config=None):
    return (a.double() @ b.double() + residual.double()).to(residual.dtype)


def _add_rms_model(x, r, w, eps):
    h = (x + r).to(x.dtype)
    hd = h.double()
    return (hd * torch.rsqrt((hd * hd).mean(-1, keepdim=True) + eps) * w.double()).to(x.dtype), h


def _add_rms_grads(gy, gh, h, w, eps):
    """float64 ``(dx, dw)``: the backward kernel's formulas (``build_add_rms_norm_bwd``)."""
    hd, wd = h.double(), w.double()
    r = torch.rsqrt((hd * hd).mean(-1, keepdim=True) + eps)
    g = wd * gy.double()
    dx = r * g - hd * r ** 3 * (g * hd).mean(-1, keepdim=True) + gh.double()
    return dx.to(h.dtype), (gy.double() * hd * r).sum(0).to(w.dtype)


def _rope_model(B, Hq, Hk, S, D, dtype, cb, layout, transpose):
    """A float64 model of ``build_rope``'s kernel: rows of q and k, tables of ``cb * S``."""
    def run(q2, k2, c2, s2):
        out = []
        for x2, H in ((q2, Hq), (k2, Hk)):
            x = x2.double().reshape((B, H, S, D) if layout == "bhsd" else (B, S, H, D))
            c = c2.double().reshape(cb, S, D)
            s = s2.double().reshape(cb, S, D)
            c, s = (t[:, None] if layout == "bhsd" else t[:, :, None] for t in (c, s))
            y = _rotate(x.numpy(), c.numpy(), s.numpy(), transpose)
            out.append(torch.from_numpy(y).to(x2.dtype).reshape(x2.shape))
        return tuple(out)
    return run


def _ce_rows_model(logits, target, scale, ignore_index, eps, z, grad, threads, unroll):
    """A float64 model of the row kernel: ``(loss, lse)``, the gradient written in place."""
    loss, lse, g = _ce_ref(logits.double().numpy(), target.numpy(), eps, z,
                           float(scale[0]), ignore_index)
    if grad:
        logits.copy_(torch.from_numpy(g).to(logits.dtype))
    return torch.from_numpy(loss).float(), torch.from_numpy(lse).float()


@pytest.fixture
def models(monkeypatch):
    monkeypatch.setattr(_common, "check_devices", lambda *a: None)
    monkeypatch.setattr(gemm_api, "_mm", lambda a, b, bias, out, trans_b=False: _mm_model(
        a, b, bias, out))
    monkeypatch.setattr(gemm_host, "_matmul_residual", _mm_residual_model)
    monkeypatch.setattr(rows_api, "_add_rms_norm", _add_rms_model)
    monkeypatch.setattr(rows_api, "_add_rms_norm_backward", _add_rms_grads)
    monkeypatch.setattr(rows_api, "_rope_kernel", _rope_model)
    monkeypatch.setattr(ce_host, "rows", _ce_rows_model)


def _leaf(*shape, dtype=BF, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return (torch.randn(*shape, generator=g) * scale).to(dtype).requires_grad_()


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-300)).item()


@pytest.mark.parametrize("dtype", [F32, BF])
def test_add_rms_norm_autograd(models, dtype):
    x, r, w = _leaf(2, 5, 96, dtype=dtype), _leaf(2, 5, 96, dtype=dtype, seed=1), _leaf(
        96, dtype=dtype, seed=2)
    y, h = pk.add_rms_norm(x, r, w, eps=1e-5)
    gy, gh = torch.randn_like(y), torch.randn_like(h)
    dx, dr, dw = torch.autograd.grad((y * gy).sum() + (h * gh).sum(), (x, r, w))
    xs = [t.detach().double().requires_grad_() for t in (x, r, w)]
    hd = xs[0] + xs[1]
    yd = hd * torch.rsqrt((hd * hd).mean(-1, keepdim=True) + 1e-5) * xs[2]
    rdx, rdr, rdw = torch.autograd.grad((yd * gy.double()).sum() + (hd * gh.double()).sum(), xs)
    tol = 1e-6 if dtype is F32 else 2e-2
    for got, ref in ((y, yd), (h, hd), (dx, rdx), (dr, rdr), (dw, rdw)):
        assert got.dtype == dtype and got.shape == ref.shape
        assert _rel(got, ref) < tol
    # one output's gradient alone: the other's is zero
    (dx,) = torch.autograd.grad(pk.add_rms_norm(x, r, w, eps=1e-5)[1].sum(), (x,))
    assert torch.equal(dx, torch.ones_like(dx))


def _hf_rotate(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


@pytest.mark.parametrize("stored", ["bhsd", "bshd", "bshd-given"])
def test_apply_rotary_autograd_and_layouts(models, stored):
    """q/k given as transformers passes them (``(B, S, H, D)`` memory seen as ``(B, H, S, D)``),
    dense ``bhsd``, or ``layout="bshd"``: the result equals ``q * cos + rotate_half(q) * sin``
    with transformers' ``(B, S, D)`` tables, and so do the gradients."""
    B, Hq, Hk, S, D = 2, 4, 2, 5, 16
    g = torch.Generator().manual_seed(3)
    ang = torch.randn(B, S, D // 2, generator=g, dtype=torch.float64)
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().to(F32), ang.sin().to(F32)
    if stored == "bhsd":
        q, k = _leaf(B, Hq, S, D, dtype=F32), _leaf(B, Hk, S, D, dtype=F32, seed=1)
        qv, kv = q, k
    else:
        q, k = _leaf(B, S, Hq, D, dtype=F32), _leaf(B, S, Hk, D, dtype=F32, seed=1)
        qv, kv = q.transpose(1, 2), k.transpose(1, 2)
    if stored == "bshd-given":
        qo, ko = pk.apply_rotary(q, k, cos, sin, layout="bshd")
        qo, ko = qo.transpose(1, 2), ko.transpose(1, 2)
    else:
        qo, ko = pk.apply_rotary(qv, kv, cos, sin)
        if stored == "bshd":   # the result keeps the input's strides: no copy
            assert qo.transpose(1, 2).is_contiguous()
    c4, s4 = cos.double()[:, None], sin.double()[:, None]
    rq, rk = _hf_rotate(qv.double(), c4, s4), _hf_rotate(kv.double(), c4, s4)
    assert _rel(qo, rq) < 1e-6 and _rel(ko, rk) < 1e-6
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    dq, dk = torch.autograd.grad((qo * gq).sum() + (ko * gk).sum(), (q, k))
    xs = [t.detach().double().requires_grad_() for t in (q, k)]
    xv = xs if stored == "bhsd" else [t.transpose(1, 2) for t in xs]
    ref = (_hf_rotate(xv[0], c4, s4) * gq.double()).sum() + (
        _hf_rotate(xv[1], c4, s4) * gk.double()).sum()
    rdq, rdk = torch.autograd.grad(ref, xs)
    assert _rel(dq, rdq) < 1e-6 and _rel(dk, rdk) < 1e-6


def test_apply_rotary_broadcasts_one_table(models):
    q, k = _leaf(3, 2, 4, 8, dtype=F32), _leaf(3, 1, 4, 8, dtype=F32, seed=1)
    ang = torch.randn(4, 8, dtype=torch.float64)
    for cos, sin in ((ang.cos().float(), ang.sin().float()),
                     (ang.cos().float()[None], ang.sin().float()[None])):
        qo, ko = pk.apply_rotary(q, k, cos, sin)
        ref = _hf_rotate(q.double(), ang.cos(), ang.sin())
        assert _rel(qo, ref) < 1e-6


@pytest.mark.parametrize("kw", [
    {}, dict(label_smoothing=0.1), dict(z_loss=1e-3), dict(reduction="sum"),
    dict(label_smoothing=0.05, z_loss=1e-4, ignore_index=3), dict(bias=True),
])
@pytest.mark.parametrize("chunk", [None, 7])
def test_linear_cross_entropy_matches_float64(models, kw, chunk):
    """Against ``F.cross_entropy(F.linear(...))`` in float64, one chunk or several (7 tokens
    of 2 x 9), with ignored tokens: loss and the gradients of x, weight and bias."""
    kw = dict(kw)
    T, H, V = 9, 16, 50
    x, w = _leaf(2, T, H), _leaf(V, H, seed=1, scale=0.5)
    b = _leaf(V, seed=2) if kw.pop("bias", False) else None
    target = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(5))
    target[0, 2] = target[1, 5] = kw.get("ignore_index", -100)
    cfg = None if chunk is None else CrossEntropyConfig(chunk_tokens=chunk)
    loss = pk.linear_cross_entropy(x, w, target, bias=b, config=cfg, **kw)
    ins = [t for t in (x, w, b) if t is not None]
    grads = torch.autograd.grad(loss * 1.5, ins)
    ds = [t.detach().double().requires_grad_() for t in ins]
    ref = ce_ref.linear_cross_entropy(ds[0], ds[1], target, ds[2] if b is not None else None, **kw)
    rgrads = torch.autograd.grad(ref * 1.5, ds)
    assert loss.dtype == F32 and loss.shape == ()
    # the chunk's logits are the GEMM's bf16 output: their rounding (2**-9 relative) moves
    # the loss by ~1e-4 of itself
    assert abs(loss.item() - ref.item()) < 1e-3 * max(1.0, abs(ref.item()))
    for g, r, t in zip(grads, rgrads, ins):
        assert g.dtype == t.dtype and g.shape == t.shape
        assert _rel(g, r) < 1e-2


def test_linear_cross_entropy_without_grad_skips_the_backward(models, monkeypatch):
    x, w = _leaf(6, 16).detach(), _leaf(30, 16, seed=1).detach()
    target = torch.randint(0, 30, (6,))
    seen = []
    monkeypatch.setattr(ce_host, "rows", lambda *a: seen.append(a[6]) or _ce_rows_model(*a))
    loss = pk.linear_cross_entropy(x, w, target)
    ref = ce_ref.linear_cross_entropy(x, w, target)
    assert seen == [False] and abs(loss.item() - ref.item()) < 1e-3 * abs(ref.item())


# ------------------------------------------------------------------------ torch.compile
class _Block(torch.nn.Module):
    def __init__(self, d=32, v=64):
        super().__init__()
        p = lambda *s: torch.nn.Parameter(torch.randn(*s).to(BF))  # noqa: E731
        self.norm, self.head = p(d), p(v, d)

    def forward(self, x, r, cos, sin, target):
        y, h = pk.add_rms_norm(x, r, self.norm)
        q = y.reshape(x.shape[0], x.shape[1], 4, -1).transpose(1, 2)
        q, k = pk.apply_rotary(q, q[:, :2], cos, sin)
        z = (q.transpose(1, 2).reshape(x.shape) + h)
        return pk.linear_cross_entropy(z, self.head, target) + k.float().sum()


def test_compile_traces_the_fused_ops():
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = _Block().to("meta")
    x, r = (torch.empty(2, 6, 32, dtype=BF, device="meta", requires_grad=True) for _ in "xr")
    cos, sin = (torch.empty(6, 8, dtype=BF, device="meta") for _ in "cs")
    target = torch.empty(2, 6, dtype=torch.long, device="meta")
    y = torch.compile(model, fullgraph=True, backend=record)(x, r, cos, sin, target)
    assert y.shape == () and len(graphs) == 1
    targets = {str(n.target).removesuffix(".default") for n in graphs[0].graph.nodes
               if n.op == "call_function"}
    assert {"pyptx.add_rms_norm", "pyptx.rotary", "pyptx.linear_cross_entropy"} <= targets
    torch._dynamo.reset()
    y = torch.compile(model, fullgraph=True, backend="aot_eager")(x, r, cos, sin, target)
    y.backward()
    assert x.grad.shape == x.shape and model.head.grad.shape == model.head.shape
    torch._dynamo.reset()


# ------------------------------------------------------------------------ bad input
HERE = str(Path(__file__).resolve())
_x = torch.empty(2, 3, 8, dtype=BF, device="meta")
BAD = [
    (lambda: pk.add_rms_norm(_x, _x[:, :2], _x.new_empty(8)), "same shape"),
    (lambda: pk.add_rms_norm(_x, _x, _x.new_empty(7)), "weight must have shape"),
    (lambda: pk.apply_rotary(_x, _x, _x[0], _x[0]), "4-D"),
    (lambda: pk.apply_rotary(_x[None], _x[None], _x[0], _x[0], layout="sbhd"), "layout"),
    (lambda: pk.apply_rotary(_x[None], _x[None][:, :, :, :6], _x[0], _x[0]), "k must share"),
    (lambda: pk.apply_rotary(_x[None], _x[None], _x[0, :2], _x[0]), "cos must have shape"),
    (lambda: pk.linear_cross_entropy(_x, _x.new_empty(5, 7), torch.empty(
        2, 3, dtype=torch.long, device="meta")), "weight"),
    (lambda: pk.linear_cross_entropy(_x.float(), _x.new_empty(5, 8).float(), torch.empty(
        2, 3, dtype=torch.long, device="meta")), "bfloat16"),
    (lambda: pk.linear_cross_entropy(_x, _x.new_empty(5, 8), torch.empty(
        2, 4, dtype=torch.long, device="meta")), "target must be"),
    (lambda: pk.linear_cross_entropy(_x, _x.new_empty(5, 8), torch.empty(
        2, 3, dtype=torch.long, device="meta"), reduction="none"), "reduction"),
    (lambda: pk.linear_cross_entropy(_x, _x.new_empty(5, 8), torch.empty(
        2, 3, dtype=torch.long, device="meta"), label_smoothing=1.5), "label_smoothing"),
    (lambda: CrossEntropyConfig(threads=48), "multiple of 32"),
]


@pytest.mark.parametrize("case,match", BAD)
def test_bad_input_names_the_caller(case, match):
    with pytest.raises(PyptxError, match=match) as e:
        case()
    assert str(e.value).startswith(HERE + ":"), str(e.value)


# ------------------------------------------------- the host paths on the simulated kernels
def _np(t):
    t = t.detach().contiguous()
    if t.dtype is BF:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _torch(a, like_dtype):
    if like_dtype is BF:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(BF)
    return torch.from_numpy(np.ascontiguousarray(a).view(np.float32))


def _simulated(k):
    """A callable running kernel (or ``TwoStage``) ``k`` in ``ptxsim`` on torch CPU tensors,
    writing its inputs back (in-place kernels)."""
    if hasattr(k, "kernels"):
        first, colsum = (_simulated(s) for s in k.kernels)

        def two(*args):
            *outs, part = first(*args)
            return (*outs, colsum(part))
        return two
    spec = k.specialize()
    dts = [BF if s.dtype.name == "bf16" else F32 for s in spec.kernel.out_specs]

    def run(*args):
        arrays = [_np(a) for a in args]
        outs = sim.run(spec, arrays, inplace=True)
        for a, arr in zip(args, arrays):
            if a.dtype in (BF, F32):
                a.copy_(_torch(arr, a.dtype).reshape(a.shape))
        got = tuple(_torch(o, d) for o, d in zip(outs, dts))
        return got if len(got) > 1 else got[0]
    return run


@pytest.fixture
def simulated(monkeypatch):
    """The GEMM as a float64 model, the fused ops' real kernels in the simulator."""
    monkeypatch.setattr(_common, "check_devices", lambda *a: None)
    monkeypatch.setattr(gemm_api, "_mm", lambda a, b, bias, out, trans_b=False: _mm_model(
        a, b, bias, out))
    monkeypatch.setattr(gemm_host, "_matmul_residual", _mm_residual_model)
    build, rope, ce = rows_api._build, rows_api._rope_kernel, ce_host._row_kernel
    monkeypatch.setattr(rows_api, "_build", lambda *a, **kw: _simulated(build(*a, **kw)))
    monkeypatch.setattr(rows_api, "_rope_kernel", lambda *a: _simulated(rope(*a)))
    monkeypatch.setattr(ce_host, "_row_kernel", lambda *a: _simulated(ce(*a)))


def test_add_rms_norm_on_the_simulated_kernels(simulated):
    x, r, w = _leaf(2, 3, 40, dtype=F32), _leaf(2, 3, 40, dtype=F32, seed=1), _leaf(
        40, dtype=F32, seed=2)
    y, h = pk.add_rms_norm(x, r, w)
    gy, gh = torch.randn_like(y), torch.randn_like(h)
    grads = torch.autograd.grad((y * gy).sum() + (h * gh).sum(), (x, r, w))
    xs = [t.detach().double().requires_grad_() for t in (x, r, w)]
    hd = xs[0] + xs[1]
    yd = hd * torch.rsqrt((hd * hd).mean(-1, keepdim=True) + 1e-6) * xs[2]
    refs = torch.autograd.grad((yd * gy.double()).sum() + (hd * gh.double()).sum(), xs)
    assert _rel(y, yd) < 1e-6 and _rel(h, hd) < 1e-6
    for g, ref in zip(grads, refs):
        assert _rel(g, ref) < 1e-5


def test_apply_rotary_on_the_simulated_kernel(simulated):
    B, Hq, Hk, S, D = 2, 4, 2, 5, 16
    q, k = _leaf(B, S, Hq, D, dtype=F32), _leaf(B, S, Hk, D, dtype=F32, seed=1)
    ang = torch.randn(B, S, D // 2, dtype=torch.float64)
    ang = torch.cat([ang, ang], -1)
    qv, kv = q.transpose(1, 2), k.transpose(1, 2)
    qo, ko = pk.apply_rotary(qv, kv, ang.cos().float(), ang.sin().float())
    c4, s4 = ang.cos()[:, None], ang.sin()[:, None]
    assert _rel(qo, _hf_rotate(qv.double(), c4, s4)) < 1e-6
    assert _rel(ko, _hf_rotate(kv.double(), c4, s4)) < 1e-6
    g = torch.randn_like(qo)
    (dq,) = torch.autograd.grad((qo * g).sum(), (q,))
    qd = q.detach().double().requires_grad_()
    (rdq,) = torch.autograd.grad((_hf_rotate(qd.transpose(1, 2), c4, s4) * g.double()).sum(),
                                 (qd,))
    assert _rel(dq, rdq) < 1e-6


@pytest.mark.parametrize("kw", [{}, dict(label_smoothing=0.1, z_loss=1e-3)])
def test_linear_cross_entropy_on_the_simulated_kernel(simulated, kw):
    """The real row kernel (in place over the chunk's bf16 logits) under the chunk loop."""
    x, w = _leaf(2, 9, 16), _leaf(50, 16, seed=1, scale=0.5)
    target = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(5))
    target[0, 2] = -100
    cfg = CrossEntropyConfig(chunk_tokens=7, threads=32, unroll=1)
    loss = pk.linear_cross_entropy(x, w, target, config=cfg, **kw)
    gx, gw = torch.autograd.grad(loss, (x, w))
    xd, wd = (t.detach().double().requires_grad_() for t in (x, w))
    ref = ce_ref.linear_cross_entropy(xd, wd, target, **kw)
    rgx, rgw = torch.autograd.grad(ref, (xd, wd))
    assert abs(loss.item() - ref.item()) < 1e-3 * abs(ref.item())
    assert _rel(gx, rgx) < 2e-2 and _rel(gw, rgw) < 2e-2


def test_ptx_names_each_fused_ops_kernels():
    """``pyptx_kernels.ptx`` on meta tensors: the kernels each call would launch (the
    backward ones where an input requires grad; the cross-entropy's row kernel per chunk)."""
    x = torch.empty(2, 3, 64, dtype=BF, device="meta", requires_grad=True)
    assert list(pk.ptx(pk.add_rms_norm, x, x, x.new_empty(64))) == [
        "add_rms_norm_bf16", "add_rms_norm_bwd_bf16", "add_rms_norm_dw_bf16"]
    q = torch.empty(2, 4, 5, 64, dtype=BF, device="meta")
    c = torch.empty(5, 64, dtype=BF, device="meta")
    assert list(pk.ptx(pk.apply_rotary, q, q[:, :2], c, c)) == ["rope_bf16"]
    w = torch.empty(100, 64, dtype=BF, device="meta")
    t = torch.empty(2, 3, dtype=torch.long, device="meta")
    assert list(pk.ptx(pk.linear_cross_entropy, x, w, t)) == ["cross_entropy_rows_bf16"]
    assert list(pk.ptx(pk.linear_cross_entropy, x.detach(), w, t)) == [
        "cross_entropy_rows_fwd_bf16"]
