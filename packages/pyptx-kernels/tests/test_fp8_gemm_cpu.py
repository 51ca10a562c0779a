"""CPU checks of the scaled FP8 GEMM (``examples/hopper/fp8_gemm.py``): every tuned
configuration assembles for sm_90a without spills, the builder and ``scaled_mm`` refuse
bad input with ``ConfigError``, and a numpy model of the kernel's exact work split
(persistent tile walk of ``tile_origin``, the accumulator fragment of every thread,
k-blocks of 128 with zero fill past K, the block-scale indices and predicates, the
row-scale epilogue over the padded ``sb``, store clipping) reproduces the float64
reference to 1e-12 and writes every output element exactly once.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from pyptx.errors import ConfigError
from pyptx.fragment import accumulator_coord

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]
fp8 = importlib.import_module("pyptx_kernels.fp8_gemm.kernel")


# ---------------------------------------------------------------------- the PTX
@pytest.mark.parametrize("scale", ["tensor", "row", "block"])
def test_configs_assemble_without_spills(scale, assemble):
    kernels = [fp8.build_fp8_gemm(4096, 4096, 4096, scale=scale, **c.kwargs)
               for c in fp8.FP8_CONFIGS]
    kernels.append(fp8.build_fp8_gemm(1000, 520, 400, scale=scale, dtype="e5m2",
                                      dtype_b="e4m3", out_dtype="f32", BN=64, ND=520))
    if scale != "block":
        kernels.append(fp8.build_fp8_gemm(300, 200, 160, scale=scale, fast_accum=True,
                                          ND=200, BN=192, cluster=1))
        kernels.append(fp8.build_fp8_gemm(300, 200, 160, scale=scale, ND=200, BN=192))
    for k in kernels:
        text = k.ptx()
        assert "setmaxnreg.inc" in text and "cp.async.bulk.tensor" in text
        report = assemble(text)
        assert "0 bytes spill stores" in report, report


def test_promotion_uses_a_partial_accumulator_of_at_most_128_columns():
    text = fp8.build_fp8_gemm(4096, 4096, 4096, BN=256).ptx()
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in text
    assert "m64n256k32" not in text
    assert text.count("add.f32") >= 128  # main += part, both halves
    fast = fp8.build_fp8_gemm(4096, 4096, 4096, BN=256, fast_accum=True).ptx()
    assert "m64n256k32.f32.e4m3.e4m3" in fast
    block = fp8.build_fp8_gemm(4096, 4096, 4096, BN=256, scale="block").ptx()
    assert block.count("fma.rn.f32") == 128
    assert "m64n96k32" in fp8.build_fp8_gemm(4096, 4096, 4096, BN=192).ptx()
    mixed = fp8.build_fp8_gemm(256, 256, 256, dtype="e5m2", dtype_b="e4m3").ptx()
    assert "k32.f32.e5m2.e4m3" in mixed


def test_builder_refuses_bad_configurations():
    with pytest.raises(ConfigError, match="multiple of 16"):
        fp8.build_fp8_gemm(64, 64, 100)
    with pytest.raises(ConfigError, match="block scales need BN"):
        fp8.build_fp8_gemm(64, 64, 128, scale="block", BN=192)
    with pytest.raises(ConfigError, match="fast_accum"):
        fp8.build_fp8_gemm(64, 64, 128, scale="block", fast_accum=True)
    with pytest.raises(ConfigError, match="dtype"):
        fp8.build_fp8_gemm(64, 64, 128, dtype="bf16")
    with pytest.raises(ConfigError, match="scale must be"):
        fp8.build_fp8_gemm(64, 64, 128, scale="col")
    with pytest.raises(ConfigError, match="ND must be"):
        fp8.build_fp8_gemm(64, 65, 128, ND=65)
    with pytest.raises(ConfigError, match="shared memory"):
        fp8.build_fp8_gemm(64, 64, 128, stages=8)


# ---------------------------------------------------------------------- host side
def test_scale_kind_from_shapes():
    M, N, K = 300, 520, 400
    assert fp8.scale_kind((), (), M, N, K) == "tensor"
    assert fp8.scale_kind((1,), (1, 1), M, N, K) == "tensor"
    assert fp8.scale_kind((M, 1), (1, N), M, N, K) == "row"
    assert fp8.scale_kind((M, 4), (5, 4), M, N, K) == "block"
    assert fp8.scale_kind((M, 3), (5, 4), M, N, K) is None
    assert fp8.scale_kind((1, N), (M, 1), M, N, K) is None


def test_scaled_mm_refuses_bad_input():
    a = torch.randn(64, 128).to(torch.float8_e4m3fn)
    w = torch.randn(96, 128).to(torch.float8_e4m3fn)
    s = torch.ones(())
    with pytest.raises(ConfigError, match="inner dimensions"):
        fp8.scaled_mm(a, w[:, :64].t(), s, s)
    with pytest.raises(ConfigError, match="float8"):
        fp8.scaled_mm(a.float(), w.t(), s, s)
    with pytest.raises(ConfigError, match="fit no scale kind"):
        fp8.scaled_mm(a, w.t(), torch.ones(64, 2), torch.ones(1, 96))
    with pytest.raises(ConfigError, match="out_dtype"):
        fp8.scaled_mm(a, w.t(), s, s, out_dtype="f16")


def test_k_padding_keeps_values():
    x = torch.randn(5, 40).to(torch.float8_e4m3fn)
    p = fp8._pad_k(x, "torch")
    assert p.shape == (5, 48) and p.dtype == x.dtype
    assert torch.equal(p[:, :40].float(), x.float()) and not p[:, 40:].float().any()


# ---------------------------------------------------------------------- numpy model
def model(M, N, K, kind, a, w, sa, sb, *, BM=128, BN=256, cluster=2, fast_accum=False,
          num_sms=132, ND=None):
    """The kernel's arithmetic, thread by thread, in float64 (see the module docstring)."""
    ND = ND or N
    g = fp8.Geometry(M, N, K, BM, BN, cluster, 8, num_sms)
    KS, NS = g.KS, g.NS
    sa_f = sa.reshape(-1)
    sb_f = sb.reshape(-1)
    NH = fp8.partial_columns(BN, fast_accum)
    W = np.arange(4)[:, None, None]
    L = np.arange(32)[None, :, None]
    Ij = np.arange(BN // 2)[None, None, :]
    row, col = np.broadcast_arrays(*accumulator_coord(Ij, W, L))  # (4, 32, BN/2) each
    row0 = 16 * W + L // 4                           # thread_origin
    assert (row - row0 == 8 * ((Ij // 2) % 2)).all()
    i_part = Ij % (NH // 2)                          # the register of the partial sum
    half = Ij // (NH // 2)
    out = np.full((M, ND), np.nan)
    writes = np.zeros((M, ND), dtype=int)
    seen = set()
    for cid in range(g.clusters):
        for rank in range(cluster):
            for t in range(cid, g.tiles, g.clusters):
                m0, n0 = fp8.tile_origin(t, rank, g)
                assert (m0, n0) not in seen
                seen.add((m0, n0))
                for wg in range(BM // 64):
                    r = m0 + wg * 64 + row
                    c = n0 + col
                    r0 = m0 + wg * 64 + row0
                    main = np.zeros(row.shape)
                    for kb in range(g.num_kb):
                        k0, k1 = kb * fp8.BK, min(K, (kb + 1) * fp8.BK)
                        ablk = np.zeros((64, fp8.BK))
                        wblk = np.zeros((BN, fp8.BK))
                        rows_a = a[m0 + wg * 64: m0 + wg * 64 + 64, k0:k1]
                        rows_w = w[n0: n0 + BN, k0:k1]
                        ablk[:rows_a.shape[0], :k1 - k0] = rows_a
                        wblk[:rows_w.shape[0], :k1 - k0] = rows_w
                        # the registers the halves' wgmma write; others stay 0
                        part = np.zeros(row.shape)
                        for h in range(BN // NH):
                            js = slice(h * (NH // 2), (h + 1) * (NH // 2))
                            part[..., js] = (ablk @ wblk.T)[row[..., js], col[..., js]]
                        if kind == "block":
                            ra = r0 * KS
                            sa0 = np.where(r0 < M, sa_f[np.minimum(ra + kb, sa_f.size - 1)], 0)
                            i1 = ra + kb + 8 * KS
                            sa1 = np.where(r0 + 8 < M, sa_f[np.minimum(i1, sa_f.size - 1)], 0)
                            nbk = (n0 + half * NH) >> 7
                            sbv = np.where(nbk < NS, sb_f[np.minimum(nbk * KS + kb, sb_f.size - 1)], 0)
                            s = np.where((i_part // 2) % 2, sa1, sa0) * sbv
                            main = main + part * s
                        else:
                            main = main + part
                    if kind == "tensor":
                        v = main * (sa_f[0] * sb_f[0])
                    elif kind == "row":
                        rs0 = np.where(r0 < M, sa_f[np.minimum(r0, M - 1)], 0)
                        rs1 = np.where(r0 + 8 < M, sa_f[np.minimum(r0 + 8, M - 1)], 0)
                        rs = np.where((Ij // 2) % 2, rs1, rs0)
                        cs = np.where(c < N, sb_f[np.minimum(c, N - 1)], 0)
                        v = main * rs * cs
                    else:
                        v = main
                    ok = (r < M) & (c < ND)
                    out[r[ok], c[ok]] = v[ok]
                    np.add.at(writes, (r[ok], c[ok]), 1)
    assert len(seen) == g.tiles * cluster
    return out, writes


MODEL_CASES = [
    # M, N, K, kind, config
    (200, 328, 400, "block", dict(BN=256, cluster=2, num_sms=4)),
    (200, 328, 400, "block", dict(BN=128, cluster=1, num_sms=3)),
    (129, 65, 16, "block", dict(BN=64, cluster=2, num_sms=132)),
    (300, 520, 272, "row", dict(BN=256, cluster=2, num_sms=2)),
    (129, 65, 16, "row", dict(BN=128, cluster=1, num_sms=5)),
    (300, 520, 272, "tensor", dict(BN=192, cluster=1, num_sms=7, fast_accum=True)),
    (513, 260, 144, "tensor", dict(BN=128, cluster=2, num_sms=6)),
    (300, 520, 272, "row", dict(BN=192, cluster=1, num_sms=5)),
    (300, 520, 272, "tensor", dict(BN=192, cluster=2, num_sms=132)),
]


@pytest.mark.parametrize("M,N,K,kind,cfg", MODEL_CASES)
def test_numpy_model_of_the_kernel_matches_the_reference(M, N, K, kind, cfg):
    a, w, sa, sb = fp8.make_inputs(M, N, K, kind, device="cpu", seed=3)
    ref = fp8.reference(a, w, sa, sb, kind).numpy()
    ND = N + (-N % 8)
    a64, w64 = a.double().numpy(), w.double().numpy()
    out, writes = model(M, N, K, kind, a64, w64, sa.double().numpy(), sb.double().numpy(),
                        ND=ND, **cfg)
    assert (writes == 1).all(), "every element of the padded output written exactly once"
    np.testing.assert_allclose(out[:, :N], ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    assert not out[:, N:].any(), "padding columns are zero"


def test_reference_block_scales_match_the_definition():
    M, N, K = 7, 130, 300
    a, w, sa, sb = fp8.make_inputs(M, N, K, "block", device="cpu", seed=5)
    ref = fp8.reference(a, w, sa, sb, "block")
    a64, w64 = a.double(), w.double()
    want = torch.zeros(M, N, dtype=torch.float64)
    for kb in range(3):
        ks = slice(kb * 128, min(K, kb * 128 + 128))
        partial = a64[:, ks] @ w64[:, ks].T
        want += partial * sa[:, kb].double()[:, None] * sb[torch.arange(N) // 128, kb].double()[None, :]
    torch.testing.assert_close(ref, want, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------- opt-in main loops
VARIANTS = [
    # scale, config
    ("tensor", dict(BN=128, cluster=1, pingpong=True)),
    ("tensor", dict(BN=128, cluster=1, pingpong=2)),
    ("tensor", dict(BN=128, cluster=2, pingpong=4, promote_kb=2)),
    ("tensor", dict(BN=256, cluster=2, promote_kb=2)),
    ("tensor", dict(BN=128, cluster=1, promote_kb=2)),
    ("row", dict(BN=128, cluster=1, pingpong=True)),
    ("row", dict(BN=192, cluster=1, promote_kb=2)),
    ("block", dict(BN=128, cluster=2, pingpong=True)),
    ("block", dict(BN=64, cluster=2, pingpong=8)),
    ("block", dict(BN=128, cluster=2, scale_prefetch=True)),
    ("block", dict(BN=256, cluster=2, scale_prefetch=True)),
]


@pytest.mark.parametrize("scale,cfg", VARIANTS)
@pytest.mark.parametrize("K", [4096, 400])
def test_variants_assemble_without_spills_or_serialised_wgmma(scale, cfg, K, assemble):
    """The opt-in main loops assemble with 0 spills, and ptxas keeps their wgmma
    asynchronous (its C7514 'serialized' note would make the ping-pong pointless)."""
    text = fp8.build_fp8_gemm(4096, 4096, K, scale=scale, **cfg).ptx()
    report = assemble(text)
    assert "0 bytes spill stores" in report, report
    assert "serialized" not in report, report
    if cfg.get("pingpong") and K == 4096:
        assert "wgmma.wait_group.sync.aligned 1;" in text


@pytest.mark.parametrize("scale", ["tensor", "row", "block"])
def test_default_configs_keep_wgmma_asynchronous(scale, assemble):
    for c in fp8.FP8_CONFIGS:
        report = assemble(fp8.build_fp8_gemm(4096, 4096, 4096, scale=scale, **c.kwargs).ptx())
        assert "serialized" not in report, (c, report)


def test_variants_refuse_what_does_not_apply():
    with pytest.raises(ConfigError, match="BN <= 128"):
        fp8.build_fp8_gemm(256, 256, 256, BN=256, pingpong=True)
    with pytest.raises(ConfigError, match="promote_kb=1"):
        fp8.build_fp8_gemm(256, 256, 256, scale="block", promote_kb=2)
    with pytest.raises(ConfigError, match="promote_kb must be"):
        fp8.build_fp8_gemm(256, 256, 256, promote_kb=3)
    with pytest.raises(ConfigError, match="fast_accum has none"):
        fp8.build_fp8_gemm(256, 256, 256, fast_accum=True, pingpong=True)
    with pytest.raises(ConfigError, match="scale_prefetch"):
        fp8.build_fp8_gemm(256, 256, 256, scale="tensor", scale_prefetch=True)
    with pytest.raises(ConfigError, match="scale_prefetch"):
        fp8.build_fp8_gemm(256, 256, 256, scale="block", BN=128, pingpong=True,
                           scale_prefetch=True)
    with pytest.raises(ConfigError, match="2 to 16"):
        fp8.build_fp8_gemm(256, 256, 256, BN=128, pingpong=1)
    names = {fp8.build_fp8_gemm(256, 256, 256, BN=128, **kw).ptx().split(".entry ")[1][:60]
             for kw in ({}, {"pingpong": 2}, {"promote_kb": 2}, {"pingpong": 4})}
    assert len(names) == 4, "variants get distinct kernel names (caches)"


def simulate(num_kb, promote_kb, pingpong, halves, prefetch, stages=4):
    """Replay ``mainloop_plan``'s events with wgmma groups completing as late as the
    waits allow; check every hazard the kernel relies on and return the promotions as
    ``(half, k-blocks, k-block of the scales used)``."""
    plan = fp8.mainloop_plan(num_kb, promote_kb, pingpong, halves, prefetch)
    next_kb, held, inflight = 0, [], []          # held: ring k-blocks not yet released
    partial = {}                                  # partial -> (half, kbs) not yet promoted
    sets = [None, None]
    promoted = []
    for trips, step, base, events in plan:
        for trip in range(trips if trips is not None else 1):
            kb_iter = base + trip * step
            assert not inflight, "a wgmma group crosses a segment (loop back edge)"
            taken = []
            for ev in events:
                op = ev[0]
                if op == "scales":
                    at = kb_iter + ev[2]
                    sets[ev[1]] = min(at, num_kb - 1) if ev[3] else at
                    assert 0 <= sets[ev[1]] < num_kb
                elif op == "take":
                    taken = list(range(next_kb, next_kb + ev[1]))
                    next_kb += ev[1]
                    held += taken
                    assert len(held) <= stages, "more stages held than the ring has"
                elif op == "issue":
                    p, h = ev[1], ev[2]
                    assert all(g[0] != p for g in inflight), "partial written while in flight"
                    assert p not in partial or h > 0 and pingpong == 0 and halves > 1, \
                        "partial overwritten before its promotion"
                    partial[p] = (h, tuple(taken))
                    inflight.append((p, h, tuple(taken)))
                elif op == "wait":
                    del inflight[:max(0, len(inflight) - ev[1])]
                elif op == "release":
                    for _ in range(ev[1]):
                        kb = held.pop(0)
                        assert not any(kb in g[2] for g in inflight), \
                            "stage released while a wgmma in flight reads it"
                elif op == "promote":
                    p, h, s = ev[1], ev[2], ev[3]
                    assert all(g[0] != p for g in inflight), "partial read while in flight"
                    ph, kbs = partial.pop(p)
                    assert ph == h
                    promoted.append((h, kbs, sets[s]))
                elif op == "rotate":
                    sets[0] = sets[1]
    assert not inflight and not held and not partial and next_kb == num_kb
    return promoted


@pytest.mark.parametrize("num_kb", [1, 2, 3, 4, 5, 7, 8, 9, 32, 33])
@pytest.mark.parametrize("promote_kb,pingpong,halves,prefetch", [
    (1, 0, 1, False), (1, 0, 2, False), (2, 0, 1, False), (2, 0, 2, False),
    (1, 0, 1, True), (1, 0, 2, True), (1, 2, 1, False), (1, 4, 1, False),
    (2, 4, 1, False), (1, 16, 1, False), (2, 3, 1, False)])
def test_main_loop_schedule(num_kb, promote_kb, pingpong, halves, prefetch):
    """Every k-block is read by exactly one wgmma group, in order, into a partial that is
    neither in flight nor holding an unpromoted sum; stages are released only after the
    group reading them completed; no group is in flight across a device loop's back edge;
    each column half is promoted once per unit, with the scales of the unit's k-block."""
    promoted = simulate(num_kb, promote_kb, pingpong, halves, prefetch)
    want = [(h, tuple(range(k, min(num_kb, k + promote_kb))))
            for k in range(0, num_kb, promote_kb) for h in range(halves)]
    assert [(h, kbs) for h, kbs, _ in promoted] == want
    if promote_kb == 1:
        assert all(s == kbs[0] for _, kbs, s in promoted), "block scales of another k-block"


@pytest.mark.parametrize("mutate,msg", [
    (lambda ev: [e for e in ev if e != ("wait", 1)], "in flight"),
    (lambda ev: [("issue", 0, 0) if e[0] == "issue" else e for e in ev], "partial"),
    (lambda ev: [e for e in ev if e != ("wait", 0)], "in flight|back edge"),
    (lambda ev: [("scales", e[1], 0, False) if e[0] == "scales" else e for e in ev],
     "scales of another"),
])
def test_schedule_simulator_catches_hazards(monkeypatch, mutate, msg):
    """The schedule test can fail: broken chains are caught."""
    good = fp8.chain_events
    monkeypatch.setattr(fp8, "chain_events", lambda counts, pk: mutate(good(counts, pk)))
    with pytest.raises(AssertionError, match=msg):
        test_main_loop_schedule(9, 1, 4, 1, False)


# ---------------------------------------------------------------------- accumulation model
def tensor_core_sum(a, w, m=14):
    """A model of one wgmma chain's fp8 accumulation: per k32 step the accumulator and the
    32 exact products are truncated (toward zero) to ``m`` fraction bits below the largest
    exponent among them, then added. With m = 14 it reproduces the H100 errors measured at
    K = 16384 (benchmarks/fp8_gemm.py, 256 x 256): normal inputs 3.15e-3 without promotion,
    1.27e-4 promoting every 128; uniform [0, 2) 2.49e-1 and 4.98e-4."""
    c = np.zeros((a.shape[0], w.shape[0]))
    for k in range(0, a.shape[1], 32):
        allv = np.concatenate([c[..., None], a[:, None, k:k + 32] * w[None, :, k:k + 32]], -1)
        e = np.frexp(np.abs(allv).max(-1))[1][..., None]
        q = np.ldexp(1.0, e - m)
        c = (np.trunc(allv / q) * q).sum(-1)
    return c


def promoted_error(positive, every, n=16, K=16384):
    g = torch.Generator().manual_seed(1)
    r = (lambda *s: torch.rand(*s, generator=g)) if positive else \
        (lambda *s: torch.randn(*s, generator=g))
    a = (r(n, K) * 2).to(torch.float8_e4m3fn).double().numpy()
    w = (r(n, K) * 2).to(torch.float8_e4m3fn).double().numpy()
    ref = a @ w.T
    out = sum(tensor_core_sum(a[:, k:k + every], w[:, k:k + every]) for k in range(0, K, every))
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def test_accumulation_model_and_promote_kb_2():
    """The calibrated model matches the measured promoted errors (within 25%), and predicts
    promote_kb=2 (every 256 K) inside the f32-output tolerance with margin: about 1.7x the
    error of promoting every 128 for normal inputs, 3.4x for uniform ones (docs/dev/fp8-gemm.md)."""
    measured = {False: 1.27e-4, True: 4.98e-4}
    for positive in (False, True):
        e128 = promoted_error(positive, 128)
        e256 = promoted_error(positive, 256)
        assert abs(e128 / measured[positive] - 1) < 0.25, (positive, e128)
        assert e128 < e256 < fp8.TOL["f32"] / 1.5, (positive, e256)
