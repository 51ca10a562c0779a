"""Find the user's ``file:line`` behind a DSL call, for errors and ``.loc`` lines."""

from __future__ import annotations

import os
import sys
from types import FrameType

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_internal: dict[str, bool] = {}

Loc = tuple[str, int]


def _is_internal(filename: str) -> bool:
    hit = _internal.get(filename)
    if hit is None:
        hit = _internal[filename] = (
            os.path.abspath(filename).startswith(_PKG_DIR)
            or filename.startswith("<frozen ")
            or os.sep + "contextlib.py" in filename
        )
    return hit


def user_loc(skip: int = 1) -> Loc:
    """The ``(file, line)`` of the nearest caller frame outside the pyptx package."""
    f: FrameType | None = sys._getframe(skip)
    while f is not None and _is_internal(f.f_code.co_filename):
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
