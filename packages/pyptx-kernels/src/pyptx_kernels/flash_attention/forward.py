"""Flash attention forward on Hopper tensor cores: ``o = softmax(scale * q k^T) v`` and its
log-sum-exp, for dense ``(B, S, H, D)`` batches and packed variable-length batches.

One CTA computes a block of 64 query rows per consumer warpgroup of one (batch, head):
``BM = 128`` rows and 384 threads with two consumers, 192 rows and 512 threads with three
(``consumers=3``, the default at head dims 64 and 128: ``default_consumers``):

* warpgroup 0 produces (``setmaxnreg.dec``): one thread copies the Q block once, then the
  K and V blocks of ``BN`` keys into two ``stages``-deep rings (``pyptx.pipeline.Pipeline``)
  with bulk tensor copies through rank-4 tensor maps over ``(B, S, H, D)`` (rank 3 over
  ``(T, H, D)`` for packed batches): copies past a sequence's end read zeros;
* warpgroups 1.. consume (``setmaxnreg.inc``: 240 registers with two, 160 with three), 64
  query rows each: ``S = Q K^T`` with wgmma from shared memory (K is a K-major operand),
  the online softmax in registers (row max and sum over the four threads of a row with
  shuffles, ``ex2.approx`` with ``scale * log2(e)`` folded in), then ``O += P V`` with P
  taken *from registers*: the f32 accumulator fragment of S, packed to bf16/f16 pairs, is
  the A fragment wgmma reads (V is an MN-major operand: keys are the K dimension of PV, D
  is contiguous);
* only the blocks that straddle the causal diagonal or the end of the keys are masked;
  causal CTAs skip the blocks above the diagonal and run longest first;
* schedules (``schedule=``): ``"simple"`` waits for each GEMM before going on;
  ``"overlap"`` issues block j's ``Q K^T`` together with block j-1's ``P V`` so the
  softmax of block j runs while the tensor cores work on ``P V``; ``"pingpong"`` adds
  named barriers so the consumer warpgroups take turns issuing GEMMs (one's softmax runs
  under the other's GEMMs; three pass the turn round a ring). ``PYPTX_ATTN_SCHEDULE``
  overrides the default;
* the epilogue divides by the row sums, writes ``lse = ln(sum_j exp(scale q.k_j))``,
  stages O through the Q tile's shared memory (128-byte swizzle, conflict free) and
  stores it with bulk tensor copies, which clip at the sequence end (packed batches
  store O with predicated ``st.global`` instead: a copy would spill into the next
  sequence);
* the lazy rescale (``rescale_threshold``, log2 units, ``0 <= t <= 16``, default ``8``): a
  row keeps its running max until a block raises it by more than ``t``, and the ``O``
  rescale (``D/2`` multiplies) is skipped when no row of the warp moved its max (a warp
  vote); P values grow to at most ``2**t``. ``t = 0`` is bit-identical to the exact
  schedule, ``rescale_threshold=None`` is that exact schedule (rescale whenever a max
  moves). Measured +1-4% at every row of ``benchmarks/attention.py`` with the same errors
  (``docs/dev/attention.md``);
* opt-in ``pin_overlap=True`` puts a ``fence.acq_rel.cta`` between the softmax and the
  wait for the previous ``P V``: ptxas otherwise hoists that wait above the exponentials,
  so they never run under the warpgroup's own ``P V`` (measured neutral to -10%);
* ``persistent=True``: one CTA per SM walks the query blocks; the next block's Q is
  loaded as soon as both consumers finished their ``Q K^T`` (an mbarrier), and O is
  staged in its own buffer, so the loads overlap the previous block's epilogue.

Grouped-query and multi-query attention (fewer KV heads) read KV head ``h // (Hq // Hkv)``.
``attention(q, k, v)`` (torch tensors or JAX arrays) returns ``o`` and is differentiable
(torch autograd, ``jax.grad``) at head dims 64 and 128 through the backward kernels of
``flash_attention_bwd.py``; ``attention_varlen(...)`` takes packed batches in the
flash-attention packages' layout and is differentiable the same way (the varlen backward
pair, ``build_attention_backward_varlen``). Head dim 256 has a forward only: a call whose
torch inputs require grad raises ``ConfigError``, as does ``jax.grad`` through it
(``NoBackward``); ``attention_forward`` / ``attention_varlen_forward`` are the calls
without autograd.
"""

from __future__ import annotations

import functools
import math
import os
import sys

from pyptx import Tile, kernel, ptx, reg
from pyptx.autotune import Config, autotune
from pyptx.errors import ConfigError, PyptxError
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.pipeline import BarrierArray, Pipeline
from pyptx.source import where_outside
from pyptx.types import b32, f16, f32, pred, s32, u32, u64
from pyptx.types import bf16 as t_bf16
from pyptx.warpspec import Roles, register_budget, ring_base, thread_ids
from pyptx_kernels._common import PACKAGE_DIR

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
BM = 128                    # query rows per CTA by default (64 per consumer warpgroup)
CONSUMERS = (2, 3)          # consumer warpgroups per CTA (``consumers=``): 128 or 192 rows
SMEM_LIMIT = 227 * 1024 - 256
H100_SMS = 132
SCHEDULES = ("simple", "overlap", "pingpong")
DEFAULT_SCHEDULE = "pingpong"
DEFAULT_PERSISTENT = False  # one CTA per query block (hardware-scheduled, longest first)
NEG_INF = float("-inf")
MAX_RESCALE_THRESHOLD = 16  # log2 units: P values stay <= 2**16, sums far from f32 overflow
#: The default ``rescale_threshold`` (log2 units): +1-4% on the H100 at every benchmark row
#: (docs/dev/attention.md); ``None`` rescales O whenever a row's max moves.
RESCALE_THRESHOLD = 8.0


def _fail(msg):
    """A ``ConfigError`` whose message starts with the ``file:line`` of the first caller
    outside this example and pyptx (the user's call)."""
    return ConfigError(f"{where_outside(PACKAGE_DIR)}: {msg}")


def _dtype(name):
    table = {"bf16": t_bf16, "f16": f16, "bfloat16": t_bf16, "float16": f16}
    key = str(name).replace("torch.", "")
    if key not in table:
        raise _fail(f"flash attention: dtype must be bf16 or f16, got {name!r}")
    return table[key]


def default_bn(D, consumers=2):
    """Keys per KV block by default: with two consumer warpgroups 128, or 64 at head dim 256
    (the registers of O); with three the most that ``fits``, up to 128 (128 at head dim 64,
    80 at 128)."""
    if consumers == 2:
        return 64 if D > 128 else 128
    return max([bn for bn in range(64, 129, 16) if fits(D, bn, consumers)] or [64])


def smem_bytes(D, BN, stages, persistent=False, consumers=2):
    """Dynamic shared memory: the Q block (64 rows per consumer warpgroup), ``stages`` K and
    V buffers, an O staging block when persistent (otherwise O is staged in Q's place),
    1024 B of alignment."""
    return 64 * consumers * D * 2 * (2 if persistent else 1) + 2 * stages * BN * D * 2 + 1024


def consumer_regs(consumers):
    """``(maxnreg, registers per consumer thread)`` of a CTA with ``consumers`` consumer
    warpgroups and a 24-register producer (``pyptx.warpspec.register_budget``)."""
    return register_budget(consumers, producer_regs=24)


#: Per consumer count: the most of ``3*BN/4`` (S and P) plus ``D/2`` (O) registers a thread
#: may hold, leaving the rest of ``consumer_regs`` for addresses and softmax state.
FRAGMENT_ROOM = {2: 200, 3: 128}


def fits(D, BN, consumers):
    """Whether ``BN`` keys per block leave room for S, P and O in ``consumers``' registers."""
    return 3 * BN // 4 + D // 2 <= FRAGMENT_ROOM[consumers]


def default_consumers(D, BN=None):
    """The consumer warpgroups a kernel gets when ``consumers`` is not given: 3 where a block
    of ``BN`` keys (of at least 64 when ``BN`` is not given) fits their registers (head dims
    64 and 128), else 2. On an H200 three measured 1.03-1.21x cuDNN's forward (paired) in
    every row of ``benchmarks/attention.py``, two 0.95-1.13x (docs/dev/attention.md)."""
    return 3 if fits(D, 64 if BN is None else BN, 3) else 2


