"""``ptx.mbarrier``: shared-memory arrive/wait barriers with transaction counts (sm_90).

An mbarrier is one 8-byte aligned ``.b64`` slot in shared memory. Every helper
takes it as ``bar``: a shared array (``smem.alloc(b64, 1, align=8)``),
``ptx.addr(bars, 8 * i)`` into one, or a 32-bit register holding its shared
address (``bars.addr()``, or a cluster address from ``ptx.cluster.map_shared``
for the ``remote=True`` forms).

Typical TMA pipeline::

    mbarrier.init(bar, 1)                      # one arriving thread
    ptx.fence_mbarrier_init()
    mbarrier.arrive_expect_tx(bar, tile_bytes)  # producer: arrive + expect the bytes
    ptx.tma.load_tile(buf, tmap, (x, y), bar)
    mbarrier.wait(bar, phase)                   # consumers: spin until the phase flips

Every helper takes ``pred=p`` (or ``~p``): its instruction is guarded ``@p`` /
``@!p``; ``wait`` (a spin loop) is instead skipped as a whole by a branch.
``init``, ``inval`` and a local ``arrive`` without ``count`` need sm_80; the
rest needs sm_90 (a ``TraceError`` at trace time names the kernel's arch).
"""

from __future__ import annotations

from typing import Any

from ..errors import OperandError
from ..reg import Reg
from ..source import where
from ..trace import Trace, current
from ..types import b64
from ..types import pred as _pred
from ._operands import check_bool, guard, require_arch, shared_addr, u32_or_imm

__all__ = ["init", "arrive", "arrive_expect_tx", "expect_tx", "try_wait_parity", "wait", "inval"]

MAX_COUNT = (1 << 20) - 1
"""Largest expected arrival count and transaction count of an mbarrier."""


def _bar(bar: Any, fn: str, trace: Trace) -> str:
    return shared_addr(bar, "bar", f"ptx.mbarrier.{fn}", trace, align=8, size=8)


def _scope(scope: Any, fn: str) -> str:
    if scope is None:
        return ""
    if scope not in ("cta", "cluster"):
        raise OperandError(
            f"{where()}: ptx.mbarrier.{fn} scope must be None, 'cta' or 'cluster', got {scope!r}"
        )
    return f".acquire.{scope}"


def init(bar: Any, count: int | Reg, *, pred: Any = None) -> None:
    """``mbarrier.init.shared::cta.b64 [bar], count;``: arm ``bar`` for ``count`` arrivals.

    ``count`` is an int in 1..2**20-1 or a u32 register. Follow the inits with
    ``ptx.fence_mbarrier_init()`` (cluster) or a ``bar_sync`` before other threads use it.
    """
    trace = current()
    require_arch(trace, "ptx.mbarrier.init", 80)
    b = _bar(bar, "init", trace)
    c = u32_or_imm(count, "count", "ptx.mbarrier.init", trace, 1, MAX_COUNT)
    trace.inst("mbarrier.init.shared::cta.b64", (b, c), guard(pred, "ptx.mbarrier.init", trace))


_REMOTE_SEMS = ("release.cluster", "relaxed.cluster", "release.cta")


def arrive(bar: Any, count: int | Reg | None = None, *, remote: bool = False,
           sem: str = "release.cluster", pred: Any = None) -> Reg | None:
    """Arrive on ``bar`` (``count`` arrivals, default 1); return the ``.b64`` phase state.

    ``mbarrier.arrive.shared::cta.b64 state, [bar]{, count};``. With ``remote=True``
    ``bar`` is a ``shared::cluster`` address (``ptx.cluster.map_shared``) of a barrier in
    another CTA: ``mbarrier.arrive.release.cluster.shared::cluster.b64 _, [bar]{, count};``
    and nothing is returned (no state comes back from a remote barrier); ``sem`` picks the
    remote arrive's ordering: 'release.cluster' (default: the thread's earlier writes are
    visible cluster-wide first), 'release.cta' or 'relaxed.cluster' (no ordering of other
    memory; enough when the arrival only hands back a buffer the async proxy read; needs PTX
    ISA 8.6, ``@kernel(version="8.6")``, which ptxas otherwise refuses). On sm_90a a remote
    'release.cta' arrive is one ``SYNCS.ARRIVE.TRANS64.RED`` with no ``MEMBAR``. ``count``
    and ``remote`` need sm_90. With ``pred=`` the returned state is undefined where it is false.
    """
    fn = "ptx.mbarrier.arrive"
    trace = current()
    check_bool(remote, "remote", fn)
    require_arch(trace, fn, 90 if remote or count is not None else 80)
    b = _bar(bar, "arrive", trace)
    ops = [b]
    if count is not None:
        ops.append(u32_or_imm(count, "count", fn, trace, 1, MAX_COUNT))
    g = guard(pred, fn, trace)
    if remote:
        if sem not in _REMOTE_SEMS:
            raise OperandError(f"{where()}: {fn} sem must be one of {_REMOTE_SEMS}, got {sem!r}")
        trace.inst(f"mbarrier.arrive.{sem}.shared::cluster.b64", ("_", *ops), g)
        return None
    state = Reg(trace.new_reg_name(b64), b64, trace)
    trace.inst("mbarrier.arrive.shared::cta.b64", (state.name, *ops), g)
    return state


