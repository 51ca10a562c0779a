"""GPU tests of the grouped GEMM (``pyptx_kernels.grouped_gemm``) from torch.

Inputs are fresh random bf16 tensors; group sizes are ragged (empty groups, sizes that
are not tile multiples); outputs are poisoned (NaN) before each launch, so an element
the kernel never writes fails, and a write past a group's end would be overwritten by
(or overwrite) the next group's rows and fail the comparison. Tolerances on
``||out - ref|| / ||ref||`` against float64 on the same bf16 inputs: 6e-3 for bf16
output (the output rounding, about 2**-9 per element), 1e-4 for f32 output (f32
accumulation), 6e-3 for dA and dB (bf16 gradients).

    pytest -m gpu packages/pyptx-torch/tests/test_grouped_gemm_gpu.py
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),  # conftest.py: unwritten elements are NaN
]

TOL = {"bf16": 6e-3, "f32": 1e-4}
gg = importlib.import_module("pyptx_kernels.grouped_gemm")
host = importlib.import_module("pyptx_kernels.grouped_gemm.host")


def plan(config):
    """The ``GroupedConfig`` of a case's keywords (None: tuned)."""
    return None if config is None else gg.GroupedConfig(**config)


def rel_err(d, ref):
    assert not torch.isnan(d).any(), "unwritten (NaN-poisoned) or NaN elements"
    return ((d.double() - ref).norm() / ref.norm()).item()


def make(sizes, N, K, trans_b=False, seed=0):
    torch.manual_seed(seed)
    M = sum(sizes)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    if trans_b:
        b = torch.randn(len(sizes), N, K, device="cuda", dtype=torch.bfloat16).transpose(-2, -1)
    else:
        b = torch.randn(len(sizes), K, N, device="cuda", dtype=torch.bfloat16)
    return a, b, gg.random_offsets(sizes)


CASES = [
    # sizes, N, K, config
    ([0, 37, 130], 72, 100, None),
    ([128, 128, 128, 128], 256, 128, None),
    ([5, 0, 300, 1, 200, 0], 264, 200, dict(BM=64, BN=128)),
    ([1000, 24, 0, 512], 512, 384, dict(BM=128, BN=128)),
    ([700, 333], 1000, 520, dict(BM=128, BN=256, stages=3)),
    ([0, 0, 65], 64, 64, dict(BM=64, BN=256)),
    ([2048] * 4, 256, 2048, None),
    ([129, 1, 63, 64, 191], 128, 4096, dict(store="masked")),
    # opt-in L2 hints: the values must not change
    ([128] * 6 + [0, 77], 512, 320, dict(BM=128, BN=256, l2_hint="stream_b")),
    # 2-CTA clusters sharing A: the second CTA's n-block wholly past N (72), partly (264)
    ([0, 37, 130], 72, 100, dict(BM=128, BN=128, cluster=2)),
    ([5, 0, 300, 1, 200, 0], 264, 200, dict(BM=64, BN=128, cluster=2)),
    ([700, 333], 1000, 520, dict(BM=128, BN=256, cluster=2, num_sms=8)),
    # opt-in prefetch of the tensor maps and group ends
    ([0, 37, 130], 72, 100, dict(BM=128, BN=128, cluster=2, prefetch=True)),
    ([5, 0, 300, 1, 200, 0], 264, 200, dict(BM=64, BN=256, prefetch=True)),
    # opt-in L2 prefetch of the guessed first tile (a hint: a wrong guess must not matter)
    ([2048] * 4, 256, 2048, dict(BM=128, BN=128, cluster=2, prefetch=True, warm=32)),
    ([5, 0, 300, 1, 200, 0], 264, 200, dict(BM=128, BN=128, cluster=2, warm=6)),
    ([1000, 24, 0, 512], 512, 384, dict(BM=128, BN=128, warm=6)),
    # opt-in speculative first tiles: guesses right (uniform groups), wrong, and a guessed
    # tile for a CTA that has none
    ([2048] * 4, 256, 2048, dict(BM=64, BN=256, prefetch=True, speculate=5)),
    ([5, 0, 300, 1, 200, 0], 264, 200, dict(BM=64, BN=128, speculate=3)),
    ([0, 0, 300, 0], 72, 104, dict(BM=128, BN=128, num_sms=5, speculate=2)),
    # clusters along m sharing B: CTAs past their group's end, slab and row splits of B
    ([2048] * 4, 256, 2048, dict(BM=64, BN=256, prefetch=True, cluster=2, cluster_along="m")),
    ([2048] * 4, 256, 2048, dict(BM=64, BN=256, prefetch=True, cluster=4, cluster_along="m")),
    ([5, 0, 300, 1, 200, 0], 264, 200, dict(BM=64, BN=128, cluster=2, cluster_along="m")),
    ([129, 1, 63, 260], 136, 136, dict(BM=128, BN=128, cluster=4, cluster_along="m", num_sms=8)),
]


