"""Flash attention on Hopper: ``attention`` (dense batches, grouped-query heads, ``bshd`` or
``bhsd`` layout read in place, sliding ``window``, ``softcap``) and ``attention_varlen``
(packed sequences), differentiable, one torch custom op each (``api``). The forward's modules: ``fwd_config`` (its plans), ``fwd_scheduler``,
``fwd_mainloop``, ``fwd_softmax``, ``masks``, ``fwd_epilogue``, ``fwd_kernel`` (the builders),
``fwd_host`` (host functions, autograd), ``fwd_reference``. Each name below is loaded at its
first use (``attention`` loads no kernel-building code until a kernel is traced)."""

_NAMES = {
    "attention": "api", "attention_varlen": "api", "ATTENTION_CONFIGS": "fwd_config",
    "SCHEDULES": "fwd_config", "ForwardConfig": "fwd_config", "build_attention": "fwd_kernel",
    "build_attention_varlen": "fwd_kernel", "reference": "fwd_reference",
    "reference_varlen": "fwd_reference",
}

__all__ = list(_NAMES)


def __getattr__(name):
    mod = _NAMES.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
