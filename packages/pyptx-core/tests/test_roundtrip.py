"""Every corpus file parses and prints back byte for byte (tests/corpus, see its regen.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyptx.parser import emit, parse

CORPUS = Path(__file__).parent / "corpus"
FILES = sorted(CORPUS.glob("*.ptx"))


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def test_corpus_is_big_and_varied():
    assert len(FILES) >= 100
    sizes = [p.stat().st_size for p in FILES]
    assert sum(s > 100_000 for s in sizes) >= 3
    tools = {p.name.split("_")[0] for p in FILES}
    assert tools >= {"nvcc", "triton", "pyptx", "hand"}
    targets = {parse(_read(p)).target.split(",")[0] for p in FILES}
    assert {"sm_80", "sm_90a"} <= targets


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_round_trip_byte_identical(path):
    text = _read(path)
    mod = parse(text, path.name)
    assert emit(mod) == text
    assert mod.version and mod.functions


def test_structure_of_a_hopper_file():
    mod = parse(_read(CORPUS / "nvcc_wgmma_inline_sm_90a.ptx"))
    ops = {i.opcode for f in mod.functions for i in f.instructions()}
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in ops
    assert "wgmma.commit_group.sync.aligned" in ops
    tma = parse(_read(CORPUS / "nvcc_tma_sm_90a.ptx"))
    insts = [i for f in tma.functions for i in f.instructions()]
    bulk = next(i for i in insts if i.opcode.startswith("cp.async.bulk.tensor.2d"))
    assert bulk.operands[1].startswith("[%rd") and "{" in bulk.operands[1]
