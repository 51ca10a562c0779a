"""TMA descriptor synthesis: encode parameters, every driver constraint, and the mocked
driver call. CPU only."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import types

import pytest

from pyptx import driver, launch
from pyptx.errors import (
    ConfigError,
    LaunchError,
    PyptxError,
    RuntimeUnavailableError,
    TmaError,
)
from pyptx.specs import Layout
from pyptx.tma import (
    DataType,
    Interleave,
    L2Promotion,
    OobFill,
    Swizzle,
    TensorMap,
    TmaParams,
    encode,
    synthesize_tma_descriptor,
    synthesize_tma_descriptor_3d,
    tma_params,
    tma_params_3d,
)
from pyptx.types import bf16, e4m3, e5m2, f16x2, f32, f64, pred, s32, tf32, u8

# ------------------------------------------------------------ parameter synthesis


def test_2d_bf16_row_defaults():
    p = tma_params((1024, 4096), bf16)
    assert p.data_type is DataType.BFLOAT16 and p.rank == 2
    assert p.global_dims == (4096, 1024)  # innermost first
    assert p.global_strides == (4096 * 2,)
    assert p.box_dims == (64, 64)  # 128-byte swizzle line x 64 rows
    assert p.element_strides == (1, 1)
    assert p.swizzle is Swizzle.B128 and p.l2_promotion is L2Promotion.B128
    assert p.interleave is Interleave.NONE and p.oob_fill is OobFill.NONE
    assert p.element_bytes == 2 and p.box_bytes == 64 * 64 * 2


def test_2d_col_layout_keeps_shape_order():
    p = tma_params((1024, 4096), bf16, Layout.COL, (64, 32))
    assert p.global_dims == (1024, 4096)
    assert p.global_strides == (1024 * 2,)
    assert p.box_dims == (64, 32)
    assert tma_params((1024, 4096), bf16, "col", (64, 32)) == p


def test_row_box_shape_is_in_shape_order():
    p = tma_params((256, 512), bf16, Layout.ROW, (128, 64))
    assert p.box_dims == (64, 128)
    assert tma_params((256, 512), bf16, "ROW", (128, 64)) == p


@pytest.mark.parametrize("shape,dims,strides,box", [
    ((4096,), (4096,), (), (64,)),
    ((8, 1024, 64), (64, 1024, 8), (128, 128 * 1024), (64, 64, 1)),
    ((2, 3, 16, 64), (64, 16, 3, 2), (128, 2048, 6144), (64, 16, 1, 1)),
    ((2, 2, 2, 8, 64), (64, 8, 2, 2, 2), (128, 1024, 2048, 4096), (64, 8, 1, 1, 1)),
])
def test_ranks_1_to_5(shape, dims, strides, box):
    p = tma_params(shape, bf16)
    assert p.rank == len(shape)
    assert p.global_dims == dims
    assert p.global_strides == strides
    assert p.box_dims == box


def test_5d_col_layout():
    p = tma_params((8, 2, 3, 4, 5), f32, Layout.COL, (8, 1, 1, 1, 1), swizzle=None)
    assert p.global_dims == (8, 2, 3, 4, 5)
    assert p.global_strides == (32, 64, 192, 768)


def test_strided_view_takes_the_given_strides():
    """A (B, S, H, D) view of (B, H, S, D) memory: the strides in any order, the contiguous
    axis 1, the others checked against the 16-byte rule."""
    p = tma_params((2, 100, 8, 64), bf16, box_shape=(1, 32, 1, 64), swizzle=None,
                   strides=(8 * 100 * 64, 64, 100 * 64, 1))
    assert p.global_dims == (64, 8, 100, 2)
    assert p.global_strides == (100 * 64 * 2, 64 * 2, 8 * 100 * 64 * 2)
    dense = tma_params((2, 100, 8, 64), bf16, box_shape=(1, 32, 1, 64), swizzle=None)
    assert tma_params((2, 100, 8, 64), bf16, box_shape=(1, 32, 1, 64), swizzle=None,
                      strides=(100 * 8 * 64, 8 * 64, 64, 1)) == dense
    with pytest.raises(TmaError, match=r"strides: the contiguous axis \(3\) must have stride 1"):
        tma_params((2, 100, 8, 64), bf16, strides=(8 * 100 * 64, 64, 100 * 64, 2))
    with pytest.raises(TmaError, match="globalStrides.*multiple of 16 bytes"):
        tma_params((2, 100, 8, 64), bf16, strides=(8 * 100 * 64, 68, 100 * 64, 1))
    with pytest.raises(TmaError, match="strides: expected 4 values"):
        tma_params((2, 100, 8, 64), bf16, strides=(64, 1))


@pytest.mark.parametrize("dtype,dt,inner", [
    (bf16, DataType.BFLOAT16, 64),
    ("bfloat16", DataType.BFLOAT16, 64),
    (f32, DataType.FLOAT32, 32),
    ("torch.float32", DataType.FLOAT32, 32),
    (types.SimpleNamespace(name="float16"), DataType.FLOAT16, 64),
    (tf32, DataType.TFLOAT32, 32),
    (f64, DataType.FLOAT64, 16),
    (e4m3, DataType.UINT8, 128),
    (e5m2, DataType.UINT8, 128),
    ("float8_e4m3fn", DataType.UINT8, 128),
    (u8, DataType.UINT8, 128),
    (s32, DataType.INT32, 32),
    ("u32", DataType.UINT32, 32),
    ("s64", DataType.INT64, 16),
    ("u16", DataType.UINT16, 64),
])
def test_dtypes_and_default_inner_box(dtype, dt, inner):
    p = tma_params((512, 1024), dtype)
    assert p.data_type is dt
    assert p.box_dims == (inner, 64)
    assert p.box_dims[0] * p.element_bytes == 128


@pytest.mark.parametrize("swizzle,mode,inner", [
    ("128B", Swizzle.B128, 64), ("64b", Swizzle.B64, 32), ("32B", Swizzle.B32, 16),
    (None, Swizzle.NONE, 64), ("none", Swizzle.NONE, 64),
    (Swizzle.B128_ATOM_64B, Swizzle.B128_ATOM_64B, 64),
])
def test_swizzle_modes_set_the_default_box(swizzle, mode, inner):
    p = tma_params((256, 256), bf16, swizzle=swizzle)
    assert p.swizzle is mode
    assert p.box_dims == (inner, 64)


def test_default_box_is_clamped_to_small_tensors():
    assert tma_params((8, 24), bf16).box_dims == (24, 8)
    assert tma_params((5,), f32, swizzle=None).box_dims == (8,)  # rounded up to 16 bytes


def test_unswizzled_box_may_be_wider_than_128_bytes():
    p = tma_params((64, 1024), bf16, box_shape=(16, 256), swizzle=None)
    assert p.box_dims == (256, 16)


def test_options():
    p = tma_params((4, 64, 64), f32, box_shape=(1, 8, 32), swizzle=None, l2_promotion="256B",
                   oob_fill="nan", element_strides=(1, 2, 1))
    assert p.l2_promotion is L2Promotion.B256
    assert p.oob_fill is OobFill.NAN_REQUEST_ZERO_FMA
    assert p.element_strides == (1, 2, 1)  # reversed: (dim0, dim1, dim2)
    assert p.box_bytes == 32 * 4 * 4 * 1
    assert tma_params((64, 64), bf16, l2_promotion=None).l2_promotion is L2Promotion.NONE
    assert tma_params((64, 64), bf16, l2_promotion=L2Promotion.B64).l2_promotion is \
        L2Promotion.B64


def test_interleave_options():
    p = tma_params((4, 8, 16), bf16, box_shape=(1, 8, 16), interleave="16B", swizzle=None)
    assert p.interleave is Interleave.B16
    p = tma_params((4, 8, 16), bf16, box_shape=(1, 8, 16), interleave="32B", swizzle="32B")
    assert p.interleave is Interleave.B32 and p.swizzle is Swizzle.B32


def test_describe_lists_every_argument():
    text = tma_params((1024, 4096), bf16).describe()
    for needle in ("cuTensorMapEncodeTiled(", "BFLOAT16 (9)", "tensorRank     = 2",
                   "[4096, 1024]", "[8192] bytes", "[64, 64]", "8192 bytes per copy",
                   "elementStrides = [1, 1]", "interleave     = NONE (0)", "B128 (3)",
                   "l2Promotion    = B128 (2)", "oobFill        = NONE (0)"):
        assert needle in text, needle


def test_params_are_frozen_and_comparable():
    p = tma_params((64, 64), bf16)
    with pytest.raises(AttributeError):
        p.rank = 3
    assert p == tma_params((64, 64), "bf16")
    assert hash(p) == hash(tma_params((64, 64), "bf16"))


def test_direct_construction_coerces_enums_and_lists():
    p = TmaParams(9, 2, [128, 64], [256], [64, 64], [1, 1], 0, 3, 2, 0)
    assert p.data_type is DataType.BFLOAT16 and p.swizzle is Swizzle.B128
    assert p.global_dims == (128, 64) and p == tma_params((64, 128), bf16)


# ------------------------------------------------------------ the 3-D view


def test_3d_view_of_a_row_major_matrix():
    p = tma_params_3d(1024, 4096, bf16, 128, 256)
    assert p.rank == 3
    assert p.global_dims == (64, 1024, 64)
    assert p.global_strides == (4096 * 2, 128)
    assert p.box_dims == (64, 128, 4)
    assert p.swizzle is Swizzle.B128
    assert p.box_bytes == 128 * 256 * 2


def test_3d_padded_store_box():
    p = tma_params_3d(512, 256, bf16, 128, 64, swizzle_128b=False, padding=True)
    assert p.box_dims == (72, 128, 1)
    assert p.swizzle is Swizzle.NONE


def test_3d_fp8_and_options():
    p = tma_params_3d(256, 512, e4m3, 64, 128, l2_promotion="none")
    assert p.data_type is DataType.UINT8
    assert p.global_strides == (512, 64)
    assert p.l2_promotion is L2Promotion.NONE


# ------------------------------------------------------------ validation errors


def _err(fn, *args, **kwargs) -> str:
    with pytest.raises(TmaError) as ei:
        fn(*args, **kwargs)
    msg = str(ei.value)
    assert msg.startswith(__file__), msg  # points at the caller
    return msg


def test_tma_error_is_a_config_error():
    assert issubclass(TmaError, ConfigError)
    assert issubclass(TmaError, PyptxError) and issubclass(TmaError, ValueError)


@pytest.mark.parametrize("args,kwargs,needles", [
    (((), bf16), {}, ["shape: TMA expects 1..5 dims, got 0"]),
    (((2,) * 6, bf16), {}, ["1..5 dims, got 6"]),
    (((64, 0), bf16), {}, ["shape[1]: expected a positive size, got 0"]),
    (((64, True), bf16), {}, ["shape[1]: expected an int, got True"]),
    (("64x64", bf16), {}, ["shape: expected a sequence of ints"]),
    (((2**33, 8), u8), {"box_shape": (1, 16)},
     ["globalDim[1] (shape axis 0)", "1..2**32 elements, got 8589934592"]),
    (((64, 3), bf16), {"swizzle": None},
     ["globalStrides[0] (the step of shape axis 0)", "multiple of 16 bytes", "got 6 bytes"]),
    (((2, 2**31, 256), f32), {"box_shape": (1, 1, 4), "swizzle": None},
     ["globalStrides[1] (the step of shape axis 0)", "less than 2**40 bytes",
      "got 2199023255552"]),
    (((512, 512), bf16), {"box_shape": (300, 64)},
     ["boxDim[1] (the box along shape axis 0)", "1..256 elements, got 300"]),
    (((512, 512), bf16), {"box_shape": (0, 64)}, ["boxDim[1]", "got 0"]),
    (((512, 512), bf16), {"box_shape": (64, 12), "swizzle": None},
     ["boxDim[0] (the box along shape axis 1)", "multiple of 16 bytes",
      "12 x 2 B = 24 bytes", "multiple of 8 elements"]),
    (((512, 512), bf16), {"box_shape": (64, 128)},
     ["boxDim[0]", "swizzle B128 allows at most 128 bytes (64 elements)",
      "128 x 2 B = 256 bytes"]),
    (((512, 512), f32), {"box_shape": (64, 32), "swizzle": "64B"},
     ["swizzle B64 allows at most 64 bytes (16 elements)", "32 x 4 B = 128 bytes"]),
    (((512, 512), bf16), {"box_shape": (64, 64), "swizzle": "32B"},
     ["swizzle B32 allows at most 32 bytes"]),
    (((512, 512), bf16), {"box_shape": (64,)},
     ["box_shape: expected 2 values (one per axis of shape (512, 512)), got 1"]),
    (((512, 512), bf16), {"element_strides": (1, 0)},
     ["elementStrides[0] (along shape axis 1): expected 1..8, got 0"]),
    (((512, 512), bf16), {"element_strides": (9, 1)}, ["elementStrides[1]", "got 9"]),
    (((512, 512), bf16), {"element_strides": (1, 1, 1)},
     ["element_strides: expected 2 values"]),
    (((512, 512), bf16), {"swizzle": "256B"},
     ["swizzle: expected one of", "'128b'", "got '256B'"]),
    (((512, 512), bf16), {"l2_promotion": "512B"}, ["l2_promotion: expected one of"]),
    (((512, 512), bf16), {"oob_fill": "inf"}, ["oob_fill: expected one of", "'nan'"]),
    (((512, 512), bf16), {"interleave": "64B"}, ["interleave: expected one of"]),
    (((512, 512), u8), {"oob_fill": "nan"},
     ["oob_fill NAN_REQUEST_ZERO_FMA: expected a floating-point data type, got UINT8"]),
    (((512, 512), e4m3), {"oob_fill": "nan"}, ["fp8 travels as UINT8"]),
    (((64, 64), bf16), {"interleave": "16B"}, ["interleave B16: expected rank >= 3, got 2"]),
    (((4, 8, 16), bf16), {"box_shape": (1, 8, 16), "interleave": "32B", "swizzle": None},
     ["interleave B32 requires swizzle B32, got NONE"]),
    (((4, 8, 24), bf16), {"box_shape": (1, 8, 16), "interleave": "32B", "swizzle": "32B"},
     ["globalStrides[0]", "multiple of 32 bytes", "got 48 bytes"]),
    (((64, 64), pred), {}, ["dtype: TMA has no data type for pred"]),
    (((64, 64), f16x2), {}, ["no data type for f16x2"]),
    (((64, 64), "complex64"), {}, ["dtype: expected a PTX type", "'complex64'"]),
    (((64, 64), bf16, "diag"), {}, ["layout: expected Layout.ROW or Layout.COL, got 'diag'"]),
])
def test_tma_params_errors(args, kwargs, needles):
    msg = _err(tma_params, *args, **kwargs)
    for needle in needles:
        assert needle in msg, (needle, msg)


@pytest.mark.parametrize("args,needles", [
    ((1024, 4096, bf16, 128, 64), []),  # valid: control
    ((0, 4096, bf16, 128, 64), ["height: expected a positive int, got 0"]),
    ((1024, 4000, bf16, 128, 64), ["width:", "multiple of 64, got 4000"]),
    ((1024, 4096, bf16, 128, 96), ["box_minor: expected a multiple of 64 columns, got 96"]),
    ((1024, 4096, bf16, 300, 64), ["boxDim[1] (the box along rows (height, box_major))",
                                   "got 300"]),
    ((1024, 4096, bf16, 128, 64 * 300), ["boxDim[2]", "box_minor / 64", "got 300"]),
    ((1024, 4096, f32, 128, 64), ["swizzle B128 allows at most 128 bytes",
                                  "64 x 4 B = 256 bytes"]),
    ((1024, 4096, bf16, 1.5, 64), ["box_major: expected a positive int, got 1.5"]),
])
def test_tma_params_3d_errors(args, needles):
    if not needles:
        tma_params_3d(*args)
        return
    msg = _err(tma_params_3d, *args)
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_3d_padding_needs_no_swizzle():
    msg = _err(tma_params_3d, 512, 256, bf16, 128, 64, padding=True)
    assert "72-element inner box" in msg and "swizzle_128b=False" in msg


@pytest.mark.parametrize("args,needles", [
    ((9, 0, (), (), (), ()), ["tensorRank: expected 1..5 dims, got 0"]),
    ((9, 2, (64, 64), (), (64, 64), (1, 1)),
     ["global_strides: expected 1 values for rank 2, got 0"]),
    ((9, 2, (64, 64), (128,), (64,), (1, 1)), ["box_dims: expected 2 values"]),
    ((99, 1, (64,), (), (64,), (1,)), ["data_type: expected one of UINT8", "got 99"]),
    ((9, 1, (64,), (), (64,), (1,), 0, 7), ["swizzle: expected one of", "got 7"]),
    ((9, 1, (64,), (), (64.0,), (1,)), ["box_dims[0]: expected an int, got 64.0"]),
])
def test_direct_construction_errors(args, needles):
    msg = _err(TmaParams, *args)
    for needle in needles:
        assert needle in msg, (needle, msg)


# ------------------------------------------------------------ encode (mocked driver)


def _fake_driver(monkeypatch, ctx: int = 1):
    """An opened driver whose current context is ``ctx``; ``calls["encode"]`` records the
    arguments ``cuTensorMapEncodeTiled`` gets."""
    calls = {}

    def encode_tiled(*args, what=""):
        calls["encode"] = args
        return bytes(range(128))

    monkeypatch.setattr(driver, "cuda", lambda: object())
    monkeypatch.setattr(driver, "current_context", lambda: ctx)
    monkeypatch.setattr(driver, "tensor_map_encode_tiled", encode_tiled)
    return calls


def test_encode_passes_every_parameter(monkeypatch):
    calls = _fake_driver(monkeypatch)
    p = tma_params((1024, 4096), bf16, oob_fill="nan")
    blob = encode(p, 0x7F0000001000)
    assert blob == bytes(range(128))
    assert calls["encode"] == (9, 2, 0x7F0000001000, (4096, 1024), (8192,), (64, 64), (1, 1),
                               0, 3, 2, 1)


def test_encode_makes_a_context_current_when_none_is(monkeypatch):
    _fake_driver(monkeypatch, ctx=0)
    seen = []
    monkeypatch.setattr(driver, "ensure_context", seen.append)
    encode(tma_params((64, 64), bf16))
    assert seen == [0]


def test_encode_driver_error_names_the_call(monkeypatch):
    """A failing encode names the call, the driver's error and the descriptor."""
    class Lib:
        @staticmethod
        def cuTensorMapEncodeTiled(*args):
            return 1

    monkeypatch.setattr(driver, "cuda", lambda: Lib)
    monkeypatch.setattr(driver, "current_context", lambda: 1)
    monkeypatch.setattr(driver, "error_name", lambda err: "CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(LaunchError, match="cuTensorMapEncodeTiled failed: "
                                          "CUDA_ERROR_INVALID_VALUE.*BFLOAT16"):
        encode(tma_params((64, 64), bf16))


