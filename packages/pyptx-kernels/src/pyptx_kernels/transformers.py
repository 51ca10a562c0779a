"""Hugging Face ``transformers`` integration: the pyptx kernels inside Llama-family models.

``register()`` adds ``"pyptx"`` to transformers' ``AttentionInterface`` (and its mask
interface), so ``AutoModelForCausalLM.from_config(cfg, attn_implementation="pyptx")`` or
``model.set_attn_implementation("pyptx")`` runs attention through ``pyptx_kernels.attention``.
``apply(model)`` does that, swaps the model's RMSNorm and ``nn.Linear`` modules for
``pyptx_kernels.nn`` modules sharing the same Parameters, and patches the fused kernels of a
training step into the model's modules (the residual add and RMSNorm of each decoder layer,
RoPE of q and k, the MLP's SwiGLU or its gate/up GEMM with the gated epilogue, the down
projection's GEMM with the residual add in its epilogue, and the head's linear +
cross-entropy), in place.
transformers is imported only when one of these is called
(``pip install "pyptx-kernels[transformers]"``).
"""

from __future__ import annotations

import importlib
import inspect
import threading
import types

from pyptx.errors import ConfigError, PyptxError

from ._common import where

__all__ = ["FAMILIES", "TransformersMissingError", "apply", "attention_forward", "attention_mask",
           "register"]

#: ``config.model_type`` of each supported family -> its class-name prefix (``LlamaRMSNorm``).
FAMILIES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}


class TransformersMissingError(PyptxError, ImportError):
    """``pyptx_kernels.transformers`` was used without transformers installed."""


def _transformers():
    try:
        return importlib.import_module("transformers")
    except ImportError as e:
        raise TransformersMissingError(
            f"{where()}: pyptx_kernels.transformers needs Hugging Face transformers: "
            f'pip install "pyptx-kernels[transformers]"') from e


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      **kwargs):
    """transformers' attention-function contract for ``"pyptx"``: ``query (B, Hq, S, D)``,
    ``key``/``value (B, Hkv, Sk, D)`` (grouped-query heads un-repeated, passed as is) ->
    ``(attn_output (B, S, Hq, D), None)`` through ``pyptx_kernels.attention(..., layout="bhsd")``,
    or, decoding, ``pyptx_kernels.attention_with_kvcache``.

    Causal when ``module.is_causal`` (or an ``is_causal`` keyword) and ``S > 1``, with
    ``j <= i`` alignment; at ``S == 1`` (decoding) the query sees every key. A causal call
    with more keys than queries and no mask is a prefill into an empty static cache (the
    mask function leaves none only then): the keys past ``S`` are unwritten and cropped. A
    ``sliding_window`` keyword ``W`` (Mistral, Qwen2 and Qwen3 pass it) with as many keys as
    queries is the kernel's ``window=(W - 1, 0)``: query ``i`` sees keys ``i - W < j <= i``,
    and key blocks outside the window are skipped. Decoding (1..16 queries after a cache of
    more keys, no mask: ``_fits_decode``, inference only) runs ``attention_with_kvcache`` on
    the cache as transformers keeps it, ``(B, Hkv, Sk, D)`` read in place through its
    strides, every sequence ``Sk`` long, the queries bottom-right aligned (``window=(W - 1,
    -1)`` past a sliding window): one read of each KV head for its whole query group. An
    explicit ``attention_mask`` (padding, packed sequences, a sliding window over a cache,
    several queries after a cache) is something the kernels cannot express: those calls fall
    back to transformers' SDPA attention, which gives the same result. ``dropout > 0``,
    ``softcap`` and attention sinks raise ``ConfigError`` (set ``config.attention_dropout =
    0``)."""
    from .nn import _op
    from .nn import where as user_where

    if dropout:
        raise ConfigError(f"{user_where()}: pyptx attention has no dropout, got dropout={dropout} "
                          f"(set config.attention_dropout = 0.0)")
    for name in ("softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise ConfigError(f"{user_where()}: pyptx attention does not support {name}")
    if attention_mask is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                                      scaling=scaling, **kwargs)
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    S = query.shape[2]
    causal = bool(is_causal) and S > 1
    if causal and key.shape[2] > S:
        # no mask with more keys than queries: a prefill into an empty static cache, whose
        # keys past S are unwritten (transformers' SDPA path crops them the same way)
        key, value = key[:, :, :S], value[:, :, :S]
    extra = {}
    W = kwargs.get("sliding_window")
    if W is not None and causal and key.shape[2] > W:
        if key.shape[2] != S:   # the mask function leaves no mask for this case alone
            raise ConfigError(f"{user_where()}: pyptx attention got a sliding window of {W} "
                              f"over {key.shape[2]} keys for {S} queries without a mask")
        extra["window"] = (W - 1, 0)
    if _fits_decode(query, key, value):
        window = (W - 1, -1) if W is not None and key.shape[2] > W else (-1, -1)
        return _decode_attention(query, key, value, causal, scaling, window), None
    attend = _op("flash_attention", "attention")
    if all(t.transpose(1, 2).is_contiguous() for t in (query, key, value)):
        # (B, S, H, D) memory seen as (B, H, S, D), as the projections' views come: read it
        # where it lies and return the (B, S, H, D) result as is (no copy either way)
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        return attend(q, k, v, causal=causal, scale=scaling, layout="bshd", **extra), None
    out = attend(query, key, value, causal=causal, scale=scaling, layout="bhsd", **extra)
    return out.transpose(1, 2).contiguous(), None


