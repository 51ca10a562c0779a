"""``torch.compile`` support: kernels become opaque ``torch.library.custom_op`` calls.

A kernel called while Dynamo traces goes through ``pyptx::launch``, one op for
every kernel (``pyptx::launch1`` .. ``launch4`` for a single-output kernel of one to
four tensors): its arguments are the input tensors and strings naming the
variant. The op's fake implementation derives the output shapes, so tracing
needs no GPU work; the real implementation is the eager launch.

What names the variant depends on the tracer. Under Dynamo (``torch.compile``)
it is the kernel's process-local uid and the template kwargs: Dynamo cannot run
the kernel tracer, and a compiled function lives in one process. Under the other
tracers (``torch.export``, non-strict, its default; ``make_fx``) the call is
specialized right away and the variant is ``sha:<content hash>`` of its compiled
record, written to the disk cache: a saved program then finds the kernel in any
process (``pyptx_torch.compiled`` must be imported there to define the ops).

``get_or_register_torch_op`` gives the spec's per-handle op for kernels
registered by hand.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from typing import Any

import torch

from pyptx.errors import LaunchError, SpecError
from pyptx.kernel import kernel_by_uid
from pyptx.launch import check_registered_geometry
from pyptx.plan import PlanCache, bind, check_record_args, check_record_device, ordinal_of
from pyptx.registry import find_record, persist, record_for
from pyptx.source import where
from pyptx.specs import Dim, Tile
from pyptx.types import from_name

from . import direct as _direct
from .dtypes import torch_dtype_of
from .eager import Plan, _fast_launcher, describe, plan_for, run_plan
from .fastpath import FASTPATH

__all__ = ["compiled_call", "get_or_register_torch_op", "call_kernel_via_torch_compile"]

_handle_ops: dict[int, Any] = {}


def _is_literal(value: Any) -> bool:
    """A value ``ast.literal_eval`` reads back from its repr (plain checks Dynamo can trace)."""
    if isinstance(value, tuple):
        return all(_is_literal(v) for v in value)
    if type(value) is float:
        return math.isfinite(value)
    return value is None or type(value) in (int, bool, str)


def _kwargs_key(kwargs: dict[str, Any]) -> str:
    """Template kwargs as a literal string (the op schema takes only plain values)."""
    if not kwargs:
        return ""
    items = tuple(sorted(kwargs.items()))
    if not _is_literal(items):
        raise SpecError(
            f"{where()}: under torch.compile, template parameters must be Python literals "
            f"(int, finite float, bool, str, None, tuples of them); got {kwargs!r}"
        )
    return repr(items)


def _variant(uid: str, key: str) -> tuple[Any, dict[str, Any]]:
    try:
        kernel = kernel_by_uid(uid)
    except KeyError:
        raise LaunchError(
            f"{where()}: no live pyptx kernel is called {uid!r} in this process: graphs traced by "
            "Dynamo (torch.compile, strict torch.export) name kernels by a process-local uid; "
            "save programs with torch.export's default non-strict mode, which names them by "
            "content hash"
        ) from None
    return kernel, dict(ast.literal_eval(key)) if key else {}


def _fake_outputs(kernel: Any, kwargs: dict[str, Any], inputs: Sequence[torch.Tensor]) -> list:
    env: dict[str, Any] = {k: v for k, v in kwargs.items() if k in kernel.dims}
    for spec, t in zip(kernel.in_specs, inputs):
        for d, n in zip(spec.dims, t.shape):
            if isinstance(d, Dim):
                env.setdefault(d.name, n)
    device = inputs[0].device
    outs = []
    for spec in kernel.out_specs:
        shape = [env[d.name] if isinstance(d, Dim) else d for d in spec.dims]
        outs.append(torch.empty(shape, dtype=torch_dtype_of(spec.dtype), device=device))
    return outs


#: Prefix of a variant naming a compiled record by its content hash.
HASH_PREFIX = "sha:"
#: (content hash, input signature) -> (Plan, fast launcher) of records found by hash (an LRU).
_hash_plans = PlanCache()
#: (kernel, kwargs) -> {(handle, device): record} of the C++ plans bound to that op variant
#: (as many as the extension keeps, oldest first): a bound plan launches by handle, so its
#: record (and shim config) must live while the plan is bound.
_bound_records: dict[tuple[str, str], dict[tuple[int, int], Any]] = {}


def _record_of(key: str) -> Any:
    rec = find_record(key)
    if rec is None:
        from pyptx import cache

        raise LaunchError(
            f"{where()}: no pyptx kernel with content hash {key} is loaded in this process or "
            f"saved in the disk cache ({cache.cache_dir() or 'off: PYPTX_CACHE_DIR'}); the "
            "program that names it was saved where another cache was in use"
        )
    return rec


def hash_variant(kernel: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """``sha:<content hash>`` of ``kernel`` specialized for ``args`` (checked like an eager
    call), its record written to the disk cache; None when a shape is symbolic."""
    if not all(isinstance(d, int) for t in args if isinstance(t, torch.Tensor) for d in t.shape):
        return None
    spec, _ = bind(kernel, args, kwargs, describe)
    rec = record_for(spec)
    persist(rec)
    return HASH_PREFIX + rec.key


def _hash_plan(key: str, args: tuple[torch.Tensor, ...]) -> tuple[Plan, Any]:
    """The plan of the record with content hash ``key`` for ``args`` (checked against the
    shapes and dtypes it was built for), loaded on their device on first use."""
    sig = tuple((t.shape, t.dtype, t.device) for t in args)
    hit = _hash_plans.hit((key, sig))
    if hit is not None and all(t.is_contiguous() for t in args):
        return hit
    rec = _record_of(key)
    infos = check_record_args(rec, args, describe)
    idx = ordinal_of(infos[0].device) if infos else torch.cuda.current_device()
    with torch.cuda.device(idx):
        torch.cuda.init()
        check_record_device(rec, idx)
        rec.function(idx)
    out_dtypes = tuple(torch_dtype_of(from_name(t)) for t in rec.out_types)
    plan = Plan(rec.handle, torch.device("cuda", idx), rec.out_shapes, out_dtypes, None, rec)
    hit = (plan, _fast_launcher(plan, sig))
    _hash_plans.keep((key, sig), hit)
    return hit


def _launch_impl(inputs: list[torch.Tensor], kernel: str, kwargs: str) -> list[torch.Tensor]:
    args = tuple(inputs)
    if kernel.startswith(HASH_PREFIX):
        plan, fast = _hash_plan(kernel[len(HASH_PREFIX):], args)
    else:
        k, kw = _variant(kernel, kwargs)
        plan, fast = plan_for(k.launcher("torch").state, k, args, kw)
    out = fast(args) if fast is not None else None
    if out is None:
        out = run_plan(plan, args)
    if FASTPATH is not None and isinstance(fast, FASTPATH.Plan):
        _bind(kernel, kwargs, plan, fast)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _bind(kernel: str, kwargs: str, plan: Plan, fast: Any) -> None:
    """Hand ``fast`` to the op's C++ kernel: every later call of this variant with the same
    input signature launches there, without coming back to Python."""
    FASTPATH.bind(kernel, kwargs, fast)
    kept = _bound_records.setdefault((kernel, kwargs), {})
    kept.pop((plan.handle, plan.index), None)
    kept[(plan.handle, plan.index)] = plan.record
    # the plans the extension dropped (a build older than per-signature plans keeps one)
    while len(kept) > getattr(FASTPATH, "PLANS_PER_VARIANT", 1):
        del kept[next(iter(kept))]


def _launch_fake(inputs: list[torch.Tensor], kernel: str, kwargs: str) -> list[torch.Tensor]:
    if kernel.startswith(HASH_PREFIX):
        rec = _record_of(kernel[len(HASH_PREFIX):])
        device = inputs[0].device
        return [torch.empty(s, dtype=torch_dtype_of(from_name(t)), device=device)
                for s, t in zip(rec.out_shapes, rec.out_types)]
    k, kw = _variant(kernel, kwargs)
    return _fake_outputs(k, kw, inputs)


# A plain library op (not custom_op): the compiled graph calls straight into the
# CUDA implementation, without custom_op's Python wrapper layers on every call.
_lib = torch.library.Library("pyptx", "FRAGMENT")
_lib.define("launch(Tensor[] inputs, str kernel, str kwargs) -> Tensor[]")
if FASTPATH is None:
    _lib.impl("launch", _launch_impl, "CUDA")
else:  # the extension registered the CUDA kernel; it calls back here when no plan matches
    FASTPATH.set_fallback(_launch_impl)
_lib.impl("launch", _launch_impl, "CPU")  # so CPU tensors get pyptx's error, not the dispatcher's
torch.library.register_fake("pyptx::launch", _launch_fake, lib=_lib)

#: A single-output kernel of 1..MAX_FIXED tensor arguments goes through
#: ``pyptx::launch<n>(Tensor t0, ..., str variant) -> Tensor`` instead: a fixed argument list
#: and one Tensor back cost less per call on torch's Python->op path (what inductor's
#: wrapper calls) than a Tensor[] and a list (a CPU study of op schemas, session 5).
#: ``variant`` is the kernel's uid, then ``|`` and the kwargs key if there is one.
MAX_FIXED = 4


def _split(variant: str) -> tuple[str, str]:
    uid, _, key = variant.partition("|")
    return uid, key


def _fixed_impl(*args: Any) -> torch.Tensor:
    *inputs, variant = args
    (out,) = _launch_impl(list(inputs), *_split(variant))
    return out


def _fixed_fake(*args: Any) -> torch.Tensor:
    # a graph is being traced (dynamo runs fake kernels as plain Python): the time to
    # register inductor's lowerings, which an eager process never pays for
    _direct.ensure_lowerings(MAX_FIXED)
    *inputs, variant = args
    (out,) = _launch_fake(list(inputs), *_split(variant))
    return out


for _n in range(1, MAX_FIXED + 1):
    _lib.define(f"launch{_n}({', '.join(f'Tensor t{i}' for i in range(_n))}, str variant) -> Tensor")
    if FASTPATH is None:
        _lib.impl(f"launch{_n}", _fixed_impl, "CUDA")
    _lib.impl(f"launch{_n}", _fixed_impl, "CPU")
    torch.library.register_fake(f"pyptx::launch{_n}", _fixed_fake, lib=_lib)
_FIXED = (None, *(getattr(torch.ops.pyptx, f"launch{n}") for n in range(1, MAX_FIXED + 1)))
_direct.expose()


def compiled_call(kernel: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``kernel(*args)`` as one ``pyptx::launch<n>`` op (one output, at most ``MAX_FIXED``
    tensor arguments) or ``pyptx::launch`` op (what the tracer records)."""
    name = None if torch.compiler.is_dynamo_compiling() else hash_variant(kernel, args, kwargs)
    if name is None:
        name, key = kernel.uid, _kwargs_key(kwargs)
    else:
        key = ""  # the content hash covers the template kwargs
    if len(kernel.out_specs) == 1 and 0 < len(args) <= MAX_FIXED:
        return _FIXED[len(args)](*args, f"{name}|{key}" if key else name)
    outs = torch.ops.pyptx.launch(list(args), name, key)
    return outs[0] if len(outs) == 1 else tuple(outs)


