"""Find the user's ``file:line`` behind a DSL call, for errors and ``.loc`` lines."""

from __future__ import annotations

import os
import sys
from types import FrameType

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_internal: set[str] = set()
_external: set[str] = set()

Loc = tuple[str, int]


def _is_internal(filename: str) -> bool:
    if filename in _internal:
        return True
    if filename in _external:
        return False
    hit = (
        os.path.abspath(filename).startswith(_PKG_DIR)
        or filename.startswith("<frozen ")
        or filename.endswith(os.sep + "contextlib.py")
    )
    (_internal if hit else _external).add(filename)
    return hit


def user_loc(skip: int = 1) -> Loc:
    """The ``(file, line)`` of the nearest caller frame outside the pyptx package."""
    f: FrameType | None = sys._getframe(skip)
    internal = _internal
    while f is not None and (f.f_code.co_filename in internal or (
            f.f_code.co_filename not in _external and _is_internal(f.f_code.co_filename))):
        f = f.f_back
    if f is None:
        return ("<unknown>", 0)
    return (f.f_code.co_filename, f.f_lineno)


def fmt_loc(loc: Loc | None) -> str:
    """Render a location as ``file:line``."""
    if loc is None:
        return "<unknown>"
    return f"{loc[0]}:{loc[1]}"


def where(skip: int = 2) -> str:
    """``file:line`` of the user's code that called into pyptx (for error messages)."""
    return fmt_loc(user_loc(skip))
