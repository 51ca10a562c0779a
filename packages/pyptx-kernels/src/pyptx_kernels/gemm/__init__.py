"""Dense GEMM: ``matmul`` and ``linear`` (``api``); the kernel's plan (``config``), tile
scheduler (``scheduler``), main loops (``mainloop``), epilogue (``epilogue``), builder
(``kernel``), host plumbing (``host``) and float64 ``reference``. Names load at first use."""

from pyptx_kernels._common import lazy_exports

_NAMES = {
    "matmul": "api", "linear": "api",
    "build_gemm": "kernel", "gemm_tuned": "kernel",
    "GemmConfig": "config", "GEMM_CONFIGS": "config",
    "reference": "reference",
}

__all__ = list(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
