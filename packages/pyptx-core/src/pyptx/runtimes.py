"""Runtime plugins, found only through the ``pyptx.runtimes`` entry-point group.

Core names no framework. Each plugin object says which arrays it owns: its
``modules`` attribute lists the top-level modules whose types it may own (a
cheap test that imports nothing), and ``owns(value)`` gives the final answer.
Entry points are read once, lazily (``importlib.metadata`` is never imported
by ``import pyptx``); a failed read is remembered, not retried. A scan is kept in
the disk cache (``pyptx.cache``) under the ``sys.path`` folders and their
modification times, so a new process reads one small file instead of every
installed distribution's metadata.

A plugin object has ``name``, ``modules``, ``owns(value) -> bool`` and
``launch(kernel, args, kwargs)``. It may also have:

- ``launcher()``: a fresh ``launch``-like callable holding one kernel's launch
  state (plans, caches); the kernel keeps it, so that state dies with the kernel;
- ``tracing() -> bool``: True while a graph compiler of the framework traces
  Python that must not create state (the kernel then calls ``launch``);
- ``differentiable(op)``: the framework glue of ``pyptx.differentiable_kernel``;
- ``prepare()``: called once when the plugin is preloaded for an imported
  framework, outside any tracer (import what a traced first call would need).
"""

from __future__ import annotations

from typing import Any, Protocol

from .errors import RuntimeUnavailableError, SpecError
from .source import where

__all__ = ["GROUP", "Runtime", "available", "discovery_error", "load", "loaded", "plugins",
           "preload", "runtime_for", "launcher_for"]

GROUP = "pyptx.runtimes"
_entry_points: dict[str, Any] | None = None
_discovery_error: str | None = None
_loaded: dict[str, Any] = {}
_all_loaded = False
_by_module: dict[str, list[Any]] = {}


