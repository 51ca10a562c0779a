"""CPU tests of the tensor-core layer: ``OperandTile`` (canonical layouts, descriptors,
tensor-map checks), ``Accumulator`` fragments, ``BarrierArray``/``Pipeline`` (run in the
PTX simulator), and the GEMM example's PTX (ptxas for every tuned configuration).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from pyptx_kernels._modules import kernel_module

from pyptx import Tile, kernel, ptx, reg, smem
from pyptx.errors import OperandError, TmaError
from pyptx.fragment import Accumulator, accumulator_coord
from pyptx.operand import OperandTile
from pyptx.pipeline import Pipeline
from pyptx.types import b64, bf16, f16, f32, tf32, u32, u64

HERE = Path(__file__).resolve()


def _load(name):
    """A library kernel module."""
    return kernel_module(name)


def _here_line(e) -> None:
    assert str(e.value).startswith(f"{HERE}:"), str(e.value)


# ---------------------------------------------------------------------- OperandTile
@pytest.mark.parametrize("major,swizzle,lbo,sbo,slabs,slab_bytes,k1,mn64", [
    # 128 x 64 bf16 tile. K-major: K slabs of `width` bytes, rows of `width` bytes.
    ("K", 128, 16, 1024, 1, 16384, 32, 8192),
    ("K", 64, 16, 512, 2, 8192, 32, 4096),
    ("K", 32, 16, 256, 4, 4096, 4096, 2048),  # a k-step is one whole 32-byte slab
    ("K", None, 2048, 128, 8, 2048, 4096, 1024),
    # MN-major: MN slabs of `width` bytes, 64 K rows each; a k-step is 16 K rows
    ("MN", 128, 8192, 1024, 2, 8192, 2048, 8192),
    ("MN", 64, 4096, 512, 4, 4096, 1024, 8192),
    ("MN", 32, 2048, 256, 8, 2048, 512, 8192),
    ("MN", None, 128, 1024, 16, 1024, 256, 8192),  # unswizzled: LBO steps K, SBO steps MN
])
def test_operand_tile_geometry(major, swizzle, lbo, sbo, slabs, slab_bytes, k1, mn64):
    t = OperandTile(128, 64, bf16, major=major, swizzle=swizzle)
    assert t.nbytes == 128 * 64 * 2
    assert (t.leading_byte_offset, t.stride_byte_offset) == (lbo, sbo)
    assert (t.slabs, t.slab_bytes) == (slabs, slab_bytes)
    assert t.k_steps == 4 and t.trans == (major == "MN")
    assert t.offset(1) == k1
    if not (major == "MN" and swizzle is None):
        assert t.offset(0, 64) == mn64
    mode = {None: 0, 128: 1, 64: 2, 32: 3}[swizzle]
    c = t.descriptor_constant()
    assert (c >> 16) & 0x3FFF == lbo >> 4 and (c >> 32) & 0x3FFF == sbo >> 4 and c >> 62 == mode
    assert t.align == (8 * swizzle if swizzle else 128)


def test_operand_tile_k_steps_per_type():
    assert OperandTile(64, 64, f16).k_steps == 4
    assert OperandTile(64, 32, tf32).k_steps == 4  # 8 tf32 per wgmma
    t = OperandTile(64, 128, bf16)  # two 128-byte K slabs
    assert [t.offset(k) for k in range(8)] == [0, 32, 64, 96, 8192, 8224, 8256, 8288]


@pytest.mark.parametrize("kwargs,match", [
    (dict(mn=100, k=64), "mn must be a positive multiple of 8"),
    (dict(mn=64, k=24), "k must be a positive multiple of 16"),
    (dict(mn=64, k=32, swizzle=128), "not a multiple of the 128-byte slab"),
    (dict(mn=64, k=64, swizzle=96), "swizzle must be 128, 64, 32 or None"),
    (dict(mn=64, k=64, major="M"), "major must be 'K' or 'MN'"),
    (dict(mn=48, k=64, major="MN"), "not a multiple of the 128-byte slab"),
])
def test_operand_tile_errors(kwargs, match):
    with pytest.raises(OperandError, match=match) as e:
        OperandTile(dtype=bf16, **kwargs)
    _here_line(e)


def test_operand_tile_offset_errors():
    t = OperandTile(128, 64, bf16)
    with pytest.raises(OperandError, match="k_step must be in 0..3") as e:
        t.offset(4)
    _here_line(e)
    with pytest.raises(OperandError, match="mn_start"):
        t.offset(0, 12)
    with pytest.raises(OperandError, match="parts must split"):
        t.tma_box(3)


def test_tma_options_match_the_tile():
    assert OperandTile(128, 64, bf16).tma_options() == {"box": (128, 64), "swizzle": "128B"}
    assert OperandTile(256, 64, bf16, major="MN").tma_options() == {"box": (64, 64),
                                                                   "swizzle": "128B"}
    assert OperandTile(256, 64, bf16, major="MN").tma_options(2) == {"box": (32, 64),
                                                                    "swizzle": "128B"}
    assert OperandTile(64, 64, bf16, swizzle=None).tma_options() == {"box": (64, 8),
                                                                    "swizzle": "none"}


def _tile_kernel(tma_opts, tile):
    @kernel(in_specs=(Tile(64, 64, bf16),), out_specs=(Tile(1, f32),), block=(128, 1, 1),
            smem=tile.nbytes + 1024, tma={"A": tma_opts})
    def k(A, Y):
        buf = (smem.dynamic(align=128).addr() + 1023) & 0xFFFFFC00
        bar = smem.alloc(b64, 1, align=8)
        tile.load(buf, A, 0, 0, bar)
        ptx.ret()

    return k


def test_tensor_map_that_disagrees_with_the_tile_is_refused():
    tile = OperandTile(64, 64, bf16)
    assert "cp.async.bulk.tensor.2d" in _tile_kernel(tile.tma_options(), tile).ptx()
    with pytest.raises(TmaError, match="swizzle NONE") as e:
        _tile_kernel({"box": (64, 64), "swizzle": "none"}, tile).ptx()
    _here_line(e)
    with pytest.raises(TmaError, match=r"box is \[32, 64\]"):
        _tile_kernel({"box": (64, 32), "swizzle": "128B"}, tile).ptx()
    with pytest.raises(TmaError, match="use box=\\(64, 64\\)"):
        _tile_kernel({"box": (32, 64), "swizzle": "128B"}, tile).ptx()


@pytest.mark.parametrize("major,part", [("K", None), ("MN", None), ("MN", (1, 2)), ("K", (1, 4))])
def test_prefetch_asks_l2_for_the_boxes_load_copies(major, part, assemble):
    tile = OperandTile(128, 64, bf16, major=major)
    opts = tile.tma_options(part[1] if part else 1)

    @kernel(in_specs=(Tile(256, 256, bf16),), out_specs=(Tile(1, f32),), block=(128, 1, 1),
            smem=tile.nbytes + 1024, tma={"A": opts})
    def k(A, Y):
        buf = (smem.dynamic(align=128).addr() + 1023) & 0xFFFFFC00
        bar = smem.alloc(b64, 1, align=8)
        kw = {"part": part} if part else {}
        tile.load(buf, A, 64, 64, bar, **kw)
        tile.prefetch(A, 64, 64, **kw)
        ptx.ret()

    text = k.ptx()
    loads = re.findall(r"cp\.async\.bulk\.tensor\.2d\S* \[[^]]+\], \[(\S+), (\{[^}]+\})\]", text)
    fetches = re.findall(r"cp\.async\.bulk\.prefetch\.tensor\.2d\.L2\.global\.tile "
                         r"\[(\S+), (\{[^}]+\})\]", text)
    assert len(loads) == tile.slabs and len(fetches) == tile.slabs
    # the same coordinate registers or constants, box by box
    assert [c for _, c in loads] == [c for _, c in fetches]
    assemble(text)


def test_descriptor_and_advance_emit_the_documented_sequence():
    tile = OperandTile(64, 64, bf16, major="MN")

    @kernel(block=(128, 1, 1), smem=tile.nbytes)
    def k():
        buf = smem.dynamic(align=1024)
        d = tile.descriptor(buf.addr(), offset=2048)
        tile.advance(d, 1)
        tile.advance(d, 0)  # no instruction
        ptx.ret()

    text = k.ptx()
    body = text[text.index("{", text.index(".entry")):]
    ops = [ln.split()[0] for ln in body.splitlines()[1:] if ln.strip() and not ln.strip().startswith((".reg", "}"))]
    assert ops == ["mov.u32", "add.u32", "and.b32", "shr.u32", "cvt.u64.u32", "or.b64",
                   "add.s64", "ret;"]
    assert f"0x{tile.descriptor_constant():016X}" in text
    assert f", {2048 >> 4};" in text  # one k-step of an MN-major tile: 16 rows x 128 B


# ---------------------------------------------------------------------- Accumulator
@pytest.mark.parametrize("n", [8, 64, 256])
def test_accumulator_coordinates_cover_the_tile_once(n):
    seen = np.zeros((64, n), int)
    for warp in range(4):
        for lane in range(32):
            for i in range(n // 2):
                r, c = accumulator_coord(i, warp, lane)
                seen[r, c] += 1
                dr, dc = Accumulator.coord(i)
                assert (r, c) == (16 * warp + lane // 4 + dr, 2 * (lane % 4) + dc)
    assert (seen == 1).all()


def test_accumulator_registers_assignment_and_errors():
    @kernel(block=(128, 1, 1))
    def k():
        acc = Accumulator(16)
        assert len(acc) == 8 and len(list(acc.pairs())) == 4
        acc.zero()
        acc[3] = 1.5
        acc[2] = acc[3]
        acc[1] *= 2.0  # in place: one mul, no mov
        with pytest.raises(OperandError, match="n must be a multiple of 8") as e:
            Accumulator(12)
        _here_line(e)
        with pytest.raises(OperandError, match=r"is \.f32, got \.u64"):
            acc[0] = reg.scalar(u64)
        ptx.ret()

    text = k.ptx()
    assert text.count("mov.f32") == 8 + 1 and "mov.b32 %f2, %f3" in text
    assert "mul.f32 %f1, %f1, 0f40000000" in text


# ---------------------------------------------------------------------- Pipeline
def _ring_kernel(stages, rounds, consumer_phase=0):
    """Thread 0 copies chunk r of X into stage r % S (bulk copy, full barrier); warps 1..2
    wait, add the chunk into Y and release the stage (empty barrier, one arrive per warp)."""
    chunk = 64  # f32 per chunk

    @kernel(in_specs=(Tile(rounds * chunk, f32),), out_specs=(Tile(2 * chunk, f32),),
            block=(96, 1, 1), smem=stages * chunk * 4)
    def ring(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        base = smem.dynamic(align=128).addr()
        pipe = Pipeline(stages, consumer_arrivals=2)
        tid = reg.from_(ptx.special.tid.x(), u32)
        warp = tid >> 5
        pipe.init(pred=tid == 0)
        ptx.bar_sync(0)
        with ptx.if_(tid == 0):
            st = pipe.producer_state()
            for r in ptx.loop(0, rounds):
                pipe.acquire(st)
                bar = pipe.arm(st, chunk * 4)
                ptx.tma.copy_bulk(st.stage * (chunk * 4) + base,
                                  ptx.addr(px + reg.from_(r * (chunk * 4), u64)),
                                  chunk * 4, bar)
                st.advance()
        with ptx.if_(warp != 0):
            cons = pipe.consumer_state() if consumer_phase == 0 else None
            if cons is None:  # a mutant that waits for the wrong parity first
                from pyptx.pipeline import PipelineState
                cons = PipelineState(stages, 1)
            lane = tid & 31
            col = (warp - 1) * 32 + lane  # 2 warps x 32 lanes cover 64 floats
            acc = reg.scalar(f32, init=0.0)
            for _ in ptx.loop(0, rounds):
                pipe.wait(cons)
                v = reg.scalar(f32)
                ptx.inst.ld.shared.f32(v, ptx.addr(cons.stage * (chunk * 4) + base + col * 4))
                acc += v
                pipe.release(cons, pred=lane == 0)
                cons.advance()
            ptx.inst.st.global_.f32(ptx.addr(py + col * 4), acc)
            ptx.inst.st.global_.f32(ptx.addr(py + col * 4 + chunk * 4), acc)
        ptx.ret()

    return ring


@pytest.fixture(scope="module")
def sim():
    sys.path.insert(0, str(HERE.parent))
    import ptxsim

    return ptxsim


# The simulator orders shared-memory reuse only through bar.sync, so a stage is not refilled
# here (rounds <= stages); refills and phase flips run on the GPU (every GEMM k-loop).
@pytest.mark.parametrize("stages,rounds", [(1, 1), (2, 2), (3, 2), (4, 4)])
def test_pipeline_ring_in_the_simulator(sim, stages, rounds):
    x = np.random.default_rng(stages).standard_normal(rounds * 64).astype(np.float32)
    (y,) = sim.run(_ring_kernel(stages, rounds).specialize(), [x])
    y = y.view(np.float32) if y.dtype != np.float32 else y
    want = x.reshape(rounds, 64).sum(0)
    np.testing.assert_allclose(y[:64], want, rtol=1e-5)
    np.testing.assert_allclose(y[64:], want, rtol=1e-5)


@pytest.mark.parametrize("stages", [1, 2, 3, 5, 6])
def test_pipeline_state_long_advance_matches_single_steps(sim, stages):
    """``advance(n)`` for ``n > 1`` (closed form, at most seven instructions) lands on the
    stage and phase of ``n`` single steps, from every start stage and phase (simulated)."""
    steps = [2, 3, stages, stages + 1, 2 * stages, 2 * stages + 1, 64, 65, 127]
    starts = [(s0, ph) for s0 in range(stages) for ph in (0, 1)]

    @kernel(in_specs=(), out_specs=(Tile(len(starts) * len(steps) * 4, u32),), block=(32, 1, 1))
    def k(Y):
        (py,) = ptx.global_ptrs(Y)
        tid = reg.from_(ptx.special.tid.x(), u32)
        with ptx.if_(tid == 0):
            from pyptx.pipeline import PipelineState

            for i, ((s0, ph), n) in enumerate((st, n) for st in starts for n in steps):
                fast, slow = PipelineState(stages, ph), PipelineState(stages, ph)
                for st in (fast, slow):
                    ptx.inst.mov.u32(st.stage, s0)
                fast.advance(n)
                for _ in range(n):
                    slow.advance()
                for j, r in enumerate((fast.stage, fast.phase, slow.stage, slow.phase)):
                    ptx.inst.st.global_.u32(ptx.addr(py + (4 * i + j) * 4), r)
        ptx.ret()

    (y,) = sim.run(k.specialize(), [])
    y = y.reshape(-1, 4)
    np.testing.assert_array_equal(y[:, :2], y[:, 2:])
    want = [((s0 + n) % stages, ph ^ ((s0 + n) // stages & 1)) for (s0, ph) in starts for n in steps]
    np.testing.assert_array_equal(y[:, :2], np.array(want))


def test_pipeline_wrong_phase_is_caught(sim):
    x = np.ones(2 * 64, np.float32)
    with pytest.raises(sim.SimError, match="deadlock|nothing wrote"):
        sim.run(_ring_kernel(2, 2, consumer_phase=1).specialize(), [x])


def test_pipeline_state_checks():
    @kernel(block=(32, 1, 1))
    def k():
        a, b = Pipeline(2), Pipeline(3)
        with pytest.raises(OperandError, match="PipelineState of this 2-stage") as e:
            a.wait(b.consumer_state())
        _here_line(e)
        with pytest.raises(OperandError, match="barrier index 5 out of range"):
            a.full.at(5)
        ptx.ret()

    k.ptx()


def test_gemm_configs_assemble_without_spills(assemble):
    gemm = _load("gemm")
    kernels = [gemm.build_gemm(4096, 4096, 4096, config=c) for c in gemm.GEMM_CONFIGS]
    kernels += [
        gemm.build_gemm(1000, 520, 136, a_major="MN", b_major="K", out_dtype="f32", bias=True,
                        activation="gelu_tanh", alpha=0.5),
        gemm.build_gemm(333, 520, 272, dtype="f16", out_dtype="f16", activation="silu",
                        config=gemm.GemmConfig(cluster=1, BN=128)),
    ]
    for k in kernels:
        text = k.ptx()
        assert "wgmma.mma_async" in text and "setmaxnreg.inc" in text
        report = assemble(text)
        assert "0 bytes spill stores" in report, report


def test_gemm_builder_refuses_bad_configurations():
    gemm = _load("gemm")
    from pyptx.errors import ConfigError

    with pytest.raises(ConfigError, match="needs .* bytes of shared memory"):
        gemm.GemmConfig(BN=256, stages=6)
    with pytest.raises(ConfigError, match="activation"):
        gemm.build_gemm(64, 64, 64, activation="tanh")
    with pytest.raises(ConfigError, match="inputs must be bf16 or f16"):
        gemm.build_gemm(64, 64, 64, dtype="f32")
    with pytest.raises(ConfigError, match="wg_rows=128 for 128x256"):
        gemm.GemmConfig(BM=128, BN=256, wg_rows=128)
    with pytest.raises(ConfigError, match="wg_rows=96") as e:
        gemm.GemmConfig(wg_rows=96)
    _here_line(e)   # the message starts at the caller's line, as every builder error
    with pytest.raises(ConfigError, match="split_tail must be True or False, got 'yes'"):
        gemm.GemmConfig(split_tail="yes")
    with pytest.raises(ConfigError, match="epi_bufs must be 1 or 2, got 3") as e:
        gemm.build_gemm(128, 8192, 8192, config=dict(BM=64, BN=128, epi_bufs=3))
    _here_line(e)
    with pytest.raises(ConfigError, match="unknown fields \\['BQ'\\]") as e:
        gemm.build_gemm(64, 64, 64, config=dict(BQ=64))
    _here_line(e)
    with pytest.raises(ConfigError, match="no tuned plan is named 'fast'"):
        gemm.build_gemm(64, 64, 64, config="fast")


def test_gemm_config_names_a_valid_plan():
    """A ``GemmConfig`` is frozen and hashable, resolves the deepest ring that fits, and has
    a unique name per tuned plan; the tuner's ``Config`` names a plan, which builds the same
    kernel as the object itself."""
    import dataclasses

    from pyptx_kernels.gemm.config import SMEM_LIMIT

    gemm = _load("gemm")
    c = gemm.GemmConfig(BM=128, BN=128, cluster=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.BM = 64
    assert c.stages > 2 and c.smem_bytes() <= SMEM_LIMIT < c.smem_bytes(c.stages + 1)
    assert c == gemm.GemmConfig(BM=128, BN=128, cluster=1, stages=c.stages)
    assert c.name == f"128x128x64_s{c.stages}_c1"
    assert gemm.GemmConfig(num_sms=6, split_tail=True).name.endswith("_st_num_sms=6")
    names = [p.name for p in gemm.GEMM_CONFIGS]
    assert len(set(names)) == len(names)
    assert [cfg.kwargs for cfg in gemm.gemm_tuned.configs] == [{"config": n} for n in names]
    for p in gemm.GEMM_CONFIGS[:3]:
        assert gemm.GemmConfig.of(p.name) is p
        assert gemm.build_gemm(1000, 520, 136, config=p.name).ptx() == \
            gemm.build_gemm(1000, 520, 136, config=dict(dataclasses.asdict(p))).ptx()


def test_tma_3d_view_errors():
    from pyptx.errors import ConfigError

    with pytest.raises(ConfigError, match="view must be '2d' or '3d'"):
        kernel(in_specs=(Tile(64, 64, bf16),), tma={"A": dict(view="4d")}, name="k")(lambda A: None)
    with pytest.raises(ConfigError, match="padding needs view='3d'"):
        kernel(in_specs=(Tile(64, 64, bf16),), tma={"A": dict(padding=True)}, name="k")(lambda A: None)
    with pytest.raises(ConfigError, match="needs box=\\(rows, cols\\)"):
        kernel(in_specs=(Tile(64, 64, bf16),), tma={"A": dict(view="3d")}, name="k")(lambda A: None)


# ---------------------------------------------------------------------- small DSL gaps
def test_reflected_operators_vector_components_and_foreign_compares():
    from pyptx.errors import LaunchError, RegisterScopeError
    from pyptx.plan import check_cluster

    @kernel(block=(32, 1, 1))
    def other():
        ptx.ret()

    @kernel(block=(32, 1, 1))
    def k():
        r = reg.from_(ptx.special.tid.x(), u32)
        _ = (5 // r, 7 % r, 1 << r, 256 >> r, 1.0 / reg.scalar(f32, init=2.0))
        with pytest.raises(OperandError, match="components x, y and z, not 'w'") as e:
            ptx.special.tid.w()
        _here_line(e)
        ptx.ret()

    text = k.ptx()
    for line in ("div.u32 %r2, 5, %r1;", "rem.u32 %r3, 7, %r1;", "shl.b32 %r4, 1, %r1;",
                 "shr.u32 %r5, 256, %r1;", "div.rn.f32 %f1, 0f3F800000, %f0;"):
        assert line in text

    held = []

    @kernel(block=(32, 1, 1), name="first")
    def first():
        held.append(reg.from_(ptx.special.tid.x(), u32))
        ptx.ret()

    @kernel(block=(32, 1, 1), name="second")
    def second():
        with pytest.raises(RegisterScopeError):
            held[0] < 3  # noqa: B015 - the comparison itself must refuse
        ptx.ret()

    first.ptx()
    second.ptx()

    @kernel(grid=(3, 1, 1), block=(32, 1, 1), cluster=(2, 1, 1), name="odd")
    def odd():
        ptx.ret()

    with pytest.raises(LaunchError, match="multiple of the cluster dim"):
        check_cluster(odd, odd.specialize())
    other.ptx()


def test_cli_checks_an_autotuned_builder(ptxas_path, capsys):
    from pyptx.cli import main

    assert main(["check", "pyptx_kernels.gemm.kernel:gemm_tuned", "M=512", "N=512", "K=256"]) == 0
    out = capsys.readouterr().out
    assert "gemm_bf16_bf16_KMN_128x256x64_s4_c2" in out and "168" in out


def test_cluster_vector_store_into_the_peer_cta(sim):
    """``ptx.cluster.store`` of four registers writes the peer CTA's shared memory; the peer
    reads it after a remote arrive (release) and its own cluster-scope wait (simulated)."""
    from pyptx.ptx import cluster, mbarrier

    @kernel(in_specs=(), out_specs=(Tile(2 * 32 * 4, f32),), grid=(2, 1, 1), block=(32, 1, 1),
            cluster=(2, 1, 1))
    def swap(Y):
        (py,) = ptx.global_ptrs(Y)
        slot = smem.alloc(f32, 32 * 4, align=16, name="slot")
        bar = smem.alloc(b64, 1, align=8, name="bar")
        tid = reg.from_(ptx.special.tid.x(), u32)
        rank = cluster.ctarank()
        with ptx.if_(tid == 0):
            mbarrier.init(bar, 32)
            ptx.fence_mbarrier_init()
        ptx.cluster_sync()
        base = reg.from_(rank * 1000 + tid * 4, f32)
        vals = [base + float(j) for j in range(4)]
        peer = rank ^ 1
        cluster.store(cluster.map_shared(slot.addr() + tid * 16, peer), vals)
        mbarrier.arrive(cluster.map_shared(bar, peer), remote=True)
        mbarrier.wait(bar, 0, scope="cluster")
        v4 = reg.array(f32, 4)
        ptx.inst.ld.shared.v4.f32(v4, ptx.addr(slot.addr() + tid * 16))
        out = py + (reg.from_(rank, u64) * 128 + reg.from_(tid, u64) * 4) * 4
        ptx.inst.st.global_.v4.f32(ptx.addr(out), v4)
        ptx.cluster_sync()
        ptx.ret()

    (y,) = sim.run(swap.specialize(), [])
    y = np.asarray(y).view(np.float32).reshape(2, 32, 4)
    for rank in (0, 1):   # each CTA holds what its peer wrote
        want = (1 - rank) * 1000 + 4 * np.arange(32)[:, None] + np.arange(4)[None, :]
        np.testing.assert_array_equal(y[rank], want)
