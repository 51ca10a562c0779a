"""The split-KV decode kernel of ``attention_with_kvcache``: ``build_decode``.

One CTA per (KV split, KV head x row chunk, batch). Its rows are the query heads of the
KV head's group times the new queries (row ``r`` = query ``r // G``, head ``hkv * G + r % G``),
so one read of the KV head serves every row. With the ring (default), a producer warp
copies blocks of ``BN`` keys of K and V by TMA (rank-4 maps over the cache, unswizzled,
one block-table read per block) into a ``stages``-deep shared ring guarded by mbarriers;
without it every lane loads its keys from global memory. Each key row is read with
16-byte accesses by ``D // 8`` lanes (``decode_config``), the CTA's lane groups take
consecutive keys, each group folds ``keys_per_step`` keys at a time into an online softmax
(log2 units) per row, and at the end the groups are merged through shared memory into
the split's partial ``O`` (normalised, f32) and natural-log ``lse`` (``-inf``: no key).
One launch: with one split the merge writes the output itself; with more, each CTA counts
its arrival on a per-(batch, KV head, row chunk) counter after its partial is stored, and
the last to arrive combines the splits in split order (``decode_combine.combine_row``, the
operations of the two-launch ``build_combine``: bit-identical) and resets the counter.
``DecodeConfig(mma=True)`` replaces the lane groups by tensor-core consumers
(``decode_mma``: one m16 tile of rows, ``mma.sync`` products over 64-key blocks of a
128-byte swizzled ring, the four warps' states merged the same way).

Keys: caches ``(B, Sk_max, Hkv, D)``, or paged ``(pages, page_size, Hkv, D)`` through
``block_table (B, max_pages)``. Sequence ``b`` has ``L = cache_seqlens[b] + n_new``
keys (read on the device); query ``i`` sits at position ``L - Sq + i`` and sees keys
``pos - left <= j <= pos + right`` (``causal``: right = 0; -1: unbounded). Only the
window's keys are split and visited. With ``append``, the new ``k, v (B, Sq, Hkv, D)`` are
read for positions ``>= cache_seqlens[b]`` and written into the cache there by the split-0
CTAs (no CTA reads those cache rows, so there is no race).

Sizes a server changes per call are scalar parameters (``runtime_sizes``: B, a contiguous
cache's ``Sk_max``, the block table's width, the split count, and the strides of q, the
caches and k, v, which the TMA maps carry too), so one PTX serves a family (``_family``:
dtype, head dim, heads, ``Sq``, page size, append/``n_new``, mask, softcap, scale, plan,
``combine``, one split or several): a new size or memory layout reuses its traced code. A
tensor that is not dense is passed as the memory it spans (``DecodeShape.span``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace

from pyptx import Tile, kernel, ptx, reg, smem
from pyptx.pipeline import Pipeline
from pyptx.types import b16, b32, f32, s32, u32, u64
from pyptx.warpspec import ring_base
from pyptx_kernels import _family
from pyptx_kernels.flash_attention.decode_combine import combine_row
from pyptx_kernels.flash_attention.decode_config import (
    DEFAULT_CONFIG,
    MMA_BLOCK,
    MMA_SLAB,
    THREADS,
    WARPS,
    key_groups,
    lanes_per_key,
)
from pyptx_kernels.flash_attention.fwd_config import LN2, LOG2E, _dtype
from pyptx_kernels.flash_attention.masks import NEG_INF

#: the tensors the kernel addresses through element strides: q, the caches, the new k, v
STRIDED = ("Q", "KC", "VC", "KN", "VN")


def dense_strides(dims):
    """Element strides of a contiguous tensor of shape ``dims``."""
    out, step = [], 1
    for n in reversed(dims):
        out.append(step)
        step *= n
    return tuple(reversed(out))


@dataclass(frozen=True)
class DecodeShape:
    """The sizes one decode kernel is built for. ``cache`` is the cache tensors' shape
    (``(B, Sk_max, Hkv, D)`` or paged ``(pages, page_size, Hkv, D)``), ``max_pages`` the
    block table's width (0: not paged), ``n_new`` the keys appended by this call that the
    lengths do not count: ``Sq`` with ``append``, or a count already written by the caller
    (JAX). ``strides``: ``(name, element strides)`` of each ``STRIDED`` tensor that is not
    dense (last dim unit-stride, the others multiples of 8 elements, no overlap: what
    ``decode_api.check_call`` accepts), in ``STRIDED`` order."""

    B: int
    Sq: int
    Hq: int
    Hkv: int
    D: int
    cache: tuple
    max_pages: int = 0
    append: bool = False
    n_new: int = 0
    strides: tuple = ()

    def dims(self, name):
        """The shape of ``STRIDED`` tensor ``name``."""
        if name in ("KC", "VC"):
            return self.cache
        return (self.B, self.Sq, self.Hq if name == "Q" else self.Hkv, self.D)

    def strides_of(self, name):
        """Element strides of ``STRIDED`` tensor ``name``: the call's, or a dense one's."""
        for n, st in self.strides:
            if n == name:
                return st
        return dense_strides(self.dims(name))

    def span(self, name):
        """Elements from the first to the last of a strided tensor ``name`` (the flat
        tensor of its memory the kernel takes in its place); None for a dense one."""
        if all(n != name for n, _ in self.strides):
            return None
        return 1 + sum((d - 1) * s for d, s in zip(self.dims(name), self.strides_of(name)))

    @property
    def group(self):
        return self.Hq // self.Hkv

    @property
    def paged(self):
        return self.max_pages > 0

    @property
    def page_size(self):
        return self.cache[1]


def unpack_words(words, dt):
    """f32 registers of the 16-bit pairs in ``words`` (b32, element ``2i`` in the low half)."""
    out = []
    for w in words:
        lo, hi = reg.scalar(f32), reg.scalar(f32)
        if dt.name == "bf16":
            ptx.inst.shl.b32(lo, w, 16)
            ptx.inst.and_.b32(hi, w, 0xFFFF0000)
        else:
            h0, h1 = reg.scalar(b16), reg.scalar(b16)
            ptx.inst.mov.b32([h0, h1], w)
            ptx.inst.cvt.f32.f16(lo, h0)
            ptx.inst.cvt.f32.f16(hi, h1)
        out += [lo, hi]
    return out


def _load16(ptr, words, pred):
    """16 bytes at ``ptr`` into 4 b32 ``words``, 0 where ``pred`` is false."""
    for w in words:
        ptx.inst.mov.b32(w, 0)
    ptx.inst.ld.global_.v4.b32(words, ptx.addr(ptr), pred=pred)


def _wide(x, mult):
    """``x * mult`` as u64 (``x`` an s32 register, ``mult`` an int)."""
    d = reg.scalar(u64)
    ptx.inst.mul.wide.s32(d, x, mult)
    return d


def _min_s32(a, b):
    d = reg.scalar(s32)
    ptx.inst.min.s32(d, a, b)
    return d


def _max_s32(a, b):
    d = reg.scalar(s32)
    ptx.inst.max.s32(d, a, b)
    return d


def runtime_sizes(shape, splits):
    """The sizes the decode kernel reads from its scalar parameters (name -> value), so one
    PTX serves every value of them: ``batch`` (B), ``cache_rows`` (a contiguous cache's
    ``Sk_max``) or ``max_pages`` (the block table's width), ``splits`` (KV splits, the
    grid's x) where there are several, and ``<name>_s0..2``: the outer three strides of q,
    the caches and (appending) k, v in 16-byte units (``Strides``). A paged cache's page
    count is read nowhere."""
    sizes = {"batch": shape.B}
    if shape.paged:
        sizes["max_pages"] = shape.max_pages
    else:
        sizes["cache_rows"] = shape.cache[1]
    if splits > 1:
        sizes["splits"] = splits
    for name in STRIDED if shape.append else STRIDED[:3]:
        for i, st in enumerate(shape.strides_of(name)[:3]):
            sizes[f"{name.lower()}_s{i}"] = st // 8
    return sizes


class Strides:
    """The outer three strides of ``STRIDED`` tensor ``name`` (16-byte units: 8 elements),
    s32 registers of the runtime sizes ``sz``; the last dim is unit-stride."""

    def __init__(self, sz, name):
        self.units = [sz[f"{name.lower()}_s{i}"] for i in range(3)]

    def at(self, i0, i1, i2):
        """Byte offset (u64) of element ``(i0, i1, i2, 0)`` (s32 registers or ints). ``i1``
        (the position, where one varies in a loop) is added last: ptxas can hoist the rest."""
        off = None
        for i, s in ((i0, self.units[0]), (i2, self.units[2]), (i1, self.units[1])):
            if isinstance(i, int) and i == 0:
                continue
            a, b = (s, i) if isinstance(i, int) else (i, s)
            if off is None:
                off = reg.scalar(u64)
                ptx.inst.mul.wide.s32(off, a, b)
            else:
                ptx.inst.mad.wide.s32(off, a, b, off)
        if off is None:
            return reg.from_(0, u64)
        ptx.inst.shl.b64(off, off, 4)
        return off


class KeyAddress:
    """Where key position ``pos`` of sequence ``b``, KV head ``hkv`` lives (this lane's 16
    bytes): the cache row (through the block table when paged) or, appended, the new
    ``k``/``v`` row, each tensor by its ``Strides``. ``sz``: the runtime sizes
    (``runtime_sizes``' names -> s32 registers)."""

    def __init__(self, shape, sz, b, hkv, sc, d0, ptab):
        self.shape, self.sz, self.b, self.hkv, self.sc, self.ptab = shape, sz, b, hkv, sc, ptab
        self.lane_bytes = reg.from_(d0 * 2, u64)

    def page_of(self, pos, pred):
        """The page (an s32 register) holding position ``pos``; the table is read where
        ``pred`` (a position past the table reads its last entry)."""
        ps, mp = self.shape.page_size, self.sz["max_pages"]
        pidx = pos >> (ps.bit_length() - 1) if ps & (ps - 1) == 0 else pos // ps
        pidx = _min_s32(pidx, mp - 1)
        page = reg.scalar(s32, init=0)
        off = _wide(self.b * mp + pidx, 4)
        ptx.inst.ld.global_.nc.s32(page, ptx.addr(self.ptab + off), pred=pred)
        return page

    def cache_index(self, pos, pred):
        """The cache's outer indices of key ``pos``: ``(b, pos)``, or paged ``(page,
        slot)`` (s32 registers; the table is read where ``pred``)."""
        sh = self.shape
        if not sh.paged:
            return self.b, pos
        ps = sh.page_size
        slot = pos & (ps - 1) if ps & (ps - 1) == 0 else pos % ps
        return self.page_of(pos, pred), slot

    def cache_at(self, st, pos, pred):
        """Byte offset of this lane's 16 bytes of key ``pos`` in a cache of ``Strides``
        ``st``."""
        i0, i1 = self.cache_index(pos, pred)
        return st.at(i0, i1, self.hkv) + self.lane_bytes

    def new_at(self, st, pos):
        """Byte offset of this lane's 16 bytes of appended key ``pos`` (new row
        ``pos - cache_seqlens[b]``) in k or v of ``Strides`` ``st``."""
        return st.at(self.b, pos - self.sc, self.hkv) + self.lane_bytes

    def load(self, pos, valid, cache, new, words):
        """Key ``pos``'s 16 bytes into ``words`` (0 unless ``valid``: the key exists): one
        load from the cache, or, appending, one from the cache and one from the new rows,
        each predicated (a lane reads one buffer). ``cache``, ``new``: ``(pointer,
        Strides)`` of the cache and of the new rows (None without append)."""
        pc, cs = cache
        if not self.shape.append:
            _load16(pc + self.cache_at(cs, pos, valid), words, valid)
            return
        old = valid & (pos < self.sc)
        is_new = valid & (pos >= self.sc)
        _load16(pc + self.cache_at(cs, pos, old), words, old)
        pn, sn = new
        ptx.inst.ld.global_.v4.b32(words, ptx.addr(pn + self.new_at(sn, pos)), pred=is_new)


def _append(shape, sz, tid, b, hkv, sc, ptrs, strides, ptab, first):
    """The split-0, chunk-0 CTA of (b, hkv) copies the new k, v rows into the cache at
    positions ``cache_seqlens[b] + i`` (skipping any past the cache's end); ``strides``:
    ``Strides`` by tensor name."""
    sh = shape
    LK = lanes_per_key(sh.D)
    pkc, pvc, pkn, pvn = ptrs
    with ptx.if_(first):
        for k in range(-(-sh.Sq * LK // THREADS)):
            e = tid + k * THREADS
            ok = e < sh.Sq * LK
            qi = e // LK
            dl = e % LK
            pos = sc + qi
            if sh.paged:
                ok = ok & (pos < sz["max_pages"] * sh.page_size)
            else:
                ok = ok & (pos < sz["cache_rows"])
            i0, i1 = KeyAddress(sh, sz, b, hkv, sc, 0, ptab).cache_index(pos, ok)
            col = _wide(dl, 16)
            for pn, pc, new, cache in ((pkn, pkc, "KN", "KC"), (pvn, pvc, "VN", "VC")):
                words = reg.array(b32, 4)
                _load16(pn + strides[new].at(b, qi, hkv) + col, words, ok)
                ptx.inst.st.global_.v4.b32(ptx.addr(pc + strides[cache].at(i0, i1, hkv) + col),
                                           list(words), pred=ok)


class RowState:
    """The query rows of one CTA in one lane: q (pre-scaled, f32, this lane's 8 columns; read
    through its ``Strides`` ``qs``), each row's window limits, and its online softmax (``m``,
    ``l`` in log2 units, ``o``)."""

    def __init__(self, *, sh, dt, rows, chunk, b, hkv, L, dl, pq, qs, window, softcap, scale):
        D, G, Sq = sh.D, sh.group, sh.Sq
        self.rows, self.LK, self.softcap = rows, lanes_per_key(D), softcap
        left, right = window
        q_mult = (scale / softcap) if softcap else scale * LOG2E
        self.q, self.lo, self.hi, self.m, self.l, self.o = [], [], [], [], [], []
        for i in range(rows):
            r = i if chunk is None else chunk * rows + i
            valid = None if chunk is None else r < G * Sq
            qi = r // G
            words = reg.array(b32, 4)
            _load16(pq + qs.at(b, qi, hkv * G + r % G) + reg.from_(dl * 16, u64), words, valid)
            qf = unpack_words(words, dt)
            for x in qf:
                ptx.inst.mul.f32(x, x, q_mult)
            self.q.append(qf)
            pos = L - Sq + qi
            self.lo.append(pos - left if left >= 0 else None)
            self.hi.append(_min_s32(L, pos + (right + 1)) if right >= 0 else L)
            self.m.append(reg.scalar(f32, init=NEG_INF))
            self.l.append(reg.scalar(f32, init=0.0))
            self.o.append([reg.scalar(f32, init=0.0) for _ in range(8)])

    def update(self, keys):
        """Fold a step's keys ``[(pos, ok, k f32 x 8, v f32 x 8)]`` into every row: the scores
        (a ``lanes_per_key``-lane sum, softcap, window mask), one rescale per row and step."""
        cap = self.softcap * LOG2E
        for i in range(self.rows):
            scores = []
            for pos, ok, kf, _ in keys:
                s = reg.scalar(f32)
                ptx.inst.mul.f32(s, self.q[i][0], kf[0])
                for j in range(1, 8):
                    ptx.inst.fma.rn.f32(s, self.q[i][j], kf[j], s)
                ptx.warp.reduce_sum(s, width=self.LK)
                if self.softcap:
                    ptx.inst.tanh.approx.f32(s, s)
                    ptx.inst.mul.f32(s, s, cap)
                keep = ok & (pos < self.hi[i])
                if self.lo[i] is not None:
                    keep = keep & (pos >= self.lo[i])
                ptx.inst.selp.f32(s, s, NEG_INF, keep)
                scores.append(s)
            mx = reg.from_(self.m[i])
            for s in scores:
                ptx.inst.max.f32(mx, mx, s)
            m_use = reg.scalar(f32)
            ptx.inst.selp.f32(m_use, 0.0, mx, mx == NEG_INF)
            alpha = reg.scalar(f32)
            ptx.inst.ex2.approx.ftz.f32(alpha, self.m[i] - m_use)
            ptx.inst.mul.f32(self.l[i], self.l[i], alpha)
            for j in range(8):
                ptx.inst.mul.f32(self.o[i][j], self.o[i][j], alpha)
            for s, (_, _, _, vf) in zip(scores, keys):
                p = reg.scalar(f32)
                ptx.inst.ex2.approx.ftz.f32(p, s - m_use)
                ptx.inst.add.f32(self.l[i], self.l[i], p)
                for j in range(8):
                    ptx.inst.fma.rn.f32(self.o[i][j], p, vf[j], self.o[i][j])
            ptx.inst.mov.f32(self.m[i], mx)

    def store_states(self, slots, sync, *, D, grp, dl):
        """Write every row's state into the merge ``slots`` (``_merge_and_store``) as lane
        group ``grp`` (``dl``: this lane's 8 columns)."""
        m_at, l_at, o_at = slots
        lead = dl == 0
        sync()
        for i in range(self.rows):
            slot = grp * self.rows + i
            ptx.inst.st.shared.f32(ptx.addr(m_at + reg.from_(slot * 4, u32)), self.m[i],
                                   pred=lead)
            ptx.inst.st.shared.f32(ptx.addr(l_at + reg.from_(slot * 4, u32)), self.l[i],
                                   pred=lead)
            oa = o_at + reg.from_((slot * D + dl * 8) * 4, u32)
            ptx.inst.st.shared.v4.f32(ptx.addr(oa), self.o[i][:4])
            ptx.inst.st.shared.v4.f32(ptx.addr(oa, 16), self.o[i][4:])
        sync()


def _merge_and_store(store, groups, *, sh, sz, rows, chunk, tid, split, b, hkv, pop, plp, base,
                     sync, final=None):
    """Merge ``groups`` partial (m, l, o) states per row through shared memory at ``base``
    (u32, ``merge_bytes``): ``store((m_at, l_at, o_at), sync)`` writes them (group ``g``'s
    row ``i`` in slot ``g * rows + i`` of ``m_at``, ``l_at`` and the ``D`` floats of ``o_at``)
    between two ``sync()``s; then every thread merges its rows' columns and stores the
    split's normalised o and lse; with ``final = (po, plse, dt)`` (one split: nothing to
    combine) the output rows themselves, ``o`` rounded to ``dt``, ``lse`` in ``(B, Hq, Sq)``
    order."""
    D, G, Sq, Hq = sh.D, sh.group, sh.Sq, sh.Hq
    NG = groups
    N = sz["batch"] * (Sq * Hq)
    m_at, l_at, o_at = base, base + NG * rows * 4, base + 2 * NG * rows * 4
    store((m_at, l_at, o_at), sync)
    for k in range(-(-rows * D // THREADS)):
        e = tid + k * THREADS
        i, d = e // D, e % D
        inside = i < rows
        ms = []
        for g in range(NG):
            mg = reg.scalar(f32, init=NEG_INF)
            ptx.inst.ld.shared.f32(mg, ptx.addr(m_at + reg.from_((i + g * rows) * 4, u32)),
                                   pred=inside)
            ms.append(mg)
        mx = reg.from_(ms[0])
        for mg in ms[1:]:
            ptx.inst.max.f32(mx, mx, mg)
        m_use = reg.scalar(f32)
        ptx.inst.selp.f32(m_use, 0.0, mx, mx == NEG_INF)
        lt = reg.scalar(f32, init=0.0)
        ot = reg.scalar(f32, init=0.0)
        for g in range(NG):
            w = reg.scalar(f32)
            ptx.inst.ex2.approx.ftz.f32(w, ms[g] - m_use)
            lg = reg.scalar(f32, init=0.0)
            og = reg.scalar(f32, init=0.0)
            ptx.inst.ld.shared.f32(lg, ptx.addr(l_at + reg.from_((i + g * rows) * 4, u32)),
                                   pred=inside)
            ptx.inst.ld.shared.f32(
                og, ptx.addr(o_at + reg.from_(((i + g * rows) * D + d) * 4, u32)), pred=inside)
            ptx.inst.fma.rn.f32(lt, lg, w, lt)
            ptx.inst.fma.rn.f32(ot, og, w, ot)
        empty = lt <= 0.0
        inv = reg.scalar(f32)
        ptx.inst.rcp.approx.ftz.f32(inv, lt)
        ptx.inst.selp.f32(inv, 0.0, inv, empty)
        ptx.inst.mul.f32(ot, ot, inv)
        lse = reg.scalar(f32)
        ptx.inst.lg2.approx.ftz.f32(lse, lt)
        lse = (lse + m_use) * LN2
        ptx.inst.selp.f32(lse, NEG_INF, lse, empty)
        r = i if chunk is None else chunk * rows + i
        ok = inside if chunk is None else inside & (r < G * Sq)
        if final is not None:
            po, plse, dt = final
            h = hkv * G + r % G
            half = reg.scalar(b16)
            ptx.inst(f"cvt.rn.{dt.name}.f32")(half, ot)
            orow = (b * Sq + r // G) * Hq + h
            ptx.inst.st.global_.b16(ptx.addr(po + _wide(orow * D + d, 2)), half, pred=ok)
            ptx.inst.st.global_.f32(ptx.addr(plse + _wide((b * Hq + h) * Sq + r // G, 4)), lse,
                                    pred=ok & (d == 0))
            continue
        prow = split * N + (b * Sq + r // G) * Hq + hkv * G + r % G
        ptx.inst.st.global_.f32(ptx.addr(pop + _wide(prow * D + d, 4)), ot, pred=ok)
        ptx.inst.st.global_.f32(ptx.addr(plp + _wide(prow, 4)), lse, pred=ok & (d == 0))


def _combine_if_last(*, sh, sz, dt, rows, chunk, chunks, tid, b, y, hkv, ptrs, flag_at, sync):
    """After this CTA's partial stores: count its arrival on the (b, KV head, row chunk)
    counter; the CTA that arrives last (``splits - 1`` counts before it) resets the counter
    to 0 for the next launch and combines every split of its rows in split order
    (``decode_combine.combine_row``, one warp per row). Release: every storing thread's
    ``fence.acq_rel.gpu`` before the CTA barrier and the counting ``atom.acq_rel.gpu``;
    acquire: that atom, the barrier, each reading thread's fence, ``ld.relaxed.gpu``."""
    D, G, Sq, Hq = sh.D, sh.group, sh.Sq, sh.Hq
    pcnt, po, plse, pop, plp = ptrs
    splits = sz["splits"]
    last = reg.from_(splits - 1, u32)
    ptx.fence("gpu", sem="acq_rel")
    sync()
    cnt = pcnt + _wide(b * (sh.Hkv * chunks) + y, 4)
    with ptx.if_(tid == 0):
        old = reg.scalar(u32)
        ptx.inst("atom.acq_rel.gpu.global.add.u32")(old, ptx.addr(cnt), 1)
        ptx.inst.st.shared.u32(ptx.addr(flag_at), old)
        ptx.inst("st.relaxed.gpu.global.u32")(ptx.addr(cnt), 0, pred=old == last)
    sync()
    seen = reg.scalar(u32)
    ptx.inst.ld.shared.u32(seen, ptx.addr(flag_at))
    with ptx.if_(seen == last):
        ptx.fence("gpu", sem="acq_rel")
        lane, warp = tid & 31, tid >> 5
        for k in range(-(-rows // WARPS)):
            i = warp + k * WARPS
            r = i if chunk is None else chunk * rows + i
            ok = i < rows if chunk is None else (i < rows) & (r < G * Sq)
            row = (b * Sq + r // G) * Hq + hkv * G + r % G
            with ptx.if_(ok):
                combine_row(pop, plp, po, plse, row, lane, N=sz["batch"] * (Sq * Hq), Sq=Sq, Hq=Hq,
                            D=D, splits=splits, dt=dt, load="ld.relaxed.gpu.global")


def merge_bytes(D, rows, groups=None):
    """Shared bytes of the merge of ``groups`` partial states (default: the lane groups,
    ``key_groups(D)``) per row: m, l and o per group and row, f32."""
    return (groups or key_groups(D)) * rows * (D + 2) * 4


def _split_range(k_lo, k_hi, split, splits, step):
    """``(s0, s1)``: split ``split`` of ``[k_lo, k_hi)`` (``splits``: 1, or an s32 register
    of the split count), cut at whole ``step``s: of the
    ``nb = ceil((k_hi - k_lo) / step)`` steps, split ``s`` takes ``[s nb / splits,
    (s + 1) nb / splits)`` (integer division), so splits differ by at most one step and
    none is empty while ``nb >= splits``."""
    if isinstance(splits, int):
        return k_lo, k_hi
    nb = (_max_s32(k_hi - k_lo, 0) + (step - 1)) // step
    s0 = k_lo + (split * nb) // splits * step
    return s0, _min_s32(k_hi, k_lo + ((split + 1) * nb) // splits * step)


def _direct_loop(st, *, sh, dt, s0, s1, grp, steps, addr, ptrs, strides):
    """Keys read straight from global memory: each lane group ``steps`` keys per step."""
    NG = key_groups(sh.D)
    pkc, pvc, pkn, pvn = ptrs
    k_at, v_at = (pkc, strides["KC"]), (pvc, strides["VC"])
    kn_at, vn_at = ((pkn, strides["KN"]), (pvn, strides["VN"])) if sh.append else (None, None)
    for base in ptx.loop(s0, s1, NG * steps, type=s32):
        keys = []
        for u in range(steps):
            pos = base + (u * NG) + grp
            ok = pos < s1
            kw, vw = reg.array(b32, 4), reg.array(b32, 4)
            addr.load(pos, ok, k_at, kn_at, kw)
            addr.load(pos, ok, v_at, vn_at, vw)
            keys.append((pos, ok, unpack_words(kw, dt), unpack_words(vw, dt)))
        st.update(keys)


def _ring_produce(ring, KC, VC, *, sh, sz, s0, s1, b, hkv, ptab):
    """The producer thread: every block of ``BN`` keys of the split, K and V by TMA into the
    ring, one box of ``box_keys`` keys and ``cols`` columns per (sub-block, column slab)
    (one block table read per sub-block when paged)."""
    BN, bk = ring.BN, ring.box_keys
    kmap = ptx.tma.tensormap_ptr(KC.tmap)
    vmap = ptx.tma.tensormap_ptr(VC.tmap)
    pst = ring.pipe.producer_state()
    for blk in ptx.loop(s0, s1, BN, type=s32):
        ring.pipe.acquire(pst)
        bar = ring.pipe.arm(pst, 2 * ring.block_bytes)
        coords = []
        table = KeyAddress(sh, sz, b, hkv, blk, 0, ptab) if sh.paged else None
        for j in range(BN // bk):
            pos = blk if j == 0 else blk + j * bk
            if sh.paged:
                page = table.page_of(pos, None)
                coords.append((hkv, pos % sh.page_size, page))
            else:
                coords.append((hkv, pos, b))
        kdst = ring.k_base + pst.stage * ring.block_bytes
        for j, at in enumerate(coords):
            for h in range(ring.slabs):
                off = (h * BN + j * bk) * ring.cols * 2
                dst = kdst if off == 0 else kdst + off
                ptx.tma.load_tile(dst, kmap, (h * ring.cols, *at), bar)
                ptx.tma.load_tile(dst + ring.stages * ring.block_bytes, vmap,
                                  (h * ring.cols, *at), bar)
        pst.advance()


def _ring_consume(ring, st, *, sh, dt, s0, s1, grp, dl, steps, sc, addr, ptrs, strides):
    """The consumers: per ring block, each lane group's ``BN / key_groups`` keys from shared
    memory (appended positions from the new rows in global memory), ``steps`` at a time."""
    D, BN = sh.D, ring.BN
    NG = key_groups(D)
    _, _, pkn, pvn = ptrs
    cst = ring.pipe.consumer_state()
    lane_off = reg.from_(dl * 16, u32)
    for blk in ptx.loop(s0, s1, BN, type=s32):
        ring.pipe.wait(cst)
        kblock = ring.k_base + cst.stage * ring.block_bytes + lane_off
        per_group = BN // NG
        for u0 in range(0, per_group, steps):
            keys = []
            for u in range(u0, min(u0 + steps, per_group)):
                pos = blk + (u * NG) + grp
                ok = pos < s1
                from_ring = ok & (pos < sc) if sh.append else ok
                row_off = reg.from_(grp * (D * 2), u32) + (u * NG * D * 2)
                words = []
                for which, pnew, new in ((0, pkn, "KN"), (1, pvn, "VN")):
                    w = reg.array(b32, 4)
                    for x in w:
                        ptx.inst.mov.b32(x, 0)
                    src = kblock + row_off + which * ring.stages * ring.block_bytes
                    ptx.inst.ld.shared.v4.b32(w, ptx.addr(src), pred=from_ring)
                    if sh.append:
                        off = addr.new_at(strides[new], pos)
                        ptx.inst.ld.global_.v4.b32(w, ptx.addr(pnew + off),
                                                   pred=ok & (pos >= sc))
                    words.append(unpack_words(w, dt))
                keys.append((pos, ok, *words))
            st.update(keys)
        ptx.fence_proxy_async("shared::cta")
        ring.pipe.release(cst)
        cst.advance()


class KeyRing:
    """The shared ring of K and V blocks (``stages`` x ``BN`` keys each) and its pipeline
    (128 consumer arrivals: every reading thread fences and arrives itself). A block is
    ``D // cols`` slabs of ``BN`` rows of ``cols`` elements (unswizzled rows of ``D``, or the
    tensor-core plan's 128-byte swizzled slabs of 64), each copied in boxes of ``box_keys``
    rows."""

    def __init__(self, *, stages, BN, D, tid, box_keys=None, cols=None):
        self.stages, self.BN = stages, BN
        self.box_keys, self.cols = box_keys or BN, cols or D
        self.slabs = D // self.cols
        self.block_bytes = BN * D * 2
        self.k_base = ring_base("dec_ring")
        self.pipe = Pipeline(stages, consumer_arrivals=THREADS)
        self.pipe.init(pred=tid == 0)
        ptx.bar_sync(0)


def _body(t, *, shape, dt, causal, window, softcap, scale, splits, rows, chunks, steps, ring,
          combine, mma):
    """The kernel body over its tensors ``t`` (name -> tensor, ``tensor_names`` order); the
    sizes of ``runtime_sizes`` are read from scalar parameters."""
    sh = shape
    sz = {n: ptx.scalar_param(s32, v, name=n) for n, v in runtime_sizes(sh, splits).items()}
    strides = {n: Strides(sz, n) for n in (STRIDED if sh.append else STRIDED[:3])}
    D, Sq = sh.D, sh.Sq
    LK = lanes_per_key(D)
    NG = key_groups(D)
    KC, VC = t["KC"], t["VC"]
    p = dict(zip(t, ptx.global_ptrs(*t.values())))
    pq, pkc, pvc, pseq = p["Q"], p["KC"], p["VC"], p["SEQ"]
    ptab, pkn, pvn = p.get("TAB"), p.get("KN"), p.get("VN")
    pop, plp = p.get("OP"), p.get("LP")

    tid = reg.from_(ptx.special.tid.x(), s32)
    split = reg.from_(ptx.special.ctaid.x(), s32)
    y = reg.from_(ptx.special.ctaid.y(), s32)
    b = reg.from_(ptx.special.ctaid.z(), s32)
    hkv, chunk = (y, None) if chunks == 1 else (y // chunks, y % chunks)
    if not mma:
        lane = tid & 31
        grp = (tid >> 5) * (32 // LK) + lane // LK
        dl = lane % LK

    kring = None if ring is None else KeyRing(stages=ring[0], BN=ring[1], D=D, tid=tid,
                                              box_keys=ring[2], cols=ring[3])
    sc = reg.scalar(s32)
    ptx.inst.ld.global_.nc.s32(sc, ptx.addr(pseq + _wide(b, 4)))
    n_new = Sq if sh.append else sh.n_new
    L = sc + n_new if n_new else sc
    if sh.append:
        first = split == 0 if chunk is None else (split == 0) & (chunk == 0)
        _append(sh, sz, tid, b, hkv, sc, (pkc, pvc, pkn, pvn), strides, ptab,
                first & (tid < THREADS))

    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    # this split's keys: the window of all queries, cut in ``splits`` pieces of whole steps
    k_lo = _max_s32(L - Sq - left, 0) if left >= 0 else reg.scalar(s32, init=0)
    k_hi = _min_s32(L, L - 1 + right + 1) if right >= 0 else L
    step = NG * steps if kring is None else kring.BN
    if kring is not None:            # blocks start on multiples of BN: inside one page
        k_lo = k_lo & -kring.BN
    s0, s1 = _split_range(k_lo, k_hi, split, sz.get("splits", 1), step)
    if kring is not None:
        with ptx.if_(tid == THREADS):
            _ring_produce(kring, KC, VC, sh=sh, sz=sz, s0=s0, s1=s1, b=b, hkv=hkv, ptab=ptab)
        ptx.ret(pred=tid >= THREADS)

    counted = combine and splits > 1
    if mma:
        from pyptx_kernels.flash_attention import decode_mma

        st = decode_mma.MmaRows(sh=sh, dt=dt, ring=kring, rows=rows, chunk=chunk, b=b,
                                hkv=hkv, sc=sc, L=L, s1=s1, tid=tid, pq=pq,
                                window=(left, right), softcap=softcap, scale=scale,
                                new=(pkn, pvn), strides=strides)
        decode_mma.consume(kring, st, s0=s0, s1=s1, fix_from=sc if sh.append else L)
        groups, store = WARPS, st.store_states
    else:
        st = RowState(sh=sh, dt=dt, rows=rows, chunk=chunk, b=b, hkv=hkv, L=L, dl=dl, pq=pq,
                      qs=strides["Q"], window=(left, right), softcap=softcap, scale=scale)
        addr = KeyAddress(sh, sz, b, hkv, sc, dl * 8, ptab)
        loads = (pkc, pvc, pkn, pvn)
        groups = NG
        if kring is None:
            _direct_loop(st, sh=sh, dt=dt, s0=s0, s1=s1, grp=grp, steps=steps, addr=addr,
                         ptrs=loads, strides=strides)
        else:
            _ring_consume(kring, st, sh=sh, dt=dt, s0=s0, s1=s1, grp=grp, dl=dl,
                          steps=steps, sc=sc, addr=addr, ptrs=loads, strides=strides)

        def store(slots, sync):
            st.store_states(slots, sync, D=D, grp=grp, dl=dl)
    if kring is None:
        words = merge_bytes(D, rows) // 4 + (1 if counted else 0)
        base = smem.alloc(f32, words, name="dec_merge").addr()
        sync = ptx.bar_sync
    else:
        base = kring.k_base

        def sync():
            ptx.bar_sync(1, THREADS)
    final = (p["O"], p["LSE"], dt) if combine and splits == 1 else None
    _merge_and_store(store, groups, sh=sh, sz=sz, rows=rows, chunk=chunk, tid=tid, split=split, b=b,
                     hkv=hkv, pop=pop, plp=plp, base=base, sync=sync, final=final)
    if counted:
        _combine_if_last(sh=sh, sz=sz, dt=dt, rows=rows, chunk=chunk, chunks=chunks, tid=tid,
                         b=b, y=y, hkv=hkv,
                         ptrs=(p["CNT"], p["O"], p["LSE"], pop, plp),
                         flag_at=base + merge_bytes(D, rows, groups), sync=sync)
    ptx.ret()


def decode_tiling(shape, config):
    """``(rows per CTA, row chunks per KV head, keys per lane group per step)``."""
    rows, chunks = config.row_tiling(shape.group * shape.Sq)
    return rows, chunks, config.step_keys(rows)


def decode_ring(shape, config):
    """``(stages, keys per block, keys per TMA box, columns per slab)`` of the TMA ring, or
    None for direct loads. The tensor-core plan: ``MMA_BLOCK`` keys in 64-column slabs,
    boxes of the largest power of two dividing the page size (at most ``MMA_BLOCK``)."""
    if not config.ring_stages:
        return None
    ps = shape.page_size if shape.paged else None
    if config.mma:
        box = MMA_BLOCK if ps is None else min(MMA_BLOCK, ps & -ps)
        return config.mma_stages(shape.D), MMA_BLOCK, box, MMA_SLAB
    bn = config.ring_block(shape.D, ps)
    return config.ring_stages, bn, bn, shape.D


def tensor_names(shape, splits, combine=True):
    """``(inputs, outputs)``: the decode kernel's tensor parameter names in order."""
    ins = ["Q", "KC", "VC", "SEQ"] + (["TAB"] if shape.paged else []) \
        + (["KN", "VN"] if shape.append else []) + (["CNT"] if combine and splits > 1 else [])
    outs = (["O", "LSE"] if combine else []) + (["OP", "LP"] if splits > 1 or not combine
                                                else [])
    return ins, outs


def counters(shape, config=DEFAULT_CONFIG):
    """Arrival counters the one-launch kernel needs with KV splits: one per (batch, KV head,
    row chunk)."""
    return shape.B * shape.Hkv * decode_tiling(shape, config)[1]


def build_decode(shape, *, dtype="bf16", causal=True, window=(-1, -1), softcap=0.0,
                 scale=None, splits=1, config=DEFAULT_CONFIG, combine=True):
    """The decode kernel for ``shape`` (``DecodeShape``). Inputs: ``q (B, Sq, Hq, D)``,
    ``k_cache``, ``v_cache`` (``shape.cache``), ``cache_seqlens (B,)`` int32, then
    ``block_table (B, max_pages)`` int32 when paged, ``k, v (B, Sq, Hkv, D)`` when
    appending, and with ``splits > 1`` (and ``combine``) ``counters`` int32
    ``(counters(shape, config),)``, zero before the launch and left zero after it.
    ``splits``: KV splits per (batch, KV head). A tensor with ``shape.strides`` is passed
    as the flat tensor of the ``shape.span(name)`` elements from its first to its last.

    ``combine`` (default): one launch. Outputs ``o (B, Sq, Hq, D)`` of ``dtype`` and
    ``lse (B, Hq, Sq)`` f32 (natural log, ``-inf`` for a query without keys), then with
    ``splits > 1`` the partials below (a workspace: the last CTA of each (batch, KV head,
    row chunk) to arrive combines them in split order, exactly as ``build_combine``).
    ``combine=False``: outputs only the per-split partials ``o (splits, B*Sq*Hq, D)`` f32
    (normalised) and ``lse (splits, B*Sq*Hq)`` f32 (``-inf`` for a split without keys), rows
    in ``(b, i, h)`` order, for ``decode_combine.build_combine`` (the two-launch reference).
    The sizes of ``runtime_sizes`` are kernel parameters: a kernel of another size of the
    same family reuses the first one's trace (``_family.specialized``)."""
    dt = _dtype(dtype)
    sh = shape
    D = sh.D
    scale = D ** -0.5 if scale is None else float(scale)
    rows, chunks, steps = decode_tiling(sh, config)
    ring = decode_ring(sh, config)
    N = sh.B * sh.Sq * sh.Hq
    names_in, names_out = tensor_names(sh, splits, combine)
    specs = {n: Tile(*sh.dims(n), dt) if sh.span(n) is None else Tile(sh.span(n), dt)
             for n in STRIDED}
    specs.update({"SEQ": Tile(sh.B, s32), "TAB": Tile(sh.B, max(sh.max_pages, 1), s32),
                  "CNT": Tile(counters(sh, config), s32),
                  "O": Tile(sh.B, sh.Sq, sh.Hq, D, dt), "LSE": Tile(sh.B, sh.Hq, sh.Sq, f32),
                  "OP": Tile(splits, N, D, f32), "LP": Tile(splits, N, f32)})
    left, right = window
    plan = "mma_" if config.mma else ""
    tile = f"r{rows}x{chunks}" + ("" if config.mma else f"_u{steps}")
    name = (f"attn_decode_{plan}{dt.name}_d{D}_g{sh.group}_q{sh.Sq}_{tile}"
            f"{'_split' if splits > 1 else ''}{'_paged' if sh.paged else ''}"
            f"{'_append' if sh.append else ''}"
            f"{'_causal' if causal else ''}"
            f"{f'_w{left}_{right}'.replace('-', 'n') if (left, right) != (-1, -1) else ''}"
            f"{'_cap' if softcap else ''}{f'_ring{ring[0]}x{ring[1]}' if ring else ''}"
            f"{f'b{ring[2]}' if config.mma else ''}"
            f"{'_fused' if combine else ''}")
    extra = {}
    if ring:
        box = dict(box=(1, ring[2], 1, ring[3]), swizzle="128B" if config.mma else "none")
        flag = 16 if combine and splits > 1 else 0
        merge = merge_bytes(D, rows, WARPS if config.mma else None)
        extra = dict(tma={n: dict(box, shape=sh.cache, strides=sh.strides_of(n))
                          for n in ("KC", "VC")},
                     smem=max(2 * ring[0] * ring[1] * D * 2, merge + flag) + 1024)
    deco = kernel(in_specs=tuple(specs[n] for n in names_in),
                  out_specs=tuple(specs[n] for n in names_out),
                  grid=(splits, sh.Hkv * chunks, sh.B), block=(THREADS + (32 if ring else 0), 1, 1),
                  name=name, **extra)
    kw = dict(shape=sh, dt=dt, causal=causal, window=(left, right), softcap=float(softcap),
              scale=scale, splits=splits, rows=rows, chunks=chunks, steps=steps, ring=ring,
              combine=combine, mma=config.mma)
    names = names_in + names_out

    def attn_decode(*tensors):
        _body(dict(zip(names, tensors)), **kw)
    attn_decode.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    family = ("attention_decode", dt.name, D, sh.Hq, sh.Hkv, sh.Sq,
              sh.page_size if sh.paged else None, sh.paged, sh.append, sh.n_new, causal,
              (left, right), float(softcap), scale, replace(config, num_splits=0), combine,
              splits > 1)
    return _family.specialized(deco(attn_decode), family, runtime_sizes(sh, splits))
