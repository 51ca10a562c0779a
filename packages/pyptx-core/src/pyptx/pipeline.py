"""mbarrier arrays and the S-stage producer/consumer ring that carries (stage, phase).

A ring of ``S`` shared-memory buffers is guarded by two barrier arrays: ``full[s]``
(the producer arms it with the bytes its copies will bring; it completes when they
land) and ``empty[s]`` (consumers arrive when they are done reading stage ``s``). Each
side walks the ring with a ``PipelineState``: the stage index and the phase parity it
waits for, flipped every time the stage index wraps. Consumers start waiting for
parity 0 of ``full``; the producer starts waiting for parity 1 of ``empty``, which a
fresh barrier reports as complete, so the first ``S`` stages are free at once.

Typical use (one producer thread, ``C`` consumer warpgroups)::

    pipe = Pipeline(S, consumer_arrivals=C)        # allocates full/empty barriers
    pipe.init(pred=tid == 0)                       # then a bar.sync / cluster sync
    prod = pipe.producer_state()                   # in the producer branch
    pipe.acquire(prod); pipe.arm(prod, nbytes); <copies on pipe.full.at(prod.stage)>
    prod.advance()
    cons = pipe.consumer_state()                   # in each consumer branch
    pipe.wait(cons); <wgmma on stage cons.stage>; pipe.release(cons, pred=leader)
    cons.advance()
"""

from __future__ import annotations

from typing import Any

from .errors import OperandError
from .ptx import mbarrier
from .ptx.memory import Addr
from .reg import Reg, render
from .smem import alloc
from .source import where
from .trace import current
from .types import b64, pred, u32

__all__ = ["BarrierArray", "Pipeline", "PipelineState"]


