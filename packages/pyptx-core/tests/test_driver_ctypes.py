"""``pyptx.driver``'s ctypes bindings against a stand-in libcuda (``fake_libcuda.c``, built
here with the C compiler): argument types, out-parameters, 64-bit handles and addresses,
the driver's error names, and what ``jit`` builds on them. No GPU needed."""

import ctypes
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from pyptx import driver, jit
from pyptx.errors import CompileError, LaunchError

SOURCE = Path(__file__).with_name("fake_libcuda.c")


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in libcuda")
    out = tmp_path_factory.mktemp("libcuda") / "libcuda.so.1"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(SOURCE)], check=True)
    return out


@pytest.fixture
def fake(fake_lib, monkeypatch):
    """The driver opened from the stand-in; its state (context, init result) reset."""
    lib = ctypes.CDLL(str(fake_lib))
    lib.fake_set_init_result(0)
    lib.cuCtxSetCurrent(None)
    monkeypatch.setattr(driver, "_SONAMES", (str(fake_lib),))
    monkeypatch.setattr(driver, "_state", {})
    return lib


def test_device_queries(fake):
    assert driver.cuda() is not None and driver.unavailable_reason() is None
    assert driver.driver_version() == 12040
    assert driver.device_count() == 2
    assert driver.device_capability(0) == (9, 0)
    assert driver.max_shared_per_block(1) == 232448
    assert driver.multiprocessor_count(1) == 133
    assert driver.device_name(1) == "Fake GPU 1"
    assert driver.device_total_memory(0) == 80 << 30
    with pytest.raises(LaunchError, match=r"cuDeviceGet failed: CUDA_ERROR_INVALID_DEVICE "
                                          r"\(device 5\)"):
        driver.multiprocessor_count(5)
    assert driver.error_name(218) == "CUDA_ERROR_INVALID_PTX"
    assert driver.error_name(12345) == "CUresult 12345"


def test_contexts(fake):
    assert driver.current_context() == 0 and driver.current_device() is None
    driver.ensure_context(1)
    ctx = driver.current_context()
    assert ctx == 0x7F0000001000 + 11 and driver.current_device() == 1
    driver.set_current_context(0)
    assert driver.current_context() == 0
    driver.set_current_context(ctx)
    assert driver.current_device() == 1


def test_modules_and_functions(fake):
    module = driver.module_load(b"\x7fELF rest of a cubin")
    assert module == 0x7F0000002000
    with pytest.raises(LaunchError, match="cuModuleLoadData failed: CUresult 200 "
                                          r"\(loading k\)"):
        driver.module_load(b"not a cubin", what="loading k")
    fn = driver.module_function(module, "kern")
    assert fn == 0x7F0000003000 + 4
    driver.set_function_attribute(fn, driver.FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, 200000)
    assert driver.function_attribute(fn, driver.FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES) == 200000
    assert driver.function_attribute(fn, driver.FUNC_ATTR_LOCAL_SIZE_BYTES) == 0
    with pytest.raises(LaunchError, match="cuFuncSetAttribute failed: "
                                          "CUDA_ERROR_INVALID_VALUE .too much."):
        driver.set_function_attribute(fn, driver.FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      300000, what="too much")
    assert driver.module_load_ptx(".entry k {}")[:2] == (0, module)
    err, mod, log = driver.module_load_ptx("// nothing")
    assert (err, mod, log) == (218, 0, "fake ptxas: no .entry")


def test_jit_loads_through_the_bindings(fake):
    fn, module = jit.load_cubin(b"\x7fELF", "kern", dynamic_smem_bytes=100000)
    assert (fn, module) == (0x7F0000003000 + 4, 0x7F0000002000)
    assert driver.function_attribute(fn, driver.FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES) == 100000
    with pytest.raises(CompileError, match=r"rejected the PTX of 'k' "
                                           r"\(CUDA_ERROR_INVALID_PTX\):\n.*no \.entry"):
        jit.load_image("// no entry", "k")


def test_tensor_map_encode_passes_every_argument(fake):
    address = 0x7F12_3456_7800
    blob = driver.tensor_map_encode_tiled(9, 2, address, (4096, 1024), (8192,), (64, 64),
                                          (1, 1), 0, 3, 2, 1)
    assert len(blob) == 128
    words = struct.unpack("<16Q", blob)
    assert words[:15] == (9, 2, address, 4096, 1024, 8192, 64, 64, 1, 1, 0, 3, 2, 1, 0)
    with pytest.raises(LaunchError, match="cuTensorMapEncodeTiled failed: "
                                          "CUDA_ERROR_INVALID_VALUE .rank 3."):
        driver.tensor_map_encode_tiled(9, 3, 0, (1, 1, 1), (2, 2), (1, 1, 1), (1, 1, 1),
                                       0, 0, 0, 0, what="rank 3")


def test_a_failing_cuinit_is_reported(fake):
    fake.fake_set_init_result(100)
    assert driver.cuda() is None
    assert driver.unavailable_reason() == ("cuInit failed: CUDA_ERROR_NO_DEVICE (no usable "
                                           "GPU or driver)")
    assert driver.device_count() == 0 and driver.driver_version() == 0
    with pytest.raises(LaunchError, match="CUDA driver unavailable: cuInit failed"):
        driver.current_context()


def test_no_driver_library(monkeypatch, tmp_path):
    monkeypatch.setattr(driver, "_SONAMES", (str(tmp_path / "libcuda.so.1"),))
    monkeypatch.setattr(driver, "_state", {})
    assert driver.cuda() is None
    assert "libcuda.so.1) was not found" in driver.unavailable_reason()
