"""Argument binding and every check before a launch, shared by all runtimes.

A runtime plugin turns each of its arrays into an ``ArgInfo`` (shape, dtype
name, device, contiguity); everything else happens here, so every runtime
answers a mistake with the same error class and message: arity, argument
types, dtype mapping (one table), device placement, contiguity, one device,
shape unification (``Kernel.specialize``), the GPU's arch capability and its
shared-memory limit. ``launch_plan`` then gives the compiled record loaded on
the devices a launch will use, and the outputs to allocate.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from ._dataclass import dataclass
from .errors import LaunchError, RuntimeUnavailableError, ShapeError, SpecError
from .source import where
from .types import PtxType, from_name, numpy_name

__all__ = ["ArgInfo", "DTYPES", "ptx_type_of", "dtype_name_of", "compatible", "check_args",
           "check_placement", "bind", "check_cluster", "ordinal_of", "check_arch", "check_smem", "check_device", "LaunchPlan",
           "launch_plan", "check_record_device", "check_record_args", "PLAN_SLOTS", "PlanCache"]

#: Plans a kernel keeps per runtime by default (``PlanCache``), least recently used dropped first.
PLAN_SLOTS = 64


class PlanCache(OrderedDict):
    """One kernel's plans in one runtime (or other per-specialization state): a bounded LRU, so
    alternating shapes reuse their plans and many shapes do not pile up. Every runtime uses it."""

    def hit(self, key: Any) -> Any:
        """The value under ``key``, marked most recently used, or None."""
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def keep(self, key: Any, value: Any, slots: int = PLAN_SLOTS) -> list[Any]:
        """Store ``value`` under ``key`` as the most recent; return the values dropped to stay
        within ``slots``, oldest first."""
        self[key] = value
        self.move_to_end(key)
        dropped = []
        while len(self) > slots:
            dropped.append(self.popitem(last=False)[1])
        return dropped


@dataclass(frozen=True)
class ArgInfo:
    """What a runtime reports of one array: all the checks need."""

    shape: tuple[int, ...]
    #: The dtype's numpy-style name (``float32``, ``bfloat16``, ``bool``, ``float8_e4m3fn``).
    dtype: str
    #: ``cuda:<ordinal>`` for a GPU, the platform name otherwise (``cpu``, ``meta``); None
    #: where placement is not known yet (an array traced inside a compiled function).
    device: str | None
    #: Strides in elements when the array is not contiguous row-major; None when it is.
    strides: tuple[int, ...] | None = None


#: Framework dtype name -> PTX element type; the one table every runtime uses.
DTYPES: dict[str, PtxType] = {
    name: from_name(ptx) for name, ptx in {
        "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
        "int8": "s8", "int16": "s16", "int32": "s32", "int64": "s64",
        "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
        "bool": "u8", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2",
    }.items()
}


def ptx_type_of(dtype: str) -> PtxType | None:
    """The PTX type of a dtype name, or None if PTX has no such element type."""
    return DTYPES.get(dtype)


def dtype_name_of(t: PtxType) -> str:
    """The dtype name runtimes allocate elements of PTX type ``t`` with."""
    name = numpy_name(t)
    if name is None:
        raise SpecError(f"{where()}: no array dtype holds PTX .{t.name} elements")
    return name


def compatible(spec: PtxType, got: PtxType | None) -> bool:
    """Does an array of type ``got`` fit a Tile of type ``spec`` (same-width ints interchange)?"""
    if got is None:
        return False
    if got is spec:
        return True
    return spec.is_int and got.is_int and spec.bits == got.bits


def _type_name(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def check_args(kernel: Any, args: Sequence[Any],
               describe: Callable[[Any], ArgInfo | None], *, placement: bool = True
               ) -> list[ArgInfo]:
    """Check ``args`` against ``kernel.in_specs``; ``describe(value)`` is the runtime's view of
    one argument (None when it is not one of its arrays). Returns the infos. ``placement=False``
    leaves the devices to ``check_placement``, so that callers report the mistakes that need
    no GPU to find (dtype, contiguity, then shapes) before "is on cpu"."""
    names = kernel.arg_names
    n_in = len(kernel.in_specs)
    if len(args) != n_in:
        raise SpecError(f"{where()}: {kernel.name} takes {n_in} input tensors "
                        f"({', '.join(names[:n_in])}), got {len(args)}")
    infos = []
    for i, (value, spec) in enumerate(zip(args, kernel.in_specs)):
        name = names[i]
        info = describe(value)
        if info is None:
            raise SpecError(f"{where()}: argument {name!r}: expected an array of the same runtime "
                            f"as the other arguments, got {_type_name(value)}")
        if not compatible(spec.dtype, ptx_type_of(info.dtype)):
            raise SpecError(f"{where()}: argument {name!r}: expected dtype {spec.dtype.name} for "
                            f"{spec!r}, got {info.dtype}")
        if info.strides is not None:
            raise SpecError(f"{where()}: argument {name!r} is not contiguous (strides "
                            f"{info.strides}); pass a contiguous copy (.contiguous())")
        infos.append(info)
    if placement:
        check_placement(kernel, infos)
    return infos


def check_placement(kernel: Any, infos: Sequence[ArgInfo]) -> None:
    """``SpecError`` unless every argument whose placement is known is on one CUDA device."""
    names = kernel.arg_names
    first: tuple[str, str] | None = None
    for name, info in zip(names, infos):
        if info.device is None:
            continue
        if not info.device.startswith("cuda"):
            raise SpecError(f"{where()}: argument {name!r} is on {info.device}; pyptx kernels "
                            "take CUDA tensors and GPU arrays (move it to a CUDA device)")
        if first is None:
            first = (name, info.device)
        elif info.device != first[1]:
            raise SpecError(f"{where()}: argument {name!r} is on {info.device} but "
                            f"{first[0]!r} is on {first[1]}; all tensors must share one "
                            "device")


def bind(kernel: Any, args: Sequence[Any], kwargs: dict[str, Any],
         describe: Callable[[Any], ArgInfo | None]) -> tuple[Any, str | None]:
    """Check ``args`` and specialize ``kernel`` for their shapes and ``kwargs``:
    ``(Specialization, device)``, the device None where placement is not known. Mistakes a
    CPU can find (dtypes, contiguity, ranks and lengths) are reported before placement."""
    infos = check_args(kernel, args, describe, placement=False)
    if getattr(kernel, "arch_auto", False):  # @kernel(arch="auto"): the launching GPU's arch
        on = next((info.device for info in infos if info.device is not None), None)
        kernel.resolve_arch(ordinal_of(on) if on and on.startswith("cuda") else None)
    spec = kernel.specialize([info.shape for info in infos], **kwargs)
    check_placement(kernel, infos)
    check_cluster(kernel, spec)
    device = next((info.device for info in infos if info.device is not None), None)
    return spec, device


def check_cluster(kernel: Any, spec: Any) -> None:
    """``LaunchError`` unless every grid dim is a multiple of the cluster's."""
    if any(g % c for g, c in zip(spec.grid, spec.cluster)):
        raise LaunchError(
            f"{where()}: {kernel.name} launches grid {spec.grid} in clusters of {spec.cluster}; "
            f"every grid dim must be a multiple of the cluster dim")