def _count(v: Any, name: str, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise OperandError(f"{where(3)}: {name} must be an int >= {lo}, got {v!r}")
    return v


def _guarded(pred_: Any):
    from contextlib import nullcontext

    from .ptx.control import if_

    return nullcontext() if pred_ is None else if_(pred_)


class BarrierArray:
    """``count`` mbarriers in shared memory, 8 bytes apart. ``at(i)`` is barrier ``i``
    (a Python int: a constant address; a u32 register: one ``mad`` from the base)."""

    __slots__ = ("count", "array", "base")

    def __init__(self, count: int, *, name: str = "bars") -> None:
        self.count = _count(count, "BarrierArray count")
        self.array = alloc(b64, count, align=8, name=name)
        self.base = self.array.addr()  # emitted here, before any branch that uses it

    def at(self, i: int | Reg) -> Addr | Reg:
        """The shared address of barrier ``i``."""
        if isinstance(i, int) and not isinstance(i, bool):
            if not 0 <= i < self.count:
                raise OperandError(f"{where()}: barrier index {i} out of range for "
                                   f"{self.count} barriers")
            return Addr(self.array, 8 * i)
        if type(i) is not Reg or not i.type.is_int or i.type.bits != 32:
            raise OperandError(f"{where()}: barrier index must be an int or a u32 register, got {i!r}")
        trace = current()
        r = Reg(trace.new_reg_name(u32), u32, trace)
        trace.inst("mad.lo.u32", (r.name, render(i, None, trace), "8", self.base.name))
        return r

    def init(self, arrivals: int, *, pred: Any = None) -> None:
        """``mbarrier.init`` every barrier for ``arrivals`` arrivals (where ``pred`` holds)."""
        _count(arrivals, "arrivals")
        with _guarded(pred):
            for i in range(self.count):
                mbarrier.init(Addr(self.array, 8 * i), arrivals)

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"BarrierArray({self.count} x mbarrier at {self.array.name})"


class PipelineState:
    """One side's position in an S-stage ring: ``stage`` and the ``phase`` parity it
    waits for, both u32 registers. ``advance()`` moves to the next stage (five
    instructions: ``add``, ``setp``, ``selp`` of the stage, ``selp`` + ``xor`` of the phase)."""

    __slots__ = ("stages", "stage", "phase")

    def __init__(self, stages: int, phase: int) -> None:
        from .reg import scalar

        self.stages = stages
        self.stage = scalar(u32, init=0)
        self.phase = scalar(u32, init=phase)

    def advance(self, steps: int = 1) -> None:
        """Move ``steps`` stages on, flipping the phase at each wrap. One step is the five
        instructions above; more steps (e.g. a ping-pong consumer skipping the other
        warpgroup's k-blocks) cost at most seven, whatever ``steps`` is."""
        trace = current()
        _count(steps, "steps")
        s, ph = self.stage.name, self.phase.name
        p = Reg(trace.new_reg_name(pred), pred, trace)
        t = Reg(trace.new_reg_name(u32), u32, trace)
        if steps == 1:
            trace.inst("add.u32", (s, s, "1"))
            trace.inst("setp.eq.u32", (p.name, s, str(self.stages)))
            trace.inst("selp.u32", (s, "0", s, p.name))
            trace.inst("selp.u32", (t.name, "1", "0", p.name))
            trace.inst("xor.b32", (ph, ph, t.name))
            return
        laps, rest = divmod(steps, self.stages)
        if rest:  # stage + rest wraps at most once
            w = Reg(trace.new_reg_name(u32), u32, trace)
            trace.inst("add.u32", (s, s, str(rest)))
            trace.inst("setp.ge.u32", (p.name, s, str(self.stages)))
            trace.inst("sub.u32", (w.name, s, str(self.stages)))
            trace.inst("selp.u32", (s, w.name, s, p.name))
            trace.inst("selp.u32", (t.name, str(1 ^ (laps & 1)), str(laps & 1), p.name))
            trace.inst("xor.b32", (ph, ph, t.name))
        elif laps & 1:
            trace.inst("xor.b32", (ph, ph, "1"))

    def __repr__(self) -> str:
        return f"PipelineState({self.stages} stages: {self.stage.name}, phase {self.phase.name})"


class Pipeline:
    """An S-stage ring guarded by ``full`` and ``empty`` barrier arrays.

    ``producer_arrivals``: arrivals that arm ``full[s]`` (1: one thread issues the copies
    and ``arrive.expect_tx``). ``consumer_arrivals``: arrivals on ``empty[s]`` per round
    (one elected thread per consumer warpgroup, times the CTAs of a cluster that read
    the stage when copies are multicast).
    """

    __slots__ = ("stages", "consumer_arrivals", "producer_arrivals", "full", "empty")

    def __init__(self, stages: int, *, consumer_arrivals: int = 1,
                 producer_arrivals: int = 1) -> None:
        self.stages = _count(stages, "stages")
        self.consumer_arrivals = _count(consumer_arrivals, "consumer_arrivals")
        self.producer_arrivals = _count(producer_arrivals, "producer_arrivals")
        self.full = BarrierArray(stages, name="full_bar")
        self.empty = BarrierArray(stages, name="empty_bar")

    def init(self, *, pred: Any = None, cluster: bool = False) -> None:
        """Initialise every barrier (where ``pred`` holds: one thread), then
        ``fence.mbarrier_init.release.cluster`` when ``cluster`` (peers arrive remotely).
        Follow with a CTA barrier (``bar.sync``) or a cluster sync before first use."""
        with _guarded(pred):
            for i in range(self.stages):
                mbarrier.init(Addr(self.full.array, 8 * i), self.producer_arrivals)
                mbarrier.init(Addr(self.empty.array, 8 * i), self.consumer_arrivals)
            if cluster:
                from .ptx.sync import fence_mbarrier_init
                fence_mbarrier_init()

    def producer_state(self) -> PipelineState:
        """The producer's state: stage 0, waiting for parity 1 of ``empty`` (free at once)."""
        return PipelineState(self.stages, 1)

    def consumer_state(self) -> PipelineState:
        """A consumer's state: stage 0, waiting for parity 0 of ``full``."""
        return PipelineState(self.stages, 0)

    def _check(self, state: Any) -> PipelineState:
        if type(state) is not PipelineState or state.stages != self.stages:
            raise OperandError(f"{where(3)}: expected a PipelineState of this {self.stages}-stage "
                               f"pipeline, got {state!r}")
        return state

    def acquire(self, state: PipelineState, *, scope: str | None = None) -> None:
        """Producer: wait until consumers released ``state.stage`` (``empty``, parity ``phase``);
        ``scope='cluster'`` waits with cluster-scope acquire (releases from peer CTAs)."""
        s = self._check(state)
        mbarrier.wait(self.empty.at(s.stage), s.phase, scope=scope)

    def arm(self, state: PipelineState, tx_bytes: int | Reg) -> Addr | Reg:
        """Producer: ``mbarrier.arrive.expect_tx`` on ``full[stage]`` for ``tx_bytes``; returns
        that barrier's address for the copies to complete on."""
        s = self._check(state)
        bar = self.full.at(s.stage)
        mbarrier.arrive_expect_tx(bar, tx_bytes)
        return bar

    def wait(self, state: PipelineState, *, scope: str | None = None) -> None:
        """Consumer: wait until ``full[stage]`` completes its phase (the stage's data landed)."""
        s = self._check(state)
        mbarrier.wait(self.full.at(s.stage), s.phase, scope=scope)

    def release(self, state: PipelineState, *, pred: Any = None, cta_ranks: Any = None,
                sem: str = "release.cluster") -> None:
        """Consumer: arrive on ``empty[stage]`` (where ``pred`` holds: one thread per warpgroup).
        ``cta_ranks``: arrive on that barrier in each of these cluster CTAs instead
        (``mapa`` + a remote arrive each, ordered by ``sem`` as in ``ptx.mbarrier.arrive``),
        for stages filled by multicast copies."""
        s = self._check(state)
        bar = self.empty.at(s.stage)
        with _guarded(pred):
            if cta_ranks is None:
                mbarrier.arrive(bar)
                return
            from .ptx.cluster import map_shared

            for rank in cta_ranks:
                mbarrier.arrive(map_shared(bar, rank), remote=True, sem=sem)

    def __repr__(self) -> str:
        return f"Pipeline({self.stages} stages)"
