"""GPU tests of the JAX runtime (``pytest -m gpu``): numerics against float64 on fresh random
inputs, jit and eager, composition with jnp ops, vmap, several GPUs, torch and jax together."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

from pyptx.testing import build_row_scale

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
np = pytest.importorskip("numpy")


def _gpus():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _gpus(), reason="needs a GPU for JAX")]

def scale_ref(x, w):
    return np.asarray(x, np.float64) * np.asarray(w, np.float64)


def rel_err(out, ref):
    out = np.asarray(out, np.float64)
    assert np.isfinite(out).all(), "non-finite output: an element was not written"
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def poison(shape):
    """Leave NaNs in the allocator's free blocks so an unwritten output element shows."""
    jnp.full(shape, jnp.nan, jnp.float32).block_until_ready()


def inputs(key, B, N):
    kx, kw = jax.random.split(key)
    return (jax.random.normal(kx, (B, N), jnp.float32) * 0.3,
            jax.random.normal(kw, (N,), jnp.float32) * 0.1 + 1.0)


@pytest.mark.parametrize("B,N", [(16, 512), (64, 4096)])
def test_jit_and_eager(B, N):
    k = build_row_scale(B, N)
    x, w = inputs(jax.random.key(B * N), B, N)
    poison((B, N))
    out = jax.jit(lambda x, w: k(x, w))(x, w)
    assert out.shape == (B, N) and out.dtype == jnp.float32
    assert rel_err(out, scale_ref(x, w)) < 1e-5
    poison((B, N))
    assert rel_err(k(x, w), scale_ref(x, w)) < 1e-5


def test_composition_with_jnp_ops_and_two_kernels():
    rms = build_row_scale(32, 1024)
    sm = importlib.import_module("pyptx_kernels.rows.softmax").build_softmax(32, 1024)
    x, w = inputs(jax.random.key(7), 32, 1024)

    @jax.jit
    def f(x, w):
        return sm(rms(jnp.tanh(x) * 2.0, w)) + 1.0

    y = scale_ref(np.tanh(np.asarray(x, np.float64)) * 2.0, w)
    e = np.exp(y - y.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True) + 1.0
    assert rel_err(f(x, w), ref) < 1e-5


def test_vmap_runs_per_batch_element():
    k = build_row_scale(8, 256)
    xs = jax.random.normal(jax.random.key(3), (4, 8, 256), jnp.float32)
    w = jnp.ones(256, jnp.float32) * 1.5
    out = jax.jit(jax.vmap(k, in_axes=(0, None)))(xs, w)
    ref = np.stack([scale_ref(x, w) for x in np.asarray(xs)])
    assert rel_err(out, ref) < 1e-5


def test_each_local_gpu_runs_its_own_copy():
    k = build_row_scale(16, 512)
    for dev in _gpus():
        x, w = inputs(jax.random.key(dev.id + 11), 16, 512)
        x, w = jax.device_put(x, dev), jax.device_put(w, dev)
        out = jax.jit(lambda x, w: k(x, w))(x, w)
        assert out.devices() == {dev}
        assert rel_err(out, scale_ref(x, w)) < 1e-5


@pytest.mark.skipif(len(_gpus()) < 2, reason="needs two GPUs")
def test_shard_map_across_two_gpus():
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    try:
        from jax import shard_map
    except ImportError:
        from jax.experimental.shard_map import shard_map
    k = build_row_scale(16, 512)
    mesh = Mesh(np.array(_gpus()[:2]), ("d",))
    x, w = inputs(jax.random.key(5), 32, 512)
    x = jax.device_put(x, NamedSharding(mesh, P("d", None)))
    w = jax.device_put(w, NamedSharding(mesh, P()))
    f = jax.jit(shard_map(lambda a, b: k(a, b), mesh=mesh, in_specs=(P("d", None), P()),
                          out_specs=P("d", None)))
    out = f(x, w)
    assert {d for d in out.devices()} == set(_gpus()[:2])
    assert rel_err(out, scale_ref(x, w)) < 1e-5


def test_same_kernel_from_torch_and_jax_in_one_process():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    k = build_row_scale(16, 512)
    x, w = inputs(jax.random.key(9), 16, 512)
    out_j = np.asarray(jax.jit(lambda x, w: k(x, w))(x, w))
    xt = torch.from_numpy(np.asarray(x)).cuda()
    wt = torch.from_numpy(np.asarray(w)).cuda()
    out_t = k(xt, wt).cpu().numpy()
    assert np.array_equal(out_j, out_t)
    assert rel_err(out_t, scale_ref(x, w)) < 1e-5


