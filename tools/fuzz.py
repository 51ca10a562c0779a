"""Fuzz the PTX parser, the transpiler, the ``Reg`` operator sugar and the raw ``ptx.inst``
layer: only ``PyptxError`` may come out of them.

    python tools/fuzz.py --cases 100000 [--seed 0] [--target all|parse|transpile|sugar]

Parser and transpiler cases are corpus files (``packages/pyptx-core/tests/corpus``)
mutated by truncation, byte flips, random bytes, deleted or duplicated ranges and lines
spliced in from other files. Sugar cases apply a random operator to a register of a
random type and a random operand (registers of every type, numbers, strings, None,
containers, shared arrays, labels, registers of another kernel); some are ``ptx.inst`` calls
of an instruction-table spelling (a part added or dropped at times) on random operands and
guards. The run prints its
counts and exits 1 if anything but a ``PyptxError`` escaped (the first ones are printed
with a reproducer). ``run(cases, seed)`` is the same as a function, for the tests.
"""

from __future__ import annotations

import argparse
import operator
import random
import signal
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pyptx import kernel, ptx, reg, smem
from pyptx.errors import PyptxError
from pyptx.parser import parse
from pyptx.transpile import transpile
from pyptx.types import _BY_NAME

CORPUS = Path(__file__).resolve().parent.parent / "packages" / "pyptx-core" / "tests" / "corpus"
#: Corpus files larger than this are cut to a random window of lines (speed).
MAX_BYTES = 24_000
TARGETS = ("parse", "transpile", "sugar")


@dataclass
class Counts:
    """What the fuzz run saw, per target: accepted inputs, PyptxErrors by class, escapes."""

    ok: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)
    escaped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def escape(self, target: str, what: str, e: BaseException) -> None:
        self.escaped[target] += 1
        if len(self.examples) < 5:
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-4:])
            self.examples.append(f"[{target}] {what}\n{tb}")

    @property
    def total_escaped(self) -> int:
        """Exceptions that were not a PyptxError (the run's failure count)."""
        return sum(self.escaped.values())

    def report(self) -> str:
        """A table of the counts per target."""
        lines = [f"{'target':<10}{'cases':>9}{'accepted':>10}{'PyptxError':>12}{'other':>7}"]
        for t in TARGETS:
            refused = sum(n for (tt, _), n in self.refused.items() if tt == t)
            n = self.ok[t] + refused + self.escaped[t]
            if n:
                lines.append(f"{t:<10}{n:>9}{self.ok[t]:>10}{refused:>12}{self.escaped[t]:>7}")
        kinds = Counter()
        for (_, cls), n in self.refused.items():
            kinds[cls] += n
        lines.append("PyptxError classes: " + ", ".join(f"{k} {v}" for k, v in kinds.most_common()))
        return "\n".join(lines)


# ------------------------------------------------------------------------ PTX mutation
def load_corpus() -> list[bytes]:
    """The corpus files' bytes, sorted by name."""
    return [p.read_bytes() for p in sorted(CORPUS.glob("*.ptx"))]


def _window(rng: random.Random, data: bytes) -> bytes:
    if len(data) <= MAX_BYTES:
        return data
    lines = data.splitlines(keepends=True)
    head = lines[:40] if rng.random() < 0.5 else []  # keep .version/.target sometimes
    start = rng.randrange(len(lines))
    out = b"".join(head + lines[start:start + rng.randint(20, 300)])
    return out[:MAX_BYTES]


_TOKENS = [b"{", b"}", b";", b"/*", b"*/", b"//", b'"', b"\n", b"%r", b"<99999999>", b".reg",
           b".entry", b"@!", b"[", b"]", b",", b"\x00", b"\xff", b"\xe9", b".section", b"$L",
           b"::", b".param", b"(", b")", b"0f", b"0x", b"-", b"+", b"\r", b"\t"]


