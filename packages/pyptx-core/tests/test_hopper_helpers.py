"""Named Hopper helpers: ptx.mbarrier, ptx.tma, ptx.wgmma, ptx.cluster, fences, cluster barriers,
setmaxnreg and elect_sync.

Each helper is checked three ways: the exact instruction text it emits, the errors it raises
for bad operands (class, message and the user's file:line), and ptxas (sm_90a) accepting
the emitted forms and a few realistic kernels that use them together.
"""

from __future__ import annotations

import os

import pytest

import pyptx
from pyptx import OperandError, RegisterScopeError, Tile, TypeMismatchError, ptx, reg, smem
from pyptx.ir import Instruction, Param
from pyptx.ptx import cluster, mbarrier, tma, wgmma
from pyptx.trace import current
from pyptx.types import b8, b32, b64, bf16, e5m2, f16, f16x2, f32, pred, s32, u8, u16, u32, u64

HERE = os.path.basename(__file__)


class Env:
    """Operands every table case can use; creating them emits no instruction.

    Registers: r=%r0 (u32), s=%ri0 (s32), rd=%rd0 (u64), p=%p0 (pred), h=%us0 (u16),
    f=%f0 (f32), bd=%bd0 (b64). Shared: bar (2 x b64, align 8), buf (64x64 bf16, align
    1024), small (4 x f32, align 4), dyn (dynamic window, align 128). Params: x (a .u64
    tensor pointer, the kernel's argument), tmap (.param .align 64 .b8 tmap[128]).
    """

    def __init__(self, x):
        self.x = x
        self.r = reg.scalar(u32)
        self.s = reg.scalar(s32)
        self.rd = reg.scalar(u64)
        self.p = reg.scalar(pred)
        self.h = reg.scalar(u16)
        self.f = reg.scalar(f32)
        self.bd = reg.scalar(b64)
        self.bar = smem.alloc(b64, 2, align=8, name="bar")
        self.buf = smem.alloc(bf16, (64, 64), align=1024, name="buf")
        self.small = smem.alloc(f32, 4, align=4, name="small")
        self.dyn = smem.dynamic(b8, align=128)
        current().func.params.append(Param("tmap", b8, align=64, count=128))
        self.tmap = "tmap"


def traced(case, *, cluster_dims=(1, 1, 1), block=(128, 1, 1)):
    """Trace ``case(env)`` as a kernel body; return the Specialization."""

    def body(x):
        case(Env(x))

    k = pyptx.kernel([Tile(16, f32)], block=block, cluster=cluster_dims, smem=1024,
                     name="k", maxnreg=240)(body)  # the budget setmaxnreg needs
    return k.specialize()


def lines(spec) -> list[str]:
    """The body statements as PTX text (labels included)."""
    return [st.text() for st in spec.module.functions[0].body]


def vec(prefix: str, start: int, n: int) -> str:
    return "{" + ", ".join(f"%{prefix}{i}" for i in range(start, start + n)) + "}"


