"""fp8_gemm."""
