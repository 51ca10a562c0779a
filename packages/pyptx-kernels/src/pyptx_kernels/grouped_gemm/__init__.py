"""Grouped GEMM (mixture-of-experts layers): ``grouped_mm`` (``api``) over ``kernel``."""

from pyptx_kernels.grouped_gemm.api import grouped_mm

__all__ = ["grouped_mm"]