_DECODE = "pyptx_kernels.flash_attention.decode_api"


def _fits_decode(query, key, value) -> bool:
    """Whether ``attention_with_kvcache`` takes this call: 1..``MAX_QUERIES`` queries after a
    cache of more keys, bf16 or f16, a head dim of ``HEAD_DIMS``, whole query groups per KV
    head, and no tensor that requires grad (it has no backward)."""
    import torch

    from .flash_attention.decode_config import HEAD_DIMS, MAX_QUERIES

    S, Sk, D = query.shape[2], key.shape[2], query.shape[3]
    return (1 <= S <= MAX_QUERIES and Sk > S and D in HEAD_DIMS and key.shape[3] == D
            and query.dtype in (torch.bfloat16, torch.float16)
            and query.dtype == key.dtype == value.dtype and query.shape[1] % key.shape[1] == 0
            and not (query.requires_grad or key.requires_grad or value.requires_grad))


def _decode_attention(query, key, value, causal, scale, window):
    """``(B, S, Hq, D)``: the queries of ``query (B, Hq, S, D)`` against the whole cache
    ``key``/``value (B, Hkv, Sk, D)``, through ``attention_with_kvcache`` on ``(B, S, H, D)``
    views (no copies) with lengths ``Sk`` (a fill on the device: no host sync, no copy)."""
    import sys

    import torch

    B, Sk = query.shape[0], key.shape[2]
    lens = torch.full((B,), Sk, dtype=torch.int32, device=query.device)
    api = sys.modules.get(_DECODE) or importlib.import_module(_DECODE)
    return api.attention_with_kvcache(query.transpose(1, 2), key.transpose(1, 2),
                                      value.transpose(1, 2), lens, causal=causal,
                                      window=window, scale=scale)


