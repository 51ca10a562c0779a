"""TMA descriptor synthesis: the 128-byte ``CUtensorMap`` that a tile copy reads.

``tma_params`` turns (shape, dtype, layout, box, swizzle, ...) into the exact
inputs of ``cuTensorMapEncodeTiled`` and checks every constraint the driver
documents, so a bad tile fails here with a ``TmaError`` that names the dim,
not later as ``CUDA_ERROR_INVALID_VALUE``. ``encode`` makes the one driver call
(through ``pyptx.driver``, opened only then).

The kernel takes the map by value (``.param .align 64 .b8 name[128]``) and the
shim patches its global address at every launch (``cuTensorMapReplaceAddress``),
so no device copy of the map exists: ``device_blob_ptr`` is always 0.
"""

from __future__ import annotations

import ctypes
import enum
from collections.abc import Sequence
from dataclasses import field
from typing import Any

from . import driver
from ._dataclass import dataclass
from .errors import RuntimeUnavailableError, TmaError
from .source import where
from .specs import Layout
from .types import PtxType, from_name

__all__ = ["DataType", "Interleave", "Swizzle", "L2Promotion", "OobFill", "TmaParams",
           "TensorMap", "tma_params", "tma_params_3d", "encode", "synthesize_tma_descriptor",
           "synthesize_tma_descriptor_3d", "TENSOR_MAP_BYTES"]

TENSOR_MAP_BYTES = 128
MAX_RANK = 5
MAX_BOX = 256
MAX_ELEMENT_STRIDE = 8
MAX_GLOBAL_DIM = 2**32
MAX_GLOBAL_STRIDE = 2**40  # exclusive


class DataType(enum.IntEnum):
    """``CUtensorMapDataType`` (values as in cuda.h; the packed 4/6-bit types are left out)."""

    UINT8 = 0
    UINT16 = 1
    UINT32 = 2
    INT32 = 3
    UINT64 = 4
    INT64 = 5
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BFLOAT16 = 9
    FLOAT32_FTZ = 10
    TFLOAT32 = 11
    TFLOAT32_FTZ = 12


class Interleave(enum.IntEnum):
    """``CUtensorMapInterleave``."""

    NONE = 0
    B16 = 1
    B32 = 2


class Swizzle(enum.IntEnum):
    """``CUtensorMapSwizzle``; the ``B128_ATOM_*`` modes need sm_100 and CUDA 12.8+."""

    NONE = 0
    B32 = 1
    B64 = 2
    B128 = 3
    B128_ATOM_32B = 4
    B128_ATOM_32B_FLIP_8B = 5
    B128_ATOM_64B = 6

    @property
    def span(self) -> int | None:
        """Bytes of the swizzle span (the most an inner box row may hold), None unswizzled."""
        return {Swizzle.NONE: None, Swizzle.B32: 32, Swizzle.B64: 64}.get(self, 128)


class L2Promotion(enum.IntEnum):
    """``CUtensorMapL2promotion``."""

    NONE = 0
    B64 = 1
    B128 = 2
    B256 = 3


class OobFill(enum.IntEnum):
    """``CUtensorMapFloatOOBfill``: zeros, or a NaN that asks FMA to treat it as zero."""

    NONE = 0
    NAN_REQUEST_ZERO_FMA = 1


_ELEMENT_BYTES = {
    DataType.UINT8: 1, DataType.UINT16: 2, DataType.UINT32: 4, DataType.INT32: 4,
    DataType.UINT64: 8, DataType.INT64: 8, DataType.FLOAT16: 2, DataType.FLOAT32: 4,
    DataType.FLOAT64: 8, DataType.BFLOAT16: 2, DataType.FLOAT32_FTZ: 4,
    DataType.TFLOAT32: 4, DataType.TFLOAT32_FTZ: 4,
}
_FLOAT_TYPES = frozenset({
    DataType.FLOAT16, DataType.FLOAT32, DataType.FLOAT64, DataType.BFLOAT16,
    DataType.FLOAT32_FTZ, DataType.TFLOAT32, DataType.TFLOAT32_FTZ,
})
# TMA copies bytes: signedness only matters where the driver has a type for it,
# and fp8 travels as UINT8 (the driver has no 8-bit float type).
_BY_PTX = {
    "u8": DataType.UINT8, "s8": DataType.UINT8, "b8": DataType.UINT8,
    "e4m3": DataType.UINT8, "e5m2": DataType.UINT8,
    "u16": DataType.UINT16, "s16": DataType.UINT16, "b16": DataType.UINT16,
    "u32": DataType.UINT32, "b32": DataType.UINT32, "s32": DataType.INT32,
    "u64": DataType.UINT64, "b64": DataType.UINT64, "s64": DataType.INT64,
    "f16": DataType.FLOAT16, "bf16": DataType.BFLOAT16, "tf32": DataType.TFLOAT32,
    "f32": DataType.FLOAT32, "f64": DataType.FLOAT64,
}

