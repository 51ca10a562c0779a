"""``matmul`` and ``linear``: the dense GEMM for torch tensors (custom ops
``pyptx::matmul``/``pyptx::linear`` with autograd) and JAX arrays."""

from __future__ import annotations

import math
import sys

from pyptx.errors import ConfigError, ShapeError, SpecError
from pyptx_kernels import _common
from pyptx_kernels._common import dtype_name, fail, framework

OUT_DTYPES = ("bf16", "f16", "f32")


def _check(who, a, b, bias, out_dtype, linear=False, launch=True):
    """Validate ``a (..., K) @ b (K, N) + bias``; return the output dtype name.
    ``linear``: ``b`` is the ``(N, K)`` weight of ``F.linear``; ``launch``: check devices."""
    bn = "weight" if linear else "b"
    if len(a.shape) < 1 or len(b.shape) != 2:
        want = "x (..., in) and weight (out, in)" if linear else "a (..., K) and b (K, N)"
        raise fail(ShapeError, who, f"expects {want}, got {tuple(a.shape)} and {tuple(b.shape)}")
    K = a.shape[-1]
    Kb, N = (b.shape[1], b.shape[0]) if linear else tuple(b.shape)
    if Kb != K:
        raise fail(ShapeError, who, f"inner dimensions differ: {tuple(a.shape)} and "
                   f"{bn} {tuple(b.shape)}")
    da, db = dtype_name(a.dtype), dtype_name(b.dtype)
    if da not in ("bf16", "f16") or db != da:
        raise fail(SpecError, who, f"inputs must both be bfloat16 or float16, got {a.dtype} "
                   f"and {b.dtype}")
    if bias is not None:
        if tuple(bias.shape) != (N,):
            raise fail(ShapeError, who, f"bias must have shape ({N},), got {tuple(bias.shape)}")
        if dtype_name(bias.dtype) not in ("bf16", "f16", "f32"):
            raise fail(SpecError, who, f"bias must be a float tensor, got {bias.dtype}")
    out = da if out_dtype is None else dtype_name(out_dtype)
    if out not in OUT_DTYPES:
        raise fail(ConfigError, who, f"out_dtype must be bfloat16, float16 or float32, got "
                   f"{out_dtype!r}")
    if framework(a) != framework(b) or (bias is not None and framework(bias) != framework(a)):
        raise fail(SpecError, who, "inputs must all be torch tensors or all JAX arrays")
    if launch:
        _common.check_devices(who, a, b, bias)
    return out


ARCHS = ("sm_80", "sm_90a", "sm_100a")
"""The targets ``matmul``/``linear`` have a GEMM for: Ampere (``pyptx_kernels.ampere``,
forward only, no bias epilogue), Hopper, and Blackwell (``pyptx_kernels.gemm_sm100``: bf16,
forward only, no bias epilogue; untested on hardware)."""


def _arch(who, x, arch):
    """The GEMM family of a call: ``arch`` if given, else the device's (``device_arch``)."""
    arch = _common.device_arch(x) if arch is None else arch
    if arch not in ARCHS:
        raise fail(ConfigError, who, f"no GEMM for arch {arch!r}: the targets are {ARCHS}")
    return arch


def _other_family(who, arch, a, b, bias, out, wants):
    """The call of a forward-only family (Ampere ``pyptx_kernels.ampere``, Blackwell
    ``pyptx_kernels.gemm_sm100``); a bias is added after."""
    if wants:
        raise fail(ConfigError, who, f"the {arch} GEMM has no backward: call it with no input "
                   f"requiring grad (or under torch.no_grad())")
    if arch == "sm_80":
        from pyptx_kernels.ampere.api import sm80_matmul

        d = sm80_matmul(a, b, out_dtype=out)
    else:
        from pyptx_kernels.gemm_sm100.host import matmul_sm100

        d = matmul_sm100(a, b, out_dtype=out)
    return d if bias is None else (d.float() + bias.float()).to(d.dtype)


