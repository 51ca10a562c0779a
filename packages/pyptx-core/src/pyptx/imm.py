"""Immediate operands: Python ints and floats encoded exactly for a PTX type."""

from __future__ import annotations

import math
import struct

from .errors import OperandError
from .source import where as _where
from .types import PtxType


def f32_hex(x: float) -> str:
    """``0fXXXXXXXX``: the nearest float32, bit-exact (also inf and nan)."""
    try:
        bits = struct.unpack("<I", struct.pack("<f", x))[0]
    except OverflowError:
        bits = 0x7F800000 if x > 0 else 0xFF800000
    return f"0f{bits:08X}"


def f64_hex(x: float) -> str:
    """``0dXXXXXXXXXXXXXXXX``: the float64 bit pattern."""
    return f"0d{struct.unpack('<Q', struct.pack('<d', x))[0]:016X}"


def f16_bits(x: float) -> int:
    """IEEE half bits of ``x`` (round to nearest even)."""
    try:
        return struct.unpack("<H", struct.pack("<e", x))[0]
    except OverflowError:
        return 0x7C00 if x > 0 else 0xFC00


def bf16_bits(x: float) -> int:
    """bfloat16 bits of ``x`` (round to nearest even from float32)."""
    if math.isnan(x):
        return 0x7FC0
    b = int(f32_hex(x)[2:], 16)
    if (b & 0x7F800000) == 0x7F800000:
        return b >> 16
    b += 0x7FFF + ((b >> 16) & 1)
    return (b >> 16) & 0xFFFF


def encode(value: int | float, t: PtxType | None, where: str | None = None) -> str:
    """Render ``value`` as an immediate operand of an instruction of type ``t``.

    ``where`` labels errors; by default the user's ``file:line`` is looked up.
    """
    if isinstance(value, bool):
        value = int(value)
    if t is None:
        if isinstance(value, float):
            return f32_hex(value)
        return str(value)
    if t.kind == "f":
        v = float(value)
        if t.bits == 64:
            return f64_hex(v)
        if t.name == "f16":
            return f"0x{f16_bits(v):04X}"
        if t.name == "bf16":
            return f"0x{bf16_bits(v):04X}"
        if t.name in ("f16x2", "bf16x2"):  # a scalar broadcast to both halves
            h = f16_bits(v) if t.name == "f16x2" else bf16_bits(v)
            return f"0x{h:04X}{h:04X}"
        return f32_hex(v)
    if isinstance(value, float) and t.kind == "b" and t.bits in (16, 32, 64):
        # a float into a bit type is its bit pattern (mov.b32 %r, 1.0 -> 0f3F800000), not int(1.0)
        return {16: lambda x: f"0x{f16_bits(x):04X}", 32: f32_hex, 64: f64_hex}[t.bits](value)
    if isinstance(value, float):
        if not value.is_integer():
            raise OperandError(
                f"{where or _where()}: expected an integer immediate for .{t.name}, got float {value!r}"
            )
        value = int(value)
    bits = 64 if t.bits > 64 or t.is_pred else t.bits
    lo, hi = -(1 << (bits - 1)), (1 << bits) - 1
    if t.kind == "s":
        hi = (1 << (bits - 1)) - 1
    if not lo <= value <= hi:
        raise OperandError(
            f"{where or _where()}: immediate {value} does not fit .{t.name} (range {lo}..{hi})"
        )
    return str(value)
