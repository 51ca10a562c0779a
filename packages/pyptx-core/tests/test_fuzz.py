"""A seeded slice of ``tools/fuzz.py`` (the full run is ``nox -s fuzz``): mutated corpus PTX
into the parser and the transpiler, random operands into the ``Reg`` sugar; nothing but a
``PyptxError`` may come out, and nothing may hang."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

from pyptx.errors import ParseError
from pyptx.parser import parse

FUZZ = Path(__file__).resolve().parents[3] / "tools" / "fuzz.py"


@pytest.fixture(scope="module")
def fuzz():
    if not FUZZ.is_file():
        pytest.skip("tools/fuzz.py is not in this checkout (installed package tests)")
    spec = importlib.util.spec_from_file_location("pyptx_fuzz", FUZZ)
    module = importlib.util.module_from_spec(spec)
    sys.modules["pyptx_fuzz"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [1, 2])
def test_fuzz_slice_raises_only_pyptx_errors(fuzz, seed):
    counts = fuzz.run(500, seed)
    assert counts.total_escaped == 0, "\n\n".join(counts.examples)
    refused = {t for t, _ in counts.refused}
    assert refused >= {"parse", "sugar"}, counts.report()
    assert counts.ok["parse"] > 0 and counts.ok["sugar"] > 0 and counts.ok["transpile"] > 0


def test_mutations_are_deterministic_per_seed(fuzz):
    import random

    corpus = fuzz.load_corpus()
    ra, rb = random.Random(7), random.Random(7)
    a = [fuzz.mutate(ra, corpus) for _ in range(3)]
    b = [fuzz.mutate(rb, corpus) for _ in range(3)]
    assert a == b and len(set(a)) == 3


def test_unterminated_statements_with_comments_fail_fast():
    # Found by the fuzzer: comments inside a statement that never reaches ';' made the
    # lexer retry every split of every comment (exponential time).
    text = ".version 8.0\n" + "".join(f".b8 {i}                // DW_AT_x{i}\n" for i in range(60))
    t0 = time.perf_counter()
    with pytest.raises(ParseError, match="without a terminating ';'"):
        parse(text)
    assert time.perf_counter() - t0 < 1.0
    block = ".version 8.0\n.b8 1 " + "/* a */ " * 60 + "\n"
    t0 = time.perf_counter()
    with pytest.raises(ParseError):
        parse(block)
    assert time.perf_counter() - t0 < 1.0
