"""CPU tests of ``pyptx_kernels.transformers``: ``apply`` and the ``"pyptx"`` attention
implementation in tiny Llama, Mistral, Qwen2 and Qwen3 models.

The functional ops are the float64 models of ``test_nn_cpu.py`` plus those of the fused ops
(``add_rms_norm``, ``apply_rotary``, ``swiglu``, ``linear_cross_entropy``; ``ops`` fixture),
so a patched model must reproduce the unpatched one (a deep copy, SDPA attention) in float32:
loss and every gradient of a training step, logits in eval mode, decoding with a cache,
padding masks (which fall back to SDPA). Module swaps and op calls are counted: every
``<Family>RMSNorm`` and every ``nn.Linear``, ``lm_head`` included. A bf16 Llama of head dim
64 decodes through ``attention_with_kvcache`` (the real function and custom op, its
implementation the float64 reference: ``decode_spy``), eager ``generate()`` and a compiled
step, against the unpatched model.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest

from pyptx.errors import ConfigError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ptf = importlib.import_module("pyptx_kernels.transformers")
pnn = importlib.import_module("pyptx_kernels.nn")
HERE = __file__

_spec = importlib.util.spec_from_file_location("pyptx_nn_cpu_tests",
                                               Path(__file__).with_name("test_nn_cpu.py"))
_nn_tests = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # for dynamo
_spec.loader.exec_module(_nn_tests)


def ref_add_rms_norm(x, residual, weight, eps=1e-6):
    h = (x.double() + residual.double()).to(x.dtype)
    return _nn_tests.ref_rms_norm(h, weight, eps), h


def ref_apply_rotary(q, k, cos, sin, *, layout="bhsd"):
    """transformers' rotation in float64; like the op, a ``(B, S, H, D)``-stored input gives a
    result stored the same way."""
    def rot(x):
        xd = x.double()
        c, s = cos.double(), sin.double()
        c, s = ((t[:, None] if t.dim() == 3 else t) for t in (c, s))
        h = xd.shape[-1] // 2
        y = xd * c + torch.cat((-xd[..., h:], xd[..., :h]), -1) * s
        if not x.is_contiguous() and x.transpose(1, 2).is_contiguous():
            return y.transpose(1, 2).contiguous().to(x.dtype).transpose(1, 2)
        return y.to(x.dtype)
    assert layout == "bhsd"
    return rot(q), rot(k)


def ref_swiglu(gate, up):
    return (torch.nn.functional.silu(gate.double()) * up.double()).to(gate.dtype)


def ref_linear_cross_entropy(x, weight, target, *, bias=None, ignore_index=-100,
                             reduction="mean", **kw):
    from pyptx_kernels.cross_entropy.reference import linear_cross_entropy

    return linear_cross_entropy(x, weight, target, bias, ignore_index=ignore_index,
                                reduction=reduction, **kw).float()


@pytest.fixture
def ops(monkeypatch):
    """``test_nn_cpu.py``'s stand-ins and the fused ops' (float64, rounded to the input type)."""
    rec = _nn_tests.Ops()
    for area, name, fn in [("rows", "rms_norm", _nn_tests.ref_rms_norm),
                           ("rows", "layer_norm", _nn_tests.ref_layer_norm),
                           ("gemm", "linear", _nn_tests.ref_linear),
                           ("flash_attention", "attention", _nn_tests.ref_attention),
                           ("rows", "add_rms_norm", ref_add_rms_norm),
                           ("rows", "apply_rotary", ref_apply_rotary),
                           ("rows", "swiglu", ref_swiglu),
                           ("cross_entropy", "linear_cross_entropy", ref_linear_cross_entropy)]:
        monkeypatch.setattr(_nn_tests._api(monkeypatch, area), name, rec.wrap(name, fn),
                            raising=False)
    return rec


@pytest.fixture
def decode_spy(monkeypatch):
    """``attention_with_kvcache`` on CPU tensors: the real function (checks, strides, the
    ``torch.ops.pyptx`` custom op and its fake) with the op's implementation
    (``decode_api._run_torch``) the float64 ``reference_decode``; each call's arguments
    recorded."""
    from pyptx_kernels import _common
    from pyptx_kernels.flash_attention import decode_api
    from pyptx_kernels.flash_attention.decode_reference import reference_decode

    calls = []

    def run(q, kc, vc, lens, k, v, table, causal, left, right, softcap, scale, splits):
        calls.append(dict(q=q, k_cache=kc, v_cache=vc, lens=lens.clone(), causal=causal,
                          window=(left, right), scale=scale))
        o, lse, _, _ = reference_decode(*(x.double().numpy() for x in (q, kc, vc)),
                                        lens.numpy(), causal=causal, window=(left, right),
                                        softcap=softcap, scale=scale)
        return torch.from_numpy(o).to(q.dtype), torch.from_numpy(lse).float()

    monkeypatch.setattr(_common, "check_devices", lambda *a: None)
    monkeypatch.setattr(decode_api, "_run_torch", run)
    return calls


TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
FAMILIES = {
    "llama": lambda **kw: transformers.LlamaConfig(**TINY, **kw),
    "mistral": lambda **kw: transformers.MistralConfig(**{**TINY, "sliding_window": 64, **kw}),
    "qwen2": lambda **kw: transformers.Qwen2Config(**TINY, **kw),
    "qwen3": lambda **kw: transformers.Qwen3Config(**TINY, head_dim=16, **kw),
}


def _model(family, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = FAMILIES[family](**kw)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float()


def _ids(B=2, S=12, seed=1, vocab=128):
    return torch.randint(0, vocab, (B, S), generator=torch.Generator().manual_seed(seed))


def _step(model, ids, **kw):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids, use_cache=False, **kw)   # training: no KV cache
    out.loss.backward()
    logits = None if out.logits is None else out.logits.detach()
    return out.loss.detach(), logits, {n: p.grad for n, p in model.named_parameters()}


def _close(a, b, **kw):
    torch.testing.assert_close(a, b, rtol=kw.get("rtol", 2e-5), atol=kw.get("atol", 2e-6))


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("tie", [False, True])
def test_apply_training_step_matches_unpatched(ops, family, tie):
    model = _model(family, tie_word_embeddings=tie)
    model.train()
    ref = copy.deepcopy(model)
    norm_cls = ptf._norm_class(family)
    n_norms = sum(type(m) is norm_cls for m in ref.modules())
    n_linears = sum(type(m) is torch.nn.Linear for m in ref.modules())
    params = dict(model.named_parameters())
    keys = model.state_dict().keys()

    assert ptf.apply(model) is model
    assert model.config._attn_implementation == "pyptx"
    kinds = [type(m) for m in model.modules()]
    assert kinds.count(pnn.RMSNorm) == n_norms == 2 * 2 + 1 + (2 * 2 if family == "qwen3" else 0)
    assert kinds.count(pnn.Linear) == n_linears == 2 * 7 + 1
    assert norm_cls not in kinds and torch.nn.Linear not in kinds
    assert isinstance(model.lm_head, pnn.Linear)
    assert model.state_dict().keys() == keys
    assert all(p is params[n] for n, p in model.named_parameters())
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie

    ids = _ids()
    loss, logits, grads = _step(model, ids)
    # the post-attention norms run inside add_rms_norm, lm_head inside linear_cross_entropy
    assert ops.count == {"rms_norm": n_norms - 2, "add_rms_norm": 2, "linear": n_linears - 1,
                         "attention": 2, "apply_rotary": 2, "swiglu": 2,
                         "linear_cross_entropy": 1}
    for name, args, kw in ops.calls:
        if name == "attention":   # the projections' (B, S, H, D) memory, read in place
            q, k, v = args
            assert q.shape == (2, 12, 4, 16) and k.shape == v.shape == (2, 12, 2, 16)
            assert kw == {"causal": True, "scale": 16 ** -0.5, "layout": "bshd"}
        if name == "linear_cross_entropy":
            x, w, target = args
            assert x.shape == (2, 12, 64) and w is model.lm_head.weight
            assert torch.equal(target[:, :-1], ids[:, 1:]) and (target[:, -1] == -100).all()
    assert logits is None   # training with labels: the logits never exist
    rloss, rlogits, rgrads = _step(ref, ids)
    _close(loss, rloss)
    model.eval()
    with torch.no_grad():
        _close(model(input_ids=ids, labels=ids).logits, rlogits)
    assert grads.keys() == rgrads.keys()
    for n in grads:
        _close(grads[n], rgrads[n], rtol=1e-4, atol=1e-6)


def test_apply_selects_what_to_swap(ops):
    model = ptf.apply(_model("llama"), attention=False, linear=False)
    kinds = [type(m) for m in model.modules()]
    assert kinds.count(pnn.RMSNorm) == 5 and pnn.Linear not in kinds
    assert model.config._attn_implementation == "sdpa"
    ptf.apply(model, rms_norm=False)
    kinds = [type(m) for m in model.modules()]
    assert kinds.count(pnn.RMSNorm) == 5 and kinds.count(pnn.Linear) == 15
    assert model.config._attn_implementation == "pyptx"
    before = list(model.modules())
    ptf.apply(model)
    assert list(model.modules()) == before


def test_from_config_with_registered_attention(ops):
    ptf.register()
    ref = _model("llama").eval()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(ref.config),
                                                          attn_implementation="pyptx").eval()
    model.load_state_dict(ref.state_dict())
    assert model.config._attn_implementation == "pyptx" != ref.config._attn_implementation
    ids = _ids(S=9)
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    assert ops.count == {"attention": 2}
    _close(got, want)


def test_decoding_with_cache(ops):
    """The prefill is causal; each one-token step sees every cached key (causal=False)."""
    ref = _model("qwen2").eval()
    model = ptf.apply(copy.deepcopy(ref))
    ids = _ids(S=10)
    with torch.no_grad():
        want = ref(ids).logits[:, -3:]
        out = model(ids[:, :7], use_cache=True)
        steps = []
        name = "cache" if "cache" in inspect.signature(model.forward).parameters \
            else "past_key_values"  # transformers < 5.2x
        cache = out.past_key_values
        for t in range(7, 10):
            out = model(ids[:, t:t + 1], **{name: cache}, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits[:, -1])
    attn = [kw["causal"] for name, _, kw in ops.calls if name == "attention"]
    assert attn == [True] * 2 + [False] * 6
    _close(torch.stack(steps, 1), want)


def test_padding_mask_falls_back_to_sdpa(ops):
    ref = _model("llama").eval()
    model = ptf.apply(copy.deepcopy(ref))
    ids = _ids(S=8)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        got, want = model(ids, attention_mask=mask).logits, ref(ids, attention_mask=mask).logits
        model(ids, attention_mask=torch.ones_like(ids))  # no padding: no mask, the kernel
    assert ops.count["attention"] == 2
    _close(got, want)


def test_refuses_dropout_and_softcap(ops):
    model = ptf.apply(_model("llama", attention_dropout=0.1)).train()
    with pytest.raises(ConfigError, match=rf"^{HERE}:\d+: pyptx attention has no dropout, "
                                          r"got dropout=0.1"):
        model(_ids())
    model.eval()
    model(_ids())  # dropout is 0 in eval mode
    q = torch.zeros(1, 2, 4, 16)
    with pytest.raises(ConfigError, match=rf"^{HERE}:\d+: pyptx attention does not support "
                                          "softcap"):
        ptf.attention_forward(model.model.layers[0].self_attn, q, q, q, None, softcap=30.0)


def test_refuses_other_families():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2,
                                                                vocab_size=64))
    with pytest.raises(ConfigError, match=rf"^{HERE}:\d+: pyptx_kernels.transformers.apply "
                                          r"supports the model families \['llama', 'mistral', "
                                          r"'qwen2', 'qwen3'\].*GPT2LMHeadModel.*'gpt2'"):
        ptf.apply(gpt2)
    with pytest.raises(ConfigError, match="got Linear with model_type=None"):
        ptf.apply(torch.nn.Linear(2, 2))
    assert not any(isinstance(m, (pnn.Linear, pnn.RMSNorm)) for m in gpt2.modules())


def test_missing_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ptf.TransformersMissingError,
                       match=rf"^{HERE}:\d+: .*" + re.escape('pip install "pyptx-kernels'
                                                             '[transformers]"')) as e:
        ptf.register()
    assert isinstance(e.value, ImportError)


def test_training_step_compiles_fullgraph(ops):
    ref = _model("llama")
    model = ptf.apply(copy.deepcopy(ref))
    ids = _ids()
    loss = torch.compile(model, fullgraph=True, backend="eager")(input_ids=ids, labels=ids).loss
    loss.backward()
    assert ops.count["attention"] == 2 and ops.count["linear"] == 14
    assert ops.count["linear_cross_entropy"] == ops.count["add_rms_norm"] // 2 == 1
    _close(loss.detach(), ref(input_ids=ids, labels=ids).loss.detach())
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_apply_switches_off_each_fused_op(ops):
    """Each keyword leaves its part of the model as transformers runs it: the unfused ops run
    instead (and the logits come back), and the loss is the same."""
    ref = _model("qwen3")
    ids = _ids()
    rloss = _step(ref, ids)[0]
    model = ptf.apply(copy.deepcopy(ref), add_rms_norm=False, rope=False, swiglu=False,
                      cross_entropy=False)
    loss, logits, _ = _step(model, ids)
    assert logits is not None
    assert not {"add_rms_norm", "apply_rotary", "swiglu", "linear_cross_entropy"} & set(ops.count)
    assert ops.count["rms_norm"] == 9 and ops.count["linear"] == 15
    _close(loss, rloss)
    ptf.apply(model)   # the patches come on later too
    ops.count.clear()
    loss = _step(model, ids)[0]
    assert ops.count["add_rms_norm"] == 2 and ops.count["linear_cross_entropy"] == 1
    _close(loss, rloss)


def test_own_positions_skip_the_packed_sequence_test(ops, monkeypatch):
    """A patched model called without ``position_ids`` makes positions ``0..S-1``: the
    packed-sequence test (a device-to-host wait per forward) does not run. Positions passed
    in are tested as before: packed ones give transformers' mask, and SDPA's result."""
    mu = importlib.import_module("transformers.masking_utils")
    ref = _model("llama").eval()
    model = ptf.apply(copy.deepcopy(ref))
    seen = []
    original = mu.find_packed_sequence_indices.__wrapped__
    monkeypatch.setattr(mu.find_packed_sequence_indices, "__wrapped__",
                        lambda p: seen.append(p) or original(p))
    ids = _ids(B=1, S=12)
    with torch.no_grad():
        model(ids, use_cache=False)
        assert seen == [] and ops.count["attention"] == 2
        packed = torch.cat([torch.arange(6), torch.arange(6)])[None]
        got = model(ids, position_ids=packed, use_cache=False).logits
        assert len(seen) == 1 and ops.count["attention"] == 2   # masked: SDPA ran
        _close(got, ref(ids, position_ids=packed, use_cache=False).logits)
        model(ids, position_ids=torch.arange(12)[None], use_cache=False)
        assert len(seen) == 3 and ops.count["attention"] == 4   # (the reference made one)


def test_mask_function_traces_without_a_graph_break():
    """``attention_mask`` compiles into the caller's graph (``fullgraph``): it looks up
    ``transformers.masking_utils`` outside the trace (``from transformers import ...`` inside
    it broke the graph where ``transformers`` is a lazy module, as in 5.17)."""
    mu = importlib.import_module("transformers.masking_utils")
    ptf.register()
    kw = dict(batch_size=2, q_length=6, kv_length=6, q_offset=0, kv_offset=0,
              mask_function=mu.causal_mask_function, attention_mask=None, dtype=torch.float32)

    def step(x):
        return x + (0 if ptf.attention_mask(**kw) is None else 1)

    assert torch.compile(step, fullgraph=True, backend="eager")(torch.ones(2)).tolist() == [1, 1]


def test_mask_function_skips_plain_causal_masks_traced_or_not():
    """``attention_mask``: no mask for a plain causal one (the kernel's flag), also while
    torch.compile traces (SDPA's own test gives up then); padding gives SDPA's mask."""
    mu = importlib.import_module("transformers.masking_utils")
    kw = dict(batch_size=2, q_length=6, kv_length=6, q_offset=0, kv_offset=0,
              mask_function=mu.causal_mask_function, attention_mask=None, dtype=torch.float32)
    assert ptf.attention_mask(**kw) is None
    assert torch.compile(lambda: ptf.attention_mask(**kw) is None, fullgraph=True,
                         backend="eager")()
    pad = torch.ones(2, 6, dtype=torch.bool)
    pad[0, :2] = False
    got = ptf.attention_mask(**{**kw, "attention_mask": pad})
    want = mu.sdpa_mask(**{**kw, "attention_mask": pad})
    assert got is not None and torch.equal(got, want)


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_sliding_window_is_the_kernels_window(ops, family):
    """A sliding window narrower than the sequence: the training step and the logits match
    the unpatched model (SDPA with transformers' mask), through the kernel's
    ``window=(W - 1, 0)`` with no mask; decoding over a cache longer than the window keeps
    transformers' mask (SDPA) and matches too."""
    W = 5
    kw = dict(sliding_window=W) if family == "mistral" else \
        dict(sliding_window=W, use_sliding_window=True, max_window_layers=0)
    ref = _model(family, **kw)
    model = ptf.apply(copy.deepcopy(ref))
    ids = _ids(S=12)
    for m in (ref, model):
        m.train()
    (l0, _, g0), (l1, _, g1) = _step(ref, ids), _step(model, ids)
    _close(l1, l0)
    for name, g in g0.items():
        _close(g1[name], g, rtol=1e-4, atol=1e-5)
    windows = [kw.get("window") for name, _, kw in ops.calls if name == "attention"]
    assert windows == [(W - 1, 0)] * 2
    ref.eval(), model.eval()
    with torch.no_grad():
        want = ref(ids).logits[:, -2:]
        out = model(ids[:, :10], use_cache=True)
        cache, steps = out.past_key_values, []
        for t in (10, 11):
            out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits[:, -1])
    _close(torch.stack(steps, 1), want, rtol=1e-4, atol=1e-5)


def test_sliding_window_mask_is_kept_over_a_cache():
    """The mask function leaves no mask for a sliding window only with as many keys as
    queries and no cache offset; otherwise it is SDPA's."""
    mu = importlib.import_module("transformers.masking_utils")
    cfg = transformers.MistralConfig(**TINY, sliding_window=4)
    kw = dict(batch_size=1, q_length=8, kv_length=8, q_offset=0, kv_offset=0,
              mask_function=mu.sliding_window_causal_mask_function(4), attention_mask=None,
              local_size=4, dtype=torch.float32, config=cfg)
    assert ptf.attention_mask(**kw) is None
    for change in (dict(q_length=1, kv_length=9, q_offset=8), dict(q_offset=torch.tensor(3)),
                   dict(config=transformers.LlamaConfig(**TINY)), dict(local_size=3)):
        got = ptf.attention_mask(**{**kw, **change})
        assert got is not None and torch.equal(got, mu.sdpa_mask(**{**kw, **change}))


def _decode_llama():
    """A bf16 Llama the decode kernel takes: head dim 64, two query heads per KV head (applied
    without ``linear_residual``: that GEMM epilogue has no stand-in)."""
    cfg = transformers.LlamaConfig(**{**TINY, "hidden_size": 128, "intermediate_size": 256,
                                      "head_dim": 64})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.to(torch.bfloat16).eval()


def _check_decode_calls(calls, steps, first_keys, B=2):
    """Each layer's decoding call: one query of 4 heads, the cache of one more key per step
    read in place (the ``(B, Hkv, S, D)`` cache's transpose), every length that many."""
    assert len(calls) == 2 * steps
    for i, c in enumerate(calls):
        Sk = first_keys + i // 2
        assert c["q"].shape == (B, 1, 4, 64) and c["k_cache"].shape == (B, Sk, 2, 64)
        for t in (c["k_cache"], c["v_cache"]):
            assert t.stride() == (2 * Sk * 64, 64, Sk * 64, 1)
        assert c["lens"].tolist() == [Sk] * B and c["lens"].dtype == torch.int32
        assert not c["causal"] and c["window"] == (-1, -1) and c["scale"] == 64 ** -0.5


def test_generate_decodes_through_attention_with_kvcache(ops, decode_spy):
    """``generate()``: the prefill through ``attention``, every later step's attention
    through ``attention_with_kvcache`` on transformers' cache as it is; the logits of each
    step match the unpatched model's (SDPA, bf16) on the generated tokens."""
    ref = _decode_llama()
    model = ptf.apply(copy.deepcopy(ref), linear_residual=False)
    ids = _ids(S=6)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0)
        want = ref(out.sequences).logits[:, 5:-1].float()
    assert ops.count["attention"] == 2
    _check_decode_calls(decode_spy, 3, 7)
    _close(torch.stack(out.logits, 1).float(), want, rtol=0, atol=2e-2)


def test_compiled_decode_step_runs_the_decode_op(ops, decode_spy):
    """A compiled one-token step (``fullgraph``) holds ``pyptx.attention_with_kvcache`` once
    per layer (its fake traced, its implementation run) and gives the unpatched logits."""
    ref = _decode_llama()
    model = ptf.apply(copy.deepcopy(ref), linear_residual=False)
    ids = _ids(S=7)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        cache = model(ids[:, :6], use_cache=True).past_key_values
        step = torch.compile(model, backend=record, fullgraph=True)
        got = step(input_ids=ids[:, 6:], past_key_values=cache, use_cache=True).logits
        want = ref(ids).logits[:, -1:]
    torch._dynamo.reset()
    ops_in = [str(n.target).removesuffix(".default") for gm in graphs for n in gm.graph.nodes
              if n.op == "call_function"]
    assert len(graphs) == 1 and ops_in.count("pyptx.attention_with_kvcache") == 2
    _check_decode_calls(decode_spy, 1, 7)
    _close(got.float(), want.float(), rtol=0, atol=2e-2)


def test_decode_route_only_where_the_kernel_applies(ops, decode_spy):
    """Float32, a head dim of 16, more than 16 queries, or gradients: the dense kernel (or
    SDPA) as before; several queries after a cache without a mask, not causal: the decode
    kernel over every key."""
    attn = _decode_llama().model.layers[0].self_attn
    bf = torch.bfloat16
    q, k = torch.randn(2, 4, 1, 64, dtype=bf), torch.randn(2, 2, 9, 64, dtype=bf)
    for qq, kk in ((q.float(), k.float()), (q[..., :16], k[..., :16]),
                   (torch.randn(2, 4, 17, 64, dtype=bf), torch.randn(2, 2, 20, 64, dtype=bf)),
                   (q.requires_grad_(), k)):
        ptf.attention_forward(attn, qq, kk, kk, None)
    assert not decode_spy and ops.count["attention"] == 4
    q = torch.randn(2, 4, 3, 64, dtype=bf)
    out, _ = ptf.attention_forward(attn, q, k, k, None, is_causal=False)
    assert len(decode_spy) == 1 and decode_spy[0]["q"].shape == (2, 3, 4, 64)
    assert not decode_spy[0]["causal"] and decode_spy[0]["lens"].tolist() == [9, 9]
    want = _nn_tests.ref_attention(q, k, k, layout="bhsd").transpose(1, 2)
    _close(out.float(), want.float(), rtol=0, atol=1e-2)
