"""The FP8 GEMM's host side: the tuned builder, the kernel cache per problem, and
``scaled_mm`` (layouts, K padding, scale shapes) for torch tensors and JAX arrays.

Debugging: ``PYPTX_FP8_CONFIG='{"BN": 128, "cluster": 1}'`` (``Fp8GemmConfig`` fields) fixes
the plan of every call."""

from __future__ import annotations

import functools
import json
import os

from pyptx.autotune import Config, autotune
from pyptx.errors import ConfigError
from pyptx_kernels import _tuning
from pyptx_kernels._common import dtype_name, fail, framework
from pyptx_kernels.fp8_gemm.config import FP8_CONFIGS, Fp8GemmConfig, default_plan
from pyptx_kernels.fp8_gemm.kernel import build_fp8_gemm
from pyptx_kernels.fp8_gemm.scales import SCALES, scale_kind

_PLANS = {c.name: c for c in FP8_CONFIGS}


def build_fp8_gemm_planned(M, N, K, *, scale="tensor", dtype="e4m3", dtype_b=None,
                           out_dtype="bf16", fast_accum=False, ND=None,
                           plan=FP8_CONFIGS[0].name):
    """``build_fp8_gemm`` with the tuned plan named ``plan`` (an ``FP8_CONFIGS`` name)."""
    return build_fp8_gemm(M, N, K, scale=scale, dtype=dtype, dtype_b=dtype_b,
                          out_dtype=out_dtype, fast_accum=fast_accum, ND=ND,
                          config=_PLANS[plan])


PLANNER = _tuning.Planner(
    "scaled_mm", lambda kv: {"M": kv["M"], "N": kv["N"], "K": kv["K"], "scale": kv["scale"]},
    {c.name: Config(plan=c.name) for c in FP8_CONFIGS}, default_plan)
"""The FP8 GEMM's plan without timing: the shipped table's for the bucket (op
``"scaled_mm"``), else ``config.default_plan``."""

fp8_gemm_tuned = _tuning.planned(
    autotune([Config(plan=c.name) for c in FP8_CONFIGS],
             key=["M", "N", "K", "scale", "dtype", "dtype_b", "out_dtype", "fast_accum",
                  "ND"])(build_fp8_gemm_planned), PLANNER)
"""The FP8 GEMM with its plan among ``FP8_CONFIGS``: a winner saved for the shape, else
``PLANNER``'s; timed only when asked (``PYPTX_AUTOTUNE=1``, ``pyptx_kernels.tune``)."""


def env_config():
    """The plan ``PYPTX_FP8_CONFIG`` fixes (JSON of ``Fp8GemmConfig`` fields), or None."""
    text = os.environ.get("PYPTX_FP8_CONFIG")
    return Fp8GemmConfig(**json.loads(text)) if text else None


@functools.lru_cache(maxsize=256)
def _kernel(M, N, K, features, config):
    if config is None:
        return fp8_gemm_tuned(M, N, K, **dict(features))
    return build_fp8_gemm(M, N, K, **dict(features), config=config)


def kernel_for(M, N, K, *, scale, dtype, dtype_b, out_dtype, fast_accum, config=None):
    """``(kernel, KP, ND)``: the kernel ``scaled_mm`` launches for ``a (M, K)`` and
    ``w (N, K)`` (K zero-padded to ``KP``, a multiple of 16; output rows padded to ``ND``
    for 16-byte stores). ``config``: a fixed ``Fp8GemmConfig`` (default: the environment's,
    else ``fp8_gemm_tuned``'s choice)."""
    ND = N + (-N % (8 if out_dtype == "bf16" else 4))
    KP = K + -K % 16
    features = tuple(sorted(dict(scale=scale, dtype=dtype, dtype_b=dtype_b,
                                 out_dtype=out_dtype, fast_accum=bool(fast_accum),
                                 ND=ND).items()))
    return _kernel(M, N, KP, features, config or env_config()), KP, ND


def _fp8_name(x, what):
    name = dtype_name(x.dtype)
    if name not in ("e4m3", "e5m2"):
        raise fail(ConfigError, "scaled_mm", f"{what} must be float8_e4m3fn or float8_e5m2, "
                   f"got {x.dtype}")
    return name