@pytest.mark.parametrize("sizes,N,K,config", CASES)
@pytest.mark.parametrize("trans_b", [False, True])
def test_forward(sizes, N, K, config, trans_b):
    a, b, offs = make(sizes, N, K, trans_b)
    ref = gg.reference(a, b, offs)
    d = host.grouped_mm(a, b, offs, config=plan(config))
    assert d.shape == (sum(sizes), N) and d.dtype == torch.bfloat16
    assert rel_err(d, ref) < TOL["bf16"]
    d32 = host.grouped_mm(a, b, offs, out_dtype="f32", config=plan(config))
    assert d32.dtype == torch.float32 and rel_err(d32, ref) < TOL["f32"]


def test_forward_rows_of_each_group_exactly():
    """Group by group, so a wrong row range cannot hide in the global norm."""
    sizes = [3, 0, 130, 64, 1]
    a, b, offs = make(sizes, 128, 64, seed=3)
    d = host.grouped_mm(a, b, offs, out_dtype="f32")
    ref = gg.reference(a, b, offs)
    s = 0
    for n in sizes:
        if n:
            assert rel_err(d[s:s + n], ref[s:s + n]) < TOL["f32"]
        s += n


def _backward(sizes, N, K, trans_b, config=None, wgrad_config=None):
    a, b, offs = make(sizes, N, K, trans_b, seed=1)
    aa = a.clone().requires_grad_(True)
    if trans_b:
        leaf = b.transpose(-2, -1).contiguous().requires_grad_(True)
        bb = leaf.transpose(-2, -1)
    else:
        leaf = bb = b.clone().requires_grad_(True)
    y = host.grouped_mm(aa, bb, offs, config=plan(config), wgrad_config=wgrad_config)
    dy = torch.randn(y.shape, device="cuda", dtype=torch.float32)
    (y.float() * dy).sum().backward()
    a64 = a.double().requires_grad_(True)
    b64 = b.double().requires_grad_(True)
    (gg.reference(a64, b64, offs) * dy.double()).sum().backward()
    return aa.grad, leaf.grad, a64.grad, (b64.grad.transpose(-2, -1) if trans_b else b64.grad)


@pytest.mark.parametrize("sizes,N,K,config", [
    ([0, 37, 130], 72, 100, None),
    ([5, 0, 300, 1, 200, 0], 264, 200, dict(BM=64, BN=128)),
    ([1000, 24, 0, 512], 512, 384, None),
    ([1000, 24, 0, 512], 512, 384, dict(BM=128, BN=128, cluster=2)),
    ([1000, 24, 0, 512], 512, 384, dict(BM=64, BN=256, cluster=2, cluster_along="m")),
])
@pytest.mark.parametrize("trans_b", [False, True])
def test_backward(sizes, N, K, config, trans_b):
    da, db, da_ref, db_ref = _backward(sizes, N, K, trans_b, config)
    assert da.shape == da_ref.shape and db.shape == db_ref.shape
    assert rel_err(da, da_ref) < TOL["bf16"]
    assert rel_err(db, db_ref) < TOL["bf16"]
    s = 0
    for g, n in enumerate(sizes):  # an empty group's weight gradient is exactly zero
        if n == 0:
            assert not db[g].any()
        s += n


