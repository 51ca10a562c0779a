"""The Blackwell GEMM's host call (untested on hardware): ``matmul_sm100``, what
``pyptx_kernels.matmul`` launches on sm_100 devices, with its kernel cache."""

from __future__ import annotations

import functools

from pyptx.errors import ConfigError
from pyptx_kernels._common import check_devices, dtype_name, fail
from pyptx_kernels.gemm_sm100.config import Sm100GemmConfig
from pyptx_kernels.gemm_sm100.kernel import build_gemm_sm100


@functools.lru_cache(maxsize=256)
def _cached(M, N, K, out_dtype, a_major, b_major, config):
    return build_gemm_sm100(M, N, K, out_dtype=out_dtype, a_major=a_major, b_major=b_major,
                            config=config)


def _layout(x, rows, cols):
    """``(tensor, major)``: ``x`` (logically ``rows x cols``) as a row-major tensor of itself
    (``"K"`` when ``cols`` is K) or of its transpose, copying only when it is neither."""
    if x.stride(1) == 1 and x.stride(0) == cols:
        return x, "row"
    if x.stride(0) == 1 and x.stride(1) == rows:
        return x.T, "col"
    return x.contiguous(), "row"


def matmul_sm100(a, b, *, out_dtype=None, config=None):
    """``a @ b`` for bf16 torch CUDA tensors ``a (M, K)`` and ``b (K, N)`` on a Blackwell
    (sm_100) device, with the tcgen05 GEMM (untested on hardware). Row-major operands and
    transposed views (``w.T``) are read in place (A K-major or MN-major, B MN-major or
    K-major); other strides are copied. Rows that are not a multiple of 16 bytes are
    zero-padded (the result is cropped back). ``out_dtype``: ``"bf16"`` (default) or
    ``"f32"``; ``config``: an ``Sm100GemmConfig`` (default the first of
    ``SM100_GEMM_CONFIGS``). Not differentiable (``matmul``'s autograd wraps it)."""
    import torch.nn.functional as F

    who = "matmul_sm100"
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise fail(ConfigError, who, f"expects a (M, K) and b (K, N), got {tuple(a.shape)} and "
                   f"{tuple(b.shape)}")
    if dtype_name(a.dtype) != "bf16" or dtype_name(b.dtype) != "bf16":
        raise fail(ConfigError, who, f"inputs must be bf16, got {a.dtype} and {b.dtype}")
    out = out_dtype or "bf16"
    if config is not None and not isinstance(config, Sm100GemmConfig):
        raise fail(ConfigError, who, f"config must be an Sm100GemmConfig, got {config!r}")
    check_devices(who, a, b)
    M, K = a.shape
    N = b.shape[1]
    a, ha = _layout(a, M, K)
    b, hb = _layout(b, K, N)
    a_major = "K" if ha == "row" else "MN"
    b_major = "MN" if hb == "row" else "K"
    # every contiguous axis rounded up to 8 elements (16-byte rows); zeros add nothing
    Kp, Np = -(-K // 8) * 8, -(-N // 8) * 8
    Mp = -(-M // 8) * 8 if a_major == "MN" else M
    if a_major == "K" and Kp != K:
        a = F.pad(a, (0, Kp - K))
    elif a_major == "MN" and (Mp != M or Kp != K):
        a = F.pad(a, (0, Mp - M, 0, Kp - K))
    if b_major == "MN" and (Np != N or Kp != K):
        b = F.pad(b, (0, Np - N, 0, Kp - K))
    elif b_major == "K" and (Kp != K or Np != N):
        b = F.pad(b, (0, Kp - K, 0, Np - N))
    d = _cached(Mp, Np, Kp, out, a_major, b_major, config)(a, b)
    return d[:M, :N] if (Mp, Np) != (M, N) else d