def scaled_mm(a, b, scale_a, scale_b, *, out_dtype="bf16", scale=None, fast_accum=False,
              trans_b=False, config=None):
    """``D = scale(a @ b)`` with the FP8 GEMM, for torch tensors or JAX arrays.

    ``a``: ``(M, K)`` fp8, K contiguous. ``b``: ``(K, N)`` with N-stride K (torch's
    ``_scaled_mm`` convention, ``b = w.t()`` for a contiguous ``w`` ``(N, K)``); a
    row-major ``(K, N)`` torch ``b`` is transposed into a copy first; ``trans_b=True``
    passes ``w`` ``(N, K)`` itself (the JAX spelling). Scales (f32): one each
    (``"tensor"``), ``(M, 1)`` and ``(1, N)`` (``"row"``), or ``(M, ceil(K/128))`` and
    ``(ceil(N/128), ceil(K/128))`` (``"block"``); ``scale`` names the kind where the
    shapes are ambiguous. ``out_dtype``: 'bf16' or 'f32'. K is zero-padded to a multiple
    of 16 when needed; ``config`` (an ``Fp8GemmConfig``) fixes the plan.
    """
    lib = framework(a)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise fail(ConfigError, "scaled_mm", f"expects 2-D operands, got {tuple(a.shape)} and "
                   f"{tuple(b.shape)}")
    if config is not None and not isinstance(config, Fp8GemmConfig):
        raise fail(ConfigError, "scaled_mm", f"config must be an Fp8GemmConfig, got {config!r}")
    M, K = tuple(a.shape)
    if lib == "torch":
        if trans_b:
            w = b.contiguous()
        else:
            w = b.T if b.T.is_contiguous() else b.T.contiguous()
        a = a.contiguous()
    else:
        import jax.numpy as jnp

        w = b if trans_b else jnp.transpose(b)
    N, Kb = tuple(w.shape)
    if Kb != K:
        raise fail(ConfigError, "scaled_mm", f"inner dimensions differ: a is {M}x{K}, b is "
                   f"{Kb}x{N}")
    da, db = _fp8_name(a, "a"), _fp8_name(w, "b")
    if out_dtype not in ("bf16", "f32"):
        raise fail(ConfigError, "scaled_mm", f"out_dtype must be 'bf16' or 'f32', got "
                   f"{out_dtype!r}")
    found = scale_kind(scale_a.shape, scale_b.shape, M, N, K)
    kind = scale or found
    if kind not in SCALES or found is None:
        raise fail(ConfigError, "scaled_mm",
                   f"scale shapes {tuple(scale_a.shape)} and {tuple(scale_b.shape)} fit no "
                   f"scale kind for {M}x{N}x{K}: want one element each, (M, 1) and (1, N), or "
                   f"(M, ceil(K/128)) and (ceil(N/128), ceil(K/128))")
    k, KP, ND = kernel_for(M, N, K, scale=kind, dtype=da, dtype_b=db, out_dtype=out_dtype,
                           fast_accum=fast_accum, config=config)
    if KP != K:
        a, w = pad_k(a, lib), pad_k(w, lib)
    if lib == "torch":
        sa = scale_a.float().reshape(-1 if kind != "block" else scale_a.shape).contiguous()
        sb = scale_b.float().reshape(-1 if kind != "block" else scale_b.shape).contiguous()
    else:
        import jax.numpy as jnp

        sa = jnp.asarray(scale_a, jnp.float32)
        sb = jnp.asarray(scale_b, jnp.float32)
        if kind != "block":
            sa, sb = sa.reshape(-1), sb.reshape(-1)
    d = k(a, w, sa, sb)
    return d[:, :N] if ND != N else d


def pad_k(x, lib):
    """``x (R, K)`` fp8 zero-padded along K to a multiple of 16."""
    extra = -x.shape[1] % 16
    if lib == "torch":
        import torch
        import torch.nn.functional as F

        return F.pad(x.view(torch.uint8), (0, extra)).view(x.dtype)
    import jax.numpy as jnp

    return jnp.pad(x, ((0, 0), (0, extra)))