def _check(D, BN, stages, schedule, persistent=False, consumers=2):
    if D not in (64, 128, 256):
        raise _fail(f"flash attention: head dim must be 64, 128 or 256, got {D!r}")
    room = FRAGMENT_ROOM[consumers]
    if isinstance(BN, bool) or not isinstance(BN, int) or BN % 16 or not 64 <= BN <= 256 \
            or not fits(D, BN, consumers):
        raise _fail(f"flash attention: BN={BN!r} keys per block does not fit head dim {D} "
                    f"with {consumers} consumer warpgroups: expected a multiple of 16 in "
                    f"64..256 whose registers (3*BN/4 for S and P, D/2 for O) stay under "
                    f"{room} per thread")
    if schedule not in SCHEDULES:
        raise _fail(f"flash attention: schedule must be one of {SCHEDULES}, got {schedule!r}")
    need = smem_bytes(D, BN, stages, persistent, consumers)
    if need > SMEM_LIMIT:
        raise _fail(f"flash attention: D={D}, BN={BN}, {stages} stages"
                    f"{', persistent' if persistent else ''}, {consumers} consumers need "
                    f"{need} bytes of shared memory, over {SMEM_LIMIT}")


def _check_opts(pin_overlap, rescale_threshold):
    """Validate the opt-in tuning options; returns ``(pin_overlap, rescale_threshold)``."""
    if not isinstance(pin_overlap, bool):
        raise _fail(f"flash attention: pin_overlap must be True or False, got {pin_overlap!r}")
    t = rescale_threshold
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))
                          or not 0 <= t <= MAX_RESCALE_THRESHOLD):
        raise _fail(f"flash attention: rescale_threshold must be None or a number in "
                    f"0..{MAX_RESCALE_THRESHOLD} (log2 units), got {t!r}")
    return pin_overlap, None if t is None else float(t)


def _opts_tag(pin_overlap, rescale_threshold):
    """Kernel-name suffix of the tuning options (empty for the defaults)."""
    tag = "_pinned" if pin_overlap else ""
    if rescale_threshold is None:
        tag += "_exact"
    elif rescale_threshold != RESCALE_THRESHOLD:
        tag += f"_rt{rescale_threshold:g}".replace(".", "p")
    return tag


def _consumers(consumers, D, BN):
    """``consumers`` as given (checked), else ``default_consumers`` (a BN that is neither None
    nor an int is refused later)."""
    if consumers is not None:
        if isinstance(consumers, bool) or consumers not in CONSUMERS:
            raise _fail(f"flash attention: consumers must be one of {CONSUMERS} (consumer "
                        f"warpgroups of 64 query rows each), got {consumers!r}")
        return consumers
    if BN is None or (isinstance(BN, int) and not isinstance(BN, bool)):
        return default_consumers(D, BN or None)
    return 2


def _consumers_tag(consumers):
    """Kernel-name suffix of the consumer warpgroup count (empty for the default 2)."""
    return "" if consumers == 2 else f"_c{consumers}"


def _schedule(schedule, default=DEFAULT_SCHEDULE):
    """``schedule`` as given, else ``$PYPTX_ATTN_SCHEDULE``, else ``default``."""
    return schedule or os.environ.get("PYPTX_ATTN_SCHEDULE") or default


def _tuning(schedule, BN, stages):
    """``attention()``'s tile options as ``_forward`` takes them: each one given (or, for the
    schedule, set by ``$PYPTX_ATTN_SCHEDULE``) or ``None``; all three ``None`` means tuned."""
    return _schedule(schedule, None), BN, stages


def _persistent(persistent, D):
    """``persistent`` as given, else ``$PYPTX_ATTN_PERSISTENT`` (0/1), else the default
    (``DEFAULT_PERSISTENT``); never at head dim 256 (no room for the O staging buffer)."""
    if persistent is None:
        env = os.environ.get("PYPTX_ATTN_PERSISTENT")
        persistent = DEFAULT_PERSISTENT if env is None else env not in ("", "0")
        return bool(persistent) and D <= 128
    return bool(persistent)


# ------------------------------------------------------------------ block plan (ints or registers)
def _min(a, b):
    """``min(a, b)`` of ints, or ``min.s32`` when either is a register."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    if isinstance(a, int):
        a, b = b, a
    d = reg.scalar(s32)
    ptx.inst.min.s32(d, a, b)
    return d


def _max(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    if isinstance(a, int):
        a, b = b, a
    d = reg.scalar(s32)
    ptx.inst.max.s32(d, a, b)
    return d


def block_plan(m0, seqlen_q, seqlen_k, BN, causal, bm=BM):
    """``(n_blocks, n_unmasked)`` of the ``bm``-row query block at row ``m0``: KV blocks
    ``0..n_blocks`` are visited, the first ``n_unmasked`` need no mask. Ints in, ints out
    (the CPU model); registers in, registers out (the kernel) - one definition for both."""
    last = _min(seqlen_k, _min(m0 + bm, seqlen_q)) if causal else seqlen_k  # keys visited
    n_blocks = (last + (BN - 1)) // BN
    full = seqlen_k // BN                       # blocks with no key past the end
    if causal:                                  # and none past the diagonal of row m0
        full = _min(full, (m0 + 1) // BN)
    return n_blocks, _min(full, n_blocks)


def row_limit(row, seqlen_k, causal):
    """First masked key of query ``row``: ``seqlen_k``, or ``min(seqlen_k, row + 1)`` causal."""
    return _min(seqlen_k, row + 1) if causal else seqlen_k


def frag_col(i):
    """Column of accumulator register ``i`` relative to the thread's first column."""
    return Accumulator.coord(i)[1]


