"""FP8 GEMM: ``scaled_mm`` and ``scaled_mm_blockwise`` (``api``) over ``kernel``."""

from pyptx_kernels.fp8_gemm.api import scaled_mm, scaled_mm_blockwise

__all__ = ["scaled_mm", "scaled_mm_blockwise"]
