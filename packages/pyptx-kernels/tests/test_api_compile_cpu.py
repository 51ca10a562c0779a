"""``torch.compile(fullgraph=True)`` of a small model built from the public functions, on the
CPU: dynamo traces the custom ops ``torch.ops.pyptx.*`` with no graph break, AOT autograd
traces their fake implementations and backward ops (on meta tensors: nothing launches), and
with the launches swapped for float64 models the compiled forward and backward equal eager
ones."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import pyptx_kernels as pk  # noqa: E402
from pyptx_kernels import _common  # noqa: E402
from pyptx_kernels.gemm import api as gemm_api  # noqa: E402
from pyptx_kernels.rows import api as rows_api  # noqa: E402

BF = torch.bfloat16
OPS = ("matmul", "linear", "rms_norm", "layer_norm", "softmax", "swiglu")


class Tiny(torch.nn.Module):
    """rms_norm -> linear -> swiglu -> matmul (+ bias) -> layer_norm -> softmax."""

    def __init__(self, d=32, hidden=64):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        p = lambda *s: torch.nn.Parameter((torch.randn(*s, generator=g) / 4).to(BF))  # noqa: E731
        self.norm, self.up, self.down = p(d), p(2 * hidden, d), p(d, hidden)
        self.bias, self.ln_w, self.ln_b = p(d), p(d), p(d)

    def forward(self, x):
        h = pk.linear(pk.rms_norm(x, self.norm), self.up)
        h = pk.swiglu(h[..., :h.shape[-1] // 2], h[..., h.shape[-1] // 2:])
        h = pk.matmul(h, self.down.T, bias=self.bias)
        return pk.softmax(pk.layer_norm(h, self.ln_w, self.ln_b))


def test_dynamo_traces_one_graph_of_pyptx_ops():
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = Tiny().to("meta")
    x = torch.empty(2, 37, 32, dtype=BF, device="meta")
    y = torch.compile(model, fullgraph=True, backend=record)(x)
    assert y.shape == (2, 37, 32) and y.dtype == BF
    assert len(graphs) == 1
    targets = {str(n.target).removesuffix(".default") for n in graphs[0].graph.nodes
               if n.op == "call_function"}
    assert {f"pyptx.{op}" for op in OPS} <= targets, targets
    torch._dynamo.reset()
    assert torch._dynamo.explain(Tiny().to("meta"))(x).graph_break_count == 0


def test_aot_autograd_traces_fakes_and_backward_ops():
    model = Tiny().to("meta")
    x = torch.empty(2, 37, 32, dtype=BF, device="meta", requires_grad=True)
    y = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    y.sum().backward()
    assert x.grad.shape == x.shape and x.grad.dtype == BF
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
    torch._dynamo.reset()


def _mm(a, b, bias, out):
    d = a.double() @ b.double()
    return (d if bias is None else d + bias.double()).to(_common.torch_dtype(out))


def _rms(x, w, eps):
    xd = x.double()
    return (xd * torch.rsqrt((xd * xd).mean(-1, keepdim=True) + eps) * w.double()).to(x.dtype)


def _ln(x, w, b, eps):
    return torch.nn.functional.layer_norm(x.double(), (x.shape[-1],), w.double(), b.double(),
                                          eps).to(x.dtype)


def _rms_bwd(dy, x, w, eps):
    dy, xd, wd = dy.double(), x.double(), w.double()
    r = torch.rsqrt((xd * xd).mean(-1, keepdim=True) + eps)
    g = wd * dy
    return ((r * g - xd * r ** 3 * (g * xd).mean(-1, keepdim=True)).to(x.dtype),
            (dy * xd * r).sum(0).to(w.dtype))


def _ln_bwd(dy, x, w, eps):
    dy, xd, wd = dy.double(), x.double(), w.double()
    d = xd - xd.mean(-1, keepdim=True)
    rstd = torch.rsqrt((d * d).mean(-1, keepdim=True) + eps)
    xhat, g = d * rstd, wd * dy
    dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    return dx.to(x.dtype), (dy * xhat).sum(0).to(w.dtype), dy.sum(0).to(w.dtype)


def test_compiled_matches_eager_with_model_launches(monkeypatch):
    monkeypatch.setattr(_common, "check_devices", lambda *a: None)
    monkeypatch.setattr(gemm_api, "_mm", _mm)
    for name, fn in (("_rms_norm", _rms), ("_rms_norm_backward", _rms_bwd), ("_layer_norm", _ln),
                     ("_layer_norm_backward", _ln_bwd),
                     ("_softmax", lambda x: torch.softmax(x.double(), -1).to(x.dtype)),
                     ("_swiglu", lambda g, u: (torch.nn.functional.silu(g.double())
                                               * u.double()).to(g.dtype))):
        monkeypatch.setattr(rows_api, name, fn)
    model = Tiny()
    x = torch.randn(2, 37, 32, generator=torch.Generator().manual_seed(1)).to(BF)
    results = []
    for run in (model, torch.compile(model, fullgraph=True, backend="aot_eager")):
        model.zero_grad()
        xi = x.clone().requires_grad_()
        y = run(xi)
        (y.float() * torch.linspace(-1, 1, 32)).sum().backward()
        results.append([y, xi.grad] + [p.grad.clone() for p in model.parameters()])
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    assert results[0][1].abs().sum() > 0
    torch._dynamo.reset()


def test_inductor_lowers_the_ops_as_registered_fallbacks(monkeypatch):
    """The ops are registered fallback kernels by the time inductor lowers a graph: its
    implicit fallback (torch 2.11) formats every argument's IR eagerly, exponential in the
    graph's depth (an 8-layer Llama spent minutes there)."""
    from torch._inductor import graph, lowering

    monkeypatch.setattr(_common, "check_devices", lambda *a: None)
    monkeypatch.setattr(rows_api, "_rms_norm", _rms)
    implicit = []
    real = graph.make_fallback
    monkeypatch.setattr(graph, "make_fallback",
                        lambda op, *a, **k: (implicit.append(str(op)), real(op, *a, **k))[1])
    _common.define_ops()
    op = torch.ops.pyptx.rms_norm.default
    lowering.lowerings.pop(op, None)
    x = torch.randn(4, 32).to(BF)
    w = (torch.randn(32) / 4).to(BF)
    torch._dynamo.reset()
    y = torch.compile(lambda x, w: pk.rms_norm(x, w) * 2, backend="inductor",
                      fullgraph=True)(x, w)
    torch.testing.assert_close(y, _rms(x, w, 1e-6) * 2, rtol=0, atol=0)
    assert op in lowering.lowerings
    assert not [o for o in implicit if o.startswith("pyptx")], implicit
    torch._dynamo.reset()


def test_bad_input_under_compile():
    """Without ``fullgraph`` dynamo falls back to eager and the ``PyptxError`` names the line;
    with it, dynamo's error carries the message (a trace has no frames to name)."""
    from pyptx.errors import ShapeError

    x = torch.empty(2, 64, dtype=BF, device="meta")
    w = torch.empty(32, dtype=BF, device="meta")

    def f(x, w):
        return pk.rms_norm(x, w)

    with pytest.raises(ShapeError) as info:
        torch.compile(f, backend="eager")(x, w)
    line = f.__code__.co_firstlineno + 1       # f's call of rms_norm
    assert str(info.value).startswith(f"{__file__}:{line}: rms_norm: weight")
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"<torch.compile>: rms_norm: weight must have shape"):
        torch.compile(f, fullgraph=True, backend="eager")(x, w)
    torch._dynamo.reset()
