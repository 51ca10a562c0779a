"""Shared fixtures of the JAX tests: ``jax_gpu`` skips a test where JAX sees no GPU. Use it
module-wide with ``pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("jax_gpu")]``
(set ``XLA_PYTHON_CLIENT_PREALLOCATE`` before importing jax, as the GPU tests do)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def jax_gpu():
    """JAX's GPU devices; skips the test when there are none (or jax is missing)."""
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("needs a GPU for JAX")
    return gpus
