"""Fixtures of the kernel tests: core's ``assemble``/``ptxas_path`` the torch tests
``poison_outputs``, taken from those packages' test folders (one definition each), and core's
PTX simulator (``ptxsim``) on the import path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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
