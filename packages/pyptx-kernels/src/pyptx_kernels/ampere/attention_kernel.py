"""The Ampere flash-attention forward, ``O = softmax(scale * Q K^T) V`` on ``mma.sync`` tensor
cores (sm_80 PTX; it runs on sm_80, sm_86, sm_89 and sm_90 devices alike).

Layout ``(B, S, H, D)`` (query head ``h`` reads key/value head ``h // (Hq // Hkv)``), bf16 or
f16, head dim 64 or 128. One CTA per ``BQ`` query rows of one head (causal: the longest rows
first); each of its warps owns 16 or 32 rows. Q is copied once with ``cp.async`` and kept in
registers as ``mma.sync`` A fragments; K/V blocks of ``BKV`` keys stream through a
double-buffered ``cp.async`` ring of swizzled shared-memory tiles (``tiles.SmemTile``). Per
block: ``S = Q K^T`` (``ldmatrix`` of K as B), the online softmax in registers (row max and
sum over the four lanes of a quad, exponentials in base 2), ``P`` packed to 16-bit A
fragments in place, and ``O += P V`` (``ldmatrix.trans`` of V). Blocks wholly below the
causal diagonal and inside ``Sk`` run unmasked; the rest mask their scores to ``-inf``. The
epilogue divides by the row sums, stores O and the log-sum-exp ``LSE (B, Hq, S)`` (f32,
natural log of the scaled scores' sum of exponentials).
"""

from __future__ import annotations

import math

from pyptx import Tile, kernel, ptx, reg, smem
from pyptx.errors import ConfigError
from pyptx.types import bf16, f16, f32, s32, u32, u64
from pyptx.warpspec import min_u32
from pyptx_kernels._common import fail
from pyptx_kernels.ampere.attention_config import Sm80AttentionConfig, for_head_dim
from pyptx_kernels.ampere.tiles import Fragments, SmemTile, TileCopy

NEG_INF = float("-inf")
LN2 = math.log(2.0)


def _wide(x, scale: int):
    """``x * scale`` as a new u64 register (``mul.wide.u32``)."""
    d = reg.scalar(u64)
    ptx.inst.mul.wide.u32(d, x, scale)
    return d


