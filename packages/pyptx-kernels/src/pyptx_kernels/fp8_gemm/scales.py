"""The three kinds of scale of the FP8 GEMM: their shapes (``scale_kind``), their tensor
specs and the loads of scale values in the kernel.

* ``"tensor"``: one f32 each, ``D = sa * sb * (A @ B)``;
* ``"row"``: ``sa (M,)`` and ``sb (N,)``, ``D[m, n] = sa[m] * sb[n] * (A @ B)[m, n]``;
* ``"block"``: ``sa (M, ceil(K/128))`` per 1 x 128 block of A, ``sb (ceil(N/128),
  ceil(K/128))`` per 128 x 128 block of B, ``D[m, n] = sum_kb sa[m, kb] * sb[n // 128, kb]
  * (A @ B over k-block kb)[m, n]``.

The host's part (kinds, specs) imports no tracing code: the loads import it.
"""

from __future__ import annotations

from pyptx import Tile
from pyptx.types import f32

SCALES = ("tensor", "row", "block")
SCALE_BLOCK = 128


def scale_kind(sa_shape, sb_shape, M, N, K):
    """'tensor', 'row' or 'block' from the scales' shapes, or None. Where two kinds fit
    (M = N = 1, or K <= 128 and N = 1) they compute the same thing."""
    sa, sb = tuple(sa_shape), tuple(sb_shape)
    ks, ns = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    if sa in ((), (1,), (1, 1)) and sb in ((), (1,), (1, 1)):
        return "tensor"
    if sa in ((M, 1), (M,)) and sb in ((1, N), (N,)):
        return "row"
    if sa == (M, ks) and sb == (ns, ks):
        return "block"
    return None


def scale_specs(scale, M, N, g):
    """The tensor specs of ``sa`` and ``sb`` (``g``: the problem's ``Geometry``)."""
    if scale == "tensor":
        return (Tile(1, f32), Tile(1, f32))
    if scale == "row":
        return (Tile(M, f32), Tile(N, f32))
    return (Tile(M, g.KS, f32), Tile(g.NS, g.KS, f32))


def load_f32(ptr, index, ok):
    """``ptr[index]`` (f32) where ``ok`` holds, else 0."""
    from pyptx import ptx, reg

    v = reg.scalar(f32, init=0.0)
    ptx.inst.ld.global_.nc.f32(v, ptx.addr(ptr + index * 4), pred=ok)
    return v


def tensor_scale(psa, psb):
    """``sa * sb`` of per-tensor scales (one f32 at each pointer)."""
    from pyptx import ptx, reg

    s_a = reg.scalar(f32)
    s_b = reg.scalar(f32)
    ptx.inst.ld.global_.nc.f32(s_a, ptx.addr(psa))
    ptx.inst.ld.global_.nc.f32(s_b, ptx.addr(psb))
    return s_a * s_b
