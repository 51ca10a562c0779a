"""Ampere (sm_80) kernels built from ``mma.sync``, ``ldmatrix`` and ``cp.async`` rings: the
bf16/f16 GEMM (``gemm_kernel``, plans in ``gemm_config``) and the flash-attention forward
(``attention_kernel``, plans in ``attention_config``); ``host``/``api`` are their torch entry
points, which ``pyptx_kernels.matmul``/``attention`` call on sm_80/sm_86 devices and for
``arch="sm_80"``. Their sm_80 PTX also runs on sm_89/sm_90 devices."""
