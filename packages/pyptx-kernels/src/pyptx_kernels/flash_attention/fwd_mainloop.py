"""The forward's main loop: the shared memory rings, the producer warpgroup's bulk tensor
copies, and the consumer warpgroups' ``S = Q K^T``, softmax, ``O += P V`` per key block.

* The producer (one thread) copies a tile's Q block once, then the K and V blocks of
  ``BN`` keys into two ``stages``-deep rings (``pyptx.pipeline.Pipeline``); persistent, it
  waits for the consumers to free Q before loading the next tile's.
* Each consumer warpgroup (64 query rows) runs the schedule of its plan: ``simple`` waits
  for each GEMM; ``overlap`` issues block j's ``Q K^T`` together with block j-1's ``P V``;
  ``pingpong`` adds turns on named barriers so the warpgroups take turns issuing GEMMs.
  P is read by ``P V`` from registers (``fwd_softmax``); K is a K-major operand, V an
  MN-major one.
"""

from __future__ import annotations

from contextlib import nullcontext

from pyptx import ptx, reg
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.pipeline import BarrierArray, Pipeline
from pyptx.types import b32, s32, u32, u64
from pyptx.warpspec import ring_base
from pyptx_kernels.flash_attention.fwd_config import _fail
from pyptx_kernels.flash_attention.fwd_softmax import OnlineSoftmax
from pyptx_kernels.flash_attention.masks import _max, mask_scores, row_limit


def _when_before(first, end):
    """``ptx.if_(first < end)`` (some key block to visit); no branch for Python ints."""
    if isinstance(first, int) and isinstance(end, int):
        if end <= first:
            raise _fail(f"flash attention: no key blocks to visit ({first}..{end})")
        return nullcontext()
    return ptx.if_(first < end) if isinstance(end, int) else ptx.if_(end > first)


class SharedRings:
    """The CTA's shared memory and its barriers, initialised where created: the Q block, the
    K and V rings, the O staging block (Q's place unless persistent), ``q_bar`` ([0]: Q
    landed, [1]: Q free again) and the K and V pipelines."""

    def __init__(self, *, bm, BN, D, dt, stages, wgs, persistent, tid):
        self.q_tile = OperandTile(bm, D, dt, major="K", swizzle=128)
        self.k_tile = OperandTile(BN, D, dt, major="K", swizzle=128)
        self.v_tile = OperandTile(D, BN, dt, major="MN", swizzle=128)
        self.kv_bytes = self.k_tile.nbytes
        self.q_bytes = self.q_tile.nbytes
        base = ring_base("smem")
        self.q_base = base
        self.k_base = base + self.q_bytes
        self.v_base = self.k_base + stages * self.kv_bytes
        self.o_base = self.v_base + stages * self.kv_bytes if persistent else self.q_base
        self.q_bar = BarrierArray(2, name="q_bar")
        self.kpipe = Pipeline(stages, consumer_arrivals=wgs)
        self.vpipe = Pipeline(stages, consumer_arrivals=wgs)
        with ptx.if_(tid == 0):
            ptx.mbarrier.init(self.q_bar.at(0), 1)
            ptx.mbarrier.init(self.q_bar.at(1), wgs)
        self.kpipe.init(pred=tid == 0)
        self.vpipe.init(pred=tid == 0)
        ptx.bar_sync(0)


def produce(sm, sched, Q, K, V, *, BN, D, varlen, persistent, tid, layouts=("bshd",) * 3):
    """The producer thread: per tile of ``sched`` the Q block, then every K and V block.
    ``layouts``: the memory order of q, k, v (dense: ``"bshd"`` or ``"bhsd"``)."""
    slabs = D // 64

    def tma_coords(i, row, head, b, layout="bshd"):
        if varlen:
            return (i * 64, head, row)
        if layout == "bhsd":
            return (i * 64, row, head, b)
        return (i * 64, head, row, b)

    with ptx.if_(tid == 0):
        qmap = ptx.tma.tensormap_ptr(Q.tmap)
        kmap = ptx.tma.tensormap_ptr(K.tmap)
        vmap = ptx.tma.tensormap_ptr(V.tmap)
        kst = sm.kpipe.producer_state()
        vst = sm.vpipe.producer_state()
        q_free = reg.scalar(u32, init=1)          # a fresh barrier completes parity 1 at once
        for x in sched.tiles():
            if persistent:
                ptx.mbarrier.wait(sm.q_bar.at(1), q_free)
                ptx.inst.xor.b32(q_free, q_free, 1)
            qrow = x["q_start"] + x["m0"] if varlen else x["m0"]
            ptx.mbarrier.arrive_expect_tx(sm.q_bar.at(0), sm.q_bytes)
            for i in range(slabs):
                ptx.tma.load_tile(sm.q_base + i * sm.q_tile.slab_bytes, qmap,
                                  tma_coords(i, qrow, x["h"], x["b"], layouts[0]),
                                  sm.q_bar.at(0))
            first, _, _, end = x["blocks"]
            for j in ptx.loop(first, end, type=s32):
                n0 = j * BN
                krow = x["k_start"] + n0 if varlen else n0
                for pipe, st, tmap, buf, lay in ((sm.kpipe, kst, kmap, sm.k_base, layouts[1]),
                                                 (sm.vpipe, vst, vmap, sm.v_base, layouts[2])):
                    pipe.acquire(st)
                    bar = pipe.arm(st, sm.kv_bytes)
                    dst = buf + st.stage * sm.kv_bytes
                    for i in range(slabs):
                        ptx.tma.load_tile(dst + i * sm.k_tile.slab_bytes if i else dst, tmap,
                                          tma_coords(i, krow, x["hk"], x["b"], lay), bar)
                    st.advance()


