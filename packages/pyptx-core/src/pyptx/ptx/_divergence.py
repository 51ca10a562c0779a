"""CTA-wide barriers under thread-dependent control flow, refused at trace time.

``bar.sync 0`` (or ``barrier.sync``, ``bar.red`` without a thread count) waits for every
thread of the CTA. Reached only by the threads for which a predicate holds, and that
predicate derived from the thread index (``%tid``, ``%laneid``, ``%warpid``, a lane mask,
``elect.sync``), the other threads never arrive: the CTA hangs or the barrier is undefined.

The check is a forward scan of the trace, run only when such a barrier is traced and
resumed where the previous one stopped, so a kernel pays one pass over its body at most.
It tracks which registers hold thread-dependent values (data flow through every
instruction's operands and guard) and which forward branches on such predicates are still
open (their label not yet placed): ``with ptx.if_(p)``, ``ptx.while_``/``ptx.loop`` exits,
``ptx.bra(lbl, pred=p)``. Named barriers with a thread count (``bar.sync id, n``) are the
way to synchronise part of a CTA and are not checked.
"""

from __future__ import annotations

import re

from ..errors import TraceError
from ..ir import Instruction, Label, Raw
from ..source import fmt_loc, where
from ..trace import Trace

_THREAD_SREGS = ("%tid.", "%laneid", "%warpid", "%lanemask")
_REG = re.compile(r"%[A-Za-z_][\w]*")
#: Opcodes whose first operand is not a destination register (a store's address, ...).
_NO_DEST = frozenset({"st", "red", "bar", "barrier", "cp", "mbarrier", "prefetch", "fence",
                      "wgmma", "tcgen05", "stmatrix", "multimem"})

#: ``ptx.inst`` spellings of barriers that wait for the whole CTA, by the number of operands
#: they have without a thread count.
CTA_BARRIERS = {"bar.sync": 1, "barrier.sync": 1, "barrier.sync.aligned": 1,
                "bar.cta.sync": 1, "barrier.cta.sync": 1, "barrier.cta.sync.aligned": 1}
_CTA_REDUCTIONS = ("bar.red.", "barrier.red.", "bar.cta.red.", "barrier.cta.red.")


def cta_barrier_operands(opcode: str) -> int | None:
    """How many operands ``opcode`` takes when it waits for the whole CTA (no thread count),
    or None if it is not a CTA-wide barrier."""
    n = CTA_BARRIERS.get(opcode)
    if n is None and opcode.startswith(_CTA_REDUCTIONS):
        n = 3
    return n


class _Scan:
    """What the scan of one trace has learnt so far."""

    __slots__ = ("pos", "thread_regs", "placed", "open")

    def __init__(self) -> None:
        self.pos = 0
        self.thread_regs: set[str] = set()
        self.placed: set[str] = set()
        #: open forward branch target -> (predicate register, the branch statement)
        self.open: dict[str, tuple[str, Instruction]] = {}


def _advance(scan: _Scan, body: list) -> None:
    regs = scan.thread_regs
    for st in body[scan.pos:]:
        cls = type(st)
        if cls is Instruction:
            op = st.opcode
            ops = st.operands
            head = op.split(".", 1)[0]
            if head == "bra":
                p = st.pred
                if p is not None and ops:
                    target = ops[-1]
                    name = p.lstrip("!")
                    if name in regs and target not in scan.placed:
                        scan.open.setdefault(target, (name, st))
                continue
            if not ops or head in _NO_DEST:
                continue
            if head == "elect" or (head == "mov" and len(ops) > 1
                                   and ops[1].startswith(_THREAD_SREGS)):
                dependent = True
            elif regs:
                dependent = st.pred is not None and st.pred.lstrip("!") in regs
                if not dependent:
                    for o in ops[1:]:
                        if o in regs or (o[:1] in "[{" and not regs.isdisjoint(_REG.findall(o))):
                            dependent = True
                            break
            else:
                continue
            if dependent:
                for d in ops[0].split("|"):
                    regs.update(_REG.findall(d.strip()))
        elif cls is Label:
            scan.placed.add(st.name)
            scan.open.pop(st.name, None)
        elif cls is Raw:
            line = st.line.strip()
            if line.endswith(":"):
                scan.placed.add(line[:-1])
                scan.open.pop(line[:-1], None)
    scan.pos = len(body)


def refuse_divergent_cta_barrier(trace: Trace, what: str, pred: str | None) -> None:
    """``TraceError`` at the user's line if a CTA-wide barrier ``what`` (guarded by ``pred``,
    its rendered ``@pred`` text or None) would be reached only by threads chosen by their
    thread index; the barrier itself is not yet in the trace."""
    scan = trace.divergence
    if scan is None:
        scan = trace.divergence = _Scan()
    body = trace.body
    if scan.pos > len(body):  # statements were moved (pdl_prologue): scan again
        scan.__init__()
    _advance(scan, body)
    if pred is not None and pred.lstrip("!") in scan.thread_regs:
        cause = f"its guard @{pred} depends on the thread index"
    elif scan.open:
        name, branch = next(iter(scan.open.values()))
        cause = (f"it is inside a branch on {name}, which depends on the thread index "
                 f"(the branch `{branch.text()}` at {fmt_loc(branch.loc)})")
    else:
        return
    raise TraceError(
        f"{where(4)}: {what} waits for every thread of the CTA, but {cause}: the threads that "
        "skip it never arrive and the CTA hangs. Expected the barrier outside the "
        "thread-dependent branch, or a named barrier counting only the threads that reach it: "
        "ptx.bar_sync(id, threads) with id 1..15"
    )