def arrive_expect_tx(bar: Any, tx_bytes: int | Reg, *, remote: bool = False,
                     pred: Any = None) -> None:
    """Arrive once on ``bar`` and raise its expected transaction count by ``tx_bytes``.

    ``mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], tx_bytes;`` (``remote=True``:
    ``.release.cluster.shared::cluster`` on a mapped cluster address). This is what the
    thread issuing a TMA load calls; the copy's completion supplies the bytes.
    ``tx_bytes`` is an int in 0..2**20-1 or a u32 register.
    """
    fn = "ptx.mbarrier.arrive_expect_tx"
    trace = current()
    check_bool(remote, "remote", fn)
    require_arch(trace, fn)
    b = _bar(bar, "arrive_expect_tx", trace)
    tx = u32_or_imm(tx_bytes, "tx_bytes", fn, trace, 0, MAX_COUNT)
    space = "release.cluster.shared::cluster" if remote else "shared::cta"
    trace.inst(f"mbarrier.arrive.expect_tx.{space}.b64", ("_", b, tx), guard(pred, fn, trace))


def expect_tx(bar: Any, tx_bytes: int | Reg, *, pred: Any = None) -> None:
    """``mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [bar], tx_bytes;`` (no arrival)."""
    fn = "ptx.mbarrier.expect_tx"
    trace = current()
    require_arch(trace, fn)
    b = _bar(bar, "expect_tx", trace)
    tx = u32_or_imm(tx_bytes, "tx_bytes", fn, trace, 0, MAX_COUNT)
    trace.inst("mbarrier.expect_tx.relaxed.cta.shared::cta.b64", (b, tx), guard(pred, fn, trace))


def _phase(phase: Any, fn: str, trace: Trace) -> str:
    return u32_or_imm(phase, "phase", f"ptx.mbarrier.{fn}", trace, 0, 1, " (a phase parity)")


def try_wait_parity(bar: Any, phase: int | Reg, *, scope: str | None = None,
                    pred: Any = None) -> Reg:
    """Test (with a bounded hardware wait) whether phase ``phase`` of ``bar`` completed.

    ``mbarrier.try_wait.parity{.acquire.scope}.shared::cta.b64 p, [bar], phase;``;
    returns the predicate ``p``. ``phase`` is 0, 1 or a u32 register holding the parity;
    ``scope`` ('cta' or 'cluster') adds acquire semantics at that scope. With ``pred=``
    the returned predicate is undefined where the guard is false.
    """
    fn = "ptx.mbarrier.try_wait_parity"
    trace = current()
    require_arch(trace, fn)
    b = _bar(bar, "try_wait_parity", trace)
    ph = _phase(phase, "try_wait_parity", trace)
    sem = _scope(scope, "try_wait_parity")
    g = guard(pred, fn, trace)
    p = Reg(trace.new_reg_name(_pred), _pred, trace)
    trace.inst(f"mbarrier.try_wait.parity{sem}.shared::cta.b64", (p.name, b, ph), g)
    return p


def wait(bar: Any, phase: int | Reg, *, scope: str | None = None, pred: Any = None) -> None:
    """Block until phase ``phase`` of ``bar`` completes: a try_wait spin loop.

    Emits::

        $L_mbar_wait:
            mbarrier.try_wait.parity.shared::cta.b64 p, [bar], phase;
            @!p bra $L_mbar_wait;

    With ``pred=q`` (``~q``) threads where the guard is false skip the whole loop:
    ``@!q bra $L_mbar_wait_skip;`` (``@q`` for ``~q``) comes first and the label
    ``$L_mbar_wait_skip:`` last.
    """
    fn = "ptx.mbarrier.wait"
    trace = current()
    require_arch(trace, fn)
    b = _bar(bar, "wait", trace)
    ph = _phase(phase, "wait", trace)
    sem = _scope(scope, "wait")
    g = guard(pred, fn, trace)
    skip = None
    if g is not None:
        skip = trace.unique("$L_mbar_wait_skip")
        trace.inst("bra", (skip,), g[1:] if g[0] == "!" else "!" + g)
    top = trace.unique("$L_mbar_wait")
    p = Reg(trace.new_reg_name(_pred), _pred, trace)
    trace.label(top)
    trace.inst(f"mbarrier.try_wait.parity{sem}.shared::cta.b64", (p.name, b, ph))
    trace.inst("bra", (top,), "!" + p.name)
    if skip is not None:
        trace.label(skip)


def inval(bar: Any, *, pred: Any = None) -> None:
    """``mbarrier.inval.shared::cta.b64 [bar];``: retire ``bar`` before reusing its memory."""
    fn = "ptx.mbarrier.inval"
    trace = current()
    require_arch(trace, fn, 80)
    trace.inst("mbarrier.inval.shared::cta.b64", (_bar(bar, "inval", trace),), guard(pred, fn, trace))
