"""Pre- and post-processing of the backward. The stats rows every kernel reads from the padded
STATS scratch (``(lse * log2 e, delta = rowsum(dO * O))`` pairs, ``padded(S)`` rows per q head)
are computed by the helpers here, inside the dQ kernel, the dK/dV kernel (``stats_lead``) or
``build_prep``: the atomic-dQ modes' first kernel (stats, a zeroed f32 dQ accumulator, the
ordered mode's counters). ``build_convert``: the f32 accumulator to the 16-bit dQ."""

from __future__ import annotations

from pyptx import Tile, kernel, ptx, reg
from pyptx.types import b32, f32, s32, u32, u64
from pyptx_kernels import _family
from pyptx_kernels.flash_attention.bwd_common import (
    BM,
    LOG2E,
    _dtype,
    _fail,
    _maybe_if,
    _unpack,
    padded,
    size_params,
)
from pyptx_kernels.flash_attention.bwd_plan import check_dq_chains


def build_prep(B, S, Hq, D, *, dtype="bf16", counters=False, width=None, lead=0, Hkv=None,
               zero=None, chains=1):
    """The atomic-dQ mode's first kernel: ``(OUT, LSE, DO) -> (STATS, DQACC)``: the stats
    of ``build_dq`` and a zeroed f32 ``DQACC`` ``(B, S, Hq, D)`` for the dK/dV kernel to add
    into. 256 threads per 128 rows, the same row split as the dQ kernel's consumers.
    ``counters``: also a zeroed int32 ``SEM`` ``(B, Hq, ceil(S/64), 2)``, the ordered dQ
    mode's counters (``build_dkdv(dq_ordered=True)``), and DQACC is left unwritten (each
    tile's first add stores it). ``width``: DQACC's columns (``dq_accumulator_width``).
    ``lead`` (with ``counters``; ``build_dkdv``'s ``stats_lead``): the stats of the first
    ``lead`` kv heads (``Hkv`` of them per batch, in launch order) only; the dK/dV grid
    writes the others'. ``zero`` (``None``: not ``counters``): whether DQACC is zeroed (a
    window's ordered dQ: q blocks no kv block reaches get no first store). ``chains`` (with
    ``counters``; ``build_dkdv``'s ``dq_chains``): SEM ``(chains * B, Hq, ceil(S/64), 2)``,
    chain ``c``'s counters in its ``c``-th ``B`` rows, all zeroed."""
    zeroed = not counters if zero is None else bool(zero)
    if lead and not (counters and isinstance(Hkv, int) and Hkv > 0 and Hq % Hkv == 0):
        raise _fail(f"build_prep: lead needs counters=True and Hkv (a divisor of Hq), got "
                    f"lead={lead!r}, counters={counters!r}, Hkv={Hkv!r}")
    check_dq_chains("build_prep", chains, counters)
    width = D if width is None else width
    dt = _dtype(dtype)
    Sp = padded(S)
    qspec = Tile(B, S, Hq, D, dt)
    nq = -(-S // 64)
    sizes = dict(seqlen_q=S, stats_rows=Sp, sem_blocks=nq)
    if chains > 1:
        sizes["units"] = B * Hq * nq            # counters per chain

    def prep(OUT, LSE, DO, STATS, DQACC, SEM):
        z = size_params(sizes)
        S, Sp, nq = z.seqlen_q, z.stats_rows, z.sem_blocks
        tid = reg.from_(ptx.special.tid.x(), u32)
        hq = reg.from_(ptx.special.ctaid.y(), u32)
        b = reg.from_(ptx.special.ctaid.z(), u32)
        q0 = reg.from_(ptx.special.ctaid.x(), u32) * BM
        po, pdo, plse, pstats, pacc = ptx.global_ptrs(OUT, DO, LSE, STATS, DQACC)
        with _maybe_if(hq // (Hq // Hkv) + Hkv * b < lead if lead else None):
            _prep_stats(po, pdo, plse, pstats, b, hq, q0, tid, S, Sp, Hq, D, dt)
        if zeroed:          # DQACC's 128 rows: a warp zeroes a row's 16-byte chunks per turn
            zero = reg.scalar(f32, init=0.0)
            per_row = width // 4
            for k in range(BM * per_row // 256):
                x = tid + 256 * k
                r = x // per_row
                elem = ((b * S + q0 + r) * Hq + hq) * width + (x % per_row) * 4
                ptx.inst.st.global_.v4.f32(ptx.addr(reg.from_(elem, u64) * 4 + pacc),
                                           [zero] * 4, pred=q0 + r < S)
        if counters:  # this CTA's two q blocks of 64 rows, two counters each (per chain)
            (psem,) = ptx.global_ptrs(SEM)
            qb = reg.from_(ptx.special.ctaid.x(), u32) * 2 + (tid >> 1 if chains == 1
                                                               else tid >> 1 & 1)
            cell = ((b * Hq + hq) * nq + qb) * 2 + (tid & 1)
            if chains > 1:      # thread 4c + i: chain c's cell i
                cell = cell + (tid >> 2) * (z.units * 2)
            ptx.inst.st.global_.u32(ptx.addr(reg.from_(cell, u64) * 4 + psem), 0,
                                    pred=(tid < 4 * chains) & (qb < nq))
        ptx.ret()

    outs = (Tile(B, Hq, Sp, 2, f32), Tile(B, S, Hq, width, f32))
    if counters:
        outs += (Tile(chains * B, Hq, nq, 2, s32),)
        fn = prep
    else:
        def fn(OUT, LSE, DO, STATS, DQACC):
            prep(OUT, LSE, DO, STATS, DQACC, None)
    fn.__name__ = "prep"
    k = kernel(in_specs=(qspec, Tile(B, Hq, S, f32), qspec), out_specs=outs,
               grid=(-(-S // BM), Hq, B), block=(256, 1, 1),
               name=f"attn_bwd_prep_{dt.name}_d{D}{'_sem' if counters else ''}"
                    f"{'_zero' if zeroed and counters else ''}"
                    f"{f'_w{width}' if width != D else ''}{f'_lead{lead}' if lead else ''}"
                    f"{f'_c{chains}' if chains > 1 else ''}")(fn)
    family = ("attn_bwd_prep", dt.name, D, Hq, counters, width, lead, Hkv if lead else None,
              zeroed, chains)
    return _family.specialized(k, family, sizes)


def build_convert(B, S, Hq, D, *, dtype="bf16", scale=1.0, width=None, chains=1):
    """The atomic-dQ mode's last kernel: ``DQACC`` f32 -> ``DQ`` (times ``scale``), eight
    elements per thread. ``width`` (``dq_accumulator_width``) ``2 * D``: each row holds two
    partial sums, added (first + second) before the conversion. ``chains``
    (``dq_chains``): rows of ``chains`` such accumulators side by side, summed in chain
    order (``chain_sum``); a chain no kv block reached must hold zeros (the prep's)."""
    width = D if width is None else width
    if width not in (D, 2 * D):
        raise _fail(f"build_convert: width must be {D} or {2 * D}, got {width}")
    check_dq_chains("build_convert", chains, True)
    dt = _dtype(dtype)
    n = B * S * Hq * D
    blocks = -(-n // (256 * 8))

    sizes = dict(chunks=n // 8)

    def convert(DQACC, DQ):
        z = size_params(sizes)
        pa, pq = ptx.global_ptrs(DQACC, DQ)
        i = reg.from_(ptx.special.ctaid.x(), u32) * 256 + reg.from_(ptx.special.tid.x(), u32)
        ok = i < z.chunks
        if width * chains == D:
            src = reg.from_(i, u64) * 32 + pa
        else:   # eight columns c.. of row r: elements r * chains * width + c (+ D for the
            # second sum, + width for the next chain)
            row = i // (D // 8)
            src = (reg.from_(row, u64) * (width * chains)
                   + reg.from_((i - row * (D // 8)) * 8, u64)) * 4 + pa
        dst = reg.from_(i, u64) * 16 + pq
        with ptx.if_(ok):  # threads past the end compute nothing (no undefined registers)
            sums = []
            for c in range(chains):     # chain c: columns from c * width
                at = 4 * c * width
                v = reg.array(f32, 8)
                ptx.inst.ld.global_.nc.v4.f32(list(v)[:4],
                                              ptx.addr(src, at) if c else ptx.addr(src))
                ptx.inst.ld.global_.nc.v4.f32(list(v)[4:], ptx.addr(src, at + 16))
                if width != D:
                    u = reg.array(f32, 8)
                    ptx.inst.ld.global_.nc.v4.f32(list(u)[:4], ptx.addr(src, at + 4 * D))
                    ptx.inst.ld.global_.nc.v4.f32(list(u)[4:], ptx.addr(src, at + 4 * D + 16))
                    for m in range(8):
                        ptx.inst.add.f32(v[m], v[m], u[m])
                sums.append(v)
            v = chain_sum(sums)
            packed = reg.array(b32, 4)
            for m in range(4):
                ptx.inst(f"cvt.rn.{dt.name}x2.f32")(packed[m], v[2 * m + 1] * float(scale),
                                                    v[2 * m] * float(scale))
            ptx.inst.st.global_.v4.b32(ptx.addr(dst), packed)
        ptx.ret()

    k = kernel(in_specs=(Tile(B, S, Hq, width * chains, f32),), out_specs=(Tile(B, S, Hq, D, dt),),
               grid=(blocks, 1, 1), block=(256, 1, 1),
               name=f"attn_bwd_convert_{dt.name}_d{D}{f'_w{width}' if width != D else ''}"
                    f"{f'_c{chains}' if chains > 1 else ''}")(convert)
    return _family.specialized(k, ("attn_bwd_convert", dt.name, D, float(scale), width, chains),
                               sizes)


def chain_sum(sums):
    """``dq_chains``' fixed order of adds: chain 0's registers plus chain 1's, then plus
    chain 2's, ... (in place, in chain 0's; the same bits at every run)."""
    for x in sums[1:]:
        for m in range(len(sums[0])):
            ptx.inst.add.f32(sums[0][m], sums[0][m], x[m])
    return sums[0]


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
