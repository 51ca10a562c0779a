"""The tensor-core kernels' numerics on the CPU: ``ptxsim`` runs their PTX (tile copies into
swizzled shared memory, ``wgmma`` through matrix descriptors, mbarrier rings, named barriers,
``stmatrix`` epilogues, tile stores; the CTAs of a cluster together, multicast included) one
CTA or cluster at a time against a float64 reference.

The cooperative GEMM's results on the GPU are known good, so it pins the simulator's layout
model (every operand major order); the same model then checks schedules before they run on a
GPU.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from pyptx import ptx

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import ptxsim  # noqa: E402

gemm = importlib.import_module("pyptx_kernels.gemm.kernel")
gemm_sched = importlib.import_module("pyptx_kernels.gemm.scheduler")


_dev, _f64 = ptxsim.device_bits, ptxsim.host_f64


def run_gemm(M, N, K, *, dtype="bf16", out_dtype=None, bias=False, alpha=1.0, activation=None,
             residual=False, seed=0, **config):
    """Simulate ``build_gemm`` of the layouts ``a_major``/``b_major`` and the plan
    ``GemmConfig(**config)`` on random inputs; the relative error against float64 of the
    same (rounded) inputs."""
    rng = np.random.default_rng(seed)
    a_major, b_major = config.pop("a_major", "K"), config.pop("b_major", "MN")
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    a = _dev(A if a_major == "K" else A.T, dtype)
    b = _dev(B if b_major == "MN" else B.T, dtype)
    args = [a, b]
    bias_v = None
    if bias:
        bias_v = rng.standard_normal(N).astype(np.float32)
        args.append(bias_v)
    out_dtype = out_dtype or dtype
    if residual:
        res = rng.standard_normal((M, N))
        res = res.astype(np.float32) if out_dtype == "f32" else _dev(res, out_dtype)
        args.append(res)
    k = gemm.build_gemm(M, N, K, dtype=dtype, out_dtype=out_dtype, bias=bias, alpha=alpha,
                        activation=activation, residual=residual, a_major=a_major,
                        b_major=b_major, config=gemm.GemmConfig(**config))
    if isinstance(k, gemm_sched.SplitTailGemm):  # zeroed flags in, left zeroed; the workspace out
        flags = np.zeros(gemm_sched.FLAG_WORDS, np.uint32)
        args = [np.ascontiguousarray(x) for x in args] + [flags]
        d, _ = ptxsim.run(k.kernel.specialize(), args, scratch=(1,), inplace=True)
        assert not flags.any(), "the split-tail kernel left flags set"
    else:
        (d,) = ptxsim.run(k.specialize(), args)
    a64 = _f64(a, dtype) if a_major == "K" else _f64(a, dtype).T
    b64 = _f64(b, dtype) if b_major == "MN" else _f64(b, dtype).T
    ref = (a64 @ b64) * alpha
    if bias:
        ref = ref + bias_v
    if activation == "relu":
        ref = np.maximum(ref, 0)
    elif activation == "silu":
        ref = ref / (1 + np.exp(-ref))
    elif activation == "swiglu":   # 64-column gate and up blocks, interleaved
        blocks = ref.reshape(M, N // 128, 2, 64)
        g, u = blocks[:, :, 0], blocks[:, :, 1]
        ref = (g / (1 + np.exp(-g)) * u).reshape(M, N // 2)
    if residual:
        ref = ref + _f64(res, out_dtype)
    got = _f64(d, out_dtype)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


TOL = {"bf16": 8e-3, "f16": 1e-3, "f32": 1e-5}


# every K extent below spans more k-blocks than the ring has stages (refills), and num_sms
# gives each CTA several tiles (the persistent walk)
@pytest.mark.parametrize("a_major", ["K", "MN"])
@pytest.mark.parametrize("b_major", ["K", "MN"])
def test_cooperative_gemm_every_layout(a_major, b_major):
    err = run_gemm(256, 264, 456, cluster=1, BN=128, num_sms=2, stages=3, a_major=a_major,
                   b_major=b_major)
    assert err < TOL["bf16"], err


# BN=64 and BN=192 store an odd number of 64-column slabs per tile (the store_slabs race the
# simulator found: a tile's first slab reused a buffer the previous tile's store still read)
@pytest.mark.parametrize("config", [
    dict(BM=128, BN=256), dict(BM=64, BN=256), dict(BM=128, BN=64, stages=2),
    dict(BM=128, BN=192, dtype="f16"),
])
def test_cooperative_gemm_tiles_ragged(config):
    assert run_gemm(200, 328, 136, cluster=1, num_sms=3, **config) < TOL[config.get("dtype", "bf16")]


# one epilogue buffer per warpgroup (each slab waits for the previous slab's store) and the
# 9-stage ring it makes room for, wrapped more than once
@pytest.mark.parametrize("config", [dict(), dict(out_dtype="f32", bias=True)])
def test_gemm_one_epilogue_buffer(config):
    err = run_gemm(200, 328, 1224, BM=64, BN=128, cluster=1, epi_bufs=1, num_sms=3, **config)
    assert err < TOL[config.get("out_dtype", "bf16")], err


def test_cooperative_gemm_f16_epilogue_f32_out():
    err = run_gemm(130, 200, 72, dtype="f16", out_dtype="f32", bias=True, alpha=0.5,
                   activation="silu", cluster=1, BN=128, num_sms=2)
    assert err < 1e-5, err


# the gated epilogue (silu(gate) * up of interleaved 64-column blocks, half the columns out)
# and the residual epilogue: ragged M, both output types, several tiles per CTA, a cluster
@pytest.mark.parametrize("M,N,K,out_dtype,config", [
    (200, 512, 136, "bf16", dict(BM=128, BN=256, cluster=1, num_sms=2)),
    (130, 384, 72, "f32", dict(BM=128, BN=128, cluster=2, num_sms=4)),
])
def test_gated_gemm(M, N, K, out_dtype, config):
    err = run_gemm(M, N, K, activation="swiglu", out_dtype=out_dtype, **config)
    assert err < TOL[out_dtype] * (1 if out_dtype == "bf16" else 100), err


@pytest.mark.parametrize("M,N,K,out_dtype,config", [
    (200, 264, 136, "bf16", dict(BM=128, BN=128, cluster=1, num_sms=2)),
    (136, 200, 72, "f32", dict(BM=128, BN=256, cluster=2, num_sms=2, a_major="MN")),
])
def test_residual_gemm(M, N, K, out_dtype, config):
    err = run_gemm(M, N, K, residual=True, out_dtype=out_dtype, **config)
    assert err < TOL[out_dtype] * (1 if out_dtype == "bf16" else 100), err


def test_gated_and_residual_refusals():
    from pyptx.errors import ConfigError

    with pytest.raises(ConfigError, match="pairs 64-column gate and up blocks"):
        gemm.build_gemm(128, 192, 64, activation="swiglu")
    with pytest.raises(ConfigError, match="residual needs a bf16 or f32 output"):
        gemm.build_gemm(128, 128, 64, out_dtype="f16", dtype="f16", residual=True)


# 2-CTA clusters run together in the simulator: multicast copies, remote mbarrier arrives
# (mapa), cluster barriers. The cooperative kernel's cluster form is known good on the GPU.
@pytest.mark.parametrize("config", [
    dict(BN=256, stages=3), dict(BN=128, a_major="MN", b_major="K"), dict(BN=256, split="slabs"),
])
def test_gemm_in_2_cta_clusters(config):
    assert run_gemm(512, 264, 200, cluster=2, num_sms=4, **config) < TOL["bf16"]


# three consumer warpgroups on 192 x 192 tiles (the tile cuBLAS picks at 6144^3 and
# 8192 x 28672 x 8192): odd slab counts, ragged edges, both layouts, a cluster
@pytest.mark.parametrize("config", [
    dict(BM=192, BN=192, cluster=2, num_sms=4),
    dict(BM=192, BN=192, cluster=1, num_sms=3, a_major="MN", b_major="K"),
])
def test_gemm_192x192_tiles(config):
    assert run_gemm(400, 264, 200, **config) < TOL["bf16"]


# two 64-row accumulators per consumer warpgroup (wg_rows=128): 256 x 128 tiles on two
# warpgroups (in a cluster, both layouts), 128 x 64 on one
@pytest.mark.parametrize("M,config", [
    (600, dict(BM=256, BN=128, cluster=2, num_sms=4, wg_rows=128)),
    (320, dict(BM=256, BN=128, cluster=1, num_sms=3, a_major="MN", b_major="K", wg_rows=128)),
    (320, dict(BM=128, BN=64, cluster=1, num_sms=3, wg_rows=128)),
])
def test_gemm_two_bands_per_warpgroup(M, config):
    assert run_gemm(M, 264, 200, **config) < TOL["bf16"]


# split tail: the tiles past the last whole wave are cut along K into chunks spread over the
# clusters; the cluster with a tile's last chunk adds the others' partial sums. Simulated
# CTAs run in grid order, so these cases fit the pieces in one round (every chunk's cluster
# comes before the last chunk's); several rounds are checked on the GPU and by the model.
@pytest.mark.parametrize("M,N,K,config", [
    (640, 256, 512, dict(BM=128, BN=256, cluster=1, num_sms=4)),    # 5 tiles on 4
    (1024, 512, 768, dict(BM=128, BN=256, cluster=1, num_sms=13)),  # 16 on 13: thirds
    (1000, 264, 512, dict(BM=128, BN=128, cluster=2, num_sms=10, a_major="MN", b_major="K")),
    (600, 264, 512, dict(BM=256, BN=128, cluster=1, num_sms=8, wg_rows=128)),
    (256, 512, 1024, dict(BM=128, BN=256, cluster=1, num_sms=8)),   # no whole wave
    (130, 520, 600, dict(BM=128, BN=128, cluster=1, num_sms=8, dtype="f16", out_dtype="f32",
                         bias=True, alpha=0.5, activation="silu")),
])
def test_gemm_split_tail(M, N, K, config):
    config = dict(config, split_tail=True)
    plan = gemm_sched.split_tail_plan(*_tiles(M, N, K, config))
    assert plan is not None and plan[1] * plan[2] <= _tiles(M, N, K, config)[1]
    dtype = config.get("dtype", "bf16")
    assert run_gemm(M, N, K, **config) < TOL[config.get("out_dtype", dtype)]


def _tiles(M, N, K, config):
    BM, BN, c = config.get("BM", 128), config.get("BN", 256), config.get("cluster", 2)
    m_blocks = -(-M // BM)
    tiles = -(-m_blocks // c) * -(-N // BN)
    return tiles, config["num_sms"] // c, -(-K // 64)


def test_split_tail_schedule_covers_every_block_once():
    for tiles, clusters, num_kb in [(5, 4, 8), (16, 13, 12), (2048, 132, 128), (1024, 66, 448),
                                    (7168, 132, 128), (128, 100, 32), (1152, 132, 96), (4, 8, 16)]:
        items = gemm_sched.split_tail_items(tiles, clusters, num_kb)
        waves, rest, split = gemm_sched.split_tail_plan(tiles, clusters, num_kb)
        seen = {}
        for c, its in enumerate(items):
            for t, kb0, kb1 in its:
                assert 0 <= kb0 < kb1 <= num_kb and kb1 - kb0 >= 4
                for kb in range(kb0, kb1):
                    assert (t, kb) not in seen
                    seen[t, kb] = c
        assert len(seen) == tiles * num_kb
        rounds = max(len(its) for its in items) - waves
        assert rounds == -(-rest * split // clusters) and rounds < split   # shorter than a tile
    assert gemm_sched.split_tail_plan(264, 132, 64) is None   # whole waves
    assert gemm_sched.split_tail_plan(200, 132, 4) is None    # chunks under 4 k-blocks


def test_split_tail_without_the_partial_sums_is_wrong(monkeypatch):
    """A mutant whose last chunks add zeros instead of the other chunks' partial sums."""
    real_inst = ptx.inst

    class ZeroPartials:
        def __call__(self, op, *a, **k):
            if op == "ld.relaxed.gpu.global.v4.f32":
                return lambda dst, _addr: [real_inst.mov.f32(r, 0.0) for r in dst]
            return real_inst(op, *a, **k)

        def __getattr__(self, name):
            return getattr(real_inst, name)

    monkeypatch.setattr(ptx, "inst", ZeroPartials())
    err = run_gemm(640, 256, 512, BM=128, BN=256, cluster=1, num_sms=4, split_tail=True)
    assert err > 0.1, err


