"""The dK/dV kernel (``build_dkdv``), one CTA per batch, kv head and 128 kv rows: the producer
(``_dkdv_producer``) streams Q/dO blocks and their stats through a ring; the consumers
(``_dkdv_block``, one step per q block) work in the transposed frame, ``S^T = K Q^T``,
``dP^T = V dO^T``, ``dV += P^T dO``, ``dK += dS^T Q``, summing over the q heads of the kv
head's group in registers. With ``atomic_dq`` it adds dQ too (``red.global.add``, TMA tile
reductions with ``dq_bulk``, in a fixed order with ``dq_ordered``) and can convert it in the
same grid (``dq_convert``, ``convert_lag``) and compute later heads' stats (``stats_lead``)."""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

from pyptx import Tile, kernel, ptx, reg
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.pipeline import BarrierArray, Pipeline
from pyptx.types import b32, f32, s32, u32, u64
from pyptx.warpspec import SLAB_BYTES, Roles, ring_base, thread_ids
from pyptx_kernels import _family
from pyptx_kernels.flash_attention.bwd_common import (
    BM,
    BSHD3,
    CONS_REGS,
    CONVERT_BLOCKS,
    DKDV_BQ,
    LOG2E,
    PROD_REGS,
    ROTATE_MAX_KV,
    SMEM_LIMIT,
    THREADS,
    _cap_slope,
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
    _selp,
    _smem_fit,
    _store_rows,
    _store_split_partials,
    _unpack,
    block_steps,
    check_layouts,
    dq_accumulator_width,
    heavy_first_cta,
    heavy_groups,
    input_box,
    input_spec,
    layout_tag,
    size_params,
    softcap_constants,
)
from pyptx_kernels.flash_attention.bwd_plan import (
    _check_dq_modes,
    _check_num_sms,
    check_dq_chains,
    default_convert_lag,
    early_convert_share,
    resolve_stats_lead,
)
from pyptx_kernels.flash_attention.bwd_prep import _row_delta, _row_pieces, chain_sum
from pyptx_kernels.flash_attention.fwd_kernel import _feature_tag as feature_tag
from pyptx_kernels.flash_attention.masks import query_blocks, right_reach

RELEASE_ARRIVALS = 256  # dK/dV ring: every consumer thread arrives (2 warpgroups x 128)


def _max_s32(a, b):
    r = reg.scalar(s32)
    ptx.inst.max.s32(r, a, b)
    return r


def _selp_u32(a, b, p):
    r = reg.scalar(u32)
    ptx.inst.selp.u32(r, a, b, p)
    return r


def _chain_adds(adds, c, chains):
    """``dq_chains``: of a q block's ``adds`` (ranks ``0 .. adds - 1``), those of chain ``c``
    (the ranks ``r`` with ``r mod chains == c``): ``ceil((adds - c) / chains)``, 0 when
    ``adds <= c``; ``adds`` itself for one chain."""
    if chains == 1:
        return adds
    return (adds + (chains - 1 - c)) >> (chains.bit_length() - 1)


