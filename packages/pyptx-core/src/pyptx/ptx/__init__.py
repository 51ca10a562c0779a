"""The instruction namespace: ``ptx.inst`` builds any PTX instruction; named helpers
cover special registers, addressing, parameters, control flow, barriers and warp
reductions. Every call appends to the kernel being traced.
"""

from . import cluster, mbarrier, tma, warp, warpgroup, wgmma
from .control import Label, bra, exit, if_, label, loop, place, ret
from .inst import inst
from .memory import Addr, TensorParam, addr, bulk_prefetch_l2, global_ptrs, scalar_param
from .special import special
from .sync import (
    bar_arrive,
    bar_sync,
    cluster_arrive,
    cluster_sync,
    cluster_wait,
    fence,
    fence_mbarrier_init,
    fence_proxy_async,
    grid_dependency_wait,
    launch_dependents,
    pdl_prologue,
)
from .warp import elect_sync
from .warpgroup import setmaxnreg

__all__ = [
    "inst", "special", "warp", "addr", "global_ptrs", "scalar_param", "Addr", "TensorParam",
    "Label", "label", "place", "bra", "loop", "if_", "ret", "exit", "bar_sync", "bar_arrive",
    "fence", "mbarrier", "tma", "wgmma", "cluster", "warpgroup", "fence_proxy_async",
    "fence_mbarrier_init", "cluster_arrive", "cluster_wait", "cluster_sync", "elect_sync",
    "setmaxnreg", "grid_dependency_wait", "launch_dependents", "pdl_prologue",
    "bulk_prefetch_l2",
]
