"""The optional C++ fast path for repeated launches (``pyptx_torch._fastpath``).

``FASTPATH`` is the loaded extension, configured with the shim's C launch
entry point, or None; ``fastpath_status()`` says which and why. It is None when
the extension was not built for this environment (see ``fastpath_build``), was
built against another torch, the shim is missing, or ``PYPTX_TORCH_FASTPATH=0``.
Loading it also registers the CUDA kernel of ``pyptx::launch``.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["FASTPATH", "fastpath_status"]

FASTPATH: Any = None
_REASON = "not loaded"


def _load() -> None:
    global FASTPATH, _REASON
    if os.environ.get("PYPTX_TORCH_FASTPATH", "") == "0":
        _REASON = "disabled by PYPTX_TORCH_FASTPATH=0"
        return
    try:
        from pyptx_shim import native
    except ImportError:
        native = None
    if native is None:
        _REASON = "the pyptx shim is not importable"
        return
    try:
        from . import _fastpath
    except ImportError as e:
        _REASON = (f"not built for this environment ({e}); build it once with "
                   "`python -m pyptx_torch.fastpath_build`")
        return
    if _fastpath.TORCH_VERSION != torch.__version__:
        _REASON = (f"built against torch {_fastpath.TORCH_VERSION}, this is {torch.__version__}; "
                   "rebuild with `python -m pyptx_torch.fastpath_build`")
        return
    FASTPATH, _REASON = _fastpath, None
    _fastpath.configure(native.launch_raw_address())


def fastpath_status() -> str:
    """``"active (torch <version>)"`` or why the C++ fast path is off."""
    return f"active (torch {FASTPATH.TORCH_VERSION})" if FASTPATH is not None else f"off: {_REASON}"


_load()