# ---------------------------------------------------------------------- grouped GEMM
grouped = importlib.import_module("pyptx_kernels.grouped_gemm")


@pytest.mark.parametrize("sizes,N,K,config", [
    ([0, 37, 130], 72, 104, dict(BM=128, BN=128, num_sms=4)),
    ([5, 0, 300, 1, 200, 0], 264, 200, dict(BM=64, BN=128, num_sms=3)),
    ([0, 37, 130], 72, 104, dict(BM=128, BN=128, num_sms=4, b_major="K")),
    ([129, 1, 63, 64, 191], 128, 136, dict(BM=64, BN=64, store="masked", num_sms=2)),
    ([128] * 4, 256, 256, dict(BM=128, BN=128, num_sms=3, warm=2, prefetch=True)),   # opt-in
    ([5, 0, 300, 1, 200, 0], 264, 200, dict(BM=128, BN=128, num_sms=3, warm=6)),     # opt-in
    # 2-CTA clusters (neighbouring n-blocks share A): the consumers need the CTA's rank too
    ([0, 37, 130], 72, 104, dict(BM=128, BN=128, num_sms=4, cluster=2)),
    ([5, 0, 300, 1, 200, 0], 264, 200, dict(BM=128, BN=128, num_sms=4, cluster=2, warm=4,
                                            prefetch=True)),
    # clusters along m share B (multicast parts): CTAs past their group's end, whole-slab
    # and row splits of B, both B layouts, 4-CTA clusters
    ([5, 0, 300, 1, 200, 0], 264, 200, dict(BM=64, BN=128, num_sms=4, cluster=2,
                                            cluster_along="m")),
    ([0, 37, 130], 72, 104, dict(BM=64, BN=64, num_sms=4, cluster=2, cluster_along="m",
                                 b_major="K")),
    ([129, 1, 63, 260], 256, 136, dict(BM=64, BN=256, num_sms=8, cluster=4, cluster_along="m",
                                       prefetch=True, warm=2)),
    ([129, 1, 63, 260], 136, 136, dict(BM=128, BN=128, num_sms=8, cluster=4, cluster_along="m",
                                       b_major="K")),
    # speculative first tiles (opt-in): every guess right, guesses wrong, and a CTA whose
    # guess is a tile while it has none (it must still wait for the guessed copies)
    ([128] * 4, 256, 256, dict(BM=128, BN=128, num_sms=3, speculate=2)),
    ([5, 0, 300, 1, 200, 0], 264, 200, dict(BM=64, BN=128, num_sms=3, speculate=3)),
    ([0, 0, 300, 0], 72, 104, dict(BM=128, BN=128, num_sms=5, speculate=2, prefetch=True)),
])
def test_grouped_gemm_forward(sizes, N, K, config):
    """Ragged groups (empty ones too) against float64; the opt-in prefetches must not matter."""
    rng = np.random.default_rng(len(sizes) * 7 + N)
    G, M = len(sizes), sum(sizes)
    plan = dict(config)
    b_major = plan.pop("b_major", "MN")
    a = _dev(rng.standard_normal((M, K)), "bf16")
    w = rng.standard_normal((G, K, N))
    b = _dev(w if b_major == "MN" else w.transpose(0, 2, 1), "bf16")
    offs = np.cumsum(sizes).astype(np.int32)
    k = grouped.build_grouped(M, N, K, G, b_major=b_major, config=grouped.GroupedConfig(**plan))
    (d,) = ptxsim.run(k.specialize(), [a, b, offs])
    bb = _f64(b, "bf16") if b_major == "MN" else _f64(b, "bf16").transpose(0, 2, 1)
    ref = np.concatenate([_f64(a, "bf16")[e - n:e] @ bb[g] for g, (n, e) in
                          enumerate(zip(sizes, offs))])
    err = np.linalg.norm(_f64(d, "bf16") - ref) / np.linalg.norm(ref)
    assert err < TOL["bf16"], err


