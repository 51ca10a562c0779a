"""pyptx-kernels: the pyptx kernel library.

The public functions take torch tensors (one ``torch.ops.pyptx.<name>`` custom op each,
differentiable where the op is, ``torch.compile``-able) or JAX arrays, of any leading
shape; bad input raises a ``pyptx.errors.PyptxError`` naming the caller's line.
``import pyptx_kernels`` imports neither torch, JAX nor any kernel: each name is loaded at
its first use.
"""

_FUNCTIONS = {
    "matmul": "pyptx_kernels.gemm.api",
    "linear": "pyptx_kernels.gemm.api",
    "swiglu_linear": "pyptx_kernels.gemm.fused",
    "linear_residual": "pyptx_kernels.gemm.fused",
    "pack_gated": "pyptx_kernels.gemm.fused",
    "grouped_mm": "pyptx_kernels.grouped_gemm.api",
    "scaled_mm": "pyptx_kernels.fp8_gemm.api",
    "scaled_mm_blockwise": "pyptx_kernels.fp8_gemm.api",
    "attention": "pyptx_kernels.flash_attention.api",
    "attention_varlen": "pyptx_kernels.flash_attention.api",
    "attention_with_kvcache": "pyptx_kernels.flash_attention.decode_api",
    "rms_norm": "pyptx_kernels.rows.api",
    "layer_norm": "pyptx_kernels.rows.api",
    "softmax": "pyptx_kernels.rows.api",
    "swiglu": "pyptx_kernels.rows.api",
    "add_rms_norm": "pyptx_kernels.rows.api",
    "apply_rotary": "pyptx_kernels.rows.api",
    "linear_cross_entropy": "pyptx_kernels.cross_entropy.api",
    "ptx": "pyptx_kernels.inspect",
    "tune": "pyptx_kernels._tuning",
    "precompile": "pyptx_kernels.warmup",
}
_SUBMODULES = ("nn", "transformers")

__all__ = [*_FUNCTIONS, *_SUBMODULES]


def __getattr__(name):
    import importlib

    if name in _FUNCTIONS:
        value = getattr(importlib.import_module(_FUNCTIONS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
