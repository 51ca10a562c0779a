"""Launching a ``Kernel`` on JAX arrays: argument checks, per-specialization plans.

A plan compiles the specialization once for every local GPU and registers
it with the shim under one handle (the handler picks the function of the
device XLA runs it on). Under ``jax.jit`` this happens while tracing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyptx import jit
from pyptx.errors import SpecError
from pyptx.launch import register_launch_config, register_specialization_params, shim
from pyptx.registry import get_cubin_registry
from pyptx.source import where
from pyptx.types import from_name

from . import ffi
from .ffi import call_kernel_via_ffi

__all__ = ["launch_kernel", "plan_handle"]


def check_arrays(kernel: Any, args: Sequence[Any]) -> None:
    """Validate arity, dtype and placement of ``args`` (shapes are bound by specialize)."""
    import jax

    names = kernel.arg_names
    n_in = len(kernel.in_specs)
    if len(args) != n_in:
        raise SpecError(f"{where()}: {kernel.name} takes {n_in} inputs "
                        f"({', '.join(names[:n_in])}), got {len(args)}")
    for i, (a, spec) in enumerate(zip(args, kernel.in_specs)):
        if not isinstance(a, jax.Array):
            raise SpecError(f"{where()}: argument {names[i]!r}: expected a jax array, got "
                            f"{type(a).__name__}")
        try:
            got = from_name(str(a.dtype))
        except Exception:
            got = None
        ok = got is spec.dtype or (got is not None and got.is_int and spec.dtype.is_int
                                   and got.bits == spec.dtype.bits)
        if not ok:
            raise SpecError(f"{where()}: argument {names[i]!r}: expected dtype {spec.dtype.name} "
                            f"for {spec!r}, got {a.dtype}")
        if not isinstance(a, jax.core.Tracer):
            platforms = {d.platform for d in a.devices()}
            if platforms - {"gpu", "cuda"}:
                raise SpecError(f"{where()}: argument {names[i]!r} lives on "
                                f"{', '.join(sorted(platforms))}; pyptx kernels run on GPU arrays")


def _gpu_ordinals() -> list[int]:
    import jax

    try:
        return sorted(d.local_hardware_id if d.local_hardware_id is not None else d.id
                      for d in jax.local_devices(backend="gpu"))
    except RuntimeError:
        return []


def plan_handle(kernel: Any, spec: Any) -> int:
    """The shim handle of ``spec``, compiled and registered for every local GPU on first use.

    Where there is no GPU (CPU-only lowering), the PTX is registered without a
    function so the custom call can still be lowered and inspected.
    """
    key = ("jax", tuple(sorted(spec.env.items())),
           tuple(sorted(spec.template_kwargs.items())))
    handle = kernel.runtime_cache.get(key)
    if handle is not None:
        return handle
    from pyptx import driver

    text, locs = spec.emit()
    registry = get_cubin_registry()
    ordinals = _gpu_ordinals() if driver.cuda() is not None else []
    if not ordinals:
        handle = registry.register(text, spec.name, smem_bytes=spec.smem, grid=spec.grid,
                                   block=spec.block)
        kernel.runtime_cache[key] = handle
        return handle
    native = shim()
    loaded = []
    previous = driver.call("cuCtxGetCurrent")
    try:
        for ordinal in ordinals:
            driver.ensure_context(ordinal)
            loaded.append(jit.compile_ptx_to_cubin(text, kernel.arch, spec.name, spec.smem,
                                                   locs=locs))
        fn0, _ = loaded[0]
        handle = registry.register(text, spec.name, smem_bytes=spec.smem, grid=spec.grid,
                                   block=spec.block, cu_function=fn0, module=loaded)
        n_ptrs = len(kernel.in_specs) + len(kernel.out_specs)
        register_launch_config(handle, fn0, spec.grid, spec.block, spec.cluster, spec.smem,
                               pdl=spec.pdl,
                               num_pointers=n_ptrs)
        for ordinal, (fn, _) in zip(ordinals, loaded):
            native.set_device_function(handle, ordinal, fn)
        register_specialization_params(handle, spec)
    finally:
        if int(previous):  # leave other frameworks' notion of the current device alone
            driver.call("cuCtxSetCurrent", previous)
    kernel.runtime_cache[key] = handle
    return handle


def launch_kernel(kernel: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``kernel(*args, **kwargs)`` on JAX arrays or tracers, inside or outside ``jax.jit``.

    Outside ``jit`` the call goes through a jitted wrapper cached per specialization,
    so an eager call costs one jit dispatch instead of re-staging the custom call.
    """
    import jax

    check_arrays(kernel, args)
    spec = kernel.specialize([tuple(a.shape) for a in args], **kwargs)
    handle = plan_handle(kernel, spec)

    def call(*arrays: Any) -> Any:
        return call_kernel_via_ffi(*arrays, cubin_handle=handle, out_specs=kernel.out_specs,
                                   out_shape_env=spec.env, grid=spec.grid, block=spec.block,
                                   cluster=spec.cluster, smem_bytes=spec.smem)

    if any(isinstance(a, jax.core.Tracer) for a in args):
        return call(*args)
    key = ("jax:eager", handle, id(ffi._mock))  # a test mock is baked into the trace
    jitted = kernel.runtime_cache.get(key)
    if jitted is None:
        jitted = kernel.runtime_cache[key] = jax.jit(call)
    return jitted(*args)
