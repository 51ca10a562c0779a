"""``Hints``: how a row kernel issues its streamed global accesses (cache modifiers and L2
eviction priorities), and the modifier constants. Apart from ``access`` (the loads and
stores that take them) so that a kernel's plan can be checked without loading the tracing
layer.
"""

from __future__ import annotations

import re

from .._dataclass import dataclass
from ..errors import ConfigError
from ..source import where

__all__ = ["STREAM", "KEEP", "PINNED", "L2_PRIORITIES", "Hints"]

#: load cache hints. Streamed rows use plain ``ld.global``: on the H100 it beat
#: ``.nc.L1::no_allocate`` by 1-3% at every size (measured with the retired tools/probe_variants.py; NOTES.md);
#: weights are shared by the CTAs of an SM, so they stay in L1 (``.nc``).
STREAM = ""
KEEP = ".nc"
#: the persistent kernels' row loads: coherent (no ``.nc``), so ptxas keeps them where they are
#: issued, before the previous row's ``bar.sync`` and stores; ``.nc`` loads it sinks past both
#: to shorten their live ranges, which undoes the prefetch.
PINNED = ".L1::no_allocate"
#: L2 eviction priorities of ``createpolicy.fractional`` ("" = no policy).
L2_PRIORITIES = ("evict_first", "evict_last", "evict_normal", "evict_unchanged")
_STORE_HINTS = ("", ".wb", ".cg", ".cs", ".wt")
_LOAD_HINT = re.compile(r"^(\.[A-Za-z0-9_:]+)*$")


@dataclass(frozen=True)
class Hints:
    """How a row kernel's streamed global accesses are issued; every field changes the PTX.

    ``load``: the cache modifier after ``ld.global`` of streamed row loads ("" = plain
    loads, the measured best; e.g. ``.nc.L1::no_allocate``; weights always use ``KEEP``).
    ``l2_load``/``l2_store``: L2 eviction priority of streamed row loads / of stores
    ("" = none, else one of ``L2_PRIORITIES``; weights loaded with ``KEEP`` get none).
    ``store``: the cache modifier after ``st.global`` ("" = the default write-back,
    ``.cs`` streaming, ...). ``pdl_prefetch``: ``pdl=True`` kernels ask for their CTA's
    rows in L2 (``cp.async.bulk.prefetch``) before ``griddepcontrol.wait``, so the
    loads overlap the previous grid's last wave.
    """

    l2_load: str = ""
    l2_store: str = ""
    store: str = ""
    pdl_prefetch: bool = True
    load: str = STREAM

    def __post_init__(self) -> None:
        at = where(4)  # past the generated __init__: the caller of Hints(...)
        for name in ("l2_load", "l2_store"):
            v = getattr(self, name)
            if v != "" and v not in L2_PRIORITIES:
                raise ConfigError(f"{at}: {name} must be '' or one of {L2_PRIORITIES}, "
                                  f"got {v!r}")
        if self.store not in _STORE_HINTS:
            raise ConfigError(f"{at}: store must be one of {_STORE_HINTS} (the st.global "
                              f"cache modifier), got {self.store!r}")
        if not isinstance(self.load, str) or not _LOAD_HINT.match(self.load):
            raise ConfigError(f"{at}: load must be '' or ld.global modifiers such as "
                              f"'.nc.L1::no_allocate', got {self.load!r}")
        if not isinstance(self.pdl_prefetch, bool):
            raise ConfigError(f"{at}: pdl_prefetch must be True or False, got "
                              f"{self.pdl_prefetch!r}")
