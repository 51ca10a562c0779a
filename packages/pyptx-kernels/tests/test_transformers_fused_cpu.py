"""CPU tests of ``pyptx_kernels.transformers.apply``'s GEMM epilogues in tiny Llama, Mistral,
Qwen2 and Qwen3 models: ``swiglu_linear`` (the MLP's gate and up projections and SiLU x up
in one gated GEMM over ``pack_gated`` weights) and ``linear_residual`` (``down_proj`` with the
decoder layer's residual add in its epilogue).

The fused ops run their real host code (``pyptx_kernels.gemm.fused``: the packing, the
custom ops, their autograd) with the kernel launch and the backward's GEMMs swapped for
float64 models; the other ops are ``test_transformers_cpu.py``'s float64 stand-ins. In
float32 (the fused GEMMs' dtype gate widened to it) a patched model must reproduce the
unpatched one: loss and the gradient of every parameter, ``gate_proj``/``up_proj`` included.
In bfloat16 the real gate applies and the result agrees within bf16 rounding.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ptf = importlib.import_module("pyptx_kernels.transformers")
pnn = importlib.import_module("pyptx_kernels.nn")
fused = importlib.import_module("pyptx_kernels.gemm.fused")
gemm_api = importlib.import_module("pyptx_kernels.gemm.api")

_spec = importlib.util.spec_from_file_location(
    "pyptx_transformers_cpu_tests", Path(__file__).with_name("test_transformers_cpu.py"))
tt = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # for dynamo
_spec.loader.exec_module(tt)

BF = torch.bfloat16
ALL_ON = dict(swiglu_linear=True, linear_residual=True)
ALL_OFF = dict(swiglu_linear=False, linear_residual=False)


def _launch_model(x, w, *, activation=None, residual=None):
    """A float64 model of ``fused._launch``'s kernel, rounded to its output dtype."""
    h = x.double() @ w.double().T
    if activation == "swiglu":
        b = h.reshape(h.shape[0], -1, 2, 64)
        h = (torch.nn.functional.silu(b[:, :, 0]) * b[:, :, 1]).reshape(h.shape[0], -1)
    if residual is not None:
        h = h + residual.double()
    return h.to(residual.dtype if residual is not None else x.dtype)


@pytest.fixture
def ops(monkeypatch):
    """The float64 stand-ins of ``test_transformers_cpu.py`` and the fused GEMMs' kernels
    (counted in ``ops.count`` as ``swiglu_linear`` and ``linear_residual``)."""
    rec = tt._nn_tests.Ops()
    for area, name, fn in [("rows", "rms_norm", tt._nn_tests.ref_rms_norm),
                           ("gemm", "linear", tt._nn_tests.ref_linear),
                           ("flash_attention", "attention", tt._nn_tests.ref_attention),
                           ("rows", "add_rms_norm", tt.ref_add_rms_norm),
                           ("rows", "apply_rotary", tt.ref_apply_rotary),
                           ("rows", "swiglu", tt.ref_swiglu),
                           ("cross_entropy", "linear_cross_entropy",
                            tt.ref_linear_cross_entropy)]:
        monkeypatch.setattr(tt._nn_tests._api(monkeypatch, area), name, rec.wrap(name, fn),
                            raising=False)

    def launch(x, w, *, activation=None, residual=None):
        rec.count["swiglu_linear" if activation == "swiglu" else "linear_residual"] += 1
        return _launch_model(x, w, activation=activation, residual=residual)

    monkeypatch.setattr(fused, "_launch", launch)
    monkeypatch.setattr(fused._common, "check_devices", lambda *a: None)
    monkeypatch.setattr(gemm_api, "matmul",
                        lambda a, b, **k: (a.double() @ b.double()).to(a.dtype))
    return rec


@pytest.fixture
def float32_gemms(monkeypatch):
    """The fused GEMMs' dtype gate (``transformers._GEMM_DTYPES`` and ``fused._check``)
    widened to float32, so a float32 model runs them."""
    monkeypatch.setattr(ptf, "_GEMM_DTYPES", (*ptf._GEMM_DTYPES, "float32"))
    check = fused._check

    def meta(t):   # the checks on a bf16 stand-in of each float32 tensor
        if t is None:
            return None
        return torch.empty(t.shape, dtype=BF if t.dtype == torch.float32 else t.dtype,
                           device="meta")

    def widened(who, x, weight, residual):
        check(who, meta(x), meta(weight), meta(residual))

    monkeypatch.setattr(fused, "_check", widened)


def _linears(model):
    return sum(type(m) is torch.nn.Linear for m in model.modules())


@pytest.mark.parametrize("family", sorted(tt.FAMILIES))
@pytest.mark.parametrize("fuse", [ALL_ON, dict(swiglu_linear=True, linear_residual=False),
                                  dict(swiglu_linear=False, linear_residual=True,
                                       add_rms_norm=False), ALL_OFF])
