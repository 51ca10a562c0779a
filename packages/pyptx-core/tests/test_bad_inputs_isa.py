"""Silent mistakes the DSL now refuses at the user's line: register array bounds, shifts
past the width, oversized register arrays."""

from __future__ import annotations

import sys

import pytest

import pyptx
from pyptx import Tile, reg, smem
from pyptx.errors import OperandError
from pyptx.types import f32, u32, u64


def _trace(body):
    @pyptx.kernel([Tile(128, f32)], [Tile(128, f32)], block=(128, 1, 1))
    def k(X, Y):
        body()

    k.ptx()


def _refused(body, match: str) -> None:
    with pytest.raises(OperandError, match=match) as ei:
        _trace(body)
    assert str(ei.value).startswith(f"{__file__}:{body.line}:"), str(ei.value)


def test_negative_register_array_index():
    def body():
        a = reg.array(f32, 4)
        body.line = sys._getframe().f_lineno + 1
        a[-1]

    _refused(body, r"index -1 is negative; expected 0\.\.3")


def test_register_array_index_past_the_end():
    def body():
        a = reg.array(f32, 4)
        body.line = sys._getframe().f_lineno + 1
        a[4]

    _refused(body, "index 4 out of range for length 4")


def test_register_array_past_the_register_file():
    def body():
        body.line = sys._getframe().f_lineno + 1
        reg.array(f32, 10_000_000)

    _refused(body, "register file")


@pytest.mark.parametrize("t,amount", [(u32, 32), (u32, 40), (u64, 64), (u32, -1)])
def test_shift_past_the_width(t, amount):
    def body():
        r = reg.scalar(t, 1)
        body.line = sys._getframe().f_lineno + 1
        r << amount

    _refused(body, rf"by {amount} on the {t.bits}-bit register")


def test_shift_within_the_width_is_emitted():
    out = {}

    def body():
        r = reg.scalar(u32, 1)
        out["r"] = (r << 31, r >> 0)

    _trace(body)


def test_unnamed_shared_arrays_get_distinct_names():
    names = []

    def body():
        names.extend(smem.alloc(f32, 16).name for _ in range(3))

    _trace(body)
    assert names == ["smem", "smem_1", "smem_2"]


def test_parse_of_none_is_a_pyptx_error():
    from pyptx.errors import PyptxError
    from pyptx.parser import parse

    with pytest.raises(PyptxError, match="parse expects PTX text") as ei:
        line = sys._getframe().f_lineno + 1
        parse(None)
    assert str(ei.value).startswith(f"{__file__}:{line}:")
