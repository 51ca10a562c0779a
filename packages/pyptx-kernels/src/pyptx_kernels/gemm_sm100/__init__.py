"""Blackwell (sm_100a) bf16 GEMM on ``tcgen05`` tensor cores, untested on hardware (proven by
ptxas for sm_100a and the CPU simulator only): the plan (``config``), tile grid
(``scheduler``), TMA ring and MMA issue (``mainloop``), tensor-memory epilogue
(``epilogue``), builder (``kernel``) and the call ``matmul`` takes on sm_100 devices
(``host``). Names load at first use."""

from pyptx_kernels._common import lazy_exports

_NAMES = {
    "build_gemm_sm100": "kernel",
    "Sm100GemmConfig": "config", "SM100_GEMM_CONFIGS": "config",
    "matmul_sm100": "host",
}

__all__ = list(_NAMES)

__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
