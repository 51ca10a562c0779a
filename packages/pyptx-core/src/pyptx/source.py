"""Find the user's ``file:line`` behind a DSL call, for errors and ``.loc`` lines."""

from __future__ import annotations

import bisect
import os
import sys
from types import CodeType, FrameType

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: Import packages whose frames are pyptx internals too: the runtime plugins and the shim.
_PLUGIN_DIRS = tuple(os.sep + name + os.sep for name in ("pyptx_torch", "pyptx_jax", "pyptx_shim"))
_internal: set[str] = set()
_external: set[str] = set()

Loc = tuple[str, int]


def _is_internal(filename: str) -> bool:
    if filename in _internal:
        return True
    if filename in _external:
        return False
    path = os.path.abspath(filename)
    hit = (
        path.startswith(_PKG_DIR)
        or any(d in path for d in _PLUGIN_DIRS)
        or filename.startswith("<frozen ")
        or filename.endswith(os.sep + "contextlib.py")
    )
    (_internal if hit else _external).add(filename)
    return hit


def user_loc(skip: int = 1) -> Loc:
    """The ``(file, line)`` of the nearest caller frame outside the pyptx package.

    ``skip`` frames up from the caller is tried first; hot paths pass the depth at
    which user code usually sits, so the common case is a single set lookup.
    """
    f: FrameType | None = sys._getframe(skip)
    name = f.f_code.co_filename
    if name in _external:
        return (name, f.f_lineno)
    while f is not None and _is_internal(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return ("<unknown>", 0)
    return (f.f_code.co_filename, f.f_lineno)


Site = tuple[CodeType, int]
_line_tables: dict[CodeType, tuple[list[int], list[int | None]]] = {}


def user_site(skip: int = 1) -> Site | Loc:
    """Like ``user_loc`` but cheap: the frame's code object and bytecode offset.

    Turning an offset into a line number costs more than everything else a
    DSL call does, so statements keep the site and ``resolve`` it on demand.
    """
    f: FrameType | None = sys._getframe(skip)
    if f.f_code.co_filename not in _external:
        while f is not None and _is_internal(f.f_code.co_filename):
            f = f.f_back
        if f is None:
            return ("<unknown>", 0)
    return (f.f_code, f.f_lasti)


def resolve(site: Site | Loc | None) -> Loc | None:
    """The ``(file, line)`` of a ``user_site`` result (a ``Loc`` passes through)."""
    if site is None or type(site[0]) is str:
        return site  # type: ignore[return-value]
    code, offset = site
    table = _line_tables.get(code)
    if table is None:
        starts, lines = [], []
        for start, _end, line in code.co_lines():
            starts.append(start)
            lines.append(line)
        table = _line_tables[code] = (starts, lines)
    i = bisect.bisect_right(table[0], offset) - 1
    line = table[1][i] if i >= 0 else None
    return (code.co_filename, line if line is not None else code.co_firstlineno)


def fmt_loc(loc: Loc | None) -> str:
    """Render a location as ``file:line``."""
    if loc is None:
        return "<unknown>"
    return f"{loc[0]}:{loc[1]}"


def where_outside(path: str) -> str:
    """``file:line`` of the nearest caller outside pyptx and outside ``path``: a kernel
    library's module (its ``__file__``) or its package directory, whose every file is then
    skipped. This is the user's call into a kernel builder, for the library's errors."""
    import os

    here = os.path.abspath(path)
    prefix = here + os.sep if os.path.isdir(here) else None
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        name = os.path.abspath(f.f_code.co_filename)
        inside = name.startswith(prefix) if prefix else name == here
        if not (inside or _is_internal(f.f_code.co_filename)):
            break
        f = f.f_back
    return "<unknown>:0" if f is None else f"{f.f_code.co_filename}:{f.f_lineno}"


def where(skip: int = 2) -> str:
    """``file:line`` of the user's code that called into pyptx (for error messages)."""
    return fmt_loc(user_loc(skip))
