"""``Rows``: the calling thread's place in a ``RowPlan``, inside a kernel body.

The thread's row-group index and column offset, the row count ``B`` (a kernel parameter,
``nrows``: the PTX is the same for every ``B``), row location (rows past ``B`` in the last
CTA are clamped for loads and masked for stores), vector loads of a row
into f32 registers (masked tail chunks filled with a neutral value), stores from
f32, and a group-wide reduction of several values at once (butterfly shuffles, then,
for ``G > 32`` threads per row, one shared-memory slot per warp and one
``bar.sync``). The view's ``Hints`` decide the cache and L2 hints of its streamed
accesses and whether ``prefetch_rows`` emits anything.
"""

from __future__ import annotations

from typing import Any

from .. import ptx, reg, smem
from ..errors import ConfigError
from ..source import where
from ..types import PtxType, f32, u32, u64
from .access import KEEP, Hints, load_raw_vec, load_vec, store_vec, unpack
from .arith import NEG_INF
from .pdl import prefetch_cta_slice
from .plan import WARP, RowPlan

__all__ = ["Rows"]


class Rows:
    """The calling thread's place in a ``RowPlan``, inside a kernel body."""

    def __init__(self, plan: RowPlan, hints: Hints | None = None) -> None:
        self.p = p = plan
        self.hints = hints if hints is not None else Hints()
        #: the row count ``B`` (u32), a kernel parameter: one PTX serves every ``B``
        self.nrows = ptx.scalar_param(u32, p.B, name="nrows")
        self.tid = ptx.special.tid.x()
        if p.rows > 1:
            shift = p.threads.bit_length() - 1
            self.g = self.tid >> shift
            self.t = self.tid & (p.threads - 1)
        else:
            self.g = None
            self.t = self.tid
        self.tail = self.t < p.tail_threads if p.tail_threads < p.threads else None
        self._col: dict[int, Any] = {}
        self._red: list = []

    # -- positions
    def first_row(self) -> Any:
        """This thread's row in a one-pass kernel: ``ctaid * R + g`` (u32)."""
        cta = ptx.special.ctaid.x()
        if self.p.rows == 1:
            return cta
        row = reg.scalar(u32)
        ptx.inst.mad.lo.u32(row, cta, self.p.rows, self.g)
        return row

    def prefetch_rows(self, *ptrs: Any) -> None:
        """Thread 0 asks for this CTA's rows of each ``(B, N)`` array at ``ptrs`` in L2
        (``prefetch_cta_slice``; rows past ``B`` left out); nothing with
        ``Hints(pdl_prefetch=False)``."""
        if not self.hints.pdl_prefetch:
            return
        p = self.p
        row_bytes = p.N * p.es
        prefetch_cta_slice(ptrs, p.rows * row_bytes, self.nrows, self.tid, unit=row_bytes)

    def locate(self, row: Any) -> tuple[Any, Any]:
        """(row to read, store predicate or None): rows past B read row B-1 and store nothing.
        With one row per CTA every row is inside B (the grid has B CTAs): no predicate."""
        if self.p.rows == 1:
            return row, None
        ok = row < self.nrows
        last = reg.scalar(u32)
        ptx.inst.sub.u32(last, self.nrows, 1)
        rc = reg.scalar(u32)
        ptx.inst.min.u32(rc, row, last)
        return rc, ok

    def col_off(self, es: int) -> Any:
        """Byte offset of this thread's first chunk within a row of ``es``-byte elements (u64)."""
        hit = self._col.get(es)
        if hit is None:
            hit = self._col[es] = reg.scalar(u64)
            ptx.inst.mul.wide.u32(hit, self.t, self.p.vec * es)
        return hit

    def offset(self, row: Any = None, es: int | None = None) -> Any:
        """u64 byte offset of this thread's first chunk: in row ``row``, or in a length-N vector."""
        es = es or self.p.es
        if row is None:
            return self.col_off(es)
        roff = reg.scalar(u64)
        ptx.inst.mul.wide.u32(roff, row, self.p.N * es)
        return roff + self.col_off(es)

    # -- rows in registers
    def load(self, ptr: Any, *, dtype: PtxType | None = None, fill: float = 0.0,
             cache: str | None = None) -> list:
        """The thread's ``K * vec`` elements at ``ptr`` (base + ``offset()``) as f32 registers
        (``cache`` after ``ld.global``; default ``hints.load``; the L2 policy ``hints.l2_load``
        unless ``cache`` is ``KEEP``)."""
        p = self.p
        cache = self.hints.load if cache is None else cache
        dtype = dtype or p.dtype
        out: list = []
        for j in range(p.chunks):
            pred = self.tail if j == p.chunks - 1 else None
            out += load_vec(ptr, j * p.threads * p.vec * dtype.bytes, dtype, p.vec, pred=pred,
                            fill=fill, cache=cache, policy=self._load_policy(cache))
        return out

    def load_raw(self, ptr: Any, *, dtype: PtxType | None = None, fill: float = 0.0,
                 cache: str | None = None, guard: Any = None, dst: list | None = None,
                 space: str = "global") -> list:
        """The thread's ``K`` chunks at ``ptr`` as stored (``load_raw_vec``), for ``unpack`` later.

        ``guard`` (a predicate) turns every load off where it is false and leaves the
        registers as they were (no traffic: a prefetch past the last row); the masked
        tail chunk reads ``fill``. ``dst`` reloads an earlier result's registers.
        ``space="shared"``: ``ptr`` is a u32 shared address of a row (``Ring``).
        """
        p = self.p
        dtype = dtype or p.dtype
        cache = self.hints.load if cache is None else cache
        tail = self.tail
        if tail is not None and guard is not None:
            tail = guard & tail
        out: list = []
        at = 0
        for j in range(p.chunks):
            last = j == p.chunks - 1 and self.tail is not None
            part = None
            if dst is not None:
                n = len(dst) // p.chunks
                part = dst[at:at + n]
                at += n
            out += load_raw_vec(ptr, j * p.threads * p.vec * dtype.bytes, dtype, p.vec,
                                pred=tail if last else guard, fill=fill if last else None,
                                cache=cache, dst=part, space=space,
                                policy=self._load_policy(cache))
        return out

    def unpack(self, raw: list, *, dtype: PtxType | None = None) -> list:
        """f32 registers of ``load_raw``'s result (``K * vec`` values)."""
        dtype = dtype or self.p.dtype
        if dtype is f32:
            return list(raw)
        per = len(raw) // self.p.chunks
        out: list = []
        for j in range(self.p.chunks):
            out += unpack(raw[j * per:(j + 1) * per], dtype)
        return out

    def hold(self, ptr: Any, *, dtype: PtxType | None = None) -> list:
        """A length-N vector's chunks (weights) at ``ptr`` + ``offset()``, loaded once per CTA
        with ``ld.global.nc`` and kept in registers as stored (bf16 stays packed: half the
        registers); ``unhold`` gives the f32 values where they are used."""
        return self.load_raw(ptr, dtype=dtype, cache=KEEP)

    def unhold(self, held: list, *, dtype: PtxType | None = None) -> list:
        """f32 values of ``hold``'s registers (no instruction for f32)."""
        return self.unpack(held, dtype=dtype)

    def load_chunk(self, ptr: Any, j: int, *, dtype: PtxType | None = None, fill: float = 0.0,
                   cache: str = KEEP) -> list:
        """Chunk ``j`` only (``vec`` values): for late loads of weights."""
        p = self.p
        dtype = dtype or p.dtype
        pred = self.tail if j == p.chunks - 1 else None
        return load_vec(ptr, j * p.threads * p.vec * dtype.bytes, dtype, p.vec, pred=pred,
                        fill=fill, cache=cache, policy=self._load_policy(cache))

    def _load_policy(self, cache: str) -> str:
        """The L2 priority of a global load with ``cache``: none for weights (``KEEP``)."""
        return "" if cache == KEEP else self.hints.l2_load

    def store_pred(self, j: int, ok: Any) -> Any:
        """Predicate for storing chunk ``j`` of a row whose store predicate is ``ok``."""
        tail = self.tail if j == self.p.chunks - 1 else None
        if tail is None:
            return ok
        if ok is None:
            return tail
        return ok & tail

    def store(self, ptr: Any, vals: list, ok: Any = None, *, dtype: PtxType | None = None,
              cache: str | None = None, space: str = "global") -> None:
        """Write the thread's ``K * vec`` f32 values to ``ptr`` as ``dtype`` (the plan's default;
        ``space="shared"``: ``ptr`` is a u32 shared address of a row; ``cache`` defaults to
        ``hints.store``, and ``hints.l2_store`` is the L2 policy)."""
        p = self.p
        dtype = dtype or p.dtype
        cache = self.hints.store if cache is None else cache
        both = None
        for j in range(p.chunks):
            pred = ok
            if j == p.chunks - 1 and self.tail is not None:
                if ok is None:
                    pred = self.tail
                else:
                    both = both or (ok & self.tail)
                    pred = both
            store_vec(ptr, j * p.threads * p.vec * dtype.bytes, dtype,
                      vals[j * p.vec:(j + 1) * p.vec], pred=pred, cache=cache, space=space,
                      policy=self.hints.l2_store)

    def tail_mask(self, vals: list, value: float = 0.0) -> list:
        """``vals`` with the masked tail chunk's entries replaced by ``value`` (selp)."""
        if self.tail is None:
            return vals
        p = self.p
        out = list(vals)
        for i in range((p.chunks - 1) * p.vec, p.chunks * p.vec):
            r = reg.scalar(f32)
            ptx.inst.selp.f32(r, vals[i], value, self.tail)
            out[i] = r
        return out

    # -- reductions
    def reduce(self, vals: list, op: str = "add", *, lanes: bool = False) -> list:
        """All-reduce each f32 register of ``vals`` over the row's threads, in place.

        ``op`` is 'add' or 'max'. Costs log2(min(G, 32)) shuffle rounds and, for
        G > 32, one ``bar.sync`` and a pass over the warps' partials in shared
        memory (a fresh slot per call, so calls never race each other). The pass
        reads all ``W = G/32`` partials into registers; with ``lanes`` each lane
        reads one partial instead and log2(W) more shuffle rounds combine them
        (one register per value instead of ``W``: for kernels short of registers).
        """
        p = self.p
        width = min(p.threads, WARP)
        off = width // 2
        clamp = ((WARP - width) << 8) | 0x1F
        tmp = [reg.scalar(f32) for _ in vals]
        while off:
            for v, t in zip(vals, tmp):
                ptx.inst.shfl.sync.bfly.b32(t, v, off, clamp, 0xFFFFFFFF)
            for v, t in zip(vals, tmp):
                ptx.inst(f"{op}.f32")(v, v, t)
            off //= 2
        if p.threads <= WARP:
            return vals
        W = p.threads // WARP
        n = len(vals)
        buf = smem.alloc(f32, p.rows * W * n, name="red")
        base = buf.addr()
        if p.rows > 1:
            base = base + self.g * (W * n * 4)
        warp = self.t >> 5
        lane = self.t & 31
        slot = base + warp * (n * 4)
        first = lane == 0
        for i, v in enumerate(vals):
            ptx.inst.st.shared.f32(ptx.addr(slot, 4 * i), v, pred=first)
        ptx.bar_sync(0)
        if lanes:
            return self._combine_in_lanes(vals, op, base, lane, W)
        parts = [[reg.scalar(f32) for _ in range(W)] for _ in vals]
        for w in range(W):
            for i in range(n):
                ptx.inst.ld.shared.f32(parts[i][w], ptx.addr(base, (w * n + i) * 4))
        for i, v in enumerate(vals):
            acc = parts[i][0]
            for w in range(1, W):  # the same order in every thread: identical results
                ptx.inst(f"{op}.f32")(acc, acc, parts[i][w])
            ptx.inst.mov.f32(v, acc)
        return vals

    def reduce_moments(self, mean: Any, m2: Any, count: int) -> tuple[Any, Any]:
        """All-reduce a thread's moments over the row, in one pass: ``mean`` and ``m2`` (the
        sum of squared deviations from ``mean``) of its ``count`` values become the row's.

        Equal-weight groups merge as ``mean = (ma + mb) / 2``, ``m2 = m2a + m2b + d*d*c/2``
        (``d = mb - ma``, ``c`` the values per side; Chan et al.'s pairwise update, stable
        like a second pass over ``x - mean``): log2(min(G, 32)) rounds of two shuffles, then
        for G > 32 one ``bar.sync`` and a merge tree over the warps' pairs in shared memory.
        The row's threads must hold ``count`` values each (no masked tail: ``RowPlan``'s
        ``tail_threads == threads``). Every thread computes the same bits."""
        p = self.p
        if p.tail_threads != p.threads:
            raise ConfigError(
                f"{where()}: reduce_moments needs every thread of a row to hold the same "
                f"number of values; N={p.N} leaves a partial last chunk "
                f"({p.tail_threads} of {p.threads} threads)")
        width = min(p.threads, WARP)
        clamp = ((WARP - width) << 8) | 0x1F
        c, off = count, width // 2
        while off:
            om, o2 = reg.scalar(f32), reg.scalar(f32)
            ptx.inst.shfl.sync.bfly.b32(om, mean, off, clamp, 0xFFFFFFFF)
            ptx.inst.shfl.sync.bfly.b32(o2, m2, off, clamp, 0xFFFFFFFF)
            self._merge(mean, m2, om, o2, c, c)
            c, off = 2 * c, off // 2
        if p.threads <= WARP:
            return mean, m2
        W = p.threads // WARP
        buf = smem.alloc(f32, p.rows * W * 2, name="red")
        base = buf.addr()
        if p.rows > 1:
            base = base + self.g * (W * 8)
        slot = base + (self.t >> 5) * 8
        first = (self.t & 31) == 0
        ptx.inst.st.shared.f32(ptx.addr(slot, 0), mean, pred=first)
        ptx.inst.st.shared.f32(ptx.addr(slot, 4), m2, pred=first)
        ptx.bar_sync(0)
        parts = []
        for w in range(W):
            pm, p2 = reg.scalar(f32), reg.scalar(f32)
            ptx.inst.ld.shared.f32(pm, ptx.addr(base, w * 8))
            ptx.inst.ld.shared.f32(p2, ptx.addr(base, w * 8 + 4))
            parts.append((pm, p2, c))
        while len(parts) > 1:  # a pairwise tree, the same in every thread
            nxt = []
            for i in range(0, len(parts) - 1, 2):
                (am, a2, na), (bm, b2, nb) = parts[i], parts[i + 1]
                self._merge(am, a2, bm, b2, na, nb)
                nxt.append((am, a2, na + nb))
            if len(parts) % 2:
                nxt.append(parts[-1])
            parts = nxt
        ptx.inst.mov.f32(mean, parts[0][0])
        ptx.inst.mov.f32(m2, parts[0][1])
        return mean, m2

    @staticmethod
    def _merge(am: Any, a2: Any, bm: Any, b2: Any, na: int, nb: int) -> None:
        """``(am, a2)`` becomes the moments of both groups (``na`` and ``nb`` values)."""
        d, s2, dw = reg.scalar(f32), reg.scalar(f32), reg.scalar(f32)
        ptx.inst.sub.f32(d, bm, am)
        ptx.inst.add.f32(s2, a2, b2)
        ptx.inst.mul.f32(dw, d, na * nb / (na + nb))
        if na == nb:  # symmetric in a and b: both partners get the same bits
            ptx.inst.add.f32(am, am, bm)
            ptx.inst.mul.f32(am, am, 0.5)
        else:
            ptx.inst.fma.rn.f32(am, d, nb / (na + nb), am)
        ptx.inst.fma.rn.f32(a2, d, dw, s2)

    def _combine_in_lanes(self, vals: list, op: str, base: Any, lane: Any, W: int) -> list:
        """``reduce(lanes=True)`` after the barrier: lane ``l`` loads partial ``l mod Wp``
        (``Wp``: W rounded up to a power of two; missing ones are the identity), then a
        butterfly over ``Wp`` lanes. Every lane adds the same values in the same tree
        (up to commutation), so all threads get identical results."""
        n = len(vals)
        wp = 1 << (W - 1).bit_length()
        r = lane if wp == WARP else lane & (wp - 1)
        src = base + r * (n * 4)
        have = r < W if W < wp else None
        ident = 0.0 if op == "add" else NEG_INF
        for i, v in enumerate(vals):
            if have is not None:
                ptx.inst.mov.f32(v, ident)
            ptx.inst.ld.shared.f32(v, ptx.addr(src, 4 * i), pred=have)
        tmp = [reg.scalar(f32) for _ in vals]
        off = wp // 2
        while off:
            for v, t in zip(vals, tmp):
                ptx.inst.shfl.sync.bfly.b32(t, v, off, 0x1F, 0xFFFFFFFF)
            for v, t in zip(vals, tmp):
                ptx.inst(f"{op}.f32")(v, v, t)
            off //= 2
        return vals