def mutate(rng: random.Random, corpus: list[bytes]) -> bytes:
    """One mutated PTX input: 1 to 4 mutations of a random corpus file (or window of it)."""
    data = bytearray(_window(rng, rng.choice(corpus)))
    for _ in range(rng.randint(1, 4)):
        n = len(data)
        kind = rng.randrange(8)
        if kind == 0 and n:  # truncate
            del data[rng.randrange(n):]
        elif kind == 1 and n:  # flip bytes
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(n)] = rng.randrange(256)
        elif kind == 2:  # insert random bytes
            at = rng.randint(0, n)
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif kind == 3 and n:  # delete a range
            at = rng.randrange(n)
            del data[at:at + rng.randint(1, 200)]
        elif kind == 4:  # splice lines of another file
            other = rng.choice(corpus).splitlines(keepends=True)
            lines = bytes(data).splitlines(keepends=True)
            at = rng.randint(0, len(lines))
            s = rng.randrange(len(other))
            lines[at:at] = other[s:s + rng.randint(1, 12)]
            data = bytearray(b"".join(lines))
        elif kind == 5 and n:  # duplicate a range
            at = rng.randrange(n)
            data[at:at] = data[at:at + rng.randint(1, 400)]
        elif kind == 6:  # insert a token that PTX gives meaning to
            at = rng.randint(0, n)
            data[at:at] = rng.choice(_TOKENS)
        elif n:  # swap two lines
            lines = bytes(data).splitlines(keepends=True)
            if len(lines) > 1:
                i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
                lines[i], lines[j] = lines[j], lines[i]
                data = bytearray(b"".join(lines))
    return bytes(data)


class Hang(Exception):
    """A case ran longer than ``HANG_S`` seconds (counted as an escape)."""


#: Seconds one parser or transpiler case may take before it counts as a hang.
HANG_S = 5.0


def _alarm(signum, frame):
    raise Hang(f"no result within {HANG_S} s")


def _limit(seconds: float) -> None:
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, seconds)


def fuzz_ptx(rng: random.Random, corpus: list[bytes], counts: Counts, transpile_every: int) -> None:
    """One parser case; every ``transpile_every``-th accepted input also goes through the
    transpiler (plain, sugar or exact), whose generated module is then run."""
    data = mutate(rng, corpus)
    _limit(HANG_S)
    try:
        _fuzz_ptx(rng, data, counts, transpile_every)
    except Hang as e:
        counts.escape("parse", f"hang on {data[:200]!r}...", e)
    finally:
        _limit(0)


def _fuzz_ptx(rng: random.Random, data: bytes, counts: Counts, transpile_every: int) -> None:
    try:
        mod = parse(data, "fuzz.ptx")
        counts.ok["parse"] += 1
    except PyptxError as e:
        counts.refused[("parse", type(e).__name__)] += 1
        return
    except Hang:
        raise
    except Exception as e:
        counts.escape("parse", f"parse({data[:200]!r}...)", e)
        return
    if rng.randrange(transpile_every):
        return
    mode = rng.choice(("plain", "sugar", "exact"))
    try:
        code = transpile(mod, exact=mode == "exact", sugar=mode == "sugar", source="fuzz.ptx")
        if mode != "exact":  # exact mode already ran it; run the others' output here
            ns: dict = {"__name__": "fuzz_transpiled"}
            exec(compile(code, "<transpiled fuzz.ptx>", "exec"), ns)
            ns["build"]().ptx()
        counts.ok["transpile"] += 1
    except PyptxError as e:
        counts.refused[("transpile", type(e).__name__)] += 1
    except Hang:
        raise
    except Exception as e:
        counts.escape("transpile", f"transpile(mode={mode}, {data[:200]!r}...)", e)


# ------------------------------------------------------------------------ Reg sugar
_BINARY = [operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
           operator.mod, operator.and_, operator.or_, operator.xor, operator.lshift,
           operator.rshift, operator.lt, operator.le, operator.gt, operator.ge, operator.eq,
           operator.ne, operator.iadd, operator.isub, operator.imul, operator.iand, operator.ior,
           operator.ixor, operator.ilshift, operator.irshift]
#: Operators a Python value on the left hands to the register (``__radd__`` and friends).
_REFLECTED = [operator.add, operator.sub, operator.mul, operator.and_, operator.or_, operator.xor,
              operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne,
              operator.truediv, operator.floordiv, operator.lshift, operator.rshift]
# not mod: ``"text" % reg`` is Python's str formatting, which never asks the register
_UNARY = [operator.neg, operator.invert]
_CONSTANTS = [0, 1, -1, 7, 255, 256, 2**31, 2**32, 2**63, 2**64, -2**70, 0.0, -0.0, 1.5,
              float("nan"), float("inf"), 1e300, True, False, "x", "", None, [], [1], (), {},
              1j, b"\x00", object()]


def _foreign_reg():
    got = []

    @kernel(name="fuzz_other")
    def other():
        got.append(reg.scalar(_BY_NAME["u32"], 0))

    other.ptx()
    return got[0]


def _operand(rng: random.Random, regs: list, extras: list):
    roll = rng.random()
    if roll < 0.45:
        return rng.choice(regs)
    if roll < 0.85:
        return rng.choice(_CONSTANTS)
    return rng.choice(extras)


_MANGLES = ("bogus", "v4", "sat", "rn", "wide", "sync", "aligned", "u32", "f32", "shared", "")


