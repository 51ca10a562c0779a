"""The dQ kernel of the deterministic pair (``build_dq``), one CTA per batch, q head and 128
query rows: warpgroup 0 produces (Q and dO once, then K and V blocks of ``BKV`` rows through an
mbarrier ring: ``_dq_producer``); warpgroups 1-2 own 64 query rows each (``_dq_consumer``):
they write the stats, then per kv block recompute ``S = Q K^T`` and ``dP = dO V^T``,
``P = exp2(S * scale * log2 e - lse * log2 e)``, ``dS = P * (dP - delta)`` and
``dQ += dS K`` with dS from registers."""

from __future__ import annotations

from pyptx import Tile, kernel, ptx, reg
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.pipeline import BarrierArray, Pipeline
from pyptx.types import b32, f32, s32, u32, u64
from pyptx.warpspec import Roles, ring_base, thread_ids
from pyptx_kernels import _family
from pyptx_kernels.flash_attention.bwd_common import (
    BM,
    BSHD3,
    CONS_REGS,
    LOG2E,
    PROD_REGS,
    SMEM_LIMIT,
    THREADS,
    _capped_p,
    _common_options,
    _fail,
    _fill_stage,
    _load_pair,
    _load_slabs,
    _maybe_if,
    _min_u32,
    _or,
    _pack,
    _smem_fit,
    _store_rows,
    check_layouts,
    input_box,
    input_spec,
    layout_tag,
    size_params,
    softcap_constants,
)
from pyptx_kernels.flash_attention.bwd_prep import _row_stats
from pyptx_kernels.flash_attention.fwd_kernel import _feature_tag as feature_tag
from pyptx_kernels.flash_attention.masks import block_plan, row_limit


def _dq_producer(tid, head_bar, head_bytes, pipe, n_kv, base, stage_bytes, K, V, sync,
                 load_head, load_kv, first=0):
    """The dQ kernels' producer (thread 0): the Q/dO head tile (``load_head(bar)``), then
    the K/V blocks ``first..n_kv`` through the ring (``load_kv(stage, k_map, v_map, j, bar)``:
    the dense kernel's 4-D copies or the packed kernel's 3-D ones)."""
    with ptx.if_(tid == 0):
        hbar = head_bar.at(0)
        ptx.mbarrier.arrive_expect_tx(hbar, head_bytes)
        load_head(hbar)
        k_map = ptx.tma.tensormap_ptr(K.tmap)
        v_map = ptx.tma.tensormap_ptr(V.tmap)
        st = pipe.producer_state()
        for j in ptx.loop(first, n_kv):
            _fill_stage(pipe, st, stage_bytes, stage_bytes, base, head_bytes,
                        lambda sb, bar, j=j: load_kv(sb, k_map, v_map, j, bar), sync)