_SWIZZLE_NAMES = {None: Swizzle.NONE, "none": Swizzle.NONE, "32b": Swizzle.B32,
                  "64b": Swizzle.B64, "128b": Swizzle.B128}
_INTERLEAVE_NAMES = {None: Interleave.NONE, "none": Interleave.NONE, "16b": Interleave.B16,
                     "32b": Interleave.B32}
_L2_NAMES = {None: L2Promotion.NONE, "none": L2Promotion.NONE, "64b": L2Promotion.B64,
             "128b": L2Promotion.B128, "256b": L2Promotion.B256}
_OOB_NAMES = {None: OobFill.NONE, "none": OobFill.NONE, "zero": OobFill.NONE,
              "nan": OobFill.NAN_REQUEST_ZERO_FMA}


def _fail(msg: str) -> TmaError:
    return TmaError(f"{where()}: {msg}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise _fail(f"{what}: expected a sequence of ints, got {value!r}")
    for i, v in enumerate(value):
        if not _is_int(v):
            raise _fail(f"{what}[{i}]: expected an int, got {v!r}")
    return tuple(value)


def _enum(cls: type[enum.IntEnum], value: Any, what: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        raise _fail(f"{what}: expected one of {', '.join(m.name for m in cls)}, "
                    f"got {value!r}") from None


@dataclass(frozen=True, init=False)
class TmaParams:
    """Every input of ``cuTensorMapEncodeTiled`` but the address, in the driver's order
    (dim 0 is the innermost, contiguous one); checked against the driver's rules on
    construction. ``axis_names`` say, for error messages, what each dim is to the caller."""

    data_type: DataType
    rank: int
    global_dims: tuple[int, ...]
    global_strides: tuple[int, ...]  # bytes, rank - 1 of them (dim 0 is contiguous)
    box_dims: tuple[int, ...]
    element_strides: tuple[int, ...]
    interleave: Interleave = Interleave.NONE
    swizzle: Swizzle = Swizzle.NONE
    l2_promotion: L2Promotion = L2Promotion.NONE
    oob_fill: OobFill = OobFill.NONE
    axis_names: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __init__(
        self,
        data_type: DataType | int,
        rank: int,
        global_dims: Sequence[int],
        global_strides: Sequence[int],
        box_dims: Sequence[int],
        element_strides: Sequence[int],
        interleave: Interleave | int = Interleave.NONE,
        swizzle: Swizzle | int = Swizzle.NONE,
        l2_promotion: L2Promotion | int = L2Promotion.NONE,
        oob_fill: OobFill | int = OobFill.NONE,
        axis_names: Sequence[str] = (),
    ) -> None:
        s = object.__setattr__  # frozen; written here (not in a generated __init__) so
        s(self, "data_type", _enum(DataType, data_type, "data_type"))  # errors point at
        s(self, "rank", rank)  # the caller's line
        s(self, "global_dims", _ints(global_dims, "global_dims"))
        s(self, "global_strides", _ints(global_strides, "global_strides"))
        s(self, "box_dims", _ints(box_dims, "box_dims"))
        s(self, "element_strides", _ints(element_strides, "element_strides"))
        s(self, "interleave", _enum(Interleave, interleave, "interleave"))
        s(self, "swizzle", _enum(Swizzle, swizzle, "swizzle"))
        s(self, "l2_promotion", _enum(L2Promotion, l2_promotion, "l2_promotion"))
        s(self, "oob_fill", _enum(OobFill, oob_fill, "oob_fill"))
        s(self, "axis_names", tuple(axis_names))
        self._check()

    @property
    def element_bytes(self) -> int:
        """Bytes of one element of ``data_type``."""
        return _ELEMENT_BYTES[self.data_type]

    @property
    def box_bytes(self) -> int:
        """Bytes one copy moves into shared memory (what ``arrive_expect_tx`` expects)."""
        n = self.element_bytes
        for i, (b, e) in enumerate(zip(self.box_dims, self.element_strides)):
            n *= b if i == 0 and self.interleave is Interleave.NONE else -(-b // e)
        return n

    def _axis(self, i: int) -> str:
        if i < len(self.axis_names):
            return self.axis_names[i]
        return f"dim {i} counting from the innermost"

    def _check(self) -> None:
        r = self.rank
        if not _is_int(r) or not 1 <= r <= MAX_RANK:
            raise _fail(f"TMA tensorRank: expected 1..{MAX_RANK} dims, got {r!r}")
        for name, have, want in (("global_dims", self.global_dims, r),
                                 ("global_strides", self.global_strides, r - 1),
                                 ("box_dims", self.box_dims, r),
                                 ("element_strides", self.element_strides, r)):
            if len(have) != want:
                raise _fail(f"TMA {name}: expected {want} values for rank {r}, "
                            f"got {len(have)}: {list(have)}")
        if self.interleave is not Interleave.NONE and r < 3:
            raise _fail(f"TMA interleave {self.interleave.name}: expected rank >= 3, got {r}")
        for i, d in enumerate(self.global_dims):
            if not 1 <= d <= MAX_GLOBAL_DIM:
                raise _fail(f"TMA globalDim[{i}] ({self._axis(i)}): expected "
                            f"1..2**32 elements, got {d}")
        align = 32 if self.interleave is Interleave.B32 else 16
        for i, st in enumerate(self.global_strides):
            where_ = f"TMA globalStrides[{i}] (the step of {self._axis(i + 1)})"
            if st <= 0 or st % align:
                raise _fail(f"{where_}: expected a positive multiple of {align} bytes, got "
                            f"{st} bytes; pad the inner dims so each row is {align}-byte "
                            f"aligned")
            if st >= MAX_GLOBAL_STRIDE:
                raise _fail(f"{where_}: expected less than 2**40 bytes, got {st}")
        for i, b in enumerate(self.box_dims):
            if not 1 <= b <= MAX_BOX:
                raise _fail(f"TMA boxDim[{i}] (the box along {self._axis(i)}): expected "
                            f"1..{MAX_BOX} elements, got {b}")
        for i, e in enumerate(self.element_strides):
            if not 1 <= e <= MAX_ELEMENT_STRIDE:
                raise _fail(f"TMA elementStrides[{i}] (along {self._axis(i)}): expected "
                            f"1..{MAX_ELEMENT_STRIDE}, got {e}")
        inner = self.box_dims[0] * self.element_bytes
        box0 = f"boxDim[0] (the box along {self._axis(0)})"
        if self.interleave is Interleave.NONE:
            if inner % 16:
                raise _fail(f"TMA {box0}: expected a multiple of 16 bytes, got "
                            f"{self.box_dims[0]} x {self.element_bytes} B = {inner} bytes; "
                            f"use a multiple of {16 // self.element_bytes} elements")
            span = self.swizzle.span
            if span is not None and inner > span:
                raise _fail(f"TMA {box0}: swizzle {self.swizzle.name} allows at most "
                            f"{span} bytes ({span // self.element_bytes} elements), got "
                            f"{self.box_dims[0]} x {self.element_bytes} B = {inner} bytes; "
                            f"shrink the box{', use a wider swizzle' if span < 128 else ''} "
                            f"or split the inner dim (tma_params_3d)")
        elif self.interleave is Interleave.B32 and self.swizzle is not Swizzle.B32:
            raise _fail(f"TMA swizzle: interleave B32 requires swizzle B32, "
                        f"got {self.swizzle.name}")
        if self.oob_fill is not OobFill.NONE and self.data_type not in _FLOAT_TYPES:
            raise _fail(f"TMA oob_fill {self.oob_fill.name}: expected a floating-point data "
                        f"type, got {self.data_type.name} (fp8 travels as UINT8)")

    def describe(self) -> str:
        """The ``cuTensorMapEncodeTiled`` arguments, one per line."""

        def e(v: enum.IntEnum) -> str:
            return f"{v.name} ({int(v)})"

        return "\n".join([
            "cuTensorMapEncodeTiled(",
            f"  tensorDataType = {e(self.data_type)}, {self.element_bytes} B/element",
            f"  tensorRank     = {self.rank}",
            f"  globalDim      = {list(self.global_dims)}  (innermost first)",
            f"  globalStrides  = {list(self.global_strides)} bytes",
            f"  boxDim         = {list(self.box_dims)}  ({self.box_bytes} bytes per copy)",
            f"  elementStrides = {list(self.element_strides)}",
            f"  interleave     = {e(self.interleave)}",
            f"  swizzle        = {e(self.swizzle)}",
            f"  l2Promotion    = {e(self.l2_promotion)}",
            f"  oobFill        = {e(self.oob_fill)}",
            ")",
        ])


def _option(table: dict[Any, Any], cls: type[enum.IntEnum], value: Any, what: str) -> Any:
    if isinstance(value, cls):
        return value
    key = value.lower() if isinstance(value, str) else value
    if key not in table:
        names = ", ".join(repr(k) for k in table)
        raise _fail(f"{what}: expected one of {names} or a {cls.__name__}, got {value!r}")
    return table[key]


def _ptx_type(dtype: Any) -> PtxType:
    if isinstance(dtype, PtxType):
        return dtype
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None) or str(dtype)
    try:
        return from_name(str(name).removeprefix("torch."))
    except KeyError:
        raise _fail(f"dtype: expected a PTX type such as bf16 or f32 (or its numpy/torch "
                    f"name), got {dtype!r}") from None


def _data_type(t: PtxType) -> DataType:
    if t.name not in _BY_PTX:
        raise _fail(f"dtype: TMA has no data type for {t.name}; expected one of "
                    f"{', '.join(_BY_PTX)}")
    return _BY_PTX[t.name]


def _layout(layout: Any) -> Layout:
    if isinstance(layout, Layout):
        return layout
    try:
        return Layout(layout.lower() if isinstance(layout, str) else layout)
    except ValueError:
        raise _fail(f"layout: expected Layout.ROW or Layout.COL, got {layout!r}") from None


def tma_params(
    shape: Sequence[int],
    dtype: Any,
    layout: Layout | str = Layout.ROW,
    box_shape: Sequence[int] | None = None,
    *,
    swizzle: str | Swizzle | None = "128B",
    element_strides: Sequence[int] | None = None,
    l2_promotion: str | L2Promotion | None = "128B",
    oob_fill: str | OobFill | None = "none",
    interleave: str | Interleave | None = None,
    strides: Sequence[int] | None = None,
) -> TmaParams:
    """The checked encode parameters of a contiguous tensor of ``shape`` and ``dtype``.

    ``shape``, ``box_shape``, ``element_strides`` and ``strides`` are in the tensor's own
    axis order. ``Layout.ROW`` (C order): the last axis is contiguous; ``Layout.COL``
    (Fortran order): the first axis is contiguous and the last is the outermost.
    ``strides``: the element strides of a strided view in place of the contiguous
    tensor's (the contiguous axis 1, the others 16-byte multiples in any order).
    The default box covers one swizzle line (128 bytes unswizzled) of the
    contiguous axis, clamped to its size, by ``min(64, n)`` of the next axis and
    1 along the others. ``oob_fill="nan"`` fills out-of-bounds float elements
    with the NaN that FMA treats as zero.
    """
    shape = _ints(shape, "shape")
    if not 1 <= len(shape) <= MAX_RANK:
        raise _fail(f"shape: TMA expects 1..{MAX_RANK} dims, got {len(shape)}: {shape}")
    for k, n in enumerate(shape):
        if n <= 0:
            raise _fail(f"shape[{k}]: expected a positive size, got {n} (shape {shape})")
    dt = _data_type(_ptx_type(dtype))
    order = list(range(len(shape)))
    if _layout(layout) is Layout.ROW:
        order.reverse()  # driver dim i is shape axis order[i]
    sw = _option(_SWIZZLE_NAMES, Swizzle, swizzle, "swizzle")
    esize = _ELEMENT_BYTES[dt]
    dims = [shape[k] for k in order]

    def per_axis(values: Sequence[int] | None, what: str) -> list[int] | None:
        if values is None:
            return None
        values = _ints(values, what)
        if len(values) != len(shape):
            raise _fail(f"{what}: expected {len(shape)} values (one per axis of shape "
                        f"{shape}), got {len(values)}: {values}")
        return [values[k] for k in order]

    if strides is None:
        strides, step = [], esize
        for d in dims[:-1]:
            step *= d
            strides.append(step)
    else:
        given = per_axis(strides, "strides")
        if given[0] != 1:
            raise _fail(f"strides: the contiguous axis ({order[0]}) must have stride 1, got "
                        f"strides {tuple(strides)}")
        strides = [s * esize for s in given[1:]]

    box = per_axis(box_shape, "box_shape")
    if box is None:
        line = (sw.span or 128) // esize
        box = [min(line, -(-dims[0] // (16 // esize)) * (16 // esize))]
        box += [min(64, dims[1])] if len(dims) > 1 else []
        box += [1] * (len(dims) - len(box))
    return TmaParams(
        data_type=dt, rank=len(dims), global_dims=tuple(dims), global_strides=tuple(strides),
        box_dims=tuple(box),
        element_strides=tuple(per_axis(element_strides, "element_strides") or [1] * len(dims)),
        interleave=_option(_INTERLEAVE_NAMES, Interleave, interleave, "interleave"),
        swizzle=sw, l2_promotion=_option(_L2_NAMES, L2Promotion, l2_promotion, "l2_promotion"),
        oob_fill=_option(_OOB_NAMES, OobFill, oob_fill, "oob_fill"),
        axis_names=tuple(f"shape axis {k}" for k in order),
    )


CHUNK = 64  # elements per inner chunk of the 3-D view (one 128-byte line of bf16)
PADDED_CHUNK = 72


def tma_params_3d(
    height: int,
    width: int,
    dtype: Any,
    box_major: int,
    box_minor: int,
    *,
    swizzle_128b: bool = True,
    padding: bool = False,
    l2_promotion: str | L2Promotion | None = "128B",
    oob_fill: str | OobFill | None = "none",
) -> TmaParams:
    """Parameters of the 3-D view ``(64, height, width / 64)`` of a row-major
    ``(height, width)`` matrix: one copy loads ``box_major`` rows by ``box_minor``
    columns as ``box_minor / 64`` 64-column slabs, so tiles wider than a 128-byte
    swizzle line need one TMA op. ``padding`` makes the inner box 72 elements (an
    unswizzled, bank-conflict-free row pitch for stores); it needs ``swizzle_128b=False``.
    """
    for what, v in (("height", height), ("width", width), ("box_major", box_major),
                    ("box_minor", box_minor)):
        if not _is_int(v) or v <= 0:
            raise _fail(f"{what}: expected a positive int, got {v!r}")
    if width % CHUNK:
        raise _fail(f"width: the 3-D view splits rows into {CHUNK}-element chunks; "
                    f"expected a multiple of {CHUNK}, got {width}")
    if box_minor % CHUNK:
        raise _fail(f"box_minor: expected a multiple of {CHUNK} columns, got {box_minor}")
    if padding and swizzle_128b:
        raise _fail(f"padding: a {PADDED_CHUNK}-element inner box does not fit a 128-byte "
                    f"swizzle line; expected swizzle_128b=False with padding=True")
    dt = _data_type(_ptx_type(dtype))
    esize = _ELEMENT_BYTES[dt]
    return TmaParams(
        data_type=dt, rank=3, global_dims=(CHUNK, height, width // CHUNK),
        global_strides=(width * esize, CHUNK * esize),
        box_dims=(PADDED_CHUNK if padding else CHUNK, box_major, box_minor // CHUNK),
        element_strides=(1, 1, 1),
        swizzle=Swizzle.B128 if swizzle_128b else Swizzle.NONE,
        l2_promotion=_option(_L2_NAMES, L2Promotion, l2_promotion, "l2_promotion"),
        oob_fill=_option(_OOB_NAMES, OobFill, oob_fill, "oob_fill"),
        axis_names=(f"the {CHUNK} columns of a chunk", "rows (height, box_major)",
                    f"column chunks (width / {CHUNK}, box_minor / {CHUNK})"),
    )


def encode(params: TmaParams, global_address: int = 0) -> bytes:
    """The 128-byte ``CUtensorMap`` for ``params`` at ``global_address`` (a placeholder
    the shim replaces at launch). Makes device 0's primary context current if the
    thread has none; ``RuntimeUnavailableError`` without a CUDA driver."""
    if not isinstance(params, TmaParams):
        raise _fail(f"encode: expected TmaParams (from tma_params), got {params!r}")
    align = 32 if params.interleave is Interleave.B32 else 16
    if not _is_int(global_address) or global_address < 0 or global_address % align:
        raise _fail(f"global_address: expected a {align}-byte aligned address, "
                    f"got {global_address!r}")
    if driver.cuda() is None:
        raise RuntimeUnavailableError(
            f"{where()}: encoding a TMA descriptor needs the CUDA driver: "
            f"{driver.unavailable_reason()}")
    if not driver.current_context():
        driver.ensure_context(0)
    p = params
    return driver.tensor_map_encode_tiled(
        int(p.data_type), p.rank, global_address, p.global_dims, p.global_strides, p.box_dims,
        p.element_strides, int(p.interleave), int(p.swizzle), int(p.l2_promotion),
        int(p.oob_fill), what=" ".join(p.describe().split()))


class TensorMap:
    """An encoded tensor map held in a 64-byte aligned host buffer at ``address``
    (valid while this object lives); ``blob`` is its current 128 bytes."""

    __slots__ = ("params", "address", "_buf")

    def __init__(self, params: TmaParams, blob: bytes) -> None:
        if len(blob) != TENSOR_MAP_BYTES:
            raise _fail(f"TensorMap: expected {TENSOR_MAP_BYTES} bytes, got {len(blob)}")
        self.params = params
        self._buf = ctypes.create_string_buffer(TENSOR_MAP_BYTES + 63)
        self.address = (ctypes.addressof(self._buf) + 63) & ~63
        ctypes.memmove(self.address, blob, TENSOR_MAP_BYTES)

    @property
    def blob(self) -> bytes:
        """The 128 bytes at ``address``."""
        return ctypes.string_at(self.address, TENSOR_MAP_BYTES)

    def __bytes__(self) -> bytes:
        return self.blob

    def __repr__(self) -> str:
        p = self.params
        return (f"TensorMap({p.data_type.name}, dims={list(p.global_dims)}, "
                f"box={list(p.box_dims)}, swizzle={p.swizzle.name}, at {self.address:#x})")


def _synthesize(params: TmaParams, placeholder_ptr: int) -> tuple[TensorMap, int, int]:
    tmap = TensorMap(params, encode(params, placeholder_ptr))
    return tmap, tmap.address, 0


def synthesize_tma_descriptor(
    shape: tuple[int, ...],
    dtype: Any,
    layout: Layout | str,
    box_shape: tuple[int, ...] | None = None,
    placeholder_ptr: int = 0,
    **options: Any,
) -> tuple[TensorMap, int, int]:
    """Encode the tensor map of ``tma_params(shape, dtype, layout, box_shape, **options)``.

    Returns ``(host_tmap, host_blob_ptr, device_blob_ptr)``: the ``TensorMap`` (keep
    it alive), the address of its 128 bytes, and 0, as maps travel by value.
    """
    return _synthesize(tma_params(shape, dtype, layout, box_shape, **options), placeholder_ptr)


def synthesize_tma_descriptor_3d(
    height: int,
    width: int,
    dtype: Any,
    box_major: int,
    box_minor: int,
    *,
    swizzle_128b: bool = True,
    padding: bool = False,
    placeholder_ptr: int = 0,
    **options: Any,
) -> tuple[TensorMap, int, int]:
    """Encode the 3-D view of ``tma_params_3d``; returns like ``synthesize_tma_descriptor``."""
    params = tma_params_3d(height, width, dtype, box_major, box_minor,
                           swizzle_128b=swizzle_128b, padding=padding, **options)
    return _synthesize(params, placeholder_ptr)
