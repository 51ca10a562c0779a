"""FP8 GEMM: ``scaled_mm`` and ``scaled_mm_blockwise`` (``api``) over the kernel.

Modules: ``config`` (``Fp8GemmConfig``, the tuned ``FP8_CONFIGS``), ``scheduler`` (tiles,
persistent grid, tile order), ``mainloop`` (producer and consumer loops), ``epilogue``
(scales, stores), ``scales`` (the three scale kinds), ``kernel`` (``build_fp8_gemm``),
``host`` (tuning, kernel cache, ``scaled_mm`` plumbing), ``reference`` (float64),
``testing`` (test inputs and tolerances). The builder-level names load at first use.
"""

from pyptx_kernels._common import lazy_exports
from pyptx_kernels.fp8_gemm.api import scaled_mm, scaled_mm_blockwise
from pyptx_kernels.fp8_gemm.config import FP8_CONFIGS, Fp8GemmConfig
from pyptx_kernels.fp8_gemm.reference import reference

_LAZY = {"build_fp8_gemm": "kernel", "fp8_gemm_tuned": "host", "scale_kind": "scales"}

__all__ = ["scaled_mm", "scaled_mm_blockwise", "Fp8GemmConfig", "FP8_CONFIGS", "reference",
           *_LAZY]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
