"""The target architecture of the GPU at hand: ``detect_arch`` and ``@kernel(arch="auto")``.

A compute capability maps to the ``sm_XY`` target pyptx emits for it: the arch-specific
``sm_90a`` / ``sm_100a`` (and the other 9.x, 10.x and 11.x parts) where the instructions
pyptx emits need the ``a`` target (wgmma, setmaxnreg, tcgen05), the plain ``sm_80``,
``sm_86``, ``sm_89``, ``sm_120`` elsewhere. The driver is reached through ``pyptx.driver``
(``ctypes``, opened on first use).
"""

from __future__ import annotations

from .errors import RuntimeUnavailableError
from .source import where

__all__ = ["detect_arch", "arch_of_capability", "AUTO", "DEFAULT_ARCH"]

AUTO = "auto"
"""``@kernel(arch=AUTO)``: the arch of the GPU of the first launch."""

DEFAULT_ARCH = "sm_90a"
"""What an ``arch="auto"`` kernel traces for before it has launched (and without a GPU)."""

#: Compute-capability majors whose pyptx kernels need the arch-specific (``a``) target.
_ARCH_SPECIFIC_MAJORS = frozenset({9, 10, 11})


def arch_of_capability(major: int, minor: int) -> str:
    """The target pyptx emits for compute capability ``major.minor``: ``(9, 0)`` ->
    ``'sm_90a'``, ``(10, 0)`` -> ``'sm_100a'``, ``(8, 6)`` -> ``'sm_86'``."""
    suffix = "a" if major in _ARCH_SPECIFIC_MAJORS else ""
    return f"sm_{major}{minor}{suffix}"


def _current_ordinal(driver) -> int:
    """The device of this thread's current CUDA context, else device 0."""
    dev = driver.current_device()
    return 0 if dev is None else dev


def detect_arch(device: int | None = None) -> str:
    """The arch of CUDA device ``device`` (an ordinal; None: the current context's device,
    else 0), e.g. ``'sm_90a'`` on an H100 or H200. Raises ``RuntimeUnavailableError`` (a
    ``PyptxError``) at the caller's line where there is no GPU or driver."""
    from . import driver

    if driver.cuda() is None:
        raise RuntimeUnavailableError(
            f"{where()}: cannot detect the GPU's arch: {driver.unavailable_reason()}; on a "
            f"machine without a GPU give the target explicitly, e.g. arch={DEFAULT_ARCH!r}"
        )
    count = driver.device_count()
    ordinal = _current_ordinal(driver) if device is None else device
    if isinstance(ordinal, bool) or not isinstance(ordinal, int) or not 0 <= ordinal < count:
        raise RuntimeUnavailableError(
            f"{where()}: detect_arch(device={device!r}): expected a device ordinal in "
            f"0..{count - 1} ({count} CUDA devices)"
        )
    return arch_of_capability(*driver.device_capability(ordinal))


def register_budget(consumers: int, producer_regs: int = 40, cap: int = 240) -> tuple[int, int]:
    """``(maxnreg, consumer_regs)`` of a CTA of one producer and ``consumers`` consumer
    warpgroups: the launch cap (the register file split evenly, a multiple of 8, at most
    255) and the most registers per consumer thread that ``setmaxnreg.inc`` can take once
    the producer went down to ``producer_regs``: the CTA's pool is ``maxnreg x threads``,
    so a larger request would wait for registers no warp ever frees."""
    threads = 128 * (1 + consumers)
    maxnreg = min(255, 65536 // threads // 8 * 8)
    pool = min(maxnreg, 256) * threads
    return maxnreg, min(cap, (pool - 128 * producer_regs) // (128 * consumers) // 8 * 8)
