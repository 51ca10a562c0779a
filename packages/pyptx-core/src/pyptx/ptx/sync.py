"""Barriers and fences."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import OperandError, TraceError
from ..ir import Instruction
from ..reg import Reg, render
from ..source import fmt_loc, where
from ..trace import current


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


def bar_sync(barrier: int | Reg = 0, threads: int | Reg | None = None) -> None:
    """``bar.sync barrier[, threads];``: wait until the CTA (or ``threads`` threads) arrive."""
    trace = current()
    _check_barrier(barrier, threads)
    ops = [render(barrier, None, trace)]
    if threads is not None:
        ops.append(render(threads, None, trace))
    trace.inst("bar.sync", tuple(ops))


def bar_arrive(barrier: int | Reg, threads: int | Reg) -> None:
    """``bar.arrive barrier, threads;``: signal arrival without waiting."""
    trace = current()
    _check_barrier(barrier, threads)
    trace.inst("bar.arrive", (render(barrier, None, trace), render(threads, None, trace)))


_FENCE_SCOPES = ("cta", "cluster", "gpu", "sys")


def fence(scope: str = "cta", *, sem: str = "sc") -> None:
    """``fence.{sc,acq_rel}.{cta,cluster,gpu,sys};`` memory ordering fence."""
    if scope not in _FENCE_SCOPES or sem not in ("sc", "acq_rel"):
        raise OperandError(
            f"{where()}: fence expects sem in ('sc', 'acq_rel') and scope in {_FENCE_SCOPES}, "
            f"got sem={sem!r} scope={scope!r}"
        )
    current().inst(f"fence.{sem}.{scope}", ())


_PROXY_SPACES = (None, "shared::cta", "shared::cluster", "global")


def fence_proxy_async(space: str | None = "shared::cta") -> None:
    """``fence.proxy.async{.space};``: order generic-proxy accesses before async-proxy ones.

    Use it between ordinary ``st.shared`` writes and a TMA store / wgmma read of that
    memory. ``space`` is 'shared::cta' (default), 'shared::cluster', 'global' or None
    (all state spaces).
    """
    if space not in _PROXY_SPACES:
        raise OperandError(
            f"{where()}: fence_proxy_async space must be one of {_PROXY_SPACES}, got {space!r}"
        )
    current().inst("fence.proxy.async" + (f".{space}" if space else ""), ())


def fence_mbarrier_init() -> None:
    """``fence.mbarrier_init.release.cluster;``: publish mbarrier.init to the cluster."""
    current().inst("fence.mbarrier_init.release.cluster", ())


def _flag(value: object, name: str, fn: str) -> bool:
    if not isinstance(value, bool):
        raise OperandError(f"{where()}: {fn} {name} must be True or False, got {value!r}")
    return value


def cluster_arrive(relaxed: bool = False, *, aligned: bool = False) -> None:
    """``barrier.cluster.arrive{.relaxed}{.aligned};``: signal this thread's cluster arrival.

    ``relaxed=True`` drops the release ordering; ``aligned=True`` promises that every
    thread of the warp executes it together.
    """
    trace = current()
    r = _flag(relaxed, "relaxed", "cluster_arrive")
    a = _flag(aligned, "aligned", "cluster_arrive")
    trace.inst("barrier.cluster.arrive" + (".relaxed" if r else "") + (".aligned" if a else ""), ())


def cluster_wait(*, aligned: bool = False) -> None:
    """``barrier.cluster.wait{.aligned};``: wait until every cluster thread has arrived."""
    trace = current()
    a = _flag(aligned, "aligned", "cluster_wait")
    trace.inst("barrier.cluster.wait" + (".aligned" if a else ""), ())


def cluster_sync(*, aligned: bool = False) -> None:
    """Cluster-wide barrier: ``barrier.cluster.arrive`` then ``barrier.cluster.wait``."""
    trace = current()
    a = _flag(aligned, "aligned", "cluster_sync")
    sfx = ".aligned" if a else ""
    trace.inst("barrier.cluster.arrive" + sfx, ())
    trace.inst("barrier.cluster.wait" + sfx, ())


def grid_dependency_wait() -> None:
    """``griddepcontrol.wait;``: block until the grids this one depends on (programmatic
    dependent launch, ``@kernel(pdl=True)``) have completed and their writes are visible."""
    current().inst("griddepcontrol.wait", ())


def launch_dependents() -> None:
    """``griddepcontrol.launch_dependents;``: let the next PDL-launched grid in the stream be
    scheduled once every CTA of this grid has issued this or exited (it still waits for this
    grid's completion in its own ``griddepcontrol.wait``)."""
    current().inst("griddepcontrol.launch_dependents", ())


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
