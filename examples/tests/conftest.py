"""Fixtures of the examples' tests: core's ``assemble``/``ptxas_path`` and the torch tests'
``poison_outputs``, taken from those packages' test folders (one definition each)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGES = Path(__file__).resolve().parents[2] / "packages"


def _fixtures(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_core = _fixtures(PACKAGES / "pyptx-core" / "tests" / "conftest.py", "pyptx_core_test_fixtures")
ptxas_path = _core.ptxas_path
assemble = _core.assemble
poison_outputs = _fixtures(PACKAGES / "pyptx-torch" / "tests" / "conftest.py",
                           "pyptx_torch_test_fixtures").poison_outputs
