"""Every code block of the documentation runs: docs/*.md (not docs/dev) and README.md.

CPU: each page's python blocks run in order in one namespace; printed output is
compared with the page's ``<!-- output -->`` blocks; every kernel a page creates
must be traced, and each traced specialization goes through ptxas. Blocks marked
``<!-- gpu -->`` are compiled here and run by the GPU test. See ``docs_blocks``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import re
import shlex
import traceback
from pathlib import Path

import pytest
from docs_blocks import (
    ROOT,
    Block,
    BlockFailed,
    blocks,
    fresh_namespace,
    pages,
    run_block,
    same_output,
)

import pyptx.ptxas as ptxas_mod
from pyptx.errors import CompileError, ToolchainError
from pyptx.kernel import Kernel
from pyptx.module import PtxModule

kernel_mod = importlib.import_module("pyptx.kernel")  # the module; pyptx.kernel is the decorator

PAGES = pages()
# torch and JAX share the GPU in one process: JAX must not grab 75% of it up front
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _missing_framework(e: BaseException) -> str | None:
    name = getattr(e, "name", None) or ""
    top = name.split(".")[0]
    return top if isinstance(e, ModuleNotFoundError) and top in ("torch", "jax", "jaxlib") else None


def _run_console(block: Block, where: str) -> None:
    from pyptx.cli import main

    chunks: list[tuple[str, list[str]]] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            chunks.append((line[2:], []))
        elif chunks:
            chunks[-1][1].append(line)
    for command, expected in chunks:
        argv = shlex.split(command)
        if argv[0] != "pyptx":
            continue
        if argv[1:2] == ["check"] and ptxas_mod.find_ptxas() is None and not CI:
            pytest.skip(f"{where}: `{command}` needs ptxas")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(argv[1:])
        if rc != 0:
            raise BlockFailed(f"{where}: `{command}` exited {rc}:\n{buf.getvalue()}")
        if "sample" not in block.marks and not same_output(buf.getvalue(), "\n".join(expected)):
            raise BlockFailed(f"{where}: `{command}` printed\n{buf.getvalue()}\nbut the page shows\n"
                              + "\n".join(expected))


#: ``PYPTX_UPDATE_DOCS=1``: rewrite output blocks that differ instead of failing (then review
#: the diff: the page's prose must still describe what the block prints).
UPDATE = os.environ.get("PYPTX_UPDATE_DOCS") == "1"
CI = os.environ.get("CI", "").lower() == "true"


def _rewrite_outputs(path: Path, updates: list[tuple[Block, str]]) -> None:
    lines = path.read_text().splitlines()
    for block, printed in reversed(updates):
        old = block.code.rstrip("\n").count("\n") + 1 if block.code.strip() else 0
        lines[block.line - 1:block.line - 1 + old] = printed.rstrip("\n").splitlines()
    path.write_text("\n".join(lines) + "\n")


def run_page(path: Path, *, gpu: bool, assemble, monkeypatch, cache: Path) -> int:
    """Run a page's blocks; return how many python blocks executed."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(cache))  # compiled records stay in the test's tmp
    # Kernels the page creates are the new entries of the live-kernel table; a kernel counts
    # as traced once its body ran (tracing may raise on purpose). Wrapping only ``_trace``
    # keeps this file's frames out of the stack where pyptx looks for the user's file:line.
    before = set(kernel_mod._by_uid.keys())
    traced: set[str] = set()
    trace = Kernel._trace

    def recording_trace(self, *args, **kwargs):
        traced.add(self.uid)
        return trace(self, *args, **kwargs)

    monkeypatch.setattr(Kernel, "_trace", recording_trace)
    reuse = Kernel.reuse   # a library kernel of a family traced before takes its code

    def recording_reuse(self, *args, **kwargs):
        traced.add(self.uid)
        return reuse(self, *args, **kwargs)

    monkeypatch.setattr(Kernel, "reuse", recording_reuse)
    modules: list[tuple[str, str]] = []  # (PTX, arch) of every PtxModule the page prints
    module_ptx = PtxModule.ptx

    def recording_module_ptx(self):
        text = module_ptx(self)
        modules.append((text, self.arch))
        return text

    monkeypatch.setattr(PtxModule, "ptx", recording_module_ptx)
    rejected: set[str] = set()  # PTX a block itself showed ptxas rejecting (a CompileError demo)
    ptxas_assemble = ptxas_mod.assemble

    def recording_assemble(text, *args, **kwargs):
        try:
            return ptxas_assemble(text, *args, **kwargs)
        except CompileError:
            rejected.add(text)
            raise

    monkeypatch.setattr(ptxas_mod, "assemble", recording_assemble)
    namespace = fresh_namespace(path)
    page = blocks(path)
    executed = 0
    printed: str | None = None
    updates: list[tuple[Block, str]] = []
    for block in page:
        where = f"{_id(path)}:{block.line}"
        if "output" in block.marks:
            if printed is None:
                raise BlockFailed(f"{where}: an output block must follow an executed python block")
            if not same_output(printed, block.code) and UPDATE:
                updates.append((block, printed))
            elif not same_output(printed, block.code):
                raise BlockFailed(f"{where}: the block above printed\n{printed}\nbut the page shows\n"
                                  f"{block.code}")
            printed = None
            continue
        printed = None
        if block.lang == "console" and not gpu:
            _run_console(block, where)
            continue
        if block.lang != "python":
            continue
        runs = block.runs_on_cpu or (gpu and "gpu" in block.marks)
        if not runs:
            compile(block.code, where, "exec")
            continue
        try:
            printed = run_block(block, namespace, where)
        except Exception as e:  # noqa: BLE001 - reported with the page's line
            missing = _missing_framework(e)
            if missing and not gpu:
                pytest.skip(f"{where}: needs {missing}")
            if isinstance(e, ToolchainError) and ptxas_mod.find_ptxas() is None and not CI:
                pytest.skip(f"{where}: needs ptxas")
            raise BlockFailed(f"{where}: the block raised\n{traceback.format_exc()}") from e
        executed += 1
    if updates:
        _rewrite_outputs(path, updates)
    created = [k for uid, k in list(kernel_mod._by_uid.items()) if uid not in before]
    untraced = [k.name for k in created if k.uid not in traced]
    assert not untraced, f"{_id(path)}: kernels never traced on the page: {untraced}"
    texts = [(spec.ptx(), k.arch) for k in created for spec in list(k._cache.values())]
    seen: set[str] = set(rejected)
    for text, arch in texts + modules if assemble is not None else ():
        if text not in seen:
            seen.add(text)
            assemble(text, arch=arch)
    return executed