def test_ffi_is_registered():
    import pyptx.jax_support as js

    assert js.ensure_ffi_registered() is True
    assert js.shim_is_available() is True


@pytest.mark.parametrize("example,op_name,n_in", [("pyptx_kernels.rows.rms_norm", "rms_norm_op", 2),
                                                  ("pyptx_kernels.rows.layer_norm", "layer_norm_op",
                                                   3)])
def test_jax_grad_matches_torch_autograd(example, op_name, n_in):
    """One ``differentiable_kernel`` object: jax.grad (custom VJP) and torch autograd run the
    same forward and backward kernels on the same inputs and agree."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    B, N = 64, 1024
    op = getattr(importlib.import_module(example), op_name)(B, N)
    rng = np.random.default_rng(abs(hash(example)) % 2**32)
    shapes = [(B, N), (N,), (N,)][:n_in]
    host = [rng.standard_normal(s).astype(np.float32) * (0.1 if i else 1.0) + (1.0 if i == 1 else 0.0)
            for i, s in enumerate(shapes)]
    g = rng.standard_normal((B, N)).astype(np.float32)
    grads_j = jax.jit(jax.grad(lambda *a: (op(*a) * jnp.asarray(g)).sum(),
                               argnums=tuple(range(n_in))))(*map(jnp.asarray, host))
    ts = [torch.from_numpy(h).cuda().requires_grad_() for h in host]
    (op(*ts) * torch.from_numpy(g).cuda()).sum().backward()
    for gj, t in zip(grads_j, ts):
        gt = t.grad.cpu().numpy().astype(np.float64)
        assert np.isfinite(np.asarray(gj)).all()
        assert float(np.linalg.norm(np.asarray(gj, np.float64) - gt) / np.linalg.norm(gt)) < 1e-5


def test_jax_export_round_trip_in_a_fresh_process(tmp_path, monkeypatch):
    """A jitted function calling the kernel, exported with jax.export, serialised, then
    deserialised and run in a new process that never builds the kernel: the custom call names
    it by content hash, found in the disk cache on the first call."""
    import subprocess

    pytest.importorskip("flatbuffers")  # jax.export serialization needs it
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path / "cache"))
    k = build_row_scale(16, 512)
    x, w = inputs(jax.random.key(21), 16, 512)
    exp = jax.export.export(
        jax.jit(lambda x, w: k(x * 0.5, w) + 1.0),
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("pyptx_launch")],
    )(x, w)
    (tmp_path / "f.jax").write_bytes(exp.serialize())
    x2, w2 = inputs(jax.random.key(22), 16, 512)
    np.savez(tmp_path / "data.npz", x=np.asarray(x2), w=np.asarray(w2),
             ref=scale_ref(np.asarray(x2) * 0.5, w2) + 1.0)
    code = (
        "import os, sys\n"
        "os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')\n"
        "import jax, numpy as np, pyptx_jax\n"
        "assert pyptx_jax.ensure_ffi_registered()\n"
        "exp = jax.export.deserialize(bytearray(open(sys.argv[1], 'rb').read()))\n"
        "d = np.load(sys.argv[2])\n"
        "y = np.asarray(exp.call(d['x'], d['w']), np.float64)\n"
        "assert np.isfinite(y).all()\n"
        "print(np.linalg.norm(y - d['ref']) / np.linalg.norm(d['ref']))\n"
    )
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "f.jax"),
                          str(tmp_path / "data.npz")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert float(run.stdout.strip().splitlines()[-1]) < 1e-5


def test_an_executable_outlives_the_kernel_it_was_traced_with(tmp_path, monkeypatch):
    """A kernel built while tracing is garbage-collected (its record leaves the shim); the
    cached executable still runs: the handler finds the record again by its hash."""
    import gc
    import re

    from pyptx_shim import native

    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path / "cache"))
    build = build_row_scale
    f = jax.jit(lambda x, w: build(16, 512)(x, w))
    x, w = inputs(jax.random.key(31), 16, 512)
    handle = int(re.search(r"cubin_handle = (\d+) : ui64", f.lower(x, w).as_text()).group(1))
    assert rel_err(f(x, w), scale_ref(x, w)) < 1e-5
    gc.collect()
    assert not native.is_registered(handle)  # the record went with the kernel
    x, w = inputs(jax.random.key(32), 16, 512)
    assert rel_err(f(x, w), scale_ref(x, w)) < 1e-5  # the same executable, resolved by hash
    assert native.is_registered(handle)
