"""Barriers and fences.

Every helper takes ``pred=p`` (or ``~p``) and guards each instruction it emits
with ``@p`` / ``@!p``. The cluster barriers, ``fence.proxy.*``,
``fence.mbarrier_init`` and ``griddepcontrol`` need sm_90; the arch is checked at
trace time (``TraceError`` naming the kernel's target).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import OperandError, TraceError
from ..ir import Instruction
from ..reg import Reg, render
from ..source import fmt_loc, where
from ..trace import current
from ._divergence import refuse_divergent_cta_barrier
from ._operands import global_addr, guard, require_arch


def _check_barrier(barrier: int | Reg, threads: int | Reg | None) -> None:
    if isinstance(barrier, int) and not isinstance(barrier, bool):
        if not 0 <= barrier <= 15:
            raise OperandError(f"{where(3)}: barrier id must be 0..15, got {barrier}")
    elif not isinstance(barrier, Reg):
        raise OperandError(f"{where(3)}: barrier id must be an int or register, got {barrier!r}")
    if isinstance(threads, int) and not isinstance(threads, bool):
        if threads <= 0 or threads % 32:
            raise OperandError(
                f"{where(3)}: barrier thread count must be a positive multiple of 32, got {threads}"
            )
    elif threads is not None and not isinstance(threads, Reg):
        raise OperandError(f"{where(3)}: barrier thread count must be an int or register, got {threads!r}")


def bar_sync(barrier: int | Reg = 0, threads: int | Reg | None = None, *, pred: Any = None) -> None:
    """``bar.sync barrier[, threads];``: wait until the CTA (or ``threads`` threads) arrive."""
    trace = current()
    _check_barrier(barrier, threads)
    ops = [render(barrier, None, trace)]
    g = guard(pred, "bar_sync", trace)
    if threads is not None:
        ops.append(render(threads, None, trace))
    else:
        refuse_divergent_cta_barrier(trace, f"ptx.bar_sync({ops[0]})", g)
    trace.inst("bar.sync", tuple(ops), g)


def bar_arrive(barrier: int | Reg, threads: int | Reg, *, pred: Any = None) -> None:
    """``bar.arrive barrier, threads;``: signal arrival without waiting."""
    trace = current()
    _check_barrier(barrier, threads)
    trace.inst("bar.arrive", (render(barrier, None, trace), render(threads, None, trace)),
               guard(pred, "bar_arrive", trace))


_FENCE_SCOPES = ("cta", "cluster", "gpu", "sys")


def fence(scope: str = "cta", *, sem: str = "sc", pred: Any = None) -> None:
    """``fence.{sc,acq_rel}.{cta,cluster,gpu,sys};`` memory ordering fence (``.cluster``: sm_90)."""
    trace = current()
    if scope not in _FENCE_SCOPES or sem not in ("sc", "acq_rel"):
        raise OperandError(
            f"{where()}: fence expects sem in ('sc', 'acq_rel') and scope in {_FENCE_SCOPES}, "
            f"got sem={sem!r} scope={scope!r}"
        )
    if scope == "cluster":
        require_arch(trace, "fence (scope='cluster')")
    trace.inst(f"fence.{sem}.{scope}", (), guard(pred, "fence", trace))


_PROXY_SPACES = (None, "shared::cta", "shared::cluster", "global")


def fence_proxy_async(space: str | None = "shared::cta", *, pred: Any = None) -> None:
    """``fence.proxy.async{.space};``: order generic-proxy accesses before async-proxy ones.

    Use it between ordinary ``st.shared`` writes and a TMA store / wgmma read of that
    memory. ``space`` is 'shared::cta' (default), 'shared::cluster', 'global' or None
    (``fence.proxy.async;``, all state spaces). sm_90.
    """
    trace = current()
    require_arch(trace, "fence_proxy_async")
    if space not in _PROXY_SPACES:
        raise OperandError(
            f"{where()}: fence_proxy_async space must be one of {_PROXY_SPACES}, got {space!r}"
        )
    trace.inst("fence.proxy.async" + (f".{space}" if space else ""), (),
               guard(pred, "fence_proxy_async", trace))


_TENSORMAP_SCOPES = ("cta", "cluster", "gpu", "sys")


def fence_proxy_tensormap(sem: str, scope: str = "gpu", *, addr: Any = None,
                          pred: Any = None) -> None:
    """Order a tensor map written through the generic proxy before TMA uses it (sm_90, PTX 8.3).

    ``sem='release'``: ``fence.proxy.tensormap::generic.release.{scope};`` after writing
    the 128-byte map. ``sem='acquire'``: ``fence.proxy.tensormap::generic.acquire.{scope}
    [addr], 128;`` before the copies that use it; ``addr`` is the map's generic address
    (a u64 register, e.g. ``ptx.tma.tensormap_ptr``). ``scope``: 'cta', 'cluster', 'gpu'
    (default) or 'sys'. Needs ``@kernel(version="8.3")`` or newer.
    """
    fn = "fence_proxy_tensormap"
    trace = current()
    require_arch(trace, fn)
    if sem not in ("release", "acquire"):
        raise OperandError(f"{where()}: {fn} sem must be 'release' or 'acquire', got {sem!r}")
    if scope not in _TENSORMAP_SCOPES:
        raise OperandError(f"{where()}: {fn} scope must be one of {_TENSORMAP_SCOPES}, got {scope!r}")
    g = guard(pred, fn, trace)
    opcode = f"fence.proxy.tensormap::generic.{sem}.{scope}"
    if sem == "release":
        if addr is not None:
            raise OperandError(f"{where()}: {fn} 'release' takes no addr, got addr={addr!r}")
        trace.inst(opcode, (), g)
        return
    if addr is None:
        raise OperandError(f"{where()}: {fn} 'acquire' needs addr=, the tensor map's u64 generic "
                           "address")
    trace.inst(opcode, (global_addr(addr, "addr", fn, trace), "128"), g)


def fence_mbarrier_init(*, pred: Any = None) -> None:
    """``fence.mbarrier_init.release.cluster;``: publish mbarrier.init to the cluster (sm_90)."""
    trace = current()
    require_arch(trace, "fence_mbarrier_init")
    trace.inst("fence.mbarrier_init.release.cluster", (), guard(pred, "fence_mbarrier_init", trace))


def _flag(value: object, name: str, fn: str) -> bool:
    if not isinstance(value, bool):
        raise OperandError(f"{where()}: {fn} {name} must be True or False, got {value!r}")
    return value


def cluster_arrive(relaxed: bool = False, *, aligned: bool = False, pred: Any = None) -> None:
    """``barrier.cluster.arrive{.relaxed}{.aligned};``: signal this thread's cluster arrival.

    ``relaxed=True`` drops the release ordering (``barrier.cluster.arrive.relaxed.aligned``
    with ``aligned=True``); ``aligned=True`` promises that every thread of the warp
    executes it together. sm_90.
    """
    trace = current()
    require_arch(trace, "cluster_arrive")
    r = _flag(relaxed, "relaxed", "cluster_arrive")
    a = _flag(aligned, "aligned", "cluster_arrive")
    trace.inst("barrier.cluster.arrive" + (".relaxed" if r else "") + (".aligned" if a else ""), (),
               guard(pred, "cluster_arrive", trace))


def cluster_wait(*, aligned: bool = False, pred: Any = None) -> None:
    """``barrier.cluster.wait{.aligned};``: wait until every cluster thread has arrived (sm_90)."""
    trace = current()
    require_arch(trace, "cluster_wait")
    a = _flag(aligned, "aligned", "cluster_wait")
    trace.inst("barrier.cluster.wait" + (".aligned" if a else ""), (), guard(pred, "cluster_wait", trace))


def cluster_sync(*, aligned: bool = False, relaxed: bool = False, pred: Any = None) -> None:
    """Cluster-wide barrier: ``barrier.cluster.arrive{.relaxed}`` then ``barrier.cluster.wait``.

    Both instructions carry the ``pred=`` guard. sm_90.
    """
    trace = current()
    require_arch(trace, "cluster_sync")
    a = _flag(aligned, "aligned", "cluster_sync")
    r = _flag(relaxed, "relaxed", "cluster_sync")
    g = guard(pred, "cluster_sync", trace)
    sfx = ".aligned" if a else ""
    trace.inst("barrier.cluster.arrive" + (".relaxed" if r else "") + sfx, (), g)
    trace.inst("barrier.cluster.wait" + sfx, (), g)


def grid_dependency_wait(*, pred: Any = None) -> None:
    """``griddepcontrol.wait;``: block until the grids this one depends on (programmatic
    dependent launch, ``@kernel(pdl=True)``) have completed and their writes are visible."""
    trace = current()
    require_arch(trace, "grid_dependency_wait")
    trace.inst("griddepcontrol.wait", (), guard(pred, "grid_dependency_wait", trace))


def launch_dependents(*, pred: Any = None) -> None:
    """``griddepcontrol.launch_dependents;``: let the next PDL-launched grid in the stream be
    scheduled once every CTA of this grid has issued this or exited (it still waits for this
    grid's completion in its own ``griddepcontrol.wait``)."""
    trace = current()
    require_arch(trace, "launch_dependents")
    trace.inst("griddepcontrol.launch_dependents", (), guard(pred, "launch_dependents", trace))


# Opcode prefixes that may touch global memory, which a PDL prologue must not do before
# ``griddepcontrol.wait`` (``.param``/``.shared``/``.local``/``.const`` accesses are fine).
_GLOBAL_ACCESS = ("ld", "ldu", "st", "atom", "red", "cp", "multimem", "suld", "sust", "sured",
                  "tex", "tld4", "tensormap", "prefetch", "prefetchu", "applypriority",
                  "discard")
_PRIVATE_SPACES = (".param", ".shared", ".local", ".const")
_PROLOGUE_OK = ("cp.async.bulk.prefetch.", "prefetch.global.L2", "prefetch.L2", "prefetch.param",
                "prefetch.tensormap", "prefetch.const")


def _touches_global(opcode: str) -> bool:
    head = opcode.split(".", 1)[0]
    if head not in _GLOBAL_ACCESS or opcode.startswith(_PROLOGUE_OK):
        return False
    if ".global" in opcode:  # e.g. cp.async.ca.shared.global: reads global into shared
        return True
    return not any(space in opcode for space in _PRIVATE_SPACES)


@contextmanager
def pdl_prologue() -> Iterator[None]:
    """Code that runs *before* ``griddepcontrol.wait`` in a ``@kernel(pdl=True)`` body.

    A PDL kernel may be resident while the previous grid still runs; its entry waits
    for that grid first. Statements traced inside this block are placed ahead of the
    wait, so they overlap the previous grid's last wave: address arithmetic, special
    registers, ``.param``/``.shared`` accesses and L2 prefetches
    (``ptx.bulk_prefetch_l2``; an L2 prefetch cannot return stale data, L2 being the
    GPU's point of coherence). Anything that may read or write global memory raises
    ``TraceError`` naming the statement. The block must open before any other
    statement of the body, once; registers it defines stay usable after it.
    """
    trace = current()
    loc = where()
    wait = trace.pdl_wait
    if wait is None:
        raise TraceError(f"{loc}: ptx.pdl_prologue() needs a kernel declared with "
                         "@kernel(pdl=True); this kernel waits for no previous grid")
    body = trace.body
    at = body.index(wait)
    if trace.pdl_prologue_used or len(body) != at + 2:
        raise TraceError(f"{loc}: ptx.pdl_prologue() must open once, before any other statement "
                         f"of the kernel body ({len(body) - at - 2} statements came first)")
    trace.pdl_prologue_used = True
    start = len(body)
    yield
    block = body[start:]
    for st in block:
        if isinstance(st, Instruction) and _touches_global(st.opcode):
            site = fmt_loc(st.loc) if st.loc else loc
            raise TraceError(f"{site}: {st.opcode} may access global memory, which a PDL prologue "
                             "must not do before griddepcontrol.wait; expected address arithmetic, "
                             ".param/.shared accesses or L2 prefetches (ptx.bulk_prefetch_l2)")
    del body[start:]
    body[at:at] = block
