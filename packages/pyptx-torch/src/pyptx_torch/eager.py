"""Eager launches from PyTorch: the per-kernel launcher, launch plans, the launch.

Each kernel gets one launcher (``make_launcher``, kept by the kernel). The
first call with given (shapes, dtypes, device, template kwargs) goes through
core's checks and plan (``pyptx.plan``): the compiled record is loaded on the
device and a ``Plan`` is kept in a bounded LRU. Calls without template kwargs
then first try the kernel's fast launchers, most recently used first: each
launches one exact (shapes, dtypes, device) signature in one C++ call (or a
Python closure without the extension) and declines anything else, so a
kernel called with alternating shapes does not rebuild anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from pyptx import plan as _plan
from pyptx._dataclass import dataclass
from pyptx.errors import LaunchError, SpecError
from pyptx.launch import check_registered_geometry, shim
from pyptx.plan import ArgInfo, PlanCache, bind, launch_plan, ordinal_of
from pyptx.source import where
from pyptx.specs import Tile

from .dtypes import torch_dtype_of
from .fastpath import FASTPATH

try:
    from pyptx_shim import native as _native
except ImportError:  # reported by shim() when a plan is built
    _native = None

__all__ = ["Plan", "LaunchState", "make_launcher", "describe", "call_kernel_via_torch",
           "plan_for", "POISON", "set_poison", "FAST_SLOTS", "PLAN_SLOTS"]

#: Fill every output with NaN (floats) or all-ones bits (ints) before the launch, so an
#: element the kernel never writes shows up. Set ``PYPTX_POISON_OUTPUTS=1`` to turn on.
#: Change it with ``set_poison`` (which also tells the C++ fast path).
POISON = os.environ.get("PYPTX_POISON_OUTPUTS", "") not in ("", "0")
#: Fast launchers a kernel keeps (distinct exact signatures), tried most recent first.
FAST_SLOTS = 8
#: Plans a kernel keeps (shapes, dtypes, device, kwargs), least recently used dropped first.
PLAN_SLOTS = _plan.PLAN_SLOTS


@dataclass(frozen=True)
class Plan:
    """Everything a repeated launch needs: the shim handle and the outputs to allocate."""

    handle: int
    device: torch.device
    out_shapes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[Any, ...]
    spec: Any
    #: The compiled record (``pyptx.registry.CubinRecord``) the handle belongs to.
    record: Any = None

    @property
    def index(self) -> int:
        """The CUDA device ordinal."""
        return self.device.index if self.device.index is not None else _current_device()


def describe(t: Any) -> ArgInfo | None:
    """Core's view of a tensor (None for anything else): shape, dtype, device, layout."""
    if not isinstance(t, torch.Tensor):
        return None
    dev = t.device
    if dev.type == "cuda":
        device = f"cuda:{dev.index if dev.index is not None else _current_device()}"
    else:
        device = dev.type
    strides = None if t.is_contiguous() else tuple(t.stride())
    return ArgInfo(tuple(t.shape), str(t.dtype).removeprefix("torch."), device, strides)


def build_plan(kernel: Any, spec: Any, device: str) -> Plan:
    """Load ``spec``'s record on ``device`` (core checks arch and shared memory) as a plan."""
    idx = ordinal_of(device)
    shim()  # fail early, naming the fix, when the launcher is missing
    with torch.cuda.device(idx):
        torch.cuda.init()
        lp = launch_plan(kernel, spec, [idx])
    out_dtypes = tuple(getattr(torch, name) for name in lp.out_dtypes)
    return Plan(lp.handle, torch.device("cuda", idx), lp.out_shapes, out_dtypes, spec, lp.record)


