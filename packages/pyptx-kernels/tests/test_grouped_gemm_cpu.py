"""CPU tests of the grouped GEMM (``pyptx_kernels.grouped_gemm``).

* the ragged tile walk (``RaggedTiles``) and the weight-gradient's group rows, as traced
  PTX run in the simulator (``ptxsim``), against a Python model of the tile order;
* the masked epilogue (``epilogue.Consumer.store_masked``) in the simulator: exactly the rows
  below the group end and the columns below N are written, with the right values;
* every tuned configuration of the three kernels assembles with ptxas without spills;
* bad configurations and bad calls raise ``ConfigError`` at the caller's line.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from pyptx import Tile, kernel, ptx, reg
from pyptx.errors import ConfigError
from pyptx.fragment import Accumulator
from pyptx.types import s32, u32, u64

HERE = Path(__file__).resolve()
gg = importlib.import_module("pyptx_kernels.grouped_gemm")
from pyptx_kernels.grouped_gemm import config, epilogue, host, scheduler  # noqa: E402
from pyptx_kernels.grouped_gemm.config import GroupedConfig, WgradConfig  # noqa: E402


@pytest.fixture(scope="module")
def sim():
    sys.path.insert(0, str(HERE.parent))
    import ptxsim

    return ptxsim


def model_tiles(sizes, M, BM, num_n):
    """Python model of the forward tile order: (g, m0, n0, end) per tile, m-block fastest."""
    out, start = [], 0
    for g, s in enumerate(sizes):
        end = min(max(start + s, start), M)
        blocks = -(-(end - start) // BM)
        for nb in range(num_n):
            for mb in range(blocks):
                out.append((g, start + mb * BM, nb, end))
        start = end
    return out


def _walk_probe(G, M, BM, BN, num_n, ctas, slots):
    @kernel(in_specs=(Tile(G, s32),), out_specs=(Tile(ctas, slots, 4, u32),),
            grid=(ctas, 1, 1), block=(32, 1, 1), name="walk_probe")
    def probe(Offs, Out):
        (p_offs,) = ptx.global_ptrs(Offs)
        (p_out,) = ptx.global_ptrs(Out)
        cid = reg.from_(ptx.special.ctaid.x(), u32)
        lead = reg.from_(ptx.special.tid.x(), u32) == 0
        walk = scheduler.RaggedTiles(p_offs, G, M, BM, num_n)
        t = reg.scalar(u32, init=cid)
        slot = reg.scalar(u32, init=0)
        row = p_out + reg.from_(cid, u64) * (slots * 16)
        top, end = ptx.label("t"), ptx.label("e")
        ptx.place(top)
        walk.seek(t)
        ptx.bra(end, pred=walk.done(t))
        g, m0, n0 = walk.tile(t, BN)
        a = row + reg.from_(slot, u64) * 16
        ptx.inst.st.global_.v4.u32(ptx.addr(a), [g, m0, n0, walk.end], pred=lead)
        slot += 1
        t += ctas
        ptx.bra(top)
        ptx.place(end)
        fill = reg.scalar(u32, init=0xFFFFFFFF)
        for s in ptx.loop(slot, slots):
            a = row + reg.from_(s, u64) * 16
            ptx.inst.st.global_.v4.u32(ptx.addr(a), [fill] * 4, pred=lead)
        ptx.ret()

    return probe


@pytest.mark.parametrize("sizes,BM,BN,N,ctas", [
    ([0, 37, 130], 128, 256, 72, 3),
    ([0, 37, 130], 64, 128, 300, 5),
    ([5, 0, 300, 1, 200, 0], 128, 128, 264, 4),
    ([128] * 6, 128, 256, 512, 7),
    ([0, 0, 0], 64, 64, 64, 2),
    ([400, 0], 64, 256, 256, 1),
])
def test_ragged_walk_matches_the_model(sim, sizes, BM, BN, N, ctas):
    G, M = len(sizes), sum(sizes)
    num_n = -(-N // BN)
    want = model_tiles(sizes, M, BM, num_n)
    total = len(want)
    slots = max(1, -(-total // ctas)) + 1
    offs = np.cumsum(sizes).astype(np.int32)
    (got,) = sim.run(_walk_probe(G, M, BM, BN, num_n, ctas, slots).specialize(), [offs])
    visited = []
    for c in range(ctas):
        k = 0
        for s in range(slots):
            rec = tuple(int(v) for v in got[c, s])
            if rec[0] == 0xFFFFFFFF:
                break
            visited.append((c + k * ctas, rec))
            k += 1
        assert all(int(v) == 0xFFFFFFFF for v in got[c, k:].ravel())
    visited.sort()
    assert [t for t, _ in visited] == list(range(total))
    expect = [(g, m0, nb * BN, end) for g, m0, nb, end in want]
    assert [r for _, r in visited] == expect


def test_group_rows_clamps(sim):
    G, M = 4, 100

    @kernel(in_specs=(Tile(G, s32),), out_specs=(Tile(G, 2, u32),), block=(32, 1, 1),
            name="rows_probe")
    def probe(Offs, Out):
        (p_offs,) = ptx.global_ptrs(Offs)
        (p_out,) = ptx.global_ptrs(Out)
        lead = reg.from_(ptx.special.tid.x(), u32) == 0
        for g in ptx.loop(0, G):
            start, end = scheduler.group_rows(p_offs, g, M)
            ptx.inst.st.global_.v2.u32(ptx.addr(p_out + reg.from_(g, u64) * 8), [start, end],
                                       pred=lead)
        ptx.ret()

    offs = np.array([10, 10, 60, 150], np.int32)  # an empty group; the last end past M
    (got,) = sim.run(probe.specialize(), [offs])
    assert got.tolist() == [[0, 10], [10, 10], [10, 60], [60, 100]]


@pytest.mark.parametrize("out", ["f32", "bf16"])
@pytest.mark.parametrize("mrow,n0,end,N", [(0, 0, 37, 72), (64, 64, 100, 72), (0, 0, 64, 256),
                                           (8, 0, 8, 64), (0, 128, 200, 200)])
def test_masked_epilogue_writes_exactly_the_group_rows(sim, out, mrow, n0, end, N):
    M, BN = 192, 128
    ot = epilogue.out_type(out)

    @kernel(in_specs=(), out_specs=(Tile(M, N, ot),), block=(128, 1, 1), name="masked_probe")
    def probe(D):
        (p_d,) = ptx.global_ptrs(D)
        tid = reg.from_(ptx.special.tid.x(), u32)
        c = epilogue.Consumer.__new__(epilogue.Consumer)  # only what store_masked reads
        c.acc, c.ot = Accumulator(BN), ot
        c.row0 = ((tid >> 5) << 4) + ((tid >> 2) & 7)  # the m64 fragment's thread origin
        c.col0 = (tid & 3) << 1
        for i in range(len(c.acc)):  # a float whose bits name (row, col), exact in bf16
            dr, dc = c.acc.coord(i)
            r = c.row0 + (mrow + dr)
            col = c.col0 + (n0 + dc)
            c.acc[i] = ((col >> 7) << 31) | ((r + 1) << 23) | ((col & 127) << 16)
        c.store_masked(p_d, N, reg.scalar(u32, init=mrow), reg.scalar(u32, init=n0),
                       reg.scalar(u32, init=end))
        ptx.ret()

    (got,) = sim.run(probe.specialize(), [], poison=False)
    rows = np.arange(M, dtype=np.uint32)[:, None]
    cols = np.arange(N, dtype=np.uint32)[None, :]
    inside = (rows >= mrow) & (rows < min(end, mrow + 64)) & (cols >= n0) & (cols < min(N, n0 + BN))
    bits = ((cols >> 7) << 31) | ((rows + 1) << 23) | ((cols & 127) << 16)
    want = bits if out == "f32" else bits >> 16
    np.testing.assert_array_equal(got[inside], want[inside])
    assert not got[~inside].any(), "a store outside the group's rows or past N"


def test_all_configurations_assemble_without_spills(assemble):
    kernels = []
    for c in gg.GROUPED_CONFIGS:
        kernels += [gg.build_grouped(16384, 4096, 4096, 16, config=c),
                    gg.build_grouped(8192, 256, 2048, 4, b_major="K", out_dtype="f32", config=c)]
    for c in gg.WGRAD_CONFIGS:
        kernels.append(gg.build_grouped_wgrad(16384, 4096, 4096, 16, config=c))
    kernels += [gg.build_grouped(167, 72, 104, 3, config=GroupedConfig(store="masked")),
                gg.build_grouped_wgrad(167, 104, 72, 3, out_dtype="f32",
                                       config=WgradConfig(BM=64, BN=64))]
    for k in kernels:
        text = k.ptx()
        assert "wgmma.mma_async" in text and "setmaxnreg.inc" in text
        report = assemble(text)
        assert "0 bytes spill stores" in report, (k.name, report)


def test_kernels_read_b_per_group_through_a_3d_map():
    k = gg.build_grouped(1000, 512, 256, 8)
    text = k.ptx()
    assert "cp.async.bulk.tensor.3d.shared::cluster.global" in text  # B[g] slabs
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in text      # the bulk-store epilogue
    assert "st.global.b32" in text                                   # the masked epilogue
    w = gg.build_grouped_wgrad(1000, 256, 512, 8).ptx()
    assert "cp.async.bulk.tensor.3d.global.shared::cta" in w and "fence.proxy.async" in w
    assert "st.shared.v4.b32" in w  # zeroing the rows past a group end


def test_bad_configurations_raise_at_the_callers_line():
    with pytest.raises(ConfigError, match="unsupported tile") as e:
        gg.build_grouped(256, 256, 256, 2, config=GroupedConfig(BM=256))
    assert str(e.value).startswith(f"{HERE}:")
    with pytest.raises(ConfigError, match="multiples of 8"):
        gg.build_grouped(256, 100, 256, 2)
    with pytest.raises(ConfigError, match="out_dtype"):
        gg.build_grouped_wgrad(256, 64, 64, 2, out_dtype="f16")
    with pytest.raises(ConfigError, match="store must be"):
        gg.build_grouped(256, 64, 64, 2, config=GroupedConfig(store="tma"))
    with pytest.raises(ConfigError, match="shared memory"):
        gg.build_grouped(256, 256, 256, 2, config=GroupedConfig(stages=8))


def test_grouped_mm_checks_its_arguments():
    torch = pytest.importorskip("torch")
    a = torch.zeros(10, 16, dtype=torch.bfloat16)
    b = torch.zeros(2, 16, 8, dtype=torch.bfloat16)
    offs = torch.tensor([4, 10], dtype=torch.int32)
    with pytest.raises(ConfigError, match="bfloat16") as e:
        host.grouped_mm(a.float(), b, offs)
    assert str(e.value).startswith(f"{HERE}:")
    with pytest.raises(ConfigError, match="int32"):
        host.grouped_mm(a, b, offs.long())
    with pytest.raises(ConfigError, match="groups of"):
        host.grouped_mm(a, b[:, :8], offs)
    with pytest.raises(ConfigError, match="expects a"):
        host.grouped_mm(a, b[0], offs)


def test_reference_model_of_the_backward():
    """The float64 reference's gradients are the per-group formulas the backward kernels
    compute: dA = dY @ B[g]^T, dB[g] = A_g^T @ dY_g, zero for an empty group."""
    torch = pytest.importorskip("torch")
    sizes = [3, 0, 5]
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
    a = torch.randn(8, 6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 6, 4, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(8, 4, dtype=torch.float64)
    (gg.reference(a, b, offs) * dy).sum().backward()
    s = 0
    for g, n in enumerate(sizes):
        torch.testing.assert_close(a.grad[s:s + n], dy[s:s + n] @ b[g].T)
        torch.testing.assert_close(b.grad[g], a[s:s + n].T @ dy[s:s + n])
        s += n
    assert not b.grad[1].any()


# ------------------------------------------------------------ split weight gradient (opt-in)
def model_units(sizes, M, tiles_per_group, splits, BK=64):
    """Python model of the split weight gradient's units: unit u -> (tile, split, lo, hi)
    with the group's row-block run [lo, hi) (split-major order)."""
    G = len(sizes)
    tiles = G * tiles_per_group
    ends, start = [], 0
    for s in sizes:
        end = min(max(start + s, start), M)
        ends.append((start, end))
        start = end
    out = []
    for u in range(tiles * splits):
        t, s = u % tiles, u // tiles
        a, e = ends[t // tiles_per_group]
        nkb = -(-(e - a) // BK)
        out.append((t, s, nkb * s // splits, nkb * (s + 1) // splits))
    return out


@pytest.mark.parametrize("sizes,splits,ctas", [
    ([0, 37, 130], 2, 3),
    ([2048] * 4, 2, 5),
    ([5, 0, 300, 1, 200, 0], 3, 4),
    ([64, 65, 640], 4, 7),
    ([0, 0], 8, 2),
])
def test_split_wgrad_units_match_the_model(sim, sizes, splits, ctas):
    """The traced unit decode (``wgrad_unit``) and block runs (``split_blocks``) in the
    simulator equal the model, and every group's runs tile its row blocks in split order."""
    G, M = len(sizes), sum(sizes)
    per_group = 3
    tiles = G * per_group
    units = tiles * splits
    offs = np.cumsum(sizes).astype(np.int32)

    @kernel(in_specs=(Tile(G, s32),), out_specs=(Tile(units, 4, u32),), grid=(ctas, 1, 1),
            block=(32, 1, 1), name="unit_probe")
    def probe(Offs, Out):
        (p_offs,) = ptx.global_ptrs(Offs)
        (p_out,) = ptx.global_ptrs(Out)
        cid = reg.from_(ptx.special.ctaid.x(), u32)
        lead = reg.from_(ptx.special.tid.x(), u32) == 0
        for u in ptx.loop(cid, units, ctas):
            t, s = scheduler.wgrad_unit(u, tiles, splits)
            start, end = scheduler.group_rows(p_offs, t // per_group, M)
            lo, hi = scheduler.split_blocks(s, start, end, splits)
            ptx.inst.st.global_.v4.u32(ptx.addr(p_out + reg.from_(u, u64) * 16), [t, s, lo, hi],
                                       pred=lead)
        ptx.ret()

    (got,) = sim.run(probe.specialize(), [offs])
    want = model_units(sizes, M, per_group, splits)
    assert [tuple(int(v) for v in r) for r in got] == want
    for t in range(tiles):
        runs = [(lo, hi) for tt, s, lo, hi in want if tt == t]
        start = 0 if t < per_group else int(offs[t // per_group - 1])
        nkb = -(-(int(offs[t // per_group]) - start) // 64)
        assert runs[0][0] == 0 and runs[-1][1] == nkb
        assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))


def test_split_wgrad_numpy_model_equals_the_group_products():
    """The split kernel's semantics as numpy: split s sums X_g^T Y_g over its row blocks
    (rows past the group end zeroed in X, rows of the next group still read in Y), the
    reduction adds the splits in order; the result is X_g^T Y_g for every group."""
    rng = np.random.default_rng(0)
    sizes, KX, NY, splits = [5, 0, 300, 1, 200, 130], 24, 16, 3
    M = sum(sizes)
    X = rng.standard_normal((M + 64, KX))  # + 64: a TMA box past M reads zeros
    Y = rng.standard_normal((M + 64, NY))
    X[M:] = Y[M:] = 0
    parts = np.zeros((splits, len(sizes), KX, NY))
    start = 0
    for g, n in enumerate(sizes):
        end = start + n
        for s in range(splits):
            lo, hi = scheduler.split_blocks(s, start, end, splits)
            for kb in range(lo, hi):
                r0 = start + kb * 64
                x = X[r0:r0 + 64].copy()
                x[max(0, end - r0):] = 0
                parts[s, g] += x.T @ Y[r0:r0 + 64]
        want = X[start:end].T @ Y[start:end]
        np.testing.assert_allclose(parts[:, g].sum(0), want, atol=1e-9)
        start = end


@pytest.mark.parametrize("out", ["f32", "bf16"])
def test_split_reduce_in_the_simulator(sim, out):
    """``build_split_reduce`` adds the partials in split order, rounds once (bf16: round to
    nearest even) and writes every element (outputs poisoned)."""
    G, KX, NY, S = 2, 8, 16, 3
    rng = np.random.default_rng(1)
    p = rng.standard_normal((S * G, KX, NY)).astype(np.float32)
    k = gg.build_split_reduce(G, KX, NY, S, out_dtype=out)
    (got,) = sim.run(k.specialize(), [p])
    acc = p[:G].copy()
    for s in range(1, S):
        acc = (acc + p[s * G:(s + 1) * G]).astype(np.float32)
    if out == "f32":
        np.testing.assert_array_equal(got.view(np.float32), acc)
    else:
        np.testing.assert_array_equal(got, sim._bf16_rne(acc))


def test_split_wgrad_assembles_without_spills(assemble):
    kernels = []
    for kw in (dict(BM=128, BN=256, splits=2), dict(BM=128, BN=128, splits=2),
               dict(BM=128, BN=256, splits=4)):
        w = gg.build_wgrad_split(8192, 2048, 256, 4, config=WgradConfig(**kw))
        kernels += list(getattr(w, "kernels", (w,)))
    kernels.append(gg.build_grouped_wgrad(167, 104, 72, 3, out_dtype="f32",
                                          config=WgradConfig(BM=64, BN=64, splits=3)))
    for k in kernels:
        report = assemble(k.ptx())
        assert "0 bytes spill stores" in report, (k.name, report)
    w = gg.build_grouped_wgrad(8192, 2048, 256, 4, out_dtype="f32", config=WgradConfig(splits=2))
    assert tuple(w.out_specs[0].dims) == (8, 2048, 256)


def test_split_wgrad_leaves_the_default_kernel_alone():
    """splits=1 emits the measured kernel (no split decode: no division by the tile count)."""
    a = gg.build_grouped_wgrad(8192, 2048, 256, 4, config=WgradConfig(BM=64, BN=256)).ptx()
    b = gg.build_grouped_wgrad(8192, 2048, 256, 4,
                               config=WgradConfig(BM=64, BN=256, splits=1)).ptx()
    assert a == b and "_split" not in a
    s2 = gg.build_grouped_wgrad(8192, 2048, 256, 4, out_dtype="f32",
                                config=WgradConfig(splits=2)).ptx()
    assert "div.u32" in s2 and "_split2" in s2


def test_bad_split_configurations_raise_at_the_callers_line():
    with pytest.raises(ConfigError, match="splits must be") as e:
        gg.build_grouped_wgrad(256, 64, 64, 2, out_dtype="f32", config=WgradConfig(splits=0))
    assert str(e.value).startswith(f"{HERE}:")
    with pytest.raises(ConfigError, match="out_dtype must be 'f32'"):
        gg.build_grouped_wgrad(256, 64, 64, 2, config=WgradConfig(splits=2))
    with pytest.raises(ConfigError, match="splits must be"):
        gg.build_split_reduce(2, 64, 64, 9)


def test_l2_hint_option():
    """``l2_hint="stream_b"``: B's copies evict-first, A's evict-last; default unchanged."""
    plain = gg.build_grouped(8192, 4096, 2048, 64).ptx()
    assert "createpolicy" not in plain and "cache_hint" not in plain
    text = gg.build_grouped(8192, 4096, 2048, 64,
                            config=GroupedConfig(l2_hint="stream_b")).ptx()
    assert "createpolicy.fractional.L2::evict_first.b64" in text
    assert "createpolicy.fractional.L2::evict_last.b64" in text
    loads = [ln for ln in text.splitlines() if "cp.async.bulk.tensor" in ln and "global.mbarrier" in ln]
    assert loads and all("L2::cache_hint" in ln for ln in loads)
    with pytest.raises(ConfigError, match="l2_hint must be") as e:
        gg.build_grouped(256, 64, 64, 2, config=GroupedConfig(l2_hint="first"))
    assert str(e.value).startswith(f"{HERE}:")


def test_cluster_option_shares_a_between_n_block_pairs(assemble):
    """``cluster=2``: A is copied in halves multicast to both CTAs of a (2, 1, 1) cluster,
    B per CTA; stages are released in both CTAs; the cluster syncs before exit; the grid
    holds whole clusters. Bad values raise at the caller's line."""
    k = gg.build_grouped(8192, 256, 2048, 4, config=GroupedConfig(BM=128, BN=128, cluster=2))
    text = k.ptx()
    assert ".reqnctapercluster 2, 1, 1" in text
    a_loads = [ln for ln in text.splitlines() if "multicast::cluster" in ln]
    assert len(a_loads) == 1 and "cp.async.bulk.tensor.2d" in a_loads[0]   # A's half
    assert "mapa.shared::cluster" in text and "barrier.cluster.wait" in text
    assert k.grid[0] % 2 == 0 and k.grid[0] <= config.H100_SMS
    assert "0 bytes spill stores" in assemble(text)
    assert "multicast" not in gg.build_grouped(8192, 256, 2048, 4).ptx()
    with pytest.raises(ConfigError, match="cluster must be 1 or 2") as e:
        gg.build_grouped(256, 64, 64, 2, config=GroupedConfig(cluster=4))
    assert str(e.value).startswith(f"{HERE}:")


def test_prefetch_option(assemble):
    """``prefetch=True``: thread 0 prefetches the three tensor maps and the group ends before
    the barrier setup; the default kernel has no prefetch."""
    text = gg.build_grouped(8192, 256, 2048, 4, config=GroupedConfig(BM=128, BN=128, cluster=2,
                                                                      prefetch=True)).ptx()
    lines = [ln.strip() for ln in text.splitlines() if "prefetch" in ln]
    assert [ln.split()[1] for ln in lines] == ["prefetch.param.tensormap"] * 3 + ["prefetch.global.L2"]
    assert text.index("prefetch.param.tensormap") < text.index("mbarrier.init")
    assert "0 bytes spill stores" in assemble(text)
    assert "prefetch" not in gg.build_grouped(8192, 256, 2048, 4).ptx()


@pytest.mark.parametrize("cluster,b_major", [(1, "MN"), (2, "MN"), (2, "K")])
def test_warm_option_prefetches_the_guessed_tile(assemble, cluster, b_major):
    """``warm=n``: before the barrier setup thread 0 issues L2 tensor prefetches of the first
    ``n`` k-blocks of A (its cluster part) and of every B slab of the guessed tile, guarded
    by ``g < G``; ``n`` past the k-blocks is clamped; bad values raise at the caller's line."""
    k = gg.build_grouped(8192, 256, 2048, 4, b_major=b_major,
                         config=GroupedConfig(BM=128, BN=128, cluster=cluster, warm=6))
    text = k.ptx()
    pre = [ln.strip() for ln in text.splitlines() if "prefetch.tensor" in ln]
    slabs = 2 if b_major == "MN" else 1
    assert len(pre) == 6 * (1 + slabs)
    assert all(ln.startswith("@%p") for ln in pre)
    assert sum(".2d.L2.global.tile" in ln for ln in pre) == 6     # A
    assert sum(".3d.L2.global.tile" in ln for ln in pre) == 6 * slabs
    assert text.index("prefetch.tensor") < text.index("mbarrier.init")
    assert "_w6" in k.name
    assert "0 bytes spill stores" in assemble(text)
    short = gg.build_grouped(256, 64, 64, 2, config=GroupedConfig(warm=8)).ptx()  # 1 k-block
    assert sum("prefetch.tensor" in ln for ln in short.splitlines()) == 1 + 4
    assert "prefetch.tensor" not in gg.build_grouped(8192, 256, 2048, 4).ptx()
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="warm must be an int") as e:
            GroupedConfig(warm=bad)
        assert str(e.value).startswith(f"{HERE}:")


def test_warm_guess_matches_the_walk_for_uniform_groups():
    """``uniform_guess`` (the tile ``warm`` prefetches) names, for every unit, the tile the
    ``RaggedTiles`` order gives it when each group has ``M // G`` rows."""
    for M, G, BM, BN, num_n in [(8192, 4, 128, 256, 1), (8192, 4, 128, 128, 2),
                                (8192, 64, 128, 256, 16), (4096, 8, 64, 128, 3),
                                (16384, 16, 128, 256, 32)]:
        rows = M // G
        walk = [(g, g * rows + mb * BM, nb * BN) for g in range(G) for nb in range(num_n)
                for mb in range(-(-rows // BM))]
        for t, want in enumerate(walk):
            assert scheduler.uniform_guess(t, M=M, G=G, BM=BM, BN=BN, num_n=num_n) == want


def test_speculate_option_copies_the_guessed_tile_before_reading_a_group_end(assemble):
    """``speculate=n``: the producer's first ``n`` tile copies (A and B of the guessed tile)
    come before its first read of ``offs``, guarded by ``g < G``; a k-loop that starts at a
    register (``n`` on a hit); the consumers' skip path waits for ``n`` stages. Values the
    option cannot take raise at the caller's line (more than the stages, with a cluster)."""
    k = gg.build_grouped(8192, 256, 2048, 4,
                         config=GroupedConfig(BM=64, BN=256, prefetch=True, speculate=2))
    text = k.ptx()
    lines = [ln.strip() for ln in text.splitlines()]
    loads = [i for i, ln in enumerate(lines) if "cp.async.bulk.tensor" in ln and ".global" in ln]
    first_offs = next(i for i, ln in enumerate(lines) if ln.startswith("ld.global.nc.u32"))
    assert len([i for i in loads if i < first_offs]) == 2 * (1 + 4)   # A + four B slabs, twice
    assert "_spec2" in k.name
    assert "0 bytes spill stores" in assemble(text)
    assert "_spec" not in gg.build_grouped(8192, 256, 2048, 4).name
    for bad, cfg in ((-1, {}), (1.5, {}), (True, {}), (99, {}), (2, {"cluster": 2})):
        with pytest.raises(ConfigError, match="speculate must be an int") as e:
            GroupedConfig(BM=128, BN=128, speculate=bad, **cfg)
        assert str(e.value).startswith(f"{HERE}:")


# ------------------------------------------------------------------------------ plans
def test_plans_are_frozen_and_name_the_tuned_lists():
    """A plan cannot be changed after it is made; the tuner times the tables' plans as the
    ``Config`` keywords the kernels were measured with; ``dgrad``/``wgrad`` derive the dA
    launch's plan (bulk stores) and the dB launch's (the same tile and ring)."""
    import dataclasses

    c = GroupedConfig(BM=64, BN=128, store="masked", cluster=2, num_sms=7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.BM = 128
    assert c.dgrad() == GroupedConfig(BM=64, BN=128, cluster=2, num_sms=7)
    assert c.wgrad() == WgradConfig(BM=64, BN=128, num_sms=7)
    assert [t.kwargs for t in gg.grouped_tuned.configs] == [
        {"BM": 128, "BN": 256}, {"BM": 128, "BN": 128}, {"BM": 64, "BN": 256},
        {"BM": 64, "BN": 128}, {"BM": 128, "BN": 256, "l2_hint": "stream_b"},
        {"BM": 128, "BN": 128, "cluster": 2}, {"BM": 128, "BN": 256, "cluster": 2},
        {"BM": 64, "BN": 256, "prefetch": True},
        {"BM": 64, "BN": 256, "prefetch": True, "speculate": 5}]
    assert [t.kwargs for t in gg.wgrad_tuned.configs] == [
        dict(BM=w.BM, BN=w.BN) for w in gg.WGRAD_CONFIGS]
    assert gg.GROUPED_CONFIGS[:4] == tuple(GroupedConfig(BM=w.BM, BN=w.BN)
                                           for w in gg.WGRAD_CONFIGS)
    for plan in gg.GROUPED_CONFIGS + gg.WGRAD_CONFIGS:   # the tuner's form builds the same
        assert type(plan)(**plan.tuner_kwargs()) == plan


def test_plan_stages_fill_shared_memory():
    """``stages=None`` takes as many ring stages as fit (2 to 8); the kernel's name and
    dynamic shared memory follow the plan."""
    for BM, BN, want in ((128, 256, 4), (128, 128, 6), (64, 256, 5), (64, 64, 8)):
        plan = GroupedConfig(BM=BM, BN=BN)
        assert plan.ring_stages == want
        assert plan.smem == config.smem_bytes(BM, BN, 64, want) <= config.SMEM_LIMIT
        assert config.smem_bytes(BM, BN, 64, want + 1) > config.SMEM_LIMIT or want == 8
        k = gg.build_grouped(1000, 512, 256, 8, config=plan)
        assert f"_{BM}x{BN}x64_s{want}" in k.name and k.smem == plan.smem
    assert GroupedConfig(BM=64, BN=64, stages=3).ring_stages == 3


def test_plans_refuse_what_they_cannot_name():
    """Values and combinations outside the valid plans raise at the line making the plan;
    builders and ``grouped_mm`` take only plan objects."""
    torch = pytest.importorskip("torch")
    bad = [(GroupedConfig, dict(cluster=4), "cluster must be 1 or 2"),
           (GroupedConfig, dict(cluster=4, cluster_along="m", BN=64), None),
           (GroupedConfig, dict(cluster_along="k"), "cluster_along must be"),
           (GroupedConfig, dict(prefetch=1), "prefetch must be a bool"),
           (GroupedConfig, dict(num_sms=0), "num_sms must be"),
           (GroupedConfig, dict(BK=128), "unsupported tile"),
           (GroupedConfig, dict(BN=96), "unsupported tile"),
           (WgradConfig, dict(splits=9), "splits must be"),
           (WgradConfig, dict(stages=0), "stages must be")]
    for cls, kw, match in bad:
        if match is None:
            cls(**kw)   # a valid plan: clusters of 4 along m
            continue
        with pytest.raises(ConfigError, match=match) as e:
            cls(**kw)
        assert str(e.value).startswith(f"{HERE}:"), e.value
    with pytest.raises(ConfigError, match="config must be a GroupedConfig") as e:
        gg.build_grouped(256, 64, 64, 2, config={"BM": 64})
    assert str(e.value).startswith(f"{HERE}:")
    with pytest.raises(ConfigError, match="config must be a WgradConfig"):
        gg.build_grouped_wgrad(256, 64, 64, 2, config=GroupedConfig())
    a = torch.zeros(10, 16, dtype=torch.bfloat16)
    b = torch.zeros(2, 16, 8, dtype=torch.bfloat16)
    offs = torch.tensor([4, 10], dtype=torch.int32)
    with pytest.raises(ConfigError, match="config must be a GroupedConfig") as e:
        host.grouped_mm(a, b, offs, config={"BM": 64})
    assert str(e.value).startswith(f"{HERE}:")
    with pytest.raises(ConfigError, match="wgrad_config must be a WgradConfig"):
        host.grouped_mm(a, b, offs, wgrad_config={"splits": 2})
