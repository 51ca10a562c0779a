"""Fused linear + cross-entropy: ``linear_cross_entropy`` (``api``), chunked over tokens so
the ``(tokens, vocab)`` logits never exist whole; its plan (``config``), the row kernel that
forms each token's loss and the logits' gradient in place (``kernel``), the chunk loop
(``host``) and the float64 ``reference``. Names load at first use."""

from pyptx_kernels._common import lazy_exports

_NAMES = {
    "linear_cross_entropy": "api",
    "CrossEntropyConfig": "config",
    "build_cross_entropy_rows": "kernel",
}

__all__ = list(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
