"""The pyptx kernel launcher (pure-Python skeleton: the C++ library is not built yet)."""

from __future__ import annotations

__all__ = ["shim_is_available", "shim_load_error"]

_LOAD_ERROR = (
    "the pyptx C++ launcher is not built in pyptx-shim 0.1.0; "
    "launching kernels needs the PyTorch-runtime release of pyptx-shim"
)


def shim_is_available() -> bool:
    """Return True if the C++ launcher is loaded and can launch kernels."""
    return False


def shim_load_error() -> str | None:
    """Return why the launcher is unavailable, or None if it loaded."""
    return _LOAD_ERROR
