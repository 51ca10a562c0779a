"""``scaled_mm`` (tensor-wise and row-wise scales, ``torch._scaled_mm``'s convention) and
``scaled_mm_blockwise`` (1x128 / 128x128 block scales): the FP8 GEMM for torch tensors
(custom ops ``pyptx::scaled_mm``/``pyptx::scaled_mm_blockwise``) and JAX arrays.
Not differentiable: a torch input that requires grad is refused."""

from __future__ import annotations

import sys

from pyptx.errors import ConfigError, ShapeError, SpecError
from pyptx_kernels import _common
from pyptx_kernels._common import dtype_name, fail, framework

BLOCK = 128   # the block scales' K and N extent (fp8_gemm.scales.SCALE_BLOCK)


def _check(who, a, b, scale_a, scale_b, out_dtype, blockwise, launch=True):
    """Validate; return ``(kind, out dtype name)``."""
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise fail(ShapeError, who, f"expects a (M, K) and b (K, N), got {tuple(a.shape)} and "
                   f"{tuple(b.shape)}")
    (M, K), (Kb, N) = tuple(a.shape), tuple(b.shape)
    if Kb != K:
        raise fail(ShapeError, who, f"inner dimensions differ: a is {M}x{K}, b is {Kb}x{N}")
    for x, what in ((a, "a"), (b, "b")):
        if dtype_name(x.dtype) not in ("e4m3", "e5m2"):
            raise fail(SpecError, who, f"{what} must be float8_e4m3fn or float8_e5m2, got "
                       f"{x.dtype}")
    for x, what in ((scale_a, "scale_a"), (scale_b, "scale_b")):
        if dtype_name(x.dtype) != "f32":
            raise fail(SpecError, who, f"{what} must be float32, got {x.dtype}")
    sa, sb = tuple(scale_a.shape), tuple(scale_b.shape)
    ks, ns = -(-K // BLOCK), -(-N // BLOCK)
    one = ((), (1,), (1, 1))
    if blockwise:
        kind = "block" if sa == (M, ks) and sb == (ns, ks) else None
        want = f"scale_a ({M}, {ks}) and scale_b ({ns}, {ks}) (1x128 and 128x128 blocks)"
    elif sa in one and sb in one:
        kind = "tensor"
    else:
        kind = "row" if sa == (M, 1) and sb == (1, N) else None
        want = f"one element each (tensor-wise) or scale_a ({M}, 1) and scale_b (1, {N}) (row-wise)"
    if kind is None:
        raise fail(ShapeError, who, f"scales {sa} and {sb} for {M}x{N}x{K}: want {want}")
    out = dtype_name(out_dtype)
    if out not in ("bf16", "f32"):
        raise fail(ConfigError, who, f"out_dtype must be bfloat16 or float32, got {out_dtype!r}")
    if len({framework(x) for x in (a, b, scale_a, scale_b)}) > 1:
        raise fail(SpecError, who, "inputs must all be torch tensors or all JAX arrays")
    if framework(a) == "torch" and _common.wants_grad(a, b, scale_a, scale_b):
        raise fail(ConfigError, who, "not differentiable: an input requires grad (detach it, "
                   "or call under torch.no_grad())")
    if launch:
        _common.check_devices(who, a, b, scale_a, scale_b)
    return kind, out


def scaled_mm(a, b, scale_a, scale_b, *, out_dtype="bf16", use_fast_accum=False):
    """``(a @ b) * scale_a * scale_b`` for fp8 (e4m3/e5m2) ``a (M, K)`` and ``b (K, N)``
    (``torch._scaled_mm``: ``b = w.t()`` of a contiguous ``w (N, K)`` is read without a
    copy); f32 scales of one element each (tensor-wise) or ``(M, 1)`` and ``(1, N)``
    (row-wise); returns ``(M, N)`` in ``out_dtype`` (bfloat16 default, or float32).
    ``use_fast_accum``: accumulate in the tensor cores' fp8 accumulator between promotions.
    torch: ``torch.ops.pyptx.scaled_mm``."""
    kind, out = _check("scaled_mm", a, b, scale_a, scale_b, out_dtype, False)
    if framework(a) != "torch":
        return _scaled(a, b, scale_a, scale_b, out, bool(use_fast_accum), kind)
    _define()
    return _common.call_op("scaled_mm", a, b, scale_a, scale_b, out,
                                                    bool(use_fast_accum))


def scaled_mm_blockwise(a, b, scale_a, scale_b, *, out_dtype="bf16"):
    """``a @ b`` of fp8 ``a (M, K)``, ``b (K, N)`` with DeepSeek-style block scales:
    ``scale_a (M, ceil(K/128))`` per 1x128 block of ``a``, ``scale_b (ceil(N/128),
    ceil(K/128))`` per 128x128 block of ``b`` (f32); returns ``(M, N)`` in ``out_dtype``.
    torch: ``torch.ops.pyptx.scaled_mm_blockwise``."""
    _, out = _check("scaled_mm_blockwise", a, b, scale_a, scale_b, out_dtype, True)
    if framework(a) != "torch":
        return _scaled(a, b, scale_a, scale_b, out, False, "block")
    _define()
    return _common.call_op("scaled_mm_blockwise", a, b, scale_a, scale_b, out)


def _scaled(a, b, scale_a, scale_b, out, fast_accum, kind):
    """The launch (``fp8_gemm.host.scaled_mm``)."""
    from pyptx_kernels.fp8_gemm import host

    d = host.scaled_mm(a, b, scale_a, scale_b, out_dtype=out, scale=kind,
                       fast_accum=fast_accum)
    if framework(d) == "torch" and not d.is_contiguous():
        d = d.contiguous()
    return d


def _kind(scale_a, scale_b):
    return "tensor" if scale_a.numel() == 1 and scale_b.numel() == 1 else "row"


def _fake(a, b, scale_a, scale_b, out_dtype, *rest):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=_common.torch_dtype(out_dtype))


