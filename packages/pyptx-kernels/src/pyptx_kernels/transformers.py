"""Hugging Face ``transformers`` integration: the pyptx kernels inside Llama-family models.

``register()`` adds ``"pyptx"`` to transformers' ``AttentionInterface`` (and its mask
interface), so ``AutoModelForCausalLM.from_config(cfg, attn_implementation="pyptx")`` or
``model.set_attn_implementation("pyptx")`` runs attention through ``pyptx_kernels.attention``.
``apply(model)`` does that and swaps the model's RMSNorm and ``nn.Linear`` modules for
``pyptx_kernels.nn`` modules sharing the same Parameters, in place. transformers is imported
only when one of these is called (``pip install "pyptx-kernels[transformers]"``).
"""

from __future__ import annotations

import importlib

from pyptx.errors import ConfigError, PyptxError

from ._common import where

__all__ = ["FAMILIES", "TransformersMissingError", "apply", "attention_forward", "register"]

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
    ``(attn_output (B, S, Hq, D), None)`` through ``pyptx_kernels.attention(..., layout="bhsd")``.

    Causal when ``module.is_causal`` (or an ``is_causal`` keyword) and ``S > 1``, with
    ``j <= i`` alignment; at ``S == 1`` (decoding) the query sees every key. An explicit
    ``attention_mask`` (padding, sliding windows wider than the keys, packed sequences) is
    something the kernel cannot express: those calls fall back to transformers' SDPA
    attention, which gives the same result. ``dropout > 0``, ``softcap`` and attention sinks
    raise ``ConfigError`` (set ``config.attention_dropout = 0``)."""
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
    out = _op("flash_attention", "attention")(query, key, value, causal=causal, scale=scaling, layout="bhsd")
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register ``"pyptx"`` as an attention implementation (attention function:
    ``attention_forward``; mask function: SDPA's, so masks transformers can skip for SDPA come
    as ``None``). Idempotent."""
    tf = _transformers()
    from transformers.masking_utils import sdpa_mask

    from .nn import preload

    preload("flash_attention")

    tf.AttentionInterface.register("pyptx", attention_forward)
    tf.AttentionMaskInterface.register("pyptx", sdpa_mask)


def _norm_class(model_type: str):
    mod = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    return getattr(mod, f"{FAMILIES[model_type]}RMSNorm")


def _pyptx_norm(m):
    from .nn import RMSNorm

    new = RMSNorm(tuple(m.weight.shape), eps=m.variance_epsilon, device="meta",
                  dtype=m.weight.dtype)
    new.weight = m.weight
    return new.train(m.training)


def apply(model, *, attention: bool = True, rms_norm: bool = True, linear: bool = True):
    """Put the pyptx kernels into a Llama, Mistral, Qwen2 or Qwen3 model, in place; returns
    ``model``. ``rms_norm``: every ``<Family>RMSNorm`` (the layers' norms, the final norm,
    Qwen3's q/k norms) becomes a ``pyptx_kernels.nn.RMSNorm``; ``linear``: every
    ``torch.nn.Linear`` (exact type, ``lm_head`` included) becomes a
    ``pyptx_kernels.nn.Linear``; each shares the replaced module's Parameters, so
    ``state_dict``, tied weights and existing optimizers are unchanged. ``attention``:
    ``register()`` and ``model.set_attn_implementation("pyptx")``. Other families raise
    ``ConfigError``; applying twice is a no-op."""
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
    return model