def test_training_step_matches_unpatched(ops, float32_gemms, family, fuse):
    """Loss and every parameter's gradient of a training step equal the unpatched model's;
    the fused GEMMs replace the projections they fuse (2 layers: 2 gated GEMMs instead of 4
    linears and 2 swiglu; 2 residual GEMMs instead of 2 linears)."""
    model = tt._model(family)
    model.train()
    ref = copy.deepcopy(model)
    n_linears = _linears(ref)
    params = dict(model.named_parameters())
    keys = model.state_dict().keys()
    assert ptf.apply(model, **fuse) is model
    assert model.state_dict().keys() == keys
    assert all(p is params[n] for n, p in model.named_parameters())

    ids = tt._ids()
    loss, _, grads = tt._step(model, ids)
    gated, residual = fuse["swiglu_linear"], fuse["linear_residual"]
    assert ops.count["swiglu_linear"] == 2 * gated
    assert ops.count["linear_residual"] == 2 * residual
    assert ops.count["swiglu"] == 2 * (not gated)
    # lm_head runs in linear_cross_entropy; the gated GEMM's backward recomputes the packed
    # projection with one linear
    assert ops.count["linear"] == n_linears - 1 - 4 * gated - 2 * residual + 2 * gated
    assert ops.count["add_rms_norm"] == 2 * fuse.get("add_rms_norm", True)
    rloss, _, rgrads = tt._step(ref, ids)
    tt._close(loss, rloss)
    assert grads.keys() == rgrads.keys()
    for n in grads:
        tt._close(grads[n], rgrads[n], rtol=1e-4, atol=1e-6)


def test_sgd_steps_track_the_unpatched_model(ops, float32_gemms):
    """Three SGD steps: the packing is redone from the updated weights at every forward."""
    model = tt._model("llama")
    ref = copy.deepcopy(model)
    ptf.apply(model, **ALL_ON)
    ids = tt._ids()
    for m in (model, ref):
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        for _ in range(3):
            opt.zero_grad()
            m(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            opt.step()
    for (n, p), (rn, rp) in zip(model.named_parameters(), ref.named_parameters()):
        assert n == rn
        tt._close(p, rp, rtol=1e-4, atol=1e-6)
    assert ops.count["swiglu_linear"] == 6


def test_bfloat16_model_runs_the_fused_gemms(ops):
    """The real dtype gate: a bf16 model takes both fused GEMMs; the loss and gradients agree
    with the unpatched bf16 model within bf16 rounding (the stand-ins round each op's
    output, at other points than torch does)."""
    ref = tt._model("qwen3").to(BF)
    model = ptf.apply(copy.deepcopy(ref), **ALL_ON)
    ids = tt._ids()
    loss, _, grads = tt._step(model, ids)
    assert ops.count["swiglu_linear"] == ops.count["linear_residual"] == 2
    rloss, _, rgrads = tt._step(ref, ids)
    assert abs(loss.item() - rloss.item()) < 1e-2 * rloss.item()
    for n in grads:
        g, r = grads[n].double(), rgrads[n].double()
        assert ((g - r).norm() / r.norm()).item() < 3e-2, n


def test_defaults_and_calls_that_do_not_fit(ops):
    """``apply(model)`` fuses ``down_proj`` + residual and leaves the gate/up GEMMs to
    ``swiglu`` (the faster default); float32 activations, MLP biases and an intermediate
    size off the 64-row blocks run unfused, with the same result."""
    ids = tt._ids()
    model = ptf.apply(tt._model("llama").to(BF))
    tt._step(model, ids)
    assert ops.count["linear_residual"] == 2 and ops.count["swiglu_linear"] == 0
    ops.count.clear()
    ptf.apply(model, swiglu_linear=True)   # turned on later
    tt._step(model, ids)
    assert ops.count["swiglu_linear"] == 2 and ops.count["swiglu"] == 0
    for kw in (dict(), dict(mlp_bias=True), dict(intermediate_size=96)):
        torch.manual_seed(0)
        ref = transformers.AutoModelForCausalLM.from_config(
            transformers.LlamaConfig(**{**tt.TINY, **kw}), attn_implementation="sdpa")
        ref = ref.to(BF) if kw else ref.float()
        model = ptf.apply(copy.deepcopy(ref), **ALL_ON)
        ops.count.clear()
        loss = tt._step(model, ids)[0]
        rloss = tt._step(ref, ids)[0]
        assert ops.count["swiglu_linear"] == 0, kw
        assert ops.count["linear_residual"] == (2 if "intermediate_size" in kw else 0), kw
        assert abs(loss.item() - rloss.item()) < 1e-2 * rloss.item()


def test_training_step_compiles_fullgraph(ops, float32_gemms):
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    ref = tt._model("mistral")
    model = ptf.apply(copy.deepcopy(ref), **ALL_ON)
    ids = tt._ids()
    loss = torch.compile(model, fullgraph=True, backend=record)(input_ids=ids, labels=ids).loss
    loss.backward()
    targets = Counter(str(n.target).removesuffix(".default") for n in graphs[0].graph.nodes
                      if n.op == "call_function")
    assert targets["pyptx.swiglu_linear"] == targets["pyptx.linear_residual"] == 2
    tt._close(loss.detach(), ref(input_ids=ids, labels=ids).loss.detach())
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    loss, _, grads = tt._step(model, ids)
    rgrads = tt._step(ref, ids)[2]
    for n in grads:
        tt._close(grads[n], rgrads[n], rtol=1e-4, atol=1e-6)
