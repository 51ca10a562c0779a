"""``ptx.tma``: the device side of the Tensor Memory Accelerator and bulk copies (sm_90).

Tile copies go through a 128-byte ``CUtensorMap`` made on the host. The
``tensor_map`` argument of these helpers is either

* a u64 register holding the tensor map's generic address (for example the
  pointer of a 128-byte tensor from ``ptx.global_ptrs``), used as is, or
* a kernel parameter declared ``.param .align 64 .b8 name[128]`` (the
  ``__grid_constant__`` pattern): its generic address is taken first with
  ``mov.u64`` + ``cvta.param.u64`` (two extra instructions per call; call
  ``tensormap_ptr`` once to hoist them).

Loads complete on an mbarrier (``ptx.mbarrier.arrive_expect_tx`` the tile's
bytes first); stores and ``store_bulk`` complete through bulk groups
(``commit_group`` then ``wait_group``). Shared-memory tiles must be 128-byte
aligned (``smem.alloc(..., align=128)``, 1024 for 128-byte swizzle).

Every helper takes ``pred=p`` (or ``~p``) and guards each instruction it emits
with ``@p`` / ``@!p`` (the tensor-map address instructions of a parameter
included). All need sm_90 except ``cache_policy`` (sm_80) and ``tensormap_ptr``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import OperandError
from ..reg import Reg, render
from ..source import where
from ..trace import Trace, current
from ..types import b64, u64
from ._operands import (
    global_addr,
    guard,
    int_in,
    is_int,
    reg_of,
    require_arch,
    shared_addr,
    u32_or_imm,
)

__all__ = ["load_tile", "prefetch_tile", "store_tile", "reduce_tile", "commit_group", "wait_group",
           "prefetch_tensormap", "tensormap_ptr", "copy_bulk", "store_bulk", "cache_policy"]

REDUCE_OPS = ("add", "min", "max", "inc", "dec", "and", "or", "xor")
TENSORMAP_BYTES = 128
TILE_ALIGN = 128
BULK_ALIGN = 16


def _param_name(tmap: Any, fn: str, trace: Trace) -> str:
    """The name of a 128-byte tensor-map kernel parameter, or an OperandError."""
    if isinstance(tmap, str):
        name = tmap
    elif hasattr(tmap, "__ptx_operand__"):
        name = render(tmap, None, trace)
    else:
        raise OperandError(
            f"{where()}: {fn} tensor_map must be a u64 register holding the tensor map's address "
            f"or a 128-byte tensor-map kernel parameter, got {tmap!r}"
        )
    for p in trace.func.params:
        if p.name == name:
            if p.type.bits == 8 and p.count == TENSORMAP_BYTES:
                return name
            raise OperandError(
                f"{where()}: {fn} tensor_map parameter {name} is declared {p.text()!r}, not a "
                f"128-byte tensor map (.param .align 64 .b8 {name}[128]); for a pointer to a "
                "tensor map in global memory pass the register from ptx.global_ptrs"
            )
    raise OperandError(f"{where()}: {fn} tensor_map {name!r} is not a parameter of this kernel")


def tensormap_ptr(tensor_map: Any, *, pred: Any = None) -> Reg:
    """Generic address of a tensor-map parameter: ``mov.u64`` + ``cvta.param.u64``.

    A u64 register is returned unchanged (no instruction).
    """
    fn = "ptx.tma.tensormap_ptr"
    trace = current()
    return _tmap_reg(tensor_map, fn, trace, guard(pred, fn, trace))


def _tmap_reg(tmap: Any, fn: str, trace: Trace, g: str | None = None) -> Reg:
    if type(tmap) is Reg:
        reg_of(tmap, "tensor_map", fn, (64,), "a 64-bit register holding the tensor map's address")
        render(tmap, None, trace)  # ownership check
        return tmap
    name = _param_name(tmap, fn, trace)
    raw = Reg(trace.new_reg_name(u64), u64, trace)
    gen = Reg(trace.new_reg_name(u64), u64, trace)
    trace.inst("mov.u64", (raw.name, name), g)
    trace.inst("cvta.param.u64", (gen.name, raw.name), g)
    return gen


def _coords(coords: Any, fn: str, trace: Trace) -> tuple[int, str]:
    if type(coords) is Reg or is_int(coords):
        coords = (coords,)
    if not isinstance(coords, Sequence) or isinstance(coords, str):
        raise OperandError(
            f"{where()}: {fn} coords must be 1 to 5 s32 registers or ints, got {coords!r}"
        )
    n = len(coords)
    if not 1 <= n <= 5:
        raise OperandError(f"{where()}: {fn} takes 1 to 5 tensor coordinates, got {n}")
    parts = []
    for i, c in enumerate(coords):
        if type(c) is Reg:
            reg_of(c, f"coords[{i}]", fn, (32,), "a 32-bit integer register (s32/u32/b32)")
            parts.append(render(c, None, trace))
        elif is_int(c):
            parts.append(str(int_in(c, f"coords[{i}]", fn, -(1 << 31), (1 << 31) - 1)))
        else:
            raise OperandError(f"{where()}: {fn} coords[{i}] must be an s32 register or an int, got {c!r}")
    return n, "{" + ", ".join(parts) + "}"


def _mask(mask: Any, fn: str, trace: Trace) -> str:
    if type(mask) is Reg:
        reg_of(mask, "multicast_mask", fn, (16,), "a 16-bit register (u16/b16) or an int")
        return render(mask, None, trace)
    return str(int_in(mask, "multicast_mask", fn, 1, 0xFFFF, " (one bit per CTA rank)"))


def _hint(hint: Any, fn: str, trace: Trace) -> str:
    if type(hint) is not Reg:
        raise OperandError(
            f"{where()}: {fn} cache_hint must be a 64-bit cache-policy register "
            f"(ptx.tma.cache_policy), got {hint!r}"
        )
    reg_of(hint, "cache_hint", fn, (64,), "a 64-bit cache-policy register (ptx.tma.cache_policy)")
    return render(hint, None, trace)


def _bar(bar: Any, fn: str, trace: Trace) -> str:
    return shared_addr(bar, "bar", fn, trace, align=8, size=8)


def load_tile(dst_smem: Any, tensor_map: Any, coords: Any, bar: Any, *,
              multicast_mask: int | Reg | None = None, cache_hint: Reg | None = None,
              pred: Any = None) -> None:
    """TMA tile load global -> shared, completing ``tile bytes`` on mbarrier ``bar``.

    ``cp.async.bulk.tensor.{N}d.shared::cluster.global.mbarrier::complete_tx::bytes
    [dst], [tmap, {coords}], [bar];`` where N = len(coords) (1..5; s32 registers or
    ints, innermost dimension first). ``multicast_mask`` (16-bit register or int)
    adds ``.multicast::cluster`` and delivers the tile (and its bytes) to the same
    offsets in every CTA whose rank bit is set; ``cache_hint`` (a policy register
    from ``cache_policy``) adds ``.L2::cache_hint``.
    """
    fn = "ptx.tma.load_tile"
    trace = current()
    require_arch(trace, fn)
    g = guard(pred, fn, trace)
    dst = shared_addr(dst_smem, "dst_smem", fn, trace, align=TILE_ALIGN)
    tmap = _tmap_reg(tensor_map, fn, trace, g)
    n, vec = _coords(coords, fn, trace)
    b = _bar(bar, fn, trace)
    ops = [dst, f"[{tmap.name}, {vec}]", b]
    opcode = f"cp.async.bulk.tensor.{n}d.shared::cluster.global.mbarrier::complete_tx::bytes"
    if multicast_mask is not None:
        opcode += ".multicast::cluster"
        ops.append(_mask(multicast_mask, fn, trace))
    if cache_hint is not None:
        opcode += ".L2::cache_hint"
        ops.append(_hint(cache_hint, fn, trace))
    trace.inst(opcode, tuple(ops), g)


def prefetch_tile(tensor_map: Any, coords: Any, *, cache_hint: Reg | None = None,
                  pred: Any = None) -> None:
    """Prefetch the tile a ``load_tile`` at ``coords`` would copy into L2 (a hint: no
    shared memory, no mbarrier, nothing to wait for; out-of-bounds parts are skipped).

    ``cp.async.bulk.prefetch.tensor.{N}d.L2.global.tile [tmap, {coords}];`` (N =
    len(coords), 1..5); ``cache_hint`` adds ``.L2::cache_hint`` and its policy register.
    """
    fn = "ptx.tma.prefetch_tile"
    trace = current()
    require_arch(trace, fn)
    g = guard(pred, fn, trace)
    tmap = _tmap_reg(tensor_map, fn, trace, g)
    n, vec = _coords(coords, fn, trace)
    ops = [f"[{tmap.name}, {vec}]"]
    opcode = f"cp.async.bulk.prefetch.tensor.{n}d.L2.global.tile"
    if cache_hint is not None:
        opcode += ".L2::cache_hint"
        ops.append(_hint(cache_hint, fn, trace))
    trace.inst(opcode, tuple(ops), g)


def store_tile(tensor_map: Any, coords: Any, src_smem: Any, *, cache_hint: Reg | None = None,
               pred: Any = None) -> None:
    """TMA tile store shared -> global, tracked by the bulk group.

    ``cp.async.bulk.tensor.{N}d.global.shared::cta.bulk_group [tmap, {coords}], [src];``.
    Make the shared writes visible first (``ptx.fence_proxy_async()``), then
    ``commit_group()`` and ``wait_group(0)`` before reusing ``src_smem``.
    """
    _tile_to_global("ptx.tma.store_tile", "cp.async.bulk.tensor.{n}d.global.shared::cta.bulk_group",
                    tensor_map, coords, src_smem, cache_hint, pred)


def reduce_tile(tensor_map: Any, coords: Any, src_smem: Any, *, op: str = "add",
                cache_hint: Reg | None = None, pred: Any = None) -> None:
    """TMA tile reduction shared -> global: each element of the global box becomes
    ``global op shared`` (atomically per element), tracked by the bulk group.

    ``cp.reduce.async.bulk.tensor.{N}d.global.shared::cta.{op}.tile.bulk_group
    [tmap, {coords}], [src];`` with ``op`` one of ``REDUCE_OPS``; the element type is the
    tensor map's (``add`` on f32 accumulates partial sums, e.g. one dQ tile per block of an
    attention backward). Same protocol as ``store_tile``: ``ptx.fence_proxy_async()``
    before, ``commit_group()`` and ``wait_group`` before reusing ``src_smem``.
    """
    fn = "ptx.tma.reduce_tile"
    if op not in REDUCE_OPS:
        raise OperandError(f"{where()}: {fn} op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
    _tile_to_global(fn, f"cp.reduce.async.bulk.tensor.{{n}}d.global.shared::cta.{op}.tile.bulk_group",
                    tensor_map, coords, src_smem, cache_hint, pred)


def _tile_to_global(fn: str, opcode: str, tensor_map: Any, coords: Any, src_smem: Any,
                    cache_hint: Reg | None, pred: Any) -> None:
    """Emit a shared -> global tile instruction ``opcode`` (``{n}`` = the coordinate count):
    ``[tmap, {coords}], [src]`` with the optional L2 hint."""
    trace = current()
    require_arch(trace, fn)
    g = guard(pred, fn, trace)
    tmap = _tmap_reg(tensor_map, fn, trace, g)
    n, vec = _coords(coords, fn, trace)
    src = shared_addr(src_smem, "src_smem", fn, trace, align=TILE_ALIGN)
    ops = [f"[{tmap.name}, {vec}]", src]
    opcode = opcode.format(n=n)
    if cache_hint is not None:
        opcode += ".L2::cache_hint"
        ops.append(_hint(cache_hint, fn, trace))
    trace.inst(opcode, tuple(ops), g)


def commit_group(*, pred: Any = None) -> None:
    """``cp.async.bulk.commit_group;``: close the current bulk group of stores."""
    fn = "ptx.tma.commit_group"
    trace = current()
    require_arch(trace, fn)
    trace.inst("cp.async.bulk.commit_group", (), guard(pred, fn, trace))


def wait_group(n: int = 0, *, read: bool = True, pred: Any = None) -> None:
    """``cp.async.bulk.wait_group{.read} n;``: wait until at most ``n`` bulk groups are pending.

    ``read=True`` only waits until the sources have been read (the shared buffer may be
    reused); ``read=False`` waits for the writes to complete.
    """
    fn = "ptx.tma.wait_group"
    trace = current()
    require_arch(trace, fn)
    if not is_int(n) or n < 0:
        raise OperandError(f"{where()}: ptx.tma.wait_group n must be a non-negative int, got {n!r}")
    if not isinstance(read, bool):
        raise OperandError(f"{where()}: ptx.tma.wait_group read must be True or False, got {read!r}")
    trace.inst("cp.async.bulk.wait_group.read" if read else "cp.async.bulk.wait_group", (str(n),),
               guard(pred, fn, trace))


def prefetch_tensormap(tensor_map: Any, *, pred: Any = None) -> None:
    """Prefetch a tensor map into the descriptor cache.

    A parameter gives ``prefetch.param.tensormap [name];``, a u64 register
    ``prefetch.tensormap [reg];``.
    """
    fn = "ptx.tma.prefetch_tensormap"
    trace = current()
    require_arch(trace, fn)
    g = guard(pred, fn, trace)
    if type(tensor_map) is Reg:
        reg_of(tensor_map, "tensor_map", fn, (64,), "a 64-bit register holding the tensor map's address")
        trace.inst("prefetch.tensormap", (f"[{render(tensor_map, None, trace)}]",), g)
        return
    name = _param_name(tensor_map, fn, trace)
    trace.inst("prefetch.param.tensormap", (f"[{name}]",), g)


def _size(size: Any, fn: str, trace: Trace) -> str:
    if is_int(size) and size > 0 and size % BULK_ALIGN:
        raise OperandError(f"{where()}: {fn} size must be a multiple of 16 bytes, got {size}")
    return u32_or_imm(size, "size", fn, trace, 16, 0xFFFFFFF0, " (bytes, a multiple of 16)")


def copy_bulk(dst_smem: Any, src_global: Any, size: int | Reg, bar: Any, *,
              multicast_mask: int | Reg | None = None, cache_hint: Reg | None = None,
              pred: Any = None) -> None:
    """Plain bulk copy global -> shared of ``size`` bytes, completing on mbarrier ``bar``.

    ``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], size, [bar];``
    (``size`` a multiple of 16; both addresses 16-byte aligned), with the same
    ``multicast_mask`` / ``cache_hint`` options as ``load_tile``.
    """
    fn = "ptx.tma.copy_bulk"
    trace = current()
    require_arch(trace, fn)
    dst = shared_addr(dst_smem, "dst_smem", fn, trace, align=BULK_ALIGN)
    src = global_addr(src_global, "src_global", fn, trace)
    sz = _size(size, fn, trace)
    b = _bar(bar, fn, trace)
    ops = [dst, src, sz, b]
    opcode = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
    if multicast_mask is not None:
        opcode += ".multicast::cluster"
        ops.append(_mask(multicast_mask, fn, trace))
    if cache_hint is not None:
        opcode += ".L2::cache_hint"
        ops.append(_hint(cache_hint, fn, trace))
    trace.inst(opcode, tuple(ops), guard(pred, fn, trace))


def store_bulk(dst_global: Any, src_smem: Any, size: int | Reg, *, cache_hint: Reg | None = None,
               pred: Any = None) -> None:
    """Plain bulk copy shared -> global, tracked by the bulk group.

    ``cp.async.bulk.global.shared::cta.bulk_group [dst], [src], size;``.
    """
    fn = "ptx.tma.store_bulk"
    trace = current()
    require_arch(trace, fn)
    dst = global_addr(dst_global, "dst_global", fn, trace)
    src = shared_addr(src_smem, "src_smem", fn, trace, align=BULK_ALIGN)
    sz = _size(size, fn, trace)
    ops = [dst, src, sz]
    opcode = "cp.async.bulk.global.shared::cta.bulk_group"
    if cache_hint is not None:
        opcode += ".L2::cache_hint"
        ops.append(_hint(cache_hint, fn, trace))
    trace.inst(opcode, tuple(ops), guard(pred, fn, trace))


_EVICT = ("first", "last", "normal", "unchanged")


def cache_policy(evict: str = "last", fraction: float = 1.0, *, pred: Any = None) -> Reg:
    """An L2 cache policy for ``cache_hint=``: ``createpolicy.fractional.L2::evict_<evict>.b64``.

    ``evict`` is 'first', 'last', 'normal' or 'unchanged'; ``fraction`` (0 < f <= 1)
    of the accesses get that priority.
    """
    fn = "ptx.tma.cache_policy"
    trace = current()
    require_arch(trace, fn, 80)
    if evict not in _EVICT:
        raise OperandError(f"{where()}: ptx.tma.cache_policy evict must be one of {_EVICT}, got {evict!r}")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise OperandError(
            f"{where()}: ptx.tma.cache_policy fraction must be a number in (0, 1], got {fraction!r}"
        )
    g = guard(pred, fn, trace)
    r = Reg(trace.new_reg_name(b64), b64, trace)
    trace.inst(f"createpolicy.fractional.L2::evict_{evict}.b64",
               (r.name, render(float(fraction), None, trace)), g)
    return r
