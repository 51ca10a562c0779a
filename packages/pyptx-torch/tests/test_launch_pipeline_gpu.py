"""GPU tests of issue 18's launch pipeline that are not about the C++ fast path itself:
cluster launch attributes on every device (including devices a record reaches through the
shim's ``set_device_function``).

Outputs are poisoned before each launch (``eager.set_poison``) and every expected value
depends on a fresh random input, so an unwritten or mis-launched element fails. Integer
results are compared exactly (tolerance 0).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pyptx import Tile, kernel, ptx, reg  # noqa: E402
from pyptx.types import s32, u32  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def build_cluster_rank(c: int):
    """Y[cta] = 1000 * %cluster_nctarank + %cluster_ctarank + X[cta], in clusters of ``c``."""

    @kernel(in_specs=(Tile("G", s32),), out_specs=(Tile("G", s32),),
            grid=lambda G: (G, 1, 1), block=(32, 1, 1), cluster=(c, 1, 1), arch="sm_90a")
    def cluster_rank(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        cta = reg.from_(ptx.special.ctaid.x(), u32)
        with ptx.if_(reg.from_(ptx.special.tid.x(), u32) == 0):
            rank = ptx.special.cluster_ctarank()
            n = ptx.special.cluster_nctarank()
            x = reg.scalar(s32)
            ptx.inst.ld.global_.s32(x, ptx.addr(px + cta * 4))
            ptx.inst.st.global_.s32(ptx.addr(py + cta * 4), reg.from_(n * 1000 + rank, s32) + x)
        ptx.ret()

    return cluster_rank


def expected(x: torch.Tensor, c: int) -> torch.Tensor:
    cta = torch.arange(x.numel(), device=x.device, dtype=torch.int32)
    return 1000 * c + cta % c + x


def sm90_devices() -> list[int]:
    return [i for i in range(torch.cuda.device_count())
            if torch.cuda.get_device_capability(i) == (9, 0)]


@pytest.mark.parametrize("c", [2, 16])  # 16 is past the portable 8: needs the shim's opt-in
def test_cluster_dims_apply_on_every_device(c, poison_outputs):
    """Each sm_90 GPU, in turn, runs the same record: the first through the shim's register,
    the others through set_device_function. Every CTA sees the cluster size and its rank."""
    devices = sm90_devices()
    if not devices:
        pytest.skip("needs an sm_90 GPU (the kernel targets sm_90a)")
    k = build_cluster_rank(c)
    for _ in range(2):  # a repeat reuses each device's plan (poisoned: the Python launch)
        for d in devices:
            x = torch.randint(-10**6, 10**6, (64 * c,), dtype=torch.int32, device=f"cuda:{d}")
            y = k(x)
            assert y.device == x.device
            assert torch.equal(y, expected(x, c)), f"cuda:{d}, cluster {c}"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cluster_dims_on_a_device_reached_through_set_device_function(poison_outputs):
    """The record is loaded on cuda:1 first (it registers there), then on cuda:0 (added with
    set_device_function): both launch in clusters of 16."""
    if len(sm90_devices()) < 2:
        pytest.skip("needs two sm_90 GPUs")
    k = build_cluster_rank(16)
    for d in (1, 0, 1, 0):
        x = torch.randint(-10**6, 10**6, (128 * 16,), dtype=torch.int32, device=f"cuda:{d}")
        assert torch.equal(k(x), expected(x, 16)), f"cuda:{d}"


def test_a_record_is_registered_with_the_shim_once_and_released_with_its_kernels(poison_outputs,
                                                                                 monkeypatch):
    """Item 1: two kernels of the same content share one record, registered with the shim once
    (on its first load); when both kernels are garbage-collected the shim forgets it."""
    import gc

    import pyptx.launch as launch
    from pyptx_shim import native

    if not sm90_devices():
        pytest.skip("needs an sm_90 GPU (the kernel targets sm_90a)")
    registered = []
    real = launch.register_launch_config

    def counting(handle, *args, **kwargs):
        registered.append(handle)
        return real(handle, *args, **kwargs)

    monkeypatch.setattr(launch, "register_launch_config", counting)
    a, b = build_cluster_rank(2), build_cluster_rank(2)
    g = 2 * 83  # a size no other test uses: a record of its own
    d = sm90_devices()[0]
    for k in (a, b, a):
        x = torch.randint(-10**6, 10**6, (g,), dtype=torch.int32, device=f"cuda:{d}")
        assert torch.equal(k(x), expected(x, 2))
    record = a.specialize(G=g).record  # made at the first launch
    assert record is not None and record is b.specialize(G=g).record
    handle = record.handle
    assert registered == [handle]
    assert native.is_registered(handle)
    del a, b, k, record  # the shim forgets a handle when its record is collected
    gc.collect()
    assert not native.is_registered(handle)