def _mask_window(acc, hi, qc, kvrow, causal, window):
    """A window's mask of a dK/dV consumer's P^T (kv rows ``kvrow``, ``kvrow + 8``; query
    columns from ``qc``): query ``q`` sees key ``kv`` iff ``kv - right <= q <= kv + left``
    (``-1``: that side unbounded), and column offset ``c < hi`` (the queries' end)."""
    right, left = right_reach(causal, window), window[0]
    rel = [reg.from_(kvrow + r, s32) - reg.from_(qc, s32) for r in (0, 8)]
    for i in range(len(acc)):
        dr, dc = Accumulator.coord(i)
        ptx.inst.selp.f32(acc[i], acc[i], 0.0, hi > dc)
        if right is not None:   # q >= kv - right  <=>  dc >= rel - right
            ptx.inst.selp.f32(acc[i], acc[i], 0.0, rel[dr // 8] - right <= dc)
        if left >= 0:           # q <= kv + left  <=>  dc <= rel + left
            ptx.inst.selp.f32(acc[i], acc[i], 0.0, rel[dr // 8] + left >= dc)


def _release_stage(pipe, state):
    """Hand a dK/dV ring stage back to the producer, after this thread's generic reads of it.

    Besides the wgmma (async-proxy) reads of Q and dO, every consumer thread reads its
    ``(lse2, delta)`` pairs out of the stage with ``ld.shared`` (generic proxy), and the
    producer's next fill of the stage writes it with ``cp.async.bulk`` (async proxy). In the
    PTX memory model accesses of different proxies to the same bytes are ordered only by a
    causality chain that contains a proxy fence, and an mbarrier arrive releases only the
    arriving thread's own accesses. Hence, for this write-after-read across proxies, every
    reading thread

    1. issues ``fence.proxy.async.shared::cta`` after its reads (the values already sit in
       registers: the stats were consumed by this block's math), then
    2. arrives on ``empty[stage]`` itself (``release.cta``; 256 arrivals per round,
       ``RELEASE_ARRIVALS``), which the producer's ``acquire`` waits for before it issues
       the bulk copies of the next fill.

    Two weaker forms left compute-sanitizer's racecheck reporting write-after-read hazards
    (``UBLKCP`` write against the consumers' ``LDS``): one arrival per warpgroup (1024), and
    one per warp after ``bar.warp.sync`` (the other 31 lanes' reads are not in the arriving
    thread's release).
    """
    ptx.fence_proxy_async("shared::cta")
    pipe.release(state)


def _dkdv_producer(tid, head_bar, head_bytes, pipe, G, hk, qb0, num_q, base, ring_off,
                   stage_bytes, q_bytes, stats_bytes, safe, sync, Q, DO, *, load_head,
                   stats_row, q_block, load_q, before=None, heads=None, q_outer=False):
    """The dK/dV kernels' producer (thread 0): the K/V head tile (``load_head(bar)``), then
    for each q head ``hk * G + g`` of the kv head the Q/dO blocks ``qb0..num_q`` through the
    ring (``q_block(step)`` the block of a step, ``load_q(stage, q_map, do_map, hq, qb, bar)``
    the dense kernel's 4-D copies or the packed kernel's 3-D ones) with, fast schedule, the
    block's ``(lse2, delta)`` rows from ``stats_row(hq)`` by a bulk copy. ``before()``: after
    the maps, before the loop. ``heads=(first, n)``: only the ``n`` q heads from ``first``
    (``kv_split``); ``q_outer``: each q step over every head (``block_steps``)."""
    with ptx.if_(tid == 0):
        hbar = head_bar.at(0)
        ptx.mbarrier.arrive_expect_tx(hbar, head_bytes)
        load_head(hbar)
        q_map = ptx.tma.tensormap_ptr(Q.tmap)
        do_map = ptx.tma.tensormap_ptr(DO.tmap)
        if before is not None:
            before()
        st = pipe.producer_state()

        def per_head(g):
            hq = hk * G + g if heads is None else heads[0] + g
            return hq, stats_row(hq)

        for (hq, srow), qstep in block_steps(G if heads is None else heads[1], qb0, num_q,
                                              per_head, q_outer):
            qb = q_block(qstep)

            def load(sb, bar, hq=hq, qb=qb, srow=srow):
                load_q(sb, q_map, do_map, hq, qb, bar)
                if not safe:
                    ptx.tma.copy_bulk(sb + 2 * q_bytes,
                                      reg.from_(qb * stats_bytes, u64) + srow, stats_bytes,
                                      bar)

            _fill_stage(pipe, st, 2 * q_bytes + (0 if safe else stats_bytes), stage_bytes,
                        base, ring_off, load, sync)


def _dkdv_consumer_regs(tid, wg, k0, n_k, BQ, D, wide, base, ring_off, kv_tile, q_tile, q_mn,
                        pipe):
    """A dK/dV consumer warpgroup's registers and descriptors (dense and packed): its 64 kv
    rows from ``k0`` (valid below ``n_k``), the accumulators (``wide``: dP^T by 64-column
    halves, no dS registers), the stage descriptors, the ring states; a namespace."""
    w = wg - 1
    t = tid & 127
    s_acc = Accumulator(BQ)
    dp_acc = Accumulator(64) if wide else Accumulator(BQ)
    dv_acc = Accumulator(D)
    dk_acc = Accumulator(D)
    p_pack = reg.array(b32, BQ // 4)
    ds_pack = None if wide else reg.array(b32, BQ // 4)
    row0, col0 = s_acc.thread_origin(t)
    kvrow = k0 + w * 64 + row0                  # this thread's kv rows: kvrow, kvrow + 8
    valid = [kvrow < n_k, kvrow + 8 < n_k]
    dv_acc.zero()
    dk_acc.zero()
    k_desc = kv_tile.descriptor(base) + reg.from_(w * (kv_tile.offset(0, 64) >> 4), u64)
    v_desc = k_desc + (kv_tile.nbytes >> 4)
    ring = base + ring_off
    q_desc0 = q_tile.descriptor(ring)
    do_desc0 = q_tile.descriptor(ring, offset=q_tile.nbytes)
    qmn_desc0 = q_mn.descriptor(ring)
    domn_desc0 = q_mn.descriptor(ring, offset=q_tile.nbytes)
    cons = pipe.consumer_state()
    rel = pipe.consumer_state()
    has_prev = reg.scalar(u32, init=0)
    stats_col = col0 * 8 + 2 * q_tile.nbytes    # this thread's first (lse2, delta) pair
    return SimpleNamespace(w=w, t=t, s_acc=s_acc, dp_acc=dp_acc, dv_acc=dv_acc, dk_acc=dk_acc,
                           p_pack=p_pack, ds_pack=ds_pack, row0=row0, col0=col0, kvrow=kvrow,
                           valid=valid, k_desc=k_desc, v_desc=v_desc, ring=ring,
                           q_desc0=q_desc0, do_desc0=do_desc0, qmn_desc0=qmn_desc0,
                           domn_desc0=domn_desc0, cons=cons, rel=rel, has_prev=has_prev,
                           stats_col=stats_col)


def _pt_dv(c, acc, q0, domn, mask, BQ, D, dt, q_mn):
    """``mask(acc, q0)``, pack P^T to 16 bits (``c.p_pack``) and issue dV += P^T dO with P^T
    from registers and dO at descriptor ``domn`` (committed, not waited for)."""
    mask(acc, q0)
    _pack(c.p_pack, acc.regs, dt)
    ptx.wgmma.fence()
    for kk in range(BQ // 16):
        ptx.wgmma.mma_async(c.dv_acc.regs, list(c.p_pack)[4 * kk:4 * kk + 4],
                            q_mn.advance(domn, kk), n=D, dtype_ab=dt.name, trans_b=q_mn.trans)
    ptx.wgmma.commit_group()


def _dkdv_block(c, q0, sbase, soff, srow, *, safe, overlap, BQ, D, dt, c1, kv_tile, q_tile,
                q_mn, pipe, mask, fix_delta=None, after_ds=None, after_dk=None, cap=None,
                keyless=False):
    """One q block of a dK/dV consumer (the plain schedule, dense and packed): S^T and dP^T
    issued, P^T = exp2(S^T c1 - lse2) masked (``mask``), dV += P^T dO, dS^T = P^T (dP^T -
    delta) (``fix_delta(dl, q0)`` may select deltas first), dK += dS^T Q, the stage
    released (``overlap``: the previous one, once this block's S^T is done). Hooks of the
    dense kernel's dQ modes: ``after_ds()`` before dK's product, ``after_dk()`` after it.
    ``cap`` (``bwd_common.softcap_constants``): P^T of the capped scores, dS^T times the
    cap's derivative ``1 - tanh^2``, its ``tanh`` recovered from P^T once dV's product is
    issued (``bwd_common._cap_slope``: holding it from the exponentials, in f32 or f16
    pairs, spilled 16-28 bytes at D=128). ``keyless`` (a window): queries may have no key
    (``lse = -inf``): their P^T is 0 everywhere, the zero-filled kv rows past Sk included
    (exp2 of +inf there would make dQ's dS K NaN)."""
    s_acc, dp_acc = c.s_acc, c.dp_acc
    qd, dod = c.q_desc0 + soff, c.do_desc0 + soff
    qmn, domn = c.qmn_desc0 + soff, c.domn_desc0 + soff
    ptx.wgmma.fence()
    for kk in range(kv_tile.k_steps):
        ptx.wgmma.mma_async(s_acc.regs, kv_tile.advance(c.k_desc, kk),
                            q_tile.advance(qd, kk), n=BQ, dtype_ab=dt.name,
                            scale_d=0 if kk == 0 else 1)
    ptx.wgmma.commit_group()
    for kk in range(kv_tile.k_steps):
        ptx.wgmma.mma_async(dp_acc.regs, kv_tile.advance(c.v_desc, kk),
                            q_tile.advance(dod, kk), n=BQ, dtype_ab=dt.name,
                            scale_d=0 if kk == 0 else 1)
    ptx.wgmma.commit_group()
    # this thread's columns: q = q0 + col0 + 8 * blk + e (e = 0, 1); their
    # (lse2, delta) pairs, from the stage (fast) or from global memory (safe)
    if safe:
        src = reg.from_(q0 * 8 + c.col0 * 8, u64) + srow
    else:
        src = sbase + (c.ring + c.stats_col)

    def stats(which, blocks=range(BQ // 8)):
        """Column offset -> lse2 (which=0, negated) or delta (1) of this thread's
        columns (loaded when needed: fewer live registers), of the 8-column ``blocks``."""
        out = {}
        for blk in blocks:
            v4 = reg.array(f32, 4)
            if safe:
                ptx.inst.ld.global_.nc.v4.f32(v4, ptx.addr(src, 64 * blk))
            else:
                ptx.inst.ld.shared.v4.f32(v4, ptx.addr(src, 64 * blk))
            for e in (0, 1):
                out[8 * blk + e] = -v4[2 * e] if which == 0 else v4[2 * e + 1]
                if which == 0 and keyless:  # lse2 = -inf stays -inf: P^T = 0
                    out[8 * blk + e] = _selp(out[8 * blk + e], v4[2 * e],
                                             v4[2 * e] > float("-inf"))
        return out

    nl2 = stats(0)
    ptx.wgmma.wait_group(1)             # S^T (and the previous block's dK) done
    if overlap:
        with ptx.if_(c.has_prev != 0):
            _release_stage(pipe, c.rel)
            c.rel.advance()
    for i in range(len(s_acc)):         # P^T = exp2(S^T * c1 - lse2), in place
        dc = Accumulator.coord(i)[1]
        if cap is None:
            ptx.inst.fma.rn.f32(s_acc[i], s_acc[i], c1, nl2[dc])
            ptx.inst.ex2.approx.ftz.f32(s_acc[i], s_acc[i])
        else:
            _capped_p(s_acc[i], s_acc[i], cap, nl2[dc])
    _pt_dv(c, s_acc, q0, domn, mask, BQ, D, dt, q_mn)
    split_stats = cap is not None or keyless
    for blocks in [(blk,) for blk in range(BQ // 8)] if split_stats else [range(BQ // 8)]:
        # a soft cap or a window: 8 columns' stats at a time (fewer live registers; a
        # window's ordered D=128 kernel spilled 4-8 bytes with all 16 deltas live)
        dl = stats(1, blocks)
        if fix_delta is not None:
            fix_delta(dl, q0)
        if cap is not None:             # P^T times the capped score's derivative
            nl2 = stats(0, blocks)
            for i in range(len(s_acc)):
                if Accumulator.coord(i)[1] in dl:
                    _cap_slope(s_acc[i], cap, nl2[Accumulator.coord(i)[1]])
        if blocks[0] == 0:
            ptx.wgmma.wait_group(1)     # dP^T done
        for i in range(len(dp_acc)):    # dS^T = P^T * (dP^T - delta), in place
            dc = Accumulator.coord(i)[1]
            if dc in dl:
                x = dp_acc[i] - dl[dc]
                ptx.inst.mul.f32(dp_acc[i], s_acc[i], x)
    _pack(c.ds_pack, dp_acc.regs, dt)
    if after_ds is not None:
        after_ds()
    ptx.wgmma.fence()
    for kk in range(BQ // 16):
        ptx.wgmma.mma_async(c.dk_acc.regs, list(c.ds_pack)[4 * kk:4 * kk + 4],
                            q_mn.advance(qmn, kk), n=D, dtype_ab=dt.name,
                            trans_b=q_mn.trans)
    ptx.wgmma.commit_group()
    if after_dk is not None:
        after_dk()
    if not overlap:
        ptx.wgmma.wait_group(0)
        _release_stage(pipe, c.cons)
    else:
        ptx.inst.mov.u32(c.has_prev, 1)
    c.cons.advance()


def _dkdv_drain(c, overlap, pipe):
    """After the last block: the overlapped schedule's last held stage."""
    if overlap:
        ptx.wgmma.wait_group(0)
        with ptx.if_(c.has_prev != 0):
            _release_stage(pipe, c.rel)


def build_dkdv(B, S, Hq, Hkv, D, *, Sk=None, dtype="bf16", causal=False, scale=None, BQ=None,
               stages=None, sync=None, safe=None, atomic_dq=False, overlap=None, dq_bulk=False,
               dq_ordered=False, num_sms=132, dq_convert=False, convert_lag=0, stats_lead=0,
               kv_split=1, dq_chains=1, heavy_first=False, trace=False, window=(-1, -1),
               softcap=0.0, layouts=BSHD3):
    """The dK/dV kernel: ``(Q, K, V, DO, STATS) -> (DK, DV)`` (STATS from ``build_dq``).
    ``layouts``: the memory orders of Q, K, V (``"bshd"``, or ``"bhsd"``: ``(B, H, S, D)``,
    read in place through their tensor maps); every other tensor is ``(B, S, H, D)``.

    ``window``, ``softcap``: the forward's (not with ``BQ=128``): a kv block visits only the
    q blocks whose window reaches it (``masks.query_blocks``), masking those straddling an
    edge; the capped scores are recomputed and dS^T taken through the cap's derivative.
    Ordered dQ with a window: descending kv blocks (the causal order), q block ``qb``
    counting the kv blocks ``window_kv_range(qb)`` reaching it (a converter writes zeros
    where none does); no ``convert_lag``.

    ``BQ``: q rows per block, 32 or 64 (``None``: ``DKDV_BQ``, 64; ``atomic_dq`` needs 64,
    its dS tile), or 128 for the D=128 ordered bulk-dQ mode only (S^T n=128, dP^T by n=64
    halves; dS and the dQ slabs in the block's ring stage, which the dQ writer releases;
    docs/dev/attention-backward.md, session 16). ``overlap``: issue a block's products before the previous block's dK is
    done (the fast schedule's, default where it keeps its wgmma asynchronous: 32-row blocks
    or D=64; at D=128 with 64-row blocks ptxas serialises every wgmma, C7512); ``False``
    waits for a block's dK product before the next block's, the stage released right after.
    See docs/dev/attention-backward.md for the measurements.

    ``atomic_dq``: also ``(..., STATS, DQACC)``: every block adds ``scale * dS K`` into the
    f32 ``DQACC`` ``(B, S, Hq, D)`` in place with ``red.global.add`` (not deterministic;
    torch eager only: the buffer is an input the kernel writes). ``dq_bulk``: the dQ tile
    goes through shared memory and is added by TMA tile reductions
    (``cp.reduce.async.bulk.tensor``, one per 32-column f32 slab) instead of
    ``red.global.add`` per pair; its product (into the dP registers) is issued before dK's
    and stored while dK's runs. ``dq_ordered`` (with ``dq_bulk``): also ``(..., DQACC,
    SEM)``, int32 ``(B, Hq, ceil(S/64), 2)`` zeroed counters (the first of each pair counts
    the adds into that q block): the kv blocks add each dQ tile in a fixed order (descending kv block when
    causal; full attention: each kv block starts at its own q block, ``2 * kv_block``,
    when ``ceil(S/64) == 2 * ceil(Sk/128)`` and there are at most ``ROTATE_MAX_KV`` kv blocks,
    so the adds of a q block come two steps apart; ascending kv block otherwise), each waiting
    for its predecessor's count: the sums, and so dQ, are the same bits at every run. A writer
    thread of the producer warpgroup does the waiting and the adds; where the predecessor is
    kv block ``kb + 1``, the grid runs the kv blocks last first, so a waiting CTA's
    predecessor has been launched (the rotated order's one exception, the last kv block
    waiting for block 0 of its head, needs the head's CTAs resident together: hence the cap).

    ``dq_convert`` (ordered bulk dQ, 64-row q blocks): the kernel also writes the 16-bit
    ``DQ`` (a third output), so ``build_convert`` is not needed: ``num_sms`` more CTAs (at
    most one per 64-row q block), launched after all the others (the grid is 1-D), turn DQACC's 64-row q blocks into DQ,
    each block once its counter says every add is in. They run where the grid's last,
    partial wave leaves SMs idle.

    ``convert_lag`` (``dq_convert``, full attention, D=128, at most two q blocks per CTA:
    ``early_convert_share``; ``"auto"``: ``default_convert_lag``): warps 2 and 3 of each dK/dV
    CTA's producer warpgroup, idle otherwise, convert this CTA's share of the q blocks of the
    kv head ``convert_lag`` heads earlier in launch order (long finished:
    ``default_convert_lag`` is two waves of heads) while the consumers compute; the converter
    CTAs take only the last ``convert_lag`` kv heads' blocks, so little conversion is left
    after the grid's last dK/dV CTA. ``"auto"`` where it does not apply: none.

    ``stats_lead`` (the ordered bulk-dQ mode, 64-row q blocks; ``"auto"``:
    ``default_stats_lead`` at full attention, else 0; ``resolve_stats_lead``): also ``(...,
    SEM, OUT, LSE)``, and STATS is written in place: warps 2 and 3 of each CTA compute the
    STATS rows of the kv head ``stats_lead`` heads later in launch order (its ``G * padded(S)``
    rows split over its ``ceil(Sk / 128)`` CTAs), then add 1 to that head's flag (the second
    SEM cell of its first q head's first q block; release); a CTA's producer waits (acquire)
    until its own head's flag counts every CTA before it loads a stats block.
    ``build_prep(lead=...)`` writes only the first ``stats_lead`` heads' stats, so the prep's
    pass over O and dO runs inside the dK/dV grid, beside its tensor-core work.

    ``kv_split`` (1, 2, 4 or 8, dividing ``Hq / Hkv``; 64-row q blocks): the grid's CTAs per
    kv block, a cluster along x: rank ``r`` takes the q heads ``r * G / kv_split ..`` of the
    group (the producer's loads, the dQ writer's adds, the consumers' sums), then each
    consumer thread writes its dK/dV partial sums (f32, four registers per 16 bytes, thread
    after thread: ``[slot group][thread][4]``) into its CTA's shared memory (dK over the K/V
    head tile, dV over the ring: both free once the last block is done), and after a cluster
    barrier rank ``r`` adds chunk ``r`` of the ``2 x D/2`` registers (``D / kv_split`` of
    them: a column range of dK or of dV) from every CTA in rank order 0, 1, ... through
    distributed shared memory, and stores it: the same bits at every run. A second cluster
    barrier keeps each CTA's shared memory alive until its peers have read it. The grid
    becomes the one of ``G / kv_split`` q heads per kv head (``kv_split`` times the CTAs,
    each with ``1 / kv_split`` of the work).

    ``dq_chains`` (1, 2 or 4; ``dq_ordered``): ``P`` independent chains of adds per q block:
    the kv block of rank ``r`` (the order above) adds into chain ``r mod P`` as its ``r div
    P``-th add (the first stores), waiting for its predecessor ``r - P`` only, so each link
    has ``P`` times the slack. DQACC ``(B, S, Hq, P * W)``: chain ``c``'s accumulator in
    columns ``c * W ..`` (``W = dq_accumulator_width(D, dq_bulk)``); SEM ``(P * B, Hq,
    ceil(S/64), 2)``: chain 0's counters where they are with one chain, chain ``c``'s in the
    ``c``-th ``B`` rows (``build_prep(chains=P)``). The converters wait for each chain's
    count (``_chain_adds``) and sum the chains in order (``bwd_prep.chain_sum``), loading
    none of a chain no kv block reached; ``build_convert(chains=P)`` sums them too (DQACC
    zeroed by the prep). The same bits at every run.

    ``heavy_first`` (causal, no window, no ``convert_lag`` or ``stats_lead``): the grid runs
    groups of kv heads one after another (``heavy_groups``: two waves of CTAs each), in a
    group kv block 0 of every head first, then block 1, ... (the longest causal CTAs first),
    where it otherwise runs a head's blocks together, the longest last when ordered. Each
    CTA walks its q blocks from the last down, each q step over every q head of its share
    (the kv blocks of a head read a Q/dO block at about the same time), and ordered, a q
    block's adds come in ascending kv block order: every kv block reaches it at the same
    step, its predecessor launched earlier.

    ``trace`` (bulk dQ, a diagnostic): a last output ``TRACE``, int32 ``(CTAs, 4)`` in launch
    order: ``%globaltimer_lo`` at the CTA's start and at its consumers' end (converters:
    their end), ``%smid``, and the ns its dQ writer (converters: thread 0) spent waiting for
    its turn (``tools/attn_bwd_trace.py`` reads it)."""
    Sk, dt, scale, safe, sync, G, Sp = _common_options(B, S, Hq, Hkv, D, Sk, dtype, scale,
                                                       safe, sync)
    _check_num_sms("build_dkdv", num_sms)
    if trace and not (atomic_dq and dq_bulk):
        raise _fail("build_dkdv: trace is for the bulk-dQ modes (atomic_dq and dq_bulk)")
    if dq_convert and not (atomic_dq and dq_bulk and dq_ordered) or dq_convert and BQ not in (
            None, 64):
        raise _fail(f"build_dkdv: dq_convert needs the ordered bulk-dQ mode (atomic_dq, "
                    f"dq_bulk, dq_ordered) with 64-row q blocks, got atomic_dq={atomic_dq!r}, "
                    f"dq_bulk={dq_bulk!r}, dq_ordered={dq_ordered!r}, BQ={BQ!r}")
    if BQ is None:
        BQ = DKDV_BQ
    window = tuple(window)
    windowed = window != (-1, -1)
    cap = softcap_constants(scale, softcap)
    if (windowed or cap) and BQ == 128:
        raise _fail(f"build_dkdv: window and softcap need 64- or 32-row q blocks, got "
                    f"window={window!r}, softcap={softcap!r}, BQ={BQ!r}")
    heavy_first = bool(heavy_first)
    if heavy_first and (not causal or windowed):
        raise _fail(f"build_dkdv: heavy_first is the causal grid's order (no window), got "
                    f"causal={causal!r}, window={window!r}")
    split = kv_split
    if split not in (1, 2, 4, 8) or isinstance(split, bool) or G % split or (split > 1
                                                                            and BQ != 64):
        raise _fail(f"build_dkdv: kv_split must be 1, 2, 4 or 8, divide the group size "
                    f"Hq / Hkv = {G} and come with 64-row q blocks, got kv_split={kv_split!r}, "
                    f"BQ={BQ!r}")
    Gs = G // split                                 # q heads per CTA
    kv_tile = OperandTile(BM, D, dt, major="K")
    q_tile = OperandTile(BQ, D, dt, major="K")
    q_mn = OperandTile(D, BQ, dt, major="MN")       # the same bytes as B of P^T dO / dS^T Q
    assert q_mn.nbytes == q_tile.nbytes
    slabs = D // 64
    stats_bytes = BQ * 8                            # (lse2, delta) of the block's rows
    stage_bytes = 2 * q_tile.nbytes + 1024          # stats padded to keep tiles 1024-aligned
    head_bytes = 2 * kv_tile.nbytes
    default_overlap = not safe and not atomic_dq and (BQ == 32 or D <= 64)
    overlap = default_overlap if overlap is None else bool(overlap)
    if overlap and (safe or atomic_dq):
        raise _fail("build_dkdv: overlap=True needs the fast schedule (not safe, not atomic_dq)")
    if BQ not in (32, 64, 128):
        raise _fail(f"build_dkdv: BQ must be 32, 64 or 128, got {BQ!r}")
    wide = BQ == 128    # dS and the dQ slabs live in the block's own stage
    if wide and (D != 128 or not dq_ordered or safe):
        raise _fail("build_dkdv: BQ=128 is the D=128 ordered bulk-dQ schedule (atomic_dq, "
                    "dq_bulk and dq_ordered; not safe)")
    if atomic_dq and BQ == 32:
        raise _fail(f"build_dkdv: atomic_dq needs BQ=64 (its dS tile), got BQ={BQ}")
    # atomic dQ: dS of the block (q x kv, q contiguous: an MN-major A) in two buffers
    ds_tile = OperandTile(BQ, BM, dt, major="MN") if atomic_dq else None
    kv_mn = OperandTile(D, BM, dt, major="MN")      # K as B of dS K (the same bytes as K)
    _check_dq_modes("build_dkdv", atomic_dq, dq_bulk, dq_ordered)
    check_dq_chains("build_dkdv", dq_chains, dq_ordered)
    chains = dq_chains
    # a consumer warpgroup's dQ columns: bulk: 64 (D=128: its half of D, all kv rows;
    # D=64: all of D over its own 64 kv rows, a partial sum in columns 64w.. of DQACC)
    dq_cols = 64 if D == 128 or dq_bulk else D
    if wide:        # 64 q rows x all of D each, over Q and dO once both are read
        dq_cols = D
    dq_bytes = 2 * (dq_cols // 32) * SLAB_BYTES if dq_bulk else 0
    dq_width = dq_accumulator_width(D, dq_bulk)     # a chain's columns
    acc_width = dq_width * chains                   # DQACC's
    ds_bytes = 2 * ds_tile.nbytes + dq_bytes if atomic_dq and not wide else 0
    stages = _smem_fit(head_bytes + ds_bytes, stage_bytes) if stages is None else stages
    smem_total = head_bytes + ds_bytes + stages * stage_bytes + 1024
    if smem_total > SMEM_LIMIT:
        raise _fail(f"build_dkdv: {stages} stages of {BQ} rows need {smem_total} bytes")
    num_q = -(-S // BQ)
    num_kv = -(-Sk // BM)
    sem_q = -(-S // 64)     # SEM's rows per head (build_prep's; BQ=128 uses the first num_q)
    # full attention, ordered dQ: kv block j walks q blocks from (BM / BQ) * j, wrapping
    rotate = (dq_ordered and not causal and num_q == (BM // BQ) * num_kv
              and num_kv * split <= ROTATE_MAX_KV    # the head's CTAs resident together
              and not windowed)
    # the predecessor is kb + 1 (launched first), or with heavy_first kb - 1
    reverse = dq_ordered and (causal or rotate or windowed) and not heavy_first
    cph = num_kv * split                            # CTAs per kv head
    n_main = cph * Hkv * B
    units = B * Hq * sem_q                          # dq_convert's 64-row q blocks
    per_head = G * sem_q                            # ... of one kv head
    share = early_convert_share(S, Sk, Hq, Hkv, split)  # convert_lag: q blocks per CTA
    lag_applies = (dq_convert and not causal and dq_accumulator_width(D, dq_bulk) == D
                   and share <= 2 and not windowed)
    if convert_lag == "auto":   # where it applies, none elsewhere
        convert_lag = default_convert_lag(Sk, num_sms, split) if lag_applies else 0
    if convert_lag and not (isinstance(convert_lag, int) and convert_lag > 0 and lag_applies):
        raise _fail(f"build_dkdv: convert_lag (a positive int) needs dq_convert, full "
                    f"attention, a dQ accumulator of width D (D=128) and at most two q blocks "
                    f"per dK/dV CTA, got convert_lag={convert_lag!r}, dq_convert={dq_convert!r}"
                    f", causal={causal!r}, D={D}, {share} q blocks per CTA")
    lag = int(convert_lag or 0)
    lead = resolve_stats_lead("build_dkdv", stats_lead, Sk, num_sms, dq_ordered, safe, BQ,
                              causal, kv_split=split)
    if heavy_first and (lag or lead):   # they count kv heads in launch order
        raise _fail(f"build_dkdv: heavy_first takes no convert_lag or stats_lead, got "
                    f"convert_lag={convert_lag!r}, stats_lead={stats_lead!r}")
    conv0 = max(0, B * Hkv - lag) * per_head if lag else 0  # the converter CTAs' first block
    n_conv = min(units - conv0, num_sms) if dq_convert else 0
    n_conv_grid = -(-n_conv // split) * split       # whole clusters; the rest return at once
    part_bytes = D * 256 * 4        # kv_split: the consumers' dK and dV partials (f32)
    if split > 1 and stages * stage_bytes < part_bytes // 2:
        raise _fail(f"build_dkdv: kv_split needs {part_bytes // 2} bytes of ring for the dV "
                    f"partials, {stages} stages of {stage_bytes} bytes give less")
    c1 = scale * LOG2E
    box_q = {"box": (1, BQ, 1, 64), "swizzle": "128B"}
    qspec = Tile(B, S, Hq, D, dt)
    kspec = Tile(B, Sk, Hkv, D, dt)
    layouts = check_layouts("build_dkdv", layouts)
    q_in, k_in, v_in = (input_spec(B, L, H, D, dt, lay) for L, H, lay in
                        ((S, Hq, layouts[0]), (Sk, Hkv, layouts[1]), (Sk, Hkv, layouts[2])))
    # stats_lead: rows per turn of _lead_stats, and per CTA; these and S are in its code
    # (runtime ones spill the 24-register producer warps, 8 bytes), hence in the family
    lead_per = 64 // (D // 8)
    lead_chunk = math.ceil(math.ceil(G * Sp / cph) / lead_per) * lead_per
    sizes = dict(seqlen_q=S, seqlen_k=Sk, stats_rows=Sp, q_blocks=num_q, kv_blocks=num_kv,
                 kv_last=num_kv - 1, sem_blocks=sem_q, kv_ctas=cph, kv_heads=B * Hkv,
                 main_ctas=n_main, units=units, head_units=per_head, conv_first=conv0,
                 converters=n_conv)
    if heavy_first:
        sizes["heavy_base"], sizes["heavy_extra"] = heavy_groups(B * Hkv, cph, num_sms)
    rt = SimpleNamespace()      # their registers in the trace (dkdv_kernel's first lines)

    def q_block(qb, kb):
        """The q block of step ``qb`` of kv block ``kb`` (rotated under ``rotate``; ordered
        ``heavy_first``: from the last q block down to kv block ``kb``'s first)."""
        if heavy_first:
            return rt.q_blocks + kb * (BM // BQ) - 1 - qb
        if not rotate:
            return qb
        r = qb + kb * (BM // BQ)
        wrapped = reg.scalar(u32)
        ptx.inst.selp.u32(wrapped, r - rt.q_blocks, r, r >= rt.q_blocks)
        return wrapped

    def window_kv_range(qb):
        """With a window: ``(klo, khi, any)``, the kv blocks ``klo..khi`` whose q blocks
        (``masks.query_blocks``) hold 64-row q block ``qb`` (registers; ``any`` false: none)."""
        right, left = right_reach(causal, window), window[0]
        q0 = reg.from_(qb * 64, s32)
        khi = reg.scalar(u32, init=rt.kv_last)
        if right is not None:
            khi = _min_u32(reg.from_((q0 + (63 + right)) // BM, u32), khi)
        if left < 0:
            return 0, khi, None
        klo = reg.from_(_max_s32(q0 - left, 0) // BM, u32)
        return klo, khi, reg.from_(q0 - left, s32) < rt.seqlen_k_s32

    def dq_rank(qb, kb):
        """The place of kv block ``kb`` among the kv blocks adding into q block ``qb`` (the
        ordered dQ mode): the adds of a q block come in rank order 0, 1, ..."""
        if heavy_first:     # kv blocks 0, 1, ..., all at the q block at the same step
            return kb
        if windowed and not causal:     # kv blocks khi, khi - 1, ..., klo (causal's order;
            return window_kv_range(qb)[1] - kb  # a causal window's khi is causal's)
        if causal:      # kv blocks jmax, jmax - 1, ..., 0 (each one step behind the last)
            return _min_u32((qb * BQ + (BQ - 1)) // BM, rt.kv_last) - kb
        if rotate:      # kv block j reaches q block i at step (i - 2j) % num_q
            step = qb + rt.q_blocks - kb * (BM // BQ)
            wrapped = reg.scalar(u32)
            ptx.inst.selp.u32(wrapped, step - rt.q_blocks, step, step >= rt.q_blocks)
            return wrapped // (BM // BQ)
        return kb       # kv blocks 0, 1, ... (each a step behind: a wavefront)

    def _now():
        return reg.from_(ptx.special.globaltimer_lo(), u32)

    def _spin_until(cell, want, now, waited=None):
        """Acquire-load the u32 at ``cell`` into ``now`` until it equals ``want``; with
        ``waited`` (``trace``), add the ns spent to it."""
        def not_yet():
            ptx.inst("ld.acquire.gpu.global.u32")(now, ptx.addr(cell))
            return now != want

        t0 = _now() if waited is not None else None
        with ptx.while_(not_yet):
            pass
        if waited is not None:
            ptx.inst.add.u32(waited, waited, _now() - t0)

    def _trace_at(TRACE, col):
        """The address of column ``col`` of this CTA's ``TRACE`` row (launch order)."""
        (pt,) = ptx.global_ptrs(TRACE)
        lin = reg.from_(ptx.special.ctaid.x(), u32)
        if not dq_convert:
            lin = lin + rt.kv_ctas * (reg.from_(ptx.special.ctaid.y(), u32)
                                  + Hkv * reg.from_(ptx.special.ctaid.z(), u32))
        return ptx.addr(reg.from_(lin * 4 + col, u64) * 4 + pt)

    def _dq_writer(DQACC, SEM, bufs, kb, hk, b, qb0, dq_full, dq_empty, pipe=None, TRACE=None,
                   qh0=None, q_end=None):
        """The ordered dQ mode's writer (one thread of the producer warpgroup): for each
        block, in the consumers' order, wait for this kv block's turn at the q block's
        counter, for both warpgroups' slabs (``dq_full``), add them into DQACC (the first
        rank stores), free the slabs once read (``dq_empty``; BQ=128: the slabs are the
        block's stage, released to ``pipe``), and once the previous block's adds are
        complete in global memory, count them (a release add)."""
        dq_map = ptx.tma.tensormap_ptr(DQACC.tmap)
        (psem,) = ptx.global_ptrs(SEM)
        now = reg.scalar(u32)

        def count(cell):
            ptx.fence_proxy_async("global")
            ptx.inst("red.release.gpu.global.add.u32")(ptx.addr(cell), 1)

        phase = reg.scalar(u32, init=0)
        waited = reg.scalar(u32, init=0) if TRACE is not None else None
        if wide:
            wst = pipe.consumer_state()
        for hq, qstep in block_steps(Gs, qb0, rt.q_blocks if q_end is None else q_end,
                                      lambda g: hk * G + g if split == 1 else qh0 + g,
                                      heavy_first):
            qb = q_block(qstep, kb)
            rank = dq_rank(qb, kb)
            u = (b * Hq + hq) * rt.sem_blocks + qb
            col = 0                         # the chain's first DQACC column
            if chains > 1:                  # chain rank mod P, as its (rank div P)-th add
                chain = rank & (chains - 1)
                rank = rank >> (chains.bit_length() - 1)
                u = u + chain * rt.units
                col = chain * dq_width
            cell = reg.from_(u * 2, u64) * 4 + psem

            _spin_until(cell, rank, now, waited)
            ptx.fence_proxy_async("global")
            first = rank == 0               # the first add writes the tile
            if wide:
                sb = wst.stage * stage_bytes + bufs
            for w in (0, 1):
                if wide:
                    ptx.mbarrier.wait(dq_full.at(wst.stage * 2 + w), wst.phase)
                else:
                    ptx.mbarrier.wait(dq_full.at(w), phase)
                for j in range(dq_cols // 32):
                    if wide:    # warpgroup w: q rows 64w.. of the block, all of D
                        src = sb + (w * (dq_bytes // 2) + j * SLAB_BYTES)
                        at = (col + 32 * j, hq, qb * BQ + 64 * w, b)
                    else:
                        src = bufs + (w * (dq_bytes // 2) + j * SLAB_BYTES)
                        at = (col + (w * dq_cols + 32 * j), hq, qb * BQ, b)
                    ptx.tma.store_tile(dq_map, at, src, pred=first)
                    ptx.tma.reduce_tile(dq_map, at, src, pred=~first)
            ptx.tma.commit_group()
            ptx.tma.wait_group(0, read=True)
            if wide:                        # the stage's last reader: back to the producer
                pipe.release(wst)
                wst.advance()
            else:
                for w in (0, 1):
                    ptx.mbarrier.arrive(dq_empty.at(w))
            ptx.tma.wait_group(0)           # complete in global memory: count it
            count(cell)
            ptx.inst.xor.b32(phase, phase, 1)
        if TRACE is not None:
            ptx.inst.st.global_.u32(_trace_at(TRACE, 3), waited)

    def _converter(DQACC, SEM, DQ, c, TRACE=None):
        """Converter CTA ``c`` (``dq_convert``): the 64-row q blocks ``c, c + n, c + 2n, ...``
        of the ``U`` in (batch, q head, q block) order (strided: the blocks of the heads that
        finish last are shared by all the converters), ``turn`` at a time, by 256
        threads, ``D / 32`` eight-column pieces each per block, every load of the turn
        issued before the first conversion. Thread ``32 j`` waits (acquire) until block j's
        counter holds every add (causal: kv blocks 0..min(qb / 2, num_kv - 1)); ``dq_chains``:
        each chain's counter its adds, the chains summed in order."""
        # the loads of CONVERT_BLOCKS blocks of 4 chains would spill (256 registers)
        turn = CONVERT_BLOCKS if chains < 4 else CONVERT_BLOCKS // 2
        tid = reg.from_(ptx.special.tid.x(), u32)
        pa, psem, pq = ptx.global_ptrs(DQACC, SEM, DQ)
        now = reg.scalar(u32)
        started = _now() if TRACE is not None else None
        waited = reg.scalar(u32, init=0) if TRACE is not None else None
        mine = (rt.units - rt.conv_first + (rt.converters - 1) - c) // rt.converters
        with ptx.if_(tid < 256):
            for j0 in ptx.loop(0, mine, turn):
                got = []
                for j in range(turn):
                    u = c + (j0 + j) * rt.converters
                    if lag:
                        u = u + rt.conv_first
                    live = j0 + j < mine
                    bh = u // rt.sem_blocks
                    qb = u - bh * rt.sem_blocks
                    some = None     # a window: whether any kv block adds into qb
                    if windowed:
                        klo, khi, some = window_kv_range(qb)
                        adds = khi + 1 - klo
                        if some is not None:
                            adds = reg.from_(_selp_u32(adds, 0, some), u32)
                    else:
                        adds = (_min_u32(qb // 2, rt.kv_last) + 1 if causal
                                else rt.kv_blocks)
                    with ptx.if_((tid == 32 * j) & live):
                        for ch in range(chains):
                            cell = u if ch == 0 else u + ch * rt.units
                            _spin_until(reg.from_(cell, u64) * 8 + psem,
                                        _chain_adds(adds, ch, chains), now, waited)
                    got.append((live, bh, qb, some, adds))
                ptx.bar_sync(1, 256)
                loads = []
                for live, bh, qb, some, adds in got:
                    b = bh // Hq
                    hq = bh - b * Hq
                    for i in range(D // 32):
                        v = tid + 256 * i
                        s = qb * 64 + v // (D // 8)
                        col = (v % (D // 8)) * 8
                        row = reg.from_((b * rt.seqlen_q + s) * Hq + hq, u64)
                        src = row * (acc_width * 4) + reg.from_(col * 4, u64) + pa
                        ok = (s < rt.seqlen_q) & live
                        xs = []
                        for ch in range(chains):    # chain ch: columns from ch * dq_width
                            x = reg.array(f32, 8 * dq_width // D)
                            for r in x:     # rows not converted: defined, never stored
                                ptx.inst.mov.f32(r, 0.0)    # (nor added into: zeros stored)
                            for h in range(len(x) // 4):   # 8 columns; a second sum D on
                                ptx.inst.ld.global_.v4.f32(
                                    list(x)[4 * h:4 * h + 4],
                                    ptx.addr(src, 16 * (h % 2) + 4 * D * (h // 2)
                                             + 4 * ch * dq_width),
                                    pred=(ok if some is None else ok & some) if ch == 0
                                    else ok & (adds > ch))  # a chain not reached: zeros
                            xs.append(x)
                        loads.append((xs, row * (D * 2) + reg.from_(col * 2, u64) + pq, ok))
                for xs, dst, ok in loads:
                    if dq_width != D:
                        for x in xs:
                            for m in range(8):
                                ptx.inst.add.f32(x[m], x[m], x[m + 8])
                    x = chain_sum(xs)
                    packed = reg.array(b32, 4)
                    _pack(packed, x, dt)
                    ptx.inst.st.global_.v4.b32(ptx.addr(dst), packed, pred=ok)
        if TRACE is not None:
            with ptx.if_(tid == 0):
                ptx.inst.st.global_.v4.b32(_trace_at(TRACE, 0), [
                    started, _now(), reg.from_(ptx.special.smid(), u32), waited])
        ptx.ret()

    def _early_converter(DQACC, SEM, DQ, cta):
        """Warps 2 and 3 of the producer warpgroup (``convert_lag``): the ``share`` q blocks
        ``p * share ..`` of kv head ``H - lag``, for CTA ``p`` of kv head ``H`` (launch order);
        thread 64 waits (acquire) until a block's counter holds all ``num_kv`` adds (each
        chain's counter its share, ``dq_chains``), then each thread converts 4 columns of a
        row per step, one load in flight (a chain's at a time, summed in order): the
        producer's 24 registers do not hold two (ptxas spills)."""
        t = reg.from_(ptx.special.tid.x(), u32) - 64
        head = cta // rt.kv_ctas
        pa, psem, pq = ptx.global_ptrs(DQACC, SEM, DQ)
        now = reg.scalar(u32)
        with ptx.if_(head >= lag):
            for j in range(share):
                within = (cta - head * rt.kv_ctas) * share + j
                u = (head - lag) * rt.head_units + within
                live = within < rt.head_units
                with ptx.if_((t == 0) & live):
                    for ch in range(chains):
                        cell = u if ch == 0 else u + ch * rt.units
                        _spin_until(reg.from_(cell, u64) * 8 + psem,
                                    _chain_adds(rt.kv_blocks, ch, chains), now)
                ptx.bar_sync(4, 64)
                bh = u // rt.sem_blocks
                b = bh // Hq
                first = ((b * rt.seqlen_q + (u - bh * rt.sem_blocks) * 64) * Hq
                         + (bh - b * Hq))   # (b, s, hq) row
                for i in ptx.loop(0, D // 4):
                    v = t + 64 * i
                    ok = ((u - bh * rt.sem_blocks) * 64 + v // (D // 4) < rt.seqlen_q) & live
                    row = reg.from_(first + (v // (D // 4)) * Hq, u64)
                    col = (v % (D // 4)) * 4
                    for ch in range(chains):    # a chain at a time, added in order
                        x = reg.array(f32, 4)
                        for r in x:     # rows past S (or a chain not reached): defined
                            ptx.inst.mov.f32(r, 0.0)
                        if ch == 0:
                            src = row * (acc_width * 4) + reg.from_(col * 4, u64) + pa
                            x0 = x
                        ptx.inst.ld.global_.v4.f32(
                            list(x), ptx.addr(src, 4 * ch * dq_width) if ch else ptx.addr(src),
                            pred=ok if ch == 0 else ok & (rt.kv_blocks > ch))
                        if ch:
                            chain_sum([x0, x])
                    packed = reg.array(b32, 2)
                    _pack(packed, x0, dt)
                    ptx.inst.st.global_.v2.b32(
                        ptx.addr(row * (D * 2) + reg.from_(col * 2, u64) + pq), packed, pred=ok)

    def _flag(psem, head):
        """The ``stats_lead`` flag of kv head ``head`` (launch order): the spare second cell
        of its first q head's first q block."""
        return reg.from_(G * head * rt.sem_blocks * 2 + 1, u64) * 4 + psem

    def _lead_stats(OUT, DO, LSE, STATS, SEM, head, p):
        """Warps 2 and 3 (``stats_lead``): CTA ``p`` of kv head ``head`` (launch order)
        writes rows ``p * chunk ..`` of the ``G * Sp`` STATS rows of kv head ``head + lead``,
        ``D / 8`` lanes per row, 16 bytes of O and dO each (``_prep_stats``'s math), then
        counts itself on that head's flag (release, after a proxy fence: the producers read
        STATS with bulk copies)."""
        t = reg.from_(ptx.special.tid.x(), u32) - 64
        lanes = D // 8
        per = 64 // lanes                   # rows per turn
        target = head + lead
        po, pdo, plse, pstats, psem = ptx.global_ptrs(OUT, DO, LSE, STATS, SEM)
        with ptx.if_(target < rt.kv_heads):
            bt = target // Hkv
            for k in ptx.loop(0, lead_chunk // lead_per):
                r = p * lead_chunk + k * per + t // lanes
                live = r < G * Sp
                g = r // Sp
                s = r - g * Sp
                hq = (target - bt * Hkv) * G + g
                ok = live & (s < S)
                off = reg.from_(((bt * S + s) * Hq + hq) * D + (t % lanes) * 8,
                                u64) * 2
                wo, wd = _row_pieces(po, pdo, off, ok)
                lv = reg.scalar(f32, init=0.0)
                row = reg.from_((bt * Hq + hq) * S + s, u64)
                ptx.inst.ld.global_.nc.f32(lv, ptx.addr(row * 4 + plse),
                                           pred=ok & (t % lanes == 0))
                acc = _row_delta(wo, wd, lanes, dt)
                soff = reg.from_((bt * Hq + hq) * Sp + s, u64) * 8
                ptx.inst.st.global_.v2.f32(ptx.addr(pstats + soff), [lv * LOG2E, acc],
                                           pred=live & (t % lanes == 0))
            ptx.fence_proxy_async("global")
        ptx.bar_sync(4, 64)
        with ptx.if_((t == 0) & (target < rt.kv_heads)):
            ptx.inst("red.release.gpu.global.add.u32")(ptx.addr(_flag(psem, target)), 1)

    def dkdv_kernel(Q, K, V, DO, STATS, DQACC, SEM, DK, DV, DQ=None, TRACE=None, OUT=None,
                    LSE=None):
        rt.__dict__.update(vars(size_params(sizes)))
        rt.seqlen_q_s32, rt.seqlen_k_s32 = reg.from_(rt.seqlen_q, s32), reg.from_(rt.seqlen_k, s32)
        if dq_convert:      # the last converters CTAs of the 1-D grid convert dQ
            with ptx.if_(reg.from_(ptx.special.ctaid.x(), u32) >= rt.main_ctas):
                spare = reg.from_(ptx.special.ctaid.x(), u32) >= rt.main_ctas + rt.converters
                ptx.ret(pred=spare)     # a last cluster's spare CTAs
                _converter(DQACC, SEM, DQ, reg.from_(ptx.special.ctaid.x(), u32) - rt.main_ctas,
                           TRACE)
        if TRACE is not None:   # the start, the SM; no writer: no wait
            with ptx.if_(reg.from_(ptx.special.tid.x(), u32) == 0):
                ptx.inst.st.global_.u32(_trace_at(TRACE, 0), _now())
                ptx.inst.st.global_.u32(_trace_at(TRACE, 2), reg.from_(ptx.special.smid(), u32))
                if not dq_ordered:
                    ptx.inst.st.global_.u32(_trace_at(TRACE, 3), 0)
        base = ring_base("smem")
        pipe = Pipeline(stages, consumer_arrivals=RELEASE_ARRIVALS + (1 if wide else 0))
        head_bar = BarrierArray(1, name="head_bar")
        tid, wg = thread_ids()
        if heavy_first:
            kb, hk, b = heavy_first_cta(split, rt.kv_blocks, Hkv, rt.heavy_base,
                                        rt.heavy_extra, flat=dq_convert)
        elif dq_convert:    # 1-D grid, the 3-D grid's order
            cta = reg.from_(ptx.special.ctaid.x(), u32)
            unit = cta if split == 1 else cta // split     # the cluster
            kb = unit % rt.kv_blocks
            if reverse:
                kb = (rt.kv_last) - kb
            hk = (unit // rt.kv_blocks) % Hkv
            b = unit // (rt.kv_blocks * Hkv)
        else:
            kb = reg.from_(ptx.special.ctaid.x(), u32)
            if split > 1:
                kb = kb // split
            if reverse:     # launched last kv block first: a block's turn follows kb + 1's
                kb = (rt.kv_last) - kb
            hk = reg.from_(ptx.special.ctaid.y(), u32)
            b = reg.from_(ptx.special.ctaid.z(), u32)
        if lead:        # kv head and CTA within it, launch order
            if dq_convert:
                head = cta // rt.kv_ctas
                pos = cta - head * rt.kv_ctas
            else:
                head = hk + Hkv * b
                pos = reg.from_(ptx.special.ctaid.x(), u32)
        k0 = kb * BM
        # kv_split: this CTA's first q head (rank r of the cluster: the group's r-th share)
        qh0 = hk * G + ptx.cluster.ctarank() * Gs if split > 1 else None
        pipe.init(pred=tid == 0)
        head_bar.init(1, pred=tid == 0)
        if dq_ordered:  # the consumers' dQ slabs <-> the dQ writer thread, per warpgroup
            # BQ=128: one dq_full per (stage, warpgroup), since the consumers may run two
            # blocks ahead of the writer; no dq_empty, the slabs are the block's stage
            dq_full = BarrierArray(2 * stages if wide else 2, name="dq_full")
            dq_empty = None if wide else BarrierArray(2, name="dq_empty")
            dq_full.init(128, pred=tid == 0)     # every thread of the warpgroup arrives
            if not wide:
                dq_empty.init(1, pred=tid == 0)
        ptx.bar_sync(0)
        # causal: q blocks wholly above the diagonal (every q < k0) are skipped
        qb0 = k0 // BQ if causal else 0
        q_end = rt.q_blocks

        def window_q_range():
            """The q blocks ``[first, end)`` the window reaches (formed where each role
            needs them: the producer warps have 24 registers)."""
            first, _, _, end = query_blocks(reg.from_(k0, s32), rt.seqlen_k_s32, rt.seqlen_q_s32, BQ,
                                            causal, BM, window)
            return tuple(x if isinstance(x, int) else reg.from_(x, u32) for x in (first, end))
        pstats, pdk, pdv = ptx.global_ptrs(STATS, DK, DV)
        if atomic_dq:
            (pacc,) = ptx.global_ptrs(DQACC)
        roles = Roles(wg, PROD_REGS)
        # ------------------------------------------------------------ producer
        def wait_stats():   # this head's stats are in once every CTA of head - lead counted
            with ptx.if_(head >= lead):
                (psem,) = ptx.global_ptrs(SEM)
                _spin_until(_flag(psem, head), rt.kv_ctas, reg.scalar(u32))
            ptx.fence_proxy_async("global")

        def load_q(sb, q_map, do_map, hq, qb, bar):
            _load_slabs(sb, q_map, slabs, hq, qb * BQ, b, BQ, bar, layouts[0])
            _load_slabs(sb + q_tile.nbytes, do_map, slabs, hq, qb * BQ, b, BQ, bar)

        if windowed:
            qb0, q_end = window_q_range()
        _dkdv_producer(
            tid, head_bar, head_bytes, pipe, G, hk, qb0, q_end, base, head_bytes + ds_bytes,
            stage_bytes, q_tile.nbytes, stats_bytes, safe, sync, Q, DO,
            load_head=lambda hbar: _load_pair(base, K, V, kv_tile.nbytes, slabs, hk, k0, b, BM,
                                              hbar, layouts[1:]),
            stats_row=lambda hq: reg.from_((b * Hq + hq) * rt.stats_rows, u64) * 8 + pstats,
            q_block=lambda qstep: q_block(qstep, kb), load_q=load_q,
            before=wait_stats if lead else None, heads=(qh0, Gs) if split > 1 else None,
            q_outer=heavy_first)
        if dq_ordered and wide:
            with ptx.if_(tid == 32):
                _dq_writer(DQACC, SEM, base + head_bytes, kb, hk, b, qb0, dq_full, dq_empty,
                           pipe, TRACE=TRACE)
        elif dq_ordered:
            with ptx.if_(tid == 32):
                if windowed:
                    qb0, q_end = window_q_range()
                _dq_writer(DQACC, SEM, base + (head_bytes + 2 * ds_tile.nbytes), kb, hk, b,
                           qb0, dq_full, dq_empty, TRACE=TRACE, qh0=qh0, q_end=q_end)
        if lag or lead:
            with ptx.if_(tid >= 64):
                if lead:
                    _lead_stats(OUT, DO, LSE, STATS, SEM, head, pos)
                if lag:
                    _early_converter(DQACC, SEM, DQ, cta)
        if split > 1:   # the producer warps exit here: barrier.cluster waits for the
            ptx.ret()   # non-exited threads, the consumers' only
        # ------------------------------------------------------------ consumers
        roles.consumers(CONS_REGS)
        c = _dkdv_consumer_regs(tid, wg, k0, rt.seqlen_k, BQ, D, wide, base,
                                head_bytes + ds_bytes, kv_tile, q_tile, q_mn, pipe)
        w, t, s_acc, dp_acc, dv_acc, dk_acc = c.w, c.t, c.s_acc, c.dp_acc, c.dv_acc, c.dk_acc
        dp_half = dp_acc    # wide: dP^T by halves (registers: dV, dK, S^T or dQ, P^T)
        p_pack, ds_pack, row0, col0, kvrow, valid = (c.p_pack, c.ds_pack, c.row0, c.col0,
                                                     c.kvrow, c.valid)
        k_desc, v_desc, ring, q_desc0 = c.k_desc, c.v_desc, c.ring, c.q_desc0
        cons, stats_col = c.cons, c.stats_col
        if wide:
            def wide_addrs(sbase):
                """This thread's dS and dQ-slab addresses in the stage at ``sbase`` (formed
                per block from the thread id: no registers held over the loop): dS (q x kv,
                MN-major) over the stage's dO, its kv row; the dQ slabs over the whole
                stage, warpgroup w's 64 q rows at w * 32 KB."""
                tx = reg.from_(ptx.special.tid.x(), u32)
                lane, wq = tx & 31, (tx >> 7) - 1
                r0, _ = s_acc.thread_origin(tx & 127)
                at = sbase + ring + r0 * 128
                ds_row = at + q_tile.nbytes + wq * (64 * 128) + (lane & 3) * 4
                dq_row = at + wq * (dq_bytes // 2) + (lane & 1) * 8
                ds_w = reg.from_(wq * (ds_tile.offset(0, 64) >> 4), u64)
                dq_x = ((lane >> 1) & 1 ^ (lane >> 2)) << 4
                return ds_row, (lane >> 2) << 4, dq_row, dq_x, ds_w
        elif atomic_dq:
            it = reg.scalar(u32, init=0)
            lane = tid & 31
            xr = lane >> 2                          # the kv row's swizzle phase (row % 8)
            # this thread's bytes of a dS buffer: kv row (64w + row0 + dr), its pair of q
            # columns in 16-byte chunk blk ^ (row % 8)
            ds_row = base + head_bytes + (w * 64 + row0) * 128 + (lane & 3) * 4
            xr16 = xr << 4                          # chunk blk's address: ds_row + (xr16 ^ 16 blk)
            kmn_desc = kv_mn.descriptor(base)
            ds_desc0 = ds_tile.descriptor(base, offset=head_bytes)
            dq_steps = ds_tile.k_steps              # the kv rows (16 per step) of dS K
            if D == 128:
                kmn_desc = kmn_desc + reg.from_(w * (kv_mn.offset(0, 64) >> 4), u64)
            elif dq_bulk:                           # D=64: this warpgroup's own 64 kv rows
                dq_steps = 4
                kmn_desc = kmn_desc + reg.from_(w * (kv_mn.offset(4) >> 4), u64)
                ds_desc0 = ds_desc0 + reg.from_(w * (ds_tile.offset(4) >> 4), u64)
            qcol = w * 64 + col0 if D == 128 else col0
            if dq_bulk:
                # this warpgroup's f32 dQ slabs (64 rows x 32 columns, 128-byte swizzled)
                dq_buf = base + (head_bytes + 2 * ds_tile.nbytes) + w * (dq_bytes // 2)
                # the pair (row, cols c, c+1) of a 128-byte swizzled f32 slab: 16-byte
                # chunk c // 4 XOR-ed with row % 8 (= lane // 4): from two registers per
                # store (an xor), not eight held addresses (registers are short here)
                dq_row = dq_buf + row0 * 128 + (lane & 1) * 8
                dq_x = ((lane >> 1) & 1 ^ (lane >> 2)) << 4
                dq_leader = t == 0
                if dq_ordered:
                    dq_n = reg.scalar(u32, init=0)      # dQ tiles handed to the writer
                else:
                    dq_map = ptx.tma.tensormap_ptr(DQACC.tmap)

                def _store_dq(q0r, hqr):
                    """The finished dQ product (dp_acc, this warpgroup's ``dq_cols`` columns
                    of q rows ``q0r..q0r+63`` of head ``hqr``), times ``scale``, into the
                    warpgroup's shared slabs; then the leader adds them into DQACC with TMA
                    tile reductions (rows past S clipped by the tensor map), or, ordered,
                    every thread hands them to the dQ writer thread (``dq_full``)."""
                    if dq_ordered:              # the writer has read the slabs
                        ptx.mbarrier.wait(dq_empty.at(w), (dq_n & 1) ^ 1)
                    else:                       # the last reductions have read the slabs
                        with ptx.if_(dq_leader):
                            ptx.tma.wait_group(0, read=True)
                        ptx.bar_sync(2 + w, 128)
                    for i, dr, dc in dp_acc.pairs():
                        v0 = dp_acc[i] * float(scale)
                        v1 = dp_acc[i + 1] * float(scale)
                        q = dc % 32 * 4 // 16       # even: its chunk is q + (lane >> 1 & 1)
                        at = dq_row + (dq_x ^ (q << 4))
                        ptx.inst.st.shared.v2.f32(ptx.addr(at, dc // 32 * SLAB_BYTES + dr * 128),
                                                  [v0, v1])
                    ptx.fence_proxy_async("shared::cta")
                    if dq_ordered:
                        ptx.mbarrier.arrive(dq_full.at(w))
                        ptx.inst.add.u32(dq_n, dq_n, 1)
                        return
                    ptx.bar_sync(2 + w, 128)
                    with ptx.if_(dq_leader):
                        for j in range(dq_cols // 32):
                            ptx.tma.reduce_tile(dq_map, (w * dq_cols + 32 * j, hqr, q0r, b),
                                                dq_buf + j * SLAB_BYTES if j else dq_buf)
                        ptx.tma.commit_group()

        def mask_pt(acc, q0):
            """Zero the P^T entries of query columns past S and, when causal, those with key
            > query (a branch skips it for blocks that need neither; the safe schedule
            always masks)."""
            if safe:
                need = None
            elif windowed:      # the blocks straddling an edge of the window or S (the
                # bounds formed again here: fewer registers held over the loop)
                _, lo_b, hi_b, _ = query_blocks(reg.from_(k0, s32), rt.seqlen_k_s32,
                                                rt.seqlen_q_s32, BQ, causal, BM, window)
                need = _or(q0 < reg.from_(lo_b * BQ, u32), q0 >= reg.from_(hi_b * BQ, u32))
            elif causal:
                need = _or(q0 + BQ > rt.seqlen_q, q0 < k0 + (BM - 1))
            else:
                need = q0 + BQ > rt.seqlen_q
            with _maybe_if(need):
                qc = q0 + col0
                hi = reg.from_(rt.seqlen_q - qc, s32)   # column offset c valid iff c < hi
                if windowed:
                    _mask_window(acc, hi, qc, kvrow, causal, window)
                    return
                if causal:
                    lo = [reg.from_(kvrow + r, s32) - reg.from_(qc, s32) for r in (0, 8)]
                for i in range(len(acc)):
                    dr, dc = Accumulator.coord(i)
                    ptx.inst.selp.f32(acc[i], acc[i], 0.0, hi > dc)
                    if causal:  # kv <= q  <=>  (kvrow + dr) - qc <= dc
                        ptx.inst.selp.f32(acc[i], acc[i], 0.0, lo[dr // 8] <= dc)

        def pt_dv(acc, q0, domn):
            _pt_dv(c, acc, q0, domn, mask_pt, BQ, D, dt, q_mn)

        def _wide_block(q0, sbase, soff):
            """One 128-row q block (BQ=128, registers: dV, dK, S^T or dQ, P^T): S^T, P^T
            packed, dV; dP^T by 64-column halves, dS^T packed over P^T in place; dK; dS
            over the stage's dO once both warpgroups' dV are done; dQ = dS K once dK is;
            the dQ tile over the whole stage once both warpgroups' dQ are done, for the
            writer thread (which releases the stage after reading it)."""
            acc = s_acc
            # every descriptor of the stage from one (they differ by constants)
            qd = q_desc0 + soff
            dod = qd + (q_tile.nbytes >> 4)
            mn = (q_mn.descriptor_constant() - q_tile.descriptor_constant()) % (1 << 64)
            qmn, domn = qd + mn, dod + mn
            src = sbase + (ring + stats_col)
            ptx.wgmma.fence()
            for kk in range(kv_tile.k_steps):
                ptx.wgmma.mma_async(acc.regs, kv_tile.advance(k_desc, kk),
                                    q_tile.advance(qd, kk), n=BQ, dtype_ab=dt.name,
                                    scale_d=0 if kk == 0 else 1)
            ptx.wgmma.commit_group()
            ptx.wgmma.wait_group(0)                 # S^T
            for blk in range(BQ // 8):              # P^T = exp2(S^T * c1 - lse2), in place
                v4 = reg.array(f32, 4)
                ptx.inst.ld.shared.v4.f32(v4, ptx.addr(src, 64 * blk))
                for i in range(4 * blk, 4 * blk + 4):
                    ptx.inst.fma.rn.f32(acc[i], acc[i], c1, -v4[2 * (i % 2)])
                    ptx.inst.ex2.approx.ftz.f32(acc[i], acc[i])
            pt_dv(acc, q0, domn)
            for h in (0, 1):    # dP^T by 64 q columns; dS^T over the packed P^T, in place
                ptx.wgmma.fence()
                for kk in range(kv_tile.k_steps):
                    ptx.wgmma.mma_async(dp_half.regs, kv_tile.advance(v_desc, kk),
                                        q_tile.advance(dod, kk, 64 * h), n=64,
                                        dtype_ab=dt.name, scale_d=0 if kk == 0 else 1)
                ptx.wgmma.commit_group()
                ptx.wgmma.wait_group(0)             # (h = 0: dV too, the reader of P^T)
                for blk in range(8):
                    v4 = reg.array(f32, 4)
                    ptx.inst.ld.shared.v4.f32(v4, ptx.addr(src, 64 * (8 * h + blk)))
                    for m in (2 * blk, 2 * blk + 1):
                        word = p_pack[16 * h + m]
                        p_lo, p_hi = _unpack(word, dt)
                        for i, p in ((2 * m, p_lo), (2 * m + 1, p_hi)):
                            x = dp_half[i] - v4[2 * (i % 2) + 1]
                            ptx.inst.mul.f32(dp_half[i], p, x)
                        ptx.inst(f"cvt.rn.{dt.name}x2.f32")(word, dp_half[2 * m + 1],
                                                            dp_half[2 * m])
            ptx.wgmma.fence()
            for kk in range(BQ // 16):
                ptx.wgmma.mma_async(dk_acc.regs, list(p_pack)[4 * kk:4 * kk + 4],
                                    q_mn.advance(qmn, kk), n=D, dtype_ab=dt.name,
                                    trans_b=q_mn.trans)
            ptx.wgmma.commit_group()
            ptx.bar_sync(1, 256)                    # both warpgroups have read dO
            dsr, xr16, dqr, dq_x, ds_w = wide_addrs(sbase)
            for m in range(len(p_pack)):
                dr, dc = Accumulator.coord(2 * m)
                at = dsr + (xr16 ^ (dc % 64 // 8 << 4))
                ptx.inst.st.shared.b32(
                    ptx.addr(at, dc // 64 * ds_tile.slab_bytes + dr * 128), p_pack[m])
            ptx.fence_proxy_async("shared::cta")
            ptx.wgmma.wait_group(0)                 # dK (its P^T registers are dQ's room)
            ptx.bar_sync(1, 256)                    # both halves of dS written
            ds = (ds_tile.descriptor_constant() - q_tile.descriptor_constant()) % (1 << 64)
            da = dod + ds + ds_w
            kmn_desc = kv_mn.descriptor(base)
            ptx.wgmma.fence()
            for kk in range(ds_tile.k_steps):
                ptx.wgmma.mma_async(acc.regs, ds_tile.advance(da, kk),
                                    kv_mn.advance(kmn_desc, kk), n=D, dtype_ab=dt.name,
                                    scale_d=0 if kk == 0 else 1, trans_a=ds_tile.trans,
                                    trans_b=kv_mn.trans)
            ptx.wgmma.commit_group()
            ptx.wgmma.wait_group(0)                 # dQ
            ptx.bar_sync(1, 256)                    # both warpgroups are done with Q and dS
            for i, dr, dc in acc.pairs():
                q = dc % 32 * 4 // 16
                at = dqr + (dq_x ^ (q << 4))
                ptx.inst.st.shared.v2.f32(ptx.addr(at, dc // 32 * SLAB_BYTES + dr * 128),
                                          [acc[i] * float(scale), acc[i + 1] * float(scale)])
            _release_stage(pipe, cons)              # the fence orders the slabs' writes too
            ptx.mbarrier.arrive(dq_full.at(cons.stage * 2 + w))

        ptx.mbarrier.wait(head_bar.at(0), 0)
        if windowed:
            qb0, q_end = window_q_range()

        def per_head(g):
            hq = hk * G + g if split == 1 else qh0 + g
            return hq, reg.from_((b * Hq + hq) * rt.stats_rows, u64) * 8 + pstats

        for (hq, srow), qstep in block_steps(Gs, qb0, q_end, per_head, heavy_first):
            qb = q_block(qstep, kb)
            q0 = qb * BQ
            pipe.wait(cons)
            sbase = cons.stage * stage_bytes
            soff = reg.from_(reg.from_(sbase >> 4, u32), u64)
            if wide:
                _wide_block(q0, sbase, soff)
                cons.advance()
                continue
            def _dq_product(q0=q0, hq=hq):
                """The block's dQ product, dS K, from a swizzled shared dS (both
                warpgroups' kv rows; bulk at D=64: the warpgroup's own): bulk, issued into
                dp_acc and stored by ``_store_dq``; otherwise waited for and added with
                one ``red.global.add.v2.f32`` per pair (dQ[q0:q0+BQ] += scale * dS K)."""
                buf = (it & 1) * ds_tile.nbytes
                dq_regs = dp_acc.regs if dq_bulk else s_acc.regs
                for m in range(len(ds_pack)):
                    dr, dc = Accumulator.coord(2 * m)
                    at = ds_row + (xr16 ^ (dc // 8 << 4)) + buf
                    ptx.inst.st.shared.b32(ptx.addr(at, dr * 128), ds_pack[m])
                ptx.fence_proxy_async("shared::cta")
                if dq_bulk and D == 64:         # its own half of dS written
                    ptx.bar_sync(2 + w, 128)
                else:
                    ptx.bar_sync(1, 256)        # both consumers' halves of dS written
                with _maybe_if(w == 0 if D == 64 and not dq_bulk else None):
                    da = ds_desc0 + reg.from_(reg.from_(buf >> 4, u32), u64)
                    ptx.wgmma.fence()
                    for kk in range(dq_steps):
                        ptx.wgmma.mma_async(dq_regs, ds_tile.advance(da, kk),
                                            kv_mn.advance(kmn_desc, kk), n=dq_cols,
                                            dtype_ab=dt.name, scale_d=0 if kk == 0 else 1,
                                            trans_a=ds_tile.trans, trans_b=kv_mn.trans)
                    ptx.wgmma.commit_group()
                    if not dq_bulk:
                        ptx.wgmma.wait_group(0)
                        qr = q0 + row0
                        for r in (0, 8):
                            elem = ((b * rt.seqlen_q + qr + r) * Hq + hq) * D + qcol
                            addr = reg.from_(elem, u64) * 4 + pacc
                            ok = qr + r < rt.seqlen_q
                            for i, dr, dc in s_acc.pairs():
                                if dr != r:
                                    continue
                                v0 = s_acc[i] * float(scale)
                                v1 = s_acc[i + 1] * float(scale)
                                ptx.inst("red.global.add.v2.f32")(ptx.addr(addr, dc * 4), [v0, v1],
                                                                  pred=ok)
                ptx.inst.add.u32(it, it, 1)

            def after_dk(q0=q0, hq=hq):
                if dq_bulk:
                    ptx.wgmma.wait_group(1)             # dV and dQ done, dK may run on
                    _store_dq(q0, hq)
                elif atomic_dq:
                    _dq_product()

            # dq_bulk: dQ's product first, stored (after_dk) while dK's runs
            _dkdv_block(c, q0, sbase, soff, srow, safe=safe, overlap=overlap, BQ=BQ, D=D,
                        dt=dt, c1=c1, kv_tile=kv_tile, q_tile=q_tile, q_mn=q_mn, pipe=pipe,
                        mask=mask_pt, after_ds=_dq_product if dq_bulk else None,
                        after_dk=after_dk, cap=cap, keyless=windowed)
        _dkdv_drain(c, overlap, pipe)
        if dq_bulk and not dq_ordered:
            with ptx.if_(dq_leader):
                ptx.tma.wait_group(0, read=True)
        if wide:        # read again here: no registers held over the loop
            pdk, pdv = ptx.global_ptrs(DK, DV)
        if split > 1:   # dK's partials over the head tile, dV's over the ring
            def store(part, col, dv):
                _store_rows(part, pdv if dv else pdk, kvrow, valid, Hkv, D, hk, b,
                            rt.seqlen_k, col0 if isinstance(col, int) and not col else col0 + col,
                            1.0 if dv else scale, dt)
            _store_split_partials(dk_acc, dv_acc, base, head_bytes + ds_bytes, split, store)
        else:
            _store_rows(dk_acc, pdk, kvrow, valid, Hkv, D, hk, b, rt.seqlen_k, col0, scale, dt)
            _store_rows(dv_acc, pdv, kvrow, valid, Hkv, D, hk, b, rt.seqlen_k, col0, 1.0, dt)
        if TRACE is not None:   # the consumers' end
            with ptx.if_(tid == 128):
                ptx.inst.st.global_.u32(_trace_at(TRACE, 1), _now())
        roles.end()
        ptx.ret()

    name = (f"attn_bwd_dkdv_{dt.name}_d{D}_h{Hq}x{Hkv}{feature_tag(causal, window, softcap)}"
            f"{'_safe' if safe else ''}{'_atomic' if atomic_dq else ''}{'_bulk' if dq_bulk else ''}"
            f"{'_ordered' if dq_ordered else ''}{f'_c{chains}' if chains > 1 else ''}"
            f"{'_heavy' if heavy_first else ''}"
            f"{f'_bq{BQ}' if BQ != 64 else ''}{'_serial' if overlap != default_overlap else ''}"
            f"{f'_cvt{num_sms}' if dq_convert else ''}{f'_lag{lag}' if lag else ''}"
            f"{f'_lead{lead}' if lead else ''}{f'_split{split}' if split > 1 else ''}"
            f"{'_trace' if trace else ''}{layout_tag(layouts)}")
    ins = (q_in, k_in, v_in, qspec, Tile(B, Hq, Sp, 2, f32))
    grid = (n_main + n_conv_grid, 1, 1) if n_conv else (cph, Hkv, B)
    outs = (kspec, kspec)
    traced = (Tile(n_main + n_conv, 4, s32),) if trace else ()
    if dq_ordered:  # tensor parameters by name: (..., SEM[, OUT, LSE], DK, DV[, DQ][, TRACE])
        ins += (Tile(B, S, Hq, acc_width, f32), Tile(chains * B, Hq, sem_q, 2, s32))
        names = ["Q", "K", "V", "DO", "STATS", "DQACC", "SEM", "DK", "DV"]
        if lead:
            ins += (qspec, Tile(B, Hq, S, f32))
            names[7:7] = ["OUT", "LSE"]
        if n_conv:
            outs += (qspec,)
            names.append("DQ")
        if trace:
            names.append("TRACE")

        def fn(*tensors):
            dkdv_kernel(**dict(zip(names, tensors)))
        fn.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    elif atomic_dq and trace:
        ins += (Tile(B, S, Hq, dq_width, f32),)

        def fn(Q, K, V, DO, STATS, DQACC, DK, DV, TRACE):
            dkdv_kernel(Q, K, V, DO, STATS, DQACC, None, DK, DV, None, TRACE)
    elif atomic_dq:
        ins += (Tile(B, S, Hq, dq_width, f32),)

        def fn(Q, K, V, DO, STATS, DQACC, DK, DV):
            dkdv_kernel(Q, K, V, DO, STATS, DQACC, None, DK, DV)
    else:
        def fn(Q, K, V, DO, STATS, DK, DV):
            dkdv_kernel(Q, K, V, DO, STATS, None, None, DK, DV)
    fn.__name__ = "dkdv_kernel"
    tma = {"Q": input_box(BQ, layouts[0]), "DO": box_q, "K": input_box(BM, layouts[1]),
           "V": input_box(BM, layouts[2])}
    if dq_bulk:
        tma["DQACC"] = {"box": (1, 64, 1, 32), "swizzle": "128B"}
    k = kernel(in_specs=ins, out_specs=outs + traced, grid=grid,
               block=(THREADS, 1, 1), smem=smem_total, maxnreg=168,
               cluster=(split, 1, 1),
               version="8.3" if atomic_dq else None,      # red.global.add.v2.f32: ISA 8.1
               tma=tma, name=name)(fn)
    # in the code, not read at run time: rotate (from the block counts), convert_lag's
    # share of q blocks per CTA (a Python loop) and stats_lead's rows
    family = ("attn_bwd_dkdv", dt.name, D, Hq, Hkv, causal, scale, BQ, stages, sync, safe,
              atomic_dq, overlap, dq_bulk, dq_ordered, num_sms, dq_convert, lag, lead, split,
              trace, window, softcap, rotate, share if lag else None,
              (S, lead_chunk) if lead else None, layouts, chains) + (
                  ("heavy_first",) if heavy_first else ())
    return _family.specialized(k, family, sizes)
