"""``pyptx transpile``: every corpus file becomes pyptx code that re-emits PTX ptxas accepts.

For each file: the default and ``--sugar`` translations are executed and their
PTX assembled with ptxas (two at a time); the ``--exact`` translation must
print the input byte for byte.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from pyptx.transpile import TranspileError, main, transpile

CORPUS = Path(__file__).parent / "corpus"
FILES = sorted(CORPUS.glob("*.ptx"))
_TARGET = re.compile(r"^\s*\.target\s+(sm_\w+)", re.M)


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def _run(code: str, name: str) -> str:
    ns: dict = {"__name__": "pyptx_transpiled"}
    exec(compile(code, f"<transpiled {name}>", "exec"), ns)
    return ns["build"]().ptx()


@pytest.fixture(scope="module")
def translations():
    """{(file name, mode): re-emitted PTX} for every corpus file and mode."""
    out = {}
    for path in FILES:
        text = _read(path)
        for mode in ("plain", "sugar"):
            code = transpile(text, sugar=mode == "sugar", source=path.name)
            compile(code, path.name, "exec")
            out[path.name, mode] = _run(code, path.name)
    return out


def _ptxas(ptxas_path: str, assemble, name: str, text: str) -> str | None:
    """None if ptxas accepts ``text``, else its log. Files that call extern functions
    are assembled as relocatable code (-c), like their original."""
    arch = _TARGET.search(text).group(1)
    if re.search(r"^\s*\.extern\s+\.func", text, re.M):
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "k.ptx")
            Path(src).write_text(text)
            p = subprocess.run([ptxas_path, "-c", "--gpu-name", arch, src, "-o", os.path.join(d, "k.o")],
                               capture_output=True, text=True)
        return None if p.returncode == 0 else p.stderr
    try:
        assemble(text, arch)
    except AssertionError as e:
        return str(e)[:2000]
    return None


def test_every_transpiled_module_assembles(translations, ptxas_path, assemble):
    jobs = sorted(translations.items())
    with cf.ThreadPoolExecutor(2) as ex:
        logs = list(ex.map(lambda kv: (kv[0], _ptxas(ptxas_path, assemble, kv[0][0], kv[1])), jobs))
    failed = [f"{name} ({mode}): {log}" for (name, mode), log in logs if log is not None]
    assert not failed, "\n\n".join(failed[:5])
    assert len(logs) == 2 * len(FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_exact_is_byte_identical(path):
    text = _read(path)
    code = transpile(text, exact=True, source=path.name)
    assert _run(code, path.name) == text


def test_output_is_dsl_code():
    code = transpile(_read(CORPUS / "nvcc_vector_add_sm_80.ptx"))
    assert "with m.function('vector_add'" in code
    assert "ptx.inst.ld.param.u64(rd[1], ptx.addr(param_0))" in code
    assert "ptx.inst.bra(L_BB0_2, pred=p[1])" in code
    assert "rd = fn.reg(b64, '%rd', 11)" in code


def test_every_transpiled_instruction_goes_through_the_checks():
    """The translations the ``translations`` fixture traced emit every instruction through
    ``ptx.inst`` (or a named helper), each checked against the instruction table, the CTA
    barrier and register-budget rules: none falls back to the unchecked ``fn.inst``."""
    unchecked = {}
    for path in FILES:
        for sugar in (False, True):
            code = transpile(_read(path), sugar=sugar, source=path.name)
            hits = re.findall(r"fn\.inst\('([^']+)'", code)
            if hits:
                unchecked[path.name, sugar] = sorted(set(hits))
    assert unchecked == {}


def test_sugar_uses_helpers():
    wg = transpile(_read(CORPUS / "nvcc_wgmma_inline_sm_90a.ptx"), sugar=True)
    for helper in ("ptx.global_ptrs(", "ptx.special.tid.x()", "ptx.wgmma.fence()",
                   "ptx.wgmma.commit_group()", "ptx.wgmma.wait_group(0)", "ptx.setmaxnreg(",
                   "reg.array(f32", "ptx.bar_sync(0)", "ptx.ret()"):
        assert helper in wg, helper
    assert "# wgmma_m64n64k16(unsigned short const*, unsigned short const*, float*, int)" in wg \
        or "c++filt" not in os.environ.get("PATH", "c++filt")
    loop = transpile(_read(CORPUS / "pyptx_block_reduce_B1024_N8192.ptx"), sugar=True)
    assert "for i in ptx.loop(tid_x, 8192, 256, type=u32):" in loop
    tma = transpile(_read(CORPUS / "hand_hopper_handwritten.ptx"), sugar=True)
    for helper in ("ptx.fence_mbarrier_init()", "ptx.cluster_arrive(aligned=True)",
                   "ptx.cluster_wait(aligned=True)"):
        assert helper in tma, helper


def test_exact_and_sugar_exclusive():
    with pytest.raises(TranspileError):
        transpile(".version 8.0\n", exact=True, sugar=True)


def test_cli(tmp_path, capsys):
    src = CORPUS / "hand_syntax_zoo.ptx"
    out = tmp_path / "zoo.py"
    assert main([str(src), "--exact", "--check", "-o", str(out)]) == 0
    assert _run(out.read_text(), "zoo") == _read(src)
    assert main([str(src), "--sugar"]) == 0
    assert "def build() -> PtxModule:" in capsys.readouterr().out
    bad = tmp_path / "bad.ptx"
    bad.write_text(".version 8.0\nret;\n")
    assert main([str(bad)]) == 1
    assert "bad.ptx:2:1: instruction outside a function body" in capsys.readouterr().err


def test_cli_subcommand(capsys):
    from pyptx.cli import main as pyptx_main

    src = CORPUS / "hand_stack_alloca.ptx"
    assert pyptx_main(["transpile", str(src), "--exact", "--check"]) == 0
    code = capsys.readouterr().out
    assert "def build()" in code
    assert _run(code, "cli") == _read(src)