@_common.defines_ops
def _define():
    """Define ``pyptx::scaled_mm`` and ``pyptx::scaled_mm_blockwise`` (no autograd)."""
    _common.torch_op("scaled_mm", "(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, "
                     "str out_dtype, bool use_fast_accum) -> Tensor",
                     lambda a, b, sa, sb, out, fast: _scaled(a, b, sa, sb, out, fast,
                                                             _kind(sa, sb)), _fake)
    _common.torch_op("scaled_mm_blockwise", "(Tensor a, Tensor b, Tensor scale_a, "
                     "Tensor scale_b, str out_dtype) -> Tensor",
                     lambda a, b, sa, sb, out: _scaled(a, b, sa, sb, out, False, "block"), _fake)
    return True

if "torch" in sys.modules:   # a torch user: define the ops before any trace reaches them
    _define()


def _kernel(a, b, kind, out, fast_accum):
    """``scaled_mm``'s kernel for these operands (K padded to 16, N to the store's rows)."""
    from pyptx_kernels.fp8_gemm import host

    (M, K), N = tuple(a.shape), b.shape[1]
    return host.kernel_for(M, N, K, scale=kind, dtype=dtype_name(a.dtype),
                           dtype_b=dtype_name(b.dtype), out_dtype=out,
                           fast_accum=fast_accum)[0]


def _kernels_scaled_mm(a, b, scale_a, scale_b, *, out_dtype="bf16", use_fast_accum=False):
    kind, out = _check("scaled_mm", a, b, scale_a, scale_b, out_dtype, False, launch=False)
    return _kernel(a, b, kind, out, use_fast_accum)


def _kernels_scaled_mm_blockwise(a, b, scale_a, scale_b, *, out_dtype="bf16"):
    _, out = _check("scaled_mm_blockwise", a, b, scale_a, scale_b, out_dtype, True, launch=False)
    return _kernel(a, b, "block", out, False)


_kernels = {"scaled_mm": _kernels_scaled_mm, "scaled_mm_blockwise": _kernels_scaled_mm_blockwise}
