"""torch dtype <-> PTX element type."""

from __future__ import annotations

from typing import Any

from pyptx.types import PtxType, from_name

_TORCH_TO_PTX = {
    "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
    "int8": "s8", "int16": "s16", "int32": "s32", "int64": "s64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "bool": "u8", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2",
}
_PTX_TO_TORCH = {
    "f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
    "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "b8": "uint8", "b16": "int16", "b32": "int32", "b64": "int64",
    "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2",
}


def ptx_type_of(dtype: Any) -> PtxType | None:
    """The PTX type of a torch dtype, or None if PTX has no such element type."""
    name = _TORCH_TO_PTX.get(str(dtype).removeprefix("torch."))
    return from_name(name) if name else None


def torch_dtype_of(t: PtxType) -> Any:
    """The torch dtype used to allocate tensors of PTX type ``t``."""
    import torch

    name = _PTX_TO_TORCH.get(t.name)
    if name is None:
        from pyptx.errors import SpecError

        raise SpecError(f"no torch dtype holds PTX .{t.name} elements")
    return getattr(torch, name)


def compatible(spec: PtxType, got: PtxType | None) -> bool:
    """Does a tensor of type ``got`` fit a Tile of type ``spec`` (same-width ints interchange)?"""
    if got is None:
        return False
    if got is spec:
        return True
    return spec.is_int and got.is_int and spec.bits == got.bits
