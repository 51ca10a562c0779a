"""Eager launches from PyTorch: argument checks, per-specialization launch plans, the launch.

The first call with a given (shapes, dtypes, device, template kwargs)
validates everything, traces, JITs and registers the kernel with the shim,
and stores a ``Plan``; later calls look the plan up, allocate the outputs and
launch on the current stream of the inputs' device.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pyptx import jit
from pyptx.errors import LaunchError, RuntimeUnavailableError, SpecError
from pyptx.launch import register_launch_config, register_specialization_params, shim
from pyptx.registry import get_cubin_registry
from pyptx.source import where
from pyptx.specs import Tile

from .dtypes import compatible, ptx_type_of, torch_dtype_of
from .fastpath import FASTPATH

try:
    from pyptx_shim import native as _native
except ImportError:  # reported by shim() when a plan is built
    _native = None

__all__ = ["Plan", "launch_kernel", "call_kernel_via_torch", "check_tensors", "plan_for", "POISON",
           "set_poison"]

#: Fill every output with NaN (floats) or all-ones bits (ints) before the launch, so an
#: element the kernel never writes shows up. Set ``PYPTX_POISON_OUTPUTS=1`` to turn on.
#: Change it with ``set_poison`` (which also tells the C++ fast path).
POISON = os.environ.get("PYPTX_POISON_OUTPUTS", "") not in ("", "0")


@dataclass(frozen=True)
class Plan:
    """Everything a repeated launch needs: the shim handle and the outputs to allocate."""

    handle: int
    device: torch.device
    out_shapes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[Any, ...]
    spec: Any

    @property
    def index(self) -> int:
        """The CUDA device ordinal."""
        return self.device.index if self.device.index is not None else _current_device()


def check_tensors(kernel: Any, args: Sequence[Any]) -> torch.device:
    """Validate arity, type, device, layout and dtype of ``args``; return their device."""
    names = kernel.arg_names
    n_in = len(kernel.in_specs)
    if len(args) != n_in:
        raise SpecError(
            f"{where()}: {kernel.name} takes {n_in} input tensors "
            f"({', '.join(names[:n_in])}), got {len(args)}"
        )
    device = None
    for i, (t, spec) in enumerate(zip(args, kernel.in_specs)):
        name = names[i]
        if not isinstance(t, torch.Tensor):
            raise SpecError(f"{where()}: argument {name!r}: expected a torch.Tensor, got "
                            f"{type(t).__name__}")
        if t.device.type != "cuda":
            raise SpecError(f"{where()}: argument {name!r} is on {t.device}; pyptx kernels take "
                            "CUDA tensors (move it with .cuda())")
        if not compatible(spec.dtype, ptx_type_of(t.dtype)):
            raise SpecError(f"{where()}: argument {name!r}: expected dtype {spec.dtype.name} for "
                            f"{spec!r}, got {t.dtype}")
        if not t.is_contiguous():
            raise SpecError(f"{where()}: argument {name!r} is not contiguous (strides "
                            f"{tuple(t.stride())}); pass .contiguous()")
        if device is None:
            device = t.device
        elif t.device != device:
            raise SpecError(f"{where()}: argument {name!r} is on {t.device} but "
                            f"{names[0]!r} is on {device}; all tensors must share one device")
    if device is None:
        raise SpecError(f"{where()}: {kernel.name} has no tensor inputs to take a device from")
    return device


def _arch_ok(arch: str, major: int, minor: int) -> bool:
    num = int(arch[3:].rstrip("af"))
    want = (num // 10, num % 10)
    if arch.endswith(("a", "f")):
        return want == (major, minor) if arch.endswith("a") else want[0] == major and want <= (major, minor)
    return want <= (major, minor)


def build_plan(kernel: Any, spec: Any, device: torch.device) -> Plan:
    """Compile ``spec`` for ``device``, register it with the shim and return the plan."""
    from pyptx import driver

    shim()  # fail early, naming the fix, when the launcher is missing
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if driver.cuda() is None:
        raise RuntimeUnavailableError(f"cannot launch: {driver.unavailable_reason()}")
    with torch.cuda.device(idx):
        major, minor = driver.device_capability(idx)
        if not _arch_ok(kernel.arch, major, minor):
            raise LaunchError(
                f"{kernel.name} targets {kernel.arch}, but {device} is sm_{major}{minor}; "
                f"rebuild it with @kernel(arch='sm_{major}{minor}') if the code allows"
            )
        total_smem = spec.smem + spec.static_smem
        limit = driver.max_shared_per_block(idx)
        if total_smem > limit:
            raise LaunchError(
                f"{kernel.name} needs {total_smem} bytes of shared memory per block "
                f"({spec.static_smem} static + {spec.smem} dynamic); {device} allows {limit}"
            )
        torch.cuda.init()
        driver.ensure_context(idx)
        text, locs = spec.emit()
        fn, module = jit.compile_ptx_to_cubin(text, kernel.arch, spec.name, spec.smem, locs=locs)
        handle = get_cubin_registry().register(text, spec.name, smem_bytes=spec.smem,
                                               grid=spec.grid, block=spec.block,
                                               cu_function=fn, module=module)
        n_ptrs = len(kernel.in_specs) + len(kernel.out_specs)
        register_launch_config(handle, fn, spec.grid, spec.block, spec.cluster, spec.smem,
                               pdl=spec.pdl,
                               num_pointers=n_ptrs)
        register_specialization_params(handle, spec)
    out_dtypes = tuple(torch_dtype_of(s.dtype) for s in kernel.out_specs)
    return Plan(handle, torch.device("cuda", idx), spec.out_shapes, out_dtypes, spec)


def plan_for(kernel: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Plan:
    """The cached plan for these arguments (shapes, dtypes, devices, kwargs), built on first use."""
    try:
        sig = tuple((t.shape, t.dtype, t.device) for t in args)
        key = ("torch", sig, tuple(sorted(kwargs.items())))
        plan = kernel.runtime_cache.get(key)
    except (AttributeError, TypeError):
        sig, key, plan = None, None, None
    if plan is None or not all(t.is_contiguous() for t in args):
        device = check_tensors(kernel, args)
        if plan is None:
            spec = kernel.specialize([tuple(t.shape) for t in args], **kwargs)
            plan = build_plan(kernel, spec, device)
            if key is not None:
                kernel.runtime_cache[key] = plan
    if sig is not None and not kwargs:
        kernel.fast_launch = _fast_launcher(plan, sig)
    return plan


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


def launch_kernel(kernel: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Eager ``kernel(*args, **kwargs)`` on torch tensors: one tensor or a tuple of them.

    A repeat of the last call's shapes, dtypes and devices never gets here: it is
    taken by the kernel's fast launcher (``_fast_launcher``).
    """
    outs = run_plan(plan_for(kernel, args, kwargs), args)
    return outs[0] if len(outs) == 1 else tuple(outs)




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
    on the current stream and returns the output(s).
    """
    del grid, block, cluster, smem_bytes  # already registered with the shim under the handle
    shim()
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
