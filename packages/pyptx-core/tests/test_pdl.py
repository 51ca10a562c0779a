"""Programmatic dependent launch: ``@kernel(pdl=True)`` and the griddepcontrol helpers."""

from __future__ import annotations

import pytest

from pyptx import Tile, kernel, ptx, reg
from pyptx.errors import ConfigError
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


def body(text: str) -> list[str]:
    lines = [ln.strip() for ln in text.split("{", 1)[1].splitlines()]
    return [ln for ln in lines if ln and not ln.startswith(".reg")]


def test_pdl_kernel_waits_then_releases_dependents_before_anything_else(assemble):
    k = build()
    spec = k.specialize(N=1000)
    assert k.pdl and spec.pdl
    assert body(spec.ptx())[:2] == ["griddepcontrol.wait;", "griddepcontrol.launch_dependents;"]
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
    assert body(text)[:2] == ["griddepcontrol.wait;", "griddepcontrol.launch_dependents;"]
    assemble(text)


def test_pdl_must_be_a_bool():
    with pytest.raises(ConfigError) as ei:
        build(pdl=1)
    # the origin is the @kernel line inside build(), in this file
    assert str(ei.value).startswith(f"{__file__}:") and "pdl must be True or False, got 1" in str(ei.value)


def test_pdl_needs_sm90():
    with pytest.raises(ConfigError, match="pdl .griddepcontrol. needs sm_90 or newer, arch is sm_80"):
        build(arch="sm_80")
