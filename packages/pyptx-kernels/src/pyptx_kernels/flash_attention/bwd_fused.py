"""The fused one-kernel backward at head dim 64 (``build_fused``): 128-row q blocks, five
products per block pair, dK and dV summed in registers and dQ added by bulk tile reductions
(in a fixed order with ``ordered``); ``defer`` and ``pingpong`` are its two other schedules."""

from __future__ import annotations

import copy

from pyptx import Tile, kernel, ptx, reg
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.pipeline import BarrierArray, Pipeline
from pyptx.types import b32, f32, s32, u32, u64
from pyptx.warpspec import SLAB_BYTES, Roles, ring_base, thread_ids
from pyptx_kernels import _family
from pyptx_kernels.flash_attention.bwd_common import (
    BSHD3,
    CONS_REGS,
    FUSED_BQ,
    LOG2E,
    PROD_REGS,
    ROTATE_MAX_KV,
    SMEM_LIMIT,
    THREADS,
    _cap_slope,
    _capped_p,
    _common_options,
    _fail,
    _load_pair,
    _load_slabs,
    _min_u32,
    _or,
    _smem_fit,
    _store_rows,
    _store_split_partials,
    block_steps,
    check_layouts,
    heavy_first_cta,
    heavy_groups,
    input_box,
    input_spec,
    layout_tag,
    padded,
    size_params,
    softcap_constants,
)
from pyptx_kernels.flash_attention.fwd_kernel import _feature_tag as feature_tag
from pyptx_kernels.flash_attention.masks import query_blocks, right_reach, row_limit

FUSED_BKV = 128     # kv rows per CTA of the fused kernel (64 of dK/dV per consumer warpgroup)
# named barriers of the fused kernel's consumers: both warpgroups (256 threads) for the
# shared P / dS tiles, one warpgroup (128) for its dQ slabs in the any-order mode
FUSED_WRITTEN, FUSED_P_FREE, FUSED_SLABS = 1, 4, 2
# fused_pingpong: one-way signals between the warpgroups (bar.arrive by one, bar.sync by the
# other, 256 threads), id + w for warpgroup w's: its half of P / dS written; its reads of the
# other warpgroup's half of the last P / dS done
PP_P_WRITTEN, PP_DS_WRITTEN, PP_P_READ, PP_DS_READ = 5, 7, 9, 11