def build_sm80_attention(B: int, S: int, Hq: int, Hkv: int, D: int, *, Sk: int | None = None,
                         dtype="bf16", causal: bool = False, scale: float | None = None,
                         config=None):
    """The Ampere attention forward kernel for ``q (B, S, Hq, D)``, ``k, v (B, Sk, Hkv, D)``.

    Outputs ``O (B, S, Hq, D)`` in the input dtype and ``LSE (B, Hq, S)`` f32. ``causal``:
    query ``i`` sees keys ``j <= i`` (top-left aligned). ``scale`` defaults to ``1/sqrt(D)``.
    ``config``: a ``Sm80AttentionConfig`` for this ``D`` (default ``for_head_dim(D)``)."""
    who = "build_sm80_attention"
    Sk = S if Sk is None else Sk
    for name, v in (("B", B), ("S", S), ("Hq", Hq), ("Hkv", Hkv), ("Sk", Sk)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise fail(ConfigError, who, f"{name} must be a positive int, got {v!r}")
    if Hq % Hkv:
        raise fail(ConfigError, who, f"Hq must be a multiple of Hkv, got Hq={Hq}, Hkv={Hkv}")
    tname = getattr(dtype, "name", dtype)
    if tname not in ("bf16", "f16"):
        raise fail(ConfigError, who, f"dtype must be bf16 or f16, got {dtype!r}")
    dt = bf16 if tname == "bf16" else f16
    if not isinstance(causal, bool):
        raise fail(ConfigError, who, f"causal must be True or False, got {causal!r}")
    if D not in (64, 128):
        raise fail(ConfigError, who, f"head dim D must be 64 or 128, got {D!r}")
    cfg = for_head_dim(D) if config is None else config
    if not isinstance(cfg, Sm80AttentionConfig) or cfg.D != D:
        raise fail(ConfigError, who, f"config must be a Sm80AttentionConfig with D={D}, "
                   f"got {config!r}")
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise fail(ConfigError, who, f"scale must be a positive number, got {scale!r}")
    sl2 = float(scale) * math.log2(math.e)
    BQ, BKV, T = cfg.BQ, cfg.BKV, cfg.threads
    MI = cfg.rows_per_warp // 16
    NB8, KC, DN = BKV // 8, BKV // 16, D // 8
    NQB, NKV = -(-S // BQ), -(-Sk // BKV)
    G = Hq // Hkv
    q_tile, kv_tile = SmemTile(BQ, D), SmemTile(BKV, D)
    pack = ptx.pack_bf16x2 if dt is bf16 else ptx.pack_f16x2

    def body(Q, K, V, Out, LSE):
        pq, pk, pv, po, pl = ptx.global_ptrs(Q, K, V, Out, LSE)
        tid = reg.from_(ptx.special.tid.x(), u32)
        lane, warp = tid & 31, tid >> 5
        g, t = lane >> 2, lane & 3
        cx = reg.from_(ptx.special.ctaid.x(), u32)
        qb = (NQB - 1) - cx if causal else cx
        h = reg.from_(ptx.special.ctaid.y(), u32)
        b = reg.from_(ptx.special.ctaid.z(), u32)
        hk = h // G if G > 1 else h
        q0 = qb * BQ
        q_head = _wide(b, S * Hq * D * 2) + _wide(h, D * 2)
        kv_head = _wide(b, Sk * Hkv * D * 2) + _wide(hk, D * 2)
        base = (smem.dynamic(align=128, name="ring").addr() + 127) & 0xFFFFFF80
        s0 = base + q_tile.nbytes
        s1 = s0 + 2 * kv_tile.nbytes
        cq = TileCopy(q_tile, T, tid, pq + q_head, Hq * D, rows_total=S if S % BQ else None,
                      cols_total=None)
        ragged_k = Sk % BKV != 0
        ck = TileCopy(kv_tile, T, tid, pk + kv_head, Hkv * D,
                      rows_total=Sk if ragged_k else None, cols_total=None)
        cv = TileCopy(kv_tile, T, tid, pv + kv_head, Hkv * D,
                      rows_total=Sk if ragged_k else None, cols_total=None)

        def load_kv(stage, kv0):
            ck.issue(stage, kv0, 0)
            cv.issue(stage + kv_tile.nbytes, kv0, 0)

        cq.issue(base, q0, 0)
        load_kv(s0, 0)
        ptx.cp_async.commit_group()
        ptx.cp_async.wait_all()
        ptx.bar_sync(0)
        wrow = warp * cfg.rows_per_warp
        fq = Fragments(q_tile, "a", lane, wrow, 0, range(0, D, 16))
        qf = []
        for kk in range(D // 16):
            at = fq.at(base, kk * 16)
            qf.append([fq.load(at, i * 16) for i in range(MI)])
        fk = Fragments(kv_tile, "b_nk", lane, 0, 0, range(0, D, 16))
        fv = Fragments(kv_tile, "b_kn", lane, 0, 0, range(0, D, 16))

        zero = reg.array(f32, 4)
        for r in zero:
            ptx.inst.mov.f32(r, 0.0)
        o = [[reg.array(f32, 4) for _ in range(DN)] for _ in range(MI)]
        for row in o:
            for a in row:
                for r in a:
                    ptx.inst.mov.f32(r, 0.0)
        m_row = [[reg.scalar(f32, init=NEG_INF) for _ in range(2)] for _ in range(MI)]
        l_row = [[reg.scalar(f32, init=0.0) for _ in range(2)] for _ in range(MI)]
        row_t = q0 + wrow + g                     # this thread's first query row
        cur = reg.scalar(u32, init=s0)
        nxt = reg.scalar(u32, init=s1)
        flip = s0 ^ s1

        if causal:
            n_total = min_u32((q0 + (BQ + BKV - 1)) // BKV, NKV)
            n_full = min_u32((q0 + 1) // BKV, Sk // BKV)
        else:
            n_total = reg.scalar(u32, init=NKV)
            n_full = reg.scalar(u32, init=Sk // BKV)

        def block(j, masked):
            ptx.cp_async.wait_group(0)
            ptx.bar_sync(0)
            kv0 = j * BKV
            with ptx.if_(j + 1 < n_total):
                load_kv(nxt, kv0 + BKV)
            ptx.cp_async.commit_group()
            v_st = cur + kv_tile.nbytes
            s = [[reg.array(f32, 4) for _ in range(NB8)] for _ in range(MI)]
            for kk in range(D // 16):
                at_k = fk.at(cur, kk * 16)
                kb = [fk.load(at_k, jj * 16) for jj in range(KC)]
                for i in range(MI):
                    for j8 in range(NB8):
                        bk = kb[j8 // 2][2 * (j8 % 2):2 * (j8 % 2) + 2]
                        ptx.mma_sync(s[i][j8], qf[kk][i], bk, s[i][j8] if kk else zero,
                                     dtype_ab=dt.name)
            for i in range(MI):
                for hh in range(2):
                    vals = [(s[i][j8], 2 * hh + e) for j8 in range(NB8) for e in range(2)]
                    if masked:   # key offset j8 * 8 + e is masked past thr (signed)
                        col = kv0 + t * 2
                        thr = reg.scalar(s32)
                        ptx.inst.sub.s32(thr, Sk - 1, col)
                        if causal:
                            diag = reg.scalar(s32)
                            ptx.inst.sub.s32(diag, row_t + (i * 16 + 8 * hh), col)
                            ptx.inst.min.s32(thr, thr, diag)
                        for n, (a, e) in enumerate(vals):
                            ptx.inst.selp.f32(a[e], NEG_INF, a[e], thr < (n // 2) * 8 + n % 2)
                    _softmax_rows(vals, m_row[i][hh], l_row[i][hh], o[i], hh, sl2)
            pa = [[[pack(s[i][2 * c + q][2 * x], s[i][2 * c + q][2 * x + 1])
                    for q in range(2) for x in range(2)] for c in range(KC)] for i in range(MI)]
            for dd in range(D // 16):       # P's A fragments: (row g, k lo), (g + 8, lo), ...hi
                at_v = fv.at(v_st, dd * 16)
                for c in range(KC):
                    vb = fv.load(at_v, c * 16)
                    for i in range(MI):
                        for e in range(2):
                            ptx.mma_sync(o[i][2 * dd + e], pa[i][c], vb[2 * e:2 * e + 2],
                                         o[i][2 * dd + e], dtype_ab=dt.name)
            ptx.inst.xor.b32(cur, cur, flip)
            ptx.inst.xor.b32(nxt, nxt, flip)

        for j in ptx.loop(0, n_full):
            block(j, masked=False)
        for j in ptx.loop(n_full, n_total):
            block(j, masked=True)
        ptx.cp_async.wait_all()

        o_ptr = po + q_head + _wide(row_t, Hq * D * 2) + t * 4
        lse_ptr = pl + _wide(b * Hq + h, S * 4) + _wide(row_t, 4)
        for i in range(MI):
            for hh in range(2):
                dr = i * 16 + 8 * hh
                if S % BQ and S - dr <= 0:          # no query block has a row here
                    continue
                ok = row_t < S - dr if S % BQ else None
                lsum = l_row[i][hh]
                ptx.warp.reduce_sum(lsum, width=4)
                inv = reg.scalar(f32)
                ptx.inst.rcp.rn.f32(inv, lsum)
                for d8 in range(DN):
                    lo, hi = reg.scalar(f32), reg.scalar(f32)
                    ptx.inst.mul.f32(lo, o[i][d8][2 * hh], inv)
                    ptx.inst.mul.f32(hi, o[i][d8][2 * hh + 1], inv)
                    at = ptx.addr(o_ptr, (dr * Hq * D + d8 * 8) * 2)
                    ptx.inst.st.global_.b32(at, pack(lo, hi), pred=ok)
                lse = reg.scalar(f32)
                ptx.inst.lg2.approx.f32(lse, lsum)
                ptx.inst.add.f32(lse, lse, m_row[i][hh])
                ptx.inst.mul.f32(lse, lse, LN2)
                first = t == 0
                ok_l = first if ok is None else (first & ok)
                ptx.inst.st.global_.f32(ptx.addr(lse_ptr, dr * 4), lse, pred=ok_l)
        ptx.ret()

    name = (f"sm80_attn_{dt.name}_d{D}_{'causal' if causal else 'full'}_q{BQ}_kv{BKV}"
            f"_w{cfg.warps}")
    deco = kernel(in_specs=(Tile(B, S, Hq, D, dt), Tile(B, Sk, Hkv, D, dt),
                            Tile(B, Sk, Hkv, D, dt)),
                  out_specs=(Tile(B, S, Hq, D, dt), Tile(B, Hq, S, f32)),
                  grid=(NQB, Hq, B), block=(T, 1, 1), smem=cfg.smem_bytes, arch="sm_80",
                  name=name)

    def sm80_attention(Q, K, V, Out, LSE):
        body(Q, K, V, Out, LSE)

    return deco(sm80_attention)


def _softmax_rows(vals, m_row, l_row, o_row, hh, sl2):
    """The online softmax of one query row's scores ``vals`` (``(array, index)`` pairs of this
    thread's S fragments; the row spans the four lanes of a quad): the new running max
    ``m_row`` (scaled, base 2), ``vals`` replaced by ``exp2(sl2 * s - m)``, the partial row sum
    ``l_row`` and the row's O fragments (half ``hh`` of each) rescaled by ``exp2(m_old - m)``."""
    regs = [a[e] for a, e in vals]
    mx = reg.scalar(f32)
    ptx.inst.max.f32(mx, regs[0], regs[1])
    for r in regs[2:]:
        ptx.inst.max.f32(mx, mx, r)
    ptx.warp.reduce_max(mx, width=4)
    m_new = reg.scalar(f32)
    ptx.inst.mul.f32(m_new, mx, sl2)
    ptx.inst.max.f32(m_new, m_new, m_row)
    m_use = reg.scalar(f32)                      # a row with no key yet: exp2(x - 0)
    ptx.inst.selp.f32(m_use, 0.0, m_new, m_new == NEG_INF)
    alpha = reg.scalar(f32)
    ptx.inst.sub.f32(alpha, m_row, m_use)
    ptx.inst.ex2.approx.ftz.f32(alpha, alpha)
    neg = reg.scalar(f32)
    ptx.inst.neg.f32(neg, m_use)
    total = None
    for r in regs:
        ptx.inst.fma.rn.f32(r, r, sl2, neg)
        ptx.inst.ex2.approx.ftz.f32(r, r)
        if total is None:
            total = reg.scalar(f32)
            ptx.inst.mov.f32(total, r)
        else:
            ptx.inst.add.f32(total, total, r)
    ptx.inst.fma.rn.f32(l_row, l_row, alpha, total)
    ptx.inst.mov.f32(m_row, m_new)
    for a in o_row:
        ptx.inst.mul.f32(a[2 * hh], a[2 * hh], alpha)
        ptx.inst.mul.f32(a[2 * hh + 1], a[2 * hh + 1], alpha)