def attention_mask(**kwargs):
    """transformers' mask-function contract for ``"pyptx"``: ``None`` (no mask: the kernel's
    causal flag) for a plain causal mask without padding where SDPA's ``is_causal`` would
    also do (one query, as many keys as queries, or an empty cache), traced or not; also for
    a plain sliding-window causal mask with as many keys as queries in the families whose
    attention passes its ``sliding_window`` on (``attention_forward`` turns it into the
    kernel's window); every other mask (padding, packed sequences, a sliding window over a
    cache, extra mask functions) as SDPA's ``sdpa_mask`` makes it. SDPA's own test gives up
    while tracing, which would send every compiled call to the SDPA fallback."""
    mu = _MASKING or _masking_utils()
    q, kv = kwargs.get("q_length"), kwargs.get("kv_length")
    if kwargs.get("allow_is_causal_skip", True) and kwargs.get("attention_mask") is None \
            and q is not None:
        local = kwargs.get("local_size")
        if (local is None and kwargs.get("mask_function") is mu.causal_mask_function
                and (q == 1 or kv == q or kwargs.get("q_offset", None) == 0)):
            return None
        config = kwargs.get("config")
        if (local is not None and kv == q and getattr(config, "model_type", None) in FAMILIES
                and getattr(config, "sliding_window", None) == local
                and all(type(kwargs.get(o, 0)) is int and kwargs.get(o, 0) == 0
                        for o in ("q_offset", "kv_offset"))):   # an empty cache, or none
            return None
    return mu.sdpa_mask(**kwargs)


_MASKING = None
"""``transformers.masking_utils``, looked up by ``register`` (an import inside a traced
function breaks the graph: ``transformers`` is a lazy module, which dynamo refuses)."""


def _masking_utils():
    global _MASKING
    _MASKING = importlib.import_module("transformers.masking_utils")
    return _MASKING


def register() -> None:
    """Register ``"pyptx"`` as an attention implementation (attention function:
    ``attention_forward``; mask function: ``attention_mask``). Idempotent."""
    tf = _transformers()
    _masking_utils()

    from .nn import preload

    preload("flash_attention")
    importlib.import_module(_DECODE)   # in sys.modules before a compiled forward looks

    tf.AttentionInterface.register("pyptx", attention_forward)
    tf.AttentionMaskInterface.register("pyptx", attention_mask)


def _norm_class(model_type: str):
    mod = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    return getattr(mod, f"{FAMILIES[model_type]}RMSNorm")


def _pyptx_norm(m):
    from .nn import RMSNorm

    new = RMSNorm(tuple(m.weight.shape), eps=m.variance_epsilon, device="meta",
                  dtype=m.weight.dtype)
    new.weight = m.weight
    return new.train(m.training)


