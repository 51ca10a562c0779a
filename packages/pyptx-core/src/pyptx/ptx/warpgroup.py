"""Warpgroup-wide register reallocation (``setmaxnreg``, sm_90a).

Warp-specialized kernels shrink the register budget of producer warpgroups
and grow that of consumer warpgroups: every warp of a warpgroup must execute
the same ``setmaxnreg``.
"""

from __future__ import annotations

from ..errors import OperandError
from ..source import where
from ..trace import current

__all__ = ["setmaxnreg"]


def setmaxnreg(count: int, inc: bool = True) -> None:
    """``setmaxnreg.{inc,dec}.sync.aligned.u32 count;``: raise (``inc=True``) or lower the
    per-thread register limit of this warpgroup to ``count`` (a multiple of 8 in 24..256).
    """
    trace = current()
    if isinstance(count, bool) or not isinstance(count, int) or not 24 <= count <= 256 or count % 8:
        raise OperandError(
            f"{where()}: setmaxnreg count must be a multiple of 8 in 24..256, got {count!r}"
        )
    if not isinstance(inc, bool):
        raise OperandError(f"{where()}: setmaxnreg inc must be True or False, got {inc!r}")
    trace.inst(f"setmaxnreg.{'inc' if inc else 'dec'}.sync.aligned.u32", (str(count),))
