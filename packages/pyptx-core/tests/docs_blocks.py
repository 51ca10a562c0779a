"""Extract and run the fenced ``python`` blocks of the documentation pages.

A page's blocks run in order in one namespace, like cells of a notebook. An
HTML comment on the line(s) right before a fence marks the block:

* ``<!-- gpu -->``: launches on a GPU. The CPU suite only compiles it (its
  kernels are built in the CPU blocks before it); the GPU suite runs it.
* ``<!-- norun: why -->``: never executed (only compiled); the reason is required.
* ``<!-- output -->`` before a ``text`` fence: the exact stdout of the python
  block above it (trailing spaces ignored).
* ``console`` fences hold ``$ pyptx ...`` commands, each run in-process through
  ``pyptx.cli.main`` (it must exit 0) and followed by its exact output, unless
  the block is marked ``<!-- sample -->`` (output that depends on the machine:
  only the exit status is checked).

Every kernel created while a page runs must have been specialized (traced) by
the end of the page; the caller assembles each specialization with ptxas.
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)[^\n]*$")
_MARK = re.compile(r"^\s*<!--\s*(?P<mark>[\w-]+)(?::\s*(?P<arg>.*?))?\s*-->\s*$")
MARKS = ("gpu", "norun", "output", "sample")


@dataclass
class Block:
    """One fenced block: its language, code, 1-based line of its first code line, marks."""

    lang: str
    code: str
    line: int
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def runs_on_cpu(self) -> bool:
        return self.lang == "python" and "gpu" not in self.marks and "norun" not in self.marks


def pages() -> list[Path]:
    """Every documentation page whose blocks are tested: docs/**/*.md (not docs/dev or the
    recorded outputs in docs/benchmarks) and README.md."""
    skip = ("dev", "benchmarks")  # contributors' notes; recorded benchmark outputs
    found = [p for p in sorted(DOCS.rglob("*.md")) if p.relative_to(DOCS).parts[0] not in skip]
    return [ROOT / "README.md", *found]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a markdown file, with the marks written just above each."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group("indent"))
        marks: dict[str, str] = {}
        j = i - 1
        while j >= 0 and (mk := _MARK.match(lines[j])):
            if mk.group("mark") not in MARKS:
                raise ValueError(f"{path}:{j + 1}: unknown docs mark {mk.group('mark')!r}")
            marks[mk.group("mark")] = mk.group("arg") or ""
            j -= 1
        body: list[str] = []
        k = i + 1
        while k < len(lines) and lines[k].strip() != "```":
            body.append(lines[k][indent:])
            k += 1
        if k == len(lines):
            raise ValueError(f"{path}:{i + 1}: unclosed code fence")
        if "norun" in marks and not marks["norun"].strip():
            raise ValueError(f"{path}:{i + 1}: a norun block must say why: <!-- norun: reason -->")
        out.append(Block(m.group("lang"), "\n".join(body) + "\n", i + 2, marks))
        i = k + 1
    return out


class BlockFailed(AssertionError):
    """A docs block raised or printed something else than its output block."""


def run_block(block: Block, namespace: dict, where: str) -> str:
    """Execute ``block`` in ``namespace`` and return what it printed.

    The code is compiled as ``example.py`` with line numbers counted from the
    block's first line, so pyptx's ``file:line`` prefixes read the same on the page.
    """
    code = compile(block.code, "example.py", "exec")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(code, namespace)  # noqa: S102 - running the documentation is the point
    return buf.getvalue()


def same_output(printed: str, expected: str) -> bool:
    """Equal up to trailing whitespace on each line and at the end."""
    norm = [ln.rstrip() for ln in printed.rstrip().splitlines()]
    return norm == [ln.rstrip() for ln in expected.rstrip().splitlines()]


def fresh_namespace(path: Path) -> dict:
    """The globals a page's blocks run in (they run with the repository root as cwd)."""
    return {"__name__": f"docs_{path.stem.replace('-', '_')}"}