def _spelling(rng: random.Random) -> str:
    """An accepted spelling of the instruction table, with a part added or dropped at times."""
    from pyptx.ptx._isa import TABLE

    spellings = [sp for row in TABLE.values() for sp in row.ok]
    parts = rng.choice(spellings).split(".")
    roll = rng.random()
    if roll < 0.3:
        parts.insert(rng.randrange(1, len(parts) + 1), rng.choice(_MANGLES))
    elif roll < 0.5 and len(parts) > 1:
        del parts[rng.randrange(1, len(parts))]
    return ".".join(p for p in parts if p)


def fuzz_sugar(rng: random.Random, counts: Counts, n: int) -> None:
    """``n`` random operator applications inside one kernel trace."""
    foreign = _foreign_reg()
    plan = [rng.random() for _ in range(n)]

    @kernel(name="fuzz_sugar", smem=1024)
    def body():
        types = [t for name, t in _BY_NAME.items() if name not in ("b128",)]
        regs = [reg.scalar(t) for t in types]
        preds = [r for r in regs if r.type.is_pred]
        extras = [~preds[0], smem.alloc(_BY_NAME["f32"], 4), ptx.label(), foreign,
                  ptx.addr(regs[3]), smem.dynamic()]
        for roll in plan:
            a = rng.choice(regs)
            if roll < 0.7:
                op, o = rng.choice(_BINARY), _operand(rng, regs, extras)
                what = f"{op.__name__}({a!r}, {o!r})"
                call, args = op, (a, o)
            elif roll < 0.85:
                op, o = rng.choice(_REFLECTED), rng.choice(_CONSTANTS + extras)
                what = f"{op.__name__}({o!r}, {a!r})"
                call, args = op, (o, a)
            elif roll < 0.93:
                op = rng.choice(_UNARY)
                what = f"{op.__name__}({a!r})"
                call, args = op, (a,)
            elif roll < 0.96:
                t, v = rng.choice(types), _operand(rng, regs, extras)
                make = rng.choice((reg.from_, reg.scalar))
                what = f"reg.{make.__name__}({v!r}, {t.name})"
                call, args = make, ((v, t) if make is reg.from_ else (t, v))
            else:  # the raw layer: a table spelling, perhaps mangled, on random operands
                spelling = _spelling(rng)
                args = tuple(_operand(rng, regs, extras) for _ in range(rng.randrange(6)))
                what = f"ptx.inst({spelling!r})(*{args!r})"

                def call(*ops, spelling=spelling):
                    return ptx.inst(spelling)(*ops, pred=rng.choice((None, preds[0], ~preds[0])))
            try:
                call(*args)
                counts.ok["sugar"] += 1
            except PyptxError as e:
                counts.refused[("sugar", type(e).__name__)] += 1
            except Exception as e:
                counts.escape("sugar", what, e)

    body.ptx()


# ------------------------------------------------------------------------ driver
def run(cases: int, seed: int = 0, targets: tuple[str, ...] = TARGETS,
        transpile_every: int = 1) -> Counts:
    """Fuzz ``cases`` inputs (split between the PTX targets and the sugar) with ``seed``."""
    rng = random.Random(seed)
    counts = Counts()
    ptx_cases = cases if "sugar" not in targets else (
        cases // 2 if {"parse", "transpile"} & set(targets) else 0)
    sugar_cases = cases - ptx_cases
    if ptx_cases:
        if hasattr(signal, "SIGALRM"):
            signal.signal(signal.SIGALRM, _alarm)
        corpus = load_corpus()
        if "transpile" not in targets:
            every = 10**18
        else:
            every = transpile_every if "parse" in targets else 1
        for _ in range(ptx_cases):
            fuzz_ptx(rng, corpus, counts, every)
    while sugar_cases > 0:
        n = min(sugar_cases, 500)
        fuzz_sugar(rng, counts, n)
        sugar_cases -= n
    return counts


def main(argv: list[str] | None = None) -> int:
    """Run the fuzzer from the command line; 1 if any non-PyptxError escaped."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000, help="inputs to try (default 100000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", choices=("all",) + TARGETS, default="all")
    args = ap.parse_args(argv)
    targets = TARGETS if args.target == "all" else (args.target,)
    t0 = time.perf_counter()
    counts = run(args.cases, args.seed, targets)
    print(f"fuzz: {args.cases} cases, seed {args.seed}, {time.perf_counter() - t0:.1f} s")
    print(counts.report())
    print(f"non-PyptxError exceptions: {counts.total_escaped}")
    for ex in counts.examples:
        print("\n" + ex)
    return 1 if counts.total_escaped else 0


if __name__ == "__main__":
    sys.exit(main())