def test_encode_without_driver(monkeypatch):
    monkeypatch.setattr(driver, "cuda", lambda: None)
    monkeypatch.setattr(driver, "unavailable_reason", lambda: "libcuda.so.1 was not found")
    with pytest.raises(RuntimeUnavailableError, match="needs the CUDA driver: libcuda"):
        encode(tma_params((64, 64), bf16))
    with pytest.raises(RuntimeUnavailableError):
        synthesize_tma_descriptor((64, 64), bf16, Layout.ROW)


@pytest.mark.parametrize("addr,needle", [
    (8, "16-byte aligned address, got 8"), (-16, "got -16"), ("0x0", "got '0x0'"),
])
def test_encode_checks_the_address(addr, needle):
    assert needle in _err(encode, tma_params((64, 64), bf16), addr)


def test_encode_interleave_32b_needs_32_byte_alignment():
    p = tma_params((4, 8, 16), bf16, box_shape=(1, 8, 16), interleave="32B", swizzle="32B")
    assert "32-byte aligned address, got 16" in _err(encode, p, 16)


def test_encode_needs_params():
    assert "expected TmaParams" in _err(encode, (64, 64))


# ------------------------------------------------------------ synthesize + shim hand-off


@pytest.fixture
def fake_encode(monkeypatch):
    seen = []

    def fake(params, global_address=0):
        seen.append((params, global_address))
        return bytes([7]) * 128

    monkeypatch.setattr("pyptx.tma.encode", fake)
    return seen


