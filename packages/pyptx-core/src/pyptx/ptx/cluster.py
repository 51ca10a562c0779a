"""``ptx.cluster``: thread-block clusters and distributed shared memory (sm_90).

A CTA of a cluster can address the shared memory of its peers: ``map_shared``
turns a local shared address into the ``shared::cluster`` address of the same
location in CTA ``rank``; ``load``/``store`` access it, and
``ptx.mbarrier.arrive(addr, remote=True)`` signals a peer's barrier.
``arrive``/``wait``/``sync`` are the cluster barrier (same as
``ptx.cluster_arrive``/``cluster_wait``/``cluster_sync``).
"""

from __future__ import annotations

from typing import Any

from ..errors import OperandError, TypeMismatchError
from ..reg import Reg, render
from ..smem import SharedArray
from ..source import where
from ..trace import current
from ..types import PtxType, u32, u64
from ._operands import reg_of, u32_or_imm
from .memory import Addr
from .special import special
from .sync import cluster_arrive as arrive
from .sync import cluster_sync as sync
from .sync import cluster_wait as wait

__all__ = ["ctarank", "nctarank", "map_shared", "rank_of", "load", "store", "arrive", "wait",
           "sync"]


def ctarank() -> Reg:
    """This CTA's rank in its cluster: ``mov.u32 r, %cluster_ctarank;``."""
    return special.cluster_ctarank()


def nctarank() -> Reg:
    """The number of CTAs in the cluster: ``mov.u32 r, %cluster_nctarank;``."""
    return special.cluster_nctarank()


def map_shared(addr: SharedArray | Reg, rank: int | Reg) -> Reg:
    """``mapa.shared::cluster.u32 d, addr, rank;``: the cluster address of ``addr`` in CTA ``rank``.

    ``addr`` is a shared array or a u32 (or u64) shared address register; the result
    has the same width and is usable as ``ptx.addr(d)`` with ``shared::cluster``
    instructions (``cluster.load``/``store``, remote mbarrier arrives, TMA multicast).
    """
    trace = current()
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
    trace.inst(f"mapa.shared::cluster.{t.name}", (d.name, a, r))
    return d


def rank_of(addr: Reg) -> Reg:
    """``getctarank.shared::cluster.u32 r, addr;``: the rank of the CTA owning a cluster address."""
    trace = current()
    if type(addr) is not Reg:
        raise OperandError(f"{where()}: ptx.cluster.rank_of expects a shared::cluster address register, got {addr!r}")
    bits = reg_of(addr, "addr", "ptx.cluster.rank_of", (32, 64),
                  "a 32/64-bit shared::cluster address register").type.bits
    r = Reg(trace.new_reg_name(u32), u32, trace)
    trace.inst(f"getctarank.shared::cluster.u{bits}", (r.name, render(addr, None, trace)))
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


def load(t: PtxType, addr: Any) -> Reg:
    """``ld.shared::cluster.<t> r, [addr];``: read a peer CTA's shared memory (32/64-bit types)."""
    trace = current()
    if not isinstance(t, PtxType) or t.name not in _LDST_TYPES:
        raise OperandError(f"{where()}: ptx.cluster.load type must be one of {_LDST_TYPES}, got {t!r}")
    a = _cluster_addr(addr, "ptx.cluster.load")
    r = Reg(trace.new_reg_name(t), t, trace)
    trace.inst(f"ld.shared::cluster.{t.name}", (r.name, render(a, None, trace)))
    return r


def store(addr: Any, value: Reg) -> None:
    """``st.shared::cluster.<type> [addr], value;``: write a peer CTA's shared memory."""
    trace = current()
    a = _cluster_addr(addr, "ptx.cluster.store")
    if type(value) is not Reg:
        raise OperandError(f"{where()}: ptx.cluster.store value must be a register, got {value!r}")
    if value.type.name not in _LDST_TYPES:
        raise TypeMismatchError(
            f"{where()}: ptx.cluster.store value must be a 32/64-bit register of {_LDST_TYPES}, "
            f"got .{value.type.name} register {value.name}"
        )
    trace.inst(f"st.shared::cluster.{value.type.name}", (render(a, None, trace), value.name))
