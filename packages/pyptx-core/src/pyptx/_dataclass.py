"""``dataclass``: ``dataclasses.dataclass`` whose generated methods are compiled once, not at
every import.

``dataclasses`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__setattr__``...
as source text and compiles it with ``exec`` when the class is created: ~0.12 ms a method,
~0.5-1 ms a class on a small host, ~10 ms of a first library call's imports. This decorator
is the same ``dataclasses.dataclass`` (same class, fields, methods, errors); only the
``exec`` it runs meanwhile takes an already compiled code object for a source text seen
before. The code objects are kept per Python bytecode version in one marshal file beside
this module's own bytecode (``__pycache__``, like ``.pyc`` files), keyed by the exact
source text, so a changed class (or ``dataclasses``) compiles its new text; where that
folder is not writable, nothing is kept and methods are compiled as usual.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from typing import Any

__all__ = ["dataclass"]

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__",
                     f"_dataclass_methods.{sys.implementation.cache_tag}.marshal")
_lock = threading.RLock()
_codes: dict[str, Any] | None = None
_new: list[str] = []
_local = threading.local()
_exec = exec


def _load() -> dict[str, Any]:
    global _codes
    if _codes is None:
        import marshal

        try:
            with open(_PATH, "rb") as f:
                loaded = marshal.loads(f.read())   # not marshal.load(f): ~20x slower (small reads)
            _codes = loaded if isinstance(loaded, dict) else {}
        except (OSError, EOFError, ValueError, TypeError):
            _codes = {}
    return _codes


def _cached_exec(source: Any, globals: Any = None, locals: Any = None) -> None:
    if not isinstance(source, str) or not getattr(_local, "active", False):
        return _exec(source, globals, locals)
    codes = _load()
    code = codes.get(source)
    if code is None:
        # As ``exec`` compiles a string from ``dataclasses`` (no ``__future__`` flags of this
        # module: annotations stay evaluated).
        code = compile(source, "<string>", "exec", dont_inherit=True)
        codes[source] = code
        _new.append(source)
    return _exec(code, globals, locals)


def _save() -> None:
    import marshal
    import tempfile

    folder = os.path.dirname(_PATH)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".marshal")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(marshal.dumps(_codes))
            os.replace(tmp, _PATH)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except (OSError, ValueError):
        pass   # a read-only install: methods are compiled at each import, as without this


def dataclass(cls: Any = None, /, **kwargs: Any) -> Any:
    """``dataclasses.dataclass(cls, **kwargs)``, its generated methods' code compiled once."""
    if cls is None:
        return lambda c: dataclass(c, **kwargs)
    with _lock:
        outer = getattr(_local, "active", False)
        _local.active = True
        dataclasses.exec = _cached_exec   # the module's global ``exec``: read at each call
        try:
            return dataclasses.dataclass(cls, **kwargs)
        finally:
            if not outer:
                del dataclasses.exec
                _local.active = False
                if _new:
                    _new.clear()
                    _save()
