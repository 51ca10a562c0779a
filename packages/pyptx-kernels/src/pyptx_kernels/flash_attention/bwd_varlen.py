"""The backward of packed variable-length attention (``attention_varlen``'s layout: ``(T, H, D)``
tensors, ``cu_seqlens`` int32 ``(B + 1,)`` on the device, ``lse (Hq, Tq)``): the deterministic
dQ / dK-dV pair (``build_dq_varlen``, ``build_dkdv_varlen``) through rank-3 tensor maps, each
CTA's sequence bounds read on the device and every mask taken from the sequence's lengths;
``build_attention_backward_varlen`` returns them as one ``AttentionBackwardVarlen``. The
atomic, bulk, ordered, fused and converting plans are refused there (``VARLEN_REFUSED``)."""

from __future__ import annotations

import functools
import math

from pyptx import Tile, kernel, ptx, reg
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.pipeline import BarrierArray, Pipeline
from pyptx.types import f32, s32, u32, u64
from pyptx.warpspec import Roles, ring_base, thread_ids
from pyptx_kernels import _family
from pyptx_kernels.flash_attention.bwd_common import (
    BM,
    CONS_REGS,
    DKDV_BQ,
    LOG2E,
    PROD_REGS,
    SMEM_LIMIT,
    THREADS,
    _dtype,
    _env,
    _fail,
    _maybe_if,
    _min_u32,
    _or,
    _selp,
    _smem_fit,
    _store_tensor_rows,
    safe_default,
    size_params,
    softcap_constants,
)
from pyptx_kernels.flash_attention.bwd_dkdv import (
    RELEASE_ARRIVALS,
    _dkdv_block,
    _dkdv_consumer_regs,
    _dkdv_drain,
    _dkdv_producer,
    _mask_window,
)
from pyptx_kernels.flash_attention.bwd_dq import _dq_consumer, _dq_producer, _window_plan
from pyptx_kernels.flash_attention.bwd_plan import BackwardPlan, default_dq_bkv
from pyptx_kernels.flash_attention.bwd_prep import _quad_row_stats
from pyptx_kernels.flash_attention.fwd_kernel import _feature_tag as feature_tag
from pyptx_kernels.flash_attention.fwd_kernel import check_softcap, check_window
from pyptx_kernels.flash_attention.masks import query_blocks

#: STATS rows per q head past the last sequence's, for the varlen dK/dV kernel's reads of
#: its last q block (``padded_varlen``).
VARLEN_PAD = 128
#: ``build_attention_backward`` options the varlen pair does not have (its dK/dV kernel is
#: the plain mode: dQ comes from the dQ kernel, out of place, deterministic).
VARLEN_REFUSED = ("atomic_dq", "dq_bulk", "dq_ordered", "fused_bq", "fused_defer",
                  "fused_pingpong", "dq_convert", "convert_lag", "stats_lead")


def padded_varlen(Tq, B):
    """Rows per q head of the varlen STATS scratch ``(Hq, padded_varlen(Tq, B), 2)``:
    sequence ``b``'s rows start at the even row ``cu_q[b] + (cu_q[b] & 1) + 2 b``
    (``_stats_base``: 16-byte aligned for the dK/dV kernel's bulk copies and vector loads,
    and never overlapping the previous sequence's), ``Tq + 2 B`` rows for them all, plus
    ``VARLEN_PAD`` so a q block read past the last sequence's end stays in bounds; an even
    count, so every q head's rows start 16-byte aligned too."""
    return Tq + (Tq & 1) + 2 * B + VARLEN_PAD


def _stats_base(q_start, b):
    """The first STATS row of sequence ``b`` (u32 registers in and out; ``padded_varlen``)."""
    return q_start + (q_start & 1) + b * 2


