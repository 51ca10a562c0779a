"""``ptx.cp_async``: Ampere-style asynchronous copies global -> shared (sm_80).

Each thread copies 4, 8 or 16 bytes; copies are grouped per thread::

    ptx.cp_async.copy(ptx.addr(buf, off), ptx.addr(src, goff), 16)
    ptx.cp_async.commit_group()        # close the group of copies issued so far
    ptx.cp_async.wait_group(0)         # at most 0 groups still in flight
    ptx.bar_sync(0)                    # then other threads may read the tile

``src_size`` (< size) copies only that many bytes and zero-fills the rest: the
bounds of a ragged edge. Every helper takes ``pred=p`` (or ``~p``), which
guards its instruction with ``@p`` / ``@!p``.
"""

from __future__ import annotations

from typing import Any

from ..errors import OperandError
from ..reg import Reg
from ..source import where
from ..trace import current
from ._operands import global_addr, guard, is_int, require_arch, shared_addr, u32_or_imm

__all__ = ["copy", "commit_group", "wait_group", "wait_all"]

SIZES = (4, 8, 16)
"""The byte counts one ``cp.async`` can copy."""


def copy(dst_smem: Any, src_global: Any, size: int, *, cache: str = "ca",
         src_size: int | Reg | None = None, pred: Any = None) -> None:
    """``cp.async.{ca,cg}.shared.global [dst], [src], size{, src_size};``.

    ``dst_smem``: a shared address (shared array, ``ptx.addr`` of one, or u32 register),
    ``src_global``: a u64 global address register or ``ptx.addr(reg, off)``; both
    ``size``-aligned. ``size``: 4, 8 or 16. ``cache``: 'ca' (cache in L1 and L2) or 'cg'
    (L2 only; ``size`` must be 16). ``src_size``: an int in 0..size or a u32 register;
    bytes past it are written as zeros.
    """
    fn = "ptx.cp_async.copy"
    trace = current()
    require_arch(trace, fn, 80)
    if not is_int(size) or size not in SIZES:
        raise OperandError(f"{where()}: {fn} size must be 4, 8 or 16 bytes, got {size!r}")
    if cache not in ("ca", "cg"):
        raise OperandError(f"{where()}: {fn} cache must be 'ca' or 'cg', got {cache!r}")
    if cache == "cg" and size != 16:
        raise OperandError(f"{where()}: {fn} cache='cg' copies 16 bytes only, got size={size}")
    dst = shared_addr(dst_smem, "dst_smem", fn, trace, align=size, size=size)
    src = global_addr(src_global, "src_global", fn, trace)
    ops = [dst, src, str(size)]
    if src_size is not None:
        ops.append(u32_or_imm(src_size, "src_size", fn, trace, 0, size, " (bytes)"))
    trace.inst(f"cp.async.{cache}.shared.global", tuple(ops), guard(pred, fn, trace))


def commit_group(*, pred: Any = None) -> None:
    """``cp.async.commit_group;``: close this thread's group of issued ``copy`` calls."""
    fn = "ptx.cp_async.commit_group"
    trace = current()
    require_arch(trace, fn, 80)
    trace.inst("cp.async.commit_group", (), guard(pred, fn, trace))


def wait_group(n: int = 0, *, pred: Any = None) -> None:
    """``cp.async.wait_group n;``: wait until at most ``n`` of this thread's groups are pending."""
    fn = "ptx.cp_async.wait_group"
    trace = current()
    require_arch(trace, fn, 80)
    if not is_int(n) or n < 0:
        raise OperandError(f"{where()}: {fn} n must be a non-negative int, got {n!r}")
    trace.inst("cp.async.wait_group", (str(n),), guard(pred, fn, trace))


def wait_all(*, pred: Any = None) -> None:
    """``cp.async.wait_all;``: wait for every copy this thread issued (committed or not)."""
    fn = "ptx.cp_async.wait_all"
    trace = current()
    require_arch(trace, fn, 80)
    trace.inst("cp.async.wait_all", (), guard(pred, fn, trace))