def matmul(a, b, *, bias=None, out_dtype=None, arch=None):
    """``a @ b (+ bias)`` with the pyptx GEMM: ``a (..., K)``, ``b (K, N)`` bf16/f16 of any
    strides (``w.T`` is read K-major, no copy), ``bias (N,)``; returns ``(..., N)`` in
    ``out_dtype`` (default ``a``'s; ``"bf16"``/``"f16"``/``"f32"`` or a dtype).
    torch: the custom op ``torch.ops.pyptx.matmul``, differentiable in all inputs;
    JAX: ``pyptx_kernels.gemm.host.matmul`` (differentiable under ``jax.grad``).
    ``arch``: the kernel family (``ARCHS``), by default the device's: sm_8x devices (and
    ``arch="sm_80"`` anywhere) take the Ampere GEMM, sm_100 devices the Blackwell one, both
    forward only."""
    out = _check("matmul", a, b, bias, out_dtype)
    a2, lead = _common.rows_of(a)
    family = _arch("matmul", a, arch) if framework(a) == "torch" else "sm_90a"
    if family != "sm_90a":
        d = _other_family("matmul", family, a2, b, bias, out, _common.wants_grad(a, b, bias))
    elif framework(a) == "torch":
        _define()
        d = _common.call_op("matmul", a2, b, bias, out)
    else:
        d = _mm(a2, b, bias, out)
    return d.reshape(*lead, d.shape[-1])


def linear(x, weight, bias=None, *, arch=None):
    """``F.linear``: ``x @ weight.T + bias`` with the pyptx GEMM, ``x (..., in)``, ``weight
    (out, in)`` bf16/f16, ``bias (out,)``; returns ``(..., out)`` in ``x``'s dtype.
    torch: the custom op ``torch.ops.pyptx.linear``, differentiable in all inputs.
    ``arch``: as ``matmul``'s."""
    out = _check("linear", x, weight, bias, None, linear=True)
    x2, lead = _common.rows_of(x)
    family = _arch("linear", x, arch) if framework(x) == "torch" else "sm_90a"
    if family != "sm_90a":
        d = _other_family("linear", family, x2, weight.T, bias, out,
                          _common.wants_grad(x, weight, bias))
    elif framework(x) == "torch":
        _define()
        d = _common.call_op("linear", x2, weight, bias)
    else:
        d = _mm(x2, weight, bias, out, trans_b=True)
    return d.reshape(*lead, d.shape[-1])


def _mm(a, b, bias, out, trans_b=False):
    """The launch: ``host.matmul`` of 2-D ``a (M, K)``, ``b (K, N)`` (a torch ``b`` of any
    strides; JAX: ``trans_b`` for a ``b`` given as ``(N, K)``; a bias cast to the kernel's
    f32), autograd off."""
    from pyptx_kernels.gemm import host

    if framework(a) != "torch":
        import jax.numpy as jnp

        bias = None if bias is None else bias.astype(jnp.float32)
        return host.matmul(a, b, bias=bias, out_dtype=out, trans_b=trans_b)
    import torch

    with torch.no_grad():
        d = host.matmul(a, b, bias=None if bias is None else bias.float(), out_dtype=out)
    return d if d.is_contiguous() else d.contiguous()


# ------------------------------------------------------------------------------ torch ops
def _matmul_impl(a, b, bias, out_dtype):
    return _mm(a, b, bias, out_dtype)


def _linear_impl(x, weight, bias):
    return _mm(x, weight.T, bias, dtype_name(x.dtype))


def _matmul_fake(a, b, bias, out_dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=_common.torch_dtype(out_dtype))