def _store_pairs(row_addr, xr16, acc, dt, dst=None):
    """Pack ``acc`` (a 64 x 128 fragment: q rows x kv columns) into 16-bit pairs and store them
    into a 128-byte swizzled tile of two 64-column slabs (row = q, kv contiguous): the MN-major
    A of ``P^T dO`` / ``dS^T Q``. ``row_addr``: this thread's row (and pair) in slab 0;
    ``xr16``: its swizzle phase. ``dst``: keep the packed pairs there (an A operand)."""
    slab = FUSED_BQ * 128
    for m in range(len(acc) // 2):
        dr, dc = Accumulator.coord(2 * m)
        word = dst[m] if dst is not None else reg.scalar(b32)
        ptx.inst(f"cvt.rn.{dt.name}x2.f32")(word, acc[2 * m + 1], acc[2 * m])
        at = row_addr + (xr16 ^ ((dc % 64) // 8 << 4))
        ptx.inst.st.shared.b32(ptx.addr(at, dc // 64 * slab + dr * 128), word)


def _zero_rows(row_addr, quarter, slabs, slab_bytes):
    """Zero this thread's quarter (``quarter`` 0..3, 32 bytes) of its rows ``row_addr`` and
    ``+ 8 * 128`` in every slab of a 128-byte-row tile (a warpgroup zeroes its 64 rows)."""
    zero = reg.scalar(b32, init=0)
    for sl in range(slabs):
        for r in (0, 8):
            for h in (0, 16):
                at = sl * slab_bytes + r * 128 + h
                ptx.inst.st.shared.v4.b32(ptx.addr(row_addr + quarter * 32, at), [zero] * 4)


def _mma_steps(acc, a_tile, a, b_tile, b, n, dt, overwrite=False, commit=True, steps=None):
    """Every k-step (or those of ``steps``) of ``acc (+)= A B`` with both operands in shared
    memory (descriptors ``a`` / ``b`` of k-step 0), then its commit group unless
    ``commit=False``."""
    for kk in range(a_tile.k_steps) if steps is None else steps:
        ptx.wgmma.mma_async(acc.regs, a_tile.advance(a, kk), b_tile.advance(b, kk), n=n,
                            dtype_ab=dt.name, scale_d=0 if overwrite and kk == 0 else 1,
                            trans_a=a_tile.trans, trans_b=b_tile.trans)
    if commit:
        ptx.wgmma.commit_group()


def _stage_dq(acc, dq_row, dq_x, scale):
    """``scale * acc`` (a 64 x 64 f32 dQ fragment) into two 128-byte swizzled 32-column f32
    slabs (``SLAB_BYTES`` apart): the source of the bulk tile stores / reductions."""
    for i, dr, dc in acc.pairs():
        v0 = acc[i] * float(scale)
        v1 = acc[i + 1] * float(scale)
        q = dc % 32 * 4 // 16
        at = dq_row + (dq_x ^ (q << 4))
        ptx.inst.st.shared.v2.f32(ptx.addr(at, dc // 32 * SLAB_BYTES + dr * 128), [v0, v1])


class _FusedPlan:
    """What ``build_fused``'s kernel knows at trace time: its tiles, the shared-memory layout
    and the order in which the kv blocks (CTAs) add into a q block's dQ."""

    def __init__(self, S, Hq, Hkv, D, Sk, dt, causal, ordered, stages, split=1,
                 window=(-1, -1), heavy=False):
        self.S, self.Hq, self.D, self.Sk, self.dt = S, Hq, D, Sk, dt
        self.heavy = heavy
        self.window, self.windowed = window, window != (-1, -1)
        self.G = Hq // Hkv
        self.causal, self.ordered = causal, ordered
        self.kv_tile = OperandTile(FUSED_BKV, D, dt, major="K")      # K, V: B of S and dP
        self.kv_mn = OperandTile(D, FUSED_BKV, dt, major="MN")       # K: B of dQ = dS K
        self.q_tile = OperandTile(FUSED_BQ, D, dt, major="K")        # Q, dO: A of S and dP
        self.q_mn = OperandTile(D, FUSED_BQ, dt, major="MN")         # Q, dO: B of dK and dV
        self.pt_tile = OperandTile(FUSED_BKV, FUSED_BQ, dt, major="MN")  # P^T, dS^T: A
        self.p_at = 2 * self.kv_tile.nbytes
        self.ds_at = self.p_at + self.pt_tile.nbytes
        self.dq_at = self.ds_at + self.pt_tile.nbytes
        self.ring_at = self.dq_at + 2 * (D // 32) * SLAB_BYTES
        self.stage_bytes = 2 * self.q_tile.nbytes
        self.stages = _smem_fit(self.ring_at, self.stage_bytes) if stages is None else stages
        self.smem = self.ring_at + self.stages * self.stage_bytes + 1024
        self.num_q = -(-S // FUSED_BQ)
        self.num_kv = -(-Sk // FUSED_BKV)
        self.nq_sem = -(-S // 64)                   # counters per head (build_prep's SEM)
        self.kv_last = self.num_kv - 1
        self.sizes = dict(seqlen_q=S, seqlen_k=Sk, stats_rows=padded(S), q_blocks=self.num_q,
                          kv_blocks=self.num_kv, sem_blocks=self.nq_sem, kv_last=self.kv_last,
                          last_key=Sk - 1)
        # full attention, ordered: kv block j walks q blocks from j on, wrapping, so a q
        # block's adds come one step apart (kv blocks i, i - 1, ..., wrapping)
        self.rotate = (ordered and not causal and self.num_q == self.num_kv
                       and self.num_kv * split <= ROTATE_MAX_KV    # the head's CTAs resident
                       and not self.windowed)
        # predecessor: kv block kb + 1 (a window: descending, as causal); heavy: kb - 1
        self.reverse = ordered and (causal or self.rotate or self.windowed) and not heavy

    def bound(self, z):
        """This plan reading its sizes from the kernel parameters ``z`` (``size_params`` of
        ``sizes``, declared at the kernel's start): ``S``, ``Sk`` s32 registers, the block
        counts u32 ones; its trace-time choices (``rotate``, ``reverse``) stay."""
        run = copy.copy(self)
        run.S, run.Sk = reg.from_(z.seqlen_q, s32), reg.from_(z.seqlen_k, s32)
        run.num_q, run.num_kv, run.nq_sem, run.kv_last = (z.q_blocks, z.kv_blocks,
                                                          z.sem_blocks, z.kv_last)
        return run

    def q_range(self, k0):
        """A window's ``KeyBlocks`` of the q blocks kv block ``k0`` reaches
        (``masks.query_blocks``), as u32 registers or ints."""
        return tuple(x if isinstance(x, int) else reg.from_(x, u32) for x in query_blocks(
            reg.from_(k0, s32), self.Sk, self.S, FUSED_BQ, self.causal, FUSED_BKV,
            self.window))

    def q_block(self, step, kb):
        """The q block of step ``step`` of kv block ``kb`` (``heavy``: from the last q block
        down to kv block ``kb``'s first, ``kb``)."""
        if self.heavy:
            return self.num_q + kb - 1 - step
        if not self.rotate:
            return step
        r = step + kb
        wrapped = reg.scalar(u32)
        ptx.inst.selp.u32(wrapped, r - self.num_q, r, r >= self.num_q)
        return wrapped

    def dq_rank(self, qb, kb):
        """The place of kv block ``kb`` among those adding into q block ``qb``."""
        if self.heavy:      # kv blocks 0, 1, ..., all at the q block at the same step
            return kb
        right = right_reach(self.causal, self.window)
        if self.windowed and not self.causal:   # descending from the last kv block reaching qb
            last = reg.scalar(u32, init=self.kv_last)
            if right is None:
                return last - kb
            return _min_u32(reg.from_((qb * FUSED_BQ + (FUSED_BQ - 1 + right)) // FUSED_BKV,
                                      u32), last) - kb
        if self.causal:     # kv blocks min(qb, last), ..., 0 (a causal window's too)
            return _min_u32(qb, self.kv_last) - kb
        if self.rotate:     # kv block kb reaches q block qb at step (qb - kb) % num_q
            step = qb + self.num_q - kb
            wrapped = reg.scalar(u32)
            ptx.inst.selp.u32(wrapped, step - self.num_q, step, step >= self.num_q)
            return wrapped
        return kb           # ascending kv blocks (a wavefront)

    def dq_writer(self, DQACC, SEM, base, kb, hk, b, qb0, dq_full, dq_empty, heads=None,
                  q_end=None):
        """The ordered mode's writer thread: per block, in the consumers' order, wait for kv
        block ``kb``'s turn at the q block's counter and for both warpgroups' dQ slabs, add
        them (the first rank stores), free the slabs once read, and once the adds are
        complete in global memory, count them (a release add). ``heads=(first, n)``: only
        the ``n`` q heads from ``first`` (``kv_split``)."""
        dq_map = ptx.tma.tensormap_ptr(DQACC.tmap)
        (psem,) = ptx.global_ptrs(SEM)
        now = reg.scalar(u32)
        phase = reg.scalar(u32, init=0)
        for hq, step in block_steps(
                self.G if heads is None else heads[1], qb0,
                self.num_q if q_end is None else q_end,
                lambda g: hk * self.G + g if heads is None else heads[0] + g, self.heavy):
            qb = self.q_block(step, kb)
            rank = self.dq_rank(qb, kb)
            cell = reg.from_(((b * self.Hq + hq) * self.nq_sem + qb) * 2, u64) * 4 + psem

            def not_my_turn(cell=cell, rank=rank):
                ptx.inst("ld.acquire.gpu.global.u32")(now, ptx.addr(cell))
                return now != rank

            with ptx.while_(not_my_turn):
                pass
            ptx.fence_proxy_async("global")
            first = rank == 0
            for w in (0, 1):
                ptx.mbarrier.wait(dq_full.at(w), phase)
                for j in range(self.D // 32):
                    src = base + (self.dq_at + (w * self.D // 32 + j) * SLAB_BYTES)
                    at = (32 * j, hq, qb * FUSED_BQ + 64 * w, b)
                    ptx.tma.store_tile(dq_map, at, src, pred=first)
                    ptx.tma.reduce_tile(dq_map, at, src, pred=~first)
            ptx.tma.commit_group()
            ptx.tma.wait_group(0, read=True)
            for w in (0, 1):
                ptx.mbarrier.arrive(dq_empty.at(w))
            ptx.tma.wait_group(0)
            ptx.fence_proxy_async("global")
            ptx.inst("red.release.gpu.global.add.u32")(ptx.addr(cell), 1)
            ptx.inst.xor.b32(phase, phase, 1)


def build_fused(B, S, Hq, Hkv, D, *, Sk=None, dtype="bf16", causal=False, scale=None,
                stages=None, ordered=False, defer=False, pingpong=0, kv_split=1,
                heavy_first=False, window=(-1, -1), softcap=0.0, layouts=BSHD3):
    """One-kernel backward: ``(Q, K, V, DO, STATS, DQACC) -> (DK, DV)``, adding every
    block's ``scale * dS K`` into the f32 ``DQACC`` ``(B, S, Hq, D)`` in place (STATS and
    a zeroed DQACC from ``build_prep``; ``build_convert`` makes dQ of it). ``layouts``: the
    memory orders of Q, K, V (``"bshd"``, or ``"bhsd"``: ``(B, H, S, D)``, read in place
    through their tensor maps); every other tensor is ``(B, S, H, D)``.

    One CTA per batch, kv head and 128 kv rows; the consumer warpgroups take 64 rows of each
    128-row q block (of every q head of the group) and compute ``S = Q K^T`` and
    ``dP = dO V^T`` (so the softmax stats are per row: two per thread), P and dS into shared
    memory (q rows x kv, kv contiguous), then ``dV += P^T dO`` and ``dK += dS^T Q`` from
    shared memory (each warpgroup its 64 kv rows over all 128 q rows) and ``dQ = dS K``
    with dS from registers: five products per block pair. ``ordered``: also ``(..., DQACC,
    SEM)`` (``build_prep(counters=True)``), and the dQ tiles are added in a fixed order by a
    writer thread (as ``build_dkdv(dq_ordered=True)``): the same bits at every run.
    ``defer``: a block's dK product is issued after the next block's S and dP, so that
    the tensor cores have it and dP to run during the next block's exponentials (otherwise
    it runs beside the next S and dP, and only dP is left for the exponentials).
    ``pingpong`` (1 or 2): warpgroup 1 runs about half a block behind warpgroup 0 (one-way
    barriers instead of the shared ones; see ``pingpong_loop``), the leader multiplying the
    follower's half of a block's P and dS right after the next block's S and dP (1) or
    after its own half of dV (2).
    ``kv_split`` (1, 2, 4 or 8, dividing ``Hq / Hkv``): a kv block's CTAs, a cluster along x,
    each taking ``G / kv_split`` of the group's q heads, their dK/dV partials summed in rank
    order through distributed shared memory (``_store_split_partials``; as
    ``build_dkdv(kv_split=)``).
    ``window``, ``softcap``: the forward's: a kv block visits only the q blocks its window
    reaches (``masks.query_blocks``; ordered: descending kv blocks, ranks from the last kv
    block reaching the q block), straddling blocks masked (``masks.row_limit``); dS through
    the cap's derivative (its ``tanh`` recovered from P once P is stored).
    ``heavy_first`` (causal, no window; as ``build_dkdv(heavy_first=)``): the grid runs
    groups of kv heads (``heavy_groups``), in each kv block 0 of every head first, then block
    1, ... (the longest causal CTAs first), where it otherwise runs a head's blocks together;
    each CTA walks its q blocks from the last down, each q step over every q head of its
    share, and ordered, a q block's adds come in ascending kv block order: all the kv blocks
    reach it at the same step, a predecessor launched earlier.
    Head dim 64 only (at D=128 the five accumulators do not fit 240 registers)."""
    Sk, dt, scale, _, _, G, Sp = _common_options(B, S, Hq, Hkv, D, Sk, dtype, scale, False, False)
    if D != 64:
        raise _fail(f"build_fused: head dim D must be 64 (at D=128 its five accumulators "
                    f"need more than {CONS_REGS} registers per thread), got {D}")
    if pingpong not in (0, 1, 2) or (pingpong and defer):
        raise _fail(f"build_fused: pingpong must be 0, 1 or 2 and not with defer, got "
                    f"pingpong={pingpong!r}, defer={defer!r}")
    split = kv_split
    if split not in (1, 2, 4, 8) or isinstance(split, bool) or G % split:
        raise _fail(f"build_fused: kv_split must be 1, 2, 4 or 8 and divide the group size "
                    f"Hq / Hkv = {G}, got kv_split={kv_split!r}")
    Gs = G // split
    window = tuple(window)
    heavy_first = bool(heavy_first)
    if heavy_first and (not causal or window != (-1, -1)):
        raise _fail(f"build_fused: heavy_first is the causal grid's order (no window), got "
                    f"causal={causal!r}, window={window!r}")
    cap = softcap_constants(scale, softcap)
    fixed = _FusedPlan(S, Hq, Hkv, D, Sk, dt, causal, bool(ordered), stages, split, window,
                       heavy_first)
    if heavy_first:     # the launch order's mapping: kv heads, heads per group
        fixed.sizes["heavy_base"], fixed.sizes["heavy_extra"] = heavy_groups(
            B * Hkv, fixed.num_kv * split)
    if fixed.smem > SMEM_LIMIT:
        raise _fail(f"build_fused: {fixed.stages} stages need {fixed.smem} bytes of shared memory "
                    f"(at most {SMEM_LIMIT})")
    c1 = scale * LOG2E
    kv_tile, q_tile, q_mn, kv_mn, pt_tile = (fixed.kv_tile, fixed.q_tile, fixed.q_mn, fixed.kv_mn,
                                             fixed.pt_tile)
    stage_bytes = fixed.stage_bytes
    qspec = Tile(B, S, Hq, D, dt)
    kspec = Tile(B, Sk, Hkv, D, dt)
    layouts = check_layouts("build_fused", layouts)
    q_in, k_in, v_in = (input_spec(B, L, H, D, dt, lay) for L, H, lay in
                        ((S, Hq, layouts[0]), (Sk, Hkv, layouts[1]), (Sk, Hkv, layouts[2])))

    def fused_kernel(Q, K, V, DO, STATS, DQACC, SEM, DK, DV):
        z = size_params(fixed.sizes)
        plan, Sk, Sp = fixed.bound(z), z.seqlen_k, z.stats_rows
        base = ring_base("smem")
        pipe = Pipeline(plan.stages, consumer_arrivals=2)
        head_bar = BarrierArray(1, name="head_bar")
        tid, wg = thread_ids()
        if heavy_first:
            kb, hk, b = heavy_first_cta(split, plan.num_kv, Hkv, z.heavy_base, z.heavy_extra)
        else:
            kb = reg.from_(ptx.special.ctaid.x(), u32)
            if split > 1:
                kb = kb // split
            if plan.reverse:    # launched last kv block first: a block's turn follows kb + 1's
                kb = plan.kv_last - kb
            hk = reg.from_(ptx.special.ctaid.y(), u32)
            b = reg.from_(ptx.special.ctaid.z(), u32)
        k0 = kb * FUSED_BKV
        # kv_split: this CTA's first q head (rank r of the cluster: the group's r-th share)
        qh0 = hk * G + ptx.cluster.ctarank() * Gs if split > 1 else None

        def blocks(first, end):
            """This CTA's blocks, ``(q head, step)`` over its q heads of the group and the
            steps ``first..end`` (``block_steps``)."""
            return block_steps(G if split == 1 else Gs, first, end,
                               lambda i: hk * G + i if split == 1 else qh0 + i, heavy_first)
        pipe.init(pred=tid == 0)
        head_bar.init(1, pred=tid == 0)
        if ordered:     # the consumers' dQ slabs <-> the writer thread, per warpgroup
            dq_full = BarrierArray(2, name="dq_full")
            dq_empty = BarrierArray(2, name="dq_empty")
            dq_full.init(128, pred=tid == 0)
            dq_empty.init(1, pred=tid == 0)
        ptx.bar_sync(0)
        qb0 = k0 // FUSED_BQ if causal else 0       # causal: q blocks above the diagonal skipped
        q_end = plan.num_q

        def window_range():     # formed where each role needs it (producer: 24 registers)
            first, _, _, end = plan.q_range(k0)
            return first, end
        if plan.windowed:
            qb0, q_end = window_range()
        roles = Roles(wg, PROD_REGS)
        # ------------------------------------------------------------ producer
        with ptx.if_(tid == 0):
            hbar = head_bar.at(0)
            ptx.mbarrier.arrive_expect_tx(hbar, 2 * kv_tile.nbytes)
            _load_pair(base, K, V, kv_tile.nbytes, 1, hk, k0, b, FUSED_BKV, hbar, layouts[1:])
            q_map = ptx.tma.tensormap_ptr(Q.tmap)
            do_map = ptx.tma.tensormap_ptr(DO.tmap)
            st = pipe.producer_state()
            for hq, step in blocks(qb0, q_end):
                qb = plan.q_block(step, kb)
                pipe.acquire(st)
                bar = pipe.arm(st, stage_bytes)
                sb = st.stage * stage_bytes + (base + plan.ring_at)
                _load_slabs(sb, q_map, 1, hq, qb * FUSED_BQ, b, FUSED_BQ, bar, layouts[0])
                _load_slabs(sb + q_tile.nbytes, do_map, 1, hq, qb * FUSED_BQ, b, FUSED_BQ, bar)
                st.advance()
        if ordered:
            with ptx.if_(tid == 32):
                if plan.windowed:
                    qb0, q_end = window_range()
                plan.dq_writer(DQACC, SEM, base, kb, hk, b, qb0, dq_full, dq_empty,
                               heads=(qh0, Gs) if split > 1 else None,
                               q_end=q_end if plan.windowed else None)
        # ------------------------------------------------------------ consumers
        if split > 1:   # the producer warps exit here: barrier.cluster waits for the
            ptx.ret()   # non-exited threads, the consumers' only
        roles.consumers(CONS_REGS)
        w = wg - 1
        t = tid & 127
        lane = tid & 31
        leader = t == 0
        s_acc = Accumulator(FUSED_BKV)
        dp_acc = Accumulator(FUSED_BKV)
        dv_acc = Accumulator(D)
        dk_acc = Accumulator(D)
        dq_acc = Accumulator(D)
        ds_pack = reg.array(b32, FUSED_BKV // 4)
        row0, col0 = s_acc.thread_origin(t)
        kvrow = k0 + w * 64 + row0                  # this thread's dK/dV rows: kvrow, kvrow + 8
        valid = [kvrow < Sk, kvrow + 8 < Sk]
        dv_acc.zero()
        dk_acc.zero()
        pstats, pdk, pdv = ptx.global_ptrs(STATS, DK, DV)
        k_desc = kv_tile.descriptor(base)
        v_desc = k_desc + (kv_tile.nbytes >> 4)
        kmn_desc = kv_mn.descriptor(base)
        wrow = reg.from_(w * (q_tile.offset(0, 64) >> 4), u64)   # this warpgroup's 64 q rows
        q_desc0 = q_tile.descriptor(base, offset=plan.ring_at) + wrow
        do_desc0 = q_desc0 + (q_tile.nbytes >> 4)
        qmn_desc0 = q_mn.descriptor(base, offset=plan.ring_at)
        domn_desc0 = qmn_desc0 + (q_tile.nbytes >> 4)
        wslab = reg.from_(w * (pt_tile.offset(0, 64) >> 4), u64)  # its 64 kv rows of P^T, dS^T
        pt_desc = pt_tile.descriptor(base, offset=plan.p_at) + wslab
        dst_desc = pt_tile.descriptor(base, offset=plan.ds_at) + wslab
        # this thread's q row in the P / dS tiles (its pair's bytes, swizzle phase row % 8)
        xr16 = (lane >> 2) << 4
        p_row = base + plan.p_at + (w * 64 + row0) * 128 + (lane & 3) * 4
        ds_row = p_row + pt_tile.nbytes
        # its f32 dQ pairs in the warpgroup's two slabs (see build_dkdv's _store_dq)
        dq_buf = base + plan.dq_at + w * (2 * SLAB_BYTES)
        dq_row = dq_buf + row0 * 128 + (lane & 1) * 8
        dq_x = ((lane >> 1) & 1 ^ (lane >> 2)) << 4
        if ordered:
            dq_n = reg.scalar(u32, init=0)
        else:
            dq_map = ptx.tma.tensormap_ptr(DQACC.tmap)
        cons = pipe.consumer_state()
        rel = pipe.consumer_state()
        has_prev = reg.scalar(u32, init=0)
        # defer: the last block's Q (B of its dK); before the first block, a loaded stage
        # against a zeroed dS (a product of zeros: no branch around the wgmma, which would
        # make ptxas inject fences, C7519)
        prev_qmn = reg.scalar(u64, init=qmn_desc0)
        if pingpong:                                # and its dO (B of its dV)
            prev_domn = reg.scalar(u64, init=domn_desc0)
        if defer:
            _zero_rows(ds_row - (lane & 3) * 4, lane & 3, pt_tile.slabs, FUSED_BQ * 128)
            ptx.fence_proxy_async("shared::cta")
            ptx.bar_sync(FUSED_WRITTEN, 256)

        def release_prev():
            with ptx.if_(has_prev != 0):            # the previous block's stage is read
                pipe.release(rel, pred=leader)
                rel.advance()

        def dk_product(qmn, commit=True):
            _mma_steps(dk_acc, pt_tile, dst_desc, q_mn, qmn, D, dt, commit=commit)

        def block_start(step):
            """Wait for the block's stage and issue ``S = Q K^T`` and ``dP = dO V^T``. Returns
            its first row, this thread's first row and the B descriptors of its Q and dO."""
            qb = plan.q_block(step, kb)
            q0 = qb * FUSED_BQ
            qrow = q0 + w * 64 + row0               # this thread's q rows: qrow, qrow + 8
            pipe.wait(cons)
            soff = reg.from_(reg.from_(cons.stage * (stage_bytes >> 4), u32), u64)
            qd, dod = q_desc0 + soff, do_desc0 + soff
            qmn, domn = qmn_desc0 + soff, domn_desc0 + soff
            ptx.wgmma.fence()
            _mma_steps(s_acc, q_tile, qd, kv_tile, k_desc, FUSED_BKV, dt, overwrite=True)
            _mma_steps(dp_acc, q_tile, dod, kv_tile, v_desc, FUSED_BKV, dt, overwrite=True)
            return q0, qrow, qmn, domn

        def row_stats(hq, qrow):
            """``(-lse * log2 e, delta)`` of this thread's two rows (lists of two)."""
            srow = reg.from_((b * Hq + hq) * Sp + qrow, u64) * 8 + pstats
            nl2, delta = [], []
            for r in (0, 8):
                pair = reg.array(f32, 2)
                ptx.inst.ld.global_.nc.v2.f32(pair, ptx.addr(srow, 8 * r))
                nl2.append(-pair[0])
                delta.append(pair[1])
            return nl2, delta

        def softmax(nl2, q0, qrow):
            """``P = exp2(S * c1 - lse2)`` in place, masked."""
            for i in range(len(s_acc)):
                dr = Accumulator.coord(i)[0]
                if cap is None:
                    ptx.inst.fma.rn.f32(s_acc[i], s_acc[i], c1, nl2[dr // 8])
                    ptx.inst.ex2.approx.ftz.f32(s_acc[i], s_acc[i])
                else:
                    _capped_p(s_acc[i], s_acc[i], cap, nl2[dr // 8])
            if plan.windowed:
                _window_mask(s_acc, plan, k0, q0, qrow, col0)
            else:
                _fused_mask(s_acc, causal, Sk, k0, q0, qrow, col0, z.last_key)

        def ds_from_dp(delta, nl2):
            """``dS = P * (dP - delta)`` in place of dP (P stored already: a soft cap's
            derivative multiplied in first)."""
            if cap is not None:
                for i in range(len(s_acc)):
                    _cap_slope(s_acc[i], cap, nl2[Accumulator.coord(i)[0] // 8])
            for i in range(len(dp_acc)):
                dr = Accumulator.coord(i)[0]
                x = dp_acc[i] - delta[dr // 8]
                ptx.inst.mul.f32(dp_acc[i], s_acc[i], x)

        def dq_product():
            """``dQ = dS K`` (its own group), dS from registers."""
            for kk in range(FUSED_BKV // 16):
                ptx.wgmma.mma_async(dq_acc.regs, list(ds_pack)[4 * kk:4 * kk + 4],
                                    kv_mn.advance(kmn_desc, kk), n=D, dtype_ab=dt.name,
                                    scale_d=0 if kk == 0 else 1, trans_b=kv_mn.trans)
            ptx.wgmma.commit_group()

        def hand_over_dq(hq, q0):
            """Stage ``scale * dQ`` in the warpgroup's slabs once they are free, then hand
            them to the writer thread (ordered) or reduce them into DQACC (the leader)."""
            if ordered:                         # the writer has read the slabs
                ptx.mbarrier.wait(dq_empty.at(w), (dq_n & 1) ^ 1)
            else:                               # the last reductions have read them
                with ptx.if_(leader):
                    ptx.tma.wait_group(0, read=True)
                ptx.bar_sync(FUSED_SLABS + w, 128)
            _stage_dq(dq_acc, dq_row, dq_x, scale)
            ptx.fence_proxy_async("shared::cta")
            if ordered:
                ptx.mbarrier.arrive(dq_full.at(w))
                ptx.inst.add.u32(dq_n, dq_n, 1)
            else:
                ptx.bar_sync(FUSED_SLABS + w, 128)
                with ptx.if_(leader):
                    for j in range(D // 32):
                        ptx.tma.reduce_tile(dq_map, (32 * j, hq, q0 + w * 64, b),
                                            dq_buf + j * SLAB_BYTES if j else dq_buf)
                    ptx.tma.commit_group()

        def lockstep_loop():
            """Both warpgroups through every block together (named barriers of 256 threads
            around the shared P and dS)."""
            first, end = window_range() if plan.windowed else (qb0, plan.num_q)
            for hq, step in blocks(first, end):
                q0, qrow, qmn, domn = block_start(step)
                if defer:                           # the last block's dK, under this softmax
                    dk_product(prev_qmn)
                nl2, delta = row_stats(hq, qrow)
                if defer:
                    ptx.wgmma.wait_group(2)         # S done
                else:
                    ptx.wgmma.wait_group(1)         # S (and the previous block's dK) done
                    release_prev()
                softmax(nl2, q0, qrow)
                if defer:   # dP and the last dK done: dS is free once both consumers are here
                    ptx.wgmma.wait_group(0)
                    release_prev()
                ptx.bar_sync(FUSED_P_FREE, 256)     # both warpgroups' dV of the last block done
                _store_pairs(p_row, xr16, s_acc, dt)
                ptx.fence_proxy_async("shared::cta")
                ptx.bar_sync(FUSED_WRITTEN, 256)    # both halves of P written
                ptx.wgmma.fence()
                _mma_steps(dv_acc, pt_tile, pt_desc, q_mn, domn, D, dt)
                if not defer:
                    ptx.wgmma.wait_group(1)         # dP done
                ds_from_dp(delta, nl2)
                _store_pairs(ds_row, xr16, dp_acc, dt, dst=ds_pack)
                ptx.fence_proxy_async("shared::cta")
                ptx.bar_sync(FUSED_WRITTEN, 256)    # both halves of dS written
                ptx.wgmma.fence()
                dq_product()
                if defer:
                    ptx.wgmma.wait_group(0)         # dV and dQ done
                    ptx.inst.mov.b64(prev_qmn, qmn)
                else:
                    dk_product(qmn)
                    ptx.wgmma.wait_group(1)         # dV and dQ done, dK may run on
                hand_over_dq(hq, q0)
                ptx.inst.mov.u32(has_prev, 1)
                cons.advance()
            if defer:                                   # the last block's dK
                with ptx.if_(has_prev != 0):
                    ptx.wgmma.fence()
                    dk_product(prev_qmn)
                    ptx.wgmma.wait_group(0)
            ptx.wgmma.wait_group(0)
            with ptx.if_(has_prev != 0):
                pipe.release(rel, pred=leader)

        def pingpong_loop(lead):
            """Warpgroup 0 (``lead``) runs about half a block ahead of warpgroup 1, so that
            one's exponentials run beside the other's products. Each multiplies its own half
            of P / dS (its q rows) into dV / dK as soon as it is written; warpgroup 1 finds
            the leader's half written and multiplies all 128 q rows at once, the leader the
            follower's half of a block during the next block (``other_halves``). One-way
            named barriers (``PP_*``) hand the halves over and free them; the counts of
            arrivals and waits match per barrier, and each one's next arrival waits for
            the previous round (so no round sees the same warpgroup twice)."""
            me = 0 if lead else 1
            own = range(4 * me, 4 * me + 4)         # the k-steps (16 q rows) of its rows
            other = range(4 - 4 * me, 8 - 4 * me)

            def other_halves():
                """The last block's dV and dK over the follower's q rows (one group)."""
                ptx.bar_sync(PP_P_WRITTEN + 1, 256)
                _mma_steps(dv_acc, pt_tile, pt_desc, q_mn, prev_domn, D, dt, commit=False,
                           steps=other)
                ptx.bar_sync(PP_DS_WRITTEN + 1, 256)
                _mma_steps(dk_acc, pt_tile, dst_desc, q_mn, prev_qmn, D, dt, steps=other)

            def hand_over(row, data, written, read, pack=None):
                """Store this warpgroup's half of P or dS once the other warpgroup has read
                its last one, and signal it written (after the warpgroup's own barrier)."""
                if lead:
                    with ptx.if_(has_prev != 0):
                        ptx.bar_sync(read + 1, 256)
                else:   # the leader's first read multiplies the zeros written below
                    ptx.bar_sync(read, 256)
                _store_pairs(row, xr16, data, dt, dst=pack)
                ptx.fence_proxy_async("shared::cta")
                ptx.bar_sync(FUSED_SLABS + w, 128)
                ptx.bar_arrive(written + me, 256)
                if not lead:
                    ptx.bar_sync(written, 256)      # the leader's half

            if not lead:    # "block -1": zero halves for the leader's first other_halves
                for row in (p_row, ds_row):
                    _zero_rows(row - (lane & 3) * 4, lane & 3, pt_tile.slabs, FUSED_BQ * 128)
                ptx.fence_proxy_async("shared::cta")
                ptx.bar_sync(FUSED_SLABS + w, 128)
                ptx.bar_arrive(PP_P_WRITTEN + 1, 256)
                ptx.bar_arrive(PP_DS_WRITTEN + 1, 256)
            early = lead and pingpong == 1          # other halves right after S and dP
            first, end = window_range() if plan.windowed else (qb0, plan.num_q)
            for hq, step in blocks(first, end):
                q0, qrow, qmn, domn = block_start(step)
                if early:
                    other_halves()
                nl2, delta = row_stats(hq, qrow)
                ptx.wgmma.wait_group(2 if early else 1)     # S done
                if not lead:                    # and the last dK: the leader's dS read
                    with ptx.if_(has_prev != 0):
                        ptx.bar_arrive(PP_DS_READ + 1, 256)
                    release_prev()
                softmax(nl2, q0, qrow)
                hand_over(p_row, s_acc, PP_P_WRITTEN, PP_P_READ)
                ptx.wgmma.fence()
                _mma_steps(dv_acc, pt_tile, pt_desc, q_mn, domn, D, dt,
                           steps=own if lead else None)
                if lead and not early:
                    other_halves()
                ptx.wgmma.wait_group(2 if lead else 1)      # dP done
                ds_from_dp(delta, nl2)
                hand_over(ds_row, dp_acc, PP_DS_WRITTEN, PP_DS_READ, pack=ds_pack)
                ptx.wgmma.fence()
                dq_product()
                _mma_steps(dk_acc, pt_tile, dst_desc, q_mn, qmn, D, dt,
                           steps=own if lead else None)
                ptx.wgmma.wait_group(1)     # dQ done, and all but this block's dK
                if lead:                    # the follower's last halves read
                    ptx.bar_arrive(PP_P_READ, 256)
                    ptx.bar_arrive(PP_DS_READ, 256)
                    release_prev()
                    ptx.inst.mov.b64(prev_qmn, qmn)
                    ptx.inst.mov.b64(prev_domn, domn)
                else:                       # the leader's P read (by dV)
                    ptx.bar_arrive(PP_P_READ + 1, 256)
                hand_over_dq(hq, q0)
                ptx.inst.mov.u32(has_prev, 1)
                cons.advance()
            ptx.wgmma.wait_group(0)
            if lead:                            # the follower's halves of the last block
                ptx.bar_sync(PP_P_WRITTEN + 1, 256)
                ptx.bar_sync(PP_DS_WRITTEN + 1, 256)
                with ptx.if_(has_prev != 0):
                    ptx.wgmma.fence()
                    _mma_steps(dv_acc, pt_tile, pt_desc, q_mn, prev_domn, D, dt, commit=False,
                               steps=other)
                    _mma_steps(dk_acc, pt_tile, dst_desc, q_mn, prev_qmn, D, dt, steps=other)
                    ptx.wgmma.wait_group(0)
                    ptx.bar_sync(PP_P_READ + 1, 256)
                    ptx.bar_sync(PP_DS_READ + 1, 256)
            else:
                with ptx.if_(has_prev != 0):
                    ptx.bar_arrive(PP_DS_READ + 1, 256)
            with ptx.if_(has_prev != 0):
                pipe.release(rel, pred=leader)

        ptx.mbarrier.wait(head_bar.at(0), 0)
        if pingpong:
            with ptx.if_(w == 0):
                pingpong_loop(True)
            with ptx.else_():
                pingpong_loop(False)
        else:
            lockstep_loop()
        if not ordered:
            with ptx.if_(leader):
                ptx.tma.wait_group(0, read=True)
        if split > 1:   # dK's partials over the head tile, dV's over the ring
            def store(part, col, dv):
                _store_rows(part, pdv if dv else pdk, kvrow, valid, Hkv, D, hk, b, Sk,
                            col0 if isinstance(col, int) and not col else col0 + col,
                            1.0 if dv else scale, dt)
            _store_split_partials(dk_acc, dv_acc, base, plan.ring_at, split, store)
        else:
            _store_rows(dk_acc, pdk, kvrow, valid, Hkv, D, hk, b, Sk, col0, scale, dt)
            _store_rows(dv_acc, pdv, kvrow, valid, Hkv, D, hk, b, Sk, col0, 1.0, dt)
        roles.end()
        ptx.ret()

    name = (f"attn_bwd_fused_{dt.name}_d{D}_h{Hq}x{Hkv}{feature_tag(causal, window, softcap)}"
            f"{'_ordered' if ordered else ''}{'_heavy' if heavy_first else ''}"
            f"{'_defer' if defer else ''}"
            f"{f'_pp{pingpong}' if pingpong else ''}{f'_split{split}' if split > 1 else ''}"
            f"{layout_tag(layouts)}")
    ins = (q_in, k_in, v_in, qspec, Tile(B, Hq, Sp, 2, f32), Tile(B, S, Hq, D, f32))
    if ordered:
        ins += (Tile(B, Hq, fixed.nq_sem, 2, s32),)
        fn = fused_kernel
    else:
        def fn(Q, K, V, DO, STATS, DQACC, DK, DV):
            fused_kernel(Q, K, V, DO, STATS, DQACC, None, DK, DV)
    fn.__name__ = "fused_kernel"
    box_q = {"box": (1, FUSED_BQ, 1, 64), "swizzle": "128B"}
    tma = {"Q": input_box(FUSED_BQ, layouts[0]), "DO": box_q,
           "K": input_box(FUSED_BKV, layouts[1]), "V": input_box(FUSED_BKV, layouts[2]),
           "DQACC": {"box": (1, 64, 1, 32), "swizzle": "128B"}}
    k = kernel(in_specs=ins, out_specs=(kspec, kspec),
               grid=(fixed.num_kv * split, Hkv, B), block=(THREADS, 1, 1), smem=fixed.smem,
               maxnreg=168, tma=tma, name=name, cluster=(split, 1, 1))(fn)
    family = ("attn_bwd_fused", dt.name, Hq, Hkv, causal, scale, fixed.stages, bool(ordered),
              defer, pingpong, split, window, softcap, fixed.rotate, layouts) + (
                  ("heavy_first",) if heavy_first else ())
    return _family.specialized(k, family, fixed.sizes)


def _window_mask(s_acc, plan, k0, q0, qrow, col0):
    """A window's ``P = 0`` outside each row's ``masks.row_limit`` (keys ``low .. lim - 1``,
    ``lim <= Sk``), only in the q blocks straddling an edge (outside ``[lo, hi)``)."""
    _, lo, hi, _ = plan.q_range(k0)
    need = _or(q0 < reg.from_(lo * FUSED_BQ, u32), q0 >= reg.from_(hi * FUSED_BQ, u32))
    with ptx.if_(need):
        kv0 = reg.from_(k0 + col0, s32)
        bounds = []
        for r in (0, 8):        # column offset c allowed iff first <= c < end
            low, lim = row_limit(reg.from_(qrow + r, s32), plan.Sk, plan.causal, plan.window)
            end = reg.scalar(s32, init=lim) - kv0 if isinstance(lim, int) else lim - kv0
            bounds.append((None if low is None else low - kv0, end))
        for i in range(len(s_acc)):
            dr, dc = Accumulator.coord(i)
            first, end = bounds[dr // 8]
            ptx.inst.selp.f32(s_acc[i], s_acc[i], 0.0, end > dc)
            if first is not None:
                ptx.inst.selp.f32(s_acc[i], s_acc[i], 0.0, first <= dc)


def _fused_mask(s_acc, causal, Sk, k0, q0, qrow, col0, last_key):
    """``P = 0`` where the kv column is past ``Sk`` (``last_key = Sk - 1``; u32 registers)
    or, causal, above the diagonal (kv > q); only in the blocks that have such columns (the
    last kv block, the diagonal blocks)."""
    need = k0 + FUSED_BKV > Sk
    if causal:
        need = _or(need, q0 < k0 + (FUSED_BKV - 1))
    with ptx.if_(need):
        kv0 = reg.from_(k0 + col0, s32)
        room = []
        for r in (0, 8):                    # column offset c allowed iff c <= room
            if causal:
                lim = reg.from_(_min_u32(qrow + r, reg.scalar(u32, init=last_key)), s32)
            else:
                lim = reg.from_(last_key, s32)
            room.append(lim - kv0)
        for i in range(len(s_acc)):
            dr, dc = Accumulator.coord(i)
            ptx.inst.selp.f32(s_acc[i], s_acc[i], 0.0, room[dr // 8] >= dc)
