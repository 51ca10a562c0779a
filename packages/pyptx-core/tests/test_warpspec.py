"""CPU checks of ``pyptx.warpspec``: the grouped tile order visits every output tile
exactly once and the swizzled epilogue addresses put every byte of a slab where the
128-byte swizzle wants it, exactly once (Python-int models of the same functions), and
a kernel built from the skeleton (ring base, prologue, role split, slab stores) emits
the expected instructions in order and assembles for sm_90a with and without a cluster,
as does a ring of A/B tiles (``load_ab_ring`` producer, ``RingMma`` consumers)."""

from __future__ import annotations

import itertools

import pytest

import pyptx
from pyptx import Tile, ptx
from pyptx import warpspec as ws
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.pipeline import Pipeline
from pyptx.types import bf16, f32


@pytest.mark.parametrize("num_mc,num_n,gm,cluster", [(1, 1, 1, 1), (5, 3, 2, 1), (7, 4, 8, 2),
                                                     (4, 9, 3, 2), (16, 16, 8, 1)])
def test_grouped_order_covers_every_tile_once(num_mc, num_n, gm, cluster):
    BM, BN = 128, 64
    seen = []
    for t, rank in itertools.product(range(num_mc * num_n), range(cluster)):
        seen.append(ws.grouped_tile_origin(t, rank, num_mc=num_mc, num_n=num_n, gm=gm,
                                        cluster=cluster, BM=BM, BN=BN))
    want = {(m * BM, n * BN) for m in range(num_mc * cluster) for n in range(num_n)}
    assert len(seen) == len(want) and set(seen) == want


def test_grouped_order_walks_bands_column_by_column():
    order = [ws.grouped_tile_origin(t, 0, num_mc=4, num_n=2, gm=2, cluster=1, BM=1, BN=1)
             for t in range(8)]
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]


