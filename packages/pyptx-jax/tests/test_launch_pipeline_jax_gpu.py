"""GPU test of issue 18 item 4 through JAX: a JAX plan loads its record on every local GPU
(one shim ``register``, then ``set_device_function`` per device); every device launches in
clusters, the non-portable size 16 included. Results are integers compared exactly against
values computed from fresh random inputs (an unwritten element cannot match)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
np = pytest.importorskip("numpy")

from pyptx import Tile, kernel, ptx, reg  # noqa: E402
from pyptx.types import s32, u32  # noqa: E402


def _sm90_gpus():
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        return []
    return [d for d in gpus if getattr(d, "compute_capability", "9.0") == "9.0"]


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _sm90_gpus(), reason="needs an sm_90 GPU for JAX")]


def build_cluster_rank(c: int):
    """Y[cta] = 1000 * %cluster_nctarank + %cluster_ctarank + X[cta], in clusters of ``c``."""

    @kernel(in_specs=(Tile("G", s32),), out_specs=(Tile("G", s32),),
            grid=lambda G: (G, 1, 1), block=(32, 1, 1), cluster=(c, 1, 1), arch="sm_90a")
    def cluster_rank_jax(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        cta = reg.from_(ptx.special.ctaid.x(), u32)
        with ptx.if_(reg.from_(ptx.special.tid.x(), u32) == 0):
            rank = ptx.special.cluster_ctarank()
            n = ptx.special.cluster_nctarank()
            x = reg.scalar(s32)
            ptx.inst.ld.global_.s32(x, ptx.addr(px + cta * 4))
            ptx.inst.st.global_.s32(ptx.addr(py + cta * 4), reg.from_(n * 1000 + rank, s32) + x)
        ptx.ret()

    return cluster_rank_jax


@pytest.mark.parametrize("c", [2, 16])
def test_cluster_dims_apply_on_every_local_gpu(c):
    k = build_cluster_rank(c)
    f = jax.jit(lambda x: k(x))
    rng = np.random.default_rng(c)
    for d in _sm90_gpus():
        host = rng.integers(-10**6, 10**6, size=64 * c, dtype=np.int32)
        jnp.full((64 * c,), -7, jnp.int32, device=d).block_until_ready()  # leave junk behind
        y = np.asarray(f(jax.device_put(host, d)))
        want = 1000 * c + np.arange(64 * c, dtype=np.int32) % c + host
        assert np.array_equal(y, want), f"{d}, cluster {c}"