def test_grouped_weight_gradient():
    sizes, KX, NY = [0, 37, 130, 64], 72, 136
    rng = np.random.default_rng(3)
    M, G = sum(sizes), len(sizes)
    x = _dev(rng.standard_normal((M, KX)), "bf16")
    y = _dev(rng.standard_normal((M, NY)), "bf16")
    offs = np.cumsum(sizes).astype(np.int32)
    k = grouped.build_grouped_wgrad(M, KX, NY, G,
                                    config=grouped.WgradConfig(BM=64, BN=128, num_sms=3))
    (w,) = ptxsim.run(k.specialize(), [x, y, offs])
    X, Y = _f64(x, "bf16"), _f64(y, "bf16")
    ref = np.stack([X[e - n:e].T @ Y[e - n:e] for n, e in zip(sizes, offs)])
    err = np.linalg.norm(_f64(w, "bf16") - ref) / np.linalg.norm(ref)
    assert err < TOL["bf16"], err


# ---------------------------------------------------------------------- FP8 GEMM
fp8 = importlib.import_module("pyptx_kernels.fp8_gemm")
_E4M3 = np.arange(256, dtype=np.uint8)
_E4M3_VALUES = ptxsim._to_float(_E4M3, "e4m3")
_E4M3_FINITE = (_E4M3 & 0x7F) != 0x7F


