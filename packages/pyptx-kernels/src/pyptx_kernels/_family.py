"""One trace per kernel family: a kernel of a new size reuses the code of the first kernel
traced for its family (``pyptx.Kernel.reuse``) instead of tracing its body again.

A family is everything a kernel's PTX depends on: dtypes, head dim, mask, layout and tile
plan, and whatever sizes the schedule does not read from kernel parameters. Its sizes (M,
batch, sequence lengths, row counts) are scalar parameters, so each builder names the family
(``key``) and gives the values of those parameters for its size (``scalars``); the tensor
shapes, grid and tensor maps come from the new kernel itself. The CPU tests check, per
family, that a reused specialization equals a fresh trace at several sizes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

SLOTS = 512
"""Families kept (least recently used dropped first); each holds one traced module."""

_families: OrderedDict = OrderedDict()
_lock = threading.Lock()
_stats = {"traced": 0, "reused": 0}


def specialized(kernel, key, scalars):
    """``kernel`` with its specialization in place: reused from family ``key``'s traced code
    with the scalar parameters ``scalars`` (a mapping of name to value) if the family was
    traced before, else traced now and kept as the family's. ``key`` must be hashable and
    name every input the PTX depends on; ``None`` traces without sharing."""
    if key is None:
        kernel.specialize()
        return kernel
    with _lock:
        like = _families.get(key)
        if like is not None:
            _families.move_to_end(key)
    if like is None:
        spec = kernel.specialize()
        _stats["traced"] += 1
        with _lock:
            _families[key] = spec
            while len(_families) > SLOTS:
                _families.popitem(last=False)
    else:
        kernel.reuse(like, scalars)
        _stats["reused"] += 1
    return kernel


def stats() -> dict:
    """How many family traces and reuses this process made (``traced``, ``reused``)."""
    return dict(_stats)


def clear() -> None:
    """Forget every family (the next kernel of each traces again)."""
    with _lock:
        _families.clear()
