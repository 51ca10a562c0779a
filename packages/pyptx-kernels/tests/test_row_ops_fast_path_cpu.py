"""The CUDA fast paths of ``add_rms_norm``, ``swiglu`` and ``apply_rotary`` (the checks'
dtype/device shortcut, 2-D rows taken as they are, ``call_op``'s direct eager path, the rope
kernel's 4-D specs) on CPU tensors that pass for CUDA ones: the same values, gradients,
strides and launch shapes as the float64 models, and every bad input still raises at the
caller's line."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import pyptx_kernels as pk  # noqa: E402
from pyptx_kernels import _common  # noqa: E402
from pyptx_kernels.rows import api  # noqa: E402

from pyptx.errors import PyptxError  # noqa: E402

F32, BF = torch.float32, torch.bfloat16
HERE = str(Path(__file__).resolve())


def _add_rms_model(x, r, w, eps):
    assert x.is_contiguous() and x.dim() == 2 and r.shape == x.shape
    h = (x.double() + r.double()).to(x.dtype)
    hd = h.double()
    y = hd * torch.rsqrt((hd * hd).mean(-1, keepdim=True) + eps) * w.double()
    return y.to(x.dtype), h


def _add_rms_grads(gy, gh, h, w, eps):
    assert all(t.is_contiguous() and t.dim() == 2 for t in (gy, gh, h))
    hd, wd = h.double(), w.double()
    r = torch.rsqrt((hd * hd).mean(-1, keepdim=True) + eps)
    g = wd * gy.double()
    dx = r * g - hd * r ** 3 * (g * hd).mean(-1, keepdim=True) + gh.double()
    return dx.to(h.dtype), (gy.double() * hd * r).sum(0).to(w.dtype)


def _swiglu_model(g, u):
    assert g.is_contiguous() and u.is_contiguous() and g.dim() == 2
    return (torch.nn.functional.silu(g.double()) * u.double()).to(g.dtype)


def _rope_model(B, Hq, Hk, S, D, dtype, cb, layout, transpose):
    """A float64 model of ``build_rope`` that asserts its inputs match the kernel's specs."""
    from pyptx_kernels.rows.rope import build_rope

    specs = [tuple(t.dims) for t in build_rope(B, Hq, Hk, S, D, dtype, cos_batch=cb,
                                                layout=layout, transpose=transpose).in_specs]

    def run(q, k, c, s):
        for t, spec in zip((q, k, c, s), specs):
            assert t.is_contiguous() and tuple(t.shape) == spec, (t.shape, spec)
        out = []
        for x in (q, k):
            cc, ss = (t.double()[:, None] if layout == "bhsd" else t.double()[:, :, None]
                      for t in (c, s))
            xd, h = x.double(), D // 2
            x1, x2 = xd[..., :h], xd[..., h:]
            if transpose:
                y = torch.cat([x1 * cc[..., :h] + x2 * ss[..., h:],
                               x2 * cc[..., h:] - x1 * ss[..., :h]], -1)
            else:
                y = torch.cat([x1 * cc[..., :h] - x2 * ss[..., :h],
                               x2 * cc[..., h:] + x1 * ss[..., h:]], -1)
            out.append(y.to(x.dtype))
        return tuple(out)
    return run