def _e4m3(x):
    """Nearest e4m3 codes of ``x`` (a table search: fine for test sizes)."""
    tv, tc = _E4M3_VALUES[_E4M3_FINITE], _E4M3[_E4M3_FINITE]
    return tc[np.abs(np.asarray(x)[..., None] - tv).argmin(-1)].astype(np.uint8)


@pytest.mark.parametrize("scale,config", [
    ("tensor", dict(BN=128)), ("row", dict(BN=128)), ("block", dict(BN=128)),
    ("tensor", dict(BN=64, fast_accum=True)), ("row", dict(BN=128, cluster=2)),
])
def test_fp8_gemm(scale, config):
    M, N, K = 200, 264, 384
    rng = np.random.default_rng(5)
    a, w = _e4m3(rng.standard_normal((M, K))), _e4m3(rng.standard_normal((N, K)))
    A, W = _E4M3_VALUES[a], _E4M3_VALUES[w]
    nk = -(-K // 128)
    if scale == "tensor":
        sa, sb = np.array([0.5], np.float32), np.array([3.0], np.float32)
        ref = (A @ W.T) * 1.5
    elif scale == "row":
        sa, sb = (rng.uniform(0.5, 2, n).astype(np.float32) for n in (M, N))
        ref = (A @ W.T) * sa[:, None] * sb[None, :]
    else:
        sa = rng.uniform(0.5, 2, (M, nk)).astype(np.float32)
        sb = rng.uniform(0.5, 2, (-(-N // 128), nk)).astype(np.float32)
        ea = np.repeat(sa, 128, 1)[:, :K]
        eb = np.repeat(np.repeat(sb, 128, 0), 128, 1)[:N, :K]
        ref = (A * ea) @ (W * eb).T
    plan = {"cluster": 1, "num_sms": 4, **config}
    fast = plan.pop("fast_accum", False)
    k = fp8.build_fp8_gemm(M, N, K, scale=scale, fast_accum=fast,
                           config=fp8.Fp8GemmConfig(**plan))
    (d,) = ptxsim.run(k.specialize(), [a, w, sa, sb])
    err = np.linalg.norm(_f64(d, "bf16") - ref) / np.linalg.norm(ref)
    assert err < TOL["bf16"], err


# ---------------------------------------------------------------------- flash attention
fwd_config = importlib.import_module("pyptx_kernels.flash_attention.fwd_config")
fwd_kernel = importlib.import_module("pyptx_kernels.flash_attention.fwd_kernel")
fab = importlib.import_module("pyptx_kernels.flash_attention.backward")
bwd_dkdv = importlib.import_module("pyptx_kernels.flash_attention.bwd_dkdv")
bwd_host = importlib.import_module("pyptx_kernels.flash_attention.bwd_host")


def _attention_inputs(B, S, Hq, Hkv, D, seed):
    rng = np.random.default_rng(seed)
    q = _dev(rng.standard_normal((B, S, Hq, D)), "bf16")
    k = _dev(rng.standard_normal((B, S, Hkv, D)), "bf16")
    v = _dev(rng.standard_normal((B, S, Hkv, D)), "bf16")
    do = _dev(rng.standard_normal((B, S, Hq, D)), "bf16")
    return q, k, v, do


def _attention_reference(q, k, v, do, causal):
    """float64 ``o``, ``lse`` and ``(dq, dk, dv)``; KV heads shared by ``Hq // Hkv`` heads."""
    Q, K, V, dO = (_f64(x, "bf16") for x in (q, k, v, do))
    S, D, g = Q.shape[1], Q.shape[3], Q.shape[2] // K.shape[2]
    Kr, Vr = np.repeat(K, g, 2), np.repeat(V, g, 2)
    s = np.einsum("bqhd,bkhd->bhqk", Q, Kr) / np.sqrt(D)
    if causal:
        s = s + np.triu(np.full((S, S), -np.inf), 1)
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - mx)
    lse = (np.log(e.sum(-1, keepdims=True)) + mx)[..., 0]
    p = e / e.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bkhd->bqhd", p, Vr)
    dp = np.einsum("bqhd,bkhd->bhqk", dO, Vr)
    delta = (dO * o).sum(-1).transpose(0, 2, 1)[..., None]
    ds = p * (dp - delta) / np.sqrt(D)
    dq = np.einsum("bhqk,bkhd->bqhd", ds, Kr)
    split = (K.shape[0], S, K.shape[2], g, D)
    dk = np.einsum("bhqk,bqhd->bkhd", ds, Q).reshape(split).sum(3)
    dv = np.einsum("bhqk,bqhd->bkhd", p, dO).reshape(split).sum(3)
    return o, lse, (dq, dk, dv)


def _rel(got, ref):
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("D,causal,config", [
    (64, True, {}), (64, False, dict(schedule="simple")), (128, True, dict(schedule="overlap")),
    (128, False, {}), (64, True, dict(persistent=True, num_sms=3)),
    # the tuned list's other candidates (ATTENTION_CONFIGS) that fit each head dim
    (64, True, dict(BN=192)), (128, False, dict(BN=176)), (128, True, dict(stages=3)),
    (64, False, dict(BN=64)),
    # three consumer warpgroups (192-row blocks: one whole and one ragged at S = 200)
    (64, True, dict(consumers=3)), (64, False, dict(consumers=3)),
    (64, True, dict(consumers=3, schedule="overlap")), (64, False, dict(consumers=3, BN=64)),
    (64, True, dict(consumers=3, persistent=True, num_sms=3)),
    # two consumers at head dim 64 (the default there is three)
    (64, True, dict(consumers=2)), (64, False, dict(consumers=2, persistent=True, num_sms=3)),
    # ... and at head dim 128 (the default there is three with BN = 80)
    (128, True, dict(consumers=2)), (128, False, dict(consumers=2, schedule="overlap")),
    (128, True, dict(persistent=True, num_sms=3)),
    # the tuner's head-dim-64 candidates: 96-key blocks in three stages, the persistent walk
    (64, False, dict(BN=96, stages=3)), (64, False, dict(persistent=True)),
])
def test_attention_forward(D, causal, config):
    """A ragged length (200), grouped-query heads (2 per KV head); ``lse`` in natural log."""
    B, S, Hq, Hkv = 1, 200, 2, 1
    q, k, v, do = _attention_inputs(B, S, Hq, Hkv, D, D + causal)
    kern = fwd_kernel.build_attention(B, S, Hq, Hkv, D, causal=causal,
                                      config=fwd_config.ForwardConfig(**config))
    o, lse = ptxsim.run(kern.specialize(), [q, k, v])
    ro, rlse, _ = _attention_reference(q, k, v, do, causal)
    assert _rel(_f64(o, "bf16"), ro) < TOL["bf16"]
    assert _rel(lse.view(np.float32).astype(np.float64), rlse) < 1e-5


@pytest.mark.parametrize("D,causal,mode", [
    (64, True, {}), (128, False, {}),
    (64, True, dict(atomic_dq=True, dq_bulk=True)),
    (128, True, dict(atomic_dq=True, dq_bulk=True, dq_ordered=True)),
    (128, False, dict(atomic_dq=True)), (128, True, dict(dkdv_bq=32)),
    (64, True, dict(dkdv_overlap=True)), (64, True, dict(dq_bkv=128)), (64, False, dict(dq_bkv=128)),
    (64, False, dict(atomic_dq=True, dq_bulk=True, dq_ordered=True)),
])
def test_attention_backward(D, causal, mode, S=300):
    """The seven-product pair and the bulk-dQ modes, the ordered one's fixed order of adds
    included (the simulator runs CTAs one after another in grid order: a CTA that waited for
    a later one would spin until the step limit). S=300: five q blocks, three kv blocks."""
    B, Hq, Hkv = 1, 2, 1
    q, k, v, do = _attention_inputs(B, S, Hq, Hkv, D, 7 * D + causal)
    o, lse = ptxsim.run(fwd_kernel.build_attention(B, S, Hq, Hkv, D, causal=causal).specialize(), [q, k, v])
    lse = lse.view(np.float32)
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, D, causal=causal, **mode)
    if not mode.get("atomic_dq"):
        dq, stats = ptxsim.run(bwd.kernels[0].specialize(), [q, k, v, o, lse, do])
        dk, dv = ptxsim.run(bwd.kernels[1].specialize(), [q, k, v, do, stats])
    else:
        prep, dkdv, convert = bwd.kernels
        # ordered: DQACC poisoned too (each tile's first add stores it, the prep leaves it)
        stats, acc, *sem = ptxsim.run(prep.specialize(), [o, lse, do],
                                      scratch=(1,) if mode.get("dq_ordered") else ())
        dk, dv = ptxsim.run(dkdv.specialize(), [q, k, v, do, stats, acc, *sem], inplace=True)
        (dq,) = ptxsim.run(convert.specialize(), [acc])
    _, _, grads = _attention_reference(q, k, v, do, causal)
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), grads):
        assert _rel(_f64(got, "bf16"), ref) < TOL["bf16"], name


