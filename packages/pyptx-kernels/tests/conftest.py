"""Fixtures of the kernel tests: core's ``assemble``/``ptxas_path`` the torch tests
``poison_outputs``, taken from those packages' test folders (one definition each), and core's
PTX simulator (``ptxsim``) on the import path; and the ``slow`` marks of the long simulator
cases (``SLOW``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[2]
CORE_TESTS = PACKAGES / "pyptx-core" / "tests"
sys.path.insert(0, str(CORE_TESTS))


def _fixtures(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_core = _fixtures(CORE_TESTS / "conftest.py", "pyptx_core_test_fixtures")
_torch = _fixtures(PACKAGES / "pyptx-torch" / "tests" / "conftest.py", "pyptx_torch_test_fixtures")
ptxas_path = _core.ptxas_path
assemble = _core.assemble
poison_outputs = _torch.poison_outputs
jax_gpu = _fixtures(PACKAGES / "pyptx-jax" / "tests" / "conftest.py", "pyptx_jax_test_fixtures").jax_gpu

#: Node-id prefixes (file::test, relative to this folder) of the long simulator cases,
#: each over ~2 s on one core: marked ``slow``, run once in nox's tests session.
SLOW = (
    "test_tensorcore_sim.py::test_attention_backward",  # also _dq_convert, _convert_lag, _stats_lead
    "test_tensorcore_sim.py::test_attention_forward",
    "test_tensorcore_sim.py::test_dkdv_trace",
    "test_tensorcore_sim.py::test_ordered_dq_rotation_needs_a_resident_head",
    "test_tensorcore_sim.py::test_cooperative_gemm_every_layout",
    "test_tensorcore_sim.py::test_gemm_one_epilogue_buffer",
    "test_tensorcore_sim.py::test_gemm_two_bands_per_warpgroup",
    "test_tensorcore_sim.py::test_gemm_split_tail",
    "test_tensorcore_sim.py::test_grouped_gemm_forward",
    "test_tensorcore_sim.py::test_fp8_gemm",
    "test_sim_attention_d128.py::test_bq128_backward_matches_float64",
    "test_sim_attention_fused.py::test_fused_backward_matches_float64",
    "test_rowwise_kernels.py::test_backward_numerics_in_simulator[9-8192-",
    "test_rowwise_kernels.py::test_backward_numerics_in_simulator[2-4097-",
)
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Mark this folder's tests named by ``SLOW`` with ``slow``."""
    for item in items:
        path = Path(str(item.path)).resolve()
        if path.parent == HERE and "::" in item.nodeid:
            local = path.name + item.nodeid[item.nodeid.index("::"):]
            if local.startswith(SLOW):
                item.add_marker(pytest.mark.slow)
