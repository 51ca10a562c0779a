"""Warpgroup-wide register reallocation (``setmaxnreg``, sm_90a).

Warp-specialized kernels shrink the register budget of producer warpgroups
and grow that of consumer warpgroups: every warp of a warpgroup must execute
the same ``setmaxnreg``. It needs an arch-specific target (``sm_90a``).
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, OperandError
from ..source import where
from ..trace import Trace, current
from ._operands import guard, require_arch

__all__ = ["setmaxnreg", "require_register_budget"]


def require_register_budget(trace: Trace, what: str) -> None:
    """``ConfigError`` at the user's line if the kernel being traced declared no register
    budget: ``setmaxnreg`` moves registers between warpgroups within the kernel's
    ``.maxnreg``, and without one ptxas allocates as many as it likes (the driver's linker,
    ignoring ``setmaxnreg``, would spill). The budget is ``@kernel(maxnreg=...)``."""
    if trace.maxnreg is None and trace.checks_register_budget:
        raise ConfigError(
            f"{where(4)}: {what} in kernel {trace.func.name!r}, which declares no register "
            "budget; expected @kernel(maxnreg=<registers per thread at launch>), e.g. "
            "maxnreg=168 for three warpgroups that setmaxnreg between 24 and 240"
        )


def setmaxnreg(count: int, inc: bool = True, *, pred: Any = None) -> None:
    """``setmaxnreg.{inc,dec}.sync.aligned.u32 count;``: raise (``inc=True``) or lower the
    per-thread register limit of this warpgroup to ``count`` (a multiple of 8 in 24..256).
    ``pred=p`` guards it (``@p``); the whole warpgroup must agree on ``p``.
    """
    trace = current()
    require_arch(trace, "setmaxnreg", 90, arch_specific=True)
    if isinstance(count, bool) or not isinstance(count, int) or not 24 <= count <= 256 or count % 8:
        raise OperandError(
            f"{where()}: setmaxnreg count must be a multiple of 8 in 24..256, got {count!r}"
        )
    if not isinstance(inc, bool):
        raise OperandError(f"{where()}: setmaxnreg inc must be True or False, got {inc!r}")
    require_register_budget(trace, f"ptx.setmaxnreg({count})")
    trace.inst(f"setmaxnreg.{'inc' if inc else 'dec'}.sync.aligned.u32", (str(count),),
               guard(pred, "setmaxnreg", trace))