@pytest.fixture
def fast(monkeypatch):
    """CPU tensors pass for CUDA ones; the kernels are float64 models."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(_common, "EAGER_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(api, "_add_rms_norm", _add_rms_model)
    monkeypatch.setattr(api, "_add_rms_norm_backward", _add_rms_grads)
    monkeypatch.setattr(api, "_swiglu", _swiglu_model)
    monkeypatch.setattr(api, "_swiglu_kernel_takes", lambda *a: False)   # torch's f32 ops
    monkeypatch.setattr(api, "_rope_kernel", _rope_model)
    api._define()
    for name, impl in (("add_rms_norm", lambda *a: api._add_rms_norm(*a)),
                       ("swiglu", lambda *a: api._swiglu(*a))):
        old = _common._EAGER[name]
        monkeypatch.setitem(_common._EAGER, name, (impl, old[1]))


def _leaf(*shape, dtype=F32, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_()


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-300)).item()


@pytest.mark.parametrize("shape", [(6, 64), (2, 3, 64)])
def test_add_rms_norm_fast_path(fast, shape):
    x, r, w = _leaf(*shape), _leaf(*shape, seed=1), _leaf(shape[-1], seed=2)
    y, h = pk.add_rms_norm(x, r, w, eps=1e-5)
    assert y.shape == h.shape == x.shape
    gy, gh = torch.randn_like(y), torch.randn_like(h)
    dx, dr, dw = torch.autograd.grad((y * gy).sum() + (h * gh).sum(), (x, r, w))
    xs = [t.detach().double().requires_grad_() for t in (x, r, w)]
    hd = xs[0] + xs[1]
    yd = hd * torch.rsqrt((hd * hd).mean(-1, keepdim=True) + 1e-5) * xs[2]
    ref = torch.autograd.grad((yd * gy.double()).sum() + (hd * gh.double()).sum(), xs)
    for got, want in ((y, yd), (h, hd), (dx, ref[0]), (dr, ref[1]), (dw, ref[2])):
        assert got.shape == want.shape and _rel(got, want) < 1e-6
    with torch.no_grad():
        y2, _ = pk.add_rms_norm(x, r, w, eps=1e-5)
    assert torch.equal(y2, y.detach())


@pytest.mark.parametrize("shape", [(6, 64), (2, 3, 64)])
def test_swiglu_fast_path(fast, shape):
    g, u = _leaf(*shape), _leaf(*shape, seed=1)
    y = pk.swiglu(g, u)
    gy = torch.randn_like(y)
    dg, du = torch.autograd.grad((y * gy).sum(), (g, u))
    gd, ud = (t.detach().double().requires_grad_() for t in (g, u))
    yd = torch.nn.functional.silu(gd) * ud
    rg, ru = torch.autograd.grad((yd * gy.double()).sum(), (gd, ud))
    assert y.shape == g.shape and _rel(y, yd) < 1e-6
    assert _rel(dg, rg) < 1e-6 and _rel(du, ru) < 1e-6


def _hf(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


@pytest.mark.parametrize("stored", ["bhsd", "bshd", "bshd-given"])
@pytest.mark.parametrize("table", ["2d", "one", "per-seq"])
def test_apply_rotary_fast_path(fast, stored, table):
    B, Hq, Hk, S, D = 2, 4, 2, 5, 16
    ang = torch.randn(B if table == "per-seq" else 1, S, D // 2, dtype=torch.float64)
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().float(), ang.sin().float()
    if table == "2d":
        cos, sin = cos[0], sin[0]
    if stored == "bhsd":
        q, k = _leaf(B, Hq, S, D), _leaf(B, Hk, S, D, seed=1)
        qv, kv = q, k
    else:
        q, k = _leaf(B, S, Hq, D), _leaf(B, S, Hk, D, seed=1)
        qv, kv = q.transpose(1, 2), k.transpose(1, 2)
    if stored == "bshd-given":
        qo, ko = pk.apply_rotary(q, k, cos, sin, layout="bshd")
        assert qo.is_contiguous() and qo.shape == q.shape
        qo, ko = qo.transpose(1, 2), ko.transpose(1, 2)
    else:
        qo, ko = pk.apply_rotary(qv, kv, cos, sin)
        assert qo.shape == qv.shape and ko.shape == kv.shape
        assert qo.stride() == qv.stride() and ko.stride() == kv.stride()  # no copy
    c4 = cos.double()[:, None] if cos.dim() == 3 else cos.double()
    s4 = sin.double()[:, None] if sin.dim() == 3 else sin.double()
    assert _rel(qo, _hf(qv.double(), c4, s4)) < 1e-6 and _rel(ko, _hf(kv.double(), c4, s4)) < 1e-6
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    dq, dk = torch.autograd.grad((qo * gq).sum() + (ko * gk).sum(), (q, k))
    xs = [t.detach().double().requires_grad_() for t in (q, k)]
    xv = xs if stored == "bhsd" else [t.transpose(1, 2) for t in xs]
    ref = (_hf(xv[0], c4, s4) * gq.double()).sum() + (_hf(xv[1], c4, s4) * gk.double()).sum()
    rdq, rdk = torch.autograd.grad(ref, xs)
    assert dq.shape == q.shape and _rel(dq, rdq) < 1e-6 and _rel(dk, rdk) < 1e-6


_x = torch.zeros(2, 3, 8)
BAD = [
    (lambda: pk.add_rms_norm(_x, _x[:, :2], _x.new_empty(8)), "same shape"),
    (lambda: pk.add_rms_norm(_x, _x, _x.new_empty(7)), "weight must have shape"),
    (lambda: pk.add_rms_norm(_x, _x.to(BF), _x.new_empty(8)), "dtype"),
    (lambda: pk.add_rms_norm(_x.double(), _x.double(), _x.new_empty(8).double()), "float32"),
    (lambda: pk.add_rms_norm(_x.new_empty(2, 9000).requires_grad_(), _x.new_empty(2, 9000),
                             _x.new_empty(9000)), "backward kernel"),
    (lambda: pk.add_rms_norm(_x[..., :0], _x[..., :0], _x.new_empty(0)), "N >= 1"),
    (lambda: pk.swiglu(_x, _x[:, :2]), "same shape"),
    (lambda: pk.swiglu(_x, _x.to(BF)), "dtype"),
    (lambda: pk.swiglu(_x.new_empty(2, 40000), _x.new_empty(2, 40000)), "at most"),
    (lambda: pk.apply_rotary(_x, _x, _x[0], _x[0]), "4-D"),
    (lambda: pk.apply_rotary(_x[None], _x[None], _x[0], _x[0], layout="sbhd"), "layout"),
    (lambda: pk.apply_rotary(_x[None], _x[None][:, :, :, :6], _x[0], _x[0]), "k must share"),
    (lambda: pk.apply_rotary(_x[None], _x[None], _x[0, :2], _x[0]), "cos must have shape"),
    (lambda: pk.apply_rotary(_x[None], _x[None], _x[0], _x[0].to(BF)), "dtype"),
]


@pytest.mark.parametrize("case,match", BAD)
def test_bad_input_on_the_fast_path_names_the_caller(fast, case, match):
    with pytest.raises(PyptxError, match=match) as e:
        case()
    assert str(e.value).startswith(HERE + ":"), str(e.value)


def test_devices_checked_on_the_fast_path(monkeypatch):
    """"CUDA" tensors of one device pass; of two devices, or CPU ones, are refused."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: getattr(self, "_dev", 0))
    a, b, c = torch.zeros(2, 8), torch.zeros(2, 8), torch.zeros(2, 8)
    c._dev = 1
    _common.check_devices("t", a, b, None)
    with pytest.raises(PyptxError):
        _common.check_devices("t", a, c)
    monkeypatch.undo()
    with pytest.raises(PyptxError, match="CUDA tensors"):
        _common.check_devices("t", a, b)


