"""``Kernel.reuse``: a kernel of another size takes a traced kernel's code without tracing,
with its own shapes, grid and tensor maps and the scalar values it is given; kernels that
visibly differ are refused at the caller's line."""

from __future__ import annotations

import inspect

import pytest

from pyptx import Tile, kernel, ptx
from pyptx.errors import ConfigError
from pyptx.types import f32, u32


def here() -> int:
    return inspect.currentframe().f_back.f_lineno


def scale_rows(n, *, block=128, name="scale_rows", tma=False):
    """A kernel over ``n`` floats whose code reads ``n`` from a scalar parameter."""
    calls = []

    @kernel(in_specs=(Tile(n, 64, f32),), out_specs=(Tile(n, 64, f32),),
            grid=(-(-n // block), 1, 1), block=(block, 1, 1), name=name,
            tma={"X": {"box": (8, 32)}} if tma else None)
    def body(X, Y):
        calls.append(n)
        rows = ptx.scalar_param(u32, n, "rows")
        tid = ptx.special.tid.x()
        with ptx.if_(tid < rows):
            ptx.ret()
        ptx.ret()

    return body, calls


def test_reuse_takes_the_code_and_its_own_sizes():
    first, traced = scale_rows(1000, tma=True)
    like = first.specialize()
    other, again = scale_rows(5000, tma=True)
    spec = other.reuse(like, {"rows": 5000})
    assert again == [] and traced == [1000]          # the second body never ran
    assert spec.module is like.module and spec.ptx() == like.ptx()
    assert spec.grid == (40, 1, 1) and spec.in_shapes == ((5000, 64),)
    assert [v for _, _, v in spec.scalar_params] == [5000]
    assert spec.tma_maps[0][1].global_dims == (64, 5000)
    assert other.specialize() is spec                # a launch finds it in the cache
    fresh, _ = scale_rows(5000, tma=True)
    f = fresh.specialize()
    assert (f.ptx(), f.grid, f.scalar_params, f.tma_maps) == (
        spec.ptx(), spec.grid, spec.scalar_params, spec.tma_maps)


def test_reuse_refuses_a_visibly_different_kernel():
    like = scale_rows(1000)[0].specialize()
    with pytest.raises(ConfigError, match=rf"test_kernel_reuse\.py:{here() + 1}: .*differ in block"):
        scale_rows(2000, block=256)[0].reuse(like, {"rows": 2000})
    with pytest.raises(ConfigError, match=r"differ in entry name"):
        scale_rows(2000, name="other")[0].reuse(like, {"rows": 2000})
    with pytest.raises(ConfigError, match=r"differ in tensor maps"):
        scale_rows(2000, tma=True)[0].reuse(like, {"rows": 2000})
    with pytest.raises(ConfigError, match=r"no scalar parameter bogus \(it has rows\)"):
        scale_rows(2000)[0].reuse(like, {"bogus": 1})


def test_code_round_trips_through_json_with_its_line_maps():
    import json

    from pyptx.kernel import Specialization

    first, _ = scale_rows(1000)
    like = first.specialize()
    data = json.loads(json.dumps(like.code()))
    assert isinstance(data["locs"], dict) and isinstance(data["locs"]["lines"], str)
    back = Specialization.from_code(data)

    def plain(spec, lineinfo=False):
        text, locs = spec.emit(lineinfo)
        return text, [tuple(x) if x else None for x in locs]

    for lineinfo in (False, True):
        assert plain(back, lineinfo) == plain(like, lineinfo)
    assert any(plain(back)[1])   # the body's lines map to this file
    old = dict(data, locs=[list(x) if x else None for x in plain(like)[1]],
               locs_lineinfo=[list(x) if x else None for x in plain(like, True)[1]])
    assert plain(Specialization.from_code(old)) == plain(like)   # a file of the older form
    second, traced = scale_rows(3000)
    second.reuse(back, {"rows": 3000})
    assert traced == [] and second.specialize().ptx() == like.ptx()
