"""``LazyRe``: a regular expression compiled at its first use, so that importing a module
that keeps patterns (the ptxas log parser, the JIT) compiles none of them (~0.1-0.2 ms each
on a small host)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["LazyRe"]


class LazyRe:
    """``re.compile(pattern, flags)`` when an attribute is first asked for (``match``,
    ``search``, ``pattern``, ...); after that, the compiled pattern's attributes directly."""

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self._args = (pattern, flags)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_args":
            raise AttributeError(name)
        value = getattr(re.compile(*self._args), name)
        self.__dict__[name] = value
        return value

    def __repr__(self) -> str:
        return f"LazyRe({self._args[0]!r})"
