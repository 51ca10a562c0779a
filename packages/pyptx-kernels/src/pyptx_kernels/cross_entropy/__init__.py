"""Fused linear + cross-entropy: ``linear_cross_entropy`` (``api``), chunked over tokens so
the ``(tokens, vocab)`` logits never exist whole; its plan (``config``), the row kernel that
forms each token's loss and the logits' gradient in place (``kernel``), the chunk loop
(``host``) and the float64 ``reference``. Names load at first use."""

_NAMES = {
    "linear_cross_entropy": "api",
    "CrossEntropyConfig": "config",
    "build_cross_entropy_rows": "kernel",
}

__all__ = list(_NAMES)


def __getattr__(name):
    import importlib

    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
