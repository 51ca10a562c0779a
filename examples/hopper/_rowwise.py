"""Shared machinery of the row-wise memory-bound kernels (RMSNorm, LayerNorm, softmax, SwiGLU).

Every kernel built on this module reads each input element once and writes each
output element once; a row's values stay in registers between the reduction
and the write. The pieces:

* ``plan_rows`` picks the launch shape of a row kernel from ``(B, N, dtype)``:
  the vector width (16-byte accesses: 4 f32 or 8 bf16 per load, narrowed to the
  largest power of two dividing ``N`` so every row start stays aligned), the
  threads per row ``G`` (1..32 as a power of two, or a multiple of 32 up to
  1024), the vector chunks per thread ``K`` and, for short rows, several rows per
  CTA (so a CTA has at least 128 threads). Thread ``t`` of a row owns chunks
  ``j*G + t`` for ``j < K``: every warp-wide access covers consecutive bytes.
* ``Rows`` is the in-kernel view of a plan: the thread's row-group index and
  column offset, row location (rows past ``B`` in the last CTA are clamped for
  loads and masked for stores), vector loads of a row into f32 registers
  (bf16 pairs unpacked with ``shl``/``and``; masked tail chunks filled with a
  neutral value), stores from f32 (bf16 packed with ``cvt.rn.bf16x2.f32``),
  and a group-wide reduction of several values at once (butterfly shuffles,
  then, for ``G > 32``, one shared-memory slot per warp and one ``bar.sync``).
* ``load_vec``/``store_vec`` do one aligned access of 1..8 elements;
  ``load_raw_vec``/``unpack`` split a load into the stored registers and their
  f32 values (``Rows.load_raw``/``unpack``/``hold``/``unhold`` per row).
* Persistent forward kernels (``ctas=P`` on the builders): ``persistent_plan``
  (a shape whose two row register sets fit in 64 registers),
  ``persistent_ctas`` (the grid) and ``row_loop`` (the device loop over the
  CTA's rows with the next row's loads in flight, unrolled twice so the two
  register sets alternate without copies).
* ``build_colsum`` is the second stage of the backward kernels: it sums the
  per-CTA partial weight gradients ``(P*C, N)`` f32 over ``P`` into ``C``
  vectors of ``N``.
* ``TwoStage`` chains a backward kernel and ``build_colsum`` into one callable
  with ``in_specs``/``out_specs`` so ``pyptx.differentiable_kernel`` accepts it.

Supported: ``B >= 1``, ``1 <= N <= MAX_N`` (32768) for the forward kernels and
``MAX_N_BWD`` (8192) for the backward ones, f32 or bf16 storage with f32 arithmetic. Tensors must be contiguous and their
base addresses 16-byte aligned (fresh torch/jax allocations are 256-byte
aligned).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

from pyptx import ConfigError, SpecError, Tile, kernel, ptx, reg, smem
from pyptx.imm import bf16_bits
from pyptx.trace import current
from pyptx.types import PtxType, b16, b32, b64, bf16, f32, from_name, u32, u64

WARP = 32
MAX_N = 32768
#: The backward kernels keep x, dy and the running weight gradients in registers.
MAX_N_BWD = 8192
LOG2E = 1.0 / math.log(2.0)
NEG_INF = float("-inf")

#: load cache hints. Streamed rows use plain ``ld.global``: on the H100 it beat
#: ``.nc.L1::no_allocate`` by 1-3% at every size (tools/probe_variants.py, NOTES.md);
#: weights are shared by the CTAs of an SM, so they stay in L1 (``.nc``).
STREAM = ""
KEEP = ".nc"
#: the persistent kernels' row loads: coherent (no ``.nc``), so ptxas keeps them where they are
#: issued, before the previous row's ``bar.sync`` and stores; ``.nc`` loads it sinks past both
#: to shorten their live ranges, which undoes the prefetch.
PINNED = ".L1::no_allocate"
#: store cache hint of ``store_vec`` / ``Rows.store`` ("" = the default write-back policy).
STORE = ""
#: L2 eviction priority of streamed loads and of stores ("" = none, else one of
#: ``L2_PRIORITIES``): a ``createpolicy.fractional`` register and ``.L2::cache_hint``.
L2_LOAD = ""
L2_STORE = ""
L2_PRIORITIES = ("evict_first", "evict_last", "evict_normal", "evict_unchanged")
#: ``pdl=True`` kernels ask for their CTA's rows in L2 before ``griddepcontrol.wait``
#: (``prefetch_cta_slice``), so the loads overlap the previous grid's last wave.
PDL_PREFETCH = True


def dtype_of(dtype: Any, who: str) -> PtxType:
    """f32 or bf16 from a PtxType, a name ('f32', 'bfloat16') or a torch/jax/numpy dtype."""
    if isinstance(dtype, PtxType):
        t = dtype
    else:
        name = str(getattr(dtype, "name", dtype)).removeprefix("torch.")
        try:
            t = from_name(name)
        except Exception:
            t = None
    if t is not f32 and t is not bf16:
        raise SpecError(f"{who}: dtype must be f32 or bf16 (float32/bfloat16), got {dtype!r}")
    return t


def _pos_int(v: Any, name: str, who: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SpecError(f"{who}: {name} must be a positive int, got {v!r}")
    return v


def _round_threads(g: int) -> int:
    """Threads per row: a power of two below 128, a multiple of 32 from 128 up to 1024."""
    if g < 128:
        return 1 << max(0, (g - 1).bit_length())
    return min(1024, -(-g // WARP) * WARP)


@dataclass(frozen=True)
class RowPlan:
    """Launch shape of a row kernel (see the module docstring)."""

    B: int
    N: int
    dtype: PtxType
    vec: int      # elements per vector access (divides N)
    threads: int  # G: threads per row
    chunks: int   # K: vector chunks per thread
    rows: int     # R: rows per CTA

    @property
    def es(self) -> int:
        """Bytes per element."""
        return self.dtype.bytes

    @property
    def nvec(self) -> int:
        """Vector chunks per row."""
        return self.N // self.vec

    @property
    def elems(self) -> int:
        """Elements each thread holds in registers."""
        return self.chunks * self.vec

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.threads * self.rows, 1, 1)

    @property
    def grid(self) -> tuple[int, int, int]:
        return (-(-self.B // self.rows), 1, 1)

    @property
    def tail_threads(self) -> int:
        """Threads of a row whose last chunk is inside the row (== threads: no tail)."""
        return self.nvec - (self.chunks - 1) * self.threads

    @property
    def ragged_rows(self) -> bool:
        """True when the last CTA has rows past B (clamped loads, masked stores)."""
        return self.B % self.rows != 0

    def describe(self) -> str:
        return (f"vec={self.vec} threads/row={self.threads} chunks={self.chunks} "
                f"rows/cta={self.rows} block={self.block[0]} grid={self.grid[0]}")


def plan_rows(B: int, N: int, dtype: PtxType, *, who: str, chunks: int | None = None,
              threads: int | None = None, rows: int | None = None, max_n: int = MAX_N,
              max_elems: int = 32, target_bytes: int = 64, min_block: int = 128) -> RowPlan:
    """Pick the launch shape of a row kernel; ``SpecError`` names the supported ``N``.

    ``chunks`` (target K), ``threads`` (G) and ``rows`` (R) override the
    heuristics: K ~ ``target_bytes`` of 16-byte vectors per thread, G from N/K,
    R so a CTA has ``min_block`` threads.
    """
    B = _pos_int(B, "B", who)
    N = _pos_int(N, "N", who)
    if N > max_n:
        raise SpecError(
            f"{who}: N={N} is not supported; rows live in registers, so N must be in "
            f"1..{max_n} (got B={B})")
    if B >= 2**31:
        raise SpecError(f"{who}: B must be below 2**31, got {B}")
    es = dtype.bytes
    vec = 16 // es
    while N % vec:
        vec //= 2
    nvec = N // vec
    max_k = max(1, max_elems // vec)
    if threads is None:
        k = chunks if chunks is not None else max(1, target_bytes // (vec * es))
        k = min(_pos_int(k, "chunks", who), max_k)
        g = _round_threads(-(-nvec // k))
    else:
        g = _pos_int(threads, "threads", who)
        if g > 1024 or (g < WARP and g & (g - 1)) or (g > WARP and g % WARP):
            raise ConfigError(
                f"{who}: threads per row must be a power of two up to 32 or a multiple of 32 "
                f"up to 1024, got {g}")
    k = -(-nvec // g)
    if k > max_k:
        raise SpecError(
            f"{who}: N={N} needs {k} chunks of {vec} per thread with {g} threads per row; "
            f"at most {max_k} fit in registers (N <= {max_n} with the default plan)")
    if threads is None:
        g = min(g, _round_threads(-(-nvec // k)))  # drop idle threads; K stays the same
    if rows is None:
        r = max(1, min_block // g) if g < min_block else 1
    else:
        r = _pos_int(rows, "rows", who)
    if r > 1 and g & (g - 1):
        raise ConfigError(f"{who}: several rows per CTA need a power-of-two threads per row, got {g}")
    if g * r > 1024 or (g < WARP and (g * r) % WARP):
        raise ConfigError(
            f"{who}: {r} rows of {g} threads make a CTA of {g * r} threads; it must be at most "
            f"1024 and, with fewer than 32 threads per row, a multiple of 32")
    return RowPlan(B, N, dtype, vec, g, k, r)


# ----------------------------------------------------------------------------- vector access
def l2_policy(priority: str) -> Any:
    """A ``createpolicy.fractional.L2::<priority>.b64`` register (all accesses), or None for ""."""
    if not priority:
        return None
    if priority not in L2_PRIORITIES:
        raise ConfigError(f"L2 priority must be one of {L2_PRIORITIES}, got {priority!r}")
    pol = reg.scalar(b64)
    ptx.inst(f"createpolicy.fractional.L2::{priority}.b64")(pol, 1.0)
    return pol


def _hinted(op: str, priority: str) -> tuple[str, tuple]:
    pol = l2_policy(priority)
    return (op, ()) if pol is None else (op + ".L2::cache_hint", (pol,))


def _bf16_word(value: float) -> int:
    b = bf16_bits(value)
    return (b << 16) | b


def load_raw_vec(ptr: Any, off: int, dtype: PtxType, n: int, *, pred: Any = None,
                 fill: float | None = 0.0, cache: str = "", dst: list | None = None,
                 space: str = "global", policy: str | None = None) -> list:
    """Load ``n`` consecutive elements at ``[ptr+off]`` as they are stored: raw registers.

    f32: ``n`` f32 registers; bf16: ``n // 2`` b32 words (element ``2i`` in the low
    half), or one b16 for ``n == 1``. Where ``pred`` is false the registers are
    ``fill`` (``fill=None``: left as they were, for a guard whose result is unused).
    ``dst`` is a list of registers from an earlier call of the same shape to load
    into (a loop-carried register set); by default fresh registers. ``space="shared"``
    reads shared memory (``ptr`` a u32 shared address; ``cache`` is ignored). ``policy``
    is an L2 eviction priority (default ``L2_LOAD``, none for ``KEEP`` loads).
    """
    hint: tuple = ()
    if space == "global":
        ld, hint = _hinted(f"ld.global{cache}", (L2_LOAD if cache != KEEP else "")
                           if policy is None else policy)
    else:
        ld = f"ld.{space}"
    out: list = []
    if dtype is f32:
        per = min(n, 4)
        for p in range(0, n, per):
            regs = reg.array(f32, per) if dst is None else dst[p:p + per]
            if pred is not None and fill is not None:
                for r in regs:
                    ptx.inst.mov.f32(r, fill)
            v = f".v{per}" if per > 1 else ""
            ptx.inst(f"{ld}{v}.f32")(regs if per > 1 else regs[0],
                                     ptx.addr(ptr, off + 4 * p), *hint, pred=pred)
            out.extend(regs)
        return out
    if n == 1:  # one bf16
        h = reg.scalar(b16) if dst is None else dst[0]
        if pred is not None and fill is not None:
            ptx.inst.mov.b16(h, bf16_bits(fill))
        ptx.inst(f"{ld}.b16")(h, ptx.addr(ptr, off), *hint, pred=pred)
        return [h]
    words = n // 2
    for p in range(0, words, 4):
        per = min(words - p, 4)
        w = reg.array(b32, per) if dst is None else dst[p:p + per]
        if pred is not None and fill is not None:
            for r in w:
                ptx.inst.mov.b32(r, _bf16_word(fill))
        v = f".v{per}" if per > 1 else ""
        ptx.inst(f"{ld}{v}.b32")(w if per > 1 else w[0], ptx.addr(ptr, off + 4 * p), *hint,
                                 pred=pred)
        out.extend(w)
    return out


def unpack(raw: list, dtype: PtxType) -> list:
    """f32 registers of the elements in ``raw`` (from ``load_raw_vec``): f32 as they are;
    bf16 words split with ``shl``/``and`` (no conversion instruction), a b16 with ``cvt``."""
    if dtype is f32:
        return list(raw)
    if len(raw) == 1 and raw[0].type is b16:
        f = reg.scalar(f32)
        ptx.inst.cvt.f32.bf16(f, raw[0])
        return [f]
    out: list = []
    for r in raw:
        lo, hi = reg.scalar(f32), reg.scalar(f32)
        ptx.inst.shl.b32(lo, r, 16)             # element 2i: the low half
        ptx.inst.and_.b32(hi, r, 0xFFFF0000)    # element 2i+1: the high half
        out += [lo, hi]
    return out


def load_vec(ptr: Any, off: int, dtype: PtxType, n: int, *, pred: Any = None,
             fill: float = 0.0, cache: str = "", policy: str | None = None,
             space: str = "global") -> list:
    """Load ``n`` consecutive elements at ``[ptr+off]`` (aligned to their size) as f32 registers.

    Where ``pred`` is false the values are ``fill``. ``cache`` is a modifier
    string after ``ld.global`` (``STREAM``, ``KEEP`` or ""); ``policy`` and ``space`` as in
    ``load_raw_vec``.
    """
    kw = dict(pred=pred, fill=fill, cache=cache, policy=policy, space=space)
    if dtype is f32 or n == 1:
        return unpack(load_raw_vec(ptr, off, dtype, n, **kw), dtype)
    out: list = []
    for p in range(0, n // 2, 4):  # each load's words unpacked right after it
        per = min(n // 2 - p, 4)
        out += unpack(load_raw_vec(ptr, off + 4 * p, dtype, 2 * per, **kw), dtype)
    return out


def store_vec(ptr: Any, off: int, dtype: PtxType, vals: list, *, pred: Any = None,
              cache: str | None = None, space: str = "global", policy: str | None = None) -> None:
    """Store f32 registers ``vals`` as ``len(vals)`` consecutive ``dtype`` elements at ``[ptr+off]``
    (``cache``: a modifier after ``st.global``, default ``STORE``; ``policy``: an L2 eviction
    priority, default ``L2_STORE``; ``space="shared"``: ``ptr`` is a u32 shared address and
    ``cache`` and ``policy`` are ignored)."""
    n = len(vals)
    cache = STORE if cache is None else cache
    hint: tuple = ()
    if space == "global":
        st, hint = _hinted(f"st.global{cache}", L2_STORE if policy is None else policy)
    else:
        st = f"st.{space}"
    if dtype is f32:
        per = min(n, 4)
        for p in range(0, n, per):
            v = f".v{per}" if per > 1 else ""
            ptx.inst(f"{st}{v}.f32")(ptx.addr(ptr, off + 4 * p),
                                     list(vals[p:p + per]) if per > 1 else vals[p], *hint,
                                     pred=pred)
        return
    if n == 1:
        h = reg.scalar(b16)
        ptx.inst.cvt.rn.bf16.f32(h, vals[0])
        ptx.inst(f"{st}.b16")(ptx.addr(ptr, off), h, *hint, pred=pred)
        return
    words = []
    for i in range(0, n, 2):
        w = reg.scalar(b32)
        ptx.inst.cvt.rn.bf16x2.f32(w, vals[i + 1], vals[i])  # a -> high half, b -> low half
        words.append(w)
    for p in range(0, len(words), 4):
        per = min(len(words) - p, 4)
        v = f".v{per}" if per > 1 else ""
        ptx.inst(f"{st}{v}.b32")(ptx.addr(ptr, off + 4 * p),
                                 words[p:p + per] if per > 1 else words[p], *hint, pred=pred)


# ----------------------------------------------------------------------------- arithmetic
def tree(vals: list, op: str) -> Any:
    """Combine ``vals`` pairwise with ``add``/``max`` (log depth); returns a register."""
    vals = list(vals)
    if len(vals) == 1:
        out = reg.scalar(f32)
        ptx.inst.mov.f32(out, vals[0])
        return out
    while len(vals) > 1:
        nxt = []
        for i in range(0, len(vals) - 1, 2):
            r = reg.scalar(f32)
            ptx.inst(f"{op}.f32")(r, vals[i], vals[i + 1])
            nxt.append(r)
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    return vals[0]


def dot(a: list, b: list, lanes: int = 4) -> Any:
    """sum(a[i] * b[i]) with ``lanes`` independent fma chains, then a tree."""
    lanes = min(lanes, len(a))
    acc = [reg.scalar(f32) for _ in range(lanes)]
    for i in range(lanes):
        ptx.inst.mul.f32(acc[i], a[i], b[i])
    for i in range(lanes, len(a)):
        ptx.inst.fma.rn.f32(acc[i % lanes], a[i], b[i], acc[i % lanes])
    return tree(acc, "add")


def mul_all(vals: list, s: Any) -> list:
    out = []
    for v in vals:
        r = reg.scalar(f32)
        ptx.inst.mul.f32(r, v, s)
        out.append(r)
    return out


def cta_slice(span: int, total: int) -> tuple[Any, Any]:
    """(start, nbytes) of this CTA's bytes ``[cta*span, (cta+1)*span)`` of an array of ``total``
    bytes: ``start`` a u64 register, ``nbytes`` the int ``span`` or, where the last CTA's
    slice is shorter (what is left of ``total``), a u32 register."""
    cta = ptx.special.ctaid.x()
    start = reg.scalar(u64)
    ptx.inst.mul.wide.u32(start, cta, span)
    nbytes: Any = span
    if total % span:
        last = -(-total // span) - 1
        nbytes = reg.scalar(u32)
        ptx.inst.selp.u32(nbytes, total - last * span, span, cta == last)
    return start, nbytes


def prefetch_cta_slice(ptrs: Any, span: int, total: int, tid: Any,
                       where: tuple[Any, Any] | None = None) -> None:
    """PDL prologue: thread 0 asks for this CTA's slice (``cta_slice``, or ``where`` if the
    caller has it) of each array at ``ptrs`` in L2, one ``cp.async.bulk.prefetch`` each.
    Nothing when ``PDL_PREFETCH`` is off or the sizes are not multiples of 16 bytes (the
    bulk copy's granule)."""
    if not PDL_PREFETCH or span % 16 or total % 16:
        return
    start, nbytes = where or cta_slice(span, total)
    lead = tid == 0
    for ptr in ptrs:
        ptx.bulk_prefetch_l2(ptr + start, nbytes, pred=lead)


def entry(pdl: bool) -> Any:
    """The block a row kernel opens first: ``ptx.pdl_prologue()`` for a ``pdl=True`` kernel
    (address setup and the L2 prefetches overlap the previous grid), else nothing."""
    return ptx.pdl_prologue() if pdl else contextlib.nullcontext()


# ----------------------------------------------------------------------------- in-kernel view
class Rows:
    """The calling thread's place in a ``RowPlan``, inside a kernel body."""

    def __init__(self, plan: RowPlan) -> None:
        self.p = p = plan
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
        (``prefetch_cta_slice``; rows past ``B`` left out)."""
        p = self.p
        row_bytes = p.N * p.es
        prefetch_cta_slice(ptrs, p.rows * row_bytes, p.B * row_bytes, self.tid)

    def locate(self, row: Any) -> tuple[Any, Any]:
        """(row to read, store predicate or None): rows past B read row B-1 and store nothing."""
        if not self.p.ragged_rows:
            return row, None
        ok = row < self.p.B
        rc = reg.scalar(u32)
        ptx.inst.min.u32(rc, row, self.p.B - 1)
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
        (``cache`` after ``ld.global``; default ``STREAM``)."""
        p = self.p
        cache = STREAM if cache is None else cache
        dtype = dtype or p.dtype
        out: list = []
        for j in range(p.chunks):
            pred = self.tail if j == p.chunks - 1 else None
            out += load_vec(ptr, j * p.threads * p.vec * dtype.bytes, dtype, p.vec, pred=pred,
                            fill=fill, cache=cache)
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
        cache = STREAM if cache is None else cache
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
                                cache=cache, dst=part, space=space)
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
                        fill=fill, cache=cache)

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
        ``space="shared"``: ``ptr`` is a u32 shared address of a row)."""
        p = self.p
        dtype = dtype or p.dtype
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
                      vals[j * p.vec:(j + 1) * p.vec], pred=pred, cache=cache, space=space)

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


def persistent_plan(B: int, N: int, dtype: PtxType, *, who: str, elems: int,
                    chunks: int | None = None, threads: int | None = None,
                    rows: int | None = None) -> RowPlan:
    """Launch shape of a persistent row kernel: ``plan_rows`` aiming at ``elems`` values per
    thread instead of 64 bytes, so two row register sets and the held weights fit in 64
    registers (two 512-thread CTAs or one of 1024 per SM; ``elems`` is the kernel's measured
    budget). ``N`` is limited to ``1024 * elems``: past that a 1024-thread CTA would need more
    values per thread than fit and ptxas spills. Overrides as in ``plan_rows``."""
    return plan_rows(B, N, dtype, who=who, chunks=chunks, threads=threads, rows=rows,
                     max_n=1024 * elems, target_bytes=elems * dtype.bytes)


def persistent_ctas(plan: RowPlan, ctas: Any, who: str) -> int:
    """Grid of a persistent row kernel: ``ctas`` CTAs, but never more than there are row
    groups (``ceil(B/R)``), so every CTA has at least one."""
    return min(_pos_int(ctas, "ctas", who), plan.grid[0])


def row_loop(io: Rows, ctas: int, fetch: Any, body: Any) -> None:
    """Device loop of a persistent row kernel, the next row's loads in flight during this one.

    CTA ``c`` walks row groups ``it = c*R, c*R + P*R, ...`` below ``B`` (``P = ctas``
    CTAs; ``persistent_ctas`` keeps ``c*R < B``). ``fetch(off, guard, dst)`` issues the
    loads of the thread's row at byte offset ``off`` (``io.offset``) and returns raw
    registers (``Rows.load_raw``; ``guard`` and ``dst`` go to it); ``body(raw, off, ok)``
    computes and stores that row (``ok``: store predicate, None when every row is
    inside ``B``). Two register sets ``A``, ``B`` and the loop unrolled twice, so no set
    is copied::

        A = fetch(c*R)
        top: B = fetch(it + P*R) if it + P*R < B;  body(A)
             if it + P*R >= B: done
             it += 2*P*R;  A = fetch(it) if it < B;  body(B)
             if it < B: goto top

    Each ``body`` call traces its reductions afresh, so the two halves use different
    shared-memory slots: a reduction slot is rewritten only after the next barrier,
    which no warp passes before every warp has read it. Rows past ``B`` inside a group
    (``R > 1``, last group) read row ``B-1`` and store nothing (``Rows.locate``).
    """
    p = io.p
    R = p.rows
    step = ctas * R

    def where(it: Any) -> tuple[Any, Any]:
        row, ok = io.locate(it if R == 1 else it + io.g)
        return io.offset(row), ok

    it0 = reg.scalar(u32)
    ptx.inst.mul.lo.u32(it0, ptx.special.ctaid.x(), R)
    a = fetch(where(it0)[0], None, None)
    top, end = ptx.label("rows"), ptx.label("rows_end")
    ptx.place(top)
    current().raw('.pragma "nounroll";')
    it1 = it0 + step
    has1 = it1 < p.B
    b = fetch(where(it1)[0], has1, None)
    body(a, *where(it0))
    ptx.bra(end, pred=~has1, uni=True)
    ptx.inst.add.u32(it0, it1, step)
    has0 = it0 < p.B
    fetch(where(it0)[0], has0, a)
    body(b, *where(it1))
    ptx.bra(top, pred=has0, uni=True)
    ptx.place(end)


def ring_plan(B: int, N: int, dtype: PtxType, *, who: str, ctas: Any, stages: Any,
              chunks: int | None = None, threads: int | None = None) -> tuple[RowPlan, int, int]:
    """(plan, CTAs, stages) of a TMA-ring row kernel (``Ring``): one row per CTA step (a
    short row gets a whole warp), ``stages`` (2..8) rows of ``N * bytes`` in shared memory,
    ``N * bytes`` a multiple of 16 (the bulk copy's granule), at most ``MAX_RING_BYTES``
    of ring per CTA."""
    plan = plan_rows(B, N, dtype, who=who, chunks=chunks, threads=threads)
    if plan.rows > 1:
        plan = plan_rows(B, N, dtype, who=who, chunks=chunks, threads=max(plan.threads, WARP),
                         rows=1)
    S = _pos_int(stages, "stages", who)
    if S < 2:  # each reduction slot is rewritten one step later: a later barrier must come first
        raise ConfigError(f"{who}: a TMA ring needs stages >= 2, got {S}")
    row_bytes = N * dtype.bytes
    if row_bytes % 16:
        raise SpecError(f"{who}: the TMA ring copies whole rows in 16-byte granules; N * "
                        f"{dtype.bytes} bytes must be a multiple of 16, got N={N}")
    if S > 8 or S * row_bytes > MAX_RING_BYTES:
        raise ConfigError(f"{who}: stages={S} rows of {row_bytes} bytes make a ring of "
                          f"{S * row_bytes} bytes; at most 8 stages and {MAX_RING_BYTES} bytes fit")
    return plan, persistent_ctas(plan, ctas, who), S


def ring_reg_cap(plan: RowPlan) -> int:
    """Default ``.maxnreg`` of a ring kernel: two CTAs per SM fit (at most 128 registers)."""
    return max(24, min(128, 65536 // (2 * plan.block[0]) // 8 * 8))


#: shared memory a ``Ring`` may take per CTA (of the 227 KiB an sm_90 CTA may have).
MAX_RING_BYTES = 192 * 1024


class Ring:
    """Rows of a persistent kernel streamed into shared memory by the bulk copy engine.

    CTA ``c`` of ``P`` handles rows ``c, c+P, c+2P, ...``; row ``i`` of its walk lands
    in slot ``i mod S`` of a ring of ``S`` row-sized slots in the dynamic shared window
    (``@kernel(smem=S * N * bytes)``), each with an mbarrier. Thread 0 issues one
    ``cp.async.bulk`` per row (``arrive.expect_tx`` of the row's bytes first); every
    thread waits on the slot's barrier, reads its chunks with ``ld.shared`` and computes.
    A slot is refilled with the row ``S`` steps ahead right after the row's first
    all-reduce: its ``bar.sync`` is the point where every thread has read the slot. So
    ``S`` rows per CTA are in flight without registers to hold them.

    ``bulk_store=True`` writes each result row back through its slot as well: every
    thread stores its values into the slot, ``fence.proxy.async`` and a ``bar.sync``
    later thread 0 issues one ``cp.async.bulk`` shared -> global for the row, and the
    slot is refilled one step later, once that copy has read it (``wait_group.read``).

    Make it in the kernel's PDL prologue (barrier setup touches only shared memory),
    ``start`` it after, then ``run``.
    """

    def __init__(self, io: Rows, ctas: int, stages: int, *, bulk_store: bool = False) -> None:
        self.io = io
        self.P = ctas
        self.S = stages
        self.bulk_store = bulk_store
        p = io.p
        self.row_bytes = p.N * p.es
        self.slots = smem.dynamic(name="ring")
        self.bars = smem.alloc(b64, stages, align=8, name="ring_bar")
        self.base = self.slots.addr()
        bars = self.bars.addr()
        with ptx.if_(io.tid == 0):
            for s in range(stages):
                ptx.mbarrier.init(bars + 8 * s, 1)
            ptx.fence_proxy_async()
        ptx.bar_sync(0)
        self._bars = bars
        self.first_row = reg.scalar(u32)
        ptx.inst.mov.u32(self.first_row, ptx.special.ctaid.x())
        self.row = reg.scalar(u32)
        ptx.inst.mov.u32(self.row, self.first_row)

    def prefetch(self, src: Any) -> None:
        """PDL prologue: ask for the first ``S`` rows of this CTA in L2 (thread 0)."""
        if not PDL_PREFETCH:
            return
        lead = self.io.tid == 0
        for s in range(self.S):
            r = self.row + s * self.P
            off = reg.scalar(u64)
            ptx.inst.mul.wide.u32(off, r, self.row_bytes)
            has = r < self.io.p.B
            ptx.bulk_prefetch_l2(src + off, self.row_bytes, pred=lead & has)

    def _fill(self, s: int, src: Any, row: Any, pred: Any = None, *, drain: bool = False) -> None:
        lead = self.io.tid == 0
        ok = lead & (row < self.io.p.B)
        with ptx.if_(ok if pred is None else ok & pred):
            if drain:  # the slot's bulk store must have read it
                ptx.tma.wait_group(0, read=True)
            bar = self._bars + 8 * s
            ptx.mbarrier.arrive_expect_tx(bar, self.row_bytes)
            off = reg.scalar(u64)
            ptx.inst.mul.wide.u32(off, row, self.row_bytes)
            ptx.tma.copy_bulk(self.base + s * self.row_bytes, src + off, self.row_bytes, bar)

    def start(self, src: Any) -> None:
        """Thread 0 issues the first ``S`` rows (after ``griddepcontrol.wait``)."""
        for s in range(self.S):
            self._fill(s, src, self.row + s * self.P)

    def run(self, src: Any, dst: Any, first: Any, then: Any) -> None:
        """The device loop, unrolled ``S`` times (one static slot per copy of the body).

        ``first(raw)`` gets the thread's chunks of the row as stored (``Rows.load_raw``
        from the slot) and must all-reduce once over the row (``Rows.reduce``; for rows
        of at most 32 threads, which have no barrier, the ring adds a ``bar.sync``); it
        returns a state from which ``then(state)`` computes the thread's f32 results,
        which the ring writes to the row of ``dst`` (same shape and dtype as ``src``).
        """
        io, S, P, B = self.io, self.S, self.P, self.io.p.B
        row = self.row
        phase = reg.scalar(u32, init=0)
        col = io.t * (io.p.vec * io.p.es)
        top, end = ptx.label("ring"), ptx.label("ring_end")
        ptx.place(top)
        current().raw('.pragma "nounroll";')
        for s in range(S):
            if s:
                ptx.bra(end, pred=row >= B, uni=True)
            ptx.mbarrier.wait(self._bars + 8 * s, phase)
            slot = self.base + (col + s * self.row_bytes)
            state = first(io.load_raw(slot, space="shared"))
            if io.p.threads <= WARP:
                ptx.bar_sync(0)
            if not self.bulk_store:
                self._fill(s, src, row + S * P)
                io.store(dst + io.offset(row), then(state))
            else:  # refill the slot stored from one step ago; store this row through its slot
                self._fill((s - 1) % S, src, row + (S - 1) * P, row != self.first_row, drain=True)
                io.store(slot, then(state), space="shared")
                ptx.fence_proxy_async()
                ptx.bar_sync(0)
                with ptx.if_(io.tid == 0):
                    off = reg.scalar(u64)
                    ptx.inst.mul.wide.u32(off, row, self.row_bytes)
                    ptx.tma.store_bulk(dst + off, self.base + s * self.row_bytes, self.row_bytes)
                    ptx.tma.commit_group()
            ptx.inst.add.u32(row, row, P)
        ptx.inst.xor.b32(phase, phase, 1)
        ptx.bra(top, pred=row < B, uni=True)
        ptx.place(end)
        if self.bulk_store:
            with ptx.if_(io.tid == 0):
                ptx.tma.wait_group(0, read=False)


def rsqrt(x: Any) -> Any:
    r = reg.scalar(f32)
    ptx.inst.rsqrt.approx.ftz.f32(r, x)
    return r


def rstd(total: Any, n: int, eps: float) -> Any:
    """``rsqrt(total / n + eps)``: the normalising factor of RMSNorm and LayerNorm."""
    ms = reg.scalar(f32)
    ptx.inst.fma.rn.f32(ms, total, 1.0 / n, eps)
    return rsqrt(ms)


# ----------------------------------------------------------------------------- backward helpers
def build_colsum(P: int, C: int, N: int, dtype: PtxType, *, name: str = "colsum",
                 ry: int = 8, unroll: int = 4):
    """Sum partials ``(P*C, N)`` f32 (row ``p*C + c``) over ``p`` into ``C`` outputs ``(N,)``.

    CTA = 32 column vectors x ``ry`` row slices; each thread adds rows
    ``ty, ty+ry, ...`` (``unroll`` loads in flight per step), the slices are
    added through shared memory and the first slice writes the result in
    ``dtype``. Grid ``(ceil(N/vec/32), C)``.
    """
    cvec = 4 if N % 4 == 0 else 2 if N % 2 == 0 else 1
    ncv = N // cvec
    gx = -(-ncv // WARP)
    step = ry * unroll
    row_bytes = N * 4

    if C not in (1, 2):
        raise ConfigError(f"build_colsum: C must be 1 or 2, got {C}")

    def body(Part, Outs):
        pp, *pouts = ptx.global_ptrs(Part, *Outs)
        tx = ptx.special.tid.x()
        ty = ptx.special.tid.y()
        c = ptx.special.ctaid.y()
        col = reg.scalar(u32)
        ptx.inst.mad.lo.u32(col, ptx.special.ctaid.x(), WARP, tx)
        ok = None
        if ncv % WARP:
            ok = col < ncv
            colc = reg.scalar(u32)
            ptx.inst.min.u32(colc, col, ncv - 1)
        else:
            colc = col
        # address of partial[ty * C + c, colc * cvec]
        r0 = reg.scalar(u32)
        ptx.inst.mad.lo.u32(r0, ty, C, c)
        base = reg.scalar(u64)
        ptx.inst.mul.wide.u32(base, r0, row_bytes)
        coff = reg.scalar(u64)
        ptx.inst.mul.wide.u32(coff, colc, cvec * 4)
        ptr = pp + base + coff
        acc = [reg.scalar(f32, init=0.0) for _ in range(cvec)]
        for r in ptx.loop(ty, P, step):
            for u in range(unroll):
                pred = None
                if u and P % step:  # r < P holds for u == 0; later rows may pass P
                    pred = (r + u * ry) < P
                vals = load_vec(ptr, u * ry * C * row_bytes, f32, cvec, pred=pred, cache=STREAM)
                for a, v in zip(acc, vals):
                    ptx.inst.add.f32(a, a, v)
            ptx.inst.add.u64(ptr, ptr, step * C * row_bytes)
        red = smem.alloc(f32, ry * WARP * cvec, name="slices")
        sbase = red.addr()
        mine = reg.scalar(u32)
        ptx.inst.mad.lo.u32(mine, ty, WARP * cvec * 4, sbase)
        mine = mine + tx * (cvec * 4)
        for i, a in enumerate(acc):
            ptx.inst.st.shared.f32(ptx.addr(mine, 4 * i), a)
        ptx.bar_sync(0)
        with ptx.if_(ty == 0):
            col_s = sbase + tx * (cvec * 4)
            tot = [reg.scalar(f32) for _ in range(cvec)]
            for i in range(cvec):
                ptx.inst.ld.shared.f32(tot[i], ptx.addr(col_s, 4 * i))
            for y in range(1, ry):
                for i in range(cvec):
                    v = reg.scalar(f32)
                    ptx.inst.ld.shared.f32(v, ptx.addr(col_s, (y * WARP * cvec + i) * 4))
                    ptx.inst.add.f32(tot[i], tot[i], v)
            ooff = reg.scalar(u64)
            ptx.inst.mul.wide.u32(ooff, colc, cvec * dtype.bytes)
            for ci, po in enumerate(pouts):
                if C == 1:
                    store_vec(po + ooff, 0, dtype, tot, pred=ok)
                else:
                    is_c = c == ci
                    pred = is_c if ok is None else (is_c & ok)
                    store_vec(po + ooff, 0, dtype, tot, pred=pred)
        ptx.ret()

    deco = kernel(in_specs=(Tile(P * C, N, f32),), out_specs=tuple(Tile(N, dtype) for _ in range(C)),
                  grid=(gx, C, 1), block=(WARP, ry, 1), name=name)
    if C == 1:
        def colsum(Part, Out):
            body(Part, (Out,))
    else:
        def colsum(Part, Out0, Out1):
            body(Part, (Out0, Out1))
    return deco(colsum)


def reg_cap(plan: RowPlan) -> int:
    """``.maxnreg`` for a CTA of the plan: what one CTA may use, at most 128.

    Without it ptxas caps 512-thread CTAs at 64 registers and spills the backward kernels.
    """
    return max(24, min(128, 65536 // plan.block[0] // 8 * 8))


def bwd_ctas(plan: RowPlan, ctas: int | None) -> int:
    """CTAs of a persistent backward stage: ``ctas``, else ~16 row groups per CTA but at
    least 264 CTAs (two per SM of an H100), never more than there are row groups."""
    groups = plan.grid[0]
    if ctas is not None:
        return max(1, min(_pos_int(ctas, "ctas", "bwd_ctas"), groups))
    return min(groups, max(264, -(-groups // 16)))


class TwoStage:
    """A backward kernel (writing ``dx`` and partials) followed by ``build_colsum``.

    Looks like a kernel to ``pyptx.differentiable_kernel``: ``in_specs`` are the
    first stage's, ``out_specs`` are ``dx`` plus the summed gradients.
    """

    def __init__(self, stage1: Any, colsum: Any) -> None:
        self.stage1 = stage1
        self.colsum = colsum
        self.in_specs = stage1.in_specs
        self.out_specs = stage1.out_specs[:-1] + colsum.out_specs
        self.name = stage1.name
        self.arg_names = stage1.arg_names
        self.kernels = (stage1, colsum)

    def __call__(self, *args: Any) -> Any:
        outs = self.stage1(*args)
        *first, part = outs
        sums = self.colsum(part)
        sums = tuple(sums) if isinstance(sums, (tuple, list)) else (sums,)
        return (*first, *sums)

    def __repr__(self) -> str:
        return f"<TwoStage {self.stage1.name} -> {self.colsum.name}>"
