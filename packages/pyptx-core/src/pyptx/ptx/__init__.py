"""The instruction namespace: ``ptx.inst`` builds any PTX instruction; named helpers
cover special registers, addressing, parameters, control flow, barriers and warp
reductions. Every call appends to the kernel being traced.
"""

import importlib
import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names for static tools (docs, type checkers); loaded lazily below
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

#: Each exported name -> (its submodule, the attribute there; None: the submodule itself).
_NAMES = {"cp_async": ("async_copy", None), "tcgen05": ("tcgen05", None)}  # tcgen05: Blackwell
for _mod in ("cluster", "mbarrier", "tma", "warp", "warpgroup", "wgmma"):
    _NAMES[_mod] = (_mod, None)
for _mod, _attrs in {
    "control": "Label WhileLoop bra else_ exit if_ label loop place ret unrolled while_",
    "convert": "pack_bf16x2 pack_f16x2 unpack_bf16x2 unpack_f16x2",
    "inst": "inst",
    "matrix": "ldmatrix stmatrix",
    "memory": "Addr TensorParam addr bulk_prefetch_l2 global_ptrs scalar_param",
    "mma": "mma_sync",
    "special": "special",
    "sync": "bar_arrive bar_sync cluster_arrive cluster_sync cluster_wait fence "
            "fence_mbarrier_init fence_proxy_async fence_proxy_tensormap grid_dependency_wait "
            "launch_dependents pdl_prologue",
    "warp": "elect_sync",
    "warpgroup": "setmaxnreg",
}.items():
    for _attr in _attrs.split():
        _NAMES[_attr] = (_mod, _attr)
del _mod, _attrs, _attr

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


def __getattr__(name: str):
    """Load each name's submodule at its first use (a launch that traces nothing loads none);
    any submodule (``ptx.control``, ``ptx._isa``) by its own name too."""
    mod, attr = _NAMES.get(name, (name, None))
    try:
        module = importlib.import_module(f"{__name__}.{mod}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{mod}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NAMES))


class _Namespace(types.ModuleType):
    """The package: importing submodule ``inst`` or ``special`` (whichever module imports
    it) binds the function of that name here, not the submodule (as ``from .inst import
    inst`` did)."""

    def __setattr__(self, name, value):
        want = _NAMES.get(name)
        if want is not None and want[1] is not None and isinstance(value, types.ModuleType) \
                and value.__name__ == f"{__name__}.{want[0]}":
            value = getattr(value, want[1])
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Namespace
