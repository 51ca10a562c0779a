"""wgmma operand tiles: a shared-memory tile in one of the canonical layouts wgmma reads.

An ``OperandTile`` is pure geometry (no trace needed): ``mn`` rows of A (M) or B (N)
by ``k`` elements of ``dtype``, stored either **K-major** (K contiguous, the layout of
a row-major A or of ``w`` in ``x @ w.T``) or **MN-major** (M/N contiguous: a row-major
``(K, N)`` B), with a 128-, 64- or 32-byte swizzle or none. It knows

* its size and alignment (``nbytes``, ``align``),
* the matrix descriptor of every k-step (``descriptor`` / ``advance``): start address,
  leading and stride byte offsets, swizzle mode, and the ``trans`` flag wgmma needs,
* how the bulk tensor copy fills it (``tma_options`` for ``@kernel(tma=...)`` and
  ``load``, which issues the copies), and refuses a tensor map whose box or swizzle
  would fill it in another layout.

Storage: the tile is cut into *slabs* of ``width`` bytes (the swizzle span, or 16 bytes
unswizzled) along its contiguous axis. K-major: ``k*e/width`` slabs of ``mn`` rows by
``width`` bytes; MN-major: ``mn*e/width`` slabs of ``k`` rows by ``width`` bytes. One
bulk tensor copy fills one slab, which is exactly how the copy engine lays a box out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import OperandError, TmaError
from .source import where
from .trace import current
from .types import PtxType, u32, u64

if TYPE_CHECKING:  # the tracing layer, imported by the methods that emit code: the geometry
    # (sizes, tensor-map options) is read by a host that builds a kernel without tracing it
    from .reg import Reg
    from .smem import SharedArray

__all__ = ["OperandTile", "MMA_K_BYTES"]

MMA_K_BYTES = 32
"""Bytes of K one wgmma consumes per row (16 bf16/f16, 8 tf32, 32 fp8/int8)."""

_SWIZZLE_MODE = {None: 0, 128: 1, 64: 2, 32: 3}
_TMA_SWIZZLE = {None: "none", 128: "128B", 64: "64B", 32: "32B"}


def _descriptor_version(target: Any) -> int:
    """The descriptor bits that tell a tcgen05 (Blackwell) descriptor from a wgmma one."""
    if target == "wgmma":
        return 0
    if target == "tcgen05":
        return 1 << 46
    raise OperandError(f"{where()}: OperandTile descriptor target must be 'wgmma' or "
                       f"'tcgen05', got {target!r}")


class OperandTile:
    """Geometry of one wgmma operand tile in shared memory (see the module docstring).

    ``mn``: rows of the operand (M for A, N for B), a multiple of 8 (of 64 for a
    MN-major tile that two warpgroups split); ``k``: its K extent, a multiple of the
    wgmma K (``32 / element bytes``); ``major``: ``"K"`` or ``"MN"``; ``swizzle``: 128,
    64, 32 or None (bytes).
    """

    __slots__ = ("mn", "k", "dtype", "major", "swizzle", "width", "elem", "slabs",
                 "slab_bytes", "nbytes")

    def __init__(self, mn: int, k: int, dtype: PtxType, *, major: str = "K",
                 swizzle: int | None = 128) -> None:
        at = where()
        if not isinstance(dtype, PtxType) or dtype.bits not in (8, 16, 32) or dtype.is_pred:
            raise OperandError(f"{at}: OperandTile dtype must be an 8/16/32-bit element type "
                               f"such as bf16, got {dtype!r}")
        if major not in ("K", "MN"):
            raise OperandError(f"{at}: OperandTile major must be 'K' or 'MN', got {major!r}")
        if isinstance(swizzle, bool) or swizzle not in _SWIZZLE_MODE:
            raise OperandError(f"{at}: OperandTile swizzle must be 128, 64, 32 or None (bytes), "
                               f"got {swizzle!r}")
        e = dtype.bytes
        kk = MMA_K_BYTES // e
        for name, v, step in (("mn", mn, 8), ("k", k, kk)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v % step:
                raise OperandError(f"{at}: OperandTile {name} must be a positive multiple of "
                                   f"{step} for .{dtype.name}, got {v!r}")
        width = swizzle or 16
        contiguous = k if major == "K" else mn
        if contiguous * e % width:
            axis = "k" if major == "K" else "mn"
            raise OperandError(
                f"{at}: OperandTile {major}-major with swizzle {swizzle}: {axis} x {e} B = "
                f"{contiguous * e} bytes is not a multiple of the {width}-byte slab; use "
                f"{axis} a multiple of {width // e} or a narrower swizzle")
        self.mn, self.k, self.dtype, self.major, self.swizzle = mn, k, dtype, major, swizzle
        self.width = width
        self.elem = e
        self.slabs = contiguous * e // width
        self.slab_bytes = (mn if major == "K" else k) * width
        self.nbytes = self.slabs * self.slab_bytes

    # ------------------------------------------------------------------ geometry
    @property
    def align(self) -> int:
        """Shared-memory alignment the tile needs: one swizzle period (8 rows of the span)."""
        return max(128, 8 * self.width) if self.swizzle else 128

    @property
    def k_steps(self) -> int:
        """wgmma instructions along K that cover the tile."""
        return self.k * self.elem // MMA_K_BYTES

    @property
    def trans(self) -> int:
        """wgmma's transpose flag for this tile: 0 K-major, 1 MN-major."""
        return 0 if self.major == "K" else 1

    @property
    def leading_byte_offset(self) -> int:
        """The descriptor's LBO: K-major, the step between K-adjacent core matrices (unused
        when swizzled: 16); MN-major, the step between MN-adjacent swizzle atoms (the slab
        stride), or the 8-K-row step when unswizzled."""
        if self.major == "K":
            return self.slab_bytes if self.swizzle is None else 16
        return self.slab_bytes if self.swizzle else 128

    @property
    def stride_byte_offset(self) -> int:
        """The descriptor's SBO: the step between 8-row groups (K-major: of M/N rows;
        MN-major: of K rows), or between MN-adjacent core matrices when unswizzled."""
        if self.major == "MN" and self.swizzle is None:
            return self.slab_bytes
        return 8 * self.width

    def offset(self, k_step: int = 0, mn_start: int = 0) -> int:
        """Byte offset from the tile base of the operand that wgmma k-step ``k_step`` reads,
        for the sub-tile starting at row ``mn_start`` (a warpgroup's 64 rows of A)."""
        if not 0 <= k_step < self.k_steps:
            raise OperandError(f"{where()}: k_step must be in 0..{self.k_steps - 1}, got {k_step}")
        if mn_start % 8 or not 0 <= mn_start < self.mn:
            raise OperandError(f"{where()}: mn_start must be a multiple of 8 in 0..{self.mn - 1}, "
                               f"got {mn_start}")
        if self.major == "K":
            p = k_step * MMA_K_BYTES
            return (p // self.width) * self.slab_bytes + p % self.width + mn_start * self.width
        if mn_start * self.elem % self.width:
            raise OperandError(f"{where()}: an MN-major sub-tile must start on a "
                               f"{self.width // self.elem}-row slab, got mn_start={mn_start}")
        rows = MMA_K_BYTES // self.elem
        return (mn_start * self.elem // self.width) * self.slab_bytes + k_step * rows * self.width

    def descriptor_constant(self, target: str = "wgmma") -> int:
        """The descriptor's fields other than the start address (LBO, SBO, swizzle mode).

        ``target="tcgen05"``: Blackwell's shared-memory descriptor (untested on hardware),
        the same canonical layouts with the version field (bits 46-48) set to 1; its 3-bit
        swizzle field at 61-63 (128B 2, 64B 4, 32B 6) holds the same bits as wgmma's."""
        return (((self.leading_byte_offset >> 4) << 16) | ((self.stride_byte_offset >> 4) << 32)
                | (_SWIZZLE_MODE[self.swizzle] << 62)) | _descriptor_version(target)

    # ------------------------------------------------------------------ descriptors
    def descriptor(self, base: Reg | SharedArray, k_step: int = 0, mn_start: int = 0,
                   offset: int = 0, *, target: str = "wgmma") -> Reg:
        """A u64 descriptor register of ``k_step`` for the tile at shared address ``base``
        (+ ``offset`` bytes). Emits ``and.b32``/``shr.u32`` (the 14-bit start address),
        ``cvt.u64.u32`` and ``or.b64`` with the constant fields; ``mov.u32`` first for a
        shared array, ``add.u32`` first for a non-zero byte offset. ``target``: "wgmma"
        (Hopper) or "tcgen05" (Blackwell's descriptor, see ``descriptor_constant``)."""
        from .reg import Reg, render
        from .smem import SharedArray

        const = self.descriptor_constant(target)
        trace = current()
        if type(base) is SharedArray:
            base = base.addr()
        elif type(base) is not Reg or base.type.bits != 32 or not base.type.is_int:
            raise OperandError(f"{where()}: OperandTile.descriptor base must be a shared array or "
                               f"a u32 shared address register, got {base!r}")
        off = offset + self.offset(k_step, mn_start)
        a = render(base, None, trace)
        if off:
            r = Reg(trace.new_reg_name(u32), u32, trace)
            trace.inst("add.u32", (r.name, a, str(off)))
            a = r.name
        m = Reg(trace.new_reg_name(u32), u32, trace)
        trace.inst("and.b32", (m.name, a, "0x3FFFF"))
        trace.inst("shr.u32", (m.name, m.name, "4"))
        w = Reg(trace.new_reg_name(u64), u64, trace)
        trace.inst("cvt.u64.u32", (w.name, m.name))
        d = Reg(trace.new_reg_name(u64), u64, trace)
        trace.inst("or.b64", (d.name, w.name, f"0x{const:016X}"))
        return d

    def advance(self, desc: Reg, k_step: int = 0, mn_start: int = 0, offset: int = 0) -> Reg:
        """``desc`` (of k-step 0, row 0) moved to ``k_step``/``mn_start`` (+ ``offset`` bytes,
        e.g. another pipeline stage): one ``add.s64`` of ``bytes >> 4``, or ``desc`` itself."""
        from .reg import Reg, render

        trace = current()
        if type(desc) is not Reg or desc.type.bits != 64:
            raise OperandError(f"{where()}: OperandTile.advance desc must be a u64 descriptor "
                               f"register, got {desc!r}")
        off = offset + self.offset(k_step, mn_start)
        if off % 16:
            raise OperandError(f"{where()}: descriptor offsets are multiples of 16 bytes, got {off}")
        if off == 0:
            return desc
        d = Reg(trace.new_reg_name(u64), u64, trace)
        trace.inst("add.s64", (d.name, render(desc, None, trace), str(off >> 4)))
        return d

    # ------------------------------------------------------------------ bulk tensor copies
    def tma_box(self, parts: int = 1) -> tuple[int, int]:
        """The copy box, innermost (contiguous) axis first: one slab per copy, or one
        ``1/parts`` of a slab's outer extent (copies split among the CTAs of a cluster)."""
        outer = self.mn if self.major == "K" else self.k
        if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1 \
                or outer % parts or (outer // parts) % 8:
            raise OperandError(f"{where()}: parts must split the slab's {outer} rows into "
                               f"multiples of 8, got {parts!r}")
        return (self.width // self.elem, outer // parts)

    def tma_options(self, parts: int = 1) -> dict[str, Any]:
        """``@kernel(tma={name: tile.tma_options()})`` for the 2-D row-major tensor that
        fills this tile: the box in the tensor's axis order (outer, inner) and the swizzle."""
        inner, outer = self.tma_box(parts)
        return {"box": (outer, inner), "swizzle": _TMA_SWIZZLE[self.swizzle]}

    def check_tensor_map(self, params: Any, what: str = "tensor map", parts: int = 1) -> None:
        """Raise ``TmaError`` unless ``params`` (``pyptx.tma.TmaParams``) copies boxes that
        are exactly this tile's slabs (or ``1/parts`` of them), with the same swizzle."""
        from .tma import Swizzle

        want_sw = {None: Swizzle.NONE, 128: Swizzle.B128, 64: Swizzle.B64, 32: Swizzle.B32}
        inner, outer = self.tma_box(parts)
        box = tuple(params.box_dims[:2])
        if params.rank == 3 and self._fits_3d_view(params, outer):
            return
        if params.element_bytes != self.elem:
            raise TmaError(f"{where()}: {what} copies {params.element_bytes}-byte elements into "
                           f"a .{self.dtype.name} OperandTile")
        if params.swizzle is not want_sw[self.swizzle]:
            raise TmaError(f"{where()}: {what} has swizzle {params.swizzle.name}, but the "
                           f"{self.major}-major OperandTile is laid out with swizzle "
                           f"{self.swizzle}; use swizzle={_TMA_SWIZZLE[self.swizzle]!r}")
        if box != (inner, outer) or any(b != 1 for b in params.box_dims[2:]):
            raise TmaError(f"{where()}: {what} box is {list(params.box_dims)} (innermost "
                           f"first), but one {'slab' if parts == 1 else f'1/{parts} slab'} of "
                           f"this {self.mn}x{self.k} {self.major}-major OperandTile is "
                           f"[{inner}, {outer}]; use box=({outer}, {inner})")

    def _fits_3d_view(self, params: Any, outer: int) -> bool:
        """True if ``params`` is the 3-D view (``tma_params_3d``) that fills every slab of
        this K-major, 128-byte-swizzled tile (``outer`` rows each) in one copy."""
        from .tma import Swizzle

        return (self.major == "K" and self.width == 128 and params.element_bytes == self.elem
                and params.swizzle is Swizzle.B128 and 64 * self.elem == 128
                and tuple(params.box_dims) == (64, outer, self.slabs))

    def load(self, dst: Reg | SharedArray, tensor: Any, mn0: Reg | int, k0: Reg | int,
             bar: Any, *, multicast_mask: Any = None, cache_hint: Reg | None = None,
             part: tuple[Reg | int, int] | None = None, slabs: tuple[Reg | int, int] | None = None,
             map_ptr: Reg | None = None, pred: Any = None) -> None:
        """Fill the tile at shared address ``dst`` from ``tensor``'s map: one
        ``cp.async.bulk.tensor.2d`` per slab, coordinates ``(k0 + i*w, mn0)`` (K-major) or
        ``(mn0 + i*w, k0)`` (MN-major), ``w`` the slab's elements, all completing on ``bar``
        (arm it with ``nbytes`` first). ``tensor`` is the kernel's tensor parameter (its map
        is checked against the tile) or a tensor-map operand. ``part=(index, count)`` copies
        only rows ``index/count`` of every slab's outer extent, so ``count`` CTAs that
        multicast (``multicast_mask``) fill the tile together; ``slabs=(index, count)`` copies
        every ``count``-th slab starting at ``index`` instead (whole boxes). ``map_ptr``: the map's
        address hoisted out of a loop (``ptx.tma.tensormap_ptr(X.tmap)``), used instead. A
        K-major 128-byte-swizzled bf16/f16 tile whose tensor declares the 3-D view
        (``@kernel(tma={name: dict(view="3d", box=(mn, k))})``) is filled by one 3-D copy
        at coordinates ``(0, mn0, k0 / 64)``."""
        from .ptx import tma as ptma

        kw = {} if pred is None else {"pred": pred}
        tmap, boxes = self._boxes(dst, tensor, mn0, k0, part, slabs, map_ptr)
        for a, coords in boxes:
            ptma.load_tile(a, tmap, coords, bar, multicast_mask=multicast_mask,
                           cache_hint=cache_hint, **kw)

    def prefetch(self, tensor: Any, mn0: Reg | int, k0: Reg | int, *,
                 part: tuple[Reg | int, int] | None = None,
                 slabs: tuple[Reg | int, int] | None = None, map_ptr: Reg | None = None,
                 pred: Any = None) -> None:
        """Ask L2 for the boxes ``load`` with the same arguments would copy (one
        ``cp.async.bulk.prefetch.tensor`` each: a hint, nothing to wait for), e.g. k-blocks
        ahead of a ring whose stages are all in flight."""
        from .ptx import tma as ptma

        kw = {} if pred is None else {"pred": pred}
        tmap, boxes = self._boxes(None, tensor, mn0, k0, part, slabs, map_ptr)
        for _, coords in boxes:
            ptma.prefetch_tile(tmap, coords, **kw)

    def _boxes(self, dst, tensor, mn0, k0, part, slabs, map_ptr):
        """``(tensor map, boxes)``: the map operand and, lazily (each box's address math
        stays beside its copy), ``(shared address, coordinates)`` of every box a ``load``
        copies; addresses are None when ``dst`` is."""
        from .ptx.memory import Addr
        from .reg import Reg, from_
        from .smem import SharedArray

        index, count = part if part is not None else (0, 1)
        tmap = tensor
        if hasattr(tensor, "tmap_params"):
            if tensor.tmap_params is not None:
                self.check_tensor_map(tensor.tmap_params, f"tensor map of {tensor.name!r}", count)
            tmap = tensor.tmap
        if map_ptr is not None:
            tmap = map_ptr
        inner, outer = self.tma_box(count)
        row0 = index * outer  # first outer row of this part (int or register)
        drow = index * (outer * self.width) if count > 1 else 0
        if type(dst) is SharedArray:
            dst = dst.addr()
        if dst is not None and (type(drow) is Reg or drow):
            dst = dst + drow
        mn0 = mn0 + row0 if self.major == "K" and count > 1 else mn0
        k0 = k0 + row0 if self.major == "MN" and count > 1 else k0
        params = getattr(tensor, "tmap_params", None)
        if params is not None and params.rank == 3:  # the 3-D view: every slab in one copy
            chunk = k0 >> 6 if type(k0) is Reg else k0 // 64
            return tmap, iter([(dst, (0, mn0, chunk))])
        if slabs is not None:  # slab i = index + j*count for j in range(slabs // count)
            first, step = slabs
            if self.slabs % step:
                raise OperandError(f"{where()}: slabs=(index, {step}) must divide the tile's "
                                   f"{self.slabs} slabs")
            if type(first) is Reg:
                k0 = k0 + first * inner if self.major == "K" else k0
                mn0 = mn0 + first * inner if self.major == "MN" else mn0
                dst = dst + first * self.slab_bytes if dst is not None else None
                order = [j * step for j in range(self.slabs // step)]
            else:
                order = list(range(first, self.slabs, step))
        else:
            order = list(range(self.slabs))

        def boxes():
            for i in order:
                if self.major == "K":
                    coords = (k0 + i * inner if i else k0, mn0)
                else:
                    coords = (mn0 + i * inner if i else mn0, k0)
                coords = tuple(c if isinstance(c, int) or c.type.bits == 32 else from_(c, u32)
                               for c in coords)
                a = None if dst is None else (Addr(dst, i * self.slab_bytes) if i else dst)
                yield a, coords
        return tmap, boxes()

    def __repr__(self) -> str:
        return (f"OperandTile({self.mn}x{self.k} .{self.dtype.name}, {self.major}-major, "
                f"swizzle={self.swizzle}, {self.nbytes} B)")
