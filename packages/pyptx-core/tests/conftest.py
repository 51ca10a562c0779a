"""Shared fixtures: ``assemble`` runs ptxas on PTX text (fails, not skips, under CI=true)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest


def find_ptxas() -> str | None:
    """ptxas from PATH, $CUDA_HOME/bin or /usr/local/cuda/bin."""
    hit = shutil.which("ptxas")
    if hit:
        return hit
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "ptxas"), os.X_OK):
            return os.path.join(root, "bin", "ptxas")
    return None


@pytest.fixture(scope="session")
def ptxas_path() -> str:
    path = find_ptxas()
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but no ptxas was found: the ptxas tests must run in CI")
        pytest.skip("ptxas not found (install CUDA or pip install 'pyptx-core[ptxas]')")
    return path


@pytest.fixture(scope="session")
def assemble(ptxas_path):
    """``assemble(ptx, arch="sm_90a") -> ptxas -v stderr``; raises AssertionError with the log."""

    def run(ptx: str, arch: str = "sm_90a") -> str:
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "k.ptx")
            with open(src, "w") as f:
                f.write(ptx)
            p = subprocess.run(
                [ptxas_path, "-v", "--gpu-name", arch, src, "-o", os.path.join(d, "k.cubin")],
                capture_output=True, text=True,
            )
        if p.returncode != 0:
            numbered = "\n".join(f"{i + 1:5d} {ln}" for i, ln in enumerate(ptx.splitlines()))
            raise AssertionError(f"ptxas rejected the PTX:\n{p.stderr}\n{numbered}")
        return p.stderr

    return run