class ConsumerMainloop:
    """One consumer warpgroup's state (accumulators, descriptors, pipeline states, named
    barriers: the epilogues' ``1..wgs``, ``bar_id`` this one's; the ping-pong turns past
    them) and its per-tile loop over the key blocks (``run``)."""

    def __init__(self, sm, *, tid, wg, wgs, BN, D, dt, sl2, schedule, causal, persistent,
                 pin_overlap, rescale_threshold, window=(-1, -1), cap=None):
        self.sm, self.wgs, self.BN, self.D, self.dt = sm, wgs, BN, D, dt
        self.causal, self.persistent, self.pin_overlap = causal, persistent, pin_overlap
        self.window = window
        self.overlap = schedule in ("overlap", "pingpong")
        self.pingpong = schedule == "pingpong"
        self.w = w = wg - 1
        t_wg = tid & 127
        self.lane = tid & 31
        self.leader = t_wg == 0
        self.s_acc = Accumulator(BN)
        self.o_acc = Accumulator(D)
        self.p_regs = reg.array(b32, BN // 4)
        self.softmax = OnlineSoftmax(self.s_acc, self.o_acc, self.p_regs, BN=BN, D=D, sl2=sl2,
                                     rescale_threshold=rescale_threshold, dt=dt, cap=cap)
        row0, col0 = self.s_acc.thread_origin(t_wg)
        self.row0 = reg.from_(row0, s32)
        self.col0 = reg.from_(col0, s32)
        q_desc = sm.q_tile.descriptor(sm.q_base + w * (64 * 128))
        self.q_descs = [sm.q_tile.advance(q_desc, kk) for kk in range(sm.q_tile.k_steps)]
        self.k_desc0 = sm.k_tile.descriptor(sm.k_base)
        self.v_desc0 = sm.v_tile.descriptor(sm.v_base)
        self.kst = sm.kpipe.consumer_state()
        self.vst = sm.vpipe.consumer_state()
        self.sched_bar = sched_bar = wgs + 1   # turns on barriers wgs+1.., past the epilogues'
        self.bar_mine = reg.from_(w, u32) + sched_bar
        if wgs == 2:
            self.bar_other = (sched_bar + 1) - reg.from_(w, u32)
        else:                        # turns go round: warpgroup w passes to w + 1 (mod wgs)
            nxt = reg.from_(w, u32) + 1
            ptx.inst.selp.u32(nxt, 0, nxt, nxt == wgs)
            self.bar_other = nxt + sched_bar
        self.first_wg = w == 0
        self.last_wg = ~self.first_wg if wgs == 2 else w == wgs - 1
        self.bar_id = reg.from_(w, u32) + 1
        self.q_full = reg.scalar(u32, init=0)

    # -- the GEMMs and the rings
    def _stage_desc(self, desc0, st):
        return desc0 + reg.from_(st.stage * (self.sm.kv_bytes >> 4), u64)

    def issue_qk(self):
        sm = self.sm
        sm.kpipe.wait(self.kst)
        dk = self._stage_desc(self.k_desc0, self.kst)
        ptx.wgmma.fence()
        for kk in range(sm.q_tile.k_steps):
            ptx.wgmma.mma_async(self.s_acc.regs, self.q_descs[kk], sm.k_tile.advance(dk, kk),
                                n=self.BN, dtype_ab=self.dt.name, scale_d=0 if kk == 0 else 1)
        ptx.wgmma.commit_group()

    def issue_pv(self):
        sm = self.sm
        sm.vpipe.wait(self.vst)
        dv = self._stage_desc(self.v_desc0, self.vst)
        ptx.wgmma.fence()
        for kk in range(sm.v_tile.k_steps):
            frag = [self.p_regs[4 * kk + q] for q in range(4)]
            ptx.wgmma.mma_async(self.o_acc.regs, frag, sm.v_tile.advance(dv, kk), n=self.D,
                                dtype_ab=self.dt.name, scale_d=1, trans_b=1)
        ptx.wgmma.commit_group()

    def _release(self, pipe, st):
        pipe.release(st, pred=self.leader, sem="release.cta")
        st.advance()

    # ping-pong turns, one per batch of GEMMs: a warpgroup waits for its turn (bar.sync on
    # its barrier), issues, and passes the turn (bar.arrive on the next one's). The last
    # warpgroup gives the first turn to warpgroup 0 before its first batch and warpgroup 0
    # takes the last one back after its last, so every arrive meets one sync and two
    # arrives on one barrier are always separated by its owner's sync.
    def _sched_wait(self):
        if self.pingpong:
            ptx.bar_sync(self.bar_mine, 256)

    def _sched_signal(self):
        if self.pingpong:
            ptx.bar_arrive(self.bar_other, 256)

    def start(self):
        """Before the first tile: the last warpgroup gives warpgroup 0 the first turn."""
        if self.pingpong:
            ptx.bar_arrive(self.sched_bar, 256, pred=self.last_wg)

    def finish(self):
        """After the last tile: warpgroup 0 takes the last turn back."""
        if self.pingpong:
            ptx.bar_sync(self.sched_bar, 256, pred=self.first_wg)

    # -- one key block per schedule
    def _scores(self, j, masked, lims):
        """Block ``j``'s scores made ready for the softmax: soft-capped, then masked."""
        self.softmax.cap_scores()
        if masked:
            mask_scores(self.s_acc, self.BN, self.col0, j, lims)

    def _simple_block(self, j, masked, lims):
        sm = self.sm
        self.issue_qk()
        ptx.wgmma.wait_group(0)
        self._release(sm.kpipe, self.kst)
        self._scores(j, masked, lims)
        self.softmax.update()
        self.softmax.rescale_and_pack()
        self.issue_pv()
        ptx.wgmma.wait_group(0)
        self._release(sm.vpipe, self.vst)

    def _overlap_block(self, j, masked, lims):
        sm = self.sm
        self._sched_wait()
        self.issue_qk()
        self.issue_pv()                  # block j-1's P V runs while block j's softmax does
        self._sched_signal()
        ptx.wgmma.wait_group(1)
        self._release(sm.kpipe, self.kst)
        self._scores(j, masked, lims)
        self.softmax.update()
        if self.pin_overlap:             # ptxas does not move the exponentials past a fence
            ptx.fence("cta", sem="acq_rel")
        ptx.wgmma.wait_group(0)
        self._release(sm.vpipe, self.vst)
        self.softmax.rescale_and_pack()

    def run(self, x):
        """Tile ``x`` (``TileScheduler``): O and the softmax state over its key blocks
        (``x["blocks"]``, ascending: the masked left edge, the unmasked middle, the masked
        right edge); returns ``(wrow, rows)``: the warpgroup's first query row and the
        thread's two rows."""
        sm = self.sm
        first, lo, hi, end = x["blocks"]
        wrow = reg.from_(self.w, s32) * 64 + x["m0"]    # this warpgroup's first query row
        rows = [wrow + self.row0, wrow + self.row0 + 8]
        lims = [row_limit(r, x["seqlen_k"], self.causal, self.window) for r in rows]
        left = self.window[0] >= 0
        self.o_acc.zero()
        self.softmax.reset()
        ptx.mbarrier.wait(sm.q_bar.at(0), self.q_full)
        ptx.inst.xor.b32(self.q_full, self.q_full, 1)
        with _when_before(first, end):
            if self.overlap:
                self._sched_wait()
                self.issue_qk()
                self._sched_signal()
                ptx.wgmma.wait_group(0)
                self._release(sm.kpipe, self.kst)
                self._scores(first, True, lims)
                self.softmax.update()
                self.softmax.rescale_and_pack()
                nxt = first + 1
                if left:
                    for j in ptx.loop(nxt, lo, type=s32):
                        self._overlap_block(j, True, lims)
                for j in ptx.loop(_max(lo, nxt) if left else _max(lo, 1), hi, type=s32):
                    self._overlap_block(j, False, lims)
                for j in ptx.loop(_max(hi, nxt), end, type=s32):
                    self._overlap_block(j, True, lims)
                self._sched_wait()
                self.issue_pv()
                self._sched_signal()
                ptx.wgmma.wait_group(0)
                self._release(sm.vpipe, self.vst)
            else:
                if left:
                    for j in ptx.loop(first, lo, type=s32):
                        self._simple_block(j, True, lims)
                for j in ptx.loop(lo, hi, type=s32):
                    self._simple_block(j, False, lims)
                for j in ptx.loop(hi, end, type=s32):
                    self._simple_block(j, True, lims)
        if self.persistent:  # every Q K^T of this tile is done: the producer may load the next Q
            ptx.mbarrier.arrive(sm.q_bar.at(1), pred=self.leader)
        return wrow, rows