class LaunchState:
    """One kernel's torch launch state: plans (bounded LRU) and fast launchers (MRU list)."""

    __slots__ = ("plans", "fast")

    def __init__(self) -> None:
        #: (signature, kwargs) -> (Plan, fast launcher of that exact signature or None).
        self.plans: PlanCache = PlanCache()
        self.fast: list[Any] = []

    def remember(self, key: Any, entry: tuple[Plan, Any]) -> None:
        """Keep a plan, dropping the least recently used past ``PLAN_SLOTS`` (and its launcher)."""
        for _, old in self.plans.keep(key, entry, PLAN_SLOTS):
            if old in self.fast:
                self.fast.remove(old)

    def use_fast(self, fast: Any) -> None:
        """Put ``fast`` first among the fast launchers (at most ``FAST_SLOTS`` kept)."""
        if self.fast and self.fast[0] is fast:
            return
        if fast in self.fast:
            self.fast.remove(fast)
        self.fast.insert(0, fast)
        del self.fast[FAST_SLOTS:]


def plan_for(state: LaunchState, kernel: Any, args: Sequence[Any],
             kwargs: dict[str, Any]) -> tuple[Plan, Any]:
    """The plan for these arguments (checked and built on first use) and the fast launcher of
    their exact signature; without kwargs that launcher becomes the kernel's first choice."""
    try:
        sig = tuple((t.shape, t.dtype, t.device) for t in args)
        key = (sig, tuple(sorted(kwargs.items())))
        entry = state.plans.get(key)
    except (AttributeError, TypeError):
        sig, key, entry = None, None, None
    if entry is None or not all(t.is_contiguous() for t in args):
        spec, device = bind(kernel, args, kwargs, describe)
        if entry is None:
            plan = build_plan(kernel, spec, device)
            entry = (plan, _fast_launcher(plan, sig) if sig is not None else None)
            if key is not None:
                state.remember(key, entry)
    else:
        state.plans.move_to_end(key)
    plan, fast = entry
    if fast is not None and not kwargs:
        state.use_fast(fast)
    return plan, fast


