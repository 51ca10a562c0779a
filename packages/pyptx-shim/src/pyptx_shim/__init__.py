"""The pyptx kernel launcher: a process-local ``handle -> launch config`` table in C++.

``pyptx_shim._shim`` is a CPython extension compiled when the package is built.
It opens the CUDA driver lazily, so importing works on any machine;
``shim_is_available()`` says whether kernels can be launched here and
``shim_load_error()`` why not.
"""

from __future__ import annotations

__all__ = ["shim_is_available", "shim_load_error", "ShimError", "native"]

try:
    from . import _shim as native
    from ._shim import ShimError
    _IMPORT_ERROR: str | None = None
except ImportError as e:  # the extension was not built for this interpreter
    native = None  # type: ignore[assignment]
    _IMPORT_ERROR = f"the pyptx C++ launcher could not be imported: {e}"

    class ShimError(RuntimeError):  # type: ignore[no-redef]
        """Raised by the launcher when a call is refused."""


def shim_load_error() -> str | None:
    """Why the launcher cannot launch kernels here (no extension, no driver), or None."""
    if native is None:
        return _IMPORT_ERROR
    return native.driver_error()


def shim_is_available() -> bool:
    """True if the C++ launcher is loaded and the CUDA driver opened."""
    return shim_load_error() is None
