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
from pyptx.launch import add_scalar_param_to_shim, register_launch_config, shim
from pyptx.registry import get_cubin_registry
from pyptx.source import where
from pyptx.specs import Tile

from .dtypes import compatible, ptx_type_of, torch_dtype_of

__all__ = ["Plan", "launch_kernel", "call_kernel_via_torch", "check_tensors", "plan_for", "POISON"]

#: Fill every output with NaN (floats) or all-ones bits (ints) before the launch, so an
#: element the kernel never writes shows up. Set ``PYPTX_POISON_OUTPUTS=1`` to turn on.
POISON = os.environ.get("PYPTX_POISON_OUTPUTS", "") not in ("", "0")


@dataclass(frozen=True)
class Plan:
    """Everything a repeated launch needs: the shim handle and the outputs to allocate."""

    handle: int
    device: torch.device
    out_shapes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[Any, ...]
    spec: Any


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
                               num_pointers=n_ptrs)
        for _, t, value in spec.scalar_params:
            add_scalar_param_to_shim(handle, value, t)
    out_dtypes = tuple(torch_dtype_of(s.dtype) for s in kernel.out_specs)
    return Plan(handle, device, spec.out_shapes, out_dtypes, spec)


def plan_for(kernel: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Plan:
    """The cached plan for these arguments, building it on first use."""
    try:
        key = ("torch", tuple(t.shape for t in args), tuple(t.dtype for t in args),
               args[0].device if args else None, tuple(sorted(kwargs.items())))
        plan = kernel.runtime_cache.get(key)
    except (AttributeError, TypeError):
        key, plan = None, None
    if plan is not None:
        for t in args:
            if not t.is_contiguous():
                check_tensors(kernel, args)
        return plan
    device = check_tensors(kernel, args)
    for i, t in enumerate(args):
        if t.device != device:
            raise SpecError(f"{where()}: argument {kernel.arg_names[i]!r} is on another device")
    spec = kernel.specialize([tuple(t.shape) for t in args], **kwargs)
    plan = build_plan(kernel, spec, device)
    if key is not None:
        kernel.runtime_cache[key] = plan
    return plan


def run_plan(plan: Plan, args: Sequence[Any]) -> list[torch.Tensor]:
    """Allocate the outputs and launch on the current stream; return the outputs."""
    device = plan.device
    outs = [torch.empty(s, dtype=d, device=device) for s, d in zip(plan.out_shapes, plan.out_dtypes)]
    if POISON:
        for o in outs:
            if o.is_floating_point():
                o.fill_(float("nan"))
            else:
                o.view(torch.uint8).fill_(0xFF)
    ptrs = [t.data_ptr() for t in args] + [o.data_ptr() for o in outs]
    native = shim()
    if device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device.index):
            _launch(native, plan.handle, torch.cuda.current_stream().cuda_stream, ptrs)
    else:
        _launch(native, plan.handle, torch.cuda.current_stream(device).cuda_stream, ptrs)
    return outs


def _launch(native: Any, handle: int, stream: int, ptrs: list[int]) -> None:
    try:
        native.launch(handle, stream, *ptrs)
    except RuntimeError as e:
        raise LaunchError(str(e)) from None


def launch_kernel(kernel: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Eager ``kernel(*args, **kwargs)`` on torch tensors: one tensor or a tuple of them."""
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
    if not inputs or not isinstance(inputs[0], torch.Tensor):
        raise SpecError(f"{where()}: call_kernel_via_torch needs torch tensor inputs")
    device = inputs[0].device
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor) or t.device != device or not t.is_contiguous():
            raise SpecError(f"{where()}: input {i} must be a contiguous tensor on {device}")
    shapes = tuple(s.resolve(out_shape_env, "output") for s in out_specs)
    dtypes = tuple(torch_dtype_of(s.dtype) for s in out_specs)
    plan = Plan(cubin_handle, device, shapes, dtypes, None)
    outs = run_plan(plan, inputs)
    return outs[0] if len(outs) == 1 else tuple(outs)