def test_wgrad_kernel_alone_f32():
    sizes = [0, 65, 64, 1, 200]
    M, KX, NY = sum(sizes), 136, 200
    x = torch.randn(M, KX, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(M, NY, device="cuda", dtype=torch.bfloat16)
    offs = gg.random_offsets(sizes)
    for cfg in (dict(BM=128, BN=256), dict(BM=64, BN=128)):
        w = gg.build_grouped_wgrad(M, KX, NY, len(sizes), out_dtype="f32",
                                   config=gg.WgradConfig(**cfg))(x, y, offs)
        s = 0
        for g, n in enumerate(sizes):
            ref = x[s:s + n].double().T @ y[s:s + n].double()
            if n:
                assert rel_err(w[g], ref) < TOL["f32"], (cfg, g)
            else:
                assert not w[g].any()
            s += n


# Opt-in split weight gradient (``splits=S``: f32 partials + a deterministic reduction).
# Sizes: an empty group, groups of fewer row blocks than splits (1 and 65 rows: some
# splits empty, their partials zero), a size that is not a block multiple.
SPLIT_SIZES = [0, 65, 64, 1, 200, 640]


@pytest.mark.parametrize("cfg", [dict(BM=128, BN=256, splits=2), dict(BM=128, BN=128, splits=3),
                                 dict(BM=64, BN=128, splits=4), dict(BM=128, BN=256, splits=8)])
def test_split_wgrad_kernel_alone(cfg):
    """Partials and the reduced gradient of ``build_wgrad_split`` per group against float64
    (f32 out: 1e-4; bf16 out: 6e-3); an empty group's gradient is exactly zero; two runs
    are bitwise equal (the reduction order is fixed)."""
    sizes = SPLIT_SIZES
    M, KX, NY, G = sum(sizes), 136, 200, len(sizes)
    x = torch.randn(M, KX, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(M, NY, device="cuda", dtype=torch.bfloat16)
    offs = gg.random_offsets(sizes)
    parts = gg.build_grouped_wgrad(M, KX, NY, G, out_dtype="f32",
                                   config=gg.WgradConfig(**cfg))(x, y, offs)
    assert parts.shape == (cfg["splits"] * G, KX, NY) and not torch.isnan(parts).any()
    for out, tol in (("f32", TOL["f32"]), ("bf16", TOL["bf16"])):
        k = gg.build_wgrad_split(M, KX, NY, G, out_dtype=out, config=gg.WgradConfig(**cfg))
        w, w2 = k(x, y, offs), k(x, y, offs)
        assert torch.equal(w, w2), "the split reduction is not deterministic"
        s = 0
        for g, n in enumerate(sizes):
            ref = x[s:s + n].double().T @ y[s:s + n].double()
            if n:
                assert rel_err(w[g], ref) < tol, (cfg, out, g)
                assert rel_err(parts[g::G].double().sum(0), ref) < TOL["f32"], (cfg, g)
            else:
                assert not w[g].any()
            s += n


@pytest.mark.parametrize("trans_b", [False, True])
def test_backward_with_split_wgrad(trans_b):
    """``grouped_mm(..., wgrad_config=WgradConfig(splits=2, ...))``: dA and dB against float64
    (6e-3)."""
    wcfg = gg.WgradConfig(splits=2, BM=128, BN=128)
    da, db, da_ref, db_ref = _backward(SPLIT_SIZES, 264, 200, trans_b, wgrad_config=wcfg)
    assert rel_err(da, da_ref) < TOL["bf16"]
    assert rel_err(db, db_ref) < TOL["bf16"]
    assert not db[0].any()


def test_torch_compile_and_cuda_graph():
    sizes = [100, 0, 300, 56]
    a, b, offs = make(sizes, 256, 192, seed=2)
    f = torch.compile(lambda x, y, o: host.grouped_mm(x, y, o))
    assert rel_err(f(a, b, offs), gg.reference(a, b, offs)) < TOL["bf16"]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        host.grouped_mm(a, b, offs)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = host.grouped_mm(a, b, offs)
    # new values and new group sizes, same buffers: the graph reads both on the device
    a.copy_(torch.randn_like(a))
    offs.copy_(gg.random_offsets([0, 200, 200, 56]))
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(out, gg.reference(a, b, offs)) < TOL["bf16"]


def test_against_torch_grouped_mm():
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm is not available")
    sizes = [256, 0, 128, 384]
    a, b, offs = make(sizes, 512, 256, seed=4)
    try:
        peer = torch._grouped_mm(a, b, offs=offs, out_dtype=torch.bfloat16)
    except Exception as e:  # noqa: BLE001 - report the peer's refusal, do not fail on it
        pytest.skip(f"torch._grouped_mm refused: {e}")
    ours = host.grouped_mm(a, b, offs)
    ref = gg.reference(a, b, offs)
    assert rel_err(ours, ref) < TOL["bf16"] and rel_err(peer, ref) < 2 * TOL["bf16"]
