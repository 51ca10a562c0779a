"""The deterministic combine of the decode kernel's KV splits: ``combine_row`` (one output
row, emitted into a kernel) and ``build_combine`` (a kernel of it over every row).

One warp per output row (``(b, i, h)`` of ``o (B, Sq, Hq, D)``), each lane ``D // 32``
columns. Two passes over the splits in index order (a fixed order: the result does not
depend on which CTA finished first): the largest ``lse``, then
``o = sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M)`` and ``lse = M + ln(sum)``;
a row whose splits all lack keys gets ``o = 0``, ``lse = -inf``. The decode kernel's last
CTA of a (batch, KV head) runs the same ``combine_row`` (``decode_kernel``), so the one-launch
and two-launch results are bit-identical.
"""

from __future__ import annotations

from pyptx import Tile, kernel, ptx, reg
from pyptx.types import b32, f32, s32, u64
from pyptx_kernels.flash_attention.decode_config import THREADS, WARPS
from pyptx_kernels.flash_attention.fwd_config import LN2, LOG2E, _dtype
from pyptx_kernels.flash_attention.masks import NEG_INF


def pack_words(vals, dt):
    """b32 registers of ``vals`` (f32) rounded to ``dt`` in pairs, element ``2i`` low."""
    words = []
    for i in range(0, len(vals), 2):
        w = reg.scalar(b32)
        ptx.inst(f"cvt.rn.{dt.name}x2.f32")(w, vals[i + 1], vals[i])
        words.append(w)
    return words


def combine_row(pop, plp, po, plse, row, lane, *, N, Sq, Hq, D, splits, dt, load="ld.global"):
    """Emit the combine of output row ``row`` (an s32 register, ``(b, i, h)`` order) by one
    warp (``lane`` its lane): partials at ``pop`` ``(splits, N, D)`` and ``plp``
    ``(splits, N)`` (f32), results to ``po`` ``(B, Sq, Hq, D)`` of ``dt`` and ``plse``
    ``(B, Hq, Sq)`` f32; ``N`` and ``splits`` ints or s32 registers (the decode kernel's
    runtime sizes). ``load``: the partials' load (``"ld.relaxed.gpu.global"`` where other
    CTAs wrote them in this launch)."""
    per = D // 32
    mx = reg.scalar(f32, init=NEG_INF)
    x = reg.scalar(f32)
    off = reg.scalar(u64)
    for s in ptx.loop(0, splits, type=s32):
        ptx.inst.mul.wide.s32(off, s * N + row, 4)
        ptx.inst(f"{load}.f32")(x, ptx.addr(plp + off))
        ptx.inst.max.f32(mx, mx, x)
    m_use = reg.scalar(f32)
    ptx.inst.selp.f32(m_use, 0.0, mx, mx == NEG_INF)
    neg = reg.scalar(f32)
    ptx.inst.mul.f32(neg, m_use, -LOG2E)
    total = reg.scalar(f32, init=0.0)
    acc = [reg.scalar(f32, init=0.0) for _ in range(per)]
    vals = reg.array(f32, per)
    w = reg.scalar(f32)
    col = reg.from_(lane * per, s32)
    for s in ptx.loop(0, splits, type=s32):
        prow = s * N + row
        ptx.inst.mul.wide.s32(off, prow, 4)
        ptx.inst(f"{load}.f32")(x, ptx.addr(plp + off))
        ptx.inst.fma.rn.f32(w, x, LOG2E, neg)
        ptx.inst.ex2.approx.ftz.f32(w, w)
        ptx.inst.add.f32(total, total, w)
        ptx.inst.mul.wide.s32(off, prow * D + col, 4)
        ptx.inst(f"{load}.v{per}.f32")(list(vals), ptx.addr(pop + off))
        for j in range(per):
            ptx.inst.fma.rn.f32(acc[j], vals[j], w, acc[j])
    empty = total <= 0.0
    inv = reg.scalar(f32)
    ptx.inst.rcp.approx.ftz.f32(inv, total)
    ptx.inst.selp.f32(inv, 0.0, inv, empty)
    for a in acc:
        ptx.inst.mul.f32(a, a, inv)
    words = pack_words(acc, dt)
    ptx.inst.mul.wide.s32(off, row * D + col, 2)
    if len(words) > 1:
        ptx.inst(f"st.global.v{len(words)}.b32")(ptx.addr(po + off), list(words))
    else:
        ptx.inst.st.global_.b32(ptx.addr(po + off), words[0])
    lse = reg.scalar(f32)
    ptx.inst.lg2.approx.ftz.f32(lse, total)
    lse = (lse * LN2) + m_use
    ptx.inst.selp.f32(lse, NEG_INF, lse, empty)
    b = row // (Sq * Hq)
    i = (row // Hq) % Sq
    h = row % Hq
    ptx.inst.mul.wide.s32(off, (b * Hq + h) * Sq + i, 4)
    ptx.inst.st.global_.f32(ptx.addr(plse + off), lse, pred=lane == 0)


def build_combine(B, Sq, Hq, D, splits, *, dtype="bf16"):
    """The kernel reducing partials ``o (splits, B*Sq*Hq, D)`` and ``lse (splits, B*Sq*Hq)``
    (f32, from ``decode_kernel.build_decode(combine=False)``) into ``o (B, Sq, Hq, D)`` of
    ``dtype`` and ``lse (B, Hq, Sq)`` f32: the two-launch reference of the decode kernel's
    own combine."""
    dt = _dtype(dtype)
    N = B * Sq * Hq
    deco = kernel(in_specs=(Tile(splits, N, D, f32), Tile(splits, N, f32)),
                  out_specs=(Tile(B, Sq, Hq, D, dt), Tile(B, Hq, Sq, f32)),
                  grid=(-(-N // WARPS), 1, 1), block=(THREADS, 1, 1),
                  name=f"attn_decode_combine_{dt.name}_d{D}_s{splits}")

    def attn_decode_combine(OP, LP, OUT, LSE):
        pop, plp, po, plse = ptx.global_ptrs(OP, LP, OUT, LSE)
        tid = reg.from_(ptx.special.tid.x(), s32)
        cta = reg.from_(ptx.special.ctaid.x(), s32)
        lane = tid & 31
        row = cta * WARPS + (tid >> 5)
        with ptx.if_(row < N):
            combine_row(pop, plp, po, plse, row, lane, N=N, Sq=Sq, Hq=Hq, D=D, splits=splits,
                        dt=dt)
        ptx.ret()

    return deco(attn_decode_combine)
