"""Flash-attention backward on Hopper tensor cores: ``(dq, dk, dv)`` from ``(q, k, v, o, lse, do)``.

Layouts follow the flash-attention packages: ``q``/``o``/``do`` ``(B, S, Hq, D)``,
``k``/``v`` ``(B, Sk, Hkv, D)`` (grouped-query: q head ``h`` reads kv head
``h // (Hq // Hkv)``), ``lse`` ``(B, Hq, S)`` float32 (natural log of the row sums of
``exp(scale * q k^T)``), bf16 or f16, head dim 64 or 128; ``causal`` is top-left aligned
(key ``j`` is allowed for query ``i`` iff ``j <= i``). Two kernels, no atomics, so the
result is deterministic:

* **dQ kernel** (one CTA per batch, q head and 128 query rows): warpgroup 0 produces
  (bulk tensor copies of Q and dO once, then K and V blocks of ``BKV`` rows through an
  mbarrier ring, ``pyptx.pipeline.Pipeline``); warpgroups 1-2 own 64 query rows each.
  They first compute ``delta = rowsum(do * o)`` (written with ``lse * log2 e`` to a
  padded scratch, STATS, for the other kernel), then
  per kv block recompute ``S = Q K^T`` and ``dP = dO V^T`` (wgmma from shared memory),
  ``P = exp2(S * scale * log2 e - lse * log2 e)``, ``dS = P * (dP - delta)`` and
  ``dQ += dS K`` with dS taken from registers (the accumulator layout of a 16-bit
  m64 fragment is the A-operand layout, so packing pairs is the whole conversion).
* **dK/dV kernel** (one CTA per batch, kv head and 128 kv rows): the same roles; the
  consumers own 64 kv rows each and loop over every q head of the kv head's group and
  every q block, working in the transposed frame: ``S^T = K Q^T``, ``dP^T = V dO^T``,
  ``dV += P^T dO`` and ``dK += dS^T Q`` with P^T/dS^T from registers and Q/dO read as
  MN-major B operands (the same shared tile serves as K-major and MN-major operand).
  Sums over q heads and blocks stay in registers.

Loads go through rank-4 tensor maps over ``(B, S, H, D)``, so rows past ``S`` read as
zeros; scores of rows/columns past the sequence ends and above the causal diagonal are
masked to ``P = 0``; gradients are stored with per-row predicates. Causal CTAs skip the
blocks that lie wholly above the diagonal.

``build_attention_backward`` returns one kernel-like object ``bwd(q, k, v, o, lse, do,
dlse) -> (dq, dk, dv)`` (``dlse`` ignored) for ``pyptx.differentiable_kernel``;
``attention_backward`` is the direct call for torch tensors or JAX arrays.
Two schedules: the default *fast* one (the block's ``(lse * log2 e, delta)`` pairs copied
into the ring stage, masks only on edge and diagonal blocks, a block's products issued
before the previous block's stage is released) and a *safe* one (``safe=True`` or
``PYPTX_ATTN_BWD_SAFE=1``: every block masked, stats read from global memory, each
block's products waited for before its stage is released) to bisect a failure; with it,
``PYPTX_ATTN_BWD_SYNC=1`` also makes the producer wait for each stage's release before
loading the next block. The dK/dV kernel takes q blocks of 64 rows by default and, at
D=128, waits for a block's dK product before the next block's (at D=128 the overlapped
schedule has too few registers: ptxas serialises its wgmma, C7512). Measured on the H100
(session 11, whole-program compile): 64 rows +5-10% over 32 at D=64; 64 rows without the
overlap +5-10% over 32 with it at D=128. ``dkdv_bq=32`` and ``dkdv_overlap`` are the other
options: ``build_dkdv`` and docs/dev/attention-backward.md.
``fused_bq=128`` (D=64, opt-in): one kernel instead of the pair (``build_fused``: five
products per block pair, dQ added by bulk tile reductions, in a fixed order with
``dq_ordered``). ``dkdv_bq=128`` (D=128, opt-in, with ``atomic_dq``, ``dq_bulk`` and
``dq_ordered``): the ordered bulk-dQ dK/dV kernel with 128-row q blocks (right on the H100,
but slower than the 64-row default there: 500/443/533/490 vs 520/460/540/510 TFLOP/s).

Packed variable-length batches (``attention_varlen``'s layout: ``(T, H, D)`` tensors,
``cu_seqlens`` int32 ``(B + 1,)`` on the device, ``lse (Hq, Tq)``):
``build_attention_backward_varlen`` returns ``AttentionBackwardVarlen``, ``bwd(q, k, v,
cu_q, cu_k, o, lse, do, dlse) -> (dq, dk, dv)``, the same deterministic pair
(``build_dq_varlen``, ``build_dkdv_varlen``) through rank-3 tensor maps, with each CTA's
sequence bounds read on the device, CTAs past their sequence's end returning before any
barrier, every mask taken from the sequence's lengths (``P = 0`` by a select for rows of the
next sequence; ``delta`` selected to 0 for query columns past the end, whose stats may be
anything), stores predicated per row, and a STATS scratch whose per-sequence rows start
16-byte aligned (``padded_varlen``). The atomic, bulk, ordered, fused and converting modes
are refused there (``ConfigError``).
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import sys
from types import SimpleNamespace

from pyptx import Tile, kernel, ptx, reg, smem
from pyptx.errors import ConfigError
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.pipeline import BarrierArray, Pipeline
from pyptx.source import where_outside
from pyptx.types import b16, b32, bf16, f16, f32, pred, s32, u32, u64
from pyptx.warpspec import SLAB_BYTES, Roles, ring_base, thread_ids
from pyptx_kernels._common import PACKAGE_DIR

LOG2E = 1.4426950408889634
SMEM_LIMIT = 227 * 1024 - 256
BM = 128          # rows a CTA owns (two consumer warpgroups of 64)
DKDV_BQ = 64     # q rows per dK/dV block (build_dkdv's default BQ)
THREADS = 384     # producer warpgroup + two consumers
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


# ------------------------------------------------------------------ trace-time helpers
def _ex2(x):
    r = reg.scalar(f32)
    ptx.inst.ex2.approx.ftz.f32(r, x)
    return r


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


def _load_slabs(dst, tmap, d_slabs, head, row0, batch, rows, bar):
    """One bulk tensor copy per 64-column slab of a ``rows x D`` tile of a (B, S, H, D) tensor."""
    for i in range(d_slabs):
        ptx.tma.load_tile(dst + i * rows * 128 if i else dst, tmap, (64 * i, head, row0, batch), bar)


def _load_pair(dst, first, second, offset, d_slabs, head, row0, batch, rows, bar):
    """``rows`` rows from ``row0`` of tensors ``first`` and ``second`` (head ``head`` of
    batch ``batch``) into ``dst`` and ``dst + offset``, completing on ``bar``."""
    first_map = ptx.tma.tensormap_ptr(first.tmap)
    second_map = ptx.tma.tensormap_ptr(second.tmap)
    _load_slabs(dst, first_map, d_slabs, head, row0, batch, rows, bar)
    _load_slabs(dst + offset, second_map, d_slabs, head, row0, batch, rows, bar)


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


# ------------------------------------------------------------------ dQ kernel (+ stats)
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


def _dq_producer(tid, head_bar, head_bytes, pipe, n_kv, base, stage_bytes, K, V, sync,
                 load_head, load_kv):
    """The dQ kernels' producer (thread 0): the Q/dO head tile (``load_head(bar)``), then
    the K/V blocks ``0..n_kv`` through the ring (``load_kv(stage, k_map, v_map, j, bar)``:
    the dense kernel's 4-D copies or the packed kernel's 3-D ones)."""
    with ptx.if_(tid == 0):
        hbar = head_bar.at(0)
        ptx.mbarrier.arrive_expect_tx(hbar, head_bytes)
        load_head(hbar)
        k_map = ptx.tma.tensormap_ptr(K.tmap)
        v_map = ptx.tma.tensormap_ptr(V.tmap)
        st = pipe.producer_state()
        for j in ptx.loop(0, n_kv):
            _fill_stage(pipe, st, stage_bytes, stage_bytes, base, head_bytes,
                        lambda sb, bar, j=j: load_kv(sb, k_map, v_map, j, bar), sync)


def _dq_consumer(tid, wg, q0, n_q, n_keys, n_kv, *, causal, safe, dt, D, BKV, c1, pipe,
                 head_bar, base, head_bytes, stage_bytes, q_tile, k_tile, k_mn, stats, limits,
                 store):
    """A dQ consumer warpgroup (dense and packed): its 64 q rows from ``q0`` (valid below
    ``n_q``), ``stats(qrow, valid, lane) -> (delta, nlse2, out)`` its rows' stats,
    ``limits(qrow)`` the last allowed key of each of its two rows; then the k-loop over
    ``n_kv`` K/V blocks (S and dP issued, P = exp2(S c1 - lse2), the mask by select where
    a block reaches past ``n_keys`` keys (an int or a register) or the diagonal, dS,
    dQ += dS K, the stage releases) and ``store(dq_acc, out, qrow, valid, col0)``."""
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
    for j in ptx.loop(0, n_kv):
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
            ptx.inst.fma.rn.f32(s_acc[i], s_acc[i], c1, nlse2[dr // 8])
            ptx.inst.ex2.approx.ftz.f32(s_acc[i], s_acc[i])
        kv0 = reg.from_(j * BKV + col0, s32)
        if safe:
            need = None
        elif causal:    # the keys' end or the diagonal crosses the block
            need = _or(j * BKV + BKV > n_keys, j * BKV + (BKV - 1) > q0)
        else:
            need = j * BKV + BKV > n_keys
        with _maybe_if(need):
            room = [lim[0] - kv0, lim[1] - kv0]    # column offset c allowed iff c <= room
            for i in range(len(s_acc)):
                dr, dc = Accumulator.coord(i)
                ptx.inst.selp.f32(s_acc[i], s_acc[i], 0.0, room[dr // 8] >= dc)
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


def build_dq(B, S, Hq, Hkv, D, *, Sk=None, dtype="bf16", causal=False, scale=None, BKV=64,
             stages=None, sync=None, safe=None):
    """The dQ kernel: ``(Q, K, V, O, LSE, DO) -> (DQ, STATS)``. STATS ``(B, Hq, padded(S), 2)``
    f32 holds ``(lse * log2 e, delta = rowsum(do * o))`` per query row (zeros past ``S``),
    which the dK/dV kernel reads. ``safe``: mask every block and wait for each block's
    products before the next (the simplest schedule; default from ``PYPTX_ATTN_BWD_SAFE``)."""
    Sk, dt, scale, safe, sync, G, Sp = _common_options(B, S, Hq, Hkv, D, Sk, dtype, scale,
                                                       safe, sync)
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
    box_q = {"box": (1, BM, 1, 64), "swizzle": "128B"}
    box_k = {"box": (1, BKV, 1, 64), "swizzle": "128B"}
    qspec = Tile(B, S, Hq, D, dt)
    kspec = Tile(B, Sk, Hkv, D, dt)

    def dq_kernel(Q, K, V, OUT, LSE, DO, DQ, STATS):
        base = ring_base("smem")
        pipe = Pipeline(stages, consumer_arrivals=2)
        head_bar = BarrierArray(1, name="head_bar")
        tid, wg = thread_ids()
        qb = reg.from_(ptx.special.ctaid.x(), u32)
        if causal:  # the longest rows (most kv blocks) first: a shorter tail
            qb = (-(-S // BM) - 1) - qb
        hq = reg.from_(ptx.special.ctaid.y(), u32)
        b = reg.from_(ptx.special.ctaid.z(), u32)
        hk = hq // G if G > 1 else hq
        q0 = qb * BM
        pipe.init(pred=tid == 0)
        head_bar.init(1, pred=tid == 0)
        ptx.bar_sync(0)
        if causal:  # blocks wholly above the diagonal are skipped
            n_kv = _min_u32(reg.from_((q0 + (BM - 1)) // BKV + 1, u32), reg.scalar(u32, init=num_kv))
        else:
            n_kv = num_kv
        roles = Roles(wg, PROD_REGS)
        # ------------------------------------------------------------ producer
        def load_kv(sb, k_map, v_map, j, bar):
            _load_slabs(sb, k_map, slabs, hk, j * BKV, b, BKV, bar)
            _load_slabs(sb + k_tile.nbytes, v_map, slabs, hk, j * BKV, b, BKV, bar)

        _dq_producer(tid, head_bar, head_bytes, pipe, n_kv, base, stage_bytes, K, V, sync,
                     lambda hbar: _load_pair(base, Q, DO, q_tile.nbytes, slabs, hq, q0, b, BM,
                                             hbar), load_kv)
        # ------------------------------------------------------------ consumers
        roles.consumers(CONS_REGS)

        def stats(qrow, valid, lane):
            po, pdo, plse, pstats, pdq = ptx.global_ptrs(OUT, DO, LSE, STATS, DQ)
            return (*_row_stats(po, pdo, plse, pstats, b, hq, qrow, valid, lane, S, Sp, Hq, D,
                                dt), pdq)

        def limits(qrow):   # causal / ragged
            if causal:
                return [reg.from_(_min_u32(qrow + r, reg.scalar(u32, init=Sk - 1)), s32)
                        for r in (0, 8)]
            return [reg.scalar(s32, init=Sk - 1) for r in (0, 8)]

        _dq_consumer(tid, wg, q0, S, Sk, n_kv, causal=causal, safe=safe, dt=dt, D=D, BKV=BKV,
                     c1=c1, pipe=pipe, head_bar=head_bar, base=base, head_bytes=head_bytes,
                     stage_bytes=stage_bytes, q_tile=q_tile, k_tile=k_tile, k_mn=k_mn,
                     stats=stats, limits=limits,
                     store=lambda acc, pdq, qrow, valid, col0: _store_rows(
                         acc, pdq, qrow, valid, Hq, D, hq, b, S, col0, scale, dt))
        roles.end()
        ptx.ret()

    name = (f"attn_bwd_dq_{dt.name}_d{D}_h{Hq}x{Hkv}{'_causal' if causal else ''}"
            f"{'_safe' if safe else ''}{f'_bkv{BKV}' if BKV != 64 else ''}")
    return kernel(in_specs=(qspec, kspec, kspec, qspec, Tile(B, Hq, S, f32), qspec),
                  out_specs=(qspec, Tile(B, Hq, Sp, 2, f32)), grid=(-(-S // BM), Hq, B),
                  block=(THREADS, 1, 1), smem=smem_total, maxnreg=168,
                  tma={"Q": box_q, "DO": box_q, "K": box_k, "V": box_k}, name=name)(dq_kernel)


def _or(p, q):
    r = reg.scalar(pred)
    ptx.inst("or.pred")(r, p, q)
    return r


def _maybe_if(p):
    from contextlib import nullcontext

    return nullcontext() if p is None else ptx.if_(p)


# ------------------------------------------------------------------ dK/dV kernel
def dq_accumulator_width(D, bulk):
    """Columns per row of the atomic modes' f32 dQ accumulator: ``D``, or 128 for the bulk
    reductions (D=64: the two consumer warpgroups' partial sums side by side, added by the
    conversion kernel in a fixed order)."""
    return 128 if bulk else D


def early_convert_share(S, Sk, Hq, Hkv):
    """``convert_lag``: the 64-row q blocks each dK/dV CTA's producer warps convert (the kv
    head's ``(Hq / Hkv) * ceil(S / 64)`` blocks over its ``ceil(Sk / 128)`` CTAs)."""
    return -(-(Hq // Hkv) * -(-S // 64) // -(-Sk // BM))


def default_convert_lag(Sk, num_sms=132):
    """A ``convert_lag`` whose kv heads finished long before: two waves of them, counted in
    kv heads of ``ceil(Sk / 128)`` CTAs."""
    return -(-2 * num_sms // -(-Sk // BM))


def default_stats_lead(Sk, num_sms=132):
    """A ``stats_lead`` whose kv heads start a whole CTA time after the CTAs that compute their
    stats: a wave of kv heads of ``ceil(Sk / 128)`` CTAs, plus one."""
    return -(-num_sms // -(-Sk // BM)) + 1


def resolve_stats_lead(fn, stats_lead, Sk, num_sms, dq_ordered, safe, BQ, causal):
    """``stats_lead`` as an int: ``"auto"`` is ``default_stats_lead`` where it applies (the
    ordered bulk-dQ dK/dV kernel, 64-row q blocks, not safe) and pays (full attention: the
    causal grid's short CTAs idle their SMs until their share of stats is done; H100,
    paired A/B, 0.991x at S=4096) and 0 elsewhere; an int is refused (``ConfigError``)
    where it does not apply."""
    applies = dq_ordered and not safe and BQ in (None, 64)
    if stats_lead == "auto":
        return default_stats_lead(Sk, num_sms) if applies and not causal else 0
    if stats_lead and not (isinstance(stats_lead, int) and not isinstance(stats_lead, bool)
                           and stats_lead > 0 and applies):
        raise _fail(f"{fn}: stats_lead (a positive int or 'auto') needs the ordered bulk-dQ dK/dV "
                    f"kernel (atomic_dq, dq_bulk, dq_ordered) with 64-row q blocks, not safe; "
                    f"got stats_lead={stats_lead!r}, dq_ordered={dq_ordered!r}, safe={safe!r}, "
                    f"BQ={BQ!r}")
    return int(stats_lead or 0)


RELEASE_ARRIVALS = 256  # dK/dV ring: every consumer thread arrives (2 warpgroups x 128)


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
                   stats_row, q_block, load_q, before=None):
    """The dK/dV kernels' producer (thread 0): the K/V head tile (``load_head(bar)``), then
    for each q head ``hk * G + g`` of the kv head the Q/dO blocks ``qb0..num_q`` through the
    ring (``q_block(step)`` the block of a step, ``load_q(stage, q_map, do_map, hq, qb, bar)``
    the dense kernel's 4-D copies or the packed kernel's 3-D ones) with, fast schedule, the
    block's ``(lse2, delta)`` rows from ``stats_row(hq)`` by a bulk copy. ``before()``: after
    the maps, before the loop."""
    with ptx.if_(tid == 0):
        hbar = head_bar.at(0)
        ptx.mbarrier.arrive_expect_tx(hbar, head_bytes)
        load_head(hbar)
        q_map = ptx.tma.tensormap_ptr(Q.tmap)
        do_map = ptx.tma.tensormap_ptr(DO.tmap)
        if before is not None:
            before()
        st = pipe.producer_state()
        for g in ptx.loop(0, G):
            hq = hk * G + g
            srow = stats_row(hq)
            for qstep in ptx.loop(qb0, num_q):
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
                q_mn, pipe, mask, fix_delta=None, after_ds=None, after_dk=None):
    """One q block of a dK/dV consumer (the plain schedule, dense and packed): S^T and dP^T
    issued, P^T = exp2(S^T c1 - lse2) masked (``mask``), dV += P^T dO, dS^T = P^T (dP^T -
    delta) (``fix_delta(dl, q0)`` may select deltas first), dK += dS^T Q, the stage
    released (``overlap``: the previous one, once this block's S^T is done). Hooks of the
    dense kernel's dQ modes: ``after_ds()`` before dK's product, ``after_dk()`` after it."""
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

    def stats(which):
        """Column offset -> lse2 (which=0, negated) or delta (1) of this thread's
        columns (loaded when needed: fewer live registers)."""
        out = {}
        for blk in range(BQ // 8):
            v4 = reg.array(f32, 4)
            if safe:
                ptx.inst.ld.global_.nc.v4.f32(v4, ptx.addr(src, 64 * blk))
            else:
                ptx.inst.ld.shared.v4.f32(v4, ptx.addr(src, 64 * blk))
            for e in (0, 1):
                out[8 * blk + e] = -v4[2 * e] if which == 0 else v4[2 * e + 1]
        return out

    nl2 = stats(0)
    ptx.wgmma.wait_group(1)             # S^T (and the previous block's dK) done
    if overlap:
        with ptx.if_(c.has_prev != 0):
            _release_stage(pipe, c.rel)
            c.rel.advance()
    for i in range(len(s_acc)):         # P^T = exp2(S^T * c1 - lse2), in place
        dc = Accumulator.coord(i)[1]
        ptx.inst.fma.rn.f32(s_acc[i], s_acc[i], c1, nl2[dc])
        ptx.inst.ex2.approx.ftz.f32(s_acc[i], s_acc[i])
    _pt_dv(c, s_acc, q0, domn, mask, BQ, D, dt, q_mn)
    dl = stats(1)
    if fix_delta is not None:
        fix_delta(dl, q0)
    ptx.wgmma.wait_group(1)             # dP^T done
    for i in range(len(dp_acc)):        # dS^T = P^T * (dP^T - delta), in place
        dc = Accumulator.coord(i)[1]
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


def _check_dq_modes(fn, atomic_dq, dq_bulk, dq_ordered):
    """``ConfigError`` (naming ``fn``) for a dQ mode without the one it builds on."""
    if dq_bulk and not atomic_dq:
        raise _fail(f"{fn}: dq_bulk=True needs atomic_dq=True")
    if dq_ordered and not dq_bulk:
        raise _fail(f"{fn}: dq_ordered=True needs dq_bulk=True")


def _check_num_sms(fn, num_sms):
    """``ConfigError`` (naming ``fn``) unless ``num_sms`` is a positive int."""
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1:
        raise _fail(f"{fn}: num_sms must be a positive int, got {num_sms!r}")


def build_dkdv(B, S, Hq, Hkv, D, *, Sk=None, dtype="bf16", causal=False, scale=None, BQ=None,
               stages=None, sync=None, safe=None, atomic_dq=False, overlap=None, dq_bulk=False,
               dq_ordered=False, num_sms=132, dq_convert=False, convert_lag=0, stats_lead=0,
               trace=False):
    """The dK/dV kernel: ``(Q, K, V, DO, STATS) -> (DK, DV)`` (STATS from ``build_dq``).

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
    # a consumer warpgroup's dQ columns: bulk: 64 (D=128: its half of D, all kv rows;
    # D=64: all of D over its own 64 kv rows, a partial sum in columns 64w.. of DQACC)
    dq_cols = 64 if D == 128 or dq_bulk else D
    if wide:        # 64 q rows x all of D each, over Q and dO once both are read
        dq_cols = D
    dq_bytes = 2 * (dq_cols // 32) * SLAB_BYTES if dq_bulk else 0
    dq_width = dq_accumulator_width(D, dq_bulk)
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
              and num_kv <= ROTATE_MAX_KV)
    reverse = dq_ordered and (causal or rotate)     # the predecessor kv block is kb + 1
    n_main = num_kv * Hkv * B
    units = B * Hq * sem_q                          # dq_convert's 64-row q blocks
    per_head = G * sem_q                            # ... of one kv head
    share = early_convert_share(S, Sk, Hq, Hkv)     # convert_lag: q blocks per CTA
    lag_applies = (dq_convert and not causal and dq_accumulator_width(D, dq_bulk) == D
                   and share <= 2)
    if convert_lag == "auto":   # where it applies, none elsewhere
        convert_lag = default_convert_lag(Sk, num_sms) if lag_applies else 0
    if convert_lag and not (isinstance(convert_lag, int) and convert_lag > 0 and lag_applies):
        raise _fail(f"build_dkdv: convert_lag (a positive int) needs dq_convert, full "
                    f"attention, a dQ accumulator of width D (D=128) and at most two q blocks "
                    f"per dK/dV CTA, got convert_lag={convert_lag!r}, dq_convert={dq_convert!r}"
                    f", causal={causal!r}, D={D}, {share} q blocks per CTA")
    lag = int(convert_lag or 0)
    lead = resolve_stats_lead("build_dkdv", stats_lead, Sk, num_sms, dq_ordered, safe, BQ,
                              causal)
    conv0 = max(0, B * Hkv - lag) * per_head if lag else 0  # the converter CTAs' first block
    n_conv = min(units - conv0, num_sms) if dq_convert else 0
    c1 = scale * LOG2E
    box_kv = {"box": (1, BM, 1, 64), "swizzle": "128B"}
    box_q = {"box": (1, BQ, 1, 64), "swizzle": "128B"}
    qspec = Tile(B, S, Hq, D, dt)
    kspec = Tile(B, Sk, Hkv, D, dt)

    def q_block(qb, kb):
        """The q block of step ``qb`` of kv block ``kb`` (rotated under ``rotate``)."""
        if not rotate:
            return qb
        r = qb + kb * (BM // BQ)
        wrapped = reg.scalar(u32)
        ptx.inst.selp.u32(wrapped, r - num_q, r, r >= num_q)
        return wrapped

    def dq_rank(qb, kb):
        """The place of kv block ``kb`` among the kv blocks adding into q block ``qb`` (the
        ordered dQ mode): the adds of a q block come in rank order 0, 1, ..."""
        if causal:      # kv blocks jmax, jmax - 1, ..., 0 (each one step behind the last)
            return _min_u32((qb * BQ + (BQ - 1)) // BM, num_kv - 1) - kb
        if rotate:      # kv block j reaches q block i at step (i - 2j) % num_q
            step = qb + num_q - kb * (BM // BQ)
            wrapped = reg.scalar(u32)
            ptx.inst.selp.u32(wrapped, step - num_q, step, step >= num_q)
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
        if not n_conv:
            lin = lin + num_kv * (reg.from_(ptx.special.ctaid.y(), u32)
                                  + Hkv * reg.from_(ptx.special.ctaid.z(), u32))
        return ptx.addr(reg.from_(lin * 4 + col, u64) * 4 + pt)

    def _dq_writer(DQACC, SEM, bufs, kb, hk, b, qb0, dq_full, dq_empty, pipe=None, TRACE=None):
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
        for g in ptx.loop(0, G):
            hq = hk * G + g
            for qstep in ptx.loop(qb0, num_q):
                qb = q_block(qstep, kb)
                rank = dq_rank(qb, kb)
                cell = reg.from_(((b * Hq + hq) * sem_q + qb) * 2, u64) * 4 + psem

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
                            at = (32 * j, hq, qb * BQ + 64 * w, b)
                        else:
                            src = bufs + (w * (dq_bytes // 2) + j * SLAB_BYTES)
                            at = (w * dq_cols + 32 * j, hq, qb * BQ, b)
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
        finish last are shared by all the converters), ``CONVERT_BLOCKS`` at a time, by 256
        threads, ``D / 32`` eight-column pieces each per block, every load of the turn
        issued before the first conversion. Thread ``32 j`` waits (acquire) until block j's
        counter holds every add (causal: kv blocks 0..min(qb / 2, num_kv - 1))."""
        tid = reg.from_(ptx.special.tid.x(), u32)
        pa, psem, pq = ptx.global_ptrs(DQACC, SEM, DQ)
        now = reg.scalar(u32)
        started = _now() if TRACE is not None else None
        waited = reg.scalar(u32, init=0) if TRACE is not None else None
        mine = (units - conv0 + (n_conv - 1) - c) // n_conv
        with ptx.if_(tid < 256):
            for j0 in ptx.loop(0, mine, CONVERT_BLOCKS):
                got = []
                for j in range(CONVERT_BLOCKS):
                    u = c + (j0 + j) * n_conv
                    if conv0:
                        u = u + conv0
                    live = j0 + j < mine
                    bh = u // sem_q
                    qb = u - bh * sem_q
                    adds = _min_u32(qb // 2, num_kv - 1) + 1 if causal else num_kv
                    with ptx.if_((tid == 32 * j) & live):
                        _spin_until(reg.from_(u, u64) * 8 + psem, adds, now, waited)
                    got.append((live, bh, qb))
                ptx.bar_sync(1, 256)
                loads = []
                for live, bh, qb in got:
                    b = bh // Hq
                    hq = bh - b * Hq
                    for i in range(D // 32):
                        v = tid + 256 * i
                        s = qb * 64 + v // (D // 8)
                        col = (v % (D // 8)) * 8
                        row = reg.from_((b * S + s) * Hq + hq, u64)
                        src = row * (dq_width * 4) + reg.from_(col * 4, u64) + pa
                        ok = (s < S) & live
                        x = reg.array(f32, 8 * dq_width // D)
                        for r in x:     # rows not converted: defined, never stored
                            ptx.inst.mov.f32(r, 0.0)
                        for h in range(len(x) // 4):   # 8 columns; a second partial sum D on
                            ptx.inst.ld.global_.v4.f32(
                                list(x)[4 * h:4 * h + 4],
                                ptx.addr(src, 16 * (h % 2) + 4 * D * (h // 2)), pred=ok)
                        loads.append((x, row * (D * 2) + reg.from_(col * 2, u64) + pq, ok))
                for x, dst, ok in loads:
                    if dq_width != D:
                        for m in range(8):
                            ptx.inst.add.f32(x[m], x[m], x[m + 8])
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
        thread 64 waits (acquire) until a block's counter holds all ``num_kv`` adds, then each
        thread converts 4 columns of a row per step, one load in flight: the producer's 24
        registers do not hold two (ptxas spills)."""
        t = reg.from_(ptx.special.tid.x(), u32) - 64
        head = cta // num_kv
        pa, psem, pq = ptx.global_ptrs(DQACC, SEM, DQ)
        now = reg.scalar(u32)
        with ptx.if_(head >= lag):
            for j in range(share):
                within = (cta - head * num_kv) * share + j
                u = (head - lag) * per_head + within
                live = within < per_head
                with ptx.if_((t == 0) & live):
                    _spin_until(reg.from_(u, u64) * 8 + psem, num_kv, now)
                ptx.bar_sync(4, 64)
                bh = u // sem_q
                b = bh // Hq
                first = (b * S + (u - bh * sem_q) * 64) * Hq + (bh - b * Hq)    # (b, s, hq) row
                for i in ptx.loop(0, D // 4):
                    v = t + 64 * i
                    ok = ((u - bh * sem_q) * 64 + v // (D // 4) < S) & live
                    row = reg.from_(first + (v // (D // 4)) * Hq, u64)
                    col = (v % (D // 4)) * 4
                    x = reg.array(f32, 4)
                    for r in x:     # rows past S: defined, never stored
                        ptx.inst.mov.f32(r, 0.0)
                    ptx.inst.ld.global_.v4.f32(list(x), ptx.addr(
                        row * (D * 4) + reg.from_(col * 4, u64) + pa), pred=ok)
                    packed = reg.array(b32, 2)
                    _pack(packed, x, dt)
                    ptx.inst.st.global_.v2.b32(
                        ptx.addr(row * (D * 2) + reg.from_(col * 2, u64) + pq), packed, pred=ok)

    def _flag(psem, head):
        """The ``stats_lead`` flag of kv head ``head`` (launch order): the spare second cell
        of its first q head's first q block."""
        return reg.from_(G * head * sem_q * 2 + 1, u64) * 4 + psem

    def _lead_stats(OUT, DO, LSE, STATS, SEM, head, p):
        """Warps 2 and 3 (``stats_lead``): CTA ``p`` of kv head ``head`` (launch order)
        writes rows ``p * chunk ..`` of the ``G * Sp`` STATS rows of kv head ``head + lead``,
        ``D / 8`` lanes per row, 16 bytes of O and dO each (``_prep_stats``'s math), then
        counts itself on that head's flag (release, after a proxy fence: the producers read
        STATS with bulk copies)."""
        t = reg.from_(ptx.special.tid.x(), u32) - 64
        lanes = D // 8
        per = 64 // lanes                   # rows per turn
        chunk = math.ceil(math.ceil(G * Sp / num_kv) / per) * per
        target = head + lead
        po, pdo, plse, pstats, psem = ptx.global_ptrs(OUT, DO, LSE, STATS, SEM)
        with ptx.if_(target < B * Hkv):
            bt = target // Hkv
            for k in ptx.loop(0, chunk // per):
                r = p * chunk + k * per + t // lanes
                live = r < G * Sp
                g = r // Sp
                s = r - g * Sp
                hq = (target - bt * Hkv) * G + g
                ok = live & (s < S)
                off = reg.from_(((bt * S + s) * Hq + hq) * D + (t % lanes) * 8, u64) * 2
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
        with ptx.if_((t == 0) & (target < B * Hkv)):
            ptx.inst("red.release.gpu.global.add.u32")(ptx.addr(_flag(psem, target)), 1)

    def dkdv_kernel(Q, K, V, DO, STATS, DQACC, SEM, DK, DV, DQ=None, TRACE=None, OUT=None,
                    LSE=None):
        if n_conv:      # the last n_conv CTAs of the 1-D grid convert dQ
            with ptx.if_(reg.from_(ptx.special.ctaid.x(), u32) >= n_main):
                _converter(DQACC, SEM, DQ, reg.from_(ptx.special.ctaid.x(), u32) - n_main,
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
        if n_conv:      # 1-D grid, the 3-D grid's order
            cta = reg.from_(ptx.special.ctaid.x(), u32)
            kb = cta % num_kv
            if reverse:
                kb = (num_kv - 1) - kb
            hk = (cta // num_kv) % Hkv
            b = cta // (num_kv * Hkv)
        else:
            kb = reg.from_(ptx.special.ctaid.x(), u32)
            if reverse:     # launched last kv block first: a block's turn follows kb + 1's
                kb = (num_kv - 1) - kb
            hk = reg.from_(ptx.special.ctaid.y(), u32)
            b = reg.from_(ptx.special.ctaid.z(), u32)
        if lead:        # kv head and CTA within it, launch order
            if n_conv:
                head = cta // num_kv
                pos = cta - head * num_kv
            else:
                head = hk + Hkv * b
                pos = reg.from_(ptx.special.ctaid.x(), u32)
        k0 = kb * BM
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
        pstats, pdk, pdv = ptx.global_ptrs(STATS, DK, DV)
        if atomic_dq:
            (pacc,) = ptx.global_ptrs(DQACC)
        roles = Roles(wg, PROD_REGS)
        # ------------------------------------------------------------ producer
        def wait_stats():   # this head's stats are in once every CTA of head - lead counted
            with ptx.if_(head >= lead):
                (psem,) = ptx.global_ptrs(SEM)
                _spin_until(_flag(psem, head), num_kv, reg.scalar(u32))
            ptx.fence_proxy_async("global")

        def load_q(sb, q_map, do_map, hq, qb, bar):
            _load_slabs(sb, q_map, slabs, hq, qb * BQ, b, BQ, bar)
            _load_slabs(sb + q_tile.nbytes, do_map, slabs, hq, qb * BQ, b, BQ, bar)

        _dkdv_producer(
            tid, head_bar, head_bytes, pipe, G, hk, qb0, num_q, base, head_bytes + ds_bytes,
            stage_bytes, q_tile.nbytes, stats_bytes, safe, sync, Q, DO,
            load_head=lambda hbar: _load_pair(base, K, V, kv_tile.nbytes, slabs, hk, k0, b, BM,
                                              hbar),
            stats_row=lambda hq: reg.from_((b * Hq + hq) * Sp, u64) * 8 + pstats,
            q_block=lambda qstep: q_block(qstep, kb), load_q=load_q,
            before=wait_stats if lead else None)
        if dq_ordered and wide:
            with ptx.if_(tid == 32):
                _dq_writer(DQACC, SEM, base + head_bytes, kb, hk, b, qb0, dq_full, dq_empty,
                           pipe, TRACE=TRACE)
        elif dq_ordered:
            with ptx.if_(tid == 32):
                _dq_writer(DQACC, SEM, base + (head_bytes + 2 * ds_tile.nbytes), kb, hk, b,
                           qb0, dq_full, dq_empty, TRACE=TRACE)
        if lag or lead:
            with ptx.if_(tid >= 64):
                if lead:
                    _lead_stats(OUT, DO, LSE, STATS, SEM, head, pos)
                if lag:
                    _early_converter(DQACC, SEM, DQ, cta)
        # ------------------------------------------------------------ consumers
        roles.consumers(CONS_REGS)
        c = _dkdv_consumer_regs(tid, wg, k0, Sk, BQ, D, wide, base, head_bytes + ds_bytes,
                                kv_tile, q_tile, q_mn, pipe)
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
            elif causal:
                need = _or(q0 + BQ > S, q0 < k0 + (BM - 1))
            else:
                need = q0 + BQ > S
            with _maybe_if(need):
                qc = q0 + col0
                hi = reg.from_(S - qc, s32)         # column offset c valid iff c < hi
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
        for g in ptx.loop(0, G):
            hq = hk * G + g
            srow = reg.from_((b * Hq + hq) * Sp, u64) * 8 + pstats
            for qstep in ptx.loop(qb0, num_q):
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
                                elem = ((b * S + qr + r) * Hq + hq) * D + qcol
                                addr = reg.from_(elem, u64) * 4 + pacc
                                ok = qr + r < S
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
                            after_dk=after_dk)
        _dkdv_drain(c, overlap, pipe)
        if dq_bulk and not dq_ordered:
            with ptx.if_(dq_leader):
                ptx.tma.wait_group(0, read=True)
        if wide:        # read again here: no registers held over the loop
            pdk, pdv = ptx.global_ptrs(DK, DV)
        _store_rows(dk_acc, pdk, kvrow, valid, Hkv, D, hk, b, Sk, col0, scale, dt)
        _store_rows(dv_acc, pdv, kvrow, valid, Hkv, D, hk, b, Sk, col0, 1.0, dt)
        if TRACE is not None:   # the consumers' end
            with ptx.if_(tid == 128):
                ptx.inst.st.global_.u32(_trace_at(TRACE, 1), _now())
        roles.end()
        ptx.ret()

    name = (f"attn_bwd_dkdv_{dt.name}_d{D}_h{Hq}x{Hkv}{'_causal' if causal else ''}"
            f"{'_safe' if safe else ''}{'_atomic' if atomic_dq else ''}{'_bulk' if dq_bulk else ''}"
            f"{'_ordered' if dq_ordered else ''}"
            f"{f'_bq{BQ}' if BQ != 64 else ''}{'_serial' if overlap != default_overlap else ''}"
            f"{f'_cvt{n_conv}' if n_conv else ''}{f'_lag{lag}' if lag else ''}"
            f"{f'_lead{lead}' if lead else ''}"
            f"{'_trace' if trace else ''}")
    ins = (qspec, kspec, kspec, qspec, Tile(B, Hq, Sp, 2, f32))
    grid = (n_main + n_conv, 1, 1) if n_conv else (num_kv, Hkv, B)
    outs = (kspec, kspec)
    traced = (Tile(n_main + n_conv, 4, s32),) if trace else ()
    if dq_ordered:  # tensor parameters by name: (..., SEM[, OUT, LSE], DK, DV[, DQ][, TRACE])
        ins += (Tile(B, S, Hq, dq_width, f32), Tile(B, Hq, sem_q, 2, s32))
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
    tma = {"Q": box_q, "DO": box_q, "K": box_kv, "V": box_kv}
    if dq_bulk:
        tma["DQACC"] = {"box": (1, 64, 1, 32), "swizzle": "128B"}
    return kernel(in_specs=ins, out_specs=outs + traced, grid=grid,
                  block=(THREADS, 1, 1), smem=smem_total, maxnreg=168,
                  version="8.3" if atomic_dq else None,      # red.global.add.v2.f32: ISA 8.1
                  tma=tma, name=name)(fn)


def build_prep(B, S, Hq, D, *, dtype="bf16", counters=False, width=None, lead=0, Hkv=None):
    """The atomic-dQ mode's first kernel: ``(OUT, LSE, DO) -> (STATS, DQACC)``: the stats
    of ``build_dq`` and a zeroed f32 ``DQACC`` ``(B, S, Hq, D)`` for the dK/dV kernel to add
    into. 256 threads per 128 rows, the same row split as the dQ kernel's consumers.
    ``counters``: also a zeroed int32 ``SEM`` ``(B, Hq, ceil(S/64), 2)``, the ordered dQ
    mode's counters (``build_dkdv(dq_ordered=True)``), and DQACC is left unwritten (each
    tile's first add stores it). ``width``: DQACC's columns (``dq_accumulator_width``).
    ``lead`` (with ``counters``; ``build_dkdv``'s ``stats_lead``): the stats of the first
    ``lead`` kv heads (``Hkv`` of them per batch, in launch order) only; the dK/dV grid
    writes the others'."""
    if lead and not (counters and isinstance(Hkv, int) and Hkv > 0 and Hq % Hkv == 0):
        raise _fail(f"build_prep: lead needs counters=True and Hkv (a divisor of Hq), got "
                    f"lead={lead!r}, counters={counters!r}, Hkv={Hkv!r}")
    width = D if width is None else width
    dt = _dtype(dtype)
    Sp = padded(S)
    qspec = Tile(B, S, Hq, D, dt)
    nq = -(-S // 64)

    def prep(OUT, LSE, DO, STATS, DQACC, SEM):
        tid = reg.from_(ptx.special.tid.x(), u32)
        hq = reg.from_(ptx.special.ctaid.y(), u32)
        b = reg.from_(ptx.special.ctaid.z(), u32)
        q0 = reg.from_(ptx.special.ctaid.x(), u32) * BM
        po, pdo, plse, pstats, pacc = ptx.global_ptrs(OUT, DO, LSE, STATS, DQACC)
        with _maybe_if(hq // (Hq // Hkv) + Hkv * b < lead if lead else None):
            _prep_stats(po, pdo, plse, pstats, b, hq, q0, tid, S, Sp, Hq, D, dt)
        if not counters:    # DQACC's 128 rows: a warp zeroes a row's 16-byte chunks per turn
            zero = reg.scalar(f32, init=0.0)
            per_row = width // 4
            for k in range(BM * per_row // 256):
                x = tid + 256 * k
                r = x // per_row
                elem = ((b * S + q0 + r) * Hq + hq) * width + (x % per_row) * 4
                ptx.inst.st.global_.v4.f32(ptx.addr(reg.from_(elem, u64) * 4 + pacc),
                                           [zero] * 4, pred=q0 + r < S)
        if counters:  # this CTA's two q blocks of 64 rows, two counters each
            (psem,) = ptx.global_ptrs(SEM)
            qb = reg.from_(ptx.special.ctaid.x(), u32) * 2 + (tid >> 1)
            cell = ((b * Hq + hq) * nq + qb) * 2 + (tid & 1)
            ptx.inst.st.global_.u32(ptx.addr(reg.from_(cell, u64) * 4 + psem), 0,
                                    pred=(tid < 4) & (qb < nq))
        ptx.ret()

    outs = (Tile(B, Hq, Sp, 2, f32), Tile(B, S, Hq, width, f32))
    if counters:
        outs += (Tile(B, Hq, nq, 2, s32),)
        fn = prep
    else:
        def fn(OUT, LSE, DO, STATS, DQACC):
            prep(OUT, LSE, DO, STATS, DQACC, None)
    fn.__name__ = "prep"
    return kernel(in_specs=(qspec, Tile(B, Hq, S, f32), qspec), out_specs=outs,
                  grid=(-(-S // BM), Hq, B), block=(256, 1, 1),
                  name=f"attn_bwd_prep_{dt.name}_d{D}{'_sem' if counters else ''}"
                       f"{f'_w{width}' if width != D else ''}{f'_lead{lead}' if lead else ''}")(fn)


def build_convert(B, S, Hq, D, *, dtype="bf16", scale=1.0, width=None):
    """The atomic-dQ mode's last kernel: ``DQACC`` f32 -> ``DQ`` (times ``scale``), eight
    elements per thread. ``width`` (``dq_accumulator_width``) ``2 * D``: each row holds two
    partial sums, added (first + second) before the conversion."""
    width = D if width is None else width
    if width not in (D, 2 * D):
        raise _fail(f"build_convert: width must be {D} or {2 * D}, got {width}")
    dt = _dtype(dtype)
    n = B * S * Hq * D
    blocks = -(-n // (256 * 8))

    def convert(DQACC, DQ):
        pa, pq = ptx.global_ptrs(DQACC, DQ)
        i = reg.from_(ptx.special.ctaid.x(), u32) * 256 + reg.from_(ptx.special.tid.x(), u32)
        ok = i < n // 8
        if width == D:
            src = reg.from_(i, u64) * 32 + pa
        else:   # eight columns c.. of row r: elements r * 2D + c (+ D for the second sum)
            row = i // (D // 8)
            src = (reg.from_(row, u64) * (2 * D) + reg.from_((i - row * (D // 8)) * 8, u64)) * 4 + pa
        dst = reg.from_(i, u64) * 16 + pq
        with ptx.if_(ok):  # threads past the end compute nothing (no undefined registers)
            v = reg.array(f32, 8)
            ptx.inst.ld.global_.nc.v4.f32(list(v)[:4], ptx.addr(src))
            ptx.inst.ld.global_.nc.v4.f32(list(v)[4:], ptx.addr(src, 16))
            if width != D:
                u = reg.array(f32, 8)
                ptx.inst.ld.global_.nc.v4.f32(list(u)[:4], ptx.addr(src, 4 * D))
                ptx.inst.ld.global_.nc.v4.f32(list(u)[4:], ptx.addr(src, 4 * D + 16))
                for m in range(8):
                    ptx.inst.add.f32(v[m], v[m], u[m])
            packed = reg.array(b32, 4)
            for m in range(4):
                ptx.inst(f"cvt.rn.{dt.name}x2.f32")(packed[m], v[2 * m + 1] * float(scale),
                                                    v[2 * m] * float(scale))
            ptx.inst.st.global_.v4.b32(ptx.addr(dst), packed)
        ptx.ret()

    return kernel(in_specs=(Tile(B, S, Hq, width, f32),), out_specs=(Tile(B, S, Hq, D, dt),),
                  grid=(blocks, 1, 1), block=(256, 1, 1),
                  name=f"attn_bwd_convert_{dt.name}_d{D}{f'_w{width}' if width != D else ''}")(convert)


# ------------------------------------------------------------------ fused kernel: dK, dV and dQ
FUSED_BQ = 128      # q rows per block of the fused kernel (64 per consumer warpgroup)
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

    def __init__(self, S, Hq, Hkv, D, Sk, dt, causal, ordered, stages):
        self.S, self.Hq, self.D, self.Sk, self.dt = S, Hq, D, Sk, dt
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
        # full attention, ordered: kv block j walks q blocks from j on, wrapping, so a q
        # block's adds come one step apart (kv blocks i, i - 1, ..., wrapping)
        self.rotate = (ordered and not causal and self.num_q == self.num_kv
                       and self.num_kv <= ROTATE_MAX_KV)
        self.reverse = ordered and (causal or self.rotate)   # predecessor: kv block kb + 1

    def q_block(self, step, kb):
        """The q block of step ``step`` of kv block ``kb``."""
        if not self.rotate:
            return step
        r = step + kb
        wrapped = reg.scalar(u32)
        ptx.inst.selp.u32(wrapped, r - self.num_q, r, r >= self.num_q)
        return wrapped

    def dq_rank(self, qb, kb):
        """The place of kv block ``kb`` among those adding into q block ``qb``."""
        if self.causal:     # kv blocks min(qb, last), ..., 0
            return _min_u32(qb, self.num_kv - 1) - kb
        if self.rotate:     # kv block kb reaches q block qb at step (qb - kb) % num_q
            step = qb + self.num_q - kb
            wrapped = reg.scalar(u32)
            ptx.inst.selp.u32(wrapped, step - self.num_q, step, step >= self.num_q)
            return wrapped
        return kb           # ascending kv blocks (a wavefront)

    def dq_writer(self, DQACC, SEM, base, kb, hk, b, qb0, dq_full, dq_empty):
        """The ordered mode's writer thread: per block, in the consumers' order, wait for kv
        block ``kb``'s turn at the q block's counter and for both warpgroups' dQ slabs, add
        them (the first rank stores), free the slabs once read, and once the adds are
        complete in global memory, count them (a release add)."""
        dq_map = ptx.tma.tensormap_ptr(DQACC.tmap)
        (psem,) = ptx.global_ptrs(SEM)
        now = reg.scalar(u32)
        phase = reg.scalar(u32, init=0)
        for g in ptx.loop(0, self.G):
            hq = hk * self.G + g
            for step in ptx.loop(qb0, self.num_q):
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
                stages=None, ordered=False, defer=False, pingpong=0):
    """One-kernel backward: ``(Q, K, V, DO, STATS, DQACC) -> (DK, DV)``, adding every
    block's ``scale * dS K`` into the f32 ``DQACC`` ``(B, S, Hq, D)`` in place (STATS and
    a zeroed DQACC from ``build_prep``; ``build_convert`` makes dQ of it).

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
    Head dim 64 only (at D=128 the five accumulators do not fit 240 registers)."""
    Sk, dt, scale, _, _, G, Sp = _common_options(B, S, Hq, Hkv, D, Sk, dtype, scale, False, False)
    if D != 64:
        raise _fail(f"build_fused: head dim D must be 64 (at D=128 its five accumulators "
                    f"need more than {CONS_REGS} registers per thread), got {D}")
    if pingpong not in (0, 1, 2) or (pingpong and defer):
        raise _fail(f"build_fused: pingpong must be 0, 1 or 2 and not with defer, got "
                    f"pingpong={pingpong!r}, defer={defer!r}")
    plan = _FusedPlan(S, Hq, Hkv, D, Sk, dt, causal, bool(ordered), stages)
    if plan.smem > SMEM_LIMIT:
        raise _fail(f"build_fused: {plan.stages} stages need {plan.smem} bytes of shared memory "
                    f"(at most {SMEM_LIMIT})")
    c1 = scale * LOG2E
    kv_tile, q_tile, q_mn, kv_mn, pt_tile = (plan.kv_tile, plan.q_tile, plan.q_mn, plan.kv_mn,
                                             plan.pt_tile)
    stage_bytes = plan.stage_bytes
    qspec = Tile(B, S, Hq, D, dt)
    kspec = Tile(B, Sk, Hkv, D, dt)

    def fused_kernel(Q, K, V, DO, STATS, DQACC, SEM, DK, DV):
        base = ring_base("smem")
        pipe = Pipeline(plan.stages, consumer_arrivals=2)
        head_bar = BarrierArray(1, name="head_bar")
        tid, wg = thread_ids()
        kb = reg.from_(ptx.special.ctaid.x(), u32)
        if plan.reverse:    # launched last kv block first: a block's turn follows kb + 1's
            kb = (plan.num_kv - 1) - kb
        hk = reg.from_(ptx.special.ctaid.y(), u32)
        b = reg.from_(ptx.special.ctaid.z(), u32)
        k0 = kb * FUSED_BKV
        pipe.init(pred=tid == 0)
        head_bar.init(1, pred=tid == 0)
        if ordered:     # the consumers' dQ slabs <-> the writer thread, per warpgroup
            dq_full = BarrierArray(2, name="dq_full")
            dq_empty = BarrierArray(2, name="dq_empty")
            dq_full.init(128, pred=tid == 0)
            dq_empty.init(1, pred=tid == 0)
        ptx.bar_sync(0)
        qb0 = k0 // FUSED_BQ if causal else 0       # causal: q blocks above the diagonal skipped
        roles = Roles(wg, PROD_REGS)
        # ------------------------------------------------------------ producer
        with ptx.if_(tid == 0):
            hbar = head_bar.at(0)
            ptx.mbarrier.arrive_expect_tx(hbar, 2 * kv_tile.nbytes)
            _load_pair(base, K, V, kv_tile.nbytes, 1, hk, k0, b, FUSED_BKV, hbar)
            q_map = ptx.tma.tensormap_ptr(Q.tmap)
            do_map = ptx.tma.tensormap_ptr(DO.tmap)
            st = pipe.producer_state()
            for g in ptx.loop(0, G):
                hq = hk * G + g
                for step in ptx.loop(qb0, plan.num_q):
                    qb = plan.q_block(step, kb)
                    pipe.acquire(st)
                    bar = pipe.arm(st, stage_bytes)
                    sb = st.stage * stage_bytes + (base + plan.ring_at)
                    _load_slabs(sb, q_map, 1, hq, qb * FUSED_BQ, b, FUSED_BQ, bar)
                    _load_slabs(sb + q_tile.nbytes, do_map, 1, hq, qb * FUSED_BQ, b, FUSED_BQ, bar)
                    st.advance()
        if ordered:
            with ptx.if_(tid == 32):
                plan.dq_writer(DQACC, SEM, base, kb, hk, b, qb0, dq_full, dq_empty)
        # ------------------------------------------------------------ consumers
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
                ptx.inst.fma.rn.f32(s_acc[i], s_acc[i], c1, nl2[dr // 8])
                ptx.inst.ex2.approx.ftz.f32(s_acc[i], s_acc[i])
            _fused_mask(s_acc, causal, Sk, k0, q0, qrow, col0)

        def ds_from_dp(delta):
            """``dS = P * (dP - delta)`` in place of dP."""
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
            for g in ptx.loop(0, G):
                hq = hk * G + g
                for step in ptx.loop(qb0, plan.num_q):
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
                    ds_from_dp(delta)
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
            for g in ptx.loop(0, G):
                hq = hk * G + g
                for step in ptx.loop(qb0, plan.num_q):
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
                    ds_from_dp(delta)
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
        _store_rows(dk_acc, pdk, kvrow, valid, Hkv, D, hk, b, Sk, col0, scale, dt)
        _store_rows(dv_acc, pdv, kvrow, valid, Hkv, D, hk, b, Sk, col0, 1.0, dt)
        roles.end()
        ptx.ret()

    name = (f"attn_bwd_fused_{dt.name}_d{D}_h{Hq}x{Hkv}{'_causal' if causal else ''}"
            f"{'_ordered' if ordered else ''}{'_defer' if defer else ''}"
            f"{f'_pp{pingpong}' if pingpong else ''}")
    ins = (qspec, kspec, kspec, qspec, Tile(B, Hq, Sp, 2, f32), Tile(B, S, Hq, D, f32))
    if ordered:
        ins += (Tile(B, Hq, plan.nq_sem, 2, s32),)
        fn = fused_kernel
    else:
        def fn(Q, K, V, DO, STATS, DQACC, DK, DV):
            fused_kernel(Q, K, V, DO, STATS, DQACC, None, DK, DV)
    fn.__name__ = "fused_kernel"
    box_kv = {"box": (1, FUSED_BKV, 1, 64), "swizzle": "128B"}
    box_q = {"box": (1, FUSED_BQ, 1, 64), "swizzle": "128B"}
    tma = {"Q": box_q, "DO": box_q, "K": box_kv, "V": box_kv,
           "DQACC": {"box": (1, 64, 1, 32), "swizzle": "128B"}}
    return kernel(in_specs=ins, out_specs=(kspec, kspec),
                  grid=(plan.num_kv, Hkv, B), block=(THREADS, 1, 1), smem=plan.smem,
                  maxnreg=168, tma=tma, name=name)(fn)


def _fused_mask(s_acc, causal, Sk, k0, q0, qrow, col0):
    """``P = 0`` where the kv column is past ``Sk`` or, causal, above the diagonal (kv > q);
    only in the blocks that have such columns (the last kv block, the diagonal blocks)."""
    need = k0 + FUSED_BKV > Sk
    if causal:
        need = _or(need, q0 < k0 + (FUSED_BKV - 1))
    with ptx.if_(need):
        kv0 = reg.from_(k0 + col0, s32)
        room = []
        for r in (0, 8):                    # column offset c allowed iff c <= room
            if causal:
                lim = reg.from_(_min_u32(qrow + r, reg.scalar(u32, init=Sk - 1)), s32)
            else:
                lim = reg.scalar(s32, init=Sk - 1)
            room.append(lim - kv0)
        for i in range(len(s_acc)):
            dr, dc = Accumulator.coord(i)
            ptx.inst.selp.f32(s_acc[i], s_acc[i], 0.0, room[dr // 8] >= dc)


def _row_stats(po, pdo, plse, pstats, b, hq, qrow, valid, lane, S, Sp, Hq, D, dt):
    """Rows ``qrow`` and ``qrow + 8`` of this thread (its quad splits D): ``delta =
    rowsum(do * o)`` by a quad reduction, ``lse2 = lse * log2 e``, both written to STATS (by
    the quad's first lane; zeros past ``S``). Returns ``(delta, -lse2)`` per row."""
    return _quad_row_stats(po, pdo, plse, pstats, hq, lambda r: b * S + qrow + r,
                           lambda r: (b * Hq + hq) * S + qrow + r,
                           lambda r: (b * Hq + hq) * Sp + qrow + r, valid, False, lane, Hq, D,
                           dt)


def _quad_row_stats(po, pdo, plse, pstats, hq, row, lse_row, stats_row, valid, guard_store,
                    lane, Hq, D, dt):
    """``_row_stats`` with the thread's row ``r`` (0 or 8) located by ``row(r)`` in the
    ``(rows, Hq, D)`` O/dO tensors, ``lse_row(r)`` in LSE and ``stats_row(r)`` in STATS;
    ``guard_store``: the STATS store is predicated on ``valid`` too."""
    quarter = D // 4
    c = lane & 3
    delta, nlse2 = [], []
    for r in (0, 8):
        acc = reg.scalar(f32, init=0.0)
        elem = (row(r) * Hq + hq) * D + c * quarter
        off = reg.from_(elem, u64) * 2
        for k8 in range(quarter // 8):
            wo, wd = reg.array(b32, 4), reg.array(b32, 4)
            for x in list(wo) + list(wd):
                ptx.inst.mov.b32(x, 0)
            ptx.inst.ld.global_.nc.v4.b32(wo, ptx.addr(po + off, 16 * k8), pred=valid[r // 8])
            ptx.inst.ld.global_.nc.v4.b32(wd, ptx.addr(pdo + off, 16 * k8), pred=valid[r // 8])
            for x, y in zip(wo, wd):
                o0, o1 = _unpack(x, dt)
                d0, d1 = _unpack(y, dt)
                ptx.inst.fma.rn.f32(acc, o0, d0, acc)
                ptx.inst.fma.rn.f32(acc, o1, d1, acc)
        ptx.warp.reduce_sum(acc, width=4)
        delta.append(acc)
        lv = reg.scalar(f32, init=0.0)
        loff = reg.from_(lse_row(r), u64) * 4
        ptx.inst.ld.global_.nc.f32(lv, ptx.addr(plse + loff), pred=valid[r // 8])
        l2 = lv * LOG2E
        soff = reg.from_(stats_row(r), u64) * 8
        dst = ptx.addr(pstats + soff)
        ptx.inst.st.global_.v2.f32(dst, [l2, acc],
                                   pred=valid[r // 8] & (c == 0) if guard_store else c == 0)
        nlse2.append(-l2)
    return delta, nlse2


def _prep_stats(po, pdo, plse, pstats, b, hq, q0, tid, S, Sp, Hq, D, dt):
    """``build_prep``'s stats of rows ``q0 .. q0 + 127`` by 256 threads: ``D / 8`` lanes per
    row, 16 bytes of O and dO each (a warp reads whole rows), every load of the CTA's rows
    issued before the first product; ``delta = rowsum(do * o)`` by a lane reduction and
    ``(lse * log2 e, delta)`` written to STATS by the row's first lane (zeros past ``S``)."""
    lanes = D // 8
    per = 256 // lanes                      # rows per turn
    got = []
    for k in range(BM // per):
        r = q0 + k * per + tid // lanes
        ok = r < S
        off = reg.from_(((b * S + r) * Hq + hq) * D + (tid % lanes) * 8, u64) * 2
        wo, wd = _row_pieces(po, pdo, off, ok)
        lv = reg.scalar(f32, init=0.0)
        ptx.inst.ld.global_.nc.f32(lv, ptx.addr(reg.from_((b * Hq + hq) * S + r, u64) * 4 + plse),
                                   pred=ok & (tid % lanes == 0))
        got.append((r, wo, wd, lv))
    for r, wo, wd, lv in got:
        acc = _row_delta(wo, wd, lanes, dt)
        soff = reg.from_((b * Hq + hq) * Sp + r, u64) * 8
        ptx.inst.st.global_.v2.f32(ptx.addr(pstats + soff), [lv * LOG2E, acc],
                                   pred=tid % lanes == 0)


def _row_pieces(po, pdo, off, ok):
    """A lane's 16 bytes of O and of dO at byte offset ``off`` (zeros where ``ok`` is false)."""
    wo, wd = reg.array(b32, 4), reg.array(b32, 4)
    for x in list(wo) + list(wd):
        ptx.inst.mov.b32(x, 0)
    ptx.inst.ld.global_.nc.v4.b32(wo, ptx.addr(po + off), pred=ok)
    ptx.inst.ld.global_.nc.v4.b32(wd, ptx.addr(pdo + off), pred=ok)
    return wo, wd


def _row_delta(wo, wd, lanes, dt):
    """``delta = rowsum(do * o)`` of a row whose ``lanes`` lanes hold 16-byte pieces of O and
    dO (``wo``, ``wd``): each lane's FMAs, then a reduction over the lanes."""
    acc = reg.scalar(f32, init=0.0)
    for x, y in zip(wo, wd):
        o0, o1 = _unpack(x, dt)
        d0, d1 = _unpack(y, dt)
        ptx.inst.fma.rn.f32(acc, o0, d0, acc)
        ptx.inst.fma.rn.f32(acc, o1, d1, acc)
    ptx.warp.reduce_sum(acc, width=lanes)
    return acc


def _env(name):
    return os.environ.get(name, "0") not in ("", "0")


def safe_default():
    """Whether ``PYPTX_ATTN_BWD_SAFE`` asks for the simplest schedule (a bisecting aid)."""
    return _env("PYPTX_ATTN_BWD_SAFE")


# ------------------------------------------------------------------ packed variable length
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
                    scale=None, BKV=None, stages=None, sync=None, safe=None):
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
    qspec = Tile(Tq, Hq, D, dt)
    kspec = Tile(Tk, Hkv, D, dt)
    cu = Tile(B + 1, s32)

    def dq_kernel(Q, K, V, CUQ, CUK, OUT, LSE, DO, DQ, STATS):
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
        if causal:  # blocks wholly above the diagonal are skipped
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
                     load_head, load_kv)
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
                     k_tile=k_tile, k_mn=k_mn, stats=stats, limits=limits,
                     store=lambda acc, pdq, qrow, valid, col0: _store_rows_varlen(
                         acc, pdq, q_start, qrow, valid, Hq, D, hq, col0, scale, dt))
        roles.end()
        ptx.ret()

    name = (f"attn_bwd_dq_varlen_{dt.name}_d{D}_h{Hq}x{Hkv}{'_causal' if causal else ''}"
            f"{'_safe' if safe else ''}_bkv{BKV}")
    box_q = {"box": (BM, 1, 64), "swizzle": "128B"}
    box_k = {"box": (BKV, 1, 64), "swizzle": "128B"}
    return kernel(in_specs=(qspec, kspec, kspec, cu, cu, qspec, Tile(Hq, Tq, f32), qspec),
                  out_specs=(qspec, Tile(Hq, Sp, 2, f32)), grid=(-(-max_seqlen_q // BM), Hq, B),
                  block=(THREADS, 1, 1), smem=smem_total, maxnreg=168,
                  tma={"Q": box_q, "DO": box_q, "K": box_k, "V": box_k}, name=name)(dq_kernel)


def build_dkdv_varlen(Tq, Tk, B, Hq, Hkv, D, max_seqlen_k, *, dtype="bf16", causal=False,
                      scale=None, BQ=None, stages=None, sync=None, safe=None, overlap=None):
    """The varlen dK/dV kernel: ``(Q, K, V, CUQ, CUK, DO, STATS) -> (DK, DV)`` (STATS from
    ``build_dq_varlen``): ``build_dkdv``'s plain mode (``BQ`` 32 or 64, ``overlap`` as
    there) on a grid of ``ceil(max_seqlen_k / 128)`` kv blocks per (kv head, sequence); a
    CTA past its sequence's keys returns before any barrier. Query columns past the
    sequence's end (the next sequence's rows, whose stats may be anything, or unwritten
    STATS rows) get ``P^T = 0`` by a select, and their ``delta`` is selected to 0 so
    ``dS^T = 0 * (dP^T - 0)`` stays 0 whatever the stats held; causal columns above the
    sequence's diagonal get ``P^T = 0``. The fast schedule masks the blocks that reach past
    ``seqlen_q`` or the diagonal (runtime lengths), the safe one every block. dK/dV are
    stored for the sequence's keys only (zeros where no query attends)."""
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
    qspec = Tile(Tq, Hq, D, dt)
    kspec = Tile(Tk, Hkv, D, dt)
    cu = Tile(B + 1, s32)

    def dkdv_kernel(Q, K, V, CUQ, CUK, DO, STATS, DK, DV):
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
            elif causal:
                need = _or(q0 + BQ > seqlen_q, q0 < k0 + (BM - 1))
            else:
                need = q0 + BQ > seqlen_q
            with _maybe_if(need):
                qc = q0 + col0
                hi = sq - reg.from_(qc, s32)        # column offset c valid iff c < hi
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
                            mask=mask_pt, fix_delta=fix_delta)
        _dkdv_drain(c, overlap, pipe)
        dk_acc, dv_acc, valid = c.dk_acc, c.dv_acc, c.valid
        _store_rows_varlen(dk_acc, pdk, k_start, kvrow, valid, Hkv, D, hk, col0, scale, dt)
        _store_rows_varlen(dv_acc, pdv, k_start, kvrow, valid, Hkv, D, hk, col0, 1.0, dt)
        roles.end()
        ptx.ret()

    name = (f"attn_bwd_dkdv_varlen_{dt.name}_d{D}_h{Hq}x{Hkv}{'_causal' if causal else ''}"
            f"{'_safe' if safe else ''}{f'_bq{BQ}' if BQ != 64 else ''}"
            f"{'_serial' if overlap != default_overlap else ''}")
    box_kv = {"box": (BM, 1, 64), "swizzle": "128B"}
    box_q = {"box": (BQ, 1, 64), "swizzle": "128B"}
    return kernel(in_specs=(qspec, kspec, kspec, cu, cu, qspec, Tile(Hq, Sp, 2, f32)),
                  out_specs=(kspec, kspec), grid=(-(-max_seqlen_k // BM), Hkv, B),
                  block=(THREADS, 1, 1), smem=smem_total, maxnreg=168,
                  tma={"Q": box_q, "DO": box_q, "K": box_kv, "V": box_kv},
                  name=name)(dkdv_kernel)


# ------------------------------------------------------------------ the pair as one object
class AttentionBackward:
    """``bwd(q, k, v, o, lse, do, dlse=None) -> (dq, dk, dv)``: the dQ kernel (which also
    writes the stats) then the dK/dV kernel; with ``atomic_dq``, the prep kernel (stats and
    a zeroed f32 dQ), the dK/dV kernel adding dQ too, then the conversion. Kernel-like
    (``in_specs``, ``out_specs``, ``name``, ``arg_names``) so ``pyptx.differentiable_kernel``
    accepts it as a backward kernel."""

    def __init__(self, kernels, B, S, Hq, Hkv, D, Sk, dt, atomic_dq=False, fallback=None):
        self.kernels, self.atomic_dq, self.fallback = kernels, atomic_dq, fallback
        self._dims = (B, S, Hq, Hkv, D, Sk, dt)
        qspec, kspec = Tile(B, S, Hq, D, dt), Tile(B, Sk, Hkv, D, dt)
        lse = Tile(B, Hq, S, f32)
        self.in_specs = (qspec, kspec, kspec, qspec, lse, qspec, lse)
        self.out_specs = (qspec, kspec, kspec)
        self.arg_names = ("q", "k", "v", "o", "lse", "do", "dlse", "dq", "dk", "dv")
        self.name = kernels[-1].name.replace("_dkdv_", "_")

    @property
    def dq_kernel(self):
        """The dQ kernel (``None`` in the atomic-dQ mode)."""
        return None if self.atomic_dq else self.kernels[0]

    @property
    def dkdv_kernel(self):
        """The dK/dV kernel."""
        return self.kernels[1]

    def __call__(self, q, k, v, o, lse, do, dlse=None):
        """Run the kernels; ``dlse`` is ignored (lse is an auxiliary output)."""
        if not self.atomic_dq:
            dq, stats = self.kernels[0](q, k, v, o, lse, do)
            dk, dv = self.kernels[1](q, k, v, do, stats)
            return dq, dk, dv
        if not type(q).__module__.startswith("torch") or sys.modules["torch"].compiler.is_compiling():
            if self.fallback is not None:   # JAX or a graph trace: the out-of-place pair
                return self.fallback(q, k, v, o, lse, do, dlse)
            from pyptx.source import where

            raise ConfigError(f"{where()}: attention backward with atomic_dq=True adds into a "
                              f"buffer in place: torch eager tensors only (not JAX or "
                              f"torch.compile), got {type(q).__name__}")
        prep, dkdv, *convert = self.kernels
        stats, dqacc, *sem = prep(o, lse, do)
        if "OUT" in dkdv.arg_names:     # stats_lead: the dK/dV grid writes most stats
            sem += [o, lse]
        if not convert:     # dq_convert: the dK/dV grid writes dQ too
            dk, dv, dq = dkdv(q, k, v, do, stats, dqacc, *sem)
            return dq, dk, dv
        dk, dv = dkdv(q, k, v, do, stats, dqacc, *sem)
        (convert,) = convert
        return convert(dqacc), dk, dv

    def with_fallback(self, other):
        """This backward, running ``other`` (same sizes) where an atomic-dQ mode cannot run
        (JAX arrays, ``torch.compile`` traces)."""
        if self._dims != other._dims:
            raise _fail("AttentionBackward.with_fallback: the fallback is for other sizes")
        return AttentionBackward(self.kernels, *self._dims, atomic_dq=self.atomic_dq,
                                 fallback=other)

    def __repr__(self):
        return f"<AttentionBackward {' + '.join(k.name for k in self.kernels)}>"


def build_attention_backward(B, S, Hq, Hkv, D, *, Sk=None, dtype="bf16", causal=False, scale=None,
                             safe=None, atomic_dq=False, dkdv_bq=None, dkdv_overlap=None,
                             dq_bulk=False, dq_ordered=False, dq_bkv=None, fused_bq=None,
                             fused_defer=False, fused_pingpong=0, num_sms=132, dq_convert=False,
                             convert_lag=0, stats_lead=0):
    """The backward kernels for these sizes: ``bwd(q, k, v, o, lse, do, dlse) -> (dq, dk,
    dv)``. ``safe=True`` (or ``PYPTX_ATTN_BWD_SAFE=1``): the simplest schedule, for
    bisecting. ``atomic_dq=True``: dQ accumulated by the dK/dV kernel with f32 atomics (no
    second pass over K and V; not deterministic; torch eager only). ``dkdv_bq`` (32 or 64;
    128 only at D=128 with ``atomic_dq``, ``dq_bulk`` and ``dq_ordered``) and ``dkdv_overlap`` (``None``: the defaults, 64 rows, overlapped at D=64 only): the
    dK/dV kernel's speed options (``build_dkdv``'s ``BQ`` and ``overlap``). ``dq_bulk``
    (with ``atomic_dq``): dQ tiles added by TMA tile reductions, ``dq_ordered`` (with
    ``dq_bulk``) in a fixed order (``build_dkdv``). ``dq_bkv`` (32, 64 or 128; ``None``:
    ``default_dq_bkv(D)``): keys per block of the pair's dQ kernel (``build_dq``'s ``BKV``).
    ``fused_bq=128`` (D=64): one kernel instead of the pair, 128-row q blocks, dQ added by
    bulk reductions in any order, or in a fixed order with ``dq_ordered`` (``build_fused``;
    like ``atomic_dq``, torch eager only); ``fused_defer``: its schedule that issues a
    block's dK product after the next block's S and dP (``build_fused``'s ``defer``);
    ``fused_pingpong`` (1 or 2): its schedule with warpgroup 1 half a block behind
    warpgroup 0 (``build_fused``'s ``pingpong``). ``dq_convert`` (with ``atomic_dq``,
    ``dq_bulk`` and ``dq_ordered``): the dK/dV grid writes dQ itself, ``num_sms`` (132)
    converter CTAs after its other CTAs, each q block once its adds are in, instead of a
    conversion kernel after it; ``convert_lag`` (with ``dq_convert``; ``build_dkdv``'s):
    the dK/dV CTAs' idle producer warps convert the q blocks of the kv head that many heads
    earlier (``"auto"``: ``default_convert_lag`` where it applies), leaving the converter CTAs
    the last heads' only. ``stats_lead`` (the ordered bulk-dQ dK/dV kernel; ``build_dkdv``'s,
    ``"auto"``: ``default_stats_lead`` where it applies): the dK/dV CTAs' idle producer warps
    compute the stats of the kv head that many heads later, the prep kernel only the first
    heads'."""
    safe = safe_default() if safe is None else bool(safe)
    if convert_lag and convert_lag != "auto" and not dq_convert:
        raise _fail(f"build_attention_backward: convert_lag needs dq_convert, got "
                    f"convert_lag={convert_lag!r}, dq_convert={dq_convert!r}")
    if dq_convert and (not (atomic_dq and dq_bulk and dq_ordered) or fused_bq
                       or dkdv_bq not in (None, 64)):
        raise _fail(f"build_attention_backward: dq_convert is for the ordered bulk-dQ dK/dV "
                    f"kernel (atomic_dq, dq_bulk and dq_ordered; 64-row q blocks; not "
                    f"fused_bq), got atomic_dq={atomic_dq!r}, dq_bulk={dq_bulk!r}, "
                    f"dq_ordered={dq_ordered!r}, dkdv_bq={dkdv_bq!r}, fused_bq={fused_bq!r}")
    _check_num_sms("build_attention_backward", num_sms)
    if (fused_defer or fused_pingpong) and fused_bq is None:
        raise _fail("build_attention_backward: fused_defer and fused_pingpong are schedules "
                    "of fused_bq=128")
    if fused_pingpong not in (0, 1, 2) or (fused_pingpong and fused_defer):
        raise _fail(f"build_attention_backward: fused_pingpong must be 0, 1 or 2 and not "
                    f"with fused_defer, got {fused_pingpong!r}")
    if fused_bq is not None:
        _check_fused("build_attention_backward", fused_bq, safe, atomic_dq, dkdv_bq,
                     dkdv_overlap, dq_bulk, dq_bkv)
        return _build(B, S, Hq, Hkv, D, S if Sk is None else Sk, dtype, causal, scale, safe,
                      True, dq_ordered=bool(dq_ordered), fused_bq=fused_bq,
                      fused_defer=bool(fused_defer), fused_pingpong=int(fused_pingpong))
    if dkdv_bq not in (None, 32, 64, 128):
        raise _fail(f"build_attention_backward: dkdv_bq must be 32, 64 or 128, got {dkdv_bq!r}")
    if dq_bkv not in (None, 32, 64, 128) or (dq_bkv is not None and atomic_dq):
        raise _fail(f"build_attention_backward: dq_bkv must be 32, 64 or 128, and only "
                          f"for the pair (not atomic_dq), got {dq_bkv!r}")
    overlap = None if dkdv_overlap is None else bool(dkdv_overlap)
    _check_dq_modes("build_attention_backward", atomic_dq, dq_bulk, dq_ordered)
    lead = resolve_stats_lead("build_attention_backward", stats_lead, S if Sk is None else Sk,
                              num_sms, bool(dq_ordered), safe, dkdv_bq, causal)
    return _build(B, S, Hq, Hkv, D, S if Sk is None else Sk, dtype, causal, scale, safe,
                  bool(atomic_dq), dkdv_bq, overlap, bool(dq_bulk), bool(dq_ordered), dq_bkv,
                  num_sms=num_sms, dq_convert=bool(dq_convert), convert_lag=convert_lag,
                  stats_lead=lead)


def default_dq_bkv(D):
    """The pair's dQ kernel's keys per block: 128 at D=64 (its two products get 128 columns;
    H100 A/B over the four benchmark shapes: +1 to +4%, identical results), 64 otherwise."""
    return 128 if D == 64 else 64


OPTIONS = ("dkdv_bq", "dkdv_overlap", "atomic_dq", "dq_bulk", "dq_ordered",
           "dq_bkv", "fused_bq", "fused_defer", "fused_pingpong",
           "num_sms", "dq_convert", "convert_lag", "stats_lead")  # build_attention_backward's
INT_OPTIONS = ("dkdv_bq", "dq_bkv", "fused_bq", "fused_pingpong", "num_sms", "convert_lag",
               "stats_lead")
AUTO_OPTIONS = ("convert_lag", "stats_lead")     # these also take "auto"


def _check_fused(fn, fused_bq, safe, atomic_dq, dkdv_bq, dkdv_overlap, dq_bulk, dq_bkv):
    """``ConfigError`` (naming ``fn``) unless ``fused_bq`` comes alone (or with
    ``dq_ordered``): the fused kernel replaces the pair and has one schedule."""
    if fused_bq != FUSED_BQ:
        raise _fail(f"{fn}: fused_bq must be {FUSED_BQ}, got {fused_bq!r}")
    others = dict(safe=safe, atomic_dq=atomic_dq, dkdv_bq=dkdv_bq, dkdv_overlap=dkdv_overlap,
                  dq_bulk=dq_bulk, dq_bkv=dq_bkv)
    given = [n for n, v in others.items() if v not in (None, False)]
    if given:
        raise _fail(f"{fn}: fused_bq={fused_bq} is a kernel of its own; it takes dq_ordered "
                    f"but not {', '.join(given)}")


def parse_options(text):
    """``"dkdv_bq=32,dkdv_overlap=0"`` -> ``{"dkdv_bq": 32, "dkdv_overlap": False}`` (empty
    text or ``default``: ``{}``), for the command lines of the example and its tools."""
    out = {}
    for item in filter(None, (text or "").replace("default", "").split(",")):
        name, _, value = item.partition("=")
        if name in AUTO_OPTIONS and value == "auto":
            out[name] = value
            continue
        if name not in OPTIONS or not value.isdigit():
            raise _fail(f"attention backward options: expected name=int with name in "
                              f"{OPTIONS} (or {'/'.join(AUTO_OPTIONS)}=auto), got {item!r}")
        out[name] = int(value) if name in INT_OPTIONS else bool(int(value))
    return out


@functools.lru_cache(maxsize=64)
def _build(B, S, Hq, Hkv, D, Sk, dtype, causal, scale, safe, atomic_dq, dkdv_bq=None, overlap=None,
           dq_bulk=False, dq_ordered=False, dq_bkv=None, fused_bq=None, fused_defer=False,
           fused_pingpong=0, num_sms=132, dq_convert=False, convert_lag=0, stats_lead=0):
    kw = dict(Sk=Sk, dtype=dtype, causal=causal, scale=scale, safe=safe)
    dkdv_kw = dict(kw, BQ=dkdv_bq, overlap=overlap)
    dt = _dtype(dtype)
    if fused_bq:
        fused = build_fused(B, S, Hq, Hkv, D, Sk=Sk, dtype=dtype, causal=causal, scale=scale,
                            ordered=dq_ordered, defer=fused_defer, pingpong=fused_pingpong)
        kernels = (build_prep(B, S, Hq, D, dtype=dtype, counters=dq_ordered),
                   fused, build_convert(B, S, Hq, D, dtype=dtype))
    elif atomic_dq:
        check_shapes(B, S, Hq, Hkv, D, Sk)
        width = dq_accumulator_width(D, dq_bulk)
        kernels = (build_prep(B, S, Hq, D, dtype=dtype, counters=dq_ordered, width=width,
                              lead=stats_lead, Hkv=Hkv),
                   build_dkdv(B, S, Hq, Hkv, D, atomic_dq=True, dq_bulk=dq_bulk,
                              dq_ordered=dq_ordered, num_sms=num_sms, dq_convert=dq_convert,
                              convert_lag=convert_lag, stats_lead=stats_lead,
                              **dkdv_kw),     # adds dQ into DQACC
                   build_convert(B, S, Hq, D, dtype=dtype, width=width))
        if dq_convert:      # the dK/dV grid converts dQ
            kernels = kernels[:2]
    else:
        dq_kw = dict(kw, BKV=default_dq_bkv(D) if dq_bkv is None else dq_bkv)
        kernels = (build_dq(B, S, Hq, Hkv, D, **dq_kw), build_dkdv(B, S, Hq, Hkv, D, **dkdv_kw))
    return AttentionBackward(kernels, B, S, Hq, Hkv, D, Sk, dt, atomic_dq)


def attention_backward(q, k, v, o, lse, do, causal=False, scale=None, *, safe=None,
                       atomic_dq=False, **options):
    """``(dq, dk, dv)`` of attention for torch tensors or JAX arrays (layouts as above);
    ``options``: ``dkdv_bq`` / ``dkdv_overlap`` of ``build_attention_backward``."""
    if len(q.shape) != 4 or len(k.shape) != 4 or tuple(k.shape) != tuple(v.shape):
        raise _fail(f"attention_backward: q (B, S, Hq, D) and k, v (B, Sk, Hkv, D) expected, "
                          f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, S, Hq, D = (int(x) for x in q.shape)
    Sk, Hkv = int(k.shape[1]), int(k.shape[2])
    name = {"bfloat16": "bf16", "float16": "f16"}.get(str(q.dtype).replace("torch.", ""))
    if name is None:
        raise _fail(f"attention_backward: q must be bfloat16 or float16, got {q.dtype}")
    bwd = build_attention_backward(B, S, Hq, Hkv, D, Sk=Sk, dtype=name, causal=causal,
                                   scale=None if scale is None else float(scale), safe=safe,
                                   atomic_dq=atomic_dq, **options)
    if type(q).__module__.startswith("torch"):  # the kernels take dense tensors
        q, k, v, o, lse, do = (x.contiguous() for x in (q, k, v, o, lse, do))
    return bwd(q, k, v, o, lse, do)


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
                                    dtype="bf16", causal=False, scale=None, safe=None,
                                    **options):
    """The backward of packed variable-length attention (``attention_varlen``'s layout:
    ``q/o/do (Tq, Hq, D)``, ``k/v (Tk, Hkv, D)``, ``cu_seqlens_q/k`` int32 ``(B + 1,)`` on
    the device, ``lse (Hq, Tq)``; causal top-left aligned per sequence):
    ``AttentionBackwardVarlen``, the dQ / dK-dV pair (``build_dq_varlen``,
    ``build_dkdv_varlen``). ``options``: ``dq_bkv``, ``dkdv_bq`` (32 or 64) and
    ``dkdv_overlap`` as in ``build_attention_backward``; its atomic, bulk, ordered, fused
    and converting modes (``VARLEN_REFUSED``) are refused with ``ConfigError``."""
    refused = [n for n in VARLEN_REFUSED if options.get(n) not in (None, False, 0)]
    if refused:
        raise _fail(f"build_attention_backward_varlen: {', '.join(refused)} not available with "
                    f"packed variable-length batches (the varlen backward is the "
                    f"deterministic dQ / dK-dV pair)")
    unknown = sorted(set(options) - set(VARLEN_REFUSED) - {"dq_bkv", "dkdv_bq", "dkdv_overlap"})
    if unknown:
        raise _fail(f"build_attention_backward_varlen: unknown options {', '.join(unknown)}")
    safe = safe_default() if safe is None else bool(safe)
    return _build_varlen(Tq, Tk, B, Hq, Hkv, D, max_seqlen_q, max_seqlen_k, dtype, bool(causal),
                         None if scale is None else float(scale), safe, options.get("dq_bkv"),
                         options.get("dkdv_bq"), options.get("dkdv_overlap"))


@functools.lru_cache(maxsize=64)
def _build_varlen(Tq, Tk, B, Hq, Hkv, D, max_q, max_k, dtype, causal, scale, safe, dq_bkv,
                  dkdv_bq, overlap):
    kw = dict(dtype=dtype, causal=causal, scale=scale, safe=safe)
    dq = build_dq_varlen(Tq, Tk, B, Hq, Hkv, D, max_q, BKV=dq_bkv, **kw)
    dkdv = build_dkdv_varlen(Tq, Tk, B, Hq, Hkv, D, max_k, BQ=dkdv_bq,
                             overlap=None if overlap is None else bool(overlap), **kw)
    return AttentionBackwardVarlen((dq, dkdv), Tq, Tk, B, Hq, Hkv, D, _dtype(dtype))


# ------------------------------------------------------------------ bisecting probe
def build_register_a_probe(N=128, K=64, dtype="bf16"):
    """One warpgroup computes ``D = A @ B`` with A ``(64, K)`` taken from registers in the
    packing the kernels use (register ``m`` = accumulator elements ``2m, 2m+1``) and B
    ``(K, N)`` an MN-major shared tile: the operand forms of ``P^T dO`` / ``dS K``."""
    from pyptx.types import b64

    dt = _dtype(dtype)
    b = OperandTile(N, K, dt, major="MN")

    @kernel(in_specs=(Tile(64, K, dt), Tile(K, N, dt)), out_specs=(Tile(64, N, f32),),
            block=(128, 1, 1), smem=b.nbytes + 1024, tma={"Bm": b.tma_options()},
            name=f"attn_bwd_probe_{dt.name}_n{N}_k{K}")
    def probe(A, Bm, Dm):
        pa, pd = ptx.global_ptrs(A, Dm)
        buf = ring_base("tiles")
        bar = smem.alloc(b64, 1, align=8, name="bar")
        tid = reg.from_(ptx.special.tid.x(), u32)
        with ptx.if_(tid == 0):
            ptx.mbarrier.init(bar, 1)
        ptx.bar_sync(0)
        with ptx.if_(tid == 0):
            ptx.mbarrier.arrive_expect_tx(bar, b.nbytes)
            b.load(buf, Bm, 0, 0, bar)
        frag = Accumulator(K)                       # A's 64 x K elements, accumulator layout
        row, col = frag.thread_origin(tid)
        a_pack = reg.array(b32, K // 4)
        first = reg.from_(row * K + col, u64) * 2 + pa
        for m in range(K // 4):
            r, c = Accumulator.coord(2 * m)
            ptx.inst.ld.global_.b32(a_pack[m], ptx.addr(first, (r * K + c) * 2))
        ptx.mbarrier.wait(bar, 0)
        acc = Accumulator(N)
        db = b.descriptor(buf)
        ptx.wgmma.fence()
        for kk in range(K // 16):
            ptx.wgmma.mma_async(acc.regs, list(a_pack)[4 * kk:4 * kk + 4], b.advance(db, kk),
                                n=N, dtype_ab=dt.name, scale_d=0 if kk == 0 else 1,
                                trans_b=b.trans)
        ptx.wgmma.commit_group()
        ptx.wgmma.wait_group(0)
        out = reg.from_(row * N + col, u64) * 4 + pd
        for i in range(len(acc)):
            r, c = Accumulator.coord(i)
            ptx.inst.st.global_.f32(ptx.addr(out, (r * N + c) * 4), acc[i])
        ptx.ret()

    return probe


def check_probe() -> int:
    """PASS/FAIL of the register-A probe (D 64 and 128); returns the failures."""
    import torch

    fails = 0
    for N in (64, 128):
        a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
        bm = torch.randn(64, N, device="cuda", dtype=torch.bfloat16)
        d = build_register_a_probe(N, 64)(a, bm)
        ref = a.double() @ bm.double()
        err = ((d.double() - ref).norm() / ref.norm()).item()
        ok = err < 1e-5
        fails += not ok
        print(f"probe: A from registers x MN-major B, n{N}: rel err {err:.1e} "
              f"{'PASS' if ok else 'FAIL'}")
    return fails


# ------------------------------------------------------------------ float64 reference (torch)
def reference(q, k, v, do, causal=False, scale=None):
    """float64 torch reference: ``(o, lse, dq, dk, dv)`` by autograd of plain attention."""
    import torch

    with torch.enable_grad():  # also inside an autograd Function's forward
        return _reference(torch, q, k, v, do, causal, scale)


def _reference(torch, q, k, v, do, causal, scale):
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    G = q.shape[2] // k.shape[2]
    qd = q.detach().double().requires_grad_()
    kd = k.detach().double().requires_grad_()
    vd = v.detach().double().requires_grad_()
    kx = kd.repeat_interleave(G, dim=2)
    vx = vd.repeat_interleave(G, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", qd, kx) * scale
    if causal:
        i = torch.arange(q.shape[1], device=q.device)[:, None]
        j = torch.arange(k.shape[1], device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    o = torch.einsum("bhij,bjhd->bihd", p, vx)
    o.backward(do.double())
    return o.detach().contiguous(), lse.detach().contiguous(), qd.grad, kd.grad, vd.grad


CHECKS = [  # (B, S, Hq, Hkv, D, dtype, causal): ragged, GQA/MQA, both dtypes and head dims
    (1, 128, 1, 1, 64, "bf16", False),
    (2, 200, 4, 2, 64, "bf16", False),
    (2, 200, 4, 2, 64, "bf16", True),
    (1, 333, 4, 1, 128, "f16", True),
    (2, 256, 2, 2, 128, "bf16", False),
    (2, 513, 8, 2, 128, "bf16", True),
]
FUSED_CHECKS = [  # fused_bq: f16, ring refills, chains of adds over many kv blocks, rotation
    (1, 300, 4, 2, 64, "f16", True),
    (2, 1000, 4, 2, 64, "bf16", False),
    (2, 1000, 4, 2, 64, "bf16", True),
    (1, 1024, 2, 2, 64, "bf16", False),
]
BQ128_CHECKS = [  # dkdv_bq=128 (D=128): f16, refills, long chains, rotation (full, S = Sk)
    (1, 300, 4, 2, 128, "f16", True),
    (2, 1000, 4, 2, 128, "bf16", False),
    (2, 1000, 4, 2, 128, "bf16", True),
    (1, 1024, 2, 2, 128, "bf16", False),
]


def check(cases=CHECKS, safe=False, atomic_dq=False, **options) -> int:
    """One PASS/FAIL line per gradient against float64 autograd; returns the failures.
    ``options``: ``dkdv_bq`` / ``dkdv_overlap`` (named in each line); with ``fused_bq`` the
    cases of other head dims than 64 are skipped (one line each) and ``FUSED_CHECKS`` added,
    with ``dkdv_bq=128`` those of D=64 and ``BQ128_CHECKS`` added; with ``convert_lag`` the
    causal and D=64 cases are skipped."""
    import torch

    fails = 0
    dts = {"bf16": torch.bfloat16, "f16": torch.float16}
    tol = {"bf16": 1e-2, "f16": 4e-3}
    only, why = ((64, "fused_bq") if options.get("fused_bq") else
                 (128, "dkdv_bq=128") if options.get("dkdv_bq") == 128 else (None, None))
    if only and cases is CHECKS:
        cases = CHECKS + (FUSED_CHECKS if only == 64 else BQ128_CHECKS)
    for B, S, Hq, Hkv, D, dtn, causal in cases:
        if only and D != only:
            print(f"B{B} S{S} H{Hq}/{Hkv} D{D} {dtn}: skipped ({why} is for D={only})")
            continue
        if options.get("convert_lag") not in (None, 0, "auto") and (causal or D != 128):
            print(f"B{B} S{S} H{Hq}/{Hkv} D{D} {dtn}: skipped (convert_lag is for full "
                  f"attention at D=128)")
            continue
        torch.manual_seed(0)
        dt = dts[dtn]
        q = torch.randn(B, S, Hq, D, device="cuda", dtype=dt)
        k = torch.randn(B, S, Hkv, D, device="cuda", dtype=dt)
        v = torch.randn(B, S, Hkv, D, device="cuda", dtype=dt)
        do = torch.randn(B, S, Hq, D, device="cuda", dtype=dt)
        o, lse, rq, rk, rv = reference(q, k, v, do, causal)
        mode = "atomic" if atomic_dq else "safe" if safe else "fast"
        mode += "".join(f" {n}={v if isinstance(v, str) else int(v)}"
                        for n, v in sorted(options.items()))
        tag = f"{mode} B{B} S{S} H{Hq}/{Hkv} D{D} {dtn} {'causal' if causal else 'full'}"
        try:
            got = attention_backward(q, k, v, o.to(dt), lse.float(), do, causal=causal, safe=safe,
                                     atomic_dq=atomic_dq, **options)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - report and go on to the next case
            print(f"{tag}: {type(e).__name__}: {str(e)[:300]} FAIL")
            fails += 3
            continue
        for nm, g, r in zip(("dq", "dk", "dv"), got, (rq, rk, rv)):
            bad = torch.isnan(g).any().item()
            err = ((g.double() - r).norm() / r.norm()).item()
            worst = ((g.double() - r).abs().max() / r.abs().max()).item()
            ok = not bad and err < tol[dtn] and worst < 0.1
            fails += not ok
            print(f"{tag} {nm}: rel err {err:.2e} max err/max {worst:.2e}"
                  f"{' NaN' if bad else ''} {'PASS' if ok else 'FAIL'}")
    return fails


def _lse(q, k, causal, chunk=512):
    """float32 log-sum-exp of scaled scores, (B, H, S), in query chunks."""
    import torch

    B, S, H, D = q.shape
    out = torch.empty(B, H, S, device=q.device, dtype=torch.float32)
    kt = k.float().permute(0, 2, 3, 1)
    for i in range(0, S, chunk):
        s = torch.einsum("bihd,bhdj->bhij", q[:, i:i + chunk].float(), kt) / math.sqrt(D)
        if causal:
            rows = torch.arange(i, min(S, i + chunk), device=q.device)[:, None]
            s = s.masked_fill(torch.arange(S, device=q.device)[None, :] > rows, float("-inf"))
        out[:, :, i:i + chunk] = torch.logsumexp(s, dim=-1)
    return out


def main(argv=None) -> int:
    """``python -m pyptx_kernels.flash_attention.backward [--fast] [--safe] [--atomic] [--options
    k=v,...]``: the probe, then PASS/FAIL per gradient of each schedule (all three by
    default; ``--options``: with the opt-in options)."""
    argv = sys.argv[1:] if argv is None else argv
    opts = parse_options(argv[argv.index("--options") + 1]) if "--options" in argv else {}
    atomic = opts.pop("atomic_dq", False)   # --options atomic_dq=1,...: every mode adds dQ
    fails = check_probe()
    # --fast / --safe / --atomic: only those schedules (safe: the simplest, to bisect a
    # failure; atomic: dQ added by the dK/dV kernel with f32 atomics, not deterministic)
    modes = [m for m in ("--fast", "--safe", "--atomic") if m in argv] or ["--fast", "--safe",
                                                                          "--atomic"]
    for m in modes:
        n = check(safe=m == "--safe", atomic_dq=m == "--atomic" or atomic, **opts)
        print(f"{m[2:]} schedule: {f'{n} FAIL' if n else 'all PASS'}")
        fails += n
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
