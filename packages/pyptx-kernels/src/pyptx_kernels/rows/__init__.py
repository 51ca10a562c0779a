"""Row kernels (RMSNorm, LayerNorm, softmax, SwiGLU), one module per op: ``rms_norm``,
``layer_norm``, ``softmax``, ``swiglu`` (each op's kernels for every plan and its builders);
``config`` (``RowConfig``, the tuned tables, the builders' shared tuning wiring); ``api``
(the public functions, not re-exported here: they would shadow the op modules).

This package re-exports ``RowConfig`` and the builders, each imported at its first use."""

from pyptx_kernels._common import lazy_exports

_NAMES = {
    "RowConfig": "config",
    "build_rms_norm_fast": "rms_norm", "build_rms_norm_bwd": "rms_norm",
    "build_layer_norm": "layer_norm", "build_layer_norm_bwd": "layer_norm",
    "build_softmax_fast": "softmax", "build_softmax": "softmax",
    "build_swiglu": "swiglu", "build_swiglu_backward": "swiglu",
}

__all__ = list(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
