"""``@kernel(tma=...)``: tensor-map parameters, their order, validation, and ptxas."""

from __future__ import annotations

import inspect

import pytest

from pyptx import Tile, kernel, ptx, reg
from pyptx.errors import ConfigError, OperandError
from pyptx.tma import TmaParams
from pyptx.types import f32, u32


def test_tensor_map_param_comes_after_scalars_and_is_recorded():
    @kernel(in_specs=(Tile("M", "N", f32),), out_specs=(Tile("M", "N", f32),),
            block=(32, 1, 1), tma={"X": dict(box=(32, 8), swizzle=None)})
    def k(X, Y):
        ptx.scalar_param(u32, 7, "n")
        ptx.tma.tensormap_ptr(X.tmap)
        ptx.ret()

    spec = k.specialize(M=64, N=128)
    params = [p.text() for p in spec.module.functions[0].params]
    assert params == [".param .u64 X", ".param .u64 Y", ".param .u32 n",
                      ".param .align 64 .b8 X_tmap[128]"]
    ((index, tp),) = spec.tma_maps
    assert index == 0 and isinstance(tp, TmaParams)
    assert tuple(tp.global_dims) == (128, 64) and tuple(tp.box_dims) == (8, 32)
    assert k.tma == {"X": {"box": (32, 8), "swizzle": None}}


def test_map_of_a_strided_view_of_a_flat_tensor():
    """``shape`` and ``strides``: the map covers a strided view of the argument's memory (a
    flat tile of the elements the view spans), not the argument's own shape."""
    shape, strides = (2, 100, 8, 64), (8 * 100 * 64, 64, 100 * 64, 1)

    @kernel(in_specs=(Tile(2 * 100 * 8 * 64, f32),), out_specs=(Tile(4, f32),),
            block=(32, 1, 1),
            tma={"X": dict(box=(1, 32, 1, 16), swizzle=None, shape=shape, strides=strides)})
    def k(X, Y):
        ptx.tma.tensormap_ptr(X.tmap)
        ptx.ret()

    ((_, tp),) = k.specialize().tma_maps
    assert tp.global_dims == (64, 8, 100, 2)
    assert tp.global_strides == (100 * 64 * 4, 64 * 4, 8 * 100 * 64 * 4)
    assert tp.box_dims == (16, 1, 32, 1)


def test_tmap_without_declaration_names_the_fix():
    @kernel(in_specs=(Tile(4, f32),), out_specs=(Tile(4, f32),), block=(32, 1, 1))
    def k(X, Y):
        ptx.tma.tensormap_ptr(X.tmap)

    line = inspect.getsourcelines(k.fn)[1] + 2
    with pytest.raises(OperandError, match=rf"test_tma_kernel.py:{line}: tensor 'X' has no "
                                           r"tensor map; declare one with @kernel\(tma="):
        k.ptx()


@pytest.mark.parametrize("tma,match", [
    ({"Z": {}}, "tma names 'Z', which is not a tensor parameter"),
    ({"X": {"bogus": 1}}, r"tma\['X'\] must be a dict with keys from"),
    ([("X", {})], "tma must map tensor names to dicts"),
    ({"X": {"view": "3d", "box": (8, 64), "strides": (4, 1)}},
     r"tma\['X'\] shape and strides need view='2d'"),
])
def test_bad_tma_declarations(tma, match):
    with pytest.raises(ConfigError, match=match):
        @kernel(in_specs=(Tile(4, f32),), out_specs=(Tile(4, f32),), tma=tma)
        def k(X, Y):
            ptx.ret()


def test_tma_constraints_are_checked_when_specializing():
    @kernel(in_specs=(Tile("M", "N", f32),), out_specs=(Tile("M", "N", f32),),
            tma={"X": dict(box=(32, 32), swizzle=None)})
    def k(X, Y):
        reg.scalar(u32)
        ptx.ret()

    with pytest.raises(ConfigError, match="multiple of 16 bytes, got 280 bytes"):
        k.ptx(M=8, N=70)
    assert ".b8 X_tmap[128]" in k.ptx(M=8, N=72)
