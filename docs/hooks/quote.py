"""MkDocs hook: pages quote repository files instead of retyping them.

* ``<!-- include: PATH -->`` (PATH relative to the repository root, e.g. a
  benchmark's output table) is replaced by that file's text and a note naming it.
* ``<!-- excerpt: PATH start=REGEX end=REGEX -->`` is replaced by a fenced python
  block of PATH's lines from the first line matching ``start`` up to, not
  including, the next line matching ``end`` (dedented): code shown on a page is
  the code in the repository, never a copy that can drift.
* A fenced block whose first line runs ``python benchmarks/NAME.py`` is followed by
  the output of that benchmark's last recorded run, ``docs/benchmarks/NAME.md``
  (written by ``--out``), in a collapsible block: the tables a page quotes come
  with the file they were taken from (``test_docs.py`` checks every number).

A missing file or marker is a warning, so ``mkdocs build --strict`` fails.
"""

from __future__ import annotations

import logging
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r"^<!--\s*include:\s*(?P<path>\S+)\s*-->\s*$", re.M)
EXCERPT = re.compile(r'^<!--\s*excerpt:\s*(?P<path>\S+)\s+start="(?P<start>[^"]+)"\s+'
                     r'end="(?P<end>[^"]+)"\s*-->\s*$', re.M)
BENCH_FENCE = re.compile(r"^```[^\n]*\n(?P<body>python benchmarks/(?P<name>\w+)\.py[^\n]*\n"
                         r"(?:[^`][^\n]*\n)*)```[ \t]*$", re.M)
BENCHMARKS = ROOT / "docs" / "benchmarks"
log = logging.getLogger("mkdocs.hooks.quote")


def _read(rel: str, page: str) -> str | None:
    path = (ROOT / rel).resolve()
    if ROOT not in path.parents or not path.is_file():
        log.warning("%s: %s: no such file in the repository", page, rel)
        return None
    return path.read_text()


def _include(m: re.Match, page: str) -> str:
    text = _read(m.group("path"), page)
    if text is None:
        return m.group(0)
    return f"{text.rstrip()}\n\n*Generated from `{m.group('path')}`.*\n"


def excerpt(text: str, start: str, end: str) -> list[str] | None:
    """The lines of ``text`` from the first match of ``start`` to the next of ``end``."""
    lines = text.splitlines()
    first = next((i for i, ln in enumerate(lines) if re.search(start, ln)), None)
    if first is None:
        return None
    last = next((i for i in range(first + 1, len(lines)) if re.search(end, lines[i])), None)
    if last is None:
        return None
    return textwrap.dedent("\n".join(lines[first:last])).rstrip().splitlines()


def _excerpt(m: re.Match, page: str) -> str:
    rel = m.group("path")
    text = _read(rel, page)
    if text is None:
        return m.group(0)
    lines = excerpt(text, m.group("start"), m.group("end"))
    if lines is None:
        log.warning("%s: excerpt of %s: no lines from /%s/ to /%s/", page, rel,
                    m.group("start"), m.group("end"))
        return m.group(0)
    return "```python\n" + "\n".join(lines) + f"\n```\n\n*From `{rel}`.*\n"


def benchmark_output(name: str) -> str | None:
    """The recorded output of ``benchmarks/<name>.py`` (``docs/benchmarks/<name>.md``)."""
    path = BENCHMARKS / f"{name}.md"
    return path.read_text() if path.is_file() else None


def _with_output(m: re.Match) -> str:
    name = m.group("name")
    text = benchmark_output(name)
    if text is None:
        return m.group(0)
    # headings of the output file would land in the page's table of contents
    body = re.sub(r"^#+\s*(.+)$", r"**\1**", text.strip(), flags=re.M)
    return (f"{m.group(0)}\n\n<details markdown=\"1\">\n<summary>Output of the recorded run: "
            f"<code>docs/benchmarks/{name}.md</code></summary>\n\n{body}\n\n</details>\n")


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Expand the page's include and excerpt lines; attach recorded benchmark outputs."""
    src = page.file.src_uri
    markdown = INCLUDE.sub(lambda m: _include(m, src), markdown)
    markdown = EXCERPT.sub(lambda m: _excerpt(m, src), markdown)
    return BENCH_FENCE.sub(_with_output, markdown)