def test_synthesize_tma_descriptor(fake_encode):
    tmap, host_ptr, dev_ptr = synthesize_tma_descriptor((128, 256), bf16, Layout.ROW,
                                                        placeholder_ptr=0x1000)
    assert isinstance(tmap, TensorMap)
    assert dev_ptr == 0  # by value: no device copy
    assert host_ptr == tmap.address and host_ptr % 64 == 0
    assert ctypes.string_at(host_ptr, 128) == tmap.blob == bytes(tmap) == bytes([7]) * 128
    assert tmap.params == tma_params((128, 256), bf16)
    assert fake_encode == [(tmap.params, 0x1000)]
    assert "BFLOAT16" in repr(tmap) and "B128" in repr(tmap)


def test_synthesize_forwards_options(fake_encode):
    tmap, _, _ = synthesize_tma_descriptor((128, 256), f32, "col", (32, 8), swizzle=None)
    assert tmap.params.global_dims == (128, 256) and tmap.params.box_dims == (32, 8)
    assert tmap.params.swizzle is Swizzle.NONE


def test_synthesize_3d(fake_encode):
    tmap, host_ptr, dev_ptr = synthesize_tma_descriptor_3d(
        1024, 4096, bf16, 128, 64, swizzle_128b=False, padding=True, placeholder_ptr=0x2000)
    assert tmap.params == tma_params_3d(1024, 4096, bf16, 128, 64, swizzle_128b=False,
                                        padding=True)
    assert dev_ptr == 0 and host_ptr == tmap.address
    assert fake_encode[0][1] == 0x2000


