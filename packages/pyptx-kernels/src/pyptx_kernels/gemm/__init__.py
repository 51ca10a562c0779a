"""Dense GEMM: ``matmul`` and ``linear`` (``api``) over the kernel in ``kernel``."""

from pyptx_kernels.gemm.api import linear, matmul

__all__ = ["linear", "matmul"]