def make_launcher() -> Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]:
    """A kernel's torch launcher ``launch(kernel, args, kwargs)``; its state is ``.state``.

    While torch.compile traces, a call becomes one ``pyptx::launch<n>`` op; otherwise the
    fast launchers are tried (no kwargs) before the plans, and a call with template kwargs
    launches through the fast launcher of its plan.
    """
    state = LaunchState()
    fast = state.fast
    is_compiling = torch.compiler.is_compiling

    def launch(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if is_compiling():
            from .compiled import compiled_call

            return compiled_call(kernel, args, kwargs)
        if not kwargs:
            for f in fast:
                out = f(args)
                if out is not None:
                    if f is not fast[0]:
                        state.use_fast(f)
                    return out
        plan, plan_fast = plan_for(state, kernel, args, kwargs)
        if kwargs and plan_fast is not None:  # kwargs calls skip the loop above: their launcher
            out = plan_fast(args)
            if out is not None:
                return out
        outs = run_plan(plan, args)
        return outs[0] if len(outs) == 1 else tuple(outs)

    launch.state = state  # type: ignore[attr-defined]
    return launch


def set_poison(on: bool) -> None:
    """Turn output poisoning (see ``POISON``) on or off, for the C++ fast path too."""
    global POISON
    POISON = bool(on)
    if FASTPATH is not None:
        FASTPATH.set_poison(POISON)


def native_plan(plan: Plan, sig: tuple) -> Any:
    """``plan`` as a C++ fast-path plan for inputs matching ``sig`` exactly, or None without it."""
    if FASTPATH is None:
        return None
    return FASTPATH.Plan(plan.handle, plan.index, [tuple(s) for s, _, _ in sig],
                         [d for _, d, _ in sig], [tuple(s) for s in plan.out_shapes],
                         list(plan.out_dtypes))


def _fast_launcher(plan: Plan, sig: tuple) -> Any:
    """A callable ``f(args)`` that launches ``plan`` when ``args`` match ``sig`` exactly (else None).

    The C++ plan when the fast path is built (checks, allocation, stream and
    launch in one call); otherwise a Python closure doing the same: a type,
    shape, dtype, device and contiguity check per tensor, the output
    allocation, the raw stream and the C launch.
    """
    fast = native_plan(plan, sig)
    if fast is not None or _native is None:
        return fast
    handle, index, device = plan.handle, plan.index, plan.device
    checks = tuple((shape, dtype) for shape, dtype, _ in sig)
    n = len(sig)
    # An output shaped and typed like an input is allocated with empty_like(input): the
    # cheapest allocation call torch has (the inputs are checked contiguous).
    like = tuple(next((i for i, (shape, dtype) in enumerate(checks)
                       if tuple(shape) == tuple(s) and dtype == d), None)
                 for s, d in zip(plan.out_shapes, plan.out_dtypes))
    outs_spec = tuple(zip(plan.out_shapes, plan.out_dtypes, like))
    single = len(outs_spec) == 1
    launch, empty, empty_like = _native.launch, torch.empty, torch.empty_like
    raw, cur = _raw_stream, _current_device
    is_compiling, Tensor = torch.compiler.is_compiling, torch.Tensor

    def fast(args: tuple) -> Any:
        if len(args) != n or POISON or is_compiling():
            return None
        for t, (shape, dtype) in zip(args, checks):
            if (t.__class__ is not Tensor or t.shape != shape or t.dtype is not dtype
                    or t.get_device() != index or not t.is_contiguous()):
                return None
        if cur() != index:
            return None
        outs = [empty(s, dtype=d, device=device) if i is None else empty_like(args[i])
                for s, d, i in outs_spec]
        try:
            launch(handle, raw(index), *[t.data_ptr() for t in args],
                   *[o.data_ptr() for o in outs])
        except RuntimeError as e:
            raise LaunchError(str(e)) from None
        return outs[0] if single else tuple(outs)

    return fast


def _raw_stream_fn() -> Any:
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


_raw_stream = _raw_stream_fn()
if FASTPATH is not None:
    FASTPATH.set_poison(POISON)
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def run_plan(plan: Plan, args: Sequence[Any]) -> list[torch.Tensor]:
    """Allocate the outputs and launch on the current stream of the plan's device."""
    device = plan.device
    outs = [torch.empty(s, dtype=d, device=device) for s, d in zip(plan.out_shapes, plan.out_dtypes)]
    if POISON:
        for o in outs:
            if o.is_floating_point():
                o.fill_(float("nan"))
            else:
                o.view(torch.uint8).fill_(0xFF)
    index = plan.index
    try:
        if _current_device() == index:
            _native.launch(plan.handle, _raw_stream(index), *[t.data_ptr() for t in args],
                           *[o.data_ptr() for o in outs])
        else:
            with torch.cuda.device(index):
                _native.launch(plan.handle, _raw_stream(index), *[t.data_ptr() for t in args],
                               *[o.data_ptr() for o in outs])
    except RuntimeError as e:
        raise LaunchError(str(e)) from None
    return outs


def call_kernel_via_torch(
    *inputs: Any,
    cubin_handle: int,
    out_specs: Sequence[Tile],
    out_shape_env: dict[str, int],
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    cluster: tuple[int, int, int] = (1, 1, 1),
    smem_bytes: int = 0,
) -> Any:
    """Launch a kernel already registered under ``cubin_handle`` on torch tensors.

    Allocates the outputs (``out_specs`` resolved with ``out_shape_env``) on the
    first input's device, passes device pointers inputs-then-outputs, launches
    on the current stream and returns the output(s). The geometry given must be the
    one registered under the handle (``LaunchError`` otherwise).
    """
    shim()
    check_registered_geometry(cubin_handle, grid, block, cluster, smem_bytes)
    if not inputs or not isinstance(inputs[0], torch.Tensor):
        raise SpecError(f"{where()}: call_kernel_via_torch needs torch tensor inputs")
    device = inputs[0].device
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor) or t.device != device or not t.is_contiguous():
            raise SpecError(f"{where()}: input {i} must be a contiguous tensor on {device}")
    shapes = tuple(s.resolve(out_shape_env, "output") for s in out_specs)
    dtypes = tuple(torch_dtype_of(s.dtype) for s in out_specs)
    if device.index is None:
        device = torch.device("cuda", _current_device())
    plan = Plan(cubin_handle, device, shapes, dtypes, None)
    outs = run_plan(plan, inputs)
    return outs[0] if len(outs) == 1 else tuple(outs)
