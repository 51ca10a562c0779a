import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from pyptx_jax.runtime import JaxRuntime


def test_entry_point_loads_jax_runtime():
    (ep,) = [ep for ep in entry_points(group="pyptx.runtimes") if ep.name == "jax"]
    assert ep.value == "pyptx_jax.runtime:JaxRuntime"
    assert ep.load() is JaxRuntime
    assert JaxRuntime.name == "jax"


def test_import_does_not_import_jax():
    code = "import sys, pyptx_jax, pyptx_jax.runtime; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_owns_rejects_non_jax_values():
    runtime = JaxRuntime()
    assert not runtime.owns(1.0)
    assert not runtime.owns([1, 2])


def test_owns_jax_arrays_and_tracers():
    jax = pytest.importorskip("jax")
    runtime = JaxRuntime()
    assert runtime.owns(jax.numpy.zeros(3))
    seen = []

    @jax.jit
    def f(x):
        seen.append(runtime.owns(x))
        return x

    f(jax.numpy.ones(2))
    assert seen == [True]