def test_synthesize_validates_before_encoding(fake_encode):
    _err(synthesize_tma_descriptor, (64, 3), bf16, Layout.ROW)
    assert fake_encode == []


def test_tensor_map_needs_128_bytes():
    assert "expected 128 bytes, got 3" in _err(TensorMap, tma_params((64, 64), bf16), b"abc")


def test_add_tma_spec_accepts_bytes_maps_and_addresses(monkeypatch, fake_encode):
    sent = []
    monkeypatch.setattr(launch, "_shim_call", lambda *a: sent.append(a))
    tmap, host_ptr, dev_ptr = synthesize_tma_descriptor((64, 64), bf16, Layout.ROW)
    launch.add_tma_spec_to_shim(5, 1, host_ptr, dev_ptr)
    launch.add_tma_spec_to_shim(5, 2, tmap)
    launch.add_tma_spec_to_shim(5, 3, tmap.blob)
    launch.add_tma_spec_to_shim(5, 4, bytearray(tmap.blob))
    blob = bytes([7]) * 128
    assert sent == [("add_tma", 5, i, blob) for i in (1, 2, 3, 4)]


@pytest.mark.parametrize("bad", [0, -8, True, 1.5, None])
def test_add_tma_spec_rejects_bad_maps(monkeypatch, bad):
    monkeypatch.setattr(launch, "_shim_call", lambda *a: None)
    with pytest.raises(LaunchError, match="add_tma_spec_to_shim"):
        launch.add_tma_spec_to_shim(5, 0, bad)


def test_import_does_not_load_cuda_python():
    code = "import sys, pyptx.tma; print(any(m == 'cuda' or m.startswith('cuda.') " \
           "for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
