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
