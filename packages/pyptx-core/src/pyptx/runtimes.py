"""Runtime plugins, found through the ``pyptx.runtimes`` entry-point group.

Core never imports a framework. A plugin is picked by the cheap test of an
argument's type module (``torch...``, ``jax...``/``jaxlib...``) and loaded
the first time such an argument appears. A plugin object has ``name``,
``owns(value) -> bool`` and ``launch(kernel, args, kwargs)``.
"""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol

from .errors import RuntimeUnavailableError, SpecError
from .source import where

GROUP = "pyptx.runtimes"
_MODULE_TO_RUNTIME = {"torch": "torch", "jax": "jax", "jaxlib": "jax"}
_EXTRA = {"torch": "pyptx-core[torch]", "jax": "pyptx-core[jax]"}
_loaded: dict[str, Any] = {}


class Runtime(Protocol):
    """What a ``pyptx.runtimes`` entry point loads to (a class or a ready object)."""

    name: str

    def owns(self, value: Any) -> bool:
        """True if ``value`` is one of this framework's arrays."""

    def launch(self, kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Launch ``kernel`` on ``args``; return its outputs."""


def available() -> dict[str, EntryPoint]:
    """Installed runtime entry points by name (nothing is imported)."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def load(name: str) -> Any:
    """Load (once) and return the runtime plugin called ``name``."""
    rt = _loaded.get(name)
    if rt is not None:
        return rt
    ep = available().get(name)
    if ep is None:
        raise RuntimeUnavailableError(
            f"no pyptx runtime for {name} is installed; install it with "
            f"pip install \"{_EXTRA.get(name, 'pyptx-' + name)}\""
        )
    obj = ep.load()
    # Loading twice on a race is harmless; the first stored object wins.
    return _loaded.setdefault(name, obj() if isinstance(obj, type) else obj)


def preload_for_imported_frameworks() -> None:
    """Load the plugins of frameworks already imported, so a later ``torch.compile`` or
    ``jax.jit`` trace finds them without scanning entry points (which tracers refuse)."""
    for mod, name in _MODULE_TO_RUNTIME.items():
        if name not in _loaded and mod in sys.modules:
            try:
                load(name)
            except Exception:  # a broken plugin is reported when a launch needs it
                pass


def framework_of(value: Any) -> str | None:
    """``"torch"``/``"jax"`` from the value's type module, or None; imports nothing."""
    mod = type(value).__module__
    return _MODULE_TO_RUNTIME.get(mod.partition(".")[0])


_by_type: dict[type, Any] = {}


def runtime_for(args: tuple[Any, ...], kernel: Any = None) -> Any:
    """The runtime plugin that should launch a kernel on ``args``.

    The plugin of the first argument's type is remembered; the plugin itself
    rejects arguments of another framework.
    """
    if args:
        rt = _by_type.get(type(args[0]))
        if rt is not None:
            return rt
    found = {framework_of(a) for a in args} - {None}
    if not found:
        got = ", ".join(type(a).__name__ for a in args) or "no arguments"
        raise SpecError(
            f"{where()}: calling a kernel launches it on torch tensors or jax arrays, got {got}; "
            "for PTX text use kernel.ptx(**dims)"
        )
    if len(found) > 1:
        raise SpecError(f"{where()}: arguments mix frameworks ({', '.join(sorted(found))})")
    rt = load(found.pop())
    if framework_of(args[0]) is not None:
        _by_type[type(args[0])] = rt
    return rt