@pytest.mark.parametrize("D,causal,Hkv", [(128, True, 1), (64, False, 2), (64, True, 2)])
def test_attention_backward_dq_convert(D, causal, Hkv, S=300):
    """``dq_convert``: ``num_sms=3`` converter CTAs after the dK/dV grid turn DQACC's 64-row q
    blocks (5 per q head, shared unevenly) into dQ, each once its counter holds all of its
    adds (causal: fewer kv blocks per q block). dQ poisoned like DK/DV: every element must be
    written; against float64, and bit for bit the conversion kernel's."""
    B, Hq = 1, 2 * Hkv
    q, k, v, do = _attention_inputs(B, S, Hq, Hkv, D, 13 * D + causal)
    o, lse = ptxsim.run(fwd_kernel.build_attention(B, S, Hq, Hkv, D, causal=causal).specialize(), [q, k, v])
    lse = lse.view(np.float32)
    mode = dict(causal=causal, atomic_dq=True, dq_bulk=True, dq_ordered=True)
    prep, dkdv = fab.build_attention_backward(B, S, Hq, Hkv, D, dq_convert=True, num_sms=3,
                                              **mode).kernels
    assert dkdv.specialize().grid == (3 * Hkv + 3, 1, 1)
    stats, acc, sem = ptxsim.run(prep.specialize(), [o, lse, do], scratch=(1,))
    dk, dv, dq = ptxsim.run(dkdv.specialize(), [q, k, v, do, stats, acc, sem], inplace=True)
    _, _, grads = _attention_reference(q, k, v, do, causal)
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), grads):
        assert _rel(_f64(got, "bf16"), ref) < TOL["bf16"], name
    (dq0,) = ptxsim.run(fab.build_attention_backward(B, S, Hq, Hkv, D, **mode).kernels[2]
                        .specialize(), [acc[:B]])
    assert np.array_equal(dq, dq0)