def apply(model, *, attention: bool = True, rms_norm: bool = True, linear: bool = True,
          add_rms_norm: bool = True, rope: bool = True, swiglu: bool = True,
          cross_entropy: bool = True, swiglu_linear: bool = False,
          linear_residual: bool = True):
    """Put the pyptx kernels into a Llama, Mistral, Qwen2 or Qwen3 model, in place; returns
    ``model``. A training script changes by one line: ``model = apply(model)``.

    Module swaps (each shares the replaced module's Parameters, so ``state_dict``, tied
    weights and existing optimizers are unchanged): ``rms_norm``: every ``<Family>RMSNorm``
    (the layers' norms, the final norm, Qwen3's q/k norms) becomes a
    ``pyptx_kernels.nn.RMSNorm``; ``linear``: every ``torch.nn.Linear`` (exact type,
    ``lm_head`` included) a ``pyptx_kernels.nn.Linear``. ``attention``: ``register()`` and
    ``model.set_attn_implementation("pyptx")``.

    Forward patches (instance attributes: other models of the family are untouched):
    ``add_rms_norm``: each decoder layer's ``residual + attention`` and
    ``post_attention_layernorm`` run as one ``pyptx_kernels.add_rms_norm``; ``rope``: the
    attention modules rotate q and k with ``pyptx_kernels.apply_rotary`` (one launch, the
    projections' layout read in place; other calls of ``apply_rotary_pos_emb`` fall back to
    transformers'); ``swiglu``: an MLP whose activation is SiLU computes ``silu(gate) * up``
    with ``pyptx_kernels.swiglu``; ``cross_entropy``: a ``*ForCausalLM`` called with
    ``labels`` in training mode computes its loss with ``pyptx_kernels.linear_cross_entropy``
    from the last hidden states (shifted labels, ``ignore_index=-100``,
    ``num_items_in_batch`` honoured) and returns ``logits=None``: the logits never exist.
    The base model (``LlamaModel``, ...), called without ``position_ids``, skips
    transformers' packed-sequence test of the positions it makes (``0..S-1``): that test
    waits for the GPU at every forward.

    GEMM epilogues (``pyptx_kernels.gemm.fused``; each applies where the call fits it: bf16
    or f16 weights and activations of one dtype, no bias, ``I`` a multiple of 64; other calls
    run unfused): ``swiglu_linear``: a SiLU MLP computes ``silu(gate(x)) * up(x)`` as one
    GEMM with the gated epilogue over ``pack_gated(gate_proj.weight, up_proj.weight)``,
    packed at each forward (a copy of both weights; its backward splits the packed weight's
    gradient back), so ``gate_proj``/``up_proj`` keep their Parameters, ``state_dict`` keys,
    optimizer state and gradients; its backward recomputes the projections (one more GEMM
    of the MLP's width) instead of keeping them: less memory, more time (off by default:
    H200 Llama step 8% slower, peak memory 11% lower). ``linear_residual`` (on):
    each decoder layer's ``residual + mlp(...)`` adds the residual in ``down_proj``'s GEMM
    epilogue. The residual add after attention is not moved into ``o_proj``: it is already
    fused with the post-attention RMSNorm (``add_rms_norm``), and ``o_proj`` is called inside
    transformers' attention forward, which the patch does not copy.

    Every op is a ``torch.ops.pyptx`` custom op, so the patched model compiles with
    ``torch.compile``. Other families raise ``ConfigError``. Applying again only turns more
    patches on (a keyword that is ``False`` leaves an earlier patch as it is); applying twice
    with the same keywords is a no-op."""
    _transformers()
    import torch

    from .nn import Linear

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if not isinstance(model, torch.nn.Module) or model_type not in FAMILIES:
        raise ConfigError(f"{where()}: pyptx_kernels.transformers.apply supports the model "
                          f"families {sorted(FAMILIES)} (config.model_type), got "
                          f"{type(model).__name__} with model_type={model_type!r}")
    norm_cls = _norm_class(model_type)
    made: dict[int, torch.nn.Module] = {}
    for name, m in list(model.named_modules(remove_duplicate=False)):
        if rms_norm and type(m) is norm_cls:
            new = made.get(id(m)) or made.setdefault(id(m), _pyptx_norm(m))
        elif linear and type(m) is torch.nn.Linear:
            new = made.get(id(m)) or made.setdefault(id(m), Linear.from_torch(m))
        else:
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
    if attention:
        register()
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation("pyptx")
        else:
            model.config._attn_implementation = "pyptx"
    _patch_forwards(model, model_type, add_rms_norm=add_rms_norm, rope=rope, swiglu=swiglu,
                    cross_entropy=cross_entropy, swiglu_linear=swiglu_linear,
                    linear_residual=linear_residual)
    return model


# ------------------------------------------------------------------------ forward patches
def _family_module(model_type: str):
    return importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")


def _patch(module, name: str, fn, **fusions: bool) -> None:
    """``module.<name> = fn`` bound to ``module``, once (applying twice is a no-op), and the
    fusions that are ``True`` recorded in ``module._pyptx_patched`` (which ``fn`` reads)."""
    patched = module.__dict__.setdefault("_pyptx_patched", {})
    patched.update({k: True for k, on in fusions.items() if on})
    if patched.get(name):
        return
    patched[name] = True
    setattr(module, name, types.MethodType(fn, module))


