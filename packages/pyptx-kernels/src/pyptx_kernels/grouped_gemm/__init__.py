"""grouped_gemm."""
