"""``ptx.cluster``: thread-block clusters and distributed shared memory (sm_90).

A CTA of a cluster can address the shared memory of its peers: ``map_shared``
turns a local shared address into the ``shared::cluster`` address of the same
location in CTA ``rank``; ``load``/``store`` access it, and
``ptx.mbarrier.arrive(addr, remote=True)`` signals a peer's barrier.
``arrive``/``wait``/``sync`` are the cluster barrier (same as
``ptx.cluster_arrive``/``cluster_wait``/``cluster_sync``); ``arrive_remote`` and
``arrive_multicast`` arrive on the same mbarrier in other CTAs of the cluster.

Everything here needs sm_90 (checked at trace time) and takes ``pred=p`` (or
``~p``), which guards each emitted instruction with ``@p`` / ``@!p``.
"""

from __future__ import annotations

from typing import Any

from ..errors import OperandError, TypeMismatchError
from ..reg import Reg, render
from ..smem import SharedArray
from ..source import where
from ..trace import current
from ..types import PtxType, u32, u64
from ._operands import guard, int_in, reg_of, require_arch, shared_addr, u32_or_imm
from .memory import Addr
from .sync import cluster_arrive as arrive
from .sync import cluster_sync as sync
from .sync import cluster_wait as wait

__all__ = ["ctarank", "nctarank", "map_shared", "rank_of", "load", "store", "arrive", "wait",
           "sync", "arrive_remote", "arrive_multicast"]


def _sreg(sreg: str, fn: str, pred: Any) -> Reg:
    trace = current()
    require_arch(trace, fn)
    g = guard(pred, fn, trace)
    r = Reg(trace.new_reg_name(u32), u32, trace)
    trace.inst("mov.u32", (r.name, sreg), g)
    return r


def ctarank(*, pred: Any = None) -> Reg:
    """This CTA's rank in its cluster: ``mov.u32 r, %cluster_ctarank;``."""
    return _sreg("%cluster_ctarank", "ptx.cluster.ctarank", pred)


def nctarank(*, pred: Any = None) -> Reg:
    """The number of CTAs in the cluster: ``mov.u32 r, %cluster_nctarank;``."""
    return _sreg("%cluster_nctarank", "ptx.cluster.nctarank", pred)


def map_shared(addr: SharedArray | Reg, rank: int | Reg, *, pred: Any = None) -> Reg:
    """``mapa.shared::cluster.u32 d, addr, rank;``: the cluster address of ``addr`` in CTA ``rank``.

    ``addr`` is a shared array or a u32 (or u64) shared address register; the result
    has the same width and is usable as ``ptx.addr(d)`` with ``shared::cluster``
    instructions (``cluster.load``/``store``, remote mbarrier arrives, TMA multicast).
    """
    fn = "ptx.cluster.map_shared"
    trace = current()
    require_arch(trace, fn)
    if type(addr) is SharedArray:
        width = 32
        a = render(addr, None, trace)
    elif type(addr) is Reg:
        width = reg_of(addr, "addr", "ptx.cluster.map_shared", (32, 64),
                       "a shared array or a 32/64-bit shared address register").type.bits
        a = render(addr, None, trace)
    else:
        raise OperandError(
            f"{where()}: ptx.cluster.map_shared addr must be a shared array or a shared address "
            f"register, got {addr!r}"
        )
    r = u32_or_imm(rank, "rank", "ptx.cluster.map_shared", trace, 0, 15, " (a CTA rank in the cluster)")
    t = u32 if width == 32 else u64
    d = Reg(trace.new_reg_name(t), t, trace)
    trace.inst(f"mapa.shared::cluster.{t.name}", (d.name, a, r), guard(pred, fn, trace))
    return d


def rank_of(addr: Reg, *, pred: Any = None) -> Reg:
    """``getctarank.shared::cluster.u32 r, addr;``: the rank of the CTA owning a cluster address."""
    trace = current()
    require_arch(trace, "ptx.cluster.rank_of")
    if type(addr) is not Reg:
        raise OperandError(f"{where()}: ptx.cluster.rank_of expects a shared::cluster address register, got {addr!r}")
    bits = reg_of(addr, "addr", "ptx.cluster.rank_of", (32, 64),
                  "a 32/64-bit shared::cluster address register").type.bits
    r = Reg(trace.new_reg_name(u32), u32, trace)
    trace.inst(f"getctarank.shared::cluster.u{bits}", (r.name, render(addr, None, trace)),
               guard(pred, "ptx.cluster.rank_of", trace))
    return r


def _cluster_addr(addr: Any, fn: str) -> Any:
    if type(addr) is Reg:
        reg_of(addr, "addr", fn, (32, 64), "a shared::cluster address register (from map_shared)")
        return Addr(addr, 0)
    if type(addr) is Addr and type(addr.base) is Reg:
        return addr
    raise OperandError(
        f"{where()}: {fn} addr must be a shared::cluster address register (from "
        f"ptx.cluster.map_shared) or ptx.addr(reg, offset), got {addr!r}"
    )


_LDST_TYPES = ("b32", "u32", "s32", "f32", "b64", "u64", "s64", "f64")


