"""The decode kernel's tensor-core consumers (``DecodeConfig(mma=True)``): ``consume``.

A CTA's query rows (up to ``MMA_ROWS``; fewer are zero padding, never stored) form one m16
tile, kept in every consumer warp's registers as ``mma.sync`` m16n8k16 A fragments. A ring
block of ``MMA_BLOCK`` keys is ``D // 64`` slabs of 64 columns with the 128-byte swizzle
(``ampere.tiles.SmemTile(MMA_BLOCK, 64)``, as the TMA writes it); warp ``w`` takes keys
``16w .. 16w + 15`` of each block: ``S = Q K^T`` (``ldmatrix`` of K as B), the forward's
online softmax (``fwd_softmax.OnlineSoftmax``: the same per-warp fragment layout as
wgmma's, log2 units, each row over a quad, the lazy rescale of ``RESCALE_THRESHOLD``), P
packed into the A fragments of ``O += P V`` (``ldmatrix.trans`` of V). Each warp keeps its
own ``(m, l, O)``; ``decode_kernel._merge_and_store`` merges the four per row.

Scores are scaled in f32 after the product (softcap: ``tanh(s * scale / softcap)``), then
masked to ``-inf`` outside each row's window ``[lo, hi)`` (``hi`` cut at the split's end,
``masks.mask_scores``); blocks wholly inside every row's window skip the masks (a uniform
branch). Cache rows at positions ``>= L`` may hold anything (NaN, and ``0 * NaN`` is NaN in
an MMA): a warp whose keys reach them zeroes its V rows there (their K scores are masked),
and with ``append`` copies the new rows into positions ``cache_seqlens[b] .. L - 1`` of its
stage, before its ``ldmatrix`` (``bar.warp.sync``); only blocks reaching those positions
take that branch.
"""

from __future__ import annotations

from pyptx import ptx, reg
from pyptx.types import b32, f32, s32, u32
from pyptx_kernels.ampere.tiles import Fragments, SmemTile
from pyptx_kernels.flash_attention.decode_config import MMA_BLOCK, MMA_SLAB
from pyptx_kernels.flash_attention.decode_kernel import _min_s32, _wide
from pyptx_kernels.flash_attention.fwd_config import LOG2E, RESCALE_THRESHOLD
from pyptx_kernels.flash_attention.fwd_softmax import OnlineSoftmax
from pyptx_kernels.flash_attention.masks import mask_scores

_WARP_KEYS = 16


