"""Shared memory: static allocations with alignment, the dynamic window, addresses, limits."""

from __future__ import annotations

import pytest

import pyptx
from pyptx import Tile, ptx, reg, smem
from pyptx.errors import ConfigError, OperandError, RegisterScopeError
from pyptx.smem import STATIC_SMEM_LIMIT, SharedArray
from pyptx.types import b8, bf16, e4m3, f16, f32, f64, pred, u8, u32, u64


def spec(fn, **kw):
    return pyptx.kernel(name="t", **kw)(fn).specialize()


def decls(s):
    return [d.text() for d in s.module.shared]


def test_static_alloc_declaration_and_metadata():
    got = {}

    def k():
        got["a"] = smem.alloc(f32, 64)
        got["b"] = smem.alloc(f16, (4, 8), align=128, name="tile")

    s = spec(k)
    a, b = got["a"], got["b"]
    assert isinstance(a, SharedArray)
    assert (a.name, a.type, a.shape, a.align, a.nbytes) == ("smem", f32, (64,), 16, 256)
    assert (b.name, b.type, b.shape, b.align, b.nbytes) == ("tile", f16, (4, 8), 128, 64)
    assert decls(s) == [".shared .align 16 .f32 smem[64];", ".shared .align 128 .f16 tile[32];"]
    assert repr(a) == "SharedArray(smem: f32[64])"
    # 256 bytes, padded to the next 128-byte boundary, then 64 more
    assert s.static_smem == 256 + 64


def test_alignment_padding_is_counted():
    def k():
        smem.alloc(u8, 3, align=1)
        smem.alloc(f64, 1, align=256)
        smem.alloc(u8, 1, align=1)

    assert spec(k).static_smem == 256 + 8 + 1


def test_names_are_unique():
    got = {}

    def k():
        got["x"] = [smem.alloc(f32, 4) for _ in range(3)]

    s = spec(k)
    assert [a.name for a in got["x"]] == ["smem", "smem_1", "smem_2"]
    assert len(set(decls(s))) == 3


@pytest.mark.parametrize("t,decl", [
    (bf16, ".shared .align 16 .b8 smem[16];"),  # no .bf16 variables: bytes
    (e4m3, ".shared .align 16 .b8 smem[8];"),
    (u8, ".shared .align 16 .u8 smem[8];"),
    (b8, ".shared .align 16 .b8 smem[8];"),
    (u64, ".shared .align 16 .u64 smem[8];"),
])
def test_declared_types(t, decl):
    assert decls(spec(lambda: smem.alloc(t, 8))) == [decl]


