"""Torch plumbing of the Ampere kernels (torch is imported inside the functions): ``matmul``
(layout from the strides, 16-byte row padding, kernel caches) and ``attention`` (``(out,
lse)``), which ``api`` and the library's ``matmul``/``attention`` dispatchers call."""

from __future__ import annotations

import functools

from pyptx.errors import ConfigError
from pyptx_kernels._common import check_devices, dtype_name, fail, torch_dtype
from pyptx_kernels.ampere import attention_config, gemm_config
from pyptx_kernels.ampere.attention_kernel import build_sm80_attention
from pyptx_kernels.ampere.gemm_kernel import build_sm80_gemm


@functools.lru_cache(maxsize=256)
def gemm_kernel(M, N, K, dtype, out_dtype, b_major, config):
    """The cached ``build_sm80_gemm`` kernel of one shape, dtypes, B layout and plan."""
    return build_sm80_gemm(M, N, K, dtype=dtype, out_dtype=out_dtype, b_major=b_major,
                           config=config)


@functools.lru_cache(maxsize=256)
def attention_kernel(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, config):
    """The cached ``build_sm80_attention`` kernel of one shape, dtype and options."""
    return build_sm80_attention(B, S, Hq, Hkv, D, Sk=Sk, dtype=dtype, causal=causal,
                                scale=scale, config=config)


def _pad(x, dim, mult):
    import torch.nn.functional as F

    extra = -x.shape[dim] % mult
    if not extra:
        return x
    return F.pad(x, [0, 0] * (x.ndim - 1 - dim) + [0, extra])


def matmul(a, b, *, out_dtype=None, config=None):
    """``a @ b`` on the Ampere GEMM for CUDA torch tensors of one dtype (bf16 or f16).

    ``a``: ``(..., K)``, any strides (copied when not row-major); ``b``: ``(K, N)``, row-major
    or the transposed view of a row-major ``(N, K)`` weight (``w.T``, read in place); anything
    else is copied. ``out_dtype``: bf16, f16 or f32 (torch dtype or name; default ``a``'s).
    ``config``: a ``Sm80GemmConfig``, a plan's name or a mapping (default:
    ``gemm_config.pick``). K (and, row-major B's, N) not a multiple of 8 is zero-padded.
    Returns ``(..., N)``."""
    who = "ampere.matmul"
    check_devices(who, a, b)
    if a.ndim < 1 or b.ndim != 2 or a.shape[-1] != b.shape[0]:
        raise fail(ConfigError, who, f"expected a (..., K) and b (K, N), got "
                   f"{tuple(a.shape)} and {tuple(b.shape)}")
    dt = dtype_name(a.dtype)
    if dt not in ("bf16", "f16") or dtype_name(b.dtype) != dt:
        raise fail(ConfigError, who, f"a and b must both be bfloat16 or both float16, got "
                   f"{a.dtype} and {b.dtype}")
    ot = dt if out_dtype is None else dtype_name(out_dtype)
    if ot not in ("bf16", "f16", "f32"):
        raise fail(ConfigError, who, f"out_dtype must be bfloat16, float16 or float32, got "
                   f"{out_dtype!r}")
    lead = tuple(a.shape[:-1])
    a2 = a.reshape(-1, a.shape[-1])
    M, K = (int(x) for x in a2.shape)
    N = int(b.shape[1])
    if M == 0 or N == 0 or K == 0:
        import torch

        out = torch.zeros((M, N), dtype=torch_dtype(ot), device=a.device)
        return out.reshape(*lead, N)
    cfg = gemm_config.pick(M, N) if config is None else gemm_config.Sm80GemmConfig.of(config)
    a2 = _pad(a2.contiguous(), 1, 8)
    if not b.is_contiguous() and b.T.is_contiguous():
        b_major, bt = "K", _pad(_pad(b.T, 1, 8), 0, 2)          # (N, K)
        Np = int(bt.shape[0])
    else:
        b_major, bt = "MN", _pad(_pad(b.contiguous(), 0, 8), 1, 8)  # (K, N)
        Np = int(bt.shape[1])
    Kp = int(a2.shape[1])
    (d,) = _outputs(gemm_kernel(M, Np, Kp, dt, ot, b_major, cfg)(a2, bt))
    if Np != N:
        d = d[:, :N]
    return d.reshape(*lead, N)


def attention(q, k, v, *, causal=False, scale=None, config=None):
    """``(out, lse)`` of the Ampere flash-attention forward for CUDA torch tensors
    ``q (B, S, Hq, D)``, ``k, v (B, Sk, Hkv, D)`` (copied when not contiguous): bf16 or f16,
    ``D`` 64 or 128, ``Hq % Hkv == 0``; ``out`` like ``q``, ``lse (B, Hq, S)`` f32 (natural
    log). ``causal``: top-left aligned; ``scale`` defaults to ``1/sqrt(D)``."""
    who = "ampere.attention"
    check_devices(who, q, k, v)
    if q.ndim != 4 or k.ndim != 4 or tuple(k.shape) != tuple(v.shape):
        raise fail(ConfigError, who, f"expected q (B, S, Hq, D) and k, v (B, Sk, Hkv, D), got "
                   f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, S, Hq, D = (int(x) for x in q.shape)
    Sk, Hkv = int(k.shape[1]), int(k.shape[2])
    if int(k.shape[0]) != B or int(k.shape[3]) != D:
        raise fail(ConfigError, who, f"q {tuple(q.shape)} and k/v {tuple(k.shape)} must have "
                   "the same batch and head dim")
    dt = dtype_name(q.dtype)
    if dt not in ("bf16", "f16") or dtype_name(k.dtype) != dt or dtype_name(v.dtype) != dt:
        raise fail(ConfigError, who, f"q, k, v must share one dtype, bfloat16 or float16, got "
                   f"{q.dtype}, {k.dtype}, {v.dtype}")
    if D not in attention_config.HEAD_DIMS:
        raise fail(ConfigError, who, f"the Ampere kernel supports head dim 64 or 128, got {D}")
    scale = None if scale is None else float(scale)
    kern = attention_kernel(B, S, Hq, Hkv, D, Sk, dt, bool(causal), scale, config)
    out, lse = _outputs(kern(q.contiguous(), k.contiguous(), v.contiguous()))
    return out, lse


def _outputs(result):
    """A launch's outputs as a tuple (a one-output kernel returns the tensor itself)."""
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)