def _patch_forwards(model, model_type, *, add_rms_norm, rope, swiglu, cross_entropy,
                    swiglu_linear, linear_residual):
    from .nn import preload

    mod = _family_module(model_type)
    prefix = FAMILIES[model_type]
    layer_cls = getattr(mod, f"{prefix}DecoderLayer")
    attn_cls = getattr(mod, f"{prefix}Attention")
    mlp_cls = getattr(mod, f"{prefix}MLP")
    lm_cls = getattr(mod, f"{prefix}ForCausalLM", None)
    if add_rms_norm or rope or swiglu:
        preload("rows")
    if cross_entropy:
        preload("cross_entropy")
    if swiglu_linear or linear_residual:
        importlib.import_module(_FUSED)
    base_cls = getattr(mod, f"{prefix}Model", None)
    for m in model.modules():
        if base_cls is not None and type(m) is base_cls:
            _skip_packed_check()
            _patch(m, "forward", _base_model_forward)
        elif (add_rms_norm or linear_residual) and type(m) is layer_cls:
            _patch(m, "forward", _decoder_layer_forward, add_rms_norm=add_rms_norm,
                   linear_residual=linear_residual)
        elif rope and type(m) is attn_cls:
            _patch(m, "forward", _with_pyptx_rope(attn_cls.forward, mod))
        elif (swiglu or swiglu_linear) and type(m) is mlp_cls and _is_silu(m):
            _patch(m, "forward", _mlp_forward, swiglu=swiglu, swiglu_linear=swiglu_linear)
    if cross_entropy and lm_cls is not None and type(model) is lm_cls:
        _patch(model, "forward", _causal_lm_forward)


_POSITIONS = threading.local()
"""``depth``: how many patched base-model calls that make their own positions are running
on this thread (their positions are ``0..S-1``: never packed sequences)."""

_TRACED_OWN_POSITIONS = 0
"""The same count while ``torch.compile`` traces (the answer is baked into the graph)."""


def _base_model_forward(self, *args, **kwargs):
    """The family's base model (``LlamaModel``, ...) as transformers runs it. A call with no
    ``position_ids`` (and at most ``input_ids`` by position) makes positions ``0..S-1`` itself,
    so transformers' packed-sequence test of them is skipped (``_skip_packed_check``): in
    eager it copies a flag to the host and waits for the GPU at every forward; traced, it
    makes a mask, which sends attention to SDPA."""
    global _TRACED_OWN_POSITIONS
    import torch

    forward = type(self).forward
    if len(args) > 1 or kwargs.get("position_ids") is not None:
        return forward(self, *args, **kwargs)
    if torch.compiler.is_compiling():
        _TRACED_OWN_POSITIONS += 1
        try:
            return forward(self, *args, **kwargs)
        finally:
            _TRACED_OWN_POSITIONS -= 1
    _POSITIONS.depth = getattr(_POSITIONS, "depth", 0) + 1
    try:
        return forward(self, *args, **kwargs)
    finally:
        _POSITIONS.depth -= 1


def _own_positions() -> bool:
    """Whether a ``_base_model_forward`` call making its own positions is running here."""
    import torch

    if torch.compiler.is_compiling():
        return _TRACED_OWN_POSITIONS > 0
    return getattr(_POSITIONS, "depth", 0) > 0


def _skip_packed_check() -> None:
    """Wrap ``transformers.masking_utils.find_packed_sequence_indices`` (once) so that it
    answers "not packed" (None) inside ``_base_model_forward``'s own-position calls and runs
    as before everywhere else."""
    mu = importlib.import_module("transformers.masking_utils")
    original = getattr(mu, "find_packed_sequence_indices", None)
    if original is None or getattr(original, "_pyptx_wrapped", False):
        return

    def find_packed_sequence_indices(position_ids):
        if _own_positions():
            return None
        return find_packed_sequence_indices.__wrapped__(position_ids)

    find_packed_sequence_indices._pyptx_wrapped = True
    find_packed_sequence_indices.__wrapped__ = original
    find_packed_sequence_indices.__doc__ = original.__doc__
    mu.find_packed_sequence_indices = find_packed_sequence_indices


def _is_silu(mlp) -> bool:
    act = getattr(getattr(mlp, "config", None), "hidden_act", None)
    return act in ("silu", "swish") and all(hasattr(mlp, n) for n in
                                            ("gate_proj", "up_proj", "down_proj"))


def _eps(norm) -> float:
    eps = getattr(norm, "variance_epsilon", None)
    return float(norm.eps if eps is None else eps)