@pytest.mark.parametrize("shape", [(2, 3, 5, 8), (1, 3, 5, 8), (2, 1, 5, 8), (2, 3, 1, 8),
                                   (1, 1, 1, 8), (2, 3, 5, 1)])
def test_memory_layout_from_strides(shape):
    """``_memory`` judges ``q.transpose(1, 2).is_contiguous()`` from the strides, as torch does."""
    base = torch.zeros(*shape)
    views = [base, base.transpose(1, 2), base.transpose(0, 1), base[..., ::2],
             base.permute(0, 2, 3, 1), torch.zeros(shape[0], shape[2], shape[1], shape[3])
             .transpose(1, 2)]
    for v in views:
        for layout, other in (("bhsd", "bshd"), ("bshd", "bhsd")):
            swapped = not v.is_contiguous() and v.transpose(1, 2).is_contiguous()
            assert api._memory(v, layout) == (other if swapped else layout), (v.shape, v.stride())


def test_swapped_rotary_takes_the_direct_autograd(fast, monkeypatch):
    """A ``(B, S, H, D)``-stored q with grad: one autograd node of the swapped op."""
    calls = []
    real = _common.call_function
    monkeypatch.setattr(_common, "call_function", lambda *a: calls.append(a[0]) or real(*a))
    q, k = _leaf(1, 4, 2, 8), _leaf(1, 4, 1, 8, seed=1)
    c = torch.ones(4, 8)
    qo, ko = pk.apply_rotary(q.transpose(1, 2), k.transpose(1, 2), c, c * 0)
    assert calls == ["rotary_swapped"] and torch.equal(qo, q.transpose(1, 2))
    with torch.no_grad():
        pk.apply_rotary(q.transpose(1, 2), k.transpose(1, 2), c, c * 0)
    assert calls == ["rotary_swapped"]