# ------------------------------------------------------------------ exact emitted text
TEXT = [
    # mbarrier
    (lambda e: mbarrier.init(e.bar, 1), ["mbarrier.init.shared::cta.b64 [bar], 1;"]),
    (lambda e: mbarrier.init(ptx.addr(e.bar, 8), e.r),
     ["mbarrier.init.shared::cta.b64 [bar+8], %r0;"]),
    (lambda e: mbarrier.init(e.r, 128), ["mbarrier.init.shared::cta.b64 [%r0], 128;"]),
    (lambda e: mbarrier.init(ptx.addr(e.dyn, 64), 1),
     ["mbarrier.init.shared::cta.b64 [dyn_smem+64], 1;"]),
    (lambda e: mbarrier.arrive(e.bar), ["mbarrier.arrive.shared::cta.b64 %bd1, [bar];"]),
    (lambda e: mbarrier.arrive(e.bar, 2), ["mbarrier.arrive.shared::cta.b64 %bd1, [bar], 2;"]),
    (lambda e: mbarrier.arrive(e.r, remote=True),
     ["mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r0];"]),
    (lambda e: mbarrier.arrive_expect_tx(e.bar, 16384),
     ["mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], 16384;"]),
    (lambda e: mbarrier.arrive_expect_tx(ptx.addr(e.bar, 8), e.r),
     ["mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar+8], %r0;"]),
    (lambda e: mbarrier.arrive_expect_tx(e.r, 64, remote=True),
     ["mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64 _, [%r0], 64;"]),
    (lambda e: mbarrier.expect_tx(e.bar, 4096),
     ["mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [bar], 4096;"]),
    (lambda e: mbarrier.try_wait_parity(e.bar, 0),
     ["mbarrier.try_wait.parity.shared::cta.b64 %p1, [bar], 0;"]),
    (lambda e: mbarrier.try_wait_parity(e.bar, e.r, scope="cluster"),
     ["mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 %p1, [bar], %r0;"]),
    (lambda e: mbarrier.wait(e.bar, e.r),
     ["$L_mbar_wait:",
      "mbarrier.try_wait.parity.shared::cta.b64 %p1, [bar], %r0;",
      "@!%p1 bra $L_mbar_wait;"]),
    (lambda e: (mbarrier.wait(e.bar, 1), mbarrier.wait(ptx.addr(e.bar, 8), 0, scope="cta")),
     ["$L_mbar_wait:",
      "mbarrier.try_wait.parity.shared::cta.b64 %p1, [bar], 1;",
      "@!%p1 bra $L_mbar_wait;",
      "$L_mbar_wait_1:",
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 %p2, [bar+8], 0;",
      "@!%p2 bra $L_mbar_wait_1;"]),
    (lambda e: mbarrier.inval(e.bar), ["mbarrier.inval.shared::cta.b64 [bar];"]),
    # fences and cluster barriers
    (lambda e: ptx.fence_proxy_async(), ["fence.proxy.async.shared::cta;"]),
    (lambda e: ptx.fence_proxy_async("global"), ["fence.proxy.async.global;"]),
    (lambda e: ptx.fence_proxy_async(None), ["fence.proxy.async;"]),
    (lambda e: ptx.fence_mbarrier_init(), ["fence.mbarrier_init.release.cluster;"]),
    (lambda e: ptx.cluster_arrive(), ["barrier.cluster.arrive;"]),
    (lambda e: ptx.cluster_arrive(relaxed=True, aligned=True),
     ["barrier.cluster.arrive.relaxed.aligned;"]),
    (lambda e: ptx.cluster_wait(), ["barrier.cluster.wait;"]),
    (lambda e: ptx.cluster_sync(aligned=True),
     ["barrier.cluster.arrive.aligned;", "barrier.cluster.wait.aligned;"]),
    (lambda e: cluster.sync(), ["barrier.cluster.arrive;", "barrier.cluster.wait;"]),
    # cluster / distributed shared memory
    (lambda e: cluster.ctarank(), ["mov.u32 %r1, %cluster_ctarank;"]),
    (lambda e: cluster.nctarank(), ["mov.u32 %r1, %cluster_nctarank;"]),
    (lambda e: cluster.map_shared(e.bar, 1), ["mapa.shared::cluster.u32 %r1, bar, 1;"]),
    (lambda e: cluster.map_shared(e.r, e.r), ["mapa.shared::cluster.u32 %r1, %r0, %r0;"]),
    (lambda e: cluster.map_shared(e.rd, 3), ["mapa.shared::cluster.u64 %rd1, %rd0, 3;"]),
    (lambda e: cluster.rank_of(e.r), ["getctarank.shared::cluster.u32 %r1, %r0;"]),
    (lambda e: cluster.load(f32, e.r), ["ld.shared::cluster.f32 %f1, [%r0];"]),
    (lambda e: cluster.store(ptx.addr(e.r, 4), e.f), ["st.shared::cluster.f32 [%r0+4], %f0;"]),
    (lambda e: cluster.store(ptx.addr(e.r, 16), [e.f] * 4),
     ["st.shared::cluster.v4.f32 [%r0+16], {%f0, %f0, %f0, %f0};"]),
    (lambda e: cluster.store(e.r, (e.rd, e.rd)), ["st.shared::cluster.v2.u64 [%r0], {%rd0, %rd0};"]),
    # TMA and bulk copies
    (lambda e: tma.load_tile(e.buf, e.rd, (e.s, 0), e.bar),
     ["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[buf], [%rd0, {%ri0, 0}], [bar];"]),
    (lambda e: tma.load_tile(e.buf, e.tmap, (1, 2, 3), ptx.addr(e.bar, 8)),
     ["mov.u64 %rd1, tmap;", "cvta.param.u64 %rd2, %rd1;",
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[buf], [%rd2, {1, 2, 3}], [bar+8];"]),
    (lambda e: tma.load_tile(ptx.addr(e.buf, 4096), e.rd, e.s, e.bar, multicast_mask=0b11,
                             cache_hint=e.bd),
     ["cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster.L2::cache_hint [buf+4096], [%rd0, {%ri0}], [bar], 3, %bd0;"]),
    (lambda e: tma.load_tile(e.r, e.rd, (e.s, e.r, 0, 0, -1), e.r, multicast_mask=e.h),
     ["cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%r0], [%rd0, {%ri0, %r0, 0, 0, -1}], [%r0], %us0;"]),
    (lambda e: tma.prefetch_tile(e.rd, (e.s, 0)),
     ["cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%rd0, {%ri0, 0}];"]),
    (lambda e: tma.prefetch_tile(e.tmap, (1, e.s, 3), cache_hint=e.bd),
     ["mov.u64 %rd1, tmap;", "cvta.param.u64 %rd2, %rd1;",
      "cp.async.bulk.prefetch.tensor.3d.L2.global.tile.L2::cache_hint [%rd2, {1, %ri0, 3}], %bd0;"]),
    (lambda e: tma.store_tile(e.rd, (0, e.s), e.buf),
     ["cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd0, {0, %ri0}], [buf];"]),
    (lambda e: tma.store_tile(e.rd, (0, 0), ptx.addr(e.dyn, 128), cache_hint=e.bd),
     ["cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint "
      "[%rd0, {0, 0}], [dyn_smem+128], %bd0;"]),
    (lambda e: tma.reduce_tile(e.rd, (0, e.s), e.buf),
     ["cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%rd0, {0, %ri0}], [buf];"]),
    (lambda e: tma.reduce_tile(e.tmap, (e.s, 0, 0), ptx.addr(e.dyn, 128), op="max", cache_hint=e.bd),
     ["mov.u64 %rd1, tmap;", "cvta.param.u64 %rd2, %rd1;",
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.max.tile.bulk_group.L2::cache_hint "
      "[%rd2, {%ri0, 0, 0}], [dyn_smem+128], %bd0;"]),
    (lambda e: tma.commit_group(), ["cp.async.bulk.commit_group;"]),
    (lambda e: tma.wait_group(0), ["cp.async.bulk.wait_group.read 0;"]),
    (lambda e: tma.wait_group(2, read=False), ["cp.async.bulk.wait_group 2;"]),
    (lambda e: tma.prefetch_tensormap(e.tmap), ["prefetch.param.tensormap [tmap];"]),
    (lambda e: tma.prefetch_tensormap(e.rd), ["prefetch.tensormap [%rd0];"]),
    (lambda e: tma.tensormap_ptr(e.tmap), ["mov.u64 %rd1, tmap;", "cvta.param.u64 %rd2, %rd1;"]),
    (lambda e: tma.copy_bulk(e.buf, e.rd, 256, e.bar),
     ["cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[buf], [%rd0], 256, [bar];"]),
    (lambda e: tma.copy_bulk(ptx.addr(e.buf, 16), ptx.addr(e.rd, 32), e.r, e.bar,
                             multicast_mask=e.h, cache_hint=e.bd),
     ["cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      ".L2::cache_hint [buf+16], [%rd0+32], %r0, [bar], %us0, %bd0;"]),
    (lambda e: tma.store_bulk(e.rd, e.buf, 8192),
     ["cp.async.bulk.global.shared::cta.bulk_group [%rd0], [buf], 8192;"]),
    (lambda e: tma.store_bulk(e.rd, e.buf, 64, cache_hint=e.bd),
     ["cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%rd0], [buf], 64, %bd0;"]),
    (lambda e: tma.cache_policy(), ["createpolicy.fractional.L2::evict_last.b64 %bd1, 0f3F800000;"]),
    (lambda e: tma.cache_policy("first", 0.5),
     ["createpolicy.fractional.L2::evict_first.b64 %bd1, 0f3F000000;"]),
    # wgmma
    (lambda e: wgmma.fence(), ["wgmma.fence.sync.aligned;"]),
    (lambda e: wgmma.commit_group(), ["wgmma.commit_group.sync.aligned;"]),
    (lambda e: wgmma.wait_group(1), ["wgmma.wait_group.sync.aligned 1;"]),
    (lambda e: wgmma.mma_async(reg.array(f32, 32), e.rd, e.rd, n=64),
     [f"wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {vec('f', 1, 32)}, "
      "%rd0, %rd0, 1, 1, 1, 0, 0;"]),
    (lambda e: wgmma.mma_async(reg.array(f32, 8), e.rd, e.rd, scale_d=e.p, imm_scale_a=-1,
                               trans_b=1),
     [f"wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {vec('f', 1, 8)}, "
      "%rd0, %rd0, %p0, -1, 1, 0, 1;"]),
    (lambda e: wgmma.mma_async(reg.array(f32, 4), e.rd, e.rd, scale_d=~e.p, dtype_ab="f16",
                               trans_a=True),
     [f"wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {vec('f', 1, 4)}, "
      "%rd0, %rd0, !%p0, 1, 1, 1, 0;"]),
    (lambda e: wgmma.mma_async(reg.array(f16x2, 16), e.rd, e.rd, dtype_d="f16", dtype_ab="f16",
                               scale_d=0),
     [f"wgmma.mma_async.sync.aligned.m64n64k16.f16.f16.f16 {vec('hh', 0, 16)}, "
      "%rd0, %rd0, 0, 1, 1, 0, 0;"]),
    (lambda e: wgmma.mma_async(reg.array(f32, 16), e.rd, e.rd, dtype_ab="tf32", k=8),
     [f"wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {vec('f', 1, 16)}, "
      "%rd0, %rd0, 1, 1, 1;"]),
    (lambda e: wgmma.mma_async(reg.array(f32, 16), e.rd, e.rd, dtype_ab=("e4m3", "e5m2")),
     [f"wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e5m2 {vec('f', 1, 16)}, "
      "%rd0, %rd0, 1, 1, 1;"]),
    (lambda e: wgmma.mma_async(reg.array(s32, 24), e.rd, e.rd, dtype_d="s32", dtype_ab="s8",
                               satfinite=True),
     [f"wgmma.mma_async.sync.aligned.m64n48k32.satfinite.s32.s8.s8 {vec('ri', 1, 24)}, "
      "%rd0, %rd0, 1;"]),
    (lambda e: wgmma.mma_async(reg.array(f16x2, 8), e.rd, e.rd, dtype_d=f16, dtype_ab=e5m2),
     [f"wgmma.mma_async.sync.aligned.m64n32k32.f16.e5m2.e5m2 {vec('hh', 0, 8)}, "
      "%rd0, %rd0, 1, 1, 1;"]),
    (lambda e: wgmma.mma_async(reg.array(f32, 16), reg.array(b32, 4), e.rd, trans_b=1),
     [f"wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {vec('f', 1, 16)}, "
      f"{vec('b', 0, 4)}, %rd0, 1, 1, 1, 1;"]),
    (lambda e: wgmma.make_smem_desc(e.buf, 16, 1024, 128),
     ["mov.u32 %r1, buf;", "and.b32 %r2, %r1, 0x3FFFF;", "shr.u32 %r3, %r2, 4;",
      "cvt.u64.u32 %rd1, %r3;", "or.b64 %rd2, %rd1, 0x4000004000010000;"]),
    (lambda e: wgmma.make_smem_desc(e.r, 128, 256, None, base_offset=1),
     ["and.b32 %r1, %r0, 0x3FFFF;", "shr.u32 %r2, %r1, 4;", "cvt.u64.u32 %rd1, %r2;",
      "or.b64 %rd2, %rd1, 0x0002001000080000;"]),
    (lambda e: wgmma.make_smem_desc(e.rd, 0, 512, 32),
     ["and.b64 %rd1, %rd0, 0x3FFFF;", "shr.u64 %rd2, %rd1, 4;",
      "or.b64 %rd3, %rd2, 0xC000002000000000;"]),
    # warpgroup / warp
    (lambda e: ptx.setmaxnreg(240), ["setmaxnreg.inc.sync.aligned.u32 240;"]),
    (lambda e: ptx.setmaxnreg(40, inc=False), ["setmaxnreg.dec.sync.aligned.u32 40;"]),
    (lambda e: ptx.elect_sync(), ["elect.sync _|%p1, 0xffffffff;"]),
    (lambda e: ptx.elect_sync(e.r), ["elect.sync _|%p1, %r0;"]),
]


@pytest.mark.parametrize("case,expected", TEXT, ids=[f"L{c.__code__.co_firstlineno}" for c, _ in TEXT])
def test_emitted_text(case, expected):
    assert lines(traced(case)) == expected


def test_helpers_return_typed_registers():
    got = {}

    def case(e):
        got["state"] = mbarrier.arrive(e.bar)
        got["remote"] = mbarrier.arrive(e.r, remote=True)
        got["p"] = mbarrier.try_wait_parity(e.bar, 0)
        got["rank"] = cluster.ctarank()
        got["mapped"] = cluster.map_shared(e.bar, 0)
        got["desc"] = wgmma.make_smem_desc(e.r, 16, 1024, 128)
        got["elect"] = ptx.elect_sync()
        got["policy"] = tma.cache_policy()
        got["tmap"] = tma.tensormap_ptr(e.rd)

    traced(case)
    assert got["state"].type is b64 and got["remote"] is None
    assert got["p"].type is pred and got["elect"].type is pred
    assert got["rank"].type is u32 and got["mapped"].type is u32
    assert got["desc"].type is u64 and got["policy"].type is b64
    assert got["tmap"].name == "%rd0"  # a register tensor map is used as is


def test_all_emitted_forms_assemble(assemble):
    """Every form of the table, in one sm_90a kernel (cluster of 2), through ptxas."""

    def case(e):
        for c, _ in TEXT:
            c(e)

    assemble(traced(case, cluster_dims=(2, 1, 1)).ptx())


def test_descriptor_fields():
    assert wgmma.accumulator_count(64, 256) == 128
    assert wgmma.accumulator_count(64, 256, "f16") == 64
    assert wgmma.K_OF["bf16"] == 16 and wgmma.K_OF["tf32"] == 8 and wgmma.K_OF["e4m3"] == 32


# ------------------------------------------------------------------ validation errors
# Each case is a one-line lambda: the error must name this file and that very line.
ERRORS = [
    # mbarrier
    (OperandError, "ptx.mbarrier.init count must be an int in 1..1048575", lambda e: mbarrier.init(e.bar, 0)),
    (OperandError, "ptx.mbarrier.init count must be an int in 1..1048575", lambda e: mbarrier.init(e.bar, 1 << 20)),
    (TypeMismatchError, "count must be a 32-bit integer register (u32/s32/b32) or an int, got .f32 register %f0", lambda e: mbarrier.init(e.bar, e.f)),
    (OperandError, "needs 8-byte aligned shared memory; small is declared with align=4", lambda e: mbarrier.init(e.small, 1)),
    (OperandError, "bar offset 4 into bar is not a multiple of 8 bytes", lambda e: mbarrier.arrive(ptx.addr(e.bar, 4))),
    (OperandError, "bar offset 16 (+8 bytes) is outside bar (16 bytes)", lambda e: mbarrier.inval(ptx.addr(e.bar, 16))),
    (TypeMismatchError, "bar must be a 32/64-bit integer register holding a shared address, got .f32", lambda e: mbarrier.arrive(e.f)),
    (OperandError, "bar must be a shared array, ptx.addr(...) of one, or a u32 shared address register, got 3", lambda e: mbarrier.arrive(3)),
    (OperandError, "bar must address shared memory", lambda e: mbarrier.arrive(ptx.addr(e.x))),
    (OperandError, "tx_bytes must be an int in 0..1048575", lambda e: mbarrier.arrive_expect_tx(e.bar, -1)),
    (OperandError, "ptx.mbarrier.arrive remote must be True or False, got 1", lambda e: mbarrier.arrive(e.r, remote=1)),
    (OperandError, "phase must be an int in 0..1 (a phase parity), got 2", lambda e: mbarrier.wait(e.bar, 2)),
    (TypeMismatchError, "phase must be a 32-bit integer register", lambda e: mbarrier.try_wait_parity(e.bar, e.p)),
    (OperandError, "scope must be None, 'cta' or 'cluster', got 'gpu'", lambda e: mbarrier.wait(e.bar, 0, scope="gpu")),
    # fences, cluster barriers, warp/warpgroup
    (OperandError, "fence_proxy_async space must be one of", lambda e: ptx.fence_proxy_async("shared")),
    (OperandError, "cluster_arrive relaxed must be True or False, got 'yes'", lambda e: ptx.cluster_arrive("yes")),
    (OperandError, "setmaxnreg count must be a multiple of 8 in 24..256, got 100", lambda e: ptx.setmaxnreg(100)),
    (OperandError, "setmaxnreg count must be a multiple of 8 in 24..256, got 16", lambda e: ptx.setmaxnreg(16)),
    (OperandError, "setmaxnreg count must be a multiple of 8 in 24..256, got 264", lambda e: ptx.setmaxnreg(264)),
    (OperandError, "setmaxnreg inc must be True or False", lambda e: ptx.setmaxnreg(64, inc="dec")),
    (OperandError, "elect_sync mask must be a nonzero 32-bit int, got 0", lambda e: ptx.elect_sync(0)),
    (TypeMismatchError, "elect_sync mask must be a 32-bit integer register or int, got .u64", lambda e: ptx.elect_sync(e.rd)),
    # cluster
    (OperandError, "ptx.cluster.map_shared rank must be an int in 0..15", lambda e: cluster.map_shared(e.r, 16)),
    (OperandError, "map_shared addr must be a shared array or a shared address register, got 5", lambda e: cluster.map_shared(5, 0)),
    (TypeMismatchError, "map_shared addr must be a shared array or a 32/64-bit shared address register, got .f32", lambda e: cluster.map_shared(e.f, 0)),
    (OperandError, "ptx.cluster.load type must be one of", lambda e: cluster.load(u8, e.r)),
    (OperandError, "ptx.cluster.store addr must be a shared::cluster address register", lambda e: cluster.store(e.bar, e.f)),
    (TypeMismatchError, "ptx.cluster.store value must be a 32/64-bit register", lambda e: cluster.store(e.r, e.p)),
    (OperandError, "ptx.cluster.store value must be a register or a list of 2 or 4, got a list of 3", lambda e: cluster.store(e.r, [e.f] * 3)),
    (TypeMismatchError, "ptx.cluster.store vector registers must share one type, got .f32 and .u32", lambda e: cluster.store(e.r, [e.f, e.r])),
    (OperandError, "a vector of four holds 32-bit registers only, got four .u64", lambda e: cluster.store(e.r, [e.rd] * 4)),
    # TMA
    (OperandError, "ptx.tma.load_tile takes 1 to 5 tensor coordinates, got 6", lambda e: tma.load_tile(e.buf, e.rd, (0,) * 6, e.bar)),
    (OperandError, "ptx.tma.load_tile takes 1 to 5 tensor coordinates, got 0", lambda e: tma.load_tile(e.buf, e.rd, (), e.bar)),
    (TypeMismatchError, "coords[1] must be a 32-bit integer register (s32/u32/b32), got .u64 register %rd0", lambda e: tma.load_tile(e.buf, e.rd, (e.s, e.rd), e.bar)),
    (OperandError, "coords[0] must be an s32 register or an int, got 1.5", lambda e: tma.load_tile(e.buf, e.rd, (1.5,), e.bar)),
    (OperandError, "coords[0] must be an int in -2147483648..2147483647", lambda e: tma.load_tile(e.buf, e.rd, (1 << 31,), e.bar)),
    (OperandError, "dst_smem needs 128-byte aligned shared memory; small is declared with align=4", lambda e: tma.load_tile(e.small, e.rd, (0,), e.bar)),
    (OperandError, "dst_smem offset 64 into buf is not a multiple of 128 bytes", lambda e: tma.load_tile(ptx.addr(e.buf, 64), e.rd, (0,), e.bar)),
    (TypeMismatchError, "tensor_map must be a 64-bit register holding the tensor map's address, got .u32", lambda e: tma.load_tile(e.buf, e.r, (0,), e.bar)),
    (OperandError, "tensor_map parameter x is declared '.param .u64 x', not a 128-byte tensor map", lambda e: tma.load_tile(e.buf, e.x, (0,), e.bar)),
    (OperandError, "tensor_map 'nope' is not a parameter of this kernel", lambda e: tma.load_tile(e.buf, "nope", (0,), e.bar)),
    (OperandError, "tensor_map must be a u64 register holding the tensor map's address or a 128-byte tensor-map kernel parameter, got 7", lambda e: tma.store_tile(7, (0,), e.buf)),
    (OperandError, "multicast_mask must be an int in 1..65535 (one bit per CTA rank), got 65536", lambda e: tma.load_tile(e.buf, e.rd, (0,), e.bar, multicast_mask=1 << 16)),
    (TypeMismatchError, "multicast_mask must be a 16-bit register (u16/b16) or an int, got .u32 register %r0", lambda e: tma.load_tile(e.buf, e.rd, (0,), e.bar, multicast_mask=e.r)),
    (TypeMismatchError, "cache_hint must be a 64-bit cache-policy register (ptx.tma.cache_policy), got .u32", lambda e: tma.store_tile(e.rd, (0,), e.buf, cache_hint=e.r)),
    (OperandError, "cache_hint must be a 64-bit cache-policy register (ptx.tma.cache_policy), got 1", lambda e: tma.load_tile(e.buf, e.rd, (0,), e.bar, cache_hint=1)),
    (OperandError, "ptx.tma.reduce_tile op must be one of add, min, max, inc, dec, and, or, xor, got 'mul'", lambda e: tma.reduce_tile(e.rd, (0,), e.buf, op="mul")),
    (OperandError, "ptx.tma.wait_group n must be a non-negative int, got -1", lambda e: tma.wait_group(-1)),
    (OperandError, "ptx.tma.wait_group read must be True or False", lambda e: tma.wait_group(0, read=None)),
    (OperandError, "ptx.tma.copy_bulk size must be a multiple of 16 bytes, got 24", lambda e: tma.copy_bulk(e.buf, e.rd, 24, e.bar)),
    (OperandError, "ptx.tma.store_bulk size must be an int in 16..4294967280", lambda e: tma.store_bulk(e.rd, e.buf, 0)),
    (TypeMismatchError, "src_global must be a 64-bit global address register (u64/b64), got .u32", lambda e: tma.copy_bulk(e.buf, e.r, 16, e.bar)),
    (OperandError, "dst_global must be a u64 global address register (see ptx.global_ptrs)", lambda e: tma.store_bulk(e.x, e.buf, 16)),
    (OperandError, "cache_policy evict must be one of", lambda e: tma.cache_policy("never")),
    (OperandError, "cache_policy fraction must be a number in (0, 1], got 0", lambda e: tma.cache_policy("last", 0)),
    # wgmma
    (OperandError, "ptx.wgmma.mma_async n must be a multiple of 8 in 8..256 for .bf16, got 12", lambda e: wgmma.mma_async(reg.array(f32, 6), e.rd, e.rd, n=12)),
    (OperandError, "n must be a multiple of 8 in 8..256 for .bf16, got 264", lambda e: wgmma.mma_async(reg.array(f32, 132), e.rd, e.rd)),
    (OperandError, "n must be 8, 16, 24, 32, 48, ..., 256 (multiples of 16 above 32) for .s8, got 40", lambda e: wgmma.mma_async(reg.array(s32, 20), e.rd, e.rd, dtype_d="s32", dtype_ab="s8")),
    (OperandError, "m64n128k16.f32 needs 64 accumulator registers per thread (m*n/128), got 32", lambda e: wgmma.mma_async(reg.array(f32, 32), e.rd, e.rd, n=128)),
    (OperandError, "m64n64k16.f16 needs 16 accumulator registers per thread (m*n/256), got 32", lambda e: wgmma.mma_async(reg.array(b32, 32), e.rd, e.rd, n=64, dtype_d="f16", dtype_ab="f16")),
    (TypeMismatchError, "accumulator for .f32 must be .f32 registers; acc[0] is .b32 register %b0", lambda e: wgmma.mma_async(reg.array(b32, 4), e.rd, e.rd)),
    (OperandError, "ptx.wgmma.mma_async k must be 16 for .bf16 inputs, got 8", lambda e: wgmma.mma_async(reg.array(f32, 4), e.rd, e.rd, k=8)),
    (OperandError, "k must be 8 for .tf32 inputs, got 16", lambda e: wgmma.mma_async(reg.array(f32, 4), e.rd, e.rd, dtype_ab="tf32", k=16)),
    (OperandError, "k must be 32 for .e4m3 inputs, got 16", lambda e: wgmma.mma_async(reg.array(f32, 4), e.rd, e.rd, dtype_ab="e4m3", k=16)),
    (OperandError, "m must be 64 (wgmma shapes are m64nNkK), got 128", lambda e: wgmma.mma_async(reg.array(f32, 4), e.rd, e.rd, m=128)),
    (OperandError, "with .bf16 inputs accumulates in .f32, got dtype_d='f16'", lambda e: wgmma.mma_async(reg.array(b32, 4), e.rd, e.rd, dtype_d="f16")),
    (OperandError, "A and B types must match except for fp8 (e4m3/e5m2) or int8 (s8/u8) mixes, got .f16 and .bf16", lambda e: wgmma.mma_async(reg.array(f32, 4), e.rd, e.rd, dtype_ab=("f16", "bf16"))),
    (OperandError, "dtype_ab must be one of", lambda e: wgmma.mma_async(reg.array(f32, 4), e.rd, e.rd, dtype_ab="f64")),
    (TypeMismatchError, "b_desc must be a 64-bit matrix descriptor (u64/b64), got .u32 register %r0", lambda e: wgmma.mma_async(reg.array(f32, 4), e.rd, e.r)),
    (OperandError, "a_desc must be a u64 matrix-descriptor register or 4 32-bit A-fragment registers, got 0", lambda e: wgmma.mma_async(reg.array(f32, 4), 0, e.rd)),
    (OperandError, "A from registers takes 4 32-bit registers, got 2", lambda e: wgmma.mma_async(reg.array(f32, 4), reg.array(b32, 2), e.rd)),
    (TypeMismatchError, "A fragment registers must be 32-bit registers holding packed .bf16 values; a_desc[0] is .f32", lambda e: wgmma.mma_async(reg.array(f32, 4), reg.array(f32, 4), e.rd)),
    (OperandError, "trans_a=1 needs A in shared memory (a descriptor)", lambda e: wgmma.mma_async(reg.array(f32, 4), reg.array(b32, 4), e.rd, trans_a=1)),
    (OperandError, "trans_b=1 is only supported for .f16/.bf16 inputs", lambda e: wgmma.mma_async(reg.array(f32, 4), e.rd, e.rd, dtype_ab="tf32", trans_b=1)),
    (OperandError, "scale_d must be a predicate register, ~p, 0 or 1, got 2", lambda e: wgmma.mma_async(reg.array(f32, 4), e.rd, e.rd, scale_d=2)),
    (TypeMismatchError, "scale_d must be a predicate register, ~p, 0 or 1, got .u32 register %r0", lambda e: wgmma.mma_async(reg.array(f32, 4), e.rd, e.rd, scale_d=e.r)),
    (OperandError, "imm_scale_a must be 1 or -1, got 2", lambda e: wgmma.mma_async(reg.array(f32, 4), e.rd, e.rd, imm_scale_a=2)),
    (OperandError, "imm_scale_b must be 1 for integer inputs", lambda e: wgmma.mma_async(reg.array(s32, 4), e.rd, e.rd, dtype_d="s32", dtype_ab="u8", imm_scale_b=-1)),
    (OperandError, "satfinite is only valid for s8/u8 inputs", lambda e: wgmma.mma_async(reg.array(f32, 4), e.rd, e.rd, satfinite=True)),
    (OperandError, "acc must be a register array (reg.array) or a list of registers", lambda e: wgmma.mma_async(e.f, e.rd, e.rd)),
    (OperandError, "ptx.wgmma.wait_group n must be a non-negative int, got -1", lambda e: wgmma.wait_group(-1)),
    (OperandError, "leading_byte_offset must be a multiple of 16 bytes, got 8", lambda e: wgmma.make_smem_desc(e.r, 8, 1024, 128)),
    (OperandError, "stride_byte_offset must be an int in 0..262128 (bytes), got 262144", lambda e: wgmma.make_smem_desc(e.r, 16, 1 << 18, 128)),
    (OperandError, "swizzle must be None, 0, 32, 64 or 128 (bytes), got 256", lambda e: wgmma.make_smem_desc(e.r, 16, 1024, 256)),
    (OperandError, "base_offset must be an int in 0..7, got 8", lambda e: wgmma.make_smem_desc(e.r, 16, 1024, 128, base_offset=8)),
    (TypeMismatchError, "addr must be a u32 shared address register, got .f32", lambda e: wgmma.make_smem_desc(e.f, 16, 1024, 128)),
    (OperandError, "make_smem_desc addr must be a shared array or a u32 shared address register, got 0", lambda e: wgmma.make_smem_desc(0, 16, 1024, 128)),
]


@pytest.mark.parametrize("exc,fragment,case", ERRORS,
                         ids=[f"L{c.__code__.co_firstlineno}" for _, _, c in ERRORS])
def test_validation_errors(exc, fragment, case):
    with pytest.raises(exc) as ei:
        traced(case)
    msg = str(ei.value)
    line = case.__code__.co_firstlineno
    assert msg.startswith(f"{case.__code__.co_filename}:{line}: "), msg
    assert f"{HERE}:{line}: " in msg
    assert fragment in msg, msg


def test_errors_point_at_the_calling_line_in_a_def_body():
    def body(x):
        bar = smem.alloc(b64, 1, align=8, name="bar")
        mbarrier.init(bar, 0)  # the line the error must name

    k = pyptx.kernel([Tile(16, f32)], block=(128, 1, 1))(body)
    with pytest.raises(OperandError) as ei:
        k.ptx()
    line = body.__code__.co_firstlineno + 2
    assert str(ei.value).startswith(f"{__file__}:{line}: ptx.mbarrier.init count")


def test_registers_of_another_kernel_are_rejected():
    stash = {}

    def first(e):
        stash["r"] = e.r
        stash["bar"] = e.bar

    traced(first)
    with pytest.raises(RegisterScopeError):
        traced(lambda e: mbarrier.init(stash["bar"], 1))
    with pytest.raises(RegisterScopeError):
        traced(lambda e: mbarrier.init(e.bar, stash["r"]))


def test_helpers_outside_a_kernel_raise_trace_error():
    with pytest.raises(pyptx.TraceError):
        wgmma.fence()
    with pytest.raises(pyptx.TraceError):
        ptx.fence_proxy_async()


# ------------------------------------------------------------------ realistic kernels
def tma_pipeline_kernel(stages: int = 3, k_tiles: int = 8):
    """Warp-specialized TMA producer/consumer skeleton with a ring of full/empty mbarriers.

    Warpgroup 0 (producer): one elected thread waits for a free slot, arms the slot's
    full barrier with the tile's bytes and issues the TMA load. Warpgroup 1 (consumer):
    waits for the full barrier, reads the tile, releases the slot, and at the end writes a
    tile back with a TMA store. The tensor map lives in global memory (a 128-byte tensor).
    """
    tile_bytes = 64 * 64 * 2

    @pyptx.kernel([Tile(128, u8), Tile("N", f32)], [], block=(256, 1, 1), name="tma_pipeline",
                  maxnreg=240)
    def k(tmap_buf, out):
        tmap, = ptx.global_ptrs(tmap_buf)
        tiles = smem.alloc(bf16, (stages, 64, 64), align=1024, name="tiles")
        full = smem.alloc(b64, stages, align=8, name="full")
        empty = smem.alloc(b64, stages, align=8, name="empty")
        tid = ptx.special.tid.x()
        tma.prefetch_tensormap(tmap)
        with ptx.if_(tid == 0):
            for s in range(stages):
                mbarrier.init(ptx.addr(full, 8 * s), 1)
                mbarrier.init(ptx.addr(empty, 8 * s), 128)
            ptx.fence_mbarrier_init()
        ptx.bar_sync(0)
        full0, empty0, tiles0 = full.addr(), empty.addr(), tiles.addr()
        is_producer = tid < 128
        done = ptx.label("done")
        with ptx.if_(is_producer):
            ptx.setmaxnreg(40, inc=False)
            leader = ptx.elect_sync()
            warp0 = tid < 32
            with ptx.if_(warp0 & leader):
                phase = reg.scalar(u32, 0)
                stage = reg.scalar(u32, 0)
                for kt in ptx.loop(k_tiles, unroll=False):
                    off = stage << 3
                    mbarrier.wait(empty0 + off, phase ^ 1)
                    f = full0 + off
                    mbarrier.arrive_expect_tx(f, tile_bytes)
                    x = reg.from_(kt * 64, s32)
                    dst = tiles0 + stage * tile_bytes
                    tma.load_tile(dst, tmap, (0, x), f)
                    stage += 1
                    wrap = stage == stages
                    ptx.inst.selp.u32(stage, 0, stage, wrap)
                    ptx.inst.xor.b32(phase, phase, 1, pred=wrap)
            ptx.bra(done)
        ptx.setmaxnreg(232)
        phase = reg.scalar(u32, 0)
        stage = reg.scalar(u32, 0)
        acc = reg.scalar(f32, 0.0)
        lane = reg.from_(tid - 128, u32)
        for _ in ptx.loop(k_tiles, unroll=False):
            off = stage << 3
            mbarrier.wait(full0 + off, phase)
            v = reg.scalar(bf16)
            ptx.inst.ld.shared.b16(v, ptx.addr(tiles0 + stage * tile_bytes + lane * 2))
            acc += reg.from_(v, f32)
            mbarrier.arrive(empty0 + off)
            stage += 1
            wrap = stage == stages
            ptx.inst.selp.u32(stage, 0, stage, wrap)
            ptx.inst.xor.b32(phase, phase, 1, pred=wrap)
        ptx.inst.st.shared.f32(ptx.addr(tiles0 + lane * 4), acc)
        ptx.fence_proxy_async()
        ptx.bar_sync(1, 128)
        with ptx.if_(tid == 128):
            tma.store_tile(tmap, (0, 0), tiles)
            tma.commit_group()
            tma.wait_group(0)
        ptx.place(done)
        with ptx.if_(tid == 0):
            for s in range(stages):
                mbarrier.inval(ptx.addr(full, 8 * s))
        ptx.ret()

    return k


def test_tma_mbarrier_pipeline_assembles(assemble):
    text = tma_pipeline_kernel().ptx(N=16)
    for needle in ("mbarrier.init.shared::cta.b64 [full+8], 1;",
                   "mbarrier.init.shared::cta.b64 [empty+16], 128;",
                   "fence.mbarrier_init.release.cluster;",
                   "setmaxnreg.dec.sync.aligned.u32 40;",
                   "setmaxnreg.inc.sync.aligned.u32 232;",
                   "elect.sync _|",
                   "mbarrier.arrive.expect_tx.shared::cta.b64 _, [",
                   "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [",
                   "mbarrier.try_wait.parity.shared::cta.b64",
                   "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [",
                   "cp.async.bulk.wait_group.read 0;",
                   "fence.proxy.async.shared::cta;"):
        assert needle in text, needle
    assemble(text)


def wgmma_gemm_kernel():
    """One warpgroup computes a 64xN tile of C = A @ B^T (bf16 -> f32) over K in steps of 64:
    TMA loads A (64x64) and B (Nx64) into 128B-swizzled shared memory, then four
    m64nNk16 wgmma per K step with descriptors advanced by 32 bytes along K. The epilogue
    is simplified (row per thread, not the wgmma fragment layout): this checks codegen."""

    @pyptx.kernel([Tile(128, u8), Tile(128, u8), Tile("K", bf16)], [Tile(64, "N", f32)],
                  block=(128, 1, 1), name="wgmma_gemm")
    def k(tma_a, tma_b, kdim, c):
        N = c.shape[1]
        ta, tb, pc = ptx.global_ptrs(tma_a, tma_b, c)
        a_s = smem.alloc(bf16, (64, 64), align=1024, name="a_s")
        b_s = smem.alloc(bf16, (N, 64), align=1024, name="b_s")
        bar = smem.alloc(b64, 1, align=8, name="bar")
        tid = ptx.special.tid.x()
        with ptx.if_(tid == 0):
            mbarrier.init(bar, 1)
            ptx.fence_proxy_async()
        ptx.bar_sync(0)
        acc = reg.array(f32, wgmma.accumulator_count(64, N))
        da0 = wgmma.make_smem_desc(a_s, 16, 1024, 128)
        db0 = wgmma.make_smem_desc(b_s, 16, 1024, 128)
        phase = reg.scalar(u32, 0)
        k_tiles = kdim.shape[0] // 64
        for kt in ptx.loop(k_tiles, unroll=False):
            with ptx.if_(tid == 0):
                mbarrier.arrive_expect_tx(bar, (64 + N) * 64 * 2)
                x = reg.from_(kt * 64, s32)
                tma.load_tile(a_s, ta, (x, 0), bar)
                tma.load_tile(b_s, tb, (x, 0), bar)
            mbarrier.wait(bar, phase)
            phase ^= 1
            first = kt == 0
            wgmma.fence()
            for j in range(4):
                scale = ~first if j == 0 else 1
                wgmma.mma_async(acc, da0 + 2 * j, db0 + 2 * j, n=N, scale_d=scale)
            wgmma.commit_group()
            wgmma.wait_group(0)
            ptx.bar_sync(0)
        row = reg.from_(tid, u64)
        for i, r in enumerate(acc):
            ptx.inst.st.global_.f32(ptx.addr(pc + row * (N * 4), 4 * i), r)
        ptx.ret()

    return k


@pytest.mark.parametrize("n", [64, 128, 256])
def test_wgmma_bf16_loop_assembles(assemble, n):
    text = wgmma_gemm_kernel().ptx(K=512, N=n)
    assert text.count(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 ") == 4
    assert f"{vec('f', 0, n // 2)}, %rd" in text
    assert ", !%p" in text  # scale_d from the first-iteration predicate
    assert "or.b64" in text and "0x4000004000010000" in text
    assemble(text)


def cluster_kernel():
    """A 2-CTA cluster: CTA 0 multicasts a TMA tile into both CTAs; each CTA then writes a
    value into its peer's shared memory and arrives on the peer's mbarrier."""

    @pyptx.kernel([Tile(128, u8)], [], block=(128, 1, 1), cluster=(2, 1, 1), name="dsmem")
    def k(tmap_buf):
        tmap, = ptx.global_ptrs(tmap_buf)
        buf = smem.alloc(f32, (32, 32), align=128, name="buf")
        slot = smem.alloc(f32, 4, align=16, name="slot")
        bar = smem.alloc(b64, 2, align=8, name="bar")
        tid = ptx.special.tid.x()
        rank = cluster.ctarank()
        with ptx.if_(tid == 0):
            mbarrier.init(bar, 1)
            mbarrier.init(ptx.addr(bar, 8), 1)
            ptx.fence_mbarrier_init()
        ptx.cluster_sync(aligned=True)
        with ptx.if_(tid == 0):
            mbarrier.arrive_expect_tx(bar, 32 * 32 * 4)
            with ptx.if_(rank == 0):
                tma.load_tile(buf, tmap, (0, 0), bar, multicast_mask=0b11,
                              cache_hint=tma.cache_policy("last"))
        mbarrier.wait(bar, 0)
        peer = rank ^ 1
        remote_slot = cluster.map_shared(slot, peer)
        remote_bar = cluster.map_shared(bar.addr() + 8, peer)
        with ptx.if_(tid == 0):
            v = reg.scalar(f32)
            ptx.inst.ld.shared.f32(v, ptx.addr(buf))
            cluster.store(remote_slot, v)
            mbarrier.arrive(remote_bar, remote=True)
        mbarrier.wait(ptx.addr(bar, 8), 0, scope="cluster")
        ptx.cluster_arrive(relaxed=True)
        ptx.cluster_wait()
        ptx.ret()

    return k


def test_cluster_dsmem_multicast_assembles(assemble):
    text = cluster_kernel().ptx()
    assert ".reqnctapercluster 2, 1, 1" in text
    assert "mapa.shared::cluster.u32" in text
    assert "st.shared::cluster.f32 [%r" in text
    assert "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r" in text
    assert ".multicast::cluster.L2::cache_hint [buf], [%rd" in text
    assert "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64" in text
    assemble(text)


def test_instructions_carry_the_callers_line():
    def body(x):
        bar = smem.alloc(b64, 1, align=8, name="bar")
        mbarrier.wait(bar, 0)

    k = pyptx.kernel([Tile(16, f32)], block=(128, 1, 1))(body)
    spec = k.specialize()
    stmts = spec.module.functions[0].body
    line = body.__code__.co_firstlineno + 2
    assert [st.loc[1] for st in stmts] == [line] * 3
    assert all(type(st) is Instruction for st in stmts[1:])
