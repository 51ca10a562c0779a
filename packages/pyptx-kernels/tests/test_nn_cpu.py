"""CPU tests of ``pyptx_kernels.nn``: the drop-in modules against torch's own.

The functional ops the modules call (``pyptx_kernels.{rows,gemm,attention}.api``) are
replaced by float64 models of what they compute, rounded to the input type
(``ops`` fixture; ``test_transformers_cpu.py`` uses it too), so constructor, init,
``state_dict``, ``from_torch`` sharing, the forward wiring and gradients are checked
against torch's modules without a GPU.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections import Counter

import pytest

from pyptx.errors import ConfigError

torch = pytest.importorskip("torch")
nn = importlib.import_module("pyptx_kernels.nn")
HERE = __file__


def _api(monkeypatch, area):
    """``pyptx_kernels.<area>.api`` (a stand-in module while it does not exist yet)."""
    name = f"pyptx_kernels.{area}.api"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        module = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, module)
        return module


def ref_rms_norm(x, weight, eps=1e-6):
    xd = x.double()
    y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    return y.to(x.dtype)


def ref_layer_norm(x, weight, bias=None, eps=1e-5):
    xd = x.double()
    y = (xd - xd.mean(-1, keepdim=True)) * torch.rsqrt(xd.var(-1, unbiased=False, keepdim=True)
                                                        + eps) * weight.double()
    return (y if bias is None else y + bias.double()).to(x.dtype)


def ref_linear(x, weight, bias=None):
    y = x.double() @ weight.double().T
    return (y if bias is None else y + bias.double()).to(x.dtype)


def ref_attention(q, k, v, *, causal=False, scale=None, layout="bshd", window=(-1, -1)):
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    Hq, Hkv, S, Sk, D = q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]
    assert Hq % Hkv == 0 and k.shape == v.shape
    kd, vd = (t.double().repeat_interleave(Hq // Hkv, dim=1) for t in (k, v))
    s = (q.double() @ kd.transpose(-1, -2)) * (D ** -0.5 if scale is None else scale)
    i, j = torch.arange(S)[:, None], torch.arange(Sk)[None, :]
    left, right = window
    keep = torch.ones(S, Sk, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    s = s.masked_fill(~keep, float("-inf"))
    o = (s.softmax(-1) @ vd).to(q.dtype)
    return o if layout == "bhsd" else o.transpose(1, 2)


class Ops:
    """The float64 stand-ins, recording each call's op name and arguments."""

    def __init__(self):
        self.calls: list[tuple[str, tuple, dict]] = []
        self.count = Counter()

    def wrap(self, name, fn):
        def op(*args, **kw):
            self.calls.append((name, args, kw))
            self.count[name] += 1
            return fn(*args, **kw)
        return op


@pytest.fixture
def ops(monkeypatch):
    rec = Ops()
    for area, name, fn in [("rows", "rms_norm", ref_rms_norm),
                           ("rows", "layer_norm", ref_layer_norm),
                           ("gemm", "linear", ref_linear),
                           ("flash_attention", "attention", ref_attention)]:
        monkeypatch.setattr(_api(monkeypatch, area), name, rec.wrap(name, fn), raising=False)
    return rec


