"""Pieces every attention-backward kernel shares: the CTA tile sizes, the ``ConfigError`` of a
bad call and the shape checks, the options the kernels resolve alike (``safe``/``sync``, from
``PYPTX_ATTN_BWD_SAFE``/``_SYNC``), and the trace-time helpers (exp2, 16-bit packing, bulk
tensor loads of 64-column slabs, predicated row stores, the producer's ring step)."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

from pyptx import Tile, ptx, reg
from pyptx.errors import ConfigError
from pyptx.source import where_outside
from pyptx.types import b16, b32, bf16, f16, f32, pred, u32, u64
from pyptx_kernels._common import PACKAGE_DIR

LOG2E = 1.4426950408889634
SMEM_LIMIT = 227 * 1024 - 256
BM = 128          # rows a CTA owns (two consumer warpgroups of 64)
DKDV_BQ = 64     # q rows per dK/dV block (build_dkdv's default BQ)
THREADS = 384     # producer warpgroup + two consumers
FUSED_BQ = 128    # q rows per block of the fused kernel (64 per consumer warpgroup)
#: The ordered dQ mode's rotated order (full attention) makes the last kv block of a head wait
#: for kv block 0, which the grid launches last: every kv block of a head must be resident at
#: once, so it is used only up to this many kv blocks (half an H100's SMs at one CTA per SM);
#: longer sequences take the ascending order, whose waits all point at earlier CTAs.
ROTATE_MAX_KV = 64
#: dq_convert: 64-row q blocks a converter CTA takes per turn (their loads in flight together)
CONVERT_BLOCKS = 2
PROD_REGS, CONS_REGS = 24, 240


def _fail(msg):
    """A ``ConfigError`` whose message starts with the ``file:line`` of the first caller
    outside this example and pyptx (the user's call)."""
    return ConfigError(f"{where_outside(PACKAGE_DIR)}: {msg}")


def _dtype(name):
    table = {"bf16": bf16, "f16": f16, bf16: bf16, f16: f16}
    if name not in table:
        raise _fail(f"build_attention_backward: dtype must be 'bf16' or 'f16', got {name!r}")
    return table[name]


def check_shapes(B, S, Hq, Hkv, D, Sk):
    """Raise ``ConfigError`` unless the sizes are ones the kernels handle."""
    for name, v in (("B", B), ("S", S), ("Hq", Hq), ("Hkv", Hkv), ("D", D), ("Sk", Sk)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise _fail(f"build_attention_backward: {name} must be a positive int, got {v!r}")
    if D not in (64, 128):
        raise _fail(f"build_attention_backward: head dim D must be 64 or 128, got {D}")
    if Hq % Hkv:
        raise _fail(f"build_attention_backward: Hq ({Hq}) must be a multiple of Hkv ({Hkv})")


#: the memory orders q, k, v may have (``layouts``): ``(B, S, H, D)`` or ``(B, H, S, D)``
LAYOUTS = ("bshd", "bhsd")
BSHD3 = ("bshd",) * 3


def check_layouts(fn, layouts):
    """``layouts`` (q, k, v's memory orders) as a tuple of three of ``LAYOUTS``."""
    if (not isinstance(layouts, (tuple, list)) or len(layouts) != 3
            or any(x not in LAYOUTS for x in layouts)):
        raise _fail(f"{fn}: layouts must be three of {LAYOUTS} (q, k, v), got {layouts!r}")
    return tuple(layouts)


def layout_tag(layouts):
    """The kernel-name suffix of non-default ``layouts`` (``""`` for ``BSHD3``)."""
    return "" if tuple(layouts) == BSHD3 else "_" + "".join(x[1] for x in layouts)


def input_spec(B, L, H, D, dt, layout):
    """The ``Tile`` of a q, k or v input of ``L`` rows and ``H`` heads in ``layout``."""
    return Tile(B, H, L, D, dt) if layout == "bhsd" else Tile(B, L, H, D, dt)


def input_box(rows, layout):
    """The tensor-map options of ``rows x 64`` tiles of a q, k or v input in ``layout``."""
    return {"box": (1, 1, rows, 64) if layout == "bhsd" else (1, rows, 1, 64),
            "swizzle": "128B"}


# ------------------------------------------------------------------ trace-time helpers
def _ex2(x):
    r = reg.scalar(f32)
    ptx.inst.ex2.approx.ftz.f32(r, x)
    return r


def _capped_p(dst, s, cap, nlse2, derivative=False):
    """The soft-capped probability of the raw score ``s`` (the forward's math: ``t =
    tanh.approx(s cap[0])``, ``cap = (scale / softcap, softcap * log2 e)``) into ``dst``:
    ``P = exp2(t cap[1] + nlse2)``; ``derivative``: ``P (1 - t^2)`` (the capped score's
    derivative folded in)."""
    t, p = reg.scalar(f32), reg.scalar(f32)
    ptx.inst.mul.f32(t, s, cap[0])
    ptx.inst.tanh.approx.f32(t, t)
    ptx.inst.fma.rn.f32(p, t, cap[1], nlse2)
    ptx.inst.ex2.approx.ftz.f32(p, p)
    if not derivative:
        ptx.inst.mov.f32(dst, p)
        return
    _slope_times(dst, p, t)


def _slope_times(dst, p, t):
    """``dst = p (1 - t^2)``."""
    nt, g = reg.scalar(f32), reg.scalar(f32)
    ptx.inst.neg.f32(nt, t)
    ptx.inst.fma.rn.f32(g, nt, t, 1.0)
    ptx.inst.mul.f32(dst, p, g)


def _cap_slope(p, cap, nlse2):
    """``p`` (a capped probability of ``_capped_p``, masked to 0 or not) times its score's
    derivative ``1 - t^2``, ``t = (log2 p - nlse2) / cap[1]`` recovered from ``p`` itself
    (0 stays 0)."""
    t = reg.scalar(f32)
    ptx.inst.lg2.approx.ftz.f32(t, p)
    ptx.inst.sub.f32(t, t, nlse2)
    ptx.inst.mul.f32(t, t, 1.0 / cap[1])
    r = reg.scalar(f32)
    _slope_times(r, p, t)
    ptx.inst.selp.f32(p, r, 0.0, p > 0.0)


def softcap_constants(scale, softcap):
    """``cap`` of ``_capped_p`` for a soft cap (``None`` without one)."""
    return (float(scale) / softcap, softcap * LOG2E) if softcap else None


def _selp(a, b, p):
    r = reg.scalar(f32)
    ptx.inst.selp.f32(r, a, b, p)
    return r


def _pack(dst, src, dt):
    """``dst[m]`` = the 16-bit pair ``(src[2m], src[2m+1])`` (low half first)."""
    for m in range(len(dst)):
        ptx.inst(f"cvt.rn.{dt.name}x2.f32")(dst[m], src[2 * m + 1], src[2 * m])


def _unpack(word, dt):
    """The two f32 values of a packed 16-bit pair (low half first)."""
    lo, hi = reg.scalar(b16), reg.scalar(b16)
    ptx.inst.mov.b32([lo, hi], word)
    a, b = reg.scalar(f32), reg.scalar(f32)
    ptx.inst(f"cvt.f32.{dt.name}")(a, lo)
    ptx.inst(f"cvt.f32.{dt.name}")(b, hi)
    return a, b


def _min_u32(a, b):
    r = reg.scalar(u32)
    ptx.inst.min.u32(r, a, b)
    return r


def _load_slabs(dst, tmap, d_slabs, head, row0, batch, rows, bar, layout="bshd"):
    """One bulk tensor copy per 64-column slab of a ``rows x D`` tile of a (B, S, H, D)
    tensor (``layout="bhsd"``: of a (B, H, S, D) one)."""
    for i in range(d_slabs):
        at = (64 * i, row0, head, batch) if layout == "bhsd" else (64 * i, head, row0, batch)
        ptx.tma.load_tile(dst + i * rows * 128 if i else dst, tmap, at, bar)


def _load_pair(dst, first, second, offset, d_slabs, head, row0, batch, rows, bar,
               layouts=("bshd", "bshd")):
    """``rows`` rows from ``row0`` of tensors ``first`` and ``second`` (head ``head`` of
    batch ``batch``; memory orders ``layouts``) into ``dst`` and ``dst + offset``,
    completing on ``bar``."""
    first_map = ptx.tma.tensormap_ptr(first.tmap)
    second_map = ptx.tma.tensormap_ptr(second.tmap)
    _load_slabs(dst, first_map, d_slabs, head, row0, batch, rows, bar, layouts[0])
    _load_slabs(dst + offset, second_map, d_slabs, head, row0, batch, rows, bar, layouts[1])


def _store_rows(acc, ptr, row, valid, H, D, head, batch, S, col0, scale, dt):
    """Store a consumer's 64 x D f32 accumulator (times ``scale``) as 16-bit pairs into a
    ``(B, S, H, D)`` tensor: this thread's rows ``row`` and ``row + 8`` (``valid`` guards)."""
    _store_tensor_rows(acc, ptr, lambda r: batch * S + row + r, valid, H, D, head, col0, scale,
                       dt)


def _store_tensor_rows(acc, ptr, tensor_row, valid, H, D, head, col0, scale, dt):
    """``_store_rows`` with the thread's rows given as ``tensor_row(r)`` (``r`` 0 or 8), the
    row index in the tensor flattened to ``(rows, H, D)``."""
    rbase = []
    for r in (0, 8):
        elem = (tensor_row(r) * H + head) * D + col0
        rbase.append(reg.from_(elem, u64) * 2 + ptr)
    for i, dr, dc in acc.pairs():
        packed = reg.scalar(b32)
        v0, v1 = acc[i], acc[i + 1]
        if scale != 1.0:
            v0, v1 = v0 * float(scale), v1 * float(scale)
        ptx.inst(f"cvt.rn.{dt.name}x2.f32")(packed, v1, v0)
        ptx.inst.st.global_.b32(ptx.addr(rbase[dr // 8], dc * 2), packed, pred=valid[dr // 8])


def _store_split_partials(dk_acc, dv_acc, base, dv_off, split, store):
    """``kv_split`` (the dK/dV and fused kernels, consumer threads ``128..383``, after the
    last block, with the producer warps gone): sum the cluster's dK and dV partials and
    store this CTA's share. Each thread writes its ``D/2 + D/2`` f32 registers into its own
    CTA's shared memory (dK's at ``base``, over the K/V head tile; dV's at ``base + dv_off``,
    over the ring; slot group ``j`` = registers ``4j..4j+3`` of every thread, 16 bytes each,
    thread after thread); after a cluster barrier (release/acquire) CTA rank ``r`` adds
    chunk ``r`` of the ``D`` registers (``D / split`` of them: a column range of dK or of
    dV) from every CTA in rank order 0, 1, ... through distributed shared memory, the
    same sum at every run, and calls ``store(part, col, is_dv)``: ``part`` an
    ``Accumulator`` of the chunk (its register ``i`` at column ``col + coord(i)`` of the
    fragment), ``col`` the column offset (an int or a u32 register), ``is_dv`` False for
    dK, True for dV (each call under its own branch); a second cluster barrier keeps each
    CTA's shared memory alive until its peers have read it."""
    from pyptx.fragment import Accumulator

    D = 2 * len(dk_acc.regs)
    m = D // split                      # the chunk: registers per CTA
    per = split // 2                    # chunks per accumulator
    ptx.bar_sync(1, 256)                # both warpgroups are done with K, V and the ring
    mine = base + (reg.from_(ptx.special.tid.x(), u32) - 128) * 16
    for t, acc in ((0, dk_acc), (1, dv_acc)):
        for j in range(len(acc.regs) // 4):
            ptx.inst.st.shared.v4.f32(ptx.addr(mine, t * dv_off + j * 4096),
                                      list(acc.regs)[4 * j:4 * j + 4])
    ptx.cluster_sync()                  # release the partials, acquire the peers'
    rank = ptx.cluster.ctarank()
    is_dv = rank >= per
    within = rank % per if per > 1 else None    # the chunk within its accumulator
    off = reg.scalar(u32)
    ptx.inst.selp.u32(off, dv_off, 0, is_dv)
    at = mine + off if within is None else mine + off + within * (m // 4 * 4096)
    peers = [ptx.cluster.map_shared(at, p) for p in range(split)]
    part = Accumulator(2 * m)
    for j in range(m // 4):
        for p in range(split):          # rank order: the same sum at every run
            v4 = reg.array(f32, 4)
            ptx.inst("ld.shared::cluster.v4.f32")(v4, ptx.addr(peers[p], j * 4096))
            for e in range(4):
                if p == 0:
                    ptx.inst.mov.f32(part[4 * j + e], v4[e])
                else:
                    ptx.inst.add.f32(part[4 * j + e], part[4 * j + e], v4[e])
    col = 0 if within is None else within * (2 * m)   # register 4k of a chunk: column 8k
    for dv, which in ((False, ~is_dv), (True, is_dv)):
        with ptx.if_(which):
            store(part, col, dv)
    ptx.cluster_sync()                  # no CTA leaves while a peer reads its partials


def padded(S):
    """Rows of the STATS scratch: ``S`` rounded up to the dQ kernel's 128-row tiles."""
    return -(-S // BM) * BM


def _smem_fit(fixed, per_stage, most=4):
    return max(2, min(most, (SMEM_LIMIT - fixed - 1024) // per_stage))


def _common_options(B, S, Hq, Hkv, D, Sk, dtype, scale, safe, sync):
    """The options both backward kernels resolve alike: ``(Sk, dt, scale, safe, sync, G, Sp)``
    (shapes checked; ``safe``/``sync`` default from ``PYPTX_ATTN_BWD_SAFE``/``_SYNC``)."""
    Sk = S if Sk is None else Sk
    check_shapes(B, S, Hq, Hkv, D, Sk)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    safe = safe_default() if safe is None else safe
    # the fast schedule holds a stage until the next block: waiting for it would deadlock
    sync = (_env("PYPTX_ATTN_BWD_SYNC") if sync is None else sync) and safe
    return Sk, _dtype(dtype), scale, safe, sync, Hq // Hkv, padded(S)


def size_params(sizes):
    """The sizes a kernel reads at run time (``name -> int``: sequence lengths, batch and what
    the host derives from them) as u32 kernel parameters, declared where this is called (the
    kernel's start, before any branch): a namespace of their registers. The PTX does not
    depend on the values, so a kernel of another size reuses the trace
    (``pyptx_kernels._family``)."""
    return SimpleNamespace(**{n: ptx.scalar_param(u32, int(v), name=n) for n, v in sizes.items()})


def heavy_groups(kv_heads, kv_ctas, num_sms=132):
    """``heavy_first``'s groups of kv heads as ``(base, extra)``: as few groups as hold two
    waves of ``num_sms`` CTAs each (``kv_ctas`` per head) or more, sizes within one of
    each other: the first ``extra`` groups ``base + 1`` heads, the others ``base``. A
    group's longest CTAs start together, and only a few heads' Q, dO and dQ accumulators
    are read at once (L2)."""
    per = max(1, -(-2 * num_sms // kv_ctas))
    count = -(-kv_heads // per)
    return kv_heads // count, kv_heads % count


def heavy_first_cta(split, kv_blocks, Hkv, base, extra, flat=False):
    """``(kv block, kv head, batch)`` of this CTA under ``heavy_first``: its cluster's place
    in launch order (``flat``: a 1-D grid; else the ``(kv_blocks * split, Hkv, B)`` grid's
    x-fastest order), the groups of ``heavy_groups`` (``base``, ``extra``) one after
    another, each running kv block 0 of its heads, then block 1, ... (u32 registers)."""
    unit = reg.from_(ptx.special.ctaid.x(), u32)
    if split > 1:
        unit = unit // split
    if not flat:
        unit = unit + kv_blocks * (reg.from_(ptx.special.ctaid.y(), u32)
                                   + Hkv * reg.from_(ptx.special.ctaid.z(), u32))
    big = base + 1
    big_units = extra * big * kv_blocks
    in_big = unit < big_units
    size, rel, first = (reg.scalar(u32) for _ in range(3))
    ptx.inst.selp.u32(size, big, base, in_big)
    ptx.inst.selp.u32(rel, unit, unit - big_units, in_big)
    ptx.inst.selp.u32(first, 0, extra * big, in_big)
    per = size * kv_blocks
    grp = rel // per
    idx = rel - grp * per
    kb = idx // size
    head = first + grp * size + (idx - kb * size)
    return kb, head % Hkv, head // Hkv


def block_steps(heads, lo, hi, per_head, q_outer=False):
    """A dK/dV CTA's blocks as ``(per_head(g), step)``: each head ``g < heads`` in turn over
    the steps ``lo..hi`` (``per_head`` formed once per head), or, ``q_outer``, each step
    over every head (``heavy_first``'s lock-step order). Every loop over a CTA's blocks
    (producer, dQ writer, consumers) walks them this way."""
    if q_outer:
        for step in ptx.loop(lo, hi):
            for g in ptx.loop(0, heads):
                yield per_head(g), step
        return
    for g in ptx.loop(0, heads):
        h = per_head(g)
        for step in ptx.loop(lo, hi):
            yield h, step


def _cdiv(x, n):
    """``ceil(x / n)`` of a non-negative int or u32 register ``x`` and an int ``n``."""
    return (x + (n - 1)) // n


def _fill_stage(pipe, st, nbytes, stage_bytes, base, ring_off, load, sync):
    """The producer's step of every backward ring: acquire stage ``st``, arm it for
    ``nbytes``, ``load(stage_address, bar)`` its copies, advance (``sync``, a bisecting aid:
    first wait until the consumers released it)."""
    pipe.acquire(st)
    bar = pipe.arm(st, nbytes)
    sb = st.stage * stage_bytes + (base + ring_off)
    load(sb, bar)
    if sync:
        ptx.mbarrier.wait(pipe.empty.at(st.stage), st.phase ^ 1)
    st.advance()


def _or(p, q):
    r = reg.scalar(pred)
    ptx.inst("or.pred")(r, p, q)
    return r


def _maybe_if(p):
    from contextlib import nullcontext

    return nullcontext() if p is None else ptx.if_(p)


def dq_accumulator_width(D, bulk, chains=1):
    """Columns per row of the atomic modes' f32 dQ accumulator: ``D``, or 128 for the bulk
    reductions (D=64: the two consumer warpgroups' partial sums side by side, added by the
    conversion kernel in a fixed order); ``chains`` (``dq_chains``) such accumulators side by
    side, chain ``c``'s from column ``c * dq_accumulator_width(D, bulk)``."""
    return (128 if bulk else D) * chains


def _env(name):
    return os.environ.get(name, "0") not in ("", "0")


def safe_default():
    """Whether ``PYPTX_ATTN_BWD_SAFE`` asks for the simplest schedule (a bisecting aid)."""
    return _env("PYPTX_ATTN_BWD_SAFE")


# ------------------------------------------------------------------ packed variable length
