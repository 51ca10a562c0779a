"""Kind and width of every type suffix the instruction table (``pyptx.ptx._isa``) names: what
``_check`` tests registers against, without building the table."""

from __future__ import annotations

from ..types import ALL_TYPES

#: Widths of the type suffixes that are not pyptx register types.
EXTRA_BITS = {"e4m3x2": 16, "e5m2x2": 16, "e2m1x2": 8, "e2m3x2": 16, "e3m2x2": 16,
              "ue8m0x2": 16, "u16x2": 32, "s16x2": 32, "b1": 1, "u4": 4, "s4": 4, "u8x4": 32,
              "s8x4": 32}
#: kind and width of every type suffix the table names.
TYPE_INFO: dict[str, tuple[str, int]] = {t.name: (t.kind, t.bits) for t in ALL_TYPES}
TYPE_INFO.update({k: ("x", v) for k, v in EXTRA_BITS.items()})
