"""Programmatic dependent launch: ``@kernel(pdl=True)`` and the griddepcontrol helpers."""

from __future__ import annotations

import pytest

from pyptx import Tile, kernel, ptx, reg
from pyptx.errors import ConfigError, OperandError, TraceError
from pyptx.types import f32, u32


def build(pdl=True, arch="sm_90a"):
    @kernel(in_specs=(Tile("N", f32),), out_specs=(Tile("N", f32),),
            grid=lambda N: ((N + 127) // 128, 1, 1), block=(128, 1, 1), pdl=pdl, arch=arch)
    def neg(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        i = reg.from_(ptx.special.ctaid.x(), u32) * 128 + reg.from_(ptx.special.tid.x(), u32)
        with ptx.if_(i < X.shape[0]):
            v = reg.scalar(f32)
            ptx.inst.ld.global_.f32(v, ptx.addr(px + i * 4))
            ptx.inst.st.global_.f32(ptx.addr(py + i * 4), -v)
        ptx.ret()

    return neg


def _body_lines(text: str) -> list[str]:
    lines = [ln.strip() for ln in text.split("{", 1)[1].splitlines()]
    return [ln for ln in lines if ln and not ln.startswith(".reg")]


def test_pdl_kernel_waits_then_releases_dependents_before_anything_else(assemble):
    k = build()
    spec = k.specialize(N=1000)
    assert k.pdl and spec.pdl
    assert _body_lines(spec.ptx())[:2] == ["griddepcontrol.wait;", "griddepcontrol.launch_dependents;"]
    assemble(spec.ptx())


def test_default_kernel_has_no_griddepcontrol():
    k = build(pdl=False)
    assert not k.pdl and not k.specialize(N=10).pdl
    assert "griddepcontrol" not in k.ptx(N=10)


def test_helpers_emit_the_instructions(assemble):
    @kernel(in_specs=(Tile(4, f32),), out_specs=(Tile(4, f32),), block=(32, 1, 1))
    def k(X, Y):
        ptx.grid_dependency_wait()
        ptx.launch_dependents()
        ptx.ret()

    text = k.ptx()
    assert _body_lines(text)[:2] == ["griddepcontrol.wait;", "griddepcontrol.launch_dependents;"]
    assemble(text)


def test_pdl_must_be_a_bool():
    with pytest.raises(ConfigError) as ei:
        build(pdl=1)
    # the origin is the @kernel line inside build(), in this file
    assert str(ei.value).startswith(f"{__file__}:") and "pdl must be True or False, got 1" in str(ei.value)


def test_pdl_needs_sm90():
    with pytest.raises(ConfigError, match="pdl .griddepcontrol. needs sm_90 or newer, arch is sm_80"):
        build(arch="sm_80")


def prologue_kernel(body, pdl=True):
    @kernel(in_specs=(Tile(256, f32),), out_specs=(Tile(256, f32),), block=(64, 1, 1), pdl=pdl)
    def k(X, Y):
        body(X, Y)
        ptx.ret()

    return k


def test_prologue_goes_before_the_wait_and_its_registers_stay_usable(assemble):
    def body(X, Y):
        with ptx.pdl_prologue():
            px, py = ptx.global_ptrs(X, Y)
            lead = ptx.special.tid.x() == 0
            ptx.bulk_prefetch_l2(px, 1024, pred=lead)
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(px))
        ptx.inst.st.global_.f32(ptx.addr(py), v)

    text = prologue_kernel(body).ptx()
    lines = _body_lines(text)
    wait = lines.index("griddepcontrol.wait;")
    assert lines[wait + 1] == "griddepcontrol.launch_dependents;"
    pre = lines[:wait]
    assert any(ln.startswith("@%p0 cp.async.bulk.prefetch.L2.global [%rd1], 1024;") for ln in pre), pre
    assert sum(ln.startswith("ld.param.u64") for ln in pre) == 2
    assert not any("ld.global" in ln for ln in pre) and any("ld.global" in ln for ln in lines[wait:])
    assemble(text)


def test_prologue_refuses_global_memory_and_names_the_line():
    def body(X, Y):
        with ptx.pdl_prologue():
            px, py = ptx.global_ptrs(X, Y)
            v = reg.scalar(f32)
            ptx.inst.ld.global_.f32(v, ptx.addr(px))  # the line the error names

    with pytest.raises(TraceError) as ei:
        prologue_kernel(body).ptx()
    line = test_prologue_refuses_global_memory_and_names_the_line.__code__.co_firstlineno + 5
    assert f"{__file__}:{line}: ld.global.f32 may access global memory" in str(ei.value)


def test_prologue_needs_pdl_and_must_come_first():
    def no_pdl(X, Y):
        with ptx.pdl_prologue():
            pass

    with pytest.raises(TraceError, match=r"needs a kernel declared with @kernel\(pdl=True\)"):
        prologue_kernel(no_pdl, pdl=False).ptx()

    def late(X, Y):
        ptx.global_ptrs(X, Y)
        with ptx.pdl_prologue():
            pass

    with pytest.raises(TraceError, match=r"must open once, before any other statement .*\(4 statements"):
        prologue_kernel(late).ptx()

    def twice(X, Y):
        with ptx.pdl_prologue():
            pass
        with ptx.pdl_prologue():
            pass

    with pytest.raises(TraceError, match="must open once"):
        prologue_kernel(twice).ptx()


@pytest.mark.parametrize("nbytes,msg", [
    (10, "positive multiple of 16 below 2\\*\\*32, got 10"),
    (0, "got 0"),
    (2**32, "got 4294967296"),
    (True, "got True"),
])
def test_bulk_prefetch_checks_its_size(nbytes, msg):
    def body(X, Y):
        with ptx.pdl_prologue():
            px, _ = ptx.global_ptrs(X, Y)
            ptx.bulk_prefetch_l2(px, nbytes)

    with pytest.raises(OperandError, match=msg) as ei:
        prologue_kernel(body).ptx()
    assert str(ei.value).startswith(f"{__file__}:")


def test_bulk_prefetch_checks_its_operands():
    def body_src(X, Y):
        ptx.bulk_prefetch_l2(reg.scalar(u32), 16)

    with pytest.raises(OperandError, match="src must be a 64-bit address register, got .u32"):
        prologue_kernel(body_src).ptx()

    def body_n(X, Y):
        px, _ = ptx.global_ptrs(X, Y)
        ptx.bulk_prefetch_l2(px, reg.scalar(f32))

    with pytest.raises(OperandError, match="nbytes register must be 32-bit"):
        prologue_kernel(body_n).ptx()