class MmaRows:
    """One consumer lane's share of the CTA's m16 row tile: Q fragments, the window limits
    of its two rows (``g`` and ``g + 8`` of the tile), their online softmax and the O
    accumulators (``D // 8`` n8 tiles). ``strides``: ``decode_kernel.Strides`` of q and the
    new k, v by tensor name."""

    def __init__(self, *, sh, dt, ring, rows, chunk, b, hkv, sc, L, s1, tid, pq, window,
                 softcap, scale, new, strides):
        D, G, Sq = sh.D, sh.group, sh.Sq
        self.sh, self.dt, self.ring, self.rows = sh, dt, ring, rows
        self.b, self.hkv, self.sc, self.L, self.new = b, hkv, sc, L, new
        self.strides = strides
        lane = tid & 31
        self.warp = tid >> 5
        self.g, self.t = lane >> 2, lane & 3
        self.lane = lane
        lu = reg.from_(lane, u32)
        key0 = reg.from_(self.warp * _WARP_KEYS, u32)
        slab = SmemTile(MMA_BLOCK, MMA_SLAB)
        steps = range(0, MMA_SLAB, 16)
        self.fk = Fragments(slab, "b_nk", lu, key0, 0, steps)
        self.fv = Fragments(slab, "b_kn", lu, key0, 0, steps)
        self.v_rows = ring.stages * ring.block_bytes // slab.row_bytes
        left, right = window
        cap, self.pre = None, None
        if softcap:
            cap, sl2 = scale / softcap, softcap * LOG2E
        elif scale > 0:
            sl2 = scale * LOG2E
        else:          # OnlineSoftmax scales its max: a positive factor only
            self.pre, sl2 = scale * LOG2E, 1.0
        self.q = [reg.array(b32, 4) for _ in range(D // 16)]
        self.lo, self.hi = [], []
        for hh in range(2):
            r = self.g + 8 * hh
            rr = r if chunk is None else chunk * rows + r
            real = r < rows if chunk is None else (r < rows) & (rr < G * Sq)
            qi = rr // G
            at = pq + strides["Q"].at(b, qi, hkv * G + rr % G) + _wide(self.t, 4)
            for kk in range(D // 16):
                for x in range(2):
                    w = self.q[kk][2 * x + hh]
                    ptx.inst.mov.b32(w, 0)
                    ptx.inst.ld.global_.b32(w, ptx.addr(at, (kk * 16 + 8 * x) * 2), pred=real)
            pos = L - Sq + qi
            hi = _min_s32(L, pos + (right + 1)) if right >= 0 else L
            self.hi.append(_min_s32(hi, s1))
            self.lo.append(pos - left if left >= 0 else None)
        # the CTA's rows share [lo_max, hi_min): blocks inside need no mask
        if chunk is None:
            first, last = 0, Sq - 1
        else:
            r0 = chunk * rows
            first, last = r0 // G, (_min_s32(r0 + rows, G * Sq) - 1) // G
        self.hi_min = _min_s32(s1, L - Sq + first + (right + 1)) if right >= 0 else s1
        self.lo_max = L - Sq + last - left if left >= 0 else None
        self.key_lane = self.warp * _WARP_KEYS + self.t * 2
        self.s = [reg.array(f32, 4) for _ in range(2)]
        self.o = [reg.array(f32, 4) for _ in range(D // 8)]
        self.p = reg.array(b32, 4)
        self.zero = reg.array(f32, 4)
        for a in (*self.o, self.zero):
            for x in a:
                ptx.inst.mov.f32(x, 0.0)
        self.sm = OnlineSoftmax([x for a in self.s for x in a], [x for a in self.o for x in a],
                                self.p, BN=_WARP_KEYS, D=D, sl2=sl2,
                                rescale_threshold=RESCALE_THRESHOLD, dt=dt, cap=cap)
        self.sm.reset()

    def full(self, blk):
        """Whether block ``blk`` lies inside every row's window (a CTA-uniform predicate)."""
        inside = blk + MMA_BLOCK <= self.hi_min
        return inside if self.lo_max is None else inside & (blk >= self.lo_max)

    def fix(self, kst, blk):
        """This warp's 16 rows of the stage at ``kst``: V zeroed at positions ``>= L``, K and
        V of appended positions (``sc <= pos < L``) copied from the new rows."""
        sh, D = self.sh, self.sh.D
        cpr = D // 8
        per = 32 // cpr
        v_off = self.ring.stages * self.ring.block_bytes
        rl, cl = self.lane // cpr, self.lane % cpr
        slab = reg.from_((cl >> 3) * (MMA_BLOCK * MMA_SLAB * 2), u32)
        zeros = reg.array(b32, 4)
        for x in zeros:
            ptx.inst.mov.b32(x, 0)
        for i in range(_WARP_KEYS // per):
            row = rl + i * per
            kr = self.warp * _WARP_KEYS + row
            pos = blk + kr
            off = reg.from_(kr * (MMA_SLAB * 2) + (((cl & 7) ^ (row & 7)) << 4), u32)
            at = kst + slab + off
            ptx.inst.st.shared.v4.b32(ptx.addr(at, v_off), list(zeros), pred=pos >= self.L)
            if sh.append:
                new = (pos >= self.sc) & (pos < self.L)
                col = _wide(cl, 16)
                for pn, extra, name in zip(self.new, (0, v_off), ("KN", "VN")):
                    src = self.strides[name].at(self.b, pos - self.sc, self.hkv) + col
                    w = reg.array(b32, 4)
                    for x in w:
                        ptx.inst.mov.b32(x, 0)
                    ptx.inst.ld.global_.v4.b32(w, ptx.addr(pn + src), pred=new)
                    ptx.inst.st.shared.v4.b32(ptx.addr(at, extra), list(w), pred=new)
        ptx.inst("bar.warp.sync")(0xFFFFFFFF)

    def block(self, kst, blk, masked):
        """Fold this warp's 16 keys of the stage at ``kst`` (block ``blk``) into its rows;
        ``masked``: apply the window limits per score."""
        D, dt, s = self.sh.D, self.dt, self.s
        at_k = [self.fk.at(kst, c) for c in range(0, min(D, MMA_SLAB), 16)]
        for kk in range(D // 16):
            slab, c = divmod(kk, MMA_SLAB // 16)
            kb = self.fk.load(at_k[c], slab * MMA_BLOCK)
            for j in range(2):
                ptx.mma_sync(s[j], self.q[kk], kb[2 * j:2 * j + 2], s[j] if kk else self.zero,
                             dtype_ab=dt.name)
        if self.pre is not None:
            for a in s:
                for x in a:
                    ptx.inst.mul.f32(x, x, self.pre)
        self.sm.cap_scores()
        if masked:
            mask_scores(self.sm.s_acc, _WARP_KEYS, blk + self.key_lane, 0,
                        list(zip(self.lo, self.hi)))
        self.sm.update()
        self.sm.rescale_and_pack()
        at_v = [self.fv.at(kst, c) for c in range(0, min(D, MMA_SLAB), 16)]
        for dd in range(D // 16):
            slab, c = divmod(dd, MMA_SLAB // 16)
            vb = self.fv.load(at_v[c], self.v_rows + slab * MMA_BLOCK)
            for e in range(2):
                ptx.mma_sync(self.o[2 * dd + e], self.p, vb[2 * e:2 * e + 2], self.o[2 * dd + e],
                             dtype_ab=dt.name)

    def store_states(self, slots, sync):
        """Write this warp's rows' states into the merge ``slots``
        (``decode_kernel._merge_and_store``: group = warp)."""
        m_at, l_at, o_at = slots
        D, rows = self.sh.D, self.rows
        for x in self.sm.l_row:
            ptx.warp.reduce_sum(x, width=4)
        sync()
        for hh in range(2):
            if 8 * hh >= rows:
                continue
            r = self.g + 8 * hh
            ok = r < rows if rows < 8 * hh + 8 else None
            slot = self.warp * rows + r
            lead = self.t == 0 if ok is None else (self.t == 0) & ok
            ptx.inst.st.shared.f32(ptx.addr(m_at + reg.from_(slot * 4, u32)),
                                   self.sm.m_row[hh], pred=lead)
            ptx.inst.st.shared.f32(ptx.addr(l_at + reg.from_(slot * 4, u32)),
                                   self.sm.l_row[hh], pred=lead)
            oa = o_at + reg.from_((slot * D + self.t * 2) * 4, u32)
            for d8 in range(D // 8):
                ptx.inst.st.shared.v2.f32(ptx.addr(oa, d8 * 32), self.o[d8][2 * hh:2 * hh + 2],
                                          pred=ok)
        sync()


def consume(ring, st, *, s0, s1, fix_from):
    """The consumer warps over the split's blocks ``[s0, s1)`` of the ring: ``st`` (an
    ``MmaRows``) folds each block in; warps whose keys reach ``fix_from`` (the first
    position not read from the cache as it is) fix their rows first. Every thread fences
    and arrives on the stage's empty barrier."""
    cst = ring.pipe.consumer_state()
    warp_end = st.warp * _WARP_KEYS + _WARP_KEYS
    for blk in ptx.loop(s0, s1, MMA_BLOCK, type=s32):
        ring.pipe.wait(cst)
        kst = ring.k_base + cst.stage * ring.block_bytes
        with ptx.if_(blk + warp_end > fix_from):
            st.fix(kst, blk)
        with ptx.if_(st.full(blk)):
            st.block(kst, blk, masked=False)
        with ptx.else_():
            st.block(kst, blk, masked=True)
        ptx.fence_proxy_async("shared::cta")
        ring.pipe.release(cst)
        cst.advance()