def test_static_limit():
    def exactly():
        smem.alloc(f32, STATIC_SMEM_LIMIT // 4)

    def over():
        smem.alloc(f32, STATIC_SMEM_LIMIT // 4)
        smem.alloc(u8, 1, align=1)

    assert spec(exactly).static_smem == 48 * 1024
    with pytest.raises(OperandError) as ei:
        spec(over)
    msg = str(ei.value)
    assert "static shared memory would be 49153 bytes, over the 49152-byte limit" in msg
    assert "smem.dynamic()" in msg and __file__ in msg


@pytest.mark.parametrize("args,kw,needle", [
    ((pred, 4), {}, "smem.alloc expects an element type such as f32"),
    (("f32", 4), {}, "smem.alloc expects an element type such as f32"),
    ((f32, 0), {}, "shape must be positive ints, got 0"),
    ((f32, (4, -1)), {}, "shape must be positive ints, got (4, -1)"),
    ((f32, ()), {}, "shape must be positive ints, got ()"),
    ((f32, 2.0), {}, "shape must be positive ints, got 2.0"),
    ((f32, 4), {"align": 12}, "alignment must be a power of two, got 12"),
    ((f32, 4), {"align": 0}, "alignment must be a power of two, got 0"),
    ((f32, 4), {"align": True}, "alignment must be a power of two, got True"),
    ((f32, 4), {"name": "my-buf"}, "shared array name must be an identifier, got 'my-buf'"),
])
def test_alloc_errors(args, kw, needle):
    with pytest.raises(OperandError) as ei:
        spec(lambda: smem.alloc(*args, **kw))
    assert needle in str(ei.value)
    assert __file__ in str(ei.value)


def test_dynamic_window():
    got = {}

    def k():
        got["d"] = smem.dynamic()

    s = spec(k, smem=4096)
    d = got["d"]
    assert d.nbytes is None and d.shape is None
    assert decls(s) == [".extern .shared .align 16 .b8 dyn_smem[];"]
    assert s.smem == 4096 and s.static_smem == 0


def test_dynamic_window_typed_and_aligned():
    s = spec(lambda: smem.dynamic(f32, align=1024, name="buf"), smem=1024)
    assert decls(s) == [".extern .shared .align 1024 .f32 buf[];"]
    s = spec(lambda: smem.dynamic(bf16), smem=1024)
    assert decls(s) == [".extern .shared .align 16 .b8 dyn_smem[];"]


def test_dynamic_once_per_kernel():
    def k():
        smem.dynamic()
        smem.dynamic()

    with pytest.raises(OperandError, match=r"smem.dynamic\(\) may be declared once per kernel"):
        spec(k)
    with pytest.raises(OperandError, match="alignment must be a power of two, got 3"):
        spec(lambda: smem.dynamic(align=3))


def test_static_plus_dynamic_limit():
    with pytest.raises(ConfigError) as ei:
        spec(lambda: smem.alloc(u8, 40 * 1024), smem=200 * 1024)
    msg = str(ei.value)
    assert "40960 static + 204800 dynamic shared bytes exceed the 232448-byte per-block limit" in msg
    assert __file__ in msg


def test_addr_and_operands():
    got = {}

    def k():
        buf = smem.alloc(f32, 32)
        a = buf.addr()
        v = reg.scalar(f32)
        ptx.inst.ld.shared.f32(v, ptx.addr(buf, 12))
        ptx.inst.st.shared.f32(ptx.addr(a, 4), v)
        got.update(a=a, v=v)

    s = spec(k)
    lines = [st.text() for st in s.module.functions[0].body]
    a, v = got["a"], got["v"].name
    assert a.type is u32
    assert lines == [f"mov.u32 {a.name}, smem;", f"ld.shared.f32 {v}, [smem+12];",
                     f"st.shared.f32 [{a.name}+4], {v};"]


def test_shared_array_of_another_kernel():
    leaked = []
    spec(lambda: leaked.append(smem.alloc(f32, 4)))

    with pytest.raises(RegisterScopeError, match="shared array smem belongs to kernel 't'"):
        spec(lambda: leaked[0].addr())

    def use():
        smem.alloc(f32, 4)  # this kernel has its own "smem": the old one must not alias it
        ptx.inst.ld.shared.f32(reg.scalar(f32), ptx.addr(leaked[0]))

    with pytest.raises(RegisterScopeError) as ei:
        spec(use)
    assert __file__ in str(ei.value)


def test_smem_kernel_assembles(assemble):
    @pyptx.kernel([Tile(128, f32)], [Tile(128, f32)], block=(128, 1, 1), smem=128 * 4,
                  name="stage")
    def stage(X, Y):
        x, y = ptx.global_ptrs(X, Y)
        tile = smem.alloc(f32, 128, align=128, name="tile")
        flags = smem.alloc(u32, 4, align=4, name="flags")
        dyn = smem.dynamic(f32)
        t = ptx.special.tid.x()
        off = t << 2
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(x + off))
        ptx.inst.st.shared.f32(ptx.addr(tile.addr() + off), v)
        ptx.inst.st.shared.u32(ptx.addr(flags, 4), t)
        ptx.inst.st.shared.f32(ptx.addr(dyn.addr() + off), v)
        ptx.bar_sync()
        w = reg.scalar(f32)
        ptx.inst.ld.shared.f32(w, ptx.addr(tile, 8))
        generic = reg.scalar(u64)
        ptx.inst.cvta.shared.u64(generic, tile)
        ptx.inst.st.global_.f32(ptx.addr(y + off), w)
        ptx.ret()

    s = stage.specialize()
    src = s.ptx()
    head = src.split(".visible .entry")[0]
    # shared declarations live at module scope, before the entry
    assert ".shared .align 128 .f32 tile[128];" in head
    assert ".shared .align 4 .u32 flags[4];" in head
    assert ".extern .shared .align 16 .f32 dyn_smem[];" in head
    assert s.static_smem == 512 + 16 and s.smem == 512
    assemble(src)