class Runtime(Protocol):
    """What a ``pyptx.runtimes`` entry point loads to (a class or a ready object)."""

    name: str
    #: Top-level module names of the array types this runtime may own (``type(x).__module__``).
    modules: tuple[str, ...]

    def owns(self, value: Any) -> bool:
        """True if ``value`` is one of this runtime's arrays."""

    def launch(self, kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Launch ``kernel`` on ``args``; return its outputs."""


def available() -> dict[str, Any]:
    """Installed runtime entry points by name (nothing is imported but ``importlib.metadata``).

    Read once per process; if reading fails the reason is kept in ``discovery_error()``
    and no runtime is available.
    """
    global _entry_points, _discovery_error
    if _entry_points is None:
        try:
            _entry_points = _read_entry_points()
        except Exception as e:  # a broken environment must not break tracing
            _discovery_error = f"reading the {GROUP} entry points failed: {type(e).__name__}: {e}"
            _entry_points = {}
    return _entry_points


_SCAN_SUFFIX = ".entry_points.json"


def _scan() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=GROUP)}


def _read_entry_points() -> dict[str, Any]:
    """The group's entry points: from the disk cache (``pyptx.cache``) when a scan of the same
    ``sys.path`` (each folder's path and modification time: installing or removing a
    distribution changes its folder's) is kept there, else scanned (~3 ms) and kept."""
    import hashlib
    import json
    import os
    import sys

    from . import cache

    if cache.cache_dir() is None:
        return _scan()
    parts = [GROUP, sys.version]
    for p in sys.path:
        try:
            mtime = os.stat(p or ".").st_mtime_ns
        except OSError:
            mtime = -1
        parts.append(f"{os.path.abspath(p or '.')}:{mtime}")
    key = "runtimes-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
    raw = cache.load(key, _SCAN_SUFFIX)
    if raw is not None:
        try:
            from importlib.metadata import EntryPoint

            return {name: EntryPoint(name=name, value=value, group=GROUP)
                    for name, value in json.loads(raw)}
        except (ValueError, TypeError):
            pass  # a torn or foreign file: scan again
    found = _scan()
    cache.store(key, json.dumps([[n, ep.value] for n, ep in found.items()]).encode(),
                _SCAN_SUFFIX)
    return found


def discovery_error() -> str | None:
    """Why entry points could not be read, or None."""
    return _discovery_error


def load(name: str) -> Any:
    """Load (once) and return the runtime plugin called ``name``."""
    rt = _loaded.get(name)
    if rt is not None:
        return rt
    ep = available().get(name)
    if ep is None:
        why = f" ({_discovery_error})" if _discovery_error else ""
        raise RuntimeUnavailableError(
            f"no pyptx runtime called {name!r} is installed{why}; install its plugin, "
            f"e.g. pip install \"pyptx-core[{name}]\""
        )
    obj = ep.load()
    obj = obj() if isinstance(obj, type) else obj
    # Loading twice on a race is harmless; the first stored object wins.
    rt = _loaded.setdefault(name, obj)
    if rt is obj:
        for mod in getattr(rt, "modules", ()) or ("",):
            _by_module.setdefault(mod, []).append(rt)
    return rt


def plugins() -> dict[str, Any]:
    """Every installed runtime plugin, loaded (a plugin that fails to load is left out)."""
    global _all_loaded
    if not _all_loaded:
        for name in available():
            try:
                load(name)
            except Exception:  # reported when an argument needs that runtime
                pass
        _all_loaded = True
    return dict(_loaded)


def loaded() -> dict[str, Any]:
    """The plugins loaded so far, by name (nothing is discovered or imported)."""
    return dict(_loaded)


def preload() -> None:
    """Load the plugins of frameworks already imported, so that a later call traced by a
    framework compiler (which refuses entry-point scans) finds them. A plugin's entry point
    is named after the top-level module its arrays come from (the plugin's ``modules``
    may list more); other plugins stay unloaded until an argument needs them."""
    import sys

    for name in available():
        if name not in _loaded and name in sys.modules:
            try:
                rt = load(name)
                prepare = getattr(rt, "prepare", None)
                if prepare is not None:
                    prepare()
            except Exception:  # a broken plugin is reported when a launch needs it
                pass


def _owner(value: Any) -> Any:
    """The plugin that owns ``value``, or None."""
    mod = type(value).__module__.partition(".")[0]
    for rt in _by_module.get(mod, ()):
        if rt.owns(value):
            return rt
    for rt in _by_module.get("", ()):  # plugins that declare no modules are asked directly
        if rt.owns(value):
            return rt
    return None


def _owners(args: tuple[Any, ...]) -> dict[str, Any]:
    owners: dict[str, Any] = {}
    for a in args:
        rt = _owner(a)
        if rt is not None:
            owners[rt.name] = rt
    return owners


def runtime_for(args: tuple[Any, ...]) -> Any:
    """The runtime plugin that owns the arrays in ``args`` (``SpecError`` if none or several)."""
    owners = _owners(args)
    if not owners and not _all_loaded:
        plugins()
        owners = _owners(args)
    if not owners:
        got = ", ".join(f"{type(a).__module__}.{type(a).__qualname__}" for a in args)
        installed = ", ".join(sorted(_loaded)) or "none"
        hint = ""
        if args:
            top = type(args[0]).__module__.partition(".")[0]
            if top not in _by_module and top not in ("builtins", "numpy"):
                hint = (f"; if {top} arrays should launch, install its plugin "
                        f"(pip install \"pyptx-core[{top}]\")")
        raise SpecError(
            f"{where()}: calling a kernel launches it on the arrays of an installed runtime "
            f"(installed: {installed}), got {got or 'no arguments'}{hint}; for PTX text use "
            "kernel.ptx(**dims)"
        )
    if len(owners) > 1:
        raise SpecError(f"{where()}: arguments mix runtimes ({', '.join(sorted(owners))})")
    return next(iter(owners.values()))


def launcher_for(rt: Any) -> Any:
    """A new per-kernel ``launch(kernel, args, kwargs)`` callable of runtime ``rt``."""
    make = getattr(rt, "launcher", None)
    return make() if make is not None else rt.launch