def _x(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


CASES = [  # (pyptx constructor, torch constructor, op name)
    (lambda: nn.Linear(24, 40), lambda: torch.nn.Linear(24, 40), "linear"),
    (lambda: nn.Linear(24, 40, bias=False), lambda: torch.nn.Linear(24, 40, bias=False), "linear"),
    (lambda: nn.RMSNorm(24), lambda: torch.nn.RMSNorm(24, eps=1e-6), "rms_norm"),
    (lambda: nn.RMSNorm((3, 8), eps=1e-3), lambda: torch.nn.RMSNorm((3, 8), eps=1e-3), "rms_norm"),
    (lambda: nn.RMSNorm(24, elementwise_affine=False),
     lambda: torch.nn.RMSNorm(24, 1e-6, elementwise_affine=False), "rms_norm"),
    (lambda: nn.LayerNorm(24), lambda: torch.nn.LayerNorm(24), "layer_norm"),
    (lambda: nn.LayerNorm((3, 8), bias=False), lambda: torch.nn.LayerNorm((3, 8), bias=False),
     "layer_norm"),
    (lambda: nn.LayerNorm(24, elementwise_affine=False),
     lambda: torch.nn.LayerNorm(24, elementwise_affine=False), "layer_norm"),
]


def _randomize(m, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("make, make_torch, op", CASES)
def test_module_matches_torch(ops, make, make_torch, op):
    """Same init (same seed), same state_dict keys and repr; state_dict loads both ways; the
    forward goes through the pyptx op and matches torch's, gradients included."""
    torch.manual_seed(3)
    ours = make()
    torch.manual_seed(3)
    ref = make_torch()
    assert isinstance(ours, type(ref)) and repr(ours) == repr(ref)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    for k, v in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    _randomize(ref, 5)
    ours.load_state_dict(ref.state_dict())
    back = make_torch()
    back.load_state_dict(ours.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k

    in_shape = (2, 5, 24) if isinstance(ref, torch.nn.Linear) else (2, 5, 3, 8) \
        if tuple(ref.normalized_shape) == (3, 8) else (2, 5, 24)
    x = _x(*in_shape, seed=1).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    y, yr = ours(x), ref(xr)
    assert ops.count == Counter({op: 1})
    torch.testing.assert_close(y, yr, rtol=1e-5, atol=1e-5)
    dy = _x(*y.shape, seed=2)
    y.backward(dy)
    yr.backward(dy)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)
    for (name, p), pr in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, pr.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_op_arguments(ops):
    """What each module hands its op: the Parameters themselves, the trailing normalized dims
    flattened into one, eps, and a ones weight where there is no affine."""
    lin = nn.Linear(8, 4)
    lin(_x(3, 8))
    name, (x, w, b), _ = ops.calls[-1]
    assert name == "linear" and w is lin.weight and b is lin.bias and x.shape == (3, 8)

    norm = nn.RMSNorm((2, 4), eps=1e-3)
    norm(_x(5, 2, 4))
    name, (x, w, eps), _ = ops.calls[-1]
    assert name == "rms_norm" and x.shape == (5, 8) and w.shape == (8,) and eps == 1e-3
    assert w._base is norm.weight or w.data_ptr() == norm.weight.data_ptr()

    nn.RMSNorm(8, eps=None)(_x(5, 8, dtype=torch.float64))
    assert ops.calls[-1][1][2] == torch.finfo(torch.float64).eps

    nn.LayerNorm(8, elementwise_affine=False)(_x(5, 8))
    name, (x, w, b, eps), _ = ops.calls[-1]
    assert name == "layer_norm" and b is None and torch.equal(w, torch.ones(8)) and eps == 1e-5


@pytest.mark.parametrize("torch_module", [
    torch.nn.Linear(6, 5), torch.nn.Linear(6, 5, bias=False), torch.nn.RMSNorm(6, eps=1e-4),
    torch.nn.RMSNorm(6, elementwise_affine=False), torch.nn.LayerNorm((2, 3)),
    torch.nn.LayerNorm(6, bias=False), torch.nn.Linear(6, 5, dtype=torch.float64)])
def test_from_torch_shares_parameters(ops, torch_module):
    torch_module.eval()
    ours = nn.from_torch(torch_module)
    assert type(ours).__name__ == type(torch_module).__name__ and type(ours).__module__ == nn.__name__
    assert not ours.training and repr(ours) == repr(torch_module)
    mine = dict(ours.named_parameters())
    theirs = dict(torch_module.named_parameters())
    assert mine.keys() == theirs.keys() and all(mine[k] is theirs[k] for k in mine)
    assert all(p.device.type == "cpu" for p in ours.parameters())
    assert type(ours).from_torch(torch_module).weight is torch_module.weight
    assert nn.from_torch(ours) is ours
    dtype = torch_module.weight.dtype if torch_module.weight is not None else torch.float32
    x = _x(4, *getattr(torch_module, "normalized_shape", (6,)), dtype=dtype)
    torch.testing.assert_close(ours(x), torch_module(x), rtol=1e-5, atol=1e-5)


def test_from_torch_refuses_other_modules():
    with pytest.raises(ConfigError, match=rf"^{HERE}:\d+: from_torch: no pyptx module for ReLU"):
        nn.from_torch(torch.nn.ReLU())
    with pytest.raises(ConfigError, match=rf"^{HERE}:\d+: from_torch: expected a torch.nn.*"
                                          r"Linear, got LayerNorm"):
        nn.Linear.from_torch(torch.nn.LayerNorm(4))


@pytest.mark.parametrize("make, message", [
    (lambda: nn.Linear(0, 4), "Linear: in_features must be a positive int, got 0"),
    (lambda: nn.Linear(4, 2.5), "Linear: out_features must be a positive int, got 2.5"),
    (lambda: nn.Linear(True, 4), "Linear: in_features must be a positive int, got True"),
    (lambda: nn.RMSNorm(()), "RMSNorm: normalized_shape must be an int or a non-empty tuple"),
    (lambda: nn.RMSNorm("8"), "RMSNorm: normalized_shape must be an int or a non-empty tuple"),
    (lambda: nn.RMSNorm((8, -1)), r"RMSNorm: normalized_shape\[1\] must be a positive int"),
    (lambda: nn.RMSNorm(8, eps=0.0), "RMSNorm: eps must be a positive finite number, got 0.0"),
    (lambda: nn.LayerNorm(8, eps=None), "LayerNorm: eps must be a positive finite number"),
    (lambda: nn.LayerNorm(8, eps=float("nan")), "LayerNorm: eps must be a positive finite"),
])
def test_bad_constructor_args(make, message):
    with pytest.raises(ConfigError, match=rf"^{HERE}:\d+: {message}"):
        make()


def test_bad_input_shape_names_the_caller(ops):
    norm = nn.LayerNorm((3, 8))
    with pytest.raises(ConfigError, match=rf"^{HERE}:\d+: LayerNorm: input's trailing dims "
                                          r"must be \(3, 8\), got shape \(2, 8\)"):
        norm(_x(2, 8))
    with pytest.raises(ConfigError, match=rf"^{HERE}:\d+: RMSNorm: input's trailing dims"):
        nn.RMSNorm((2, 3, 4))(_x(3, 4))
    assert not ops.calls


def test_import_is_lazy():
    """Importing the modules calls no op: the functional API is looked up at forward time."""
    code = ("import sys, pyptx_kernels.nn; "
            "assert not [m for m in sys.modules if m.startswith('pyptx_kernels.') and "
            "m.endswith('.api')], sorted(sys.modules)")
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True)


def test_compiles_without_graph_break(ops):
    """The op lookup is traceable: ``torch.compile(fullgraph=True)`` of the modules."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(nn.Linear(8, 12), torch.nn.Unflatten(-1, (3, 4)),
                                nn.RMSNorm((3, 4)), torch.nn.Flatten(-2), nn.LayerNorm(12))
    x = _x(5, 8)
    want = model(x)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), want)
    assert ops.count == {"linear": 2, "rms_norm": 2, "layer_norm": 2}