@pytest.mark.parametrize("lag", [1, 3])
def test_attention_backward_convert_lag(lag, S=300):
    """``convert_lag``: the producer's warps 2 and 3 of the CTAs of kv head ``h`` convert the
    q blocks of head ``h - lag`` (two per CTA), the 3 converter CTAs the last ``lag`` heads'
    blocks. Four kv heads (B=2, H=2), a ragged S; dQ poisoned, bit for bit the conversion
    kernel's."""
    B, H, D = 2, 2, 128
    q, k, v, do = _attention_inputs(B, S, H, H, D, 19 + lag)
    o, lse = ptxsim.run(fwd_kernel.build_attention(B, S, H, H, D).specialize(), [q, k, v])
    lse = lse.view(np.float32)
    mode = dict(atomic_dq=True, dq_bulk=True, dq_ordered=True)
    prep, dkdv = fab.build_attention_backward(B, S, H, H, D, dq_convert=True, num_sms=3,
                                              convert_lag=lag, **mode).kernels
    assert dkdv.specialize().grid == (4 * 3 + 3, 1, 1)
    stats, acc, sem = ptxsim.run(prep.specialize(), [o, lse, do], scratch=(1,))
    dk, dv, dq = ptxsim.run(dkdv.specialize(), [q, k, v, do, stats, acc, sem], inplace=True)
    _, _, grads = _attention_reference(q, k, v, do, False)
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), grads):
        assert _rel(_f64(got, "bf16"), ref) < TOL["bf16"], name
    (dq0,) = ptxsim.run(fab.build_attention_backward(B, S, H, H, D, **mode).kernels[2]
                        .specialize(), [acc[:B]])
    assert np.array_equal(dq, dq0)