def _decoder_layer_forward(self, hidden_states, *args, **kwargs):
    """A pre-norm decoder layer, ``h = x + attn(norm(x)); out = h + mlp(norm2(h))``, with
    the fusions of ``self._pyptx_patched``: ``add_rms_norm`` (``x + attn`` and ``norm2`` in
    one ``add_rms_norm``) and ``linear_residual`` (``h + mlp(...)`` in ``down_proj``'s GEMM
    epilogue). The model passes everything but ``hidden_states`` by keyword, as the
    attention module takes it; a call with more positional arguments runs transformers'
    forward."""
    from .nn import _op

    if args:
        return type(self).forward(self, hidden_states, *args, **kwargs)
    fused = self._pyptx_patched
    residual = hidden_states
    attn_out, _ = self.self_attn(hidden_states=self.input_layernorm(residual), **kwargs)
    norm = self.post_attention_layernorm
    if fused.get("add_rms_norm"):
        normed, residual = _op("rows", "add_rms_norm")(attn_out, residual, norm.weight,
                                                       _eps(norm))
    else:
        residual = residual + attn_out
        normed = norm(residual)
    if fused.get("linear_residual"):
        return _mlp_plus_residual(self.mlp, normed, residual)
    return residual + self.mlp(normed)


def _with_pyptx_rope(forward, family_module):
    """The attention class's ``forward`` with its module's ``apply_rotary_pos_emb`` replaced
    by ``_rope``: a copy of the function over the globals of a twin module registered in
    ``sys.modules`` (so ``torch.compile`` can name them), the class left as it is."""
    import sys

    fn = inspect.unwrap(forward)
    name = f"{__name__}._rope.{family_module.__name__}"
    twin = sys.modules.get(name)
    if twin is None:
        twin = types.ModuleType(name)
        twin.__dict__.update(fn.__globals__)
        twin.__name__ = name
        fallback = family_module.apply_rotary_pos_emb

        def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            return _rope(fallback, q, k, cos, sin, unsqueeze_dim)

        twin.apply_rotary_pos_emb = apply_rotary_pos_emb
        sys.modules[name] = twin
    new = types.FunctionType(fn.__code__, twin.__dict__, fn.__name__, fn.__defaults__,
                             fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


def _rope(fallback, q, k, cos, sin, unsqueeze_dim):
    """``apply_rotary_pos_emb`` through ``pyptx_kernels.apply_rotary`` where it applies:
    ``(B, H, S, D)`` q and k (``unsqueeze_dim=1``) of one dtype with their tables; else
    transformers' own."""
    from .nn import _op

    ok = (unsqueeze_dim == 1 and q.dim() == 4 and k.dim() == 4 and cos.dim() in (2, 3)
          and q.dtype == k.dtype == cos.dtype == sin.dtype and q.shape[-1] == cos.shape[-1])
    if not ok:
        return fallback(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    return _op("rows", "apply_rotary")(q, k, cos, sin)


_FUSED = "pyptx_kernels.gemm.fused"


def _fused(name: str):
    """``pyptx_kernels.gemm.fused.<name>``, looked up at call time (swappable in tests, and
    through ``sys.modules``, which ``torch.compile`` traces)."""
    import sys

    return getattr(sys.modules.get(_FUSED) or importlib.import_module(_FUSED), name)


#: the activation dtypes (names in ``torch``) the fused GEMMs take
_GEMM_DTYPES = ("bfloat16", "float16")


def _fits_gemm(x, *linears) -> bool:
    """Whether the fused GEMMs take ``x`` through ``linears`` (``nn.Linear`` or
    ``pyptx_kernels.nn.Linear`` without bias, weights of ``x``'s dtype, one of
    ``_GEMM_DTYPES``). Calls that do not fit run unfused."""
    import torch

    from .nn import Linear

    return x.dtype in tuple(getattr(torch, n) for n in _GEMM_DTYPES) and all(
        type(m) in (Linear, torch.nn.Linear) and m.bias is None and m.weight.dtype == x.dtype
        for m in linears)


def _fits_swiglu_linear(mlp, x) -> bool:
    from .gemm.config import GATE_BLOCK

    gate, up = mlp.gate_proj, mlp.up_proj
    return (_fits_gemm(x, gate, up) and gate.weight.shape == up.weight.shape
            and gate.weight.shape[0] % GATE_BLOCK == 0 and gate.weight.shape[1] % 8 == 0)


def _fits_linear_residual(down, x, residual) -> bool:
    import torch

    ok = (torch.float32, x.dtype) if x.dtype == torch.bfloat16 else (torch.float32,)
    return (_fits_gemm(x, down) and residual.dtype in ok
            and residual.shape[-1] == down.weight.shape[0]
            and down.weight.shape[0] % 8 == 0 and down.weight.shape[1] % 8 == 0)


def _mlp_hidden(mlp, x):
    """``act(gate(x)) * up(x)``, the MLP's input to ``down_proj``: one gated GEMM
    (``swiglu_linear`` on the packed weights) or ``pyptx_kernels.swiglu``, as ``mlp`` is
    patched and the call fits; else transformers' ``act_fn`` and product."""
    from .nn import _op

    fused = getattr(mlp, "_pyptx_patched", {})
    if fused.get("swiglu_linear") and _fits_swiglu_linear(mlp, x):
        packed = _fused("pack_gated")(mlp.gate_proj.weight, mlp.up_proj.weight)
        return _fused("swiglu_linear")(x, packed)
    if fused.get("swiglu"):
        return _op("rows", "swiglu")(mlp.gate_proj(x), mlp.up_proj(x))
    return mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)


def _mlp_forward(self, x):
    """``down(silu(gate(x)) * up(x))`` with the gated product from ``_mlp_hidden``."""
    return self.down_proj(_mlp_hidden(self, x))


def _mlp_plus_residual(mlp, x, residual):
    """``residual + mlp(x)``: the add in ``down_proj``'s GEMM epilogue
    (``linear_residual``) where the MLP has transformers' gate/up/down structure and the call
    fits (the MLP's module hooks then do not run); else the MLP as it is and a separate
    add."""
    if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return residual + mlp(x)
    h = _mlp_hidden(mlp, x)
    if not _fits_linear_residual(mlp.down_proj, h, residual):
        return residual + mlp.down_proj(h)
    return _fused("linear_residual")(h, mlp.down_proj.weight, residual)


def _causal_lm_forward(self, *args, **kwargs):
    """``*ForCausalLM.forward``; with ``labels`` in training mode (and at most ``input_ids``
    by position) the loss comes from ``linear_cross_entropy`` on the last hidden states and
    ``logits`` is None."""
    from .nn import _op

    labels = kwargs.get("labels")
    if labels is None or not self.training or len(args) > 1 or (args and "input_ids" in kwargs):
        return type(self).forward(self, *args, **kwargs)
    kw = dict(kwargs, input_ids=args[0]) if args else dict(kwargs)
    del kw["labels"]
    keep = kw.pop("logits_to_keep", 0)
    kw.pop("return_dict", None)
    outputs = self.model(**kw)
    hidden = outputs.last_hidden_state
    if not (isinstance(keep, int) and keep == 0):
        from transformers.modeling_utils import slice_logits_to_keep

        hidden = slice_logits_to_keep(hidden, keep)
        labels = labels[:, -hidden.shape[1]:]
    import torch

    shift = kw.pop("shift_labels", None)
    if shift is None:
        shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    n_items = kw.get("num_items_in_batch")
    head = self.lm_head
    lce = _op("cross_entropy", "linear_cross_entropy")
    if n_items is None:
        loss = lce(hidden, head.weight, shift, bias=head.bias)
    else:
        loss = lce(hidden, head.weight, shift, bias=head.bias, reduction="sum") / n_items
    from transformers.modeling_outputs import CausalLMOutputWithPast

    rest = {k: v for k, v in outputs.items() if k != "last_hidden_state"}
    return CausalLMOutputWithPast(loss=loss, logits=None, **rest)
