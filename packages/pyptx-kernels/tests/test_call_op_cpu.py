"""``pyptx_kernels._common.call_op``: a plain eager call runs the op's implementation (and its
registered autograd) without the dispatcher, with the same values and gradients as the op;
traced and meta calls go through the op. The direct path is shown on CPU tensors here by
adding ``"cpu"`` to ``EAGER_DEVICES`` for a toy op."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pyptx_kernels import _common  # noqa: E402

CALLS = []


def _impl(x, w, scale):
    CALLS.append("impl")
    return x * w * scale, (x * 0).to(torch.int32)


def _fake(x, w, scale):
    return torch.empty_like(x), torch.empty_like(x, dtype=torch.int32)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.scale = inputs[2]


def _backward(ctx, grad, _):
    x, w = ctx.saved_tensors
    return grad * w * ctx.scale, (grad * x * ctx.scale).sum(0), None


@pytest.fixture
def toy(monkeypatch):
    _common.torch_op("test_call_op_toy", "(Tensor x, Tensor w, float scale) -> (Tensor, Tensor)",
                     _impl, _fake, _backward, _setup)
    monkeypatch.setattr(_common, "EAGER_DEVICES", ("cuda", "cpu"))
    CALLS.clear()


def test_direct_path_matches_the_op(toy):
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y, flags = _common.call_op("test_call_op_toy", x, w, 0.5)
    assert CALLS == ["impl"] and not flags.requires_grad
    g = torch.randn_like(y)
    y.backward(g)
    dx, dw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    y2, _ = torch.ops.pyptx.test_call_op_toy(x, w, 0.5)
    y2.backward(g)
    assert torch.equal(y, y2) and torch.equal(dx, x.grad) and torch.equal(dw, w.grad)
    with torch.no_grad():
        out, _ = _common.call_op("test_call_op_toy", x, w, 0.5)
    assert out.grad_fn is None


def test_meta_and_traced_calls_take_the_op(toy):
    x = torch.empty(4, 3, device="meta")
    y, _ = _common.call_op("test_call_op_toy", x, torch.empty(3, device="meta"), 1.0)
    assert y.device.type == "meta" and CALLS == []

    @torch.compile(backend="eager", fullgraph=True)
    def f(a, b):
        return _common.call_op("test_call_op_toy", a, b, 2.0)[0] + 1

    a, b = torch.randn(4, 3), torch.randn(3)
    assert torch.allclose(f(a, b), a * b * 2 + 1)


def test_parameters_take_the_direct_path(toy):
    x = torch.randn(4, 3, dtype=torch.float64)
    w = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))
    y, _ = _common.call_op("test_call_op_toy", x, w, 0.5)
    assert CALLS == ["impl"] and "test_call_op_toy_eager" in type(y.grad_fn).__name__
    y.sum().backward()
    assert torch.allclose(w.grad, (x * 0.5).sum(0))


def test_other_subclasses_take_the_op(toy, monkeypatch):
    class Sub(torch.Tensor):
        pass

    def direct(*args):
        raise AssertionError("a subclass took the direct path")

    monkeypatch.setitem(_common._EAGER, "test_call_op_toy", (direct, None))
    x = torch.randn(4, 3, dtype=torch.float64).as_subclass(Sub)
    y, _ = _common.call_op("test_call_op_toy", x, torch.randn(3, dtype=torch.float64), 0.5)
    assert CALLS == ["impl"] and y.shape == (4, 3)
