"""Launching a ``Kernel`` on JAX arrays: the per-kernel launcher and its plans.

Core checks the arguments and builds the plan (``pyptx.plan``); this module
only describes JAX arrays to it and stages the custom call. A plan's record
is loaded on every local GPU under one shim handle (the handler picks the
function of the device XLA runs it on). Under ``jax.jit`` this happens while
tracing. Where there is no GPU (CPU-only lowering) the record only describes
the kernel, so the custom call can still be lowered and inspected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pyptx import plan as _plan
from pyptx.plan import ArgInfo, LaunchPlan, PlanCache, bind, launch_plan
from pyptx.registry import find_record, persist

from . import ffi
from .ffi import call_kernel_via_ffi

__all__ = ["LaunchState", "describe", "make_launcher", "launch_kernel", "plan_for",
           "resolve_handle", "PLAN_SLOTS"]

#: Plans (and jitted eager wrappers) a kernel keeps, least recently used dropped first. A dropped
#: plan's record may still be named by a compiled executable: the shim's resolver finds it again.
PLAN_SLOTS = _plan.PLAN_SLOTS

#: Records handed to XLA while the disk cache is off. A compiled executable may call a handle
#: after the kernel that made it is gone (XLA reports no executable's end): with the cache on,
#: the shim's resolver finds the freed record again by its hash; without it, it is kept.
_handed_to_xla: set[Any] = set()
#: Records the resolver loaded for programs made elsewhere (nothing else here holds them).
_resolved: set[Any] = set()


def describe(a: Any) -> ArgInfo | None:
    """Core's view of a JAX array or tracer (None for anything else)."""
    import jax

    if not isinstance(a, jax.Array):
        return None
    device = None
    if not isinstance(a, jax.core.Tracer):
        devices = a.devices()
        other = sorted({d.platform for d in devices} - {"gpu", "cuda"})
        if other:
            device = other[0]
        elif len(devices) == 1:
            (d,) = devices
            device = f"cuda:{d.local_hardware_id if d.local_hardware_id is not None else d.id}"
    return ArgInfo(tuple(a.shape), str(a.dtype), device)


def _gpu_ordinals() -> list[int]:
    import jax

    try:
        return sorted(d.local_hardware_id if d.local_hardware_id is not None else d.id
                      for d in jax.local_devices(backend="gpu"))
    except RuntimeError:
        return []


class LaunchState:
    """One kernel's JAX launch state: plans by specialization and jitted eager wrappers, each a
    bounded LRU (``PLAN_SLOTS``), so alternating shapes reuse them and many shapes do not pile up."""

    __slots__ = ("plans", "jitted")

    def __init__(self) -> None:
        self.plans: PlanCache = PlanCache()  # of LaunchPlan
        self.jitted: PlanCache = PlanCache()


def plan_for(state: LaunchState, kernel: Any, spec: Any) -> LaunchPlan:
    """The plan of ``spec``: its record loaded on every local GPU (none without a driver)."""
    key = (tuple(sorted(spec.env.items())), tuple(sorted(spec.template_kwargs.items())))
    plan = state.plans.hit(key)
    if plan is None:
        from pyptx import driver

        ordinals = _gpu_ordinals() if driver.cuda() is not None else []
        plan = launch_plan(kernel, spec, ordinals)
        state.plans.keep(key, plan, PLAN_SLOTS)
        # An executable or an exported program names it by hash: found again through the disk.
        if not persist(plan.record):
            _handed_to_xla.add(plan.record)
    return plan


def resolve_handle(handle: int) -> bool:
    """The shim's resolver for a handle nobody registered here (a program exported by another
    process): the record with that content hash from the disk cache, loaded on every GPU
    that can run it. False (never an exception: it runs on XLA's thread) if there is none."""
    from pyptx import driver
    from pyptx.errors import PyptxError
    from pyptx.plan import check_record_device

    try:
        rec = find_record(handle)
        if rec is None:
            return False
        loaded = 0
        for ordinal in range(driver.device_count()):
            try:
                check_record_device(rec, ordinal)
            except PyptxError:  # a GPU this arch does not run on: XLA will not pick it
                continue
            rec.function(ordinal)
            loaded += 1
        _resolved.add(rec)  # XLA holds the handle; no kernel in this process holds the record
        return loaded > 0
    except Exception:  # noqa: BLE001 - reported by the handler as an unknown handle
        return False


def launch_kernel(state: LaunchState, kernel: Any, args: Sequence[Any],
                  kwargs: dict[str, Any]) -> Any:
    """``kernel(*args, **kwargs)`` on JAX arrays or tracers, inside or outside ``jax.jit``.

    Outside ``jit`` the call goes through a jitted wrapper cached per specialization,
    so an eager call costs one jit dispatch instead of re-staging the custom call.
    """
    import jax

    spec, _ = bind(kernel, args, kwargs, describe)
    handle = plan_for(state, kernel, spec).handle

    def call(*arrays: Any) -> Any:
        return call_kernel_via_ffi(*arrays, cubin_handle=handle, out_specs=kernel.out_specs,
                                   out_shape_env=spec.env, grid=spec.grid, block=spec.block,
                                   cluster=spec.cluster, smem_bytes=spec.smem)

    if any(isinstance(a, jax.core.Tracer) for a in args):
        return call(*args)
    key = (handle, id(ffi._mock))  # a test mock is baked into the trace
    jitted = state.jitted.hit(key)
    if jitted is None:
        jitted = jax.jit(call)
        state.jitted.keep(key, jitted, PLAN_SLOTS)
    return jitted(*args)


def make_launcher() -> Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]:
    """A kernel's JAX launcher ``launch(kernel, args, kwargs)``; its state is ``.state``."""
    state = LaunchState()

    def launch(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return launch_kernel(state, kernel, args, kwargs)

    launch.state = state  # type: ignore[attr-defined]
    return launch
