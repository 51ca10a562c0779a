"""The instruction namespace: ``ptx.inst`` builds any PTX instruction; named helpers
cover special registers, addressing, parameters, control flow, barriers and warp
reductions. Every call appends to the kernel being traced.
"""

from . import warp
from .control import Label, bra, exit, if_, label, loop, place, ret
from .inst import inst
from .memory import Addr, TensorParam, addr, global_ptrs, scalar_param
from .special import special
from .sync import bar_arrive, bar_sync, fence

__all__ = [
    "inst", "special", "warp", "addr", "global_ptrs", "scalar_param", "Addr", "TensorParam",
    "Label", "label", "place", "bra", "loop", "if_", "ret", "exit", "bar_sync", "bar_arrive",
    "fence",
]
