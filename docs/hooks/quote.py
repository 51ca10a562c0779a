"""MkDocs hook: pages quote repository files instead of retyping them.

* ``<!-- include: PATH -->`` (PATH relative to the repository root, e.g. a
  benchmark's output table) is replaced by that file's text and a note naming it.
* ``<!-- excerpt: PATH start=REGEX end=REGEX -->`` is replaced by a fenced python
  block of PATH's lines from the first line matching ``start`` up to, not
  including, the next line matching ``end`` (dedented): code shown on a page is
  the code in the repository, never a copy that can drift.

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


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Expand the page's include and excerpt lines."""
    src = page.file.src_uri
    markdown = INCLUDE.sub(lambda m: _include(m, src), markdown)
    return EXCERPT.sub(lambda m: _excerpt(m, src), markdown)
