"""Helpers shared by the whole library: where the user's call is, the framework of an array."""

from __future__ import annotations

import os

#: The package directory: every frame inside it is the library's, not the user's.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def where() -> str:
    """``file:line`` of the user's call into the library (the first frame outside it)."""
    from pyptx.source import where_outside

    return where_outside(PACKAGE_DIR)


def framework(x) -> str:
    """``"torch"`` or ``"jax"``: the framework an array (or tracer) belongs to."""
    return "torch" if type(x).__module__.startswith("torch") else "jax"
