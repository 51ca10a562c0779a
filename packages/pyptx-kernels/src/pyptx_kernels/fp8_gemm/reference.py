"""The float64 reference of the scaled FP8 GEMM."""

from __future__ import annotations

from pyptx_kernels.fp8_gemm.scales import SCALE_BLOCK


def reference(a, w, sa, sb, kind):
    """float64 ``scale(a @ w.T)`` of the dequantised inputs (torch; ``w`` is ``(N, K)``,
    scales of ``kind``'s shapes)."""
    a64, w64 = a.double(), w.double()
    sa64, sb64 = sa.double(), sb.double()
    M, K = a.shape
    N = w.shape[0]
    if kind == "tensor":
        return (a64 @ w64.T) * sa64.reshape(()) * sb64.reshape(())
    if kind == "row":
        return (a64 @ w64.T) * sa64.reshape(M, 1) * sb64.reshape(1, N)
    ea = sa64.repeat_interleave(SCALE_BLOCK, 1)[:, :K]
    eb = sb64.repeat_interleave(SCALE_BLOCK, 0).repeat_interleave(SCALE_BLOCK, 1)[:N, :K]
    return (a64 * ea) @ (w64 * eb).T