def _dq_consumer(tid, wg, q0, n_q, n_keys, n_kv, *, causal, safe, dt, D, BKV, c1, pipe,
                 head_bar, base, head_bytes, stage_bytes, q_tile, k_tile, k_mn, stats, limits,
                 store, first=0, need_mask=None, lows=None, cap=None):
    """A dQ consumer warpgroup (dense and packed): its 64 q rows from ``q0`` (valid below
    ``n_q``), ``stats(qrow, valid, lane) -> (delta, nlse2, out)`` its rows' stats,
    ``limits(qrow)`` the last allowed key of each of its two rows; then the k-loop over
    K/V blocks ``first..n_kv`` (S and dP issued, P = exp2(S c1 - lse2), the mask by select
    where a block reaches past ``n_keys`` keys (an int or a register) or the diagonal, dS,
    dQ += dS K, the stage releases) and ``store(dq_acc, out, qrow, valid, col0)``.
    A sliding window: ``need_mask(j)`` the blocks to mask (straddling an edge), ``lows(qrow)``
    the first allowed key of each row. ``cap=(scale / softcap, softcap * log2 e)``: the soft
    cap, ``P = exp2(tanh(S cap[0]) cap[1] - lse2)``, and P times the cap's derivative
    ``1 - tanh^2`` (what dS needs; P itself is not used)."""
    w = wg - 1
    t = tid & 127
    lane = tid & 31
    leader = t == 0
    s_acc = Accumulator(BKV)
    dp_acc = Accumulator(BKV)
    dq_acc = Accumulator(D)
    ds_pack = reg.array(b32, BKV // 4)
    row0, col0 = s_acc.thread_origin(t)
    qrow = q0 + w * 64 + row0                   # this thread's rows: qrow, qrow + 8
    valid = [qrow < n_q, qrow + 8 < n_q]
    # delta = rowsum(do * o) and lse2 of this thread's rows, also written to STATS
    delta, nlse2, out = stats(qrow, valid, lane)
    lim = limits(qrow)      # the last allowed kv column per row: allowed iff kv <= lim
    low = None if lows is None else lows(qrow)
    dq_acc.zero()
    q_desc = q_tile.descriptor(base) + reg.from_(w * (q_tile.offset(0, 64) >> 4), u64)
    do_desc = q_desc + (q_tile.nbytes >> 4)
    ring = base + head_bytes
    k_desc0 = k_tile.descriptor(ring)
    v_desc0 = k_tile.descriptor(ring, offset=k_tile.nbytes)
    kmn_desc0 = k_mn.descriptor(ring)
    cons = pipe.consumer_state()
    rel = pipe.consumer_state()
    has_prev = reg.scalar(u32, init=0)
    ptx.mbarrier.wait(head_bar.at(0), 0)
    for j in ptx.loop(first, n_kv):
        pipe.wait(cons)
        soff = reg.from_(reg.from_(cons.stage * (stage_bytes >> 4), u32), u64)
        kd, vd, kmn = k_desc0 + soff, v_desc0 + soff, kmn_desc0 + soff
        ptx.wgmma.fence()
        for kk in range(q_tile.k_steps):
            ptx.wgmma.mma_async(s_acc.regs, q_tile.advance(q_desc, kk), k_tile.advance(kd, kk),
                                n=BKV, dtype_ab=dt.name, scale_d=0 if kk == 0 else 1)
        ptx.wgmma.commit_group()
        for kk in range(q_tile.k_steps):
            ptx.wgmma.mma_async(dp_acc.regs, q_tile.advance(do_desc, kk), k_tile.advance(vd, kk),
                                n=BKV, dtype_ab=dt.name, scale_d=0 if kk == 0 else 1)
        ptx.wgmma.commit_group()
        ptx.wgmma.wait_group(1)                 # S (and the previous block's dQ) done
        if not safe:
            with ptx.if_(has_prev != 0):
                pipe.release(rel, pred=leader)
                rel.advance()
        for i in range(len(s_acc)):             # P = exp2(S * c1 - lse2), in place
            dr = Accumulator.coord(i)[0]
            if cap is None:
                ptx.inst.fma.rn.f32(s_acc[i], s_acc[i], c1, nlse2[dr // 8])
                ptx.inst.ex2.approx.ftz.f32(s_acc[i], s_acc[i])
            else:
                _capped_p(s_acc[i], s_acc[i], cap, nlse2[dr // 8], derivative=True)
        kv0 = reg.from_(j * BKV + col0, s32)
        if safe:
            need = None
        elif need_mask is not None:
            need = need_mask(j)
        elif causal:    # the keys' end or the diagonal crosses the block
            need = _or(j * BKV + BKV > n_keys, j * BKV + (BKV - 1) > q0)
        else:
            need = j * BKV + BKV > n_keys
        with _maybe_if(need):
            room = [lim[0] - kv0, lim[1] - kv0]    # column offset c allowed iff c <= room
            for i in range(len(s_acc)):
                dr, dc = Accumulator.coord(i)
                ptx.inst.selp.f32(s_acc[i], s_acc[i], 0.0, room[dr // 8] >= dc)
            if low is not None:                    # column offset c allowed iff c >= first
                first_c = [low[0] - kv0, low[1] - kv0]
                for i in range(len(s_acc)):
                    dr, dc = Accumulator.coord(i)
                    ptx.inst.selp.f32(s_acc[i], s_acc[i], 0.0, first_c[dr // 8] <= dc)
        ptx.wgmma.wait_group(0)
        for i in range(len(dp_acc)):            # dS = P * (dP - delta), in place
            dr = Accumulator.coord(i)[0]
            x = dp_acc[i] - delta[dr // 8]
            ptx.inst.mul.f32(dp_acc[i], s_acc[i], x)
        _pack(ds_pack, dp_acc.regs, dt)
        ptx.wgmma.fence()
        for kk in range(BKV // 16):
            ptx.wgmma.mma_async(dq_acc.regs, list(ds_pack)[4 * kk:4 * kk + 4],
                                k_mn.advance(kmn, kk), n=D, dtype_ab=dt.name, trans_b=k_mn.trans)
        ptx.wgmma.commit_group()
        if safe:
            ptx.wgmma.wait_group(0)
            pipe.release(cons, pred=leader)
        else:
            ptx.inst.mov.u32(has_prev, 1)
        cons.advance()
    if not safe:
        ptx.wgmma.wait_group(0)
        with ptx.if_(has_prev != 0):
            pipe.release(rel, pred=leader)
    store(dq_acc, out, qrow, valid, col0)


def _window_plan(q0, n_q, n_keys, BKV, causal, window):
    """A window's dQ CTA at q row ``q0`` (``n_q`` queries, ``n_keys`` keys: ints or s32
    registers): ``(first, end, keywords)``, the kv blocks it visits (``masks.block_plan``)
    and ``_dq_consumer``'s ``limits``, ``need_mask`` (blocks outside the unmasked
    ``[lo, hi)``) and ``lows`` (each row's first key)."""
    first, lo, hi, end = (x if isinstance(x, int) else reg.from_(x, u32) for x in
                          block_plan(reg.from_(q0, s32), n_q, n_keys, BKV, causal, BM, window))

    def limits(qrow):       # the last allowed key of each row
        lims = [row_limit(reg.from_(qrow + r, s32), n_keys, causal, window)[1] for r in (0, 8)]
        return [reg.scalar(s32, init=x - 1) if isinstance(x, int) else x - 1 for x in lims]

    kw = dict(limits=limits, need_mask=lambda j: j >= hi if isinstance(lo, int) and lo == 0
              else _or(j < lo, j >= hi))
    if window[0] >= 0:
        kw["lows"] = lambda qrow: [reg.from_(qrow + r, s32) - window[0] for r in (0, 8)]
    return first, end, kw


def build_dq(B, S, Hq, Hkv, D, *, Sk=None, dtype="bf16", causal=False, scale=None, BKV=64,
             stages=None, sync=None, safe=None, window=(-1, -1), softcap=0.0,
             layouts=BSHD3):
    """The dQ kernel: ``(Q, K, V, O, LSE, DO) -> (DQ, STATS)``. STATS ``(B, Hq, padded(S), 2)``
    f32 holds ``(lse * log2 e, delta = rowsum(do * o))`` per query row (zeros past ``S``),
    which the dK/dV kernel reads. ``safe``: mask every block and wait for each block's
    products before the next (the simplest schedule; default from ``PYPTX_ATTN_BWD_SAFE``).
    ``window``, ``softcap``: the forward's (``build_attention``'s): only the kv blocks the
    window reaches are visited (``masks.block_plan``), those straddling an edge masked; the
    capped scores are recomputed and dS taken through the cap's derivative. ``layouts``:
    the memory orders of Q, K, V (``"bshd"``, or ``"bhsd"``: ``(B, H, S, D)``, read in place
    through their tensor maps); the others are ``(B, S, H, D)``."""
    Sk, dt, scale, safe, sync, G, Sp = _common_options(B, S, Hq, Hkv, D, Sk, dtype, scale,
                                                       safe, sync)
    layouts = check_layouts("build_dq", layouts)
    q_tile = OperandTile(BM, D, dt, major="K")
    k_tile = OperandTile(BKV, D, dt, major="K")
    k_mn = OperandTile(D, BKV, dt, major="MN")      # the same bytes as B of dS K
    assert k_mn.nbytes == k_tile.nbytes
    slabs = D // 64
    stage_bytes = 2 * k_tile.nbytes
    head_bytes = 2 * q_tile.nbytes
    stages = _smem_fit(head_bytes, stage_bytes) if stages is None else stages
    smem_total = head_bytes + stages * stage_bytes + 1024
    if smem_total > SMEM_LIMIT:
        raise _fail(f"build_dq: {stages} stages of {BKV} rows need {smem_total} bytes")
    num_kv = -(-Sk // BKV)
    c1 = scale * LOG2E
    window = tuple(window)
    windowed = window != (-1, -1)
    cap = softcap_constants(scale, softcap)
    box_q = {"box": (1, BM, 1, 64), "swizzle": "128B"}
    qspec = Tile(B, S, Hq, D, dt)
    q_in, k_in, v_in = (input_spec(B, L, H, D, dt, lay) for L, H, lay in
                        ((S, Hq, layouts[0]), (Sk, Hkv, layouts[1]), (Sk, Hkv, layouts[2])))

    sizes = dict(seqlen_q=S, seqlen_k=Sk, stats_rows=Sp, q_blocks=-(-S // BM),
                 kv_blocks=num_kv, last_key=Sk - 1)

    def dq_kernel(Q, K, V, OUT, LSE, DO, DQ, STATS):
        z = size_params(sizes)
        S, Sk, Sp = z.seqlen_q, z.seqlen_k, z.stats_rows
        base = ring_base("smem")
        pipe = Pipeline(stages, consumer_arrivals=2)
        head_bar = BarrierArray(1, name="head_bar")
        tid, wg = thread_ids()
        qb = reg.from_(ptx.special.ctaid.x(), u32)
        if causal:  # the longest rows (most kv blocks) first: a shorter tail
            qb = (z.q_blocks - 1) - qb
        hq = reg.from_(ptx.special.ctaid.y(), u32)
        b = reg.from_(ptx.special.ctaid.z(), u32)
        hk = hq // G if G > 1 else hq
        q0 = qb * BM
        pipe.init(pred=tid == 0)
        head_bar.init(1, pred=tid == 0)
        ptx.bar_sync(0)
        first = 0
        if windowed:    # the kv blocks the window reaches: [first, end), [lo, hi) unmasked
            first, n_kv, window_kw = _window_plan(q0, reg.from_(S, s32), reg.from_(Sk, s32),
                                                  BKV, causal, window)
        elif causal:  # blocks wholly above the diagonal are skipped
            n_kv = _min_u32(reg.from_((q0 + (BM - 1)) // BKV + 1, u32), z.kv_blocks)
        else:
            n_kv = z.kv_blocks
        roles = Roles(wg, PROD_REGS)
        # ------------------------------------------------------------ producer
        def load_kv(sb, k_map, v_map, j, bar):
            _load_slabs(sb, k_map, slabs, hk, j * BKV, b, BKV, bar, layouts[1])
            _load_slabs(sb + k_tile.nbytes, v_map, slabs, hk, j * BKV, b, BKV, bar, layouts[2])

        _dq_producer(tid, head_bar, head_bytes, pipe, n_kv, base, stage_bytes, K, V, sync,
                     lambda hbar: _load_pair(base, Q, DO, q_tile.nbytes, slabs, hq, q0, b, BM,
                                             hbar, (layouts[0], "bshd")), load_kv, first=first)
        # ------------------------------------------------------------ consumers
        roles.consumers(CONS_REGS)

        def stats(qrow, valid, lane):
            po, pdo, plse, pstats, pdq = ptx.global_ptrs(OUT, DO, LSE, STATS, DQ)
            return (*_row_stats(po, pdo, plse, pstats, b, hq, qrow, valid, lane, S, Sp, Hq, D,
                                dt), pdq)

        def limits(qrow):   # causal / ragged
            if causal:
                return [reg.from_(_min_u32(qrow + r, reg.scalar(u32, init=z.last_key)), s32)
                        for r in (0, 8)]
            return [reg.from_(z.last_key, s32) for r in (0, 8)]

        kw = dict(limits=limits) if not windowed else window_kw
        _dq_consumer(tid, wg, q0, S, Sk, n_kv, causal=causal, safe=safe, dt=dt, D=D, BKV=BKV,
                     c1=c1, pipe=pipe, head_bar=head_bar, base=base, head_bytes=head_bytes,
                     stage_bytes=stage_bytes, q_tile=q_tile, k_tile=k_tile, k_mn=k_mn,
                     stats=stats,
                     store=lambda acc, pdq, qrow, valid, col0: _store_rows(
                         acc, pdq, qrow, valid, Hq, D, hq, b, S, col0, scale, dt),
                     first=first, cap=cap, **kw)
        roles.end()
        ptx.ret()

    name = (f"attn_bwd_dq_{dt.name}_d{D}_h{Hq}x{Hkv}{feature_tag(causal, window, softcap)}"
            f"{'_safe' if safe else ''}{f'_bkv{BKV}' if BKV != 64 else ''}{layout_tag(layouts)}")
    k = kernel(in_specs=(q_in, k_in, v_in, qspec, Tile(B, Hq, S, f32), qspec),
               out_specs=(qspec, Tile(B, Hq, Sp, 2, f32)), grid=(-(-S // BM), Hq, B),
               block=(THREADS, 1, 1), smem=smem_total, maxnreg=168,
               tma={"Q": input_box(BM, layouts[0]), "DO": box_q,
                    "K": input_box(BKV, layouts[1]), "V": input_box(BKV, layouts[2])},
               name=name)(dq_kernel)
    family = ("attn_bwd_dq", dt.name, D, Hq, Hkv, causal, scale, BKV, stages, sync, safe,
              window, softcap, layouts)
    return _family.specialized(k, family, sizes)
