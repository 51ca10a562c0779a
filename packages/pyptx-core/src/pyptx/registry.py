"""``CubinRecord`` and ``CubinRegistry``: the process-local table of compiled kernels."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["CubinRecord", "CubinRegistry", "get_cubin_registry"]


@dataclass
class CubinRecord:
    """A compiled kernel and its launch config.

    ``cu_function`` is the CUfunction pointer as an int (None where no driver
    is available); ``module`` keeps the loaded module alive, so the function
    pointer stays valid for as long as the record is registered.
    """

    handle: int
    ptx_source: str
    kernel_name: str
    smem_bytes: int = 0
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    cu_function: int | None = None
    module: Any = None
    cubin_bytes: bytes | None = None


class CubinRegistry:
    """Thread-safe process-local table mapping handle -> ``CubinRecord``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[int, CubinRecord] = {}
        self._next = itertools.count(1)

    def register(
        self,
        ptx_source: str,
        kernel_name: str,
        cubin_bytes: bytes | None = None,
        smem_bytes: int = 0,
        grid: tuple[int, int, int] = (1, 1, 1),
        block: tuple[int, int, int] = (1, 1, 1),
        cu_function: int | None = None,
        module: Any = None,
    ) -> int:
        """Insert a compiled kernel record and return its process-local handle."""
        with self._lock:
            handle = next(self._next)
            self._records[handle] = CubinRecord(
                handle, ptx_source, kernel_name, smem_bytes, tuple(grid), tuple(block),
                cu_function, module, cubin_bytes,
            )
        return handle

    def get(self, handle: int) -> CubinRecord | None:
        """Look up a previously registered kernel handle."""
        return self._records.get(handle)

    def clear(self) -> None:
        """Drop all registered kernel records."""
        with self._lock:
            self._records.clear()

    def __len__(self) -> int:
        return len(self._records)


_registry = CubinRegistry()


def get_cubin_registry() -> CubinRegistry:
    """Return the process-local cubin registry singleton."""
    return _registry
