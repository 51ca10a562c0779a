"""The library's kernel modules by short name, for tests, tools and benchmarks that walk them."""

KERNEL_MODULES = {
    "gemm": "pyptx_kernels.gemm.kernel",
    "grouped_gemm": "pyptx_kernels.grouped_gemm",
    "fp8_gemm": "pyptx_kernels.fp8_gemm",
    "flash_attention": "pyptx_kernels.flash_attention",
    "flash_attention_bwd": "pyptx_kernels.flash_attention.backward",
    "rms_norm": "pyptx_kernels.rows.rms_norm",
    "layer_norm": "pyptx_kernels.rows.layer_norm",
    "softmax": "pyptx_kernels.rows.softmax",
    "swiglu": "pyptx_kernels.rows.swiglu",
    "add_rms_norm": "pyptx_kernels.rows.add_rms_norm",
    "rope": "pyptx_kernels.rows.rope",
    "cross_entropy": "pyptx_kernels.cross_entropy.kernel",
    "decode": "pyptx_kernels.flash_attention.decode_kernel",
    "decode_combine": "pyptx_kernels.flash_attention.decode_combine",
    "sm80_gemm": "pyptx_kernels.ampere.gemm_kernel",
    "sm80_attention": "pyptx_kernels.ampere.attention_kernel",
}


def kernel_module(name):
    """The module of the library kernel file named ``name`` (a key of ``KERNEL_MODULES``)."""
    import importlib

    return importlib.import_module(KERNEL_MODULES[name])
