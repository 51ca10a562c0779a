"""The instruction namespace: ``ptx.inst`` builds any PTX instruction; named helpers
cover special registers, addressing, parameters, control flow, barriers and warp
reductions. Every call appends to the kernel being traced.
"""

from . import async_copy as cp_async
from . import cluster, mbarrier, tma, warp, warpgroup, wgmma
from . import tcgen05 as tcgen05  # Blackwell tensor cores (untested on hardware)
from .control import (
    Label,
    WhileLoop,
    bra,
    else_,
    exit,
    if_,
    label,
    loop,
    place,
    ret,
    unrolled,
    while_,
)
from .convert import pack_bf16x2, pack_f16x2, unpack_bf16x2, unpack_f16x2
from .inst import inst
from .matrix import ldmatrix, stmatrix
from .memory import Addr, TensorParam, addr, bulk_prefetch_l2, global_ptrs, scalar_param
from .mma import mma_sync
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
    fence_proxy_tensormap,
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
    "bulk_prefetch_l2", "else_", "while_", "WhileLoop", "unrolled", "ldmatrix", "stmatrix",
    "cp_async", "mma_sync", "pack_bf16x2", "pack_f16x2", "unpack_bf16x2", "unpack_f16x2",
    "fence_proxy_tensormap",
]