def _linear_fake(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


def _backward_impl(grad, a, b, bias, need_a, need_b, need_bias, linear=False):
    """``(da, db, dbias)`` of ``d = a @ b + bias`` (``b = weight.T`` when ``linear``): the
    gradient rounded to the inputs' type, ``da = g @ b^T`` and ``db = a^T @ g`` (``dweight
    = g^T @ a``) as GEMMs on transposed views, ``dbias`` the f32 column sums; an input that
    needs no gradient gets an empty tensor."""
    import torch

    name = dtype_name(a.dtype)
    g = grad.to(a.dtype)
    empty = lambda: grad.new_empty((0,))  # noqa: E731 (outputs may not alias each other)
    bl = b.T if linear else b
    da = _mm(g, bl.T, None, name) if need_a else empty()
    if need_b:
        db = _mm(g.T, a, None, name) if linear else _mm(a.T, g, None, name)
    else:
        db = empty()
    dbias = grad.sum(0, dtype=torch.float32).to(bias.dtype) if need_bias else empty()
    return da, db, dbias


def _linear_backward_impl(grad, a, b, bias, need_a, need_b, need_bias):
    return _backward_impl(grad, a, b, bias, need_a, need_b, need_bias, linear=True)


def _backward_fake(grad, a, b, bias, need_a, need_b, need_bias):
    def empty():
        return grad.new_empty((0,))

    return (a.new_empty(a.shape) if need_a else empty(),
            b.new_empty(b.shape) if need_b else empty(),
            bias.new_empty(bias.shape) if need_bias else empty())


def _setup(ctx, inputs, output):
    a, b, bias = inputs[:3]
    ctx.save_for_backward(a, b, bias)
    ctx.has_bias = bias is not None


def _grads(ctx, grad, linear):

    a, b, bias = ctx.saved_tensors
    need = ctx.needs_input_grad
    da, db, dbias = _common.call_op("linear_backward" if linear else "matmul_backward", grad, a, b,
                                    bias, need[0], need[1], ctx.has_bias and need[2])
    return (da if need[0] else None, db if need[1] else None,
            dbias if ctx.has_bias and need[2] else None)


def _matmul_backward(ctx, grad):
    return (*_grads(ctx, grad, False), None)


def _linear_backward(ctx, grad):
    return _grads(ctx, grad, True)


@_common.defines_ops
def _define():
    """Define ``pyptx::matmul``, ``pyptx::linear`` and their ``pyptx::<name>_backward``."""
    schema = ("(Tensor grad, Tensor a, Tensor b, Tensor? bias, bool need_a, bool need_b, "
              "bool need_bias) -> (Tensor, Tensor, Tensor)")
    _common.torch_op("matmul_backward", schema, _backward_impl, _backward_fake)
    _common.torch_op("linear_backward", schema, _linear_backward_impl, _backward_fake)
    _common.torch_op("matmul", "(Tensor a, Tensor b, Tensor? bias, str out_dtype) -> Tensor",
                     _matmul_impl, _matmul_fake, _matmul_backward, _setup)
    _common.torch_op("linear", "(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
                     _linear_impl, _linear_fake, _linear_backward, _setup)
    return True

if "torch" in sys.modules:   # a torch user: define the ops before any trace reaches them
    _define()


# ------------------------------------------------------------------------ kernels (ptx())
def _kernels_mm(a, b, bias, out, trans_b=False):
    from pyptx_kernels.gemm import host

    lib = framework(a)
    k = _common.shaped(a, (math.prod(a.shape[:-1]), a.shape[-1]))
    plan = host._plan(k, b, bias, 1.0, None, out, False, trans_b, None, lib)
    return host._cached(*plan.build)


def _kernels_backward(a, b, bias, out, linear):
    """The backward's GEMMs (``_backward_impl``) where a torch input requires grad."""
    if framework(a) != "torch" or not _common.wants_grad(a, b, bias):
        return []
    import torch

    a2 = _common.rows_of(a)[0]
    N = b.shape[0] if linear else b.shape[1]
    g = torch.empty(a2.shape[0], N, dtype=a.dtype, device="meta")
    bl, name = (b.T if linear else b), dtype_name(a.dtype)
    dw = _kernels_mm(g.T, a2, None, name) if linear else _kernels_mm(a2.T, g, None, name)
    return [_kernels_mm(g, bl.T, None, name), dw]


def _kernels_matmul(a, b, *, bias=None, out_dtype=None):
    out = _check("matmul", a, b, bias, out_dtype, launch=False)
    return [_kernels_mm(a, b, bias, out), *_kernels_backward(a, b, bias, out, False)]


def _kernels_linear(x, weight, bias=None):
    out = _check("linear", x, weight, bias, None, linear=True, launch=False)
    if framework(x) != "torch":
        return _kernels_mm(x, weight, bias, out, trans_b=True)
    return [_kernels_mm(x, weight.T, bias, out), *_kernels_backward(x, weight, bias, out, True)]


_kernels = {"matmul": _kernels_matmul, "linear": _kernels_linear}