@pytest.mark.parametrize("path", PAGES, ids=_id)
def test_page_runs_on_cpu(path, assemble, monkeypatch, tmp_path):
    run_page(path, gpu=False, assemble=assemble, monkeypatch=monkeypatch, cache=tmp_path)


GPU_PAGES = [p for p in PAGES if any("gpu" in b.marks for b in blocks(p))]


@pytest.mark.gpu
@pytest.mark.parametrize("path", GPU_PAGES, ids=_id)
def test_page_runs_on_gpu(path, monkeypatch, tmp_path):
    # no ptxas needed here: the CPU test assembles the same kernels, and the driver JITs them
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    run_page(path, gpu=True, assemble=None, monkeypatch=monkeypatch, cache=tmp_path)


def test_marks_are_known_and_every_python_block_is_reachable():
    total = norun = 0
    for path in PAGES:
        for b in blocks(path):  # raises on unknown marks, unclosed fences, bare norun
            if b.lang == "python":
                total += 1
                norun += "norun" in b.marks
    assert total > 0
    assert norun <= max(1, total // 20), f"{norun} of {total} python blocks are norun: keep that rare"


def _quote_hook():
    spec = importlib.util.spec_from_file_location("docs_quote_hook", ROOT / "docs" / "hooks" / "quote.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_quoted_file_and_excerpt_resolves():
    hook = _quote_hook()
    found = 0
    for path in PAGES:
        text = path.read_text()
        for m in hook.INCLUDE.finditer(text):
            found += 1
            assert (ROOT / m.group("path")).is_file(), f"{_id(path)}: include {m.group('path')} is missing"
        for m in hook.EXCERPT.finditer(text):
            found += 1
            source = (ROOT / m.group("path")).read_text()
            lines = hook.excerpt(source, m.group("start"), m.group("end"))
            assert lines, (f"{_id(path)}: excerpt of {m.group('path')} from /{m.group('start')}/ to "
                           f"/{m.group('end')}/ matches nothing: the quoted file changed")
    assert found > 0


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _recorded(number: str, outputs: list[str]) -> bool:
    """``number`` (as a page prints it) is one of ``outputs`` or one of them rounded."""
    places = len(number.split(".")[1]) if "." in number else 0
    return any(o == number or round(float(o), places) == float(number) for o in outputs)


def test_performance_tables_are_the_recorded_benchmark_outputs():
    """Every number in a table of a section that names ``python benchmarks/NAME.py`` is in
    that benchmark's recorded output, ``docs/benchmarks/NAME.md`` (shown under the table)."""
    hook = _quote_hook()
    checked = 0
    for path in PAGES:
        text = path.read_text()
        for section in re.split(r"^## ", text, flags=re.M)[1:]:
            names = [m.group("name") for m in hook.BENCH_FENCE.finditer(section)]
            outputs = [n for name in names if (out := hook.benchmark_output(name))
                       for n in _NUMBER.findall(out)]
            if not outputs:
                continue
            title = section.splitlines()[0]
            for row in section.splitlines():
                if not row.startswith("|") or set(row) <= set("|-: "):
                    continue
                cells = [c.strip() for c in row.strip("|").split("|")]
                if cells and cells[0] in ("dtype", "path", "measure", "what"):
                    continue  # a header row
                for number in _NUMBER.findall(row):
                    checked += 1
                    assert _recorded(number, outputs), (
                        f"{_id(path)} '{title}': {number} in {row!r} is not in the recorded "
                        f"output of {', '.join(names)} (docs/benchmarks/)")
    assert checked > 0