@pytest.mark.parametrize("elem_bytes", [2, 4])
def test_swizzled_rows_cover_a_slab_once_in_swizzled_order(elem_bytes):
    cols = 128 // elem_bytes          # columns of one slab
    cbuf = 4096
    owner = {}
    for tid in range(128):            # one consumer warpgroup: 4 warps x 16 rows
        lane = tid & 31
        row0, col0 = 16 * (tid >> 5) + lane // 4, 2 * (lane % 4)
        sw = ws.swizzled_rows(cbuf, row0, lane, elem_bytes)
        for dr in (0, 8):
            for dc in range(0, cols, 8):
                addr = sw[dc * elem_bytes // 16] + dr * 128 - cbuf
                r, byte = row0 + dr, (col0 + dc) * elem_bytes
                assert addr == r * 128 + ((byte // 16) ^ (r % 8)) * 16 + byte % 16
                for b in range(addr, addr + 2 * elem_bytes):
                    assert b not in owner
                    owner[b] = tid
    assert sorted(owner) == list(range(ws.SLAB_BYTES))


def _skeleton(cluster):
    @pyptx.kernel([Tile(16, f32)], [Tile(64, 64, f32)], block=(384, 1, 1),
                  cluster=(cluster, 1, 1), smem=4 * ws.SLAB_BYTES + 1024, name=f"skeleton_c{cluster}",
                  maxnreg=168,  # the register budget setmaxnreg moves registers within
                  tma={"D": {"box": (64, 32), "swizzle": "128B"}})
    def k(X, D):
        base = ws.ring_base()
        pipe = Pipeline(2, consumer_arrivals=2)
        tid, wg = ws.thread_ids()
        rank, cid = ws.prologue(pipe, tid, cluster)
        roles = ws.Roles(wg, 40)
        m0, n0 = ws.grouped_tile_origin(cid, rank, num_mc=3, num_n=5, gm=2, cluster=cluster,
                                     BM=128, BN=64)
        roles.consumers(232)
        leader = (tid & 127) == 0
        d_map = ptx.tma.tensormap_ptr(D.tmap)
        ws.store_slabs(2, leader=leader, bar_id=1, cbuf=base, tmap=d_map,
                    write=lambda j, buf: ptx.inst.st.shared.b32(ptx.addr(base, buf), m0 + n0),
                    coords=lambda j: (j * 32, 0))
        ws.drain_stores(leader)
        roles.end()
        ptx.ret()
    return k


@pytest.mark.parametrize("cluster", [1, 2])
def test_skeleton_emits_the_split_in_order_and_assembles(cluster, assemble):
    text = _skeleton(cluster).ptx()
    sync = "barrier.cluster.arrive" if cluster > 1 else "bar.sync 0"
    marks = ["& -1024" if "& -1024" in text else "4294966272", "mbarrier.init", sync,
             "setmaxnreg.dec.sync.aligned.u32 40", "min.u32", "setmaxnreg.inc.sync.aligned.u32 232",
             "cp.async.bulk.wait_group.read 1", "fence.proxy.async.shared::cta",
             "cp.async.bulk.tensor.2d.global.shared::cta", "cp.async.bulk.commit_group",
             "cp.async.bulk.wait_group 0"]
    at = [text.find(m) for m in marks]
    assert -1 not in at and at == sorted(at), (marks, at)
    assert ("mapa" in text or "%cluster_ctarank" in text) == (cluster > 1)
    assert text.count("cp.async.bulk.tensor.2d.global.shared::cta") == 2
    assemble(text)


def test_ab_ring_loads_and_mma_keep_one_group_in_flight_and_assemble(assemble):
    a_tile = OperandTile(64, 64, bf16, major="K", swizzle=128)
    b_tile = OperandTile(64, 64, bf16, major="MN", swizzle=128)
    stage_bytes = a_tile.nbytes + b_tile.nbytes

    @pyptx.kernel([Tile(192, 192, bf16), Tile(192, 64, bf16)], block=(256, 1, 1),
                  smem=2 * stage_bytes + 1024, name="ring_mma", maxnreg=240,
                  tma={"A": a_tile.tma_options(), "B": b_tile.tma_options()})
    def k(A, B):
        base = ws.ring_base()
        pipe = Pipeline(2, consumer_arrivals=1)
        tid, wg = ws.thread_ids()
        _, cid = ws.prologue(pipe, tid)
        roles = ws.Roles(wg, 40)
        with ptx.if_(tid == 0):
            ws.load_ab_ring(pipe, A, B, a_tile, b_tile, base=base, tile_range=(cid, 3, 1),
                            coords=lambda t: (t * 64, 0), num_kb=3, BK=64)
        roles.consumers(232)
        acc = Accumulator(64)
        mma = ws.RingMma(pipe, acc, a_tile, b_tile, a_tile.descriptor(base),
                         b_tile.descriptor(base, offset=a_tile.nbytes), stage_bytes, n=64,
                         dtype="bf16", leader=(tid & 127) == 0)
        for _t in ptx.loop(cid, 3, 1):
            mma.run(3)
        roles.end()
        ptx.ret()

    text = k.ptx()
    # the first block outside the loop, one in its body, each a_tile.k_steps wgmma
    assert text.count("wgmma.mma_async") == 2 * a_tile.k_steps
    assert text.count("wgmma.wait_group.sync.aligned 1") == 1
    assert text.count("wgmma.wait_group.sync.aligned 0") == 1
    assert text.count("mbarrier.arrive") >= 3  # releases: in the loop body, at the end; arm
    assert text.count("cp.async.bulk.tensor.2d.shared::cluster.global") == 2  # A, B per stage
    assemble(text)


def test_ring_mma_skip_waits_for_a_stage_and_hands_it_back_unread(assemble):
    """``RingMma.skip()`` (a stage filled on a wrong guess): one wait on the stage's full
    barrier and one release arrival, no wgmma; the next tile then starts one stage later.
    The grouped GEMM's ``speculate`` option runs it (numerics: ``test_tensorcore_sim.py``)."""
    a_tile = OperandTile(64, 64, bf16, major="K", swizzle=128)
    b_tile = OperandTile(64, 64, bf16, major="MN", swizzle=128)
    stage_bytes = a_tile.nbytes + b_tile.nbytes

    def build(skips):
        @pyptx.kernel([Tile(64, 64, bf16), Tile(64, 64, bf16)], block=(256, 1, 1),
                      smem=2 * stage_bytes + 1024, name=f"ring_skip{skips}", maxnreg=240,
                      tma={"A": a_tile.tma_options(), "B": b_tile.tma_options()})
        def k(A, B):
            base = ws.ring_base()
            pipe = Pipeline(2, consumer_arrivals=1)
            tid, wg = ws.thread_ids()
            ws.prologue(pipe, tid)
            roles = ws.Roles(wg, 40)
            with ptx.if_(tid == 0):
                ws.load_ab_ring(pipe, A, B, a_tile, b_tile, base=base, tile_range=(0, 1 + skips, 1),
                                coords=lambda t: (0, 0), num_kb=1, BK=64)
            roles.consumers(232)
            mma = ws.RingMma(pipe, Accumulator(64), a_tile, b_tile, a_tile.descriptor(base),
                             b_tile.descriptor(base, offset=a_tile.nbytes), stage_bytes, n=64,
                             dtype="bf16", leader=(tid & 127) == 0)
            for _ in range(skips):
                mma.skip()
            mma.run(1)
            roles.end()
            ptx.ret()
        return k.ptx()

    plain, skipped = build(0), build(1)
    count = lambda text, s: sum(s in ln for ln in text.splitlines())  # noqa: E731
    assert count(skipped, "wgmma.mma_async") == count(plain, "wgmma.mma_async") > 0
    assert count(skipped, "mbarrier.try_wait") == count(plain, "mbarrier.try_wait") + 1
    assert count(skipped, "mbarrier.arrive.") == count(plain, "mbarrier.arrive.") + 1
    assemble(skipped)


@pytest.mark.parametrize("consumers,producer", [(1, 40), (2, 40), (3, 24), (4, 24)])
def test_register_budget_fits_the_ctas_pool(consumers, producer):
    """What ``setmaxnreg.inc`` asks for fits the registers the CTA was launched with (a larger
    request waits forever: BM=256 GEMM tiles hung on the H100 before the pool was counted)."""
    from pyptx.warpspec import register_budget

    maxnreg, regs = register_budget(consumers, producer)
    threads = 128 * (1 + consumers)
    assert maxnreg * threads <= 65536 and regs % 8 == 0 and regs <= 240
    assert 128 * producer + 128 * consumers * regs <= min(maxnreg + 7 & ~7, 256) * threads
