"""The Ampere kernels' public torch functions, each one ``torch.ops.pyptx.<name>`` custom op
(fake impl for ``torch.compile``; forward only), defined at the first call: ``sm80_matmul``
and ``sm80_attention``. They run on any device that runs sm_80 code (A100, A10/RTX 30xx,
L4/RTX 40xx, H100/H200), which is how ``pyptx_kernels.matmul``/``attention`` reach them on
sm_80/sm_86 devices and for ``arch="sm_80"``."""

from __future__ import annotations

from pyptx_kernels import _common
from pyptx_kernels._common import defines_ops, dtype_name
from pyptx_kernels.ampere import host


def _matmul_impl(a, b, out_dtype):
    return host.matmul(a, b, out_dtype=out_dtype or None)


def _matmul_fake(a, b, out_dtype):
    ot = dtype_name(out_dtype) if out_dtype else dtype_name(a.dtype)
    return a.new_empty((*a.shape[:-1], b.shape[1]), dtype=_common.torch_dtype(ot))


def _attention_impl(q, k, v, causal, scale):
    return host.attention(q, k, v, causal=causal, scale=scale if scale > 0 else None)


def _attention_fake(q, k, v, causal, scale):
    import torch

    B, S, Hq, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, Hq, S), dtype=torch.float32)


@defines_ops
def _define():
    """Define ``pyptx::sm80_matmul`` and ``pyptx::sm80_attention``."""
    _common.torch_op("sm80_matmul", "(Tensor a, Tensor b, str out_dtype) -> Tensor",
                     _matmul_impl, _matmul_fake)
    _common.torch_op("sm80_attention",
                     "(Tensor q, Tensor k, Tensor v, bool causal, float scale) -> (Tensor, Tensor)",
                     _attention_impl, _attention_fake)
    return True


def sm80_matmul(a, b, *, out_dtype=None, config=None):
    """``a @ b`` on the Ampere GEMM (``host.matmul``: ``a (..., K)``, ``b (K, N)`` row-major
    or ``w.T``; bf16/f16; ``out_dtype`` bf16/f16/f32). ``config`` (a ``Sm80GemmConfig`` or
    plan name) calls the kernel directly instead of through the custom op."""
    if config is not None:
        return host.matmul(a, b, out_dtype=out_dtype, config=config)

    _define()
    name = "" if out_dtype is None else str(out_dtype).removeprefix("torch.")
    return _common.call_op("sm80_matmul", a, b, name)


def sm80_attention(q, k, v, *, causal=False, scale=None, layout="bshd"):
    """Flash attention forward on the Ampere kernel: ``layout="bshd"`` ``q (B, S, Hq, D)``,
    ``k, v (B, Sk, Hkv, D)``; ``"bhsd"`` ``(B, H, S, D)`` (copied into bshd; the output is a
    transposed view). bf16/f16, ``D`` 64 or 128. Returns ``out`` shaped like ``q``."""

    from pyptx.errors import ConfigError

    if layout not in ("bshd", "bhsd"):
        raise _common.fail(ConfigError, "sm80_attention",
                           f"layout must be 'bshd' or 'bhsd', got {layout!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not scale > 0):
        raise _common.fail(ConfigError, "sm80_attention",
                           f"scale must be a positive number, got {scale!r}")
    _define()
    if layout == "bhsd":
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    out = _common.call_op("sm80_attention", q, k, v, bool(causal),
                                         -1.0 if scale is None else float(scale))[0]
    return out.transpose(1, 2) if layout == "bhsd" else out