@pytest.mark.parametrize("D,causal,Hq,Hkv,lead,extra", [
    (128, False, 2, 2, 1, dict(dq_convert=True, num_sms=3, convert_lag=1)),
    (128, True, 2, 2, 3, {}),
    (64, True, 4, 2, 2, {}),          # two q heads per kv head: 2 * 384 rows over 3 CTAs
])
def test_attention_backward_stats_lead(D, causal, Hq, Hkv, lead, extra, S=300):
    """``stats_lead``: the prep writes the stats of the first ``lead`` kv heads only (STATS
    poisoned), warps 2 and 3 of kv head ``h``'s CTAs those of head ``h + lead``, and each
    head's producer waits for its flag. Four kv heads (B=2), a ragged S; against float64 and
    bit for bit the plain ordered kernel's gradients (the same stats)."""
    B = 2
    q, k, v, do = _attention_inputs(B, S, Hq, Hkv, D, 29 + lead)
    o, lse = ptxsim.run(fwd_kernel.build_attention(B, S, Hq, Hkv, D, causal=causal).specialize(),
                        [q, k, v])
    lse = lse.view(np.float32)
    mode = dict(causal=causal, atomic_dq=True, dq_bulk=True, dq_ordered=True)
    outs = []
    for stats_lead, more in ((lead, extra), (0, {})):
        bwd = fab.build_attention_backward(B, S, Hq, Hkv, D, stats_lead=stats_lead, **mode,
                                           **more)
        prep, dkdv, *convert = bwd.kernels
        assert ("OUT" in dkdv.arg_names) == bool(stats_lead)
        stats, acc, sem = ptxsim.run(prep.specialize(), [o, lse, do], scratch=(0, 1))
        got = ptxsim.run(dkdv.specialize(), [q, k, v, do, stats, acc, sem]
                         + ([o, lse] if stats_lead else []), inplace=True)
        if convert:
            got = ptxsim.run(convert[0].specialize(), [acc]) + got
        else:
            got = got[2:] + got[:2]
        outs.append((stats,) + tuple(got))
    _, _, grads = _attention_reference(q, k, v, do, causal)
    for name, got, ref in zip(("dq", "dk", "dv"), outs[0][1:], grads):
        assert _rel(_f64(got, "bf16"), ref) < TOL["bf16"], name
    assert all(np.array_equal(x, y) for x, y in zip(outs[0], outs[1]))