def check_varlen_shapes(fn, Tq, Tk, B, Hq, Hkv, D, max_seqlen):
    """Raise ``ConfigError`` (naming ``fn``) unless the packed sizes are ones the varlen
    kernels handle (D 64 or 128, ``Hq`` a multiple of ``Hkv``)."""
    for name, v in (("Tq", Tq), ("Tk", Tk), ("B", B), ("Hq", Hq), ("Hkv", Hkv), ("D", D),
                    ("max_seqlen", max_seqlen)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise _fail(f"{fn}: {name} must be a positive int, got {v!r}")
    if D not in (64, 128):
        raise _fail(f"{fn}: head dim D must be 64 or 128, got {D}")
    if Hq % Hkv:
        raise _fail(f"{fn}: Hq ({Hq}) must be a multiple of Hkv ({Hkv})")


def _varlen_options(fn, Tq, Tk, B, Hq, Hkv, D, max_seqlen, dtype, scale, safe, sync):
    check_varlen_shapes(fn, Tq, Tk, B, Hq, Hkv, D, max_seqlen)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    safe = safe_default() if safe is None else bool(safe)
    sync = (_env("PYPTX_ATTN_BWD_SYNC") if sync is None else sync) and safe
    return _dtype(dtype), scale, safe, sync, Hq // Hkv, padded_varlen(Tq, B)


def _seq_bounds(CUQ, CUK, b):
    """``(q_start, seqlen_q, k_start, seqlen_k)`` of sequence ``b`` (u32 registers), read
    from the device's ``cu_seqlens_q``/``cu_seqlens_k`` (no host sync: graph-capturable)."""
    pq, pk = ptx.global_ptrs(CUQ, CUK)
    off = reg.from_(b, u64) * 4
    q_start, q_end, k_start, k_end = (reg.scalar(u32) for _ in range(4))
    ptx.inst.ld.global_.nc.u32(q_start, ptx.addr(pq + off))
    ptx.inst.ld.global_.nc.u32(q_end, ptx.addr(pq + off, 4))
    ptx.inst.ld.global_.nc.u32(k_start, ptx.addr(pk + off))
    ptx.inst.ld.global_.nc.u32(k_end, ptx.addr(pk + off, 4))
    return q_start, q_end - q_start, k_start, k_end - k_start


def _load_slabs3(dst, tmap, d_slabs, head, row, rows, bar):
    """``_load_slabs`` through a rank-3 ``(T, H, D)`` map (``row``: a packed row)."""
    for i in range(d_slabs):
        ptx.tma.load_tile(dst + i * rows * 128 if i else dst, tmap, (64 * i, head, row), bar)


def _store_rows_varlen(acc, ptr, start, row, valid, H, D, head, col0, scale, dt):
    """``_store_rows`` into a packed ``(T, H, D)`` tensor: this thread's rows ``start + row``
    and ``+ 8`` (``row`` within the sequence; ``valid`` guards: rows past the sequence's end
    belong to the next one)."""
    _store_tensor_rows(acc, ptr, lambda r: start + row + r, valid, H, D, head, col0, scale, dt)


def _row_stats_varlen(po, pdo, plse, pstats, hq, q_start, sbase, qrow, valid, lane, Tq, Sp,
                      Hq, D, dt):
    """``_row_stats`` of a packed batch: rows ``q_start + qrow`` and ``+ 8``, loads and the
    STATS store predicated on ``valid`` (a row past the sequence's end is the next
    sequence's: its stats are that sequence's CTAs' to write)."""
    return _quad_row_stats(po, pdo, plse, pstats, hq, lambda r: q_start + qrow + r,
                           lambda r: hq * Tq + q_start + qrow + r,
                           lambda r: hq * Sp + sbase + qrow + r, valid, True, lane, Hq, D, dt)


def _min_s32(a, b):
    r = reg.scalar(s32)
    ptx.inst.min.s32(r, a, b)
    return r


def build_dq_varlen(Tq, Tk, B, Hq, Hkv, D, max_seqlen_q, *, dtype="bf16", causal=False,
                    scale=None, BKV=None, stages=None, sync=None, safe=None, window=(-1, -1),
                    softcap=0.0):
    """The varlen dQ kernel: ``(Q, K, V, CUQ, CUK, OUT, LSE, DO) -> (DQ, STATS)`` for packed
    ``q/o/do (Tq, Hq, D)``, ``k/v (Tk, Hkv, D)``, ``cu_seqlens`` int32 ``(B + 1,)``, ``lse
    (Hq, Tq)``; STATS ``(Hq, padded_varlen(Tq, B), 2)`` (``(lse2, delta)`` of every row of
    every sequence, at ``_stats_base``; the rows between and after sequences unwritten).
    ``build_dq``'s schedule on a grid of ``ceil(max_seqlen_q / 128)`` blocks per (q head,
    sequence); a CTA past its sequence's end returns before any barrier. Every mask is the
    sequence's (lengths read on the device): keys past its end (the next sequence's rows)
    and, causal, above its top-left diagonal get ``P = 0`` by a select; the fast schedule
    masks the blocks where that can happen (``j * BKV + BKV > seqlen_k``, the diagonal), the
    safe one every block. dQ is stored for the sequence's rows only."""
    dt, scale, safe, sync, G, Sp = _varlen_options("build_dq_varlen", Tq, Tk, B, Hq, Hkv, D,
                                                   max_seqlen_q, dtype, scale, safe, sync)
    BKV = default_dq_bkv(D) if BKV is None else BKV
    if BKV not in (32, 64, 128):
        raise _fail(f"build_dq_varlen: BKV must be 32, 64 or 128, got {BKV!r}")
    q_tile = OperandTile(BM, D, dt, major="K")
    k_tile = OperandTile(BKV, D, dt, major="K")
    k_mn = OperandTile(D, BKV, dt, major="MN")
    slabs = D // 64
    stage_bytes = 2 * k_tile.nbytes
    head_bytes = 2 * q_tile.nbytes
    stages = _smem_fit(head_bytes, stage_bytes) if stages is None else stages
    smem_total = head_bytes + stages * stage_bytes + 1024
    if smem_total > SMEM_LIMIT:
        raise _fail(f"build_dq_varlen: {stages} stages of {BKV} rows need {smem_total} bytes")
    c1 = scale * LOG2E
    window = tuple(window)
    windowed = window != (-1, -1)
    cap = softcap_constants(scale, softcap)
    qspec = Tile(Tq, Hq, D, dt)
    kspec = Tile(Tk, Hkv, D, dt)
    cu = Tile(B + 1, s32)

    sizes = dict(total_q=Tq, stats_rows=Sp)

    def dq_kernel(Q, K, V, CUQ, CUK, OUT, LSE, DO, DQ, STATS):
        z = size_params(sizes)
        Tq, Sp = z.total_q, z.stats_rows
        tid, wg = thread_ids()
        mi = reg.from_(ptx.special.ctaid.x(), u32)
        hq = reg.from_(ptx.special.ctaid.y(), u32)
        b = reg.from_(ptx.special.ctaid.z(), u32)
        q_start, seqlen_q, k_start, seqlen_k = _seq_bounds(CUQ, CUK, b)
        ptx.ret(pred=mi * BM >= seqlen_q)       # past the sequence: the whole CTA, first
        qb = mi
        if causal:  # the longest rows first, within this sequence's blocks
            qb = ((seqlen_q + (BM - 1)) // BM - 1) - mi
        hk = hq // G if G > 1 else hq
        q0 = qb * BM
        base = ring_base("smem")
        pipe = Pipeline(stages, consumer_arrivals=2)
        head_bar = BarrierArray(1, name="head_bar")
        pipe.init(pred=tid == 0)
        head_bar.init(1, pred=tid == 0)
        ptx.bar_sync(0)
        n_kv = (seqlen_k + (BKV - 1)) // BKV
        first, window_kw = 0, None
        if windowed:    # the sequence's kv blocks the window reaches
            first, n_kv, window_kw = _window_plan(q0, reg.from_(seqlen_q, s32),
                                                  reg.from_(seqlen_k, s32), BKV, causal, window)
        elif causal:  # blocks wholly above the diagonal are skipped
            n_kv = _min_u32((q0 + (BM - 1)) // BKV + 1, n_kv)
        roles = Roles(wg, PROD_REGS)
        # ------------------------------------------------------------ producer
        def load_head(hbar):
            q_map = ptx.tma.tensormap_ptr(Q.tmap)
            do_map = ptx.tma.tensormap_ptr(DO.tmap)
            _load_slabs3(base, q_map, slabs, hq, q_start + q0, BM, hbar)
            _load_slabs3(base + q_tile.nbytes, do_map, slabs, hq, q_start + q0, BM, hbar)

        def load_kv(sb, k_map, v_map, j, bar):
            krow = k_start + j * BKV
            _load_slabs3(sb, k_map, slabs, hk, krow, BKV, bar)
            _load_slabs3(sb + k_tile.nbytes, v_map, slabs, hk, krow, BKV, bar)

        _dq_producer(tid, head_bar, head_bytes, pipe, n_kv, base, stage_bytes, K, V, sync,
                     load_head, load_kv, first=first)
        # ------------------------------------------------------------ consumers
        roles.consumers(CONS_REGS)

        def stats(qrow, valid, lane):   # qrow within the sequence
            po, pdo, plse, pstats, pdq = ptx.global_ptrs(OUT, DO, LSE, STATS, DQ)
            return (*_row_stats_varlen(po, pdo, plse, pstats, hq, q_start,
                                       _stats_base(q_start, b), qrow, valid, lane, Tq, Sp, Hq,
                                       D, dt), pdq)

        def limits(qrow):
            last = reg.from_(seqlen_k, s32) - 1         # the sequence's last key
            return [_min_s32(reg.from_(qrow + r, s32), last) if causal else last
                    for r in (0, 8)]

        _dq_consumer(tid, wg, q0, seqlen_q, seqlen_k, n_kv, causal=causal, safe=safe, dt=dt,
                     D=D, BKV=BKV, c1=c1, pipe=pipe, head_bar=head_bar, base=base,
                     head_bytes=head_bytes, stage_bytes=stage_bytes, q_tile=q_tile,
                     k_tile=k_tile, k_mn=k_mn, stats=stats,
                     store=lambda acc, pdq, qrow, valid, col0: _store_rows_varlen(
                         acc, pdq, q_start, qrow, valid, Hq, D, hq, col0, scale, dt),
                     first=first, cap=cap, **(window_kw or dict(limits=limits)))
        roles.end()
        ptx.ret()

    name = (f"attn_bwd_dq_varlen_{dt.name}_d{D}_h{Hq}x{Hkv}{feature_tag(causal, window, softcap)}"
            f"{'_safe' if safe else ''}_bkv{BKV}")
    box_q = {"box": (BM, 1, 64), "swizzle": "128B"}
    box_k = {"box": (BKV, 1, 64), "swizzle": "128B"}
    k = kernel(in_specs=(qspec, kspec, kspec, cu, cu, qspec, Tile(Hq, Tq, f32), qspec),
               out_specs=(qspec, Tile(Hq, Sp, 2, f32)), grid=(-(-max_seqlen_q // BM), Hq, B),
               block=(THREADS, 1, 1), smem=smem_total, maxnreg=168,
               tma={"Q": box_q, "DO": box_q, "K": box_k, "V": box_k}, name=name)(dq_kernel)
    family = ("attn_bwd_dq_varlen", dt.name, D, Hq, Hkv, causal, scale, BKV, stages, sync,
              safe, window, softcap)
    return _family.specialized(k, family, sizes)


def build_dkdv_varlen(Tq, Tk, B, Hq, Hkv, D, max_seqlen_k, *, dtype="bf16", causal=False,
                      scale=None, BQ=None, stages=None, sync=None, safe=None, overlap=None,
                      window=(-1, -1), softcap=0.0):
    """The varlen dK/dV kernel: ``(Q, K, V, CUQ, CUK, DO, STATS) -> (DK, DV)`` (STATS from
    ``build_dq_varlen``): ``build_dkdv``'s plain mode (``BQ`` 32 or 64, ``overlap`` as
    there) on a grid of ``ceil(max_seqlen_k / 128)`` kv blocks per (kv head, sequence); a
    CTA past its sequence's keys returns before any barrier. Query columns past the
    sequence's end (the next sequence's rows, whose stats may be anything, or unwritten
    STATS rows) get ``P^T = 0`` by a select, and their ``delta`` is selected to 0 so
    ``dS^T = 0 * (dP^T - 0)`` stays 0 whatever the stats held; causal columns above the
    sequence's diagonal get ``P^T = 0``. The fast schedule masks the blocks that reach past
    ``seqlen_q`` or the diagonal (runtime lengths), the safe one every block. dK/dV are
    stored for the sequence's keys only (zeros where no query attends). ``window``,
    ``softcap``: ``build_dkdv``'s, per sequence."""
    dt, scale, safe, sync, G, Sp = _varlen_options("build_dkdv_varlen", Tq, Tk, B, Hq, Hkv, D,
                                                   max_seqlen_k, dtype, scale, safe, sync)
    BQ = DKDV_BQ if BQ is None else BQ
    if BQ not in (32, 64):
        raise _fail(f"build_dkdv_varlen: BQ must be 32 or 64, got {BQ!r}")
    kv_tile = OperandTile(BM, D, dt, major="K")
    q_tile = OperandTile(BQ, D, dt, major="K")
    q_mn = OperandTile(D, BQ, dt, major="MN")
    slabs = D // 64
    stats_bytes = BQ * 8
    stage_bytes = 2 * q_tile.nbytes + 1024
    head_bytes = 2 * kv_tile.nbytes
    default_overlap = not safe and (BQ == 32 or D <= 64)
    overlap = default_overlap if overlap is None else bool(overlap)
    if overlap and safe:
        raise _fail("build_dkdv_varlen: overlap=True needs the fast schedule (not safe)")
    stages = _smem_fit(head_bytes, stage_bytes) if stages is None else stages
    smem_total = head_bytes + stages * stage_bytes + 1024
    if smem_total > SMEM_LIMIT:
        raise _fail(f"build_dkdv_varlen: {stages} stages of {BQ} rows need {smem_total} bytes")
    c1 = scale * LOG2E
    window = tuple(window)
    windowed = window != (-1, -1)
    cap = softcap_constants(scale, softcap)
    qspec = Tile(Tq, Hq, D, dt)
    kspec = Tile(Tk, Hkv, D, dt)
    cu = Tile(B + 1, s32)

    def window_q_range(k0, seqlen_q, seqlen_k):
        """The sequence's q blocks ``[first, end)`` the window reaches (formed where each
        role needs them) and the unmasked ``[lo, hi)``."""
        return tuple(x if isinstance(x, int) else reg.from_(x, u32) for x in query_blocks(
            reg.from_(k0, s32), reg.from_(seqlen_k, s32), reg.from_(seqlen_q, s32), BQ,
            causal, BM, window))

    sizes = dict(stats_rows=Sp)

    def dkdv_kernel(Q, K, V, CUQ, CUK, DO, STATS, DK, DV):
        Sp = size_params(sizes).stats_rows
        tid, wg = thread_ids()
        kb = reg.from_(ptx.special.ctaid.x(), u32)
        hk = reg.from_(ptx.special.ctaid.y(), u32)
        b = reg.from_(ptx.special.ctaid.z(), u32)
        q_start, seqlen_q, k_start, seqlen_k = _seq_bounds(CUQ, CUK, b)
        k0 = kb * BM
        ptx.ret(pred=k0 >= seqlen_k)                # past the sequence: the whole CTA, first
        base = ring_base("smem")
        pipe = Pipeline(stages, consumer_arrivals=RELEASE_ARRIVALS)
        head_bar = BarrierArray(1, name="head_bar")
        pipe.init(pred=tid == 0)
        head_bar.init(1, pred=tid == 0)
        ptx.bar_sync(0)
        num_q = (seqlen_q + (BQ - 1)) // BQ
        qb0 = k0 // BQ if causal else 0             # causal: q blocks wholly above skipped
        if windowed:
            qb0, _, _, num_q = window_q_range(k0, seqlen_q, seqlen_k)
        sbase = _stats_base(q_start, b)
        pstats, pdk, pdv = ptx.global_ptrs(STATS, DK, DV)
        roles = Roles(wg, PROD_REGS)
        # ------------------------------------------------------------ producer
        def load_head(hbar):
            k_map = ptx.tma.tensormap_ptr(K.tmap)
            v_map = ptx.tma.tensormap_ptr(V.tmap)
            _load_slabs3(base, k_map, slabs, hk, k_start + k0, BM, hbar)
            _load_slabs3(base + kv_tile.nbytes, v_map, slabs, hk, k_start + k0, BM, hbar)

        def load_q(sb, q_map, do_map, hq, qb, bar):
            qrow = q_start + qb * BQ
            _load_slabs3(sb, q_map, slabs, hq, qrow, BQ, bar)
            _load_slabs3(sb + q_tile.nbytes, do_map, slabs, hq, qrow, BQ, bar)

        _dkdv_producer(
            tid, head_bar, head_bytes, pipe, G, hk, qb0, num_q, base, head_bytes, stage_bytes,
            q_tile.nbytes, stats_bytes, safe, sync, Q, DO, load_head=load_head,
            stats_row=lambda hq: reg.from_(hq * Sp + sbase, u64) * 8 + pstats,
            q_block=lambda qb: qb, load_q=load_q)
        # ------------------------------------------------------------ consumers
        roles.consumers(CONS_REGS)
        c = _dkdv_consumer_regs(tid, wg, k0, seqlen_k, BQ, D, False, base, head_bytes, kv_tile,
                                q_tile, q_mn, pipe)
        col0, kvrow = c.col0, c.kvrow       # kvrow: within the sequence
        sq = reg.from_(seqlen_q, s32)

        def mask_pt(acc, q0):
            """``build_dkdv``'s mask with the sequence's length: P^T of query columns past
            ``seqlen_q`` and, causal, of key > query set to 0 (a select)."""
            if safe:
                need = None
            elif windowed:
                _, lo_b, hi_b, _ = window_q_range(k0, seqlen_q, seqlen_k)
                need = _or(q0 < reg.from_(lo_b * BQ, u32), q0 >= reg.from_(hi_b * BQ, u32))
            elif causal:
                need = _or(q0 + BQ > seqlen_q, q0 < k0 + (BM - 1))
            else:
                need = q0 + BQ > seqlen_q
            with _maybe_if(need):
                qc = q0 + col0
                hi = sq - reg.from_(qc, s32)        # column offset c valid iff c < hi
                if windowed:
                    _mask_window(acc, hi, qc, kvrow, causal, window)
                    return
                if causal:
                    lo = [reg.from_(kvrow + r, s32) - reg.from_(qc, s32) for r in (0, 8)]
                for i in range(len(acc)):
                    dr, dc = Accumulator.coord(i)
                    ptx.inst.selp.f32(acc[i], acc[i], 0.0, hi > dc)
                    if causal:
                        ptx.inst.selp.f32(acc[i], acc[i], 0.0, lo[dr // 8] <= dc)

        def fix_delta(dl, q0):
            hi = sq - reg.from_(q0 + col0, s32)
            for col in dl:  # columns past the sequence: delta 0 (their stats: anything)
                dl[col] = _selp(dl[col], 0.0, hi > col)

        ptx.mbarrier.wait(head_bar.at(0), 0)
        if windowed:
            qb0, _, _, num_q = window_q_range(k0, seqlen_q, seqlen_k)
        for g in ptx.loop(0, G):
            hq = hk * G + g
            srow = reg.from_(hq * Sp + sbase, u64) * 8 + pstats
            for qb in ptx.loop(qb0, num_q):
                q0 = qb * BQ
                pipe.wait(c.cons)
                sbs = c.cons.stage * stage_bytes
                soff = reg.from_(reg.from_(sbs >> 4, u32), u64)
                _dkdv_block(c, q0, sbs, soff, srow, safe=safe, overlap=overlap, BQ=BQ, D=D,
                            dt=dt, c1=c1, kv_tile=kv_tile, q_tile=q_tile, q_mn=q_mn, pipe=pipe,
                            mask=mask_pt, fix_delta=fix_delta, cap=cap, keyless=windowed)
        _dkdv_drain(c, overlap, pipe)
        dk_acc, dv_acc, valid = c.dk_acc, c.dv_acc, c.valid
        _store_rows_varlen(dk_acc, pdk, k_start, kvrow, valid, Hkv, D, hk, col0, scale, dt)
        _store_rows_varlen(dv_acc, pdv, k_start, kvrow, valid, Hkv, D, hk, col0, 1.0, dt)
        roles.end()
        ptx.ret()

    name = (f"attn_bwd_dkdv_varlen_{dt.name}_d{D}_h{Hq}x{Hkv}{feature_tag(causal, window, softcap)}"
            f"{'_safe' if safe else ''}{f'_bq{BQ}' if BQ != 64 else ''}"
            f"{'_serial' if overlap != default_overlap else ''}")
    box_kv = {"box": (BM, 1, 64), "swizzle": "128B"}
    box_q = {"box": (BQ, 1, 64), "swizzle": "128B"}
    k = kernel(in_specs=(qspec, kspec, kspec, cu, cu, qspec, Tile(Hq, Sp, 2, f32)),
               out_specs=(kspec, kspec), grid=(-(-max_seqlen_k // BM), Hkv, B),
               block=(THREADS, 1, 1), smem=smem_total, maxnreg=168,
               tma={"Q": box_q, "DO": box_q, "K": box_kv, "V": box_kv},
               name=name)(dkdv_kernel)
    family = ("attn_bwd_dkdv_varlen", dt.name, D, Hq, Hkv, causal, scale, BQ, stages, sync,
              safe, overlap, window, softcap)
    return _family.specialized(k, family, sizes)


class AttentionBackwardVarlen:
    """``bwd(q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse, do, dlse=None) -> (dq, dk, dv)``
    of packed variable-length attention: the varlen dQ kernel (which also writes the stats)
    then the varlen dK/dV kernel, deterministic. Kernel-like (``in_specs``, ``out_specs``,
    ``name``, ``arg_names``) so ``pyptx.differentiable_kernel`` accepts it as the backward
    of the varlen forward (saved inputs ``q, k, v, cu_q, cu_k``, saved outputs ``o, lse``,
    output gradients ``do, dlse``; ``num_grad_inputs=3``)."""

    def __init__(self, kernels, Tq, Tk, B, Hq, Hkv, D, dt):
        self.kernels = kernels
        self._dims = (Tq, Tk, B, Hq, Hkv, D, dt)
        qspec, kspec, cu = Tile(Tq, Hq, D, dt), Tile(Tk, Hkv, D, dt), Tile(B + 1, s32)
        lse = Tile(Hq, Tq, f32)
        self.in_specs = (qspec, kspec, kspec, cu, cu, qspec, lse, qspec, lse)
        self.out_specs = (qspec, kspec, kspec)
        self.arg_names = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "o", "lse", "do",
                          "dlse", "dq", "dk", "dv")
        self.name = kernels[1].name.replace("_dkdv_", "_")

    @property
    def dq_kernel(self):
        """The varlen dQ kernel."""
        return self.kernels[0]

    @property
    def dkdv_kernel(self):
        """The varlen dK/dV kernel."""
        return self.kernels[1]

    def __call__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse, do, dlse=None):
        """Run both kernels; ``dlse`` is ignored (lse is an auxiliary output)."""
        dq, stats = self.kernels[0](q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse, do)
        dk, dv = self.kernels[1](q, k, v, cu_seqlens_q, cu_seqlens_k, do, stats)
        return dq, dk, dv

    def __repr__(self):
        return f"<AttentionBackwardVarlen {' + '.join(k.name for k in self.kernels)}>"


def build_attention_backward_varlen(Tq, Tk, B, Hq, Hkv, D, max_seqlen_q, max_seqlen_k, *,
                                    dtype="bf16", causal=False, scale=None, plan=None,
                                    window=(-1, -1), softcap=0.0, **options):
    """The backward of packed variable-length attention (``attention_varlen``'s layout:
    ``q/o/do (Tq, Hq, D)``, ``k/v (Tk, Hkv, D)``, ``cu_seqlens_q/k`` int32 ``(B + 1,)`` on
    the device, ``lse (Hq, Tq)``; causal top-left aligned per sequence):
    ``AttentionBackwardVarlen``, the dQ / dK-dV pair (``build_dq_varlen``,
    ``build_dkdv_varlen``). ``plan`` (or its ``options`` keywords): a ``BackwardPlan`` of
    the pair (``default`` or ``safe_pair``, with ``dq_bkv``, ``dkdv_bq`` 32 or 64 and
    ``dkdv_overlap``); the plans that set a field of ``VARLEN_REFUSED`` are refused with
    ``ConfigError``. ``window``, ``softcap``: the forward's, per sequence."""
    if options:
        if plan is not None:
            raise _fail("build_attention_backward_varlen: give plan= or option keywords, "
                        "not both")
        plan = BackwardPlan.from_options(**options)
    plan = (BackwardPlan() if plan is None else plan).resolved()
    refused = [n for n in VARLEN_REFUSED if getattr(plan, n) not in (None, False, 0)]
    if refused:
        raise _fail(f"build_attention_backward_varlen: {', '.join(refused)} not available with "
                    f"packed variable-length batches (the varlen backward is the "
                    f"deterministic dQ / dK-dV pair)")
    return _build_varlen(Tq, Tk, B, Hq, Hkv, D, max_seqlen_q, max_seqlen_k, dtype, bool(causal),
                         None if scale is None else float(scale), plan.safe, plan.dq_bkv,
                         plan.dkdv_bq, plan.dkdv_overlap,
                         (check_window(window), check_softcap(softcap)))


@functools.lru_cache(maxsize=64)
def _build_varlen(Tq, Tk, B, Hq, Hkv, D, max_q, max_k, dtype, causal, scale, safe, dq_bkv,
                  dkdv_bq, overlap, features=((-1, -1), 0.0)):
    kw = dict(dtype=dtype, causal=causal, scale=scale, safe=safe)
    if features != ((-1, -1), 0.0):
        kw.update(window=features[0], softcap=features[1])
    dq = build_dq_varlen(Tq, Tk, B, Hq, Hkv, D, max_q, BKV=dq_bkv, **kw)
    dkdv = build_dkdv_varlen(Tq, Tk, B, Hq, Hkv, D, max_k, BQ=dkdv_bq,
                             overlap=None if overlap is None else bool(overlap), **kw)
    return AttentionBackwardVarlen((dq, dkdv), Tq, Tk, B, Hq, Hkv, D, _dtype(dtype))
