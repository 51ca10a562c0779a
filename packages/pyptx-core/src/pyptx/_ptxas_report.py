"""``pyptx.ptxas``'s report classes (``EntryResources``, ``PtxasReport``), defined here so
that importing ``pyptx.ptxas`` to find ptxas (every first launch) makes no dataclass; import
them from ``pyptx.ptxas``."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EntryResources", "PtxasReport"]


@dataclass(frozen=True)
class EntryResources:
    """What ptxas allocated for one ``.entry``; sizes in bytes.

    ``cmem`` maps constant bank -> bytes where ptxas reports it (older releases do).
    """

    name: str
    arch: str
    registers: int
    barriers: int
    smem: int
    stack: int
    spill_stores: int
    spill_loads: int
    cmem: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PtxasReport:
    """Result of one successful ``ptxas -v`` run."""

    arch: str
    entries: tuple[EntryResources, ...]
    warnings: tuple[str, ...]
    log: str
    cubin: bytes
    ptxas: str

    def entry(self, name: str) -> EntryResources:
        """The resources of entry ``name``."""
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(f"no entry {name!r}; entries: {', '.join(e.name for e in self.entries)}")


for _cls in (EntryResources, PtxasReport):
    _cls.__module__ = "pyptx.ptxas"   # their public home (pickles and reprs name it)
del _cls
