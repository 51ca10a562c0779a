"""pyptx.types: every scalar type, its properties, from_name, and that ptxas accepts its registers."""

from __future__ import annotations

import pickle

import pytest

import pyptx
from pyptx import reg
from pyptx import types as T
from pyptx.errors import PyptxError

# name, bits, kind, declared register type
EXPECTED = [
    ("b8", 8, "b", "b8"), ("b16", 16, "b", "b16"), ("b32", 32, "b", "b32"),
    ("b64", 64, "b", "b64"), ("b128", 128, "b", "b128"),
    ("u8", 8, "u", "u8"), ("u16", 16, "u", "u16"), ("u32", 32, "u", "u32"), ("u64", 64, "u", "u64"),
    ("s8", 8, "s", "s8"), ("s16", 16, "s", "s16"), ("s32", 32, "s", "s32"), ("s64", 64, "s", "s64"),
    ("f16", 16, "f", "f16"), ("f16x2", 32, "f", "f16x2"), ("bf16", 16, "f", "b16"),
    ("bf16x2", 32, "f", "b32"), ("tf32", 32, "f", "b32"), ("f32", 32, "f", "f32"),
    ("f64", 64, "f", "f64"), ("e4m3", 8, "f", "b8"), ("e5m2", 8, "f", "b8"),
    ("pred", 1, "pred", "pred"),
]


def test_all_types_listed_once():
    assert [t.name for t in T.ALL_TYPES] == [e[0] for e in EXPECTED]
    assert len(set(map(id, T.ALL_TYPES))) == len(T.ALL_TYPES)


@pytest.mark.parametrize("name,bits,kind,decl", EXPECTED, ids=[e[0] for e in EXPECTED])
def test_type_properties(name, bits, kind, decl):
    t = getattr(T, name)
    assert isinstance(t, T.PtxType)
    assert (t.name, t.bits, t.kind, t.reg_decl) == (name, bits, kind, decl)
    assert str(t) == repr(t) == name
    assert t.bytes == max(bits // 8, 1)
    assert t.is_float == (kind == "f")
    assert t.is_int == (kind in ("b", "u", "s"))
    assert t.is_signed == (kind == "s")
    assert t.is_pred == (kind == "pred")
    # lookup by name, with and without the PTX dot, returns the singleton
    assert T.from_name(name) is t
    assert T.from_name("." + name) is t


@pytest.mark.parametrize("t", T.ALL_TYPES, ids=str)
def test_pickle_keeps_identity(t):
    assert pickle.loads(pickle.dumps(t)) is t


def test_register_prefixes_cannot_collide():
    # %<prefix><n> names of two types must never coincide: no prefix is another prefix
    # followed only by digits.
    prefixes = [t.prefix for t in T.ALL_TYPES]
    assert len(set(prefixes)) == len(prefixes)
    for a in prefixes:
        for b in prefixes:
            if a != b and b.startswith(a):
                assert not b[len(a):].isdigit(), (a, b)


@pytest.mark.parametrize("alias,name", [
    ("float32", "f32"), ("float", "f32"), ("float16", "f16"), ("half", "f16"),
    ("bfloat16", "bf16"), ("float64", "f64"), ("double", "f64"), ("int32", "s32"),
    ("int64", "s64"), ("int16", "s16"), ("int8", "s8"), ("uint8", "u8"), ("uint16", "u16"),
    ("uint32", "u32"), ("uint64", "u64"), ("bool", "pred"), ("float8_e4m3fn", "e4m3"),
    ("float8_e5m2", "e5m2"),
])
def test_from_name_aliases(alias, name):
    assert T.from_name(alias) is getattr(T, name)


@pytest.mark.parametrize("bad", ["f33", "F32", "", "int", ".", "float128"])
def test_from_name_unknown(bad):
    with pytest.raises(T.UnknownTypeError) as ei:
        T.from_name(bad)
    e = ei.value
    assert isinstance(e, PyptxError) and isinstance(e, KeyError)
    msg = str(e)
    assert repr(bad) in msg
    assert "known:" in msg and "bf16" in msg and "u32" in msg


def test_int_type():
    assert T.int_type(32, True) is T.s32
    assert T.int_type(32, False) is T.u32
    assert T.int_type(64, False) is T.u64
    assert T.int_type(8, True) is T.s8
    assert T.int_type(16, False) is T.u16


def _decl_kernel(types, version=None):
    @pyptx.kernel(name="decls", version=version)
    def decls():
        for t in types:
            reg.scalar(t)
            reg.array(t, 2)

    return decls


def test_every_type_declares_a_register(assemble):
    types = [t for t in T.ALL_TYPES if t is not T.b128]
    src = _decl_kernel(types).ptx()
    for t in types:
        # one scalar + an array of 2 -> three registers of each type
        assert f"\t.reg .{t.reg_decl} %{t.prefix}<3>;" in src
    assemble(src)


def test_b128_register_needs_ptx_8_3(assemble):
    src = _decl_kernel([T.b128], version="8.3").ptx()
    assert ".version 8.3" in src
    assert "\t.reg .b128 %q<3>;" in src
    assemble(src)