def ordinal_of(device: str) -> int:
    """The ordinal of a ``cuda:<n>`` device name."""
    return int(device.partition(":")[2] or 0)


def _arch_runs_on(arch: str, capability: tuple[int, int]) -> bool:
    num = int(arch[3:].rstrip("af"))
    want = (num // 10, num % 10)
    if arch.endswith("a"):
        return want == capability
    if arch.endswith("f"):
        return want[0] == capability[0] and want <= capability
    return want <= capability


def check_arch(kernel: Any, capability: tuple[int, int], device: str) -> None:
    """``LaunchError`` unless a GPU of compute ``capability`` can run ``kernel.arch``."""
    if not _arch_runs_on(kernel.arch, tuple(capability)):
        major, minor = capability
        raise LaunchError(
            f"{where()}: {kernel.name} targets {kernel.arch}, but {device} is sm_{major}{minor}; "
            f"rebuild it with @kernel(arch='sm_{major}{minor}') if the code allows"
        )


def check_smem(kernel: Any, spec: Any, limit: int, device: str) -> None:
    """``LaunchError`` if ``spec`` needs more shared memory per block than ``limit``."""
    total = spec.smem + spec.static_smem
    if total > limit:
        raise LaunchError(
            f"{where()}: {kernel.name} needs {total} bytes of shared memory per block "
            f"({spec.static_smem} static + {spec.smem} dynamic); {device} allows {limit}"
        )


def _driver() -> Any:
    from . import driver

    if driver.cuda() is None:
        raise RuntimeUnavailableError(f"{where()}: cannot launch: {driver.unavailable_reason()}")
    return driver


def check_device(kernel: Any, spec: Any, ordinal: int) -> None:
    """Check ``spec`` against GPU ``ordinal`` (arch, shared memory); needs the driver."""
    driver = _driver()
    name = f"cuda:{ordinal}"
    check_arch(kernel, driver.device_capability(ordinal), name)
    check_smem(kernel, spec, driver.max_shared_per_block(ordinal), name)


def check_record_device(record: Any, ordinal: int) -> None:
    """``check_device`` for a record found by its hash (no ``Kernel`` at hand)."""
    driver = _driver()
    view = SimpleNamespace(name=record.kernel_name, arch=record.arch, smem=record.smem_bytes,
                           static_smem=record.static_smem)
    name = f"cuda:{ordinal}"
    check_arch(view, driver.device_capability(ordinal), name)
    check_smem(view, view, driver.max_shared_per_block(ordinal), name)


def check_record_args(record: Any, args: Sequence[Any],
                      describe: Callable[[Any], ArgInfo | None]) -> list[ArgInfo]:
    """Check ``args`` against a record found by its hash: the checks of ``check_args``, with
    the exact shapes the record was built for in place of shape binding."""
    from .specs import Tile

    view = SimpleNamespace(
        name=record.kernel_name, arg_names=record.arg_names,
        in_specs=tuple(Tile(*s, from_name(t)) for t, s in zip(record.in_types, record.in_shapes)))
    infos = check_args(view, args, describe, placement=False)
    for i, (info, want) in enumerate(zip(infos, record.in_shapes)):
        if tuple(info.shape) != tuple(want):
            raise ShapeError(f"{where()}: argument {record.arg_names[i]!r}: {record.kernel_name} "
                             f"(content hash {record.key[:12]}) was built for shape "
                             f"{tuple(want)}, got {tuple(info.shape)}")
    check_placement(view, infos)
    return infos


@dataclass(frozen=True, eq=False)
class LaunchPlan:
    """One specialization ready to launch: its compiled record (loaded on ``ordinals``) and the
    outputs to allocate (shapes and dtype names)."""

    spec: Any
    record: Any
    ordinals: tuple[int, ...]
    out_shapes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[str, ...]

    @property
    def handle(self) -> int:
        """The shim handle of the record."""
        return self.record.handle


def launch_plan(kernel: Any, spec: Any, ordinals: Sequence[int]) -> LaunchPlan:
    """Check ``spec`` against each GPU in ``ordinals`` and load its record on them (nothing is
    loaded when ``ordinals`` is empty: the record then only describes the kernel)."""
    from .registry import record_for

    out_dtypes = tuple(dtype_name_of(s.dtype) for s in kernel.out_specs)
    if ordinals:
        from .launch import shim

        shim()  # fail first, naming the fix, when the launcher is missing
    for ordinal in ordinals:
        check_device(kernel, spec, ordinal)
    record = record_for(spec)
    for ordinal in ordinals:
        record.function(ordinal)
    return LaunchPlan(spec, record, tuple(ordinals), spec.out_shapes, out_dtypes)
