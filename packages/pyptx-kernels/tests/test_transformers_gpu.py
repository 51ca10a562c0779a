"""GPU test of ``pyptx_kernels.transformers.apply``: a tiny bf16 Llama (head dim 64) trained one
step on the real kernels against the unpatched model (SDPA, torch's GEMMs and RMSNorm), and
its greedy ``generate()`` (each step after the prefill through ``attention_with_kvcache``)
against the unpatched model's.

bf16 tolerance: every op rounds its output to bf16 (about 2**-9 relative) and the two models
round at different points (transformers' RMSNorm rounds before the weight product, the
kernel after it), so the loss agrees to ``1e-2`` relative and the whole gradient's direction
to a cosine of 0.99; every gradient is finite and outputs are poisoned (NaN) before each launch.

    pytest -m gpu packages/pyptx-kernels/tests/test_transformers_gpu.py
"""

from __future__ import annotations

import copy
import importlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),  # conftest.py: unwritten elements are NaN
]

ptf = importlib.import_module("pyptx_kernels.transformers")


@pytest.fixture(autouse=True)
def _first_config(monkeypatch):
    monkeypatch.setenv("PYPTX_AUTOTUNE", "0")


def _step(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}


def test_llama_training_step_bf16():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=256)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    ref = ref.to("cuda", torch.bfloat16).train()
    model = ptf.apply(copy.deepcopy(ref))
    assert model.config._attn_implementation == "pyptx"
    ids = torch.randint(0, 256, (2, 128), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))

    loss, grads = _step(model, ids)
    rloss, rgrads = _step(ref, ids)
    assert torch.isfinite(loss) and abs(loss - rloss) <= 1e-2 * abs(rloss), (loss, rloss)
    assert all(torch.isfinite(g).all() for g in grads.values())
    flat = torch.cat([grads[n].flatten() for n in rgrads])
    rflat = torch.cat([g.flatten() for g in rgrads.values()])
    assert torch.nn.functional.cosine_similarity(flat, rflat, dim=0) > 0.99

    torch.optim.SGD(model.parameters(), lr=1e-1).step()
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids, labels=ids).loss)


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_sliding_window_training_step_bf16(family):
    """A sliding window (32 keys) narrower than the sequence (128): the patched model runs it
    as the kernel's window; loss and gradients match SDPA's masked attention."""
    torch.manual_seed(0)
    kw = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
              sliding_window=32)
    if family == "qwen2":
        kw.update(use_sliding_window=True, max_window_layers=0)
    cfg = (transformers.MistralConfig if family == "mistral" else transformers.Qwen2Config)(**kw)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    ref = ref.to("cuda", torch.bfloat16).train()
    model = ptf.apply(copy.deepcopy(ref))
    ids = torch.randint(0, 256, (2, 128), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    loss, grads = _step(model, ids)
    rloss, rgrads = _step(ref, ids)
    assert torch.isfinite(loss) and abs(loss - rloss) <= 1e-2 * abs(rloss), (loss, rloss)
    flat = torch.cat([grads[n].flatten() for n in rgrads])
    rflat = torch.cat([g.flatten() for g in rgrads.values()])
    assert torch.nn.functional.cosine_similarity(flat, rflat, dim=0) > 0.99
    # the window matters at this length: full causal attention gives other logits
    full = transformers.AutoModelForCausalLM.from_config(
        type(cfg)(**{**kw, "sliding_window": None}), attn_implementation="sdpa")
    full.load_state_dict(ref.state_dict())
    full = full.to("cuda", torch.bfloat16)
    with torch.no_grad():
        a = model(input_ids=ids).logits.float()
        r = ref(input_ids=ids).logits.float()
        f = full(input_ids=ids).logits.float()
    assert (a - r).abs().max() < (f - r).abs().max()


def test_llama_generate_matches_sdpa():
    """``generate(max_new_tokens=8, do_sample=False)``: the prefill through ``attention``,
    each of the 7 later steps through ``attention_with_kvcache`` on transformers' (B, Hkv, S,
    D) cache as it is. The tokens are the unpatched model's up to a step where its two best
    logits are nearer than the tolerance (a tie bf16 rounding may break either way); the
    patched model's logits at every step are the unpatched model's on the same tokens to
    ``2e-2`` of their largest magnitude."""
    from pyptx_kernels.flash_attention import decode_api

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=256)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    ref = ref.to("cuda", torch.bfloat16).eval()
    model = ptf.apply(copy.deepcopy(ref))
    calls = []
    real = decode_api.attention_with_kvcache

    def spy(*args, **kwargs):
        calls.append(args[1].shape)
        return real(*args, **kwargs)

    ids = torch.randint(0, 256, (2, 32), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    opts = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(decode_api, "attention_with_kvcache", spy)
        out = model.generate(ids, **opts)
    with torch.no_grad():
        want = ref.generate(ids, **opts)
        forced = ref(out.sequences).logits[:, 31:-1].float()
    assert [tuple(s) for s in calls] == [(2, 32 + i, 2, 64) for i in range(1, 8) for _ in "ab"]
    got = torch.stack(out.logits, 1).float()
    assert torch.isfinite(got).all()
    tol = 2e-2 * forced.abs().max()
    assert (got - forced).abs().max() <= tol, ((got - forced).abs().max(), tol)
    ref_logits = torch.stack(want.logits, 1).float()
    for t in range(8):
        if not torch.equal(out.sequences[:, 32 + t], want.sequences[:, 32 + t]):
            top2 = ref_logits[:, t].topk(2).values
            assert (top2[:, 0] - top2[:, 1]).min() <= 2 * tol, f"step {t}: no near tie"
            break
