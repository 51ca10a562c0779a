"""GPU tests of ``pyptx.jit``'s compile paths on warp-specialised kernels: ptxas and the
driver's whole-program compile give the head-dim-128 attention kernels (forward, dK/dV)
no local memory. The driver's linker (``cuLink*``), used before, compiled the PTX as
relocatable code, which ignores the consumers' ``setmaxnreg`` budget: 160-192 bytes of
stack per thread and 1.6x / 2.2x slower kernels on the H100.

    pytest -m gpu packages/pyptx-torch/tests/test_compile_path_gpu.py
"""

from __future__ import annotations

import importlib

import pytest

from pyptx import driver, jit

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]



def _kernels():
    from pyptx_kernels.flash_attention import fwd_kernel as fa
    fab = importlib.import_module("pyptx_kernels.flash_attention.backward")
    dkdv = [k for k in fab.build_attention_backward(2, 512, 4, 4, 128).kernels
            if "dkdv" in k.name]
    return [fa.build_attention(2, 512, 4, 4, 128), *dkdv]


def _local_bytes(fn: int) -> int:
    return driver.function_attribute(fn, driver.FUNC_ATTR_LOCAL_SIZE_BYTES)


@pytest.mark.parametrize("path", ["default", "driver"])
def test_warp_specialised_kernels_compile_without_local_memory(path, monkeypatch, tmp_path):
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    if path == "driver":  # no usable ptxas: the driver compiles the PTX when loading it
        monkeypatch.setenv("PYPTX_PTXAS", str(tmp_path / "no-ptxas"))
        assert jit.compiler() is None
    torch.cuda.init()
    driver.ensure_context(torch.cuda.current_device())
    for spec in _kernels():
        fn, _ = jit.compile_ptx_to_cubin(spec.ptx(), "sm_90a", spec.name)
        assert _local_bytes(fn) == 0, f"{spec.name} ({path}) uses local memory"


def test_ptxas_cubins_are_cached_and_driver_compiles_are_not(monkeypatch, tmp_path):
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    spec = _kernels()[0]
    driver.ensure_context(torch.cuda.current_device())
    if jit.compiler() is not None:
        assert jit.cubin_for(spec.ptx(), "sm_90a", spec.name) is not None
        assert len(list(tmp_path.glob("*.cubin"))) == 1
    monkeypatch.setenv("PYPTX_PTXAS", str(tmp_path / "no-ptxas"))
    assert jit.cubin_for(spec.ptx(), "sm_90a", spec.name) is None