def load(t: PtxType, addr: Any, *, pred: Any = None) -> Reg:
    """``ld.shared::cluster.<t> r, [addr];``: read a peer CTA's shared memory (32/64-bit types)."""
    trace = current()
    require_arch(trace, "ptx.cluster.load")
    if not isinstance(t, PtxType) or t.name not in _LDST_TYPES:
        raise OperandError(f"{where()}: ptx.cluster.load type must be one of {_LDST_TYPES}, got {t!r}")
    a = _cluster_addr(addr, "ptx.cluster.load")
    r = Reg(trace.new_reg_name(t), t, trace)
    trace.inst(f"ld.shared::cluster.{t.name}", (r.name, render(a, None, trace)),
               guard(pred, "ptx.cluster.load", trace))
    return r


def store(addr: Any, value: Reg | list | tuple, *, pred: Any = None) -> None:
    """``st.shared::cluster.<type> [addr], value;``: write a peer CTA's shared memory.

    ``value`` is a 32/64-bit register, or a list of 2 or 4 registers of one such type,
    stored as one vector (``st.shared::cluster.v4.f32 [addr], {a, b, c, d};``, ``addr``
    aligned to the vector's size).
    """
    fn = "ptx.cluster.store"
    trace = current()
    require_arch(trace, fn)
    a = _cluster_addr(addr, fn)
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(values) not in (1, 2, 4):
        raise OperandError(f"{where()}: {fn} value must be a register or a list of 2 or 4, "
                           f"got a list of {len(values)}")
    for v in values:
        if type(v) is not Reg:
            raise OperandError(f"{where()}: {fn} value must be a register, got {v!r}")
        if v.type.name not in _LDST_TYPES:
            raise TypeMismatchError(
                f"{where()}: {fn} value must be a 32/64-bit register of {_LDST_TYPES}, "
                f"got .{v.type.name} register {v.name}"
            )
        if v.type is not values[0].type:
            raise TypeMismatchError(
                f"{where()}: {fn} vector registers must share one type, got "
                f".{values[0].type.name} and .{v.type.name}"
            )
    t = values[0].type.name
    if len(values) == 4 and values[0].type.bits == 64:
        raise OperandError(f"{where()}: {fn}: a vector of four holds 32-bit registers only, got "
                           f"four .{t}")
    vec = "" if len(values) == 1 else f"v{len(values)}."
    trace.inst(f"st.shared::cluster.{vec}{t}",
               (render(a, None, trace), render(values[0] if len(values) == 1 else values, None, trace)),
               guard(pred, fn, trace))


_ARRIVE_REMOTE = "mbarrier.arrive.release.cluster.shared::cluster.b64"


def _remote_arrive(fn: str, bar: Any, ranks: list[str], count: Any, pred: Any) -> None:
    trace = current()
    require_arch(trace, fn)
    b = shared_addr(bar, "bar", fn, trace, align=8, size=8)[1:-1]
    if type(bar) is Reg and bar.type.bits != 32:
        raise TypeMismatchError(f"{where(3)}: {fn} bar must be a 32-bit shared address register, "
                                f"got .{bar.type.name} register {bar.name}")
    tail = () if count is None else (u32_or_imm(count, "count", fn, trace, 1, (1 << 20) - 1),)
    g = guard(pred, fn, trace)
    for r in ranks:
        d = Reg(trace.new_reg_name(u32), u32, trace)
        trace.inst("mapa.shared::cluster.u32", (d.name, b, r), g)
        trace.inst(_ARRIVE_REMOTE, ("_", f"[{d.name}]", *tail), g)


def arrive_remote(bar: Any, rank: int | Reg, *, count: int | Reg | None = None,
                  pred: Any = None) -> None:
    """Arrive on the mbarrier at ``bar``'s offset in cluster CTA ``rank`` (release, cluster scope).

    ``bar`` is a local mbarrier as for ``ptx.mbarrier`` (a shared array, ``ptx.addr`` of
    one, or a u32 shared address); ``rank`` an int 0..15 or a u32 register. Emits::

        mapa.shared::cluster.u32 r, bar, rank;
        mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r]{, count};
    """
    fn = "ptx.cluster.arrive_remote"
    trace = current()
    rk = u32_or_imm(rank, "rank", fn, trace, 0, 15, " (a CTA rank in the cluster)")
    _remote_arrive(fn, bar, [rk], count, pred)


def arrive_multicast(bar: Any, mask: int, *, count: int | Reg | None = None,
                     pred: Any = None) -> None:
    """Arrive on ``bar``'s mbarrier in every cluster CTA whose bit is set in ``mask``.

    ``mask`` is a Python int in 1..0xFFFF (bit r = CTA rank r, the same convention as the
    TMA ``multicast_mask``); for each set bit, in rank order, it emits the
    ``arrive_remote`` pair ``mapa`` + ``mbarrier.arrive.release.cluster.shared::cluster``.
    A consumer uses it to release a stage that a multicast load fills in several CTAs.
    """
    fn = "ptx.cluster.arrive_multicast"
    int_in(mask, "mask", fn, 1, 0xFFFF, " (one bit per CTA rank)")
    _remote_arrive(fn, bar, [str(r) for r in range(16) if mask >> r & 1], count, pred)