@pytest.mark.parametrize("ordered,convert", [(False, False), (True, False), (True, True)])
def test_dkdv_trace(ordered, convert, S=300):
    """``build_dkdv(trace=True)``: the same gradients, bit for bit, plus a TRACE row per CTA
    (converters included) whose every element is written (outputs poisoned); the simulator's
    clock and SM read 0, so the row holds zeros."""
    B, Hq, Hkv, D = 1, 4, 2, 64
    q, k, v, do = _attention_inputs(B, S, Hq, Hkv, D, 17)
    o, lse = ptxsim.run(fwd_kernel.build_attention(B, S, Hq, Hkv, D, causal=True).specialize(), [q, k, v])
    lse = lse.view(np.float32)
    mode = dict(causal=True, atomic_dq=True, dq_bulk=True, dq_ordered=ordered,
                dq_convert=convert, num_sms=3)
    width = fab.dq_accumulator_width(D, True)
    prep = fab.build_prep(B, S, Hq, D, counters=ordered, width=width).specialize()
    sem = (1,) if ordered else ()
    outs = []
    for trace in (False, True):
        stats, acc, *cnt = ptxsim.run(prep, [o, lse, do], scratch=sem)
        dkdv = fab.build_dkdv(B, S, Hq, Hkv, D, trace=trace, **mode).specialize()
        got = ptxsim.run(dkdv, [q, k, v, do, stats, acc, *cnt], inplace=True)
        if not convert:
            got = got[:2] + ptxsim.run(fab.build_convert(B, S, Hq, D, width=width).specialize(),
                                       [acc]) + got[2:]
        outs.append(got)
    assert all(np.array_equal(x, y) for x, y in zip(outs[0], outs[1]))
    trace = outs[1][-1]
    assert trace.shape == (3 * Hkv + (3 if convert else 0), 4) and not trace.any()


def _ordered_full_backward(S, max_steps):
    B, Hq, Hkv, D = 1, 2, 1, 64
    q, k, v, do = _attention_inputs(B, S, Hq, Hkv, D, 11)
    o, lse = ptxsim.run(fwd_kernel.build_attention(B, S, Hq, Hkv, D).specialize(), [q, k, v])
    bwd = fab.build_attention_backward(B, S, Hq, Hkv, D, atomic_dq=True, dq_bulk=True,
                                       dq_ordered=True)
    prep, dkdv, convert = bwd.kernels
    stats, acc, sem = ptxsim.run(prep.specialize(), [o, lse.view(np.float32), do], poison=False)
    ptxsim.run(dkdv.specialize(), [q, k, v, do, stats, acc, sem], inplace=True,
               max_steps=max_steps)
    (dq,) = ptxsim.run(convert.specialize(), [acc])
    return _rel(_f64(dq, "bf16"), _attention_reference(q, k, v, do, False)[2][0])


def test_ordered_dq_rotation_needs_a_resident_head(monkeypatch):
    """Full attention with ``ceil(S/64) == 2 * ceil(S/128)`` takes the rotated order, in which
    the last kv block of a head waits for block 0, launched last: run one CTA after another it
    never finishes (on a GPU every kv block of the head must be resident together, hence
    ``ROTATE_MAX_KV``); above the cap the ascending order runs in launch order."""
    with pytest.raises(ptxsim.SimError, match="step limit"):
        _ordered_full_backward(256, max_steps=150_000)
    monkeypatch.setattr(bwd_dkdv, "ROTATE_MAX_KV", 1)
    bwd_host._build.cache_clear()
    try:
        assert _ordered_full_backward(256, max_steps=2_000_000) < TOL["bf16"]
    finally:
        bwd_host._build.cache_clear()


def test_attention_tuned_configs_are_simulated():
    """Every ``ATTENTION_CONFIGS`` entry is one of the simulated forward cases above."""
    simulated = [c for _, _, c in test_attention_forward.pytestmark[0].args[1]]
    for cfg in fwd_config.ATTENTION_CONFIGS:
        assert cfg.changes() in simulated, cfg
