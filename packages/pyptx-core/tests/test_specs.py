"""Tile / Layout / Dim and ``bind``: shapes, symbolic dims, unification and conflicts."""

from __future__ import annotations

import pytest

from pyptx import Dim, Layout, Tile
from pyptx.errors import PyptxError, ShapeError, SpecError, UnboundDimError
from pyptx.specs import bind
from pyptx.types import bf16, f32, pred, u8

# ---------------------------------------------------------------- Tile / Dim

def test_tile_dims_and_dtype():
    t = Tile("M", 64, "K", bf16)
    assert t.dims == (Dim("M"), 64, Dim("K"))
    assert t.dtype is bf16
    assert t.rank == 3
    assert t.layout is Layout.ROW
    assert t.symbols == ("M", "K")
    assert repr(t) == "Tile('M', 64, 'K', bf16)"


def test_tile_symbols_are_deduplicated_in_order():
    assert Tile("N", "M", "N", f32).symbols == ("N", "M")


def test_tile_dtype_by_name_and_layout():
    t = Tile(4, "N", "float32", layout=Layout.COL)
    assert t.dtype is f32
    assert t.layout is Layout.COL
    assert "layout=Layout.COL" in repr(t)


def test_tile_accepts_dim_objects():
    assert Tile(Dim("N"), f32) == Tile("N", f32)


def test_tile_equality_and_hash():
    assert Tile("M", 4, f32) == Tile("M", 4, f32)
    assert hash(Tile("M", 4, f32)) == hash(Tile("M", 4, f32))
    assert Tile("M", 4, f32) != Tile("M", 4, bf16)
    assert Tile("M", 4, f32) != Tile("N", 4, f32)
    assert Tile("M", 4, f32) != Tile("M", 4, f32, layout=Layout.COL)
    assert len({Tile("M", f32), Tile("M", f32), Tile(3, f32)}) == 2


def test_dim_equality():
    assert Dim("N") == Dim("N")
    assert Dim("N") != Dim("M")
    assert Dim("N") != "N"
    assert hash(Dim("N")) == hash(Dim("N"))
    assert repr(Dim("N")) == "Dim('N')"


@pytest.mark.parametrize("args,kwargs,needle", [
    ((), {}, "needs its dims and an element type"),
    (("M", 3), {}, "last argument must be the element type"),
    ((0, f32), {}, "dim 0 must be positive, got 0"),
    ((4, -2, f32), {}, "dim 1 must be positive, got -2"),
    ((True, f32), {}, "dim 0 must be an int or a dim name"),
    ((2.5, f32), {}, "dim 0 must be an int or a dim name, got 2.5"),
    (("M", pred), {}, "cannot be pred"),
    (("M", f32), {"layout": "row"}, "layout must be a Layout"),
    (("not an id", f32), {}, "Dim name must be a Python identifier"),
])
def test_tile_rejects(args, kwargs, needle):
    with pytest.raises(SpecError) as ei:
        Tile(*args, **kwargs)
    assert needle in str(ei.value)
    assert isinstance(ei.value, PyptxError) and isinstance(ei.value, TypeError)


def test_tile_unknown_dtype_name():
    with pytest.raises(PyptxError, match="'f33'"):
        Tile("M", "f33")


def test_tile_u8_is_allowed_for_boolean_tensors():
    assert Tile(8, u8).dtype is u8


# ---------------------------------------------------------------- resolve

def test_resolve():
    t = Tile("M", 8, "K", f32)
    assert t.resolve({"M": 2, "K": 3}) == (2, 8, 3)


def test_resolve_unbound_names_the_dim():
    with pytest.raises(UnboundDimError) as ei:
        Tile("M", "K", f32).resolve({"M": 2}, "input 'A'")
    msg = str(ei.value)
    assert msg.startswith("input 'A': dim 'K' has no value")
    assert "K=..." in msg and "'M': 2" in msg
    assert isinstance(ei.value, SpecError)


# ---------------------------------------------------------------- bind

def test_bind_unifies_shared_dims():
    specs = [Tile("M", "K", f32), Tile("K", "N", f32), Tile("M", "N", f32)]
    env = bind(specs, [(2, 3), (3, 5), (2, 5)], ["A", "B", "C"])
    assert env == {"M": 2, "K": 3, "N": 5}


def test_bind_checks_fixed_dims():
    assert bind([Tile(4, "N", f32)], [(4, 7)], ["X"]) == {"N": 7}
    with pytest.raises(ShapeError) as ei:
        bind([Tile(4, "N", f32)], [(5, 7)], ["X"])
    msg = str(ei.value)
    assert "argument 'X' dim 0" in msg and "expected 4" in msg and "got 5" in msg


def test_bind_conflict_names_both_arguments_and_the_dim():
    specs = [Tile("M", "K", f32), Tile("K", "N", f32)]
    with pytest.raises(ShapeError) as ei:
        bind(specs, [(2, 3), (4, 5)], ["A", "B"])
    msg = str(ei.value)
    # the offending argument, axis and dim, and where the first value came from
    assert msg == "argument 'B' dim 0 ('K'): expected 3 (from argument 'A' dim 1), got 4"


def test_bind_conflict_with_keyword():
    with pytest.raises(ShapeError) as ei:
        bind([Tile("N", f32)], [(3,)], ["X"], {"N": 4})
    assert str(ei.value) == "argument 'X' dim 0 ('N'): expected 4 (from keyword argument), got 3"


def test_bind_keeps_keyword_dims():
    assert bind([Tile("N", f32)], [(3,)], ["X"], {"N": 3, "B": 9}) == {"N": 3, "B": 9}


def test_bind_rank_mismatch():
    with pytest.raises(ShapeError) as ei:
        bind([Tile("M", "N", f32)], [(3,)], ["X"])
    msg = str(ei.value)
    assert "argument 'X'" in msg and "expected rank 2" in msg and "(3,)" in msg


def test_bind_accepts_any_sequence_shape():
    assert bind([Tile("M", "N", f32)], [[2, 3]], ["X"]) == {"M": 2, "N": 3}


def test_bind_does_not_mutate_env():
    env = {"N": 3}
    bind([Tile("N", "M", f32)], [(3, 2)], ["X"], env)
    assert env == {"N": 3}
