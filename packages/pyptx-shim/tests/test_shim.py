"""The launcher builds, imports without a GPU, says why it cannot launch, and refuses bad input."""

import os

import pytest

import pyptx_shim
from pyptx_shim import ShimError, native

NO_GPU = not os.path.exists("/dev/nvidia0")


def test_extension_is_built():
    assert native is not None, pyptx_shim.shim_load_error()


@pytest.mark.skipif(not NO_GPU, reason="machine has a GPU")
def test_no_driver_is_reported():
    assert pyptx_shim.shim_is_available() is False
    assert "CUDA driver" in pyptx_shim.shim_load_error()


def test_unknown_handle_is_an_error_not_a_crash():
    with pytest.raises(ShimError, match="unknown kernel handle 987654"):
        native.launch(987654, 0, 1, 2, 3)
    with pytest.raises(ShimError, match="unknown handle"):
        native.add_scalar(987654, b"\x01\x00\x00\x00")
    with pytest.raises(ShimError, match="unknown handle"):
        native.unregister(987654)


@pytest.mark.parametrize("grid", [(1, 0, 1), (1, 1), "abc", (1, -2, 1)])
def test_bad_geometry_is_rejected(grid):
    with pytest.raises((TypeError, ValueError)):
        native.register(1, 0x1000, grid, (32, 1, 1), (1, 1, 1), 0, 2)


def test_bad_argument_types():
    with pytest.raises(TypeError):
        native.launch(1)
    with pytest.raises(TypeError):
        native.launch("x", 0)
    with pytest.raises(ValueError, match="128 bytes"):
        native.add_tma(1, 0, b"short")


def test_null_function_is_refused():
    with pytest.raises(ShimError, match="null"):
        native.register(5, 0, (1, 1, 1), (1, 1, 1), (1, 1, 1), 0, 1)


def test_ffi_handler_reports_the_version_it_was_built_against():
    major, minor, from_jaxlib = native.ffi_api_version()
    assert (major, minor) >= (0, 1) and isinstance(from_jaxlib, bool)
    header = _jaxlib_ffi_header()
    if from_jaxlib and header is not None:
        text = header.read_text()
        assert f"#define XLA_FFI_API_MAJOR {major}\n" in text
        assert f"#define XLA_FFI_API_MINOR {minor}\n" in text


def _jaxlib_ffi_header():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("jaxlib")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "include" / "xla" / "ffi" / "api" / "c_api.h"
        if path.is_file():
            return path
    return None


# Struct -> fields the handler reads; each must sit where jaxlib's header puts it.
_FFI_FIELDS = {
    "XLA_FFI_Extension_Base": ["struct_size", "type", "next"],
    "XLA_FFI_Metadata": ["api_version", "traits"],
    "XLA_FFI_Metadata_Extension": ["extension_base", "metadata"],
    "XLA_FFI_Error_Create_Args": ["message", "errc"],
    "XLA_FFI_Stream_Get_Args": ["ctx", "stream"],
    "XLA_FFI_DeviceOrdinal_Get_Args": ["ctx", "device_ordinal"],
    "XLA_FFI_Api": ["api_version", "XLA_FFI_Error_Create", "XLA_FFI_Stream_Get",
                    "XLA_FFI_DeviceOrdinal_Get"],
    "XLA_FFI_Args": ["size", "types", "args"],
    "XLA_FFI_Rets": ["size", "types", "rets"],
    "XLA_FFI_ByteSpan": ["ptr", "len"],
    "XLA_FFI_Scalar": ["dtype", "value"],
    "XLA_FFI_Attrs": ["size", "types", "names", "attrs"],
    "XLA_FFI_Buffer": ["dtype", "data", "rank", "dims"],
    "XLA_FFI_CallFrame": ["api", "ctx", "stage", "args", "rets", "attrs"],
}


def test_ffi_mirror_matches_jaxlibs_header(tmp_path):
    """The shim's own copy of the FFI declarations (used without jaxlib at build time) has
    every field the handler reads at the offset jaxlib's header gives it."""
    import shutil
    import subprocess
    from pathlib import Path

    header = _jaxlib_ffi_header()
    if header is None or shutil.which("g++") is None:
        pytest.skip("needs jaxlib's FFI header and g++")
    mirror = Path(pyptx_shim.__file__).parent / "csrc" / "xla_ffi_mirror.h"
    asserts = "\n".join(
        f'static_assert(offsetof({s}, {f}) == offsetof(mirror::{s}, {f}), "{s}.{f}");'
        for s, fields in _FFI_FIELDS.items() for f in fields)
    src = tmp_path / "layout.cpp"
    src.write_text(f'#include <cstddef>\n#include <cstdint>\n#include "xla/ffi/api/c_api.h"\n'
                   f'#undef XLA_FFI_API_MAJOR\n#undef XLA_FFI_API_MINOR\n'
                   f'namespace mirror {{\n#include "{mirror}"\n}}\n{asserts}\n')
    include = header.parents[3]
    r = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{include}", str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_device_functions_need_a_registered_handle():
    with pytest.raises(ShimError, match="unknown handle 987655"):
        native.set_device_function(987655, 0, 0x1000)
    with pytest.raises(ShimError, match="out of range"):
        native.set_device_function(987655, 64, 0x1000)
    with pytest.raises(ShimError, match="null"):
        native.set_device_function(987655, 0, 0)
    assert native.is_registered(987655) is False