def frag_half(i):
    """Which of the thread's two rows (0: row, 1: row + 8) register ``i`` belongs to."""
    return (i // 2) % 2


def a_fragment(k_step):
    """Accumulator registers (of S, ``m64 x BN``) that make wgmma's A fragment of ``k_step``:
    ``a0..a3`` = (row, cols c..c+1), (row+8, c..c+1), (row, c+8..c+9), (row+8, c+8..c+9)
    of the 16 columns ``16 * k_step``, each pair packed low element first."""
    b = 8 * k_step
    return [(b, b + 1), (b + 2, b + 3), (b + 4, b + 5), (b + 6, b + 7)]


def _when_positive(value):
    """``ptx.if_(value > 0)`` for a register ``value``; no branch for a Python int > 0."""
    from contextlib import nullcontext

    if isinstance(value, int):
        if value <= 0:
            raise _fail(f"flash attention: no key blocks to visit ({value})")
        return nullcontext()
    return ptx.if_(value > 0)


# ------------------------------------------------------------------ the kernel
def _body(Q, K, V, CUQ, CUK, Out, LSE, *, dims, varlen, pin_overlap=False,
          rescale_threshold=RESCALE_THRESHOLD):
    (B, S, Sk, Hq, Hkv, D, BN, stages, causal, scale, schedule, dt, Tq, ctas, wgs) = dims
    bm = 64 * wgs
    lazy = rescale_threshold is not None
    persistent = ctas is not None
    group = Hq // Hkv
    slabs = D // 64
    q_tile = OperandTile(bm, D, dt, major="K", swizzle=128)
    k_tile = OperandTile(BN, D, dt, major="K", swizzle=128)
    v_tile = OperandTile(D, BN, dt, major="MN", swizzle=128)
    kv_bytes = k_tile.nbytes
    q_bytes = q_tile.nbytes
    sl2 = float(scale) * LOG2E
    overlap = schedule in ("overlap", "pingpong")
    pingpong = schedule == "pingpong"
    num_m = -(-S // bm)

    tid, wg = thread_ids()
    cx = reg.from_(ptx.special.ctaid.x(), s32)

    def tile(t=None):
        """The query block's coordinates and KV plan: of CTA ``ctaid`` (one block per CTA)
        or of tile ``t`` of the persistent order (heads outermost, longest rows first)."""
        if t is None:
            mi, h, b = cx, reg.from_(ptx.special.ctaid.y(), s32), reg.from_(ptx.special.ctaid.z(), s32)
        else:
            bh = t // num_m
            mi = t - bh * num_m
            b = bh // Hq
            h = bh - b * Hq
        mb = (num_m - 1) - mi if causal else mi   # causal: the longest rows first
        x = dict(h=h, b=b, m0=mb * bm, hk=h // group if group > 1 else h, q_start=None,
                 k_start=None, seqlen_q=S, seqlen_k=Sk)
        if varlen:
            pq, pk = ptx.global_ptrs(CUQ, CUK)
            q_start, q_end, k_start, k_end = (reg.scalar(s32) for _ in range(4))
            ptx.inst.ld.global_.nc.s32(q_start, ptx.addr(pq + b * 4))
            ptx.inst.ld.global_.nc.s32(q_end, ptx.addr(pq + b * 4 + 4))
            ptx.inst.ld.global_.nc.s32(k_start, ptx.addr(pk + b * 4))
            ptx.inst.ld.global_.nc.s32(k_end, ptx.addr(pk + b * 4 + 4))
            x.update(q_start=q_start, k_start=k_start, seqlen_q=q_end - q_start,
                     seqlen_k=k_end - k_start)
            ptx.ret(pred=mi * bm >= x["seqlen_q"])  # the whole CTA leaves together
            if causal:  # the grid covers max_seqlen_q: reverse within this sequence's blocks
                nq = (x["seqlen_q"] + (bm - 1)) // bm
                x["m0"] = ((nq - 1) - mi) * bm
        x["n_blocks"], x["n_unmasked"] = block_plan(x["m0"], x["seqlen_q"], x["seqlen_k"], BN,
                                                    causal, bm)
        return x

    one = None if persistent else tile()

    def tiles():
        """Python loop of one iteration (one block per CTA) or the device loop over tiles."""
        if not persistent:
            yield one
            return
        for t in ptx.loop(cx, num_m * Hq * B, ctas, type=s32):
            yield tile(t)

    base = ring_base("smem")
    q_base = base
    k_base = base + q_bytes
    v_base = k_base + stages * kv_bytes
    o_base = v_base + stages * kv_bytes if persistent else q_base  # O staged in Q otherwise
    q_bar = BarrierArray(2, name="q_bar")       # [0]: Q landed, [1]: Q free again
    kpipe = Pipeline(stages, consumer_arrivals=wgs)
    vpipe = Pipeline(stages, consumer_arrivals=wgs)
    with ptx.if_(tid == 0):
        ptx.mbarrier.init(q_bar.at(0), 1)
        ptx.mbarrier.init(q_bar.at(1), wgs)
    kpipe.init(pred=tid == 0)
    vpipe.init(pred=tid == 0)
    ptx.bar_sync(0)

    def tma_coords(i, row, head, b):
        if varlen:
            return (i * 64, head, row)
        return (i * 64, head, row, b)

    roles = Roles(wg, 24)
    # ------------------------------------------------------------------ producer
    with ptx.if_(tid == 0):
        qmap = ptx.tma.tensormap_ptr(Q.tmap)
        kmap = ptx.tma.tensormap_ptr(K.tmap)
        vmap = ptx.tma.tensormap_ptr(V.tmap)
        kst = kpipe.producer_state()
        vst = vpipe.producer_state()
        q_free = reg.scalar(u32, init=1)          # a fresh barrier completes parity 1 at once
        for x in tiles():
            if persistent:
                ptx.mbarrier.wait(q_bar.at(1), q_free)
                ptx.inst.xor.b32(q_free, q_free, 1)
            qrow = x["q_start"] + x["m0"] if varlen else x["m0"]
            ptx.mbarrier.arrive_expect_tx(q_bar.at(0), q_bytes)
            for i in range(slabs):
                ptx.tma.load_tile(q_base + i * q_tile.slab_bytes, qmap,
                                  tma_coords(i, qrow, x["h"], x["b"]), q_bar.at(0))
            for j in ptx.loop(0, x["n_blocks"], type=s32):
                n0 = j * BN
                krow = x["k_start"] + n0 if varlen else n0
                for pipe, st, tmap, buf in ((kpipe, kst, kmap, k_base), (vpipe, vst, vmap, v_base)):
                    pipe.acquire(st)
                    bar = pipe.arm(st, kv_bytes)
                    dst = buf + st.stage * kv_bytes
                    for i in range(slabs):
                        ptx.tma.load_tile(dst + i * k_tile.slab_bytes if i else dst, tmap,
                                          tma_coords(i, krow, x["hk"], x["b"]), bar)
                    st.advance()
    # ------------------------------------------------------------------ consumers
    roles.consumers(consumer_regs(wgs)[1])
    w = wg - 1
    t_wg = tid & 127
    lane = tid & 31
    leader = t_wg == 0
    s_acc = Accumulator(BN)
    o_acc = Accumulator(D)
    p_regs = reg.array(b32, BN // 4)
    m_row = [reg.scalar(f32) for _ in range(2)]
    l_row = [reg.scalar(f32) for _ in range(2)]
    alpha = [reg.scalar(f32) for _ in range(2)]
    moved_rows = [None, None]    # per block: did row hh move its max (rescale_threshold)
    row0, col0 = s_acc.thread_origin(t_wg)
    row0 = reg.from_(row0, s32)
    col0 = reg.from_(col0, s32)
    q_desc = q_tile.descriptor(q_base + w * (64 * 128))
    q_descs = [q_tile.advance(q_desc, kk) for kk in range(q_tile.k_steps)]
    k_desc0 = k_tile.descriptor(k_base)
    v_desc0 = v_tile.descriptor(v_base)
    kst = kpipe.consumer_state()
    vst = vpipe.consumer_state()
    sched_bar = wgs + 1          # turns on barriers wgs+1.., past the epilogues' 1..wgs
    bar_mine = reg.from_(w, u32) + sched_bar
    if wgs == 2:
        bar_other = (sched_bar + 1) - reg.from_(w, u32)
    else:                        # turns go round: warpgroup w passes to w + 1 (mod wgs)
        nxt = reg.from_(w, u32) + 1
        ptx.inst.selp.u32(nxt, 0, nxt, nxt == wgs)
        bar_other = nxt + sched_bar
    first_wg = w == 0
    last_wg = ~first_wg if wgs == 2 else w == wgs - 1
    bar_id = reg.from_(w, u32) + 1
    q_full = reg.scalar(u32, init=0)
    (plse,) = ptx.global_ptrs(LSE)
    if varlen:
        (po,) = ptx.global_ptrs(Out)
    else:
        omap = ptx.tma.tensormap_ptr(Out.tmap)
        obuf = o_base + w * (64 * 128)          # this warpgroup's 64 rows of each slab
        # epilogue addressing: row r, 16-byte chunk q at chunk q ^ (r % 8) = q ^ (lane / 4)
        rowbase = obuf + reg.from_(row0, u32) * 128 + (lane & 3) * 4
        sw = {q: (((lane >> 2) ^ q) << 4) + rowbase for q in range(8)}

    def stage_desc(desc0, st):
        return desc0 + reg.from_(st.stage * (kv_bytes >> 4), u64)

    def issue_qk():
        kpipe.wait(kst)
        dk = stage_desc(k_desc0, kst)
        ptx.wgmma.fence()
        for kk in range(q_tile.k_steps):
            ptx.wgmma.mma_async(s_acc.regs, q_descs[kk], k_tile.advance(dk, kk), n=BN,
                                dtype_ab=dt.name, scale_d=0 if kk == 0 else 1)
        ptx.wgmma.commit_group()

    def issue_pv():
        vpipe.wait(vst)
        dv = stage_desc(v_desc0, vst)
        ptx.wgmma.fence()
        for kk in range(v_tile.k_steps):
            frag = [p_regs[4 * kk + q] for q in range(4)]
            ptx.wgmma.mma_async(o_acc.regs, frag, v_tile.advance(dv, kk), n=D,
                                dtype_ab=dt.name, scale_d=1, trans_b=1)
        ptx.wgmma.commit_group()

    def release(pipe, st):
        pipe.release(st, pred=leader, sem="release.cta")
        st.advance()

    def mask(j, lims):
        n0c = j * BN + col0
        for hh in range(2):
            t = lims[hh] - n0c                   # first masked column, relative to col0
            for i in range(BN // 2):
                if frag_half(i) == hh:
                    ptx.inst.selp.f32(s_acc[i], NEG_INF, s_acc[i], t <= frag_col(i))

    def softmax():
        """P (in s_acc) = exp2(S * sl2 - m_new); l, m updated; alpha = exp2(m_old - m_new)."""
        for hh in range(2):
            idx = [i for i in range(BN // 2) if frag_half(i) == hh]
            vals = [s_acc[i] for i in idx]
            while len(vals) > 1:
                nxt = []
                for a, c in zip(vals[::2], vals[1::2]):
                    d = reg.scalar(f32)
                    ptx.inst.max.f32(d, a, c)
                    nxt.append(d)
                vals = nxt + vals[len(vals) // 2 * 2:]
            mx = vals[0]
            ptx.warp.reduce_max(mx, width=4)
            m_new = reg.scalar(f32)
            ptx.inst.mul.f32(m_new, mx, sl2)          # -inf stays -inf
            ptx.inst.max.f32(m_new, m_new, m_row[hh])
            if lazy:  # keep the old max unless this block raised it by more than the threshold
                moved = m_new > m_row[hh] + rescale_threshold   # false for -inf, -inf
                ptx.inst.selp.f32(m_new, m_new, m_row[hh], moved)
                moved_rows[hh] = moved
            m_use = reg.scalar(f32)                   # a row with no key yet: exp2(x - 0)
            ptx.inst.selp.f32(m_use, 0.0, m_new, m_new == NEG_INF)
            ptx.inst.ex2.approx.ftz.f32(alpha[hh], m_row[hh] - m_use)
            neg = reg.scalar(f32)
            ptx.inst.neg.f32(neg, m_use)
            for i in idx:
                ptx.inst.fma.rn.f32(s_acc[i], s_acc[i], sl2, neg)
                ptx.inst.ex2.approx.ftz.f32(s_acc[i], s_acc[i])
            vals = [s_acc[i] for i in idx]
            while len(vals) > 1:
                vals = [a + c for a, c in zip(vals[::2], vals[1::2])] + vals[len(vals) // 2 * 2:]
            ptx.inst.fma.rn.f32(l_row[hh], l_row[hh], alpha[hh], vals[0])
            ptx.inst.mov.f32(m_row[hh], m_new)

    def rescale_o():
        for i in range(D // 2):
            ptx.inst.mul.f32(o_acc[i], o_acc[i], alpha[frag_half(i)])

    def rescale_and_pack():
        if lazy:  # alpha is exactly 1 on every row that kept its max: skip when the whole warp did
            anyp = reg.scalar(pred)
            ptx.inst.vote.sync.any.pred(anyp, moved_rows[0] | moved_rows[1], 0xFFFFFFFF)
            with ptx.if_(anyp):
                rescale_o()
        else:
            rescale_o()
        for kk in range(BN // 16):
            for q, (lo, hi) in enumerate(a_fragment(kk)):
                ptx.inst(f"cvt.rn.{dt.name}x2.f32")(p_regs[4 * kk + q], s_acc[hi], s_acc[lo])

    # ping-pong turns, one per batch of GEMMs: a warpgroup waits for its turn (bar.sync on
    # its barrier), issues, and passes the turn (bar.arrive on the next one's). The last
    # warpgroup gives the first turn to warpgroup 0 before its first batch and warpgroup 0
    # takes the last one back after its last, so every arrive meets one sync and two
    # arrives on one barrier are always separated by its owner's sync.
    def sched_wait():
        if pingpong:
            ptx.bar_sync(bar_mine, 256)

    def sched_signal():
        if pingpong:
            ptx.bar_arrive(bar_other, 256)

    def simple_block(j, masked, lims):
        issue_qk()
        ptx.wgmma.wait_group(0)
        release(kpipe, kst)
        if masked:
            mask(j, lims)
        softmax()
        rescale_and_pack()
        issue_pv()
        ptx.wgmma.wait_group(0)
        release(vpipe, vst)

    def overlap_block(j, masked, lims):
        sched_wait()
        issue_qk()
        issue_pv()                  # block j-1's P V runs while block j's softmax does
        sched_signal()
        ptx.wgmma.wait_group(1)
        release(kpipe, kst)
        if masked:
            mask(j, lims)
        softmax()
        if pin_overlap:             # ptxas does not move the exponentials past a fence
            ptx.fence("cta", sem="acq_rel")
        ptx.wgmma.wait_group(0)
        release(vpipe, vst)
        rescale_and_pack()

    if pingpong:
        ptx.bar_arrive(sched_bar, 256, pred=last_wg)
    for x in tiles():
        n_blocks, n_unmasked = x["n_blocks"], x["n_unmasked"]
        seqlen_q, h, b = x["seqlen_q"], x["h"], x["b"]
        wrow = reg.from_(w, s32) * 64 + x["m0"]    # this warpgroup's first query row
        rows = [wrow + row0, wrow + row0 + 8]
        lims = [row_limit(r, x["seqlen_k"], causal) for r in rows]
        o_acc.zero()
        for hh in range(2):
            ptx.inst.mov.f32(m_row[hh], NEG_INF)
            ptx.inst.mov.f32(l_row[hh], 0.0)
        ptx.mbarrier.wait(q_bar.at(0), q_full)
        ptx.inst.xor.b32(q_full, q_full, 1)
        with _when_positive(n_blocks):
            if overlap:
                sched_wait()
                issue_qk()
                sched_signal()
                ptx.wgmma.wait_group(0)
                release(kpipe, kst)
                mask(0, lims)
                softmax()
                rescale_and_pack()
                for j in ptx.loop(1, n_unmasked, type=s32):
                    overlap_block(j, False, lims)
                for j in ptx.loop(_max(n_unmasked, 1), n_blocks, type=s32):
                    overlap_block(j, True, lims)
                sched_wait()
                issue_pv()
                sched_signal()
                ptx.wgmma.wait_group(0)
                release(vpipe, vst)
            else:
                for j in ptx.loop(0, n_unmasked, type=s32):
                    simple_block(j, False, lims)
                for j in ptx.loop(n_unmasked, n_blocks, type=s32):
                    simple_block(j, True, lims)
        if persistent:  # every Q K^T of this tile is done: the producer may load the next Q
            ptx.mbarrier.arrive(q_bar.at(1), pred=leader)

        # -------------------------------------------------------------- epilogue
        inv = []
        for hh in range(2):
            ls = reg.from_(l_row[hh])
            ptx.warp.reduce_sum(ls, width=4)
            empty = ls <= 0.0
            r = reg.scalar(f32)
            ptx.inst.rcp.approx.ftz.f32(r, ls)
            ptx.inst.selp.f32(r, 0.0, r, empty)
            inv.append(r)
            lg = reg.scalar(f32)
            ptx.inst.lg2.approx.ftz.f32(lg, ls)
            lse = (m_row[hh] + lg) * LN2
            ptx.inst.selp.f32(lse, NEG_INF, lse, empty)
            row = rows[hh]
            ok = (row < seqlen_q) & ((lane & 3) == 0)
            idx = h * Tq + x["q_start"] + row if varlen else (b * Hq + h) * S + row
            ptx.inst.st.global_.f32(ptx.addr(plse + reg.from_(idx, u64) * 4), lse, pred=ok)
        for i in range(D // 2):
            ptx.inst.mul.f32(o_acc[i], o_acc[i], inv[frag_half(i)])

        if varlen:
            for hh in range(2):
                row = rows[hh]
                ok = row < seqlen_q
                rbase = (reg.from_(x["q_start"] + row, u64) * Hq + reg.from_(h, u64)) * (D * 2) + po
                cb = reg.from_(col0, u64) * 2 + rbase
                for i, dr, dc in o_acc.pairs():
                    if dr // 8 != hh:
                        continue
                    packed = reg.scalar(b32)
                    ptx.inst(f"cvt.rn.{dt.name}x2.f32")(packed, o_acc[i + 1], o_acc[i])
                    ptx.inst.st.global_.b32(ptx.addr(cb, dc * 2), packed, pred=ok)
            continue
        # stage O in 128-byte-swizzled slabs: this warpgroup's 64 rows of the Q tile (its
        # Q K^T reads are complete), or of its own buffer when persistent (the previous
        # tile's store must have read it)
        if persistent:
            ptx.tma.wait_group(0, read=True, pred=leader)
        ptx.bar_sync(bar_id, 128)
        for i, dr, dc in o_acc.pairs():
            packed = reg.scalar(b32)
            ptx.inst(f"cvt.rn.{dt.name}x2.f32")(packed, o_acc[i + 1], o_acc[i])
            off = (dc // 64) * q_tile.slab_bytes + dr * 128
            ptx.inst.st.shared.b32(ptx.addr(sw[(dc % 64) // 8], off), packed)
        ptx.fence_proxy_async("shared::cta")
        ptx.bar_sync(bar_id, 128)
        with ptx.if_(leader):
            for i in range(slabs):
                ptx.tma.store_tile(omap, (i * 64, h, wrow, b), obuf + i * q_tile.slab_bytes)
            ptx.tma.commit_group()
    if pingpong:
        ptx.bar_sync(sched_bar, 256, pred=first_wg)
    if not varlen:
        ptx.tma.wait_group(0, read=False, pred=leader)
    roles.end()
    ptx.ret()


def build_attention(B, S, Hq, Hkv, D, *, Sk=None, dtype="bf16", causal=False, scale=None,
                    BN=None, stages=2, schedule=None, persistent=False, num_sms=H100_SMS,
                    pin_overlap=False, rescale_threshold=RESCALE_THRESHOLD, consumers=None):
    """The forward kernel for ``q (B, S, Hq, D)``, ``k, v (B, Sk, Hkv, D)``: returns
    ``o (B, S, Hq, D)`` and ``lse (B, Hq, S)`` f32. ``scale`` defaults to ``1/sqrt(D)``;
    ``causal`` masks key ``j > i`` (top-left aligned). ``BN`` keys per block, ``stages``
    K and V buffers each, ``schedule`` one of ``SCHEDULES`` (default ``DEFAULT_SCHEDULE``
    or ``$PYPTX_ATTN_SCHEDULE``). ``persistent``: ``num_sms`` CTAs walk the query blocks
    (heads outermost, longest rows first), loading the next block's Q and K/V while the
    current one's output is stored; otherwise one CTA per query block. ``consumers``: 2
    or 3 consumer warpgroups of 64 query rows each (3: 192-row blocks, 160 registers per
    consumer thread instead of 240; ``FRAGMENT_ROOM``), by default ``default_consumers``.
    ``pin_overlap``, ``rescale_threshold``: opt-in tuning options (module docstring)."""
    dt = _dtype(dtype)
    pin_overlap, rescale_threshold = _check_opts(pin_overlap, rescale_threshold)
    Sk = S if Sk is None else Sk
    consumers = _consumers(consumers, D, BN)
    BN = BN or default_bn(D, consumers)
    schedule = _schedule(schedule)
    _check(D, BN, stages, schedule, persistent, consumers)
    if Hq % Hkv:
        raise _fail(f"flash attention: Hq={Hq} is not a multiple of Hkv={Hkv}")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    bm = 64 * consumers
    num_m = -(-S // bm)
    ctas = min(num_m * Hq * B, num_sms) if persistent else None
    dims = (B, S, Sk, Hq, Hkv, D, BN, stages, causal, scale, schedule, dt, None, ctas, consumers)
    tma = {"Q": dict(box=(1, bm, 1, 64), swizzle="128B"),
           "K": dict(box=(1, BN, 1, 64), swizzle="128B"),
           "V": dict(box=(1, BN, 1, 64), swizzle="128B"),
           "Out": dict(box=(1, 64, 1, 64), swizzle="128B")}
    name = (f"flash_fwd_{dt.name}_d{D}_bn{BN}_s{stages}_{schedule}"
            f"{'_causal' if causal else ''}_g{Hq // Hkv}{'_persistent' if persistent else ''}"
            f"{_consumers_tag(consumers)}{_opts_tag(pin_overlap, rescale_threshold)}")
    deco = kernel(in_specs=(Tile(B, S, Hq, D, dt), Tile(B, Sk, Hkv, D, dt), Tile(B, Sk, Hkv, D, dt)),
                  out_specs=(Tile(B, S, Hq, D, dt), Tile(B, Hq, S, f32)),
                  grid=(ctas, 1, 1) if persistent else (num_m, Hq, B),
                  block=(128 * (1 + consumers), 1, 1),
                  smem=smem_bytes(D, BN, stages, persistent, consumers),
                  maxnreg=consumer_regs(consumers)[0], tma=tma, name=name)

    def flash_fwd(Q, K, V, Out, LSE):
        _body(Q, K, V, None, None, Out, LSE, dims=dims, varlen=False, pin_overlap=pin_overlap,
              rescale_threshold=rescale_threshold)
    return deco(flash_fwd)


def build_attention_varlen(Tq, Tk, B, Hq, Hkv, D, max_seqlen_q, *, dtype="bf16", causal=False,
                           scale=None, BN=None, stages=2, schedule=None, pin_overlap=False,
                           rescale_threshold=RESCALE_THRESHOLD, consumers=None):
    """The packed variable-length forward kernel: ``q (Tq, Hq, D)``, ``k, v (Tk, Hkv, D)``,
    ``cu_seqlens_q``/``cu_seqlens_k`` int32 ``(B + 1,)``; returns ``o (Tq, Hq, D)`` and
    ``lse (Hq, Tq)`` f32. The grid covers ``max_seqlen_q`` rows per sequence; the options
    are ``build_attention``'s."""
    dt = _dtype(dtype)
    pin_overlap, rescale_threshold = _check_opts(pin_overlap, rescale_threshold)
    consumers = _consumers(consumers, D, BN)
    BN = BN or default_bn(D, consumers)
    schedule = _schedule(schedule)
    _check(D, BN, stages, schedule, consumers=consumers)
    if Hq % Hkv:
        raise _fail(f"flash attention: Hq={Hq} is not a multiple of Hkv={Hkv}")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    bm = 64 * consumers
    dims = (B, max_seqlen_q, None, Hq, Hkv, D, BN, stages, causal, scale, schedule, dt, Tq, None,
            consumers)
    tma = {"Q": dict(box=(bm, 1, 64), swizzle="128B"),
           "K": dict(box=(BN, 1, 64), swizzle="128B"),
           "V": dict(box=(BN, 1, 64), swizzle="128B")}
    name = (f"flash_fwd_varlen_{dt.name}_d{D}_bn{BN}_s{stages}_{schedule}"
            f"{'_causal' if causal else ''}_g{Hq // Hkv}{_consumers_tag(consumers)}"
            f"{_opts_tag(pin_overlap, rescale_threshold)}")
    deco = kernel(in_specs=(Tile(Tq, Hq, D, dt), Tile(Tk, Hkv, D, dt), Tile(Tk, Hkv, D, dt),
                            Tile(B + 1, s32), Tile(B + 1, s32)),
                  out_specs=(Tile(Tq, Hq, D, dt), Tile(Hq, Tq, f32)),
                  grid=(-(-max_seqlen_q // bm), Hq, B), block=(128 * (1 + consumers), 1, 1),
                  smem=smem_bytes(D, BN, stages, consumers=consumers),
                  maxnreg=consumer_regs(consumers)[0], tma=tma, name=name)

    def flash_fwd_varlen(Q, K, V, CUQ, CUK, Out, LSE):
        _body(Q, K, V, CUQ, CUK, Out, LSE, dims=dims, varlen=True, pin_overlap=pin_overlap,
              rescale_threshold=rescale_threshold)
    return deco(flash_fwd_varlen)


# ------------------------------------------------------------------------ host side
def _lib(x):
    return "torch" if type(x).__module__.startswith("torch") else "jax"


def _dtype_name(x):
    name = {"bfloat16": "bf16", "float16": "f16"}.get(str(x.dtype).replace("torch.", ""))
    if name is None:
        raise _fail(f"flash attention: q, k, v must be bfloat16 or float16, got {x.dtype}")
    return name


def _bwd_module():
    """The backward kernels' module (imported late: it is large and the forward needs it
    only when gradients are asked for)."""
    from pyptx_kernels.flash_attention import backward

    return backward


ATTENTION_CONFIGS = [Config(), Config(stages=3), Config(BN=64), Config(BN=176), Config(BN=192),
                     Config(schedule="overlap"), Config(consumers=2)]
"""The forward tile options ``attention()`` times per shape when none is given (the first is
the default with ``PYPTX_AUTOTUNE=0``): ``BN`` keys per block, ring ``stages`` and the
overlap schedule, each with ``default_consumers`` (three consumer warpgroups where the block
fits, so ``BN=176``/``192`` run with two), and two consumers with their default block; a head
dim a config does not fit (``BN=192`` at 128, three stages at 256) is refused and skipped. Each one is checked against float64 in the CPU simulator
(``test_tensorcore_sim.py``) and on the GPU (``tools/attention_sanitize.py``); the H100 tuner
picked ``BN=192``, ``stages=3``, ``BN=176`` or the defaults across the benchmark's rows."""

attention_tuned = autotune(ATTENTION_CONFIGS, key=[
    "B", "S", "Hq", "Hkv", "D", "Sk", "dtype", "causal", "scale", "persistent", "pin_overlap",
    "rescale_threshold"])(build_attention)
"""``build_attention`` with its tile options chosen on the device at the first launch."""


@functools.lru_cache(maxsize=128)
def _forward(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, schedule, BN, stages, persistent=False,
             pin_overlap=False, rescale_threshold=RESCALE_THRESHOLD, consumers=None):
    kw = dict(Sk=Sk, dtype=dtype, causal=causal, scale=scale, persistent=persistent,
              pin_overlap=pin_overlap, rescale_threshold=rescale_threshold)
    given = {k: v for k, v in (("schedule", schedule), ("BN", BN), ("stages", stages),
                               ("consumers", consumers)) if v is not None}
    if not given:
        return attention_tuned(B, S, Hq, Hkv, D, **kw)
    return build_attention(B, S, Hq, Hkv, D, **kw, **given)


BACKWARD_HEAD_DIMS = (64, 128)   # head dims the backward kernels support (check_shapes)


def _no_backward_message(D):
    return (f"no backward at head dim {D}: the attention backward kernels support head dims "
            f"{' and '.join(map(str, BACKWARD_HEAD_DIMS))}; for inference call "
            f"attention_forward (or attention_varlen_forward), or run under torch.no_grad()")


class NoBackward:
    """A kernel-like backward (``in_specs``, ``out_specs``, ``name``, ``arg_names``) for a
    forward whose backward does not exist (head dim 256): ``differentiable_kernel`` accepts
    it, and calling it (``loss.backward()``, ``jax.grad``) raises ``ConfigError`` naming the
    head dim, prefixed with the ``file:line`` of the latest ``attention()`` /
    ``attention_varlen()`` call that ran this forward (``where``)."""

    def __init__(self, fwd, D, n_saved_in, n_grad=3):
        n_out = len(fwd.out_specs)
        self.in_specs = tuple(fwd.in_specs[:n_saved_in]) + tuple(fwd.out_specs) * 2
        self.out_specs = tuple(fwd.in_specs[:n_grad])
        self.arg_names = tuple(f"x{i}" for i in range(n_saved_in + 2 * n_out + n_grad))
        self.name = f"{fwd.name}_no_backward"
        self.D = D
        self.where = "<unknown>:0"

    def __call__(self, *args):
        raise ConfigError(f"{self.where}: attention: {_no_backward_message(self.D)}")


def _refuse_grad(fn, D, xs, op):
    """``attention()``/``attention_varlen()`` at a head dim without backward: ``ConfigError``
    now when torch will want gradients (``requires_grad`` and grad mode on); otherwise note
    the call's ``file:line`` in ``op``'s ``NoBackward`` (a later ``jax.grad`` raises there)."""
    if D in BACKWARD_HEAD_DIMS:
        return
    if _lib(xs[0]) == "torch":
        import torch

        if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
            raise _fail(f"{fn}: q, k or v requires grad, but there is "
                        f"{_no_backward_message(D)}")
    bwd = getattr(op, "backward_kernel", None)
    if isinstance(bwd, NoBackward):
        bwd.where = where_outside(PACKAGE_DIR)


@functools.lru_cache(maxsize=128)
def _differentiable(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, schedule, BN, stages,
                    persistent=False, pin_overlap=False, rescale_threshold=RESCALE_THRESHOLD,
                    deterministic=True, consumers=None):
    """The forward kernel wrapped with the backward one, or the bare forward kernel when the
    backward example or ``differentiable_kernel(save_outputs=)`` is not available.
    The backward for torch eager calls: at D=128, the dK/dV kernel also adds dQ, with TMA
    tile reductions in a fixed order (``dq_ordered``: five products, not seven, still
    deterministic), and converts dQ in converter CTAs after its own (``dq_convert``); at
    full attention its producer warpgroup's idle warps also convert earlier heads' dQ and
    compute later heads' (lse, delta) stats (``convert_lag``, ``stats_lead``: "auto"); at
    D=64, the fused one-kernel backward (``fused_bq=128``, 128-row q blocks, its consumer
    warpgroups half a block apart: ``fused_pingpong=1``) adds dQ the same way; ``deterministic=False``: in any order. JAX and
    ``torch.compile`` traces run the seven-product pair (``AttentionBackward.fallback``), as
    does a size the faster kernel refuses."""
    fwd = _forward(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, schedule, BN, stages, persistent,
                   pin_overlap, rescale_threshold, consumers)
    bwd_mod = _bwd_module()
    if bwd_mod is None:
        return fwd
    from pyptx.autodiff import differentiable_kernel

    try:
        bwd = bwd_mod.build_attention_backward(B, S, Hq, Hkv, D, Sk=Sk, dtype=dtype,
                                               causal=causal, scale=scale)
    except PyptxError:  # a size the backward refuses (head dim 256): gradients raise
        try:
            return differentiable_kernel(fwd, NoBackward(fwd, D, 3), save_for_backward=[0, 1, 2],
                                         save_outputs=[0, 1], num_grad_inputs=3)
        except TypeError:  # no save_outputs yet
            return fwd
    fast = {}
    if D == 64 and not bwd_mod.safe_default():
        fast = dict(fused_bq=128, dq_ordered=deterministic, fused_pingpong=1)
    elif not deterministic:
        fast = dict(atomic_dq=True, dq_bulk=True)
    elif D == 128 and not bwd_mod.safe_default():
        fast = dict(atomic_dq=True, dq_bulk=True, dq_ordered=True, dq_convert=True,
                    convert_lag="auto", stats_lead="auto")
    if fast:
        try:
            bwd = bwd_mod.build_attention_backward(
                B, S, Hq, Hkv, D, Sk=Sk, dtype=dtype, causal=causal, scale=scale,
                **fast).with_fallback(bwd)
        except PyptxError:  # the pair alone
            pass
    try:
        return differentiable_kernel(fwd, bwd, save_for_backward=[0, 1, 2], save_outputs=[0, 1],
                                     num_grad_inputs=3)
    except TypeError:  # no save_outputs yet
        return fwd


def _shapes(q, k, v):
    if len(q.shape) != 4 or len(k.shape) != 4 or tuple(k.shape) != tuple(v.shape):
        raise _fail(f"attention expects q (B, S, Hq, D) and k, v (B, Sk, Hkv, D), got "
                          f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, S, Hq, D = (int(d) for d in q.shape)
    Bk, Sk, Hkv, Dk = (int(d) for d in k.shape)
    if Bk != B or Dk != D or Hq % Hkv:
        raise _fail(f"attention: k/v {tuple(k.shape)} do not match q {tuple(q.shape)} "
                          f"(same B and D, Hq a multiple of Hkv)")
    name = _dtype_name(q)
    if _dtype_name(k) != name or _dtype_name(v) != name:
        raise _fail(f"attention: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, "
                          f"{v.dtype}")
    return B, S, Hq, Hkv, D, Sk, name


def _contiguous(*xs):
    return tuple(x.contiguous() if _lib(x) == "torch" else x for x in xs)


def attention_forward(q, k, v, causal=False, scale=None, *, schedule=None, BN=None, stages=None,
                      persistent=None, pin_overlap=False, rescale_threshold=RESCALE_THRESHOLD,
                      consumers=None):
    """``(o, lse)`` of the forward kernel (no autograd): ``o (B, S, Hq, D)``, ``lse (B, Hq, S)``
    float32, natural log of each row's sum of ``exp(scale * q.k)``. With none of
    ``schedule``, ``BN``, ``stages``, ``consumers`` given, they are tuned per shape
    (``ATTENTION_CONFIGS``)."""
    B, S, Hq, Hkv, D, Sk, name = _shapes(q, k, v)
    sc = 1.0 / math.sqrt(D) if scale is None else float(scale)
    k_ = _forward(B, S, Hq, Hkv, D, Sk, name, bool(causal), sc, *_tuning(schedule, BN, stages),
                  _persistent(persistent, D), *_check_opts(pin_overlap, rescale_threshold),
                  consumers)
    return k_(*_contiguous(q, k, v))


def attention(q, k, v, causal=False, scale=None, *, schedule=None, BN=None, stages=None,
              persistent=None, pin_overlap=False, rescale_threshold=RESCALE_THRESHOLD,
              deterministic=True, consumers=None):
    """Flash attention ``softmax(scale * q k^T) v`` (torch tensors or JAX arrays):
    ``q (B, S, Hq, D)``, ``k, v (B, Sk, Hkv, D)`` with ``Hq % Hkv == 0``, bf16 or f16,
    ``D`` in 64/128/256. ``causal``: key ``j`` allowed for query ``i`` iff ``j <= i``.
    ``scale`` defaults to ``1/sqrt(D)``. Differentiable in ``q, k, v`` at ``D`` 64 and 128;
    at 256 there is no backward: torch inputs that require grad (grad mode on) raise
    ``ConfigError`` here, ``jax.grad`` raises it when it reaches the backward (use
    ``attention_forward`` or ``torch.no_grad()`` for inference). ``schedule``, ``BN``, ``stages``, ``consumers``, ``persistent``,
    ``pin_overlap``, ``rescale_threshold``: see ``build_attention``; with none of the first
    four given, the forward's tile options are tuned per shape on the device (``ATTENTION_CONFIGS``,
    ``pyptx.autotune``; ``PYPTX_AUTOTUNE=0`` takes the defaults). ``deterministic=False``: a faster
    backward whose dQ sums come in run-dependent order (last bits vary between runs;
    torch eager only: JAX and ``torch.compile`` raise ``ConfigError``)."""
    B, S, Hq, Hkv, D, Sk, name = _shapes(q, k, v)
    sc = 1.0 / math.sqrt(D) if scale is None else float(scale)
    fn = _differentiable(B, S, Hq, Hkv, D, Sk, name, bool(causal), sc,
                         *_tuning(schedule, BN, stages), _persistent(persistent, D),
                         *_check_opts(pin_overlap, rescale_threshold), bool(deterministic),
                         consumers)
    _refuse_grad("attention", D, (q, k, v), fn)
    return fn(*_contiguous(q, k, v))[0]


@functools.lru_cache(maxsize=128)
def _varlen(Tq, Tk, B, Hq, Hkv, D, max_q, dtype, causal, scale, schedule, BN, stages,
            pin_overlap=False, rescale_threshold=RESCALE_THRESHOLD, consumers=None):
    return build_attention_varlen(Tq, Tk, B, Hq, Hkv, D, max_q, dtype=dtype, causal=causal,
                                  scale=scale, BN=BN, stages=stages, schedule=schedule,
                                  pin_overlap=pin_overlap, rescale_threshold=rescale_threshold,
                                  consumers=consumers)


def _varlen_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """``(Tq, Tk, B, Hq, Hkv, D, max_q, max_k, dtype name)`` of a packed call, or
    ``ConfigError`` at the user's line."""
    if len(q.shape) != 3 or len(k.shape) != 3 or tuple(k.shape) != tuple(v.shape):
        raise _fail(f"attention_varlen expects q (Tq, Hq, D) and k, v (Tk, Hkv, D), got "
                    f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    Tq, Hq, D = (int(d) for d in q.shape)
    Tk, Hkv, _ = (int(d) for d in k.shape)
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if len(cu.shape) != 1 or "int32" not in str(cu.dtype):
            raise _fail(f"attention_varlen: {name} must be a 1-D int32 tensor (B + 1,), got "
                        f"shape {tuple(cu.shape)} dtype {cu.dtype}")
    B = int(cu_seqlens_q.shape[0]) - 1
    if int(cu_seqlens_k.shape[0]) - 1 != B or B < 1:
        raise _fail(f"attention_varlen: cu_seqlens_q and cu_seqlens_k must both have B + 1 "
                    f"entries, got {cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")
    if int(k.shape[2]) != D or Hq % Hkv:
        raise _fail(f"attention_varlen: k/v {tuple(k.shape)} do not match q {tuple(q.shape)} "
                    f"(same D, Hq a multiple of Hkv)")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise _fail(f"attention_varlen: {name} must be a positive Python int (the "
                        f"longest sequence), got {m!r}")
    name = _dtype_name(q)
    if _dtype_name(k) != name or _dtype_name(v) != name:
        raise _fail(f"attention_varlen: q, k, v must share one dtype, got {q.dtype}, "
                    f"{k.dtype}, {v.dtype}")
    return Tq, Tk, B, Hq, Hkv, D, max_seqlen_q, max_seqlen_k, name


def attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             causal=False, scale=None, *, schedule=None, BN=None, stages=2,
                             pin_overlap=False, rescale_threshold=RESCALE_THRESHOLD,
                             consumers=None):
    """``(o, lse)`` of the packed variable-length forward (no autograd): ``o (Tq, Hq, D)``,
    ``lse (Hq, Tq)`` float32 (``-inf`` for rows of a sequence without keys)."""
    Tq, Tk, B, Hq, Hkv, D, max_q, _, name = _varlen_shapes(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    sc = 1.0 / math.sqrt(D) if scale is None else float(scale)
    k_ = _varlen(Tq, Tk, B, Hq, Hkv, D, max_q, name, bool(causal), sc,
                 _schedule(schedule), BN, stages,
                 *_check_opts(pin_overlap, rescale_threshold), consumers)
    return k_(*_contiguous(q, k, v, cu_seqlens_q, cu_seqlens_k))


@functools.lru_cache(maxsize=128)
def _differentiable_varlen(Tq, Tk, B, Hq, Hkv, D, max_q, max_k, dtype, causal, scale, schedule,
                           BN, stages, pin_overlap=False, rescale_threshold=RESCALE_THRESHOLD,
                           consumers=None):
    """The varlen forward wrapped with the varlen backward pair
    (``build_attention_backward_varlen``: the deterministic dQ / dK-dV kernels) by
    ``differentiable_kernel`` (saved ``q, k, v, cu_q, cu_k`` and ``o, lse``; gradients of
    ``q, k, v``), or with ``NoBackward`` at a head dim the backward refuses (256)."""
    fwd = _varlen(Tq, Tk, B, Hq, Hkv, D, max_q, dtype, causal, scale, schedule, BN, stages,
                  pin_overlap, rescale_threshold, consumers)
    bwd_mod = _bwd_module()
    if bwd_mod is None:
        return fwd
    from pyptx.autodiff import differentiable_kernel

    if D in BACKWARD_HEAD_DIMS:
        bwd = bwd_mod.build_attention_backward_varlen(Tq, Tk, B, Hq, Hkv, D, max_q, max_k,
                                                      dtype=dtype, causal=causal, scale=scale)
    else:
        bwd = NoBackward(fwd, D, 5)
    return differentiable_kernel(fwd, bwd, save_for_backward=[0, 1, 2, 3, 4],
                                 save_outputs=[0, 1], num_grad_inputs=3)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     causal=False, scale=None, *, schedule=None, BN=None, stages=2,
                     pin_overlap=False, rescale_threshold=RESCALE_THRESHOLD, consumers=None):
    """Flash attention over packed sequences (the flash-attention packages' layout):
    ``q (Tq, Hq, D)``, ``k, v (Tk, Hkv, D)``, ``cu_seqlens_q/k`` int32 ``(B + 1,)`` on the
    device (sequence ``b`` is rows ``cu[b]:cu[b+1]``; empty sequences allowed),
    ``max_seqlen_q/k`` Python ints (the grids' sizes: no host sync, so the call can be
    captured in a CUDA graph). ``causal`` is top-left aligned per sequence. Returns ``o (Tq,
    Hq, D)``, differentiable in ``q, k, v`` (torch autograd, ``jax.grad``) at head dims 64
    and 128 through the deterministic varlen backward pair (flash_attention_bwd.py,
    ``build_attention_backward_varlen``); at head dim 256 there is no backward: torch inputs
    that require grad raise ``ConfigError`` here, and ``jax.grad`` raises ``ConfigError``
    (use ``attention_varlen_forward`` for inference). ``Tq``/``Tk`` should equal
    ``cu_seqlens_q/k[-1]``: rows past the last sequence get no output and no gradient. The
    tile options are ``attention_varlen_forward``'s."""
    Tq, Tk, B, Hq, Hkv, D, max_q, max_k, name = _varlen_shapes(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    sc = 1.0 / math.sqrt(D) if scale is None else float(scale)
    fn = _differentiable_varlen(Tq, Tk, B, Hq, Hkv, D, max_q, max_k, name, bool(causal), sc,
                                _schedule(schedule), BN, stages,
                                *_check_opts(pin_overlap, rescale_threshold), consumers)
    _refuse_grad("attention_varlen", D, (q, k, v), fn)
    return fn(*_contiguous(q, k, v, cu_seqlens_q, cu_seqlens_k))[0]


def reference(q, k, v, causal=False, scale=None):
    """float64 ``(o, lse)`` of dense attention (torch tensors, ``(B, S, H, D)`` layout)."""
    import torch

    B, S, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    qd = q.double().transpose(1, 2)
    kd = k.double().transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    vd = v.double().transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    s = (qd @ kd.transpose(-1, -2)) * sc
    if causal:
        i = torch.arange(S, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    o = (p @ vd).transpose(1, 2)
    return o, lse


def reference_varlen(q, k, v, cu_q, cu_k, causal=False, scale=None):
    """float64 ``(o, lse)`` of packed attention, sequence by sequence."""
    import torch

    cq, ck = cu_q.tolist(), cu_k.tolist()
    Tq, Hq, D = q.shape
    o = torch.zeros(Tq, Hq, D, dtype=torch.float64, device=q.device)
    lse = torch.full((Hq, Tq), float("-inf"), dtype=torch.float64, device=q.device)
    for bi in range(len(cq) - 1):
        a, e, ka, ke = cq[bi], cq[bi + 1], ck[bi], ck[bi + 1]
        if e == a or ke == ka:
            continue
        ob, lb = reference(q[None, a:e], k[None, ka:ke], v[None, ka:ke], causal, scale)
        o[a:e] = ob[0]
        lse[:, a:e] = lb[0]
    return o, lse


def check(o, lse, ref_o, ref_lse, dtype):
    """``(ok, o error, lse error)``. The o error is ``max |o - ref| / max(1, |ref|)``: at most
    2e-2 for bf16 output (P rounded to bf16 before ``P V``: 2**-9 of max |v| <~ 5, plus the
    output's own rounding, 2**-9 relative), 1e-2 for f16 (2**-11 each). lse: relative error
    at most 1e-3 (f32 softmax state, ``ex2``/``lg2.approx`` ~2**-22), -inf exactly where the
    reference is (rows without keys). NaN anywhere (poisoned, unwritten) fails."""
    import torch

    o64 = o.double()
    finite = torch.isfinite(ref_lse)
    if torch.isnan(o64).any():
        return False, float("nan"), float("nan")
    err_o = ((o64 - ref_o).abs() / ref_o.abs().clamp(min=1.0)).max().item() if o.numel() else 0.0
    l64 = lse.double()
    if (torch.isfinite(l64) != finite).any():
        return False, err_o, float("inf")
    err_l = ((l64[finite] - ref_lse[finite]).abs() / ref_lse[finite].abs().clamp(min=1.0)).max().item() \
        if finite.any() else 0.0
    tol = 2e-2 if dtype == "bf16" else 1e-2
    return err_o <= tol and err_l <= 1e-3, err_o, err_l


def check_varlen_backward(q, k, v, cu_q, cu_k, max_q, max_k, causal, tol=2e-2):
    """``(ok, errors)``: ``(dq, dk, dv)`` of ``attention_varlen`` by torch autograd (a random
    ``do``) against float64 autograd of ``reference_varlen``; each error is ``max |g - ref|
    / max(1, max |ref|)`` (a tensor-wide scale, since single gradients can be tiny)."""
    import torch

    xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    do = torch.randn_like(q)
    attention_varlen(*xs, cu_q, cu_k, max_q, max_k, causal=causal).backward(do)
    refs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    o_ref, _ = reference_varlen(*refs, cu_q, cu_k, causal)
    o_ref.backward(do.double())
    errs = {}
    for name, x, r in zip(("dq", "dk", "dv"), xs, refs):
        g, gr = x.grad.double(), r.grad
        errs[name] = ((g - gr).abs().max() / gr.abs().max().clamp(min=1.0)).item()
    return all(e <= tol for e in errs.values()), errs


MAIN_CASES = [
    # B, S, Sk, Hq, Hkv, D, causal, dtype
    (1, 128, 128, 1, 1, 64, False, "bf16"),
    (2, 77, 77, 4, 2, 64, True, "bf16"),
    (2, 200, 200, 4, 4, 128, False, "bf16"),
    (2, 333, 333, 4, 1, 128, True, "bf16"),
    (1, 1, 1, 2, 2, 128, True, "f16"),
    (1, 256, 333, 2, 2, 128, False, "f16"),
    (1, 1000, 1000, 2, 1, 64, True, "f16"),
    (1, 300, 300, 2, 2, 256, True, "bf16"),
]


def main(argv=None) -> int:
    """Correctness checks on the GPU, one PASS/FAIL line each; arguments: schedules to run
    (default: the default schedule), ``persistent`` for the persistent kernel, and the
    tuning options ``pin_overlap`` and ``rescale_threshold=T``."""
    import torch

    torch.manual_seed(0)
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}
    fails = 0
    args = argv or sys.argv[1:]
    schedules = [s for s in args if s in SCHEDULES] or [_schedule(None)]
    persistent = "persistent" in args
    opts = {"pin_overlap": True} if "pin_overlap" in args else {}
    for a in args:
        if a.startswith("rescale_threshold="):
            value = a.split("=", 1)[1]
            opts["rescale_threshold"] = None if value == "none" else float(value)
    otag = "".join(f" {k}={v}" for k, v in opts.items())
    for schedule in schedules:
        for (B, S, Sk, Hq, Hkv, D, causal, dname) in MAIN_CASES:
            q = torch.randn(B, S, Hq, D, device="cuda", dtype=dt[dname])
            k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt[dname])
            v = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt[dname])
            try:
                o, lse = attention_forward(q, k, v, causal=causal, schedule=schedule,
                                           persistent=True if persistent and D <= 128 else None,
                                           **opts)
                torch.cuda.synchronize()
                ok, eo, el = check(o, lse, *reference(q, k, v, causal), dname)
            except Exception as e:  # report and go on: one line per case
                ok, eo, el = False, float("nan"), float("nan")
                print(f"  {type(e).__name__}: {e}"[:400])
            fails += not ok
            tag = (" persistent" if persistent and D <= 128 else "") + otag
            print(f"{schedule}{tag} B{B} S{S} Sk{Sk} H{Hq}/{Hkv} D{D} {'causal' if causal else 'full'} "
                  f"{dname}: o err {eo:.2e} lse err {el:.2e} {'PASS' if ok else 'FAIL'}",
                  flush=True)
        for causal in (False, True):
            lens_q, lens_k = [77, 1, 200, 128], [77, 5, 333, 128]
            cu_q = torch.tensor([0] + list(_cumsum(lens_q)), device="cuda", dtype=torch.int32)
            cu_k = torch.tensor([0] + list(_cumsum(lens_k)), device="cuda", dtype=torch.int32)
            Hq, Hkv, D = 4, 2, 128
            q = torch.randn(sum(lens_q), Hq, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(sum(lens_k), Hkv, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(sum(lens_k), Hkv, D, device="cuda", dtype=torch.bfloat16)
            try:
                o, lse = attention_varlen_forward(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                  causal=causal, schedule=schedule, **opts)
                torch.cuda.synchronize()
                ok, eo, el = check(o, lse, *reference_varlen(q, k, v, cu_q, cu_k, causal), "bf16")
            except Exception as e:
                ok, eo, el = False, float("nan"), float("nan")
                print(f"  {type(e).__name__}: {e}"[:400])
            fails += not ok
            print(f"{schedule}{otag} varlen {lens_q}/{lens_k} H{Hq}/{Hkv} D{D} "
                  f"{'causal' if causal else 'full'}: o err {eo:.2e} lse err {el:.2e} "
                  f"{'PASS' if ok else 'FAIL'}", flush=True)
            try:    # the backward through autograd against float64 autograd
                ok, errs = check_varlen_backward(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                 causal)
            except Exception as e:
                ok, errs = False, {}
                print(f"  {type(e).__name__}: {e}"[:400])
            fails += not ok
            print(f"{schedule}{otag} varlen backward {lens_q}/{lens_k} H{Hq}/{Hkv} D{D} "
                  f"{'causal' if causal else 'full'}: "
                  + " ".join(f"{n} err {x:.2e}" for n, x in errs.items())
                  + f" {'PASS' if ok else 'FAIL'}", flush=True)
    print("all PASS" if not fails else f"{fails} FAIL")
    return 1 if fails else 0


def _cumsum(xs):
    t = 0
    for x in xs:
        t += x
        yield t


if __name__ == "__main__":
    sys.exit(main())