def get_or_register_torch_op(
    cubin_handle: int,
    out_specs: Sequence[Tile],
    out_shape_env: dict[str, int],
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    cluster: tuple[int, int, int],
    smem_bytes: int,
):
    """Return a ``torch.library.custom_op`` taking ``(*input_tensors)`` for ``cubin_handle``.

    The first call with a handle registers ``pyptx::handle_<n>``; later calls
    reuse it. It survives ``torch.compile``/Dynamo tracing. The geometry must be
    the one registered under the handle, and a later call must describe the same
    outputs (``LaunchError`` otherwise).
    """
    check_registered_geometry(cubin_handle, grid, block, cluster, smem_bytes)
    shapes = tuple(s.resolve(out_shape_env, "output") for s in out_specs)
    dtypes = tuple(torch_dtype_of(s.dtype) for s in out_specs)
    hit = _handle_ops.get(cubin_handle)
    if hit is not None:
        op, outs = hit
        if outs != (shapes, dtypes):
            raise LaunchError(f"{where()}: the op of kernel handle {cubin_handle} returns "
                              f"{_describe(*outs)}, got out_specs for {_describe(shapes, dtypes)}")
        return op

    @torch.library.custom_op(f"pyptx::handle_{cubin_handle}", mutates_args=())
    def op_impl(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return run_plan(Plan(cubin_handle, inputs[0].device, shapes, dtypes, None), inputs)

    @op_impl.register_fake
    def _(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.empty(s, dtype=d, device=inputs[0].device) for s, d in zip(shapes, dtypes)]

    def call(*inputs: torch.Tensor) -> Any:
        outs = op_impl(list(inputs))
        return outs[0] if len(outs) == 1 else tuple(outs)

    _handle_ops[cubin_handle] = (call, (shapes, dtypes))
    return call


def _describe(shapes: Sequence[tuple[int, ...]], dtypes: Sequence[Any]) -> str:
    return ", ".join(f"{tuple(s)} {d}" for s, d in zip(shapes, dtypes)) or "nothing"


def call_kernel_via_torch_compile(
    *inputs: Any,
    cubin_handle: int,
    out_specs: Sequence[Tile],
    out_shape_env: dict[str, int],
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    cluster: tuple[int, int, int] = (1, 1, 1),
    smem_bytes: int = 0,
) -> Any:
    """``torch.compile``-compatible launch: ``call_kernel_via_torch`` inside a custom op.

    Returns a single tensor if there is one output, else a tuple.
    """
    op = get_or_register_torch_op(cubin_handle, out_specs, out_shape_env, grid, block, cluster,
                                  smem_bytes)
    return op(*inputs)
