"""The tensor-core layer's instruction helpers: ``pred=`` on every named helper, arch checks,
``ptx.ldmatrix``/``stmatrix``, ``ptx.cp_async``, ``ptx.mma_sync``, packed conversions, the
``fence.proxy`` forms and cluster-remote mbarrier arrives.

Each helper is checked for the exact text it emits, ptxas (sm_90a, and sm_80 for the Ampere
forms) accepting it, the errors it raises (class, message, and the user's file:line first),
and, where the PTX simulator models the instructions, its numbers.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

import pyptx
from pyptx import OperandError, Tile, TraceError, TypeMismatchError, ptx, reg, smem
from pyptx.ir import Param
from pyptx.ptx import async_copy, cluster, convert, matrix, mbarrier, mma, sync, tma, wgmma
from pyptx.trace import current
from pyptx.types import b8, b16, b32, b64, bf16, bf16x2, f16x2, f32, pred, s32, u16, u32, u64

TESTS = Path(__file__).resolve().parent


class Env:
    """Operands every table case can use; creating them emits no instruction.

    Registers: r=%r0 (u32), s=%ri0 (s32), rd=%rd0 (u64), p=%p0 (pred), h=%us0 (u16),
    f=%f0 (f32), bd=%bd0 (b64), b4=%b0..%b3 (b32), f4=%f1..%f4 (f32), hx=%hh0..%hh1 (f16x2),
    bx=%bhh0 (bf16x2). Shared: bar (2 x b64, align 8), buf (64x64 bf16, align 1024), small
    (4 x f32, align 4). Params: x (the kernel's .u64 tensor), tmap (a 128-byte tensor map).
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
        self.b4 = reg.array(b32, 4)
        self.f4 = reg.array(f32, 4)
        self.hx = reg.array(f16x2, 2)
        self.bx = reg.scalar(bf16x2)
        self.bar = smem.alloc(b64, 2, align=8, name="bar")
        self.buf = smem.alloc(bf16, (64, 64), align=1024, name="buf")
        self.small = smem.alloc(f32, 4, align=4, name="small")
        current().func.params.append(Param("tmap", b8, align=64, count=128))
        self.tmap = "tmap"


def traced(case, *, arch="sm_90a", cluster_dims=(1, 1, 1), version="8.4"):
    """Trace ``case(env)`` as a kernel body for ``arch``; return the Specialization."""

    def body(x):
        case(Env(x))

    k = pyptx.kernel([Tile(16, f32)], block=(128, 1, 1), cluster=cluster_dims, smem=1024,
                     name="k", arch=arch, version=version, maxnreg=240)(body)
    return k.specialize()


def lines(spec) -> list[str]:
    """The body statements as PTX text (labels included)."""
    return [st.text() for st in spec.module.functions[0].body]


# ------------------------------------------------------------------ exact emitted text
TEXT = [
    (lambda e: mbarrier.init(e.bar, 1, pred=e.p),
     ['@%p0 mbarrier.init.shared::cta.b64 [bar], 1;']),
    (lambda e: mbarrier.arrive(e.bar, pred=~e.p),
     ['@!%p0 mbarrier.arrive.shared::cta.b64 %bd1, [bar];']),
    (lambda e: mbarrier.arrive(e.r, 2, remote=True, pred=e.p),
     ['@%p0 mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r0], 2;']),
    (lambda e: mbarrier.arrive_expect_tx(e.bar, 4096, pred=e.p),
     ['@%p0 mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], 4096;']),
    (lambda e: mbarrier.expect_tx(e.bar, e.r, pred=~e.p),
     ['@!%p0 mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [bar], %r0;']),
    (lambda e: mbarrier.try_wait_parity(e.bar, 1, pred=e.p),
     ['@%p0 mbarrier.try_wait.parity.shared::cta.b64 %p1, [bar], 1;']),
    (lambda e: mbarrier.wait(e.bar, e.r, pred=e.p),
     ['@!%p0 bra $L_mbar_wait_skip;', '$L_mbar_wait:', 'mbarrier.try_wait.parity.shared::cta.b64 %p1, [bar], %r0;', '@!%p1 bra $L_mbar_wait;', '$L_mbar_wait_skip:']),
    (lambda e: mbarrier.wait(ptx.addr(e.bar, 8), 0, scope="cta", pred=~e.p),
     ['@%p0 bra $L_mbar_wait_skip;', '$L_mbar_wait:', 'mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 %p1, [bar+8], 0;', '@!%p1 bra $L_mbar_wait;', '$L_mbar_wait_skip:']),
    (lambda e: mbarrier.inval(e.bar, pred=e.p),
     ['@%p0 mbarrier.inval.shared::cta.b64 [bar];']),
    (lambda e: tma.load_tile(e.buf, e.tmap, (0, e.s), e.bar, pred=e.p),
     ['@%p0 mov.u64 %rd1, tmap;', '@%p0 cvta.param.u64 %rd2, %rd1;', '@%p0 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [buf], [%rd2, {0, %ri0}], [bar];']),
    (lambda e: tma.store_tile(e.rd, (0, 0), e.buf, pred=~e.p),
     ['@!%p0 cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd0, {0, 0}], [buf];']),
    (lambda e: tma.commit_group(pred=e.p),
     ['@%p0 cp.async.bulk.commit_group;']),
    (lambda e: tma.wait_group(1, read=False, pred=e.p),
     ['@%p0 cp.async.bulk.wait_group 1;']),
    (lambda e: tma.prefetch_tensormap(e.tmap, pred=e.p),
     ['@%p0 prefetch.param.tensormap [tmap];']),
    (lambda e: tma.prefetch_tile(e.rd, (0, e.s), pred=e.p),
     ['@%p0 cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%rd0, {0, %ri0}];']),
    (lambda e: tma.tensormap_ptr(e.tmap, pred=e.p),
     ['@%p0 mov.u64 %rd1, tmap;', '@%p0 cvta.param.u64 %rd2, %rd1;']),
    (lambda e: tma.copy_bulk(e.buf, e.rd, 256, e.bar, pred=e.p),
     ['@%p0 cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [buf], [%rd0], 256, [bar];']),
    (lambda e: tma.store_bulk(e.rd, e.buf, 64, pred=~e.p),
     ['@!%p0 cp.async.bulk.global.shared::cta.bulk_group [%rd0], [buf], 64;']),
    (lambda e: tma.cache_policy("first", pred=e.p),
     ['@%p0 createpolicy.fractional.L2::evict_first.b64 %bd1, 0f3F800000;']),
    (lambda e: wgmma.fence(pred=e.p),
     ['@%p0 wgmma.fence.sync.aligned;']),
    (lambda e: wgmma.commit_group(pred=e.p),
     ['@%p0 wgmma.commit_group.sync.aligned;']),
    (lambda e: wgmma.wait_group(0, pred=~e.p),
     ['@!%p0 wgmma.wait_group.sync.aligned 0;']),
    (lambda e: wgmma.mma_async(e.f4, e.rd, e.rd, pred=e.p),
     ['@%p0 wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%f1, %f2, %f3, %f4}, %rd0, %rd0, 1, 1, 1, 0, 0;']),
    (lambda e: wgmma.make_smem_desc(e.buf, 16, 1024, 128, pred=e.p),
     ['@%p0 mov.u32 %r1, buf;', '@%p0 and.b32 %r2, %r1, 0x3FFFF;', '@%p0 shr.u32 %r3, %r2, 4;', '@%p0 cvt.u64.u32 %rd1, %r3;', '@%p0 or.b64 %rd2, %rd1, 0x4000004000010000;']),
    (lambda e: cluster.ctarank(pred=e.p),
     ['@%p0 mov.u32 %r1, %cluster_ctarank;']),
    (lambda e: cluster.nctarank(pred=e.p),
     ['@%p0 mov.u32 %r1, %cluster_nctarank;']),
    (lambda e: cluster.map_shared(e.bar, 1, pred=e.p),
     ['@%p0 mapa.shared::cluster.u32 %r1, bar, 1;']),
    (lambda e: cluster.rank_of(e.r, pred=e.p),
     ['@%p0 getctarank.shared::cluster.u32 %r1, %r0;']),
    (lambda e: cluster.load(f32, e.r, pred=e.p),
     ['@%p0 ld.shared::cluster.f32 %f5, [%r0];']),
    (lambda e: cluster.store(e.r, e.f, pred=~e.p),
     ['@!%p0 st.shared::cluster.f32 [%r0], %f0;']),
    (lambda e: cluster.arrive_remote(ptx.addr(e.bar, 8), e.r, pred=e.p),
     ['@%p0 mapa.shared::cluster.u32 %r1, bar+8, %r0;', '@%p0 mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r1];']),
    (lambda e: cluster.arrive_remote(e.bar, 1, count=2),
     ['mapa.shared::cluster.u32 %r1, bar, 1;', 'mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r1], 2;']),
    (lambda e: cluster.arrive_multicast(e.bar, 0b101, pred=~e.p),
     ['@!%p0 mapa.shared::cluster.u32 %r1, bar, 0;', '@!%p0 mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r1];', '@!%p0 mapa.shared::cluster.u32 %r2, bar, 2;', '@!%p0 mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r2];']),
    (lambda e: ptx.bar_sync(1, 128, pred=e.p),
     ['@%p0 bar.sync 1, 128;']),
    (lambda e: ptx.bar_arrive(1, 128, pred=~e.p),
     ['@!%p0 bar.arrive 1, 128;']),
    (lambda e: ptx.fence("gpu", sem="acq_rel", pred=e.p),
     ['@%p0 fence.acq_rel.gpu;']),
    (lambda e: ptx.fence_proxy_async(pred=e.p),
     ['@%p0 fence.proxy.async.shared::cta;']),
    (lambda e: ptx.fence_proxy_async("shared::cluster"),
     ['fence.proxy.async.shared::cluster;']),
    (lambda e: ptx.fence_proxy_async("global", pred=~e.p),
     ['@!%p0 fence.proxy.async.global;']),
    (lambda e: ptx.fence_proxy_async(None, pred=e.p),
     ['@%p0 fence.proxy.async;']),
    (lambda e: ptx.fence_proxy_tensormap("release"),
     ['fence.proxy.tensormap::generic.release.gpu;']),
    (lambda e: ptx.fence_proxy_tensormap("acquire", "cluster", addr=e.rd, pred=e.p),
     ['@%p0 fence.proxy.tensormap::generic.acquire.cluster [%rd0], 128;']),
    (lambda e: ptx.fence_mbarrier_init(pred=e.p),
     ['@%p0 fence.mbarrier_init.release.cluster;']),
    (lambda e: ptx.cluster_arrive(relaxed=True, aligned=True, pred=e.p),
     ['@%p0 barrier.cluster.arrive.relaxed.aligned;']),
    (lambda e: ptx.cluster_wait(aligned=True, pred=e.p),
     ['@%p0 barrier.cluster.wait.aligned;']),
    (lambda e: ptx.cluster_sync(relaxed=True, pred=~e.p),
     ['@!%p0 barrier.cluster.arrive.relaxed;', '@!%p0 barrier.cluster.wait;']),
    (lambda e: cluster.arrive(relaxed=True),
     ['barrier.cluster.arrive.relaxed;']),
    (lambda e: ptx.grid_dependency_wait(pred=e.p),
     ['@%p0 griddepcontrol.wait;']),
    (lambda e: ptx.launch_dependents(pred=e.p),
     ['@%p0 griddepcontrol.launch_dependents;']),
    (lambda e: ptx.elect_sync(pred=e.p),
     ['@%p0 elect.sync _|%p1, 0xffffffff;']),
    (lambda e: ptx.setmaxnreg(232, pred=e.p),
     ['@%p0 setmaxnreg.inc.sync.aligned.u32 232;']),
    # ldmatrix / stmatrix
    (lambda e: ptx.ldmatrix(e.b4, e.buf),
     ['ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%b0, %b1, %b2, %b3}, [buf];']),
    (lambda e: ptx.ldmatrix(e.b4[:2], ptx.addr(e.buf, 16), trans=True, pred=e.p),
     ['@%p0 ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%b0, %b1}, [buf+16];']),
    (lambda e: ptx.ldmatrix([e.r], e.r, num=1),
     ['ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%r0}, [%r0];']),
    (lambda e: ptx.ldmatrix(e.hx, ptx.addr(e.r, 32), num=2, pred=~e.p),
     ['@!%p0 ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%hh0, %hh1}, [%r0+32];']),
    (lambda e: ptx.stmatrix(e.buf, e.b4, trans=True),
     ['stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [buf], {%b0, %b1, %b2, %b3};']),
    (lambda e: ptx.stmatrix(ptx.addr(e.buf, 4096), e.f4[:1], pred=e.p),
     ['@%p0 stmatrix.sync.aligned.m8n8.x1.shared.b16 [buf+4096], {%f1};']),
    # cp.async
    (lambda e: ptx.cp_async.copy(e.buf, e.rd, 16),
     ['cp.async.ca.shared.global [buf], [%rd0], 16;']),
    (lambda e: ptx.cp_async.copy(ptx.addr(e.buf, 32), ptx.addr(e.rd, 16), 16, cache="cg", src_size=e.r, pred=e.p),
     ['@%p0 cp.async.cg.shared.global [buf+32], [%rd0+16], 16, %r0;']),
    (lambda e: ptx.cp_async.copy(ptx.addr(e.small, 4), e.rd, 4, src_size=0, pred=~e.p),
     ['@!%p0 cp.async.ca.shared.global [small+4], [%rd0], 4, 0;']),
    (lambda e: ptx.cp_async.copy(ptx.addr(e.buf, 8), e.rd, 8),
     ['cp.async.ca.shared.global [buf+8], [%rd0], 8;']),
    (lambda e: ptx.cp_async.commit_group(pred=e.p),
     ['@%p0 cp.async.commit_group;']),
    (lambda e: ptx.cp_async.wait_group(2),
     ['cp.async.wait_group 2;']),
    (lambda e: ptx.cp_async.wait_all(pred=e.p),
     ['@%p0 cp.async.wait_all;']),
    # mma.sync
    (lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4),
     ['mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1, %f2, %f3, %f4}, {%b0, %b1, %b2, %b3}, {%b0, %b1}, {%f1, %f2, %f3, %f4};']),
    (lambda e: ptx.mma_sync(e.f4, e.b4[:2], [e.b4[2]], e.f4, shape="m16n8k8", pred=e.p),
     ['@%p0 mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%f1, %f2, %f3, %f4}, {%b0, %b1}, {%b2}, {%f1, %f2, %f3, %f4};']),
    (lambda e: ptx.mma_sync(e.hx, [*e.hx, *e.hx], e.hx, e.hx, dtype_ab="f16", dtype_d="f16"),
     ['mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%hh0, %hh1}, {%hh0, %hh1, %hh0, %hh1}, {%hh0, %hh1}, {%hh0, %hh1};']),
    (lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, dtype_ab="f16"),
     ['mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%b0, %b1, %b2, %b3}, {%b0, %b1}, {%f1, %f2, %f3, %f4};']),
    (lambda e: ptx.mma_sync(e.f4, e.b4[:2], e.b4[:1], e.f4, shape="m16n8k8", dtype_ab="f16"),
     ['mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%b0, %b1}, {%b0}, {%f1, %f2, %f3, %f4};']),
    (lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, shape="m16n8k8", dtype_ab="tf32"),
     ['mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1, %f2, %f3, %f4}, {%b0, %b1, %b2, %b3}, {%b0, %b1}, {%f1, %f2, %f3, %f4};']),
    (lambda e: ptx.mma_sync(e.f4, e.b4[:2], e.b4[:1], e.f4, shape="m16n8k4", dtype_ab="tf32"),
     ['mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32 {%f1, %f2, %f3, %f4}, {%b0, %b1}, {%b0}, {%f1, %f2, %f3, %f4};']),
    (lambda e: ptx.mma_sync(reg.array(s32, 4), e.b4, e.b4[:2], reg.array(s32, 4), shape="m16n8k32", dtype_ab="s8", dtype_d="s32"),
     ['mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%ri1, %ri2, %ri3, %ri4}, {%b0, %b1, %b2, %b3}, {%b0, %b1}, {%ri5, %ri6, %ri7, %ri8};']),
    (lambda e: ptx.mma_sync(reg.array(s32, 4), e.b4[:2], e.b4[:1], reg.array(s32, 4), shape="m16n8k16", dtype_ab=("u8", "s8"), dtype_d="s32", satfinite=True),
     ['mma.sync.aligned.m16n8k16.row.col.satfinite.s32.u8.s8.s32 {%ri1, %ri2, %ri3, %ri4}, {%b0, %b1}, {%b0}, {%ri5, %ri6, %ri7, %ri8};']),
    (lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, shape="m16n8k32", dtype_ab=("e4m3", "e5m2")),
     ['mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32 {%f1, %f2, %f3, %f4}, {%b0, %b1, %b2, %b3}, {%b0, %b1}, {%f1, %f2, %f3, %f4};']),
    # conversions
    (lambda e: ptx.pack_bf16x2(e.f4[0], e.f4[1]),
     ['cvt.rn.bf16x2.f32 %bhh1, %f2, %f1;']),
    (lambda e: ptx.pack_bf16x2(e.f, e.f4[3], relu=True, pred=e.p),
     ['@%p0 cvt.rn.relu.bf16x2.f32 %bhh1, %f4, %f0;']),
    (lambda e: ptx.pack_f16x2(e.f4[0], e.f4[1], pred=~e.p),
     ['@!%p0 cvt.rn.f16x2.f32 %hh2, %f2, %f1;']),
    (lambda e: ptx.unpack_bf16x2(e.bx),
     ['shl.b32 %f5, %bhh0, 16;', 'and.b32 %f6, %bhh0, 0xFFFF0000;']),
    (lambda e: ptx.unpack_f16x2(e.hx[1], pred=e.p),
     ['@%p0 mov.b32 {%h0, %h1}, %hh1;', '@%p0 cvt.f32.f16 %f5, %h0;', '@%p0 cvt.f32.f16 %f6, %h1;']),]


@pytest.mark.parametrize("case,expected", TEXT, ids=[f"L{c.__code__.co_firstlineno}" for c, _ in TEXT])
def test_emitted_text(case, expected):
    assert lines(traced(case)) == expected


def test_all_emitted_forms_assemble(assemble):
    """Every form of the table in one sm_90a kernel (a cluster of 2; PTX 8.4 for fp8 mma and
    the tensormap fence), through ptxas."""

    def case(e):
        for c, _ in TEXT:
            c(e)

    assemble(traced(case, cluster_dims=(2, 1, 1)).ptx())


NAMED = [mbarrier, tma, wgmma, cluster, sync, matrix, async_copy, mma, convert]


def test_every_named_helper_takes_pred():
    """Every public helper of the instruction modules accepts ``pred=`` (keyword only)."""
    missing = []
    for mod in NAMED:
        for name, fn in vars(mod).items():
            if name.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != mod.__name__:
                continue
            if name in ("pdl_prologue", "accumulator_count"):
                continue  # a block (not an instruction) and pure arithmetic
            param = inspect.signature(fn).parameters.get("pred")
            if param is None or param.kind is not inspect.Parameter.KEYWORD_ONLY:
                missing.append(f"{mod.__name__}.{name}")
    for fn in (ptx.elect_sync, ptx.setmaxnreg, cluster.arrive, cluster.wait, cluster.sync):
        if "pred" not in inspect.signature(fn).parameters:
            missing.append(fn.__name__)
    assert missing == []


# ------------------------------------------------------------------ guarded execution in the simulator
@pytest.fixture(scope="module")
def sim():
    global np
    np = pytest.importorskip("numpy")
    sys.path.insert(0, str(TESTS))
    import ptxsim

    return ptxsim


def test_guarded_mbarrier_helpers_run(sim):
    """Guards in the simulator: only thread 0 inits and arrives; the parity-1 wait is skipped
    by every thread (it would never complete: a deadlock if the guard were ignored or
    inverted), the parity-0 wait is taken by warp 1 only."""

    @pyptx.kernel([Tile(128, u32)], [Tile(128, u32)], block=(128, 1, 1), name="guarded")
    def k(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        bar = smem.alloc(b64, 1, align=8, name="bar")
        tid = ptx.special.tid.x()
        first = tid == 0
        mbarrier.init(bar, 1, pred=first)
        ptx.bar_sync(0)
        mbarrier.arrive(bar, pred=first)
        nobody = tid > 1000
        mbarrier.wait(bar, 1, pred=nobody)
        mbarrier.wait(bar, 0, pred=(tid >= 32) & (tid < 64))
        off = reg.scalar(u64)
        ptx.inst.mul.wide.u32(off, tid, 4)
        v = reg.scalar(u32)
        ptx.inst.ld.global_.u32(v, ptx.addr(px + off))
        ptx.inst.st.global_.u32(ptx.addr(py + off), v + 1)
        ptx.ret()

    xs = np.arange(128, dtype=np.uint32)
    (y,) = sim.run(k.specialize(), [xs])
    assert y.tolist() == (xs + 1).tolist()


def pack_kernel(n: int, relu: bool):
    """Thread t packs X[2t], X[2t+1] into one bf16x2 (stored to Y) and unpacks it into Z."""

    @pyptx.kernel([Tile(2 * n, f32)], [Tile(2 * n, bf16), Tile(2 * n, f32)], block=(n, 1, 1),
                  name="pack")
    def k(X, Y, Z):
        px, py, pz = ptx.global_ptrs(X, Y, Z)
        tid = ptx.special.tid.x()
        off = reg.scalar(u64)
        ptx.inst.mul.wide.u32(off, tid, 8)
        lo, hi = reg.scalar(f32), reg.scalar(f32)
        ptx.inst.ld.global_.v2.f32([lo, hi], ptx.addr(px + off))
        packed = ptx.pack_bf16x2(lo, hi, relu=relu)
        half = reg.scalar(u64)
        ptx.inst.mul.wide.u32(half, tid, 4)
        ptx.inst.st.global_.b32(ptx.addr(py + half), packed)
        a, b = ptx.unpack_bf16x2(packed)
        ptx.inst.st.global_.v2.f32(ptx.addr(pz + off), [a, b])
        ptx.ret()

    return k


@pytest.mark.parametrize("relu", [False, True])
def test_pack_bf16x2_orders_and_rounds(sim, assemble, relu):
    n = 64
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(2 * n) * 3).astype(np.float32)
    x[:4] = [1.0, -2.0, 1.00390625, 1.01171875]  # exact, exact, a tie to even down, a tie up
    k = pack_kernel(n, relu)
    y, z = sim.run(k.specialize(), [x])
    want = sim._bf16_rne(np.maximum(x, 0) if relu else x)
    assert y.tolist() == want.astype(np.uint16).tolist()  # element 0 is lo: memory order
    back = (want.astype(np.uint32) << 16).view(np.float32)
    assert z.view(np.float32).tolist() == back.tolist()
    assert y[:4].tolist() == ([0x3F80, 0, 0x3F80, 0x3F82] if relu else [0x3F80, 0xC000, 0x3F80, 0x3F82])
    assemble(k.ptx())


def ldmatrix_kernel(trans: bool):
    """One warp: thread t stores X[8t .. 8t+7] (row t // 2, columns 8 (t % 2) ..) of a 16 x 16
    b16 matrix into shared memory, then ``ldmatrix.x4`` reads the four 8x8 quadrants (lanes
    0-7: rows 0-7 at column 0, 8-15: rows 8-15, 16-23: rows 0-7 at column 8, 24-31: rows
    8-15 at column 8, the m16 x k16 A layout of ``mma``); each thread stores its 4 registers."""

    @pyptx.kernel([Tile(256, u16)], [Tile(128, u32)], block=(32, 1, 1), name="ldm")
    def k(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        buf = smem.alloc(b16, 256, align=16, name="buf")
        tid = ptx.special.tid.x()
        v = reg.array(b32, 4)
        off = reg.scalar(u64)
        ptx.inst.mul.wide.u32(off, tid, 16)
        ptx.inst.ld.global_.v4.b32(v, ptx.addr(px + off))
        ptx.inst.st.shared.v4.b32(ptx.addr(buf.addr() + tid * 16), v)
        ptx.bar_sync(0)
        lane = tid & 31
        row = (lane & 7) + ((lane >> 3) & 1) * 8
        col = (lane >> 4) * 8
        d = reg.array(b32, 4)
        ptx.ldmatrix(d, buf.addr() + row * 32 + col * 2, trans=trans)
        ptx.inst.st.global_.v4.b32(ptx.addr(py + off), d)
        ptx.ret()

    return k


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_runs_in_the_simulator(sim, assemble, trans):
    x = np.arange(256, dtype=np.uint16) * 3 + 1
    k = ldmatrix_kernel(trans)
    (y,) = sim.run(k.specialize(), [x])
    got = y.reshape(32, 4)
    m = x.reshape(16, 16).astype(np.uint32)
    lane = np.arange(32)
    g, c = lane // 4, 2 * (lane % 4)
    for i, (r0, c0) in enumerate([(0, 0), (8, 0), (0, 8), (8, 8)]):
        q = m[r0:r0 + 8, c0:c0 + 8]
        if trans:
            q = q.T
        want = q[g, c] | (q[g, c + 1] << 16)
        assert got[:, i].tolist() == want.tolist(), i
    assemble(k.ptx())


# ------------------------------------------------------------------ arch checks
# (arch, message fragment, case): each must raise TraceError naming this file and line.
ARCH = [
    ("sm_80", "ptx.wgmma.fence needs sm_90a, but this kernel targets sm_80", lambda e: wgmma.fence()),
    ("sm_90", "ptx.wgmma.mma_async needs sm_90a, but this kernel targets sm_90;", lambda e: wgmma.mma_async(e.f4, e.rd, e.rd)),
    ("sm_100a", "ptx.wgmma.commit_group needs sm_90a, but this kernel targets sm_100a", lambda e: wgmma.commit_group()),
    ("sm_90", "setmaxnreg needs sm_90a or a newer arch-specific target", lambda e: ptx.setmaxnreg(240)),
    ("sm_80", "setmaxnreg needs sm_90a", lambda e: ptx.setmaxnreg(240, inc=False)),
    ("sm_80", "ptx.mbarrier.arrive_expect_tx needs sm_90 or newer, but this kernel targets sm_80", lambda e: mbarrier.arrive_expect_tx(e.bar, 64)),
    ("sm_80", "ptx.mbarrier.expect_tx needs sm_90 or newer", lambda e: mbarrier.expect_tx(e.bar, 64)),
    ("sm_80", "ptx.mbarrier.try_wait_parity needs sm_90 or newer", lambda e: mbarrier.try_wait_parity(e.bar, 0)),
    ("sm_80", "ptx.mbarrier.wait needs sm_90 or newer", lambda e: mbarrier.wait(e.bar, 0)),
    ("sm_80", "ptx.mbarrier.arrive needs sm_90 or newer", lambda e: mbarrier.arrive(e.bar, 2)),
    ("sm_80", "ptx.mbarrier.arrive needs sm_90 or newer", lambda e: mbarrier.arrive(e.r, remote=True)),
    ("sm_75", "ptx.mbarrier.init needs sm_80 or newer, but this kernel targets sm_75", lambda e: mbarrier.init(e.bar, 1)),
    ("sm_80", "ptx.tma.load_tile needs sm_90 or newer", lambda e: tma.load_tile(e.buf, e.rd, (0,), e.bar)),
    ("sm_89", "ptx.tma.store_tile needs sm_90 or newer, but this kernel targets sm_89", lambda e: tma.store_tile(e.rd, (0,), e.buf)),
    ("sm_80", "ptx.tma.copy_bulk needs sm_90 or newer", lambda e: tma.copy_bulk(e.buf, e.rd, 16, e.bar)),
    ("sm_80", "ptx.tma.store_bulk needs sm_90", lambda e: tma.store_bulk(e.rd, e.buf, 16)),
    ("sm_80", "ptx.tma.commit_group needs sm_90", lambda e: tma.commit_group()),
    ("sm_80", "ptx.tma.wait_group needs sm_90", lambda e: tma.wait_group(0)),
    ("sm_80", "ptx.tma.prefetch_tensormap needs sm_90", lambda e: tma.prefetch_tensormap(e.rd)),
    ("sm_80", "ptx.tma.prefetch_tile needs sm_90", lambda e: tma.prefetch_tile(e.rd, (0, 0))),
    ("sm_75", "ptx.tma.cache_policy needs sm_80 or newer", lambda e: tma.cache_policy()),
    ("sm_80", "ptx.cluster.map_shared needs sm_90 or newer", lambda e: cluster.map_shared(e.bar, 0)),
    ("sm_80", "ptx.cluster.ctarank needs sm_90", lambda e: cluster.ctarank()),
    ("sm_80", "ptx.cluster.rank_of needs sm_90", lambda e: cluster.rank_of(e.r)),
    ("sm_80", "ptx.cluster.load needs sm_90", lambda e: cluster.load(f32, e.r)),
    ("sm_80", "ptx.cluster.store needs sm_90", lambda e: cluster.store(e.r, e.f)),
    ("sm_80", "ptx.cluster.arrive_remote needs sm_90", lambda e: cluster.arrive_remote(e.bar, 1)),
    ("sm_80", "ptx.cluster.arrive_multicast needs sm_90", lambda e: cluster.arrive_multicast(e.bar, 3)),
    ("sm_80", "cluster_arrive needs sm_90 or newer", lambda e: ptx.cluster_arrive(relaxed=True)),
    ("sm_80", "cluster_wait needs sm_90", lambda e: ptx.cluster_wait()),
    ("sm_80", "cluster_sync needs sm_90", lambda e: cluster.sync()),
    ("sm_80", "fence_proxy_async needs sm_90", lambda e: ptx.fence_proxy_async()),
    ("sm_80", "fence_proxy_tensormap needs sm_90", lambda e: ptx.fence_proxy_tensormap("release")),
    ("sm_80", "fence_mbarrier_init needs sm_90", lambda e: ptx.fence_mbarrier_init()),
    ("sm_80", "fence (scope='cluster') needs sm_90", lambda e: ptx.fence("cluster")),
    ("sm_80", "elect_sync needs sm_90 or newer, but this kernel targets sm_80", lambda e: ptx.elect_sync()),
    ("sm_80", "ptx.stmatrix needs sm_90 or newer", lambda e: ptx.stmatrix(e.buf, e.b4)),
    ("sm_70", "ptx.ldmatrix needs sm_75 or newer, but this kernel targets sm_70", lambda e: ptx.ldmatrix(e.b4, e.buf)),
    ("sm_75", "ptx.cp_async.copy needs sm_80 or newer", lambda e: ptx.cp_async.copy(e.buf, e.rd, 16)),
    ("sm_75", "ptx.cp_async.commit_group needs sm_80", lambda e: ptx.cp_async.commit_group()),
    ("sm_75", "ptx.cp_async.wait_group needs sm_80", lambda e: ptx.cp_async.wait_group(0)),
    ("sm_75", "ptx.cp_async.wait_all needs sm_80", lambda e: ptx.cp_async.wait_all()),
    ("sm_80", "ptx.mma_sync m16n8k32.e4m3 needs sm_89 or newer, but this kernel targets sm_80", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, shape="m16n8k32", dtype_ab="e4m3")),
    ("sm_75", "ptx.mma_sync m16n8k16.bf16 needs sm_80 or newer", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4)),
    ("sm_75", "ptx.mma_sync m16n8k8.bf16 needs sm_80", lambda e: ptx.mma_sync(e.f4, e.b4[:2], e.b4[:1], e.f4, shape="m16n8k8")),
    ("sm_75", "ptx.pack_bf16x2 needs sm_80", lambda e: ptx.pack_bf16x2(e.f, e.f)),
    ("sm_75", "ptx.pack_f16x2 needs sm_80", lambda e: ptx.pack_f16x2(e.f, e.f)),
]


@pytest.mark.parametrize("arch,fragment,case", ARCH, ids=[f"L{c.__code__.co_firstlineno}" for *_, c in ARCH])
def test_arch_errors(arch, fragment, case):
    with pytest.raises(TraceError) as ei:
        traced(case, arch=arch, version="7.8" if arch < "sm_90" else "8.4")
    msg = str(ei.value)
    assert msg.startswith(f"{case.__code__.co_filename}:{case.__code__.co_firstlineno}: "), msg
    assert fragment in msg, msg
    assert "@kernel(arch=...)" in msg


def test_ampere_forms_assemble_for_sm_80(assemble):
    """What sm_80 has is accepted there, and ptxas agrees."""

    def case(e):
        mbarrier.init(e.bar, 1, pred=e.p)
        mbarrier.arrive(e.bar)
        mbarrier.inval(e.bar)
        ptx.ldmatrix(e.b4, e.buf, trans=True)
        ptx.cp_async.copy(e.buf, e.rd, 16, cache="cg", src_size=8)
        ptx.cp_async.commit_group()
        ptx.cp_async.wait_group(0)
        ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4)
        ptx.mma_sync(reg.array(s32, 4), e.b4, e.b4[:2], reg.array(s32, 4), shape="m16n8k32",
                     dtype_ab="s8", dtype_d="s32")
        ptx.pack_bf16x2(e.f4[0], e.f4[1])
        ptx.unpack_f16x2(ptx.pack_f16x2(e.f4[2], e.f4[3]))
        tma.cache_policy()
        ptx.fence("gpu")
        ptx.bar_sync(0, pred=~e.p)

    assemble(traced(case, arch="sm_80", version="7.8").ptx(), arch="sm_80")


def test_arch_specific_targets_beyond_sm_90a():
    """setmaxnreg is allowed on later arch-specific targets; wgmma only on sm_90a."""
    assert lines(traced(lambda e: ptx.setmaxnreg(96, inc=False), arch="sm_100a", version="8.6")) == \
        ["setmaxnreg.dec.sync.aligned.u32 96;"]
    assert lines(traced(lambda e: ptx.cp_async.wait_all(), arch="sm_120")) == ["cp.async.wait_all;"]


# ------------------------------------------------------------------ validation errors
# Each case is a one-line lambda: the error must name this file and that very line.
ERRORS = [
    # pred=
    (TypeMismatchError, "ptx.mbarrier.init pred= must be a predicate register or ~p, got .u32 register %r0", lambda e: mbarrier.init(e.bar, 1, pred=e.r)),
    (OperandError, "ptx.tma.commit_group pred= must be a predicate register or ~p, got True", lambda e: tma.commit_group(pred=True)),
    (OperandError, "ptx.tma.prefetch_tile takes 1 to 5 tensor coordinates, got 6", lambda e: tma.prefetch_tile(e.rd, (0,) * 6)),
    (OperandError, "ptx.tma.prefetch_tile cache_hint must be a 64-bit cache-policy register", lambda e: tma.prefetch_tile(e.rd, (0, 0), cache_hint=3)),
    (OperandError, "ptx.wgmma.fence pred= must be a predicate register or ~p, got 1", lambda e: wgmma.fence(pred=1)),
    (TypeMismatchError, "ptx.ldmatrix pred= must be a predicate register or ~p, got .f32", lambda e: ptx.ldmatrix(e.b4, e.buf, pred=e.f)),
    (OperandError, "cluster_sync pred= must be a predicate register or ~p", lambda e: ptx.cluster_sync(pred="p")),
    (OperandError, "ptx.mbarrier.wait pred= must be a predicate register or ~p", lambda e: mbarrier.wait(e.bar, 0, pred=0)),
    # ldmatrix / stmatrix
    (OperandError, "ptx.ldmatrix dst_regs must hold 1, 2 or 4 32-bit registers (one per 8x8 matrix), got 3", lambda e: ptx.ldmatrix(e.b4[:3], e.buf)),
    (OperandError, "ptx.ldmatrix dst_regs must hold 2 32-bit registers (one per 8x8 matrix), got 4", lambda e: ptx.ldmatrix(e.b4, e.buf, num=2)),
    (OperandError, "ptx.ldmatrix num must be 1, 2 or 4, got 8", lambda e: ptx.ldmatrix(e.b4, e.buf, num=8)),
    (TypeMismatchError, "ptx.ldmatrix dst_regs[1] must be a 32-bit register (two b16 values), got .u64 register %rd0", lambda e: ptx.ldmatrix([e.r, e.rd], e.buf)),
    (TypeMismatchError, "ptx.ldmatrix dst_regs registers must all have one type (ptxas refuses mixed vectors); dst_regs[0] is .b32, dst_regs[1] is .f32", lambda e: ptx.ldmatrix([e.b4[0], e.f], e.buf)),
    (OperandError, "ptx.ldmatrix addr offset 8 into buf is not a multiple of 16 bytes", lambda e: ptx.ldmatrix(e.b4, ptx.addr(e.buf, 8))),
    (OperandError, "ptx.ldmatrix addr needs 16-byte aligned shared memory; small is declared with align=4", lambda e: ptx.ldmatrix(e.b4[:1], e.small)),
    (OperandError, "ptx.ldmatrix trans must be True or False, got 1", lambda e: ptx.ldmatrix(e.b4, e.buf, trans=1)),
    (OperandError, "ptx.ldmatrix dst_regs must be a register array (reg.array) or a list of registers, got Reg(%r0: u32)", lambda e: ptx.ldmatrix(e.r, e.buf)),
    (TypeMismatchError, "ptx.stmatrix src_regs[0] must be a 32-bit register (two b16 values), got .pred", lambda e: ptx.stmatrix(e.buf, [e.p])),
    (OperandError, "ptx.stmatrix addr must be a shared array, ptx.addr(...) of one, or a u32 shared address register, got 5", lambda e: ptx.stmatrix(5, e.b4)),
    # cp.async
    (OperandError, "ptx.cp_async.copy size must be 4, 8 or 16 bytes, got 12", lambda e: ptx.cp_async.copy(e.buf, e.rd, 12)),
    (OperandError, "ptx.cp_async.copy cache='cg' copies 16 bytes only, got size=8", lambda e: ptx.cp_async.copy(e.buf, e.rd, 8, cache="cg")),
    (OperandError, "ptx.cp_async.copy cache must be 'ca' or 'cg', got 'cs'", lambda e: ptx.cp_async.copy(e.buf, e.rd, 16, cache="cs")),
    (OperandError, "ptx.cp_async.copy src_size must be an int in 0..16 (bytes), got 17", lambda e: ptx.cp_async.copy(e.buf, e.rd, 16, src_size=17)),
    (TypeMismatchError, "ptx.cp_async.copy src_size must be a 32-bit integer register (u32/s32/b32) or an int, got .u64", lambda e: ptx.cp_async.copy(e.buf, e.rd, 16, src_size=e.rd)),
    (OperandError, "ptx.cp_async.copy dst_smem offset 8 into buf is not a multiple of 16 bytes", lambda e: ptx.cp_async.copy(ptx.addr(e.buf, 8), e.rd, 16)),
    (OperandError, "ptx.cp_async.copy dst_smem offset 16 (+4 bytes) is outside small (16 bytes)", lambda e: ptx.cp_async.copy(ptx.addr(e.small, 16), e.rd, 4)),
    (TypeMismatchError, "ptx.cp_async.copy src_global must be a 64-bit global address register (u64/b64), got .u32", lambda e: ptx.cp_async.copy(e.buf, e.r, 16)),
    (OperandError, "ptx.cp_async.wait_group n must be a non-negative int, got -1", lambda e: ptx.cp_async.wait_group(-1)),
    # mma.sync
    (OperandError, "ptx.mma_sync a needs 4 registers per thread here, got 2", lambda e: ptx.mma_sync(e.f4, e.b4[:2], e.b4[:2], e.f4)),
    (OperandError, "ptx.mma_sync b needs 1 registers per thread here, got 2", lambda e: ptx.mma_sync(e.f4, e.b4[:2], e.b4[:2], e.f4, shape="m16n8k8")),
    (OperandError, "ptx.mma_sync d needs 2 registers per thread here, got 4", lambda e: ptx.mma_sync(e.b4, e.b4, e.b4[:2], e.hx, dtype_ab="f16", dtype_d="f16")),
    (TypeMismatchError, "ptx.mma_sync d must be .f32 registers; d[0] is .b32 register %b0", lambda e: ptx.mma_sync(e.b4, e.b4, e.b4[:2], e.f4)),
    (TypeMismatchError, "ptx.mma_sync c must be .s32 (or u32/b32) registers; c[0] is .f32 register %f1", lambda e: ptx.mma_sync(e.b4, e.b4, e.b4[:2], e.f4, shape="m16n8k32", dtype_ab="s8", dtype_d="s32")),
    (TypeMismatchError, "ptx.mma_sync a must be .b32 registers (reg.array(b32, n)); a[0] is .f16x2 register %hh0", lambda e: ptx.mma_sync(e.f4, [*e.hx, *e.hx], e.b4[:2], e.f4)),
    (TypeMismatchError, "ptx.mma_sync b must be .b32 registers (reg.array(b32, n)); b[0] is .u32 register %r0", lambda e: ptx.mma_sync(e.f4, e.b4, [e.r, e.r], e.f4, dtype_ab="tf32", shape="m16n8k8")),
    (TypeMismatchError, "ptx.mma_sync d must be 32-bit registers holding f16 pairs (.f16x2 or .b32); d[0] is .u32", lambda e: ptx.mma_sync([e.r, e.r], e.b4, e.b4[:2], e.hx, dtype_ab="f16", dtype_d="f16")),
    (OperandError, "ptx.mma_sync with .bf16 inputs accumulates in .f32, got dtype_d='f16'", lambda e: ptx.mma_sync(e.hx, e.b4, e.b4[:2], e.hx, dtype_d="f16")),
    (OperandError, "ptx.mma_sync shape for .bf16 inputs must be one of m16n8k16, m16n8k8, got 'm16n8k32'", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, shape="m16n8k32")),
    (OperandError, "ptx.mma_sync dtype_ab must be one of f16, bf16, tf32, s8, u8, e4m3, e5m2, got 'f64'", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, dtype_ab="f64")),
    (OperandError, "ptx.mma_sync dtype_d must be one of f32, f16, s32, got 'f64'", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, dtype_d="f64")),
    (OperandError, "ptx.mma_sync A and B types must match except for int8 (s8/u8) or fp8 (e4m3/e5m2) mixes, got .f16 and .bf16", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, dtype_ab=("f16", "bf16"))),
    (OperandError, "ptx.mma_sync satfinite is only valid for s8/u8 inputs", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, satfinite=True)),
    (OperandError, "ptx.mma_sync c must be a register array (reg.array) or a list of registers, got 0", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], 0)),
    # conversions
    (TypeMismatchError, "ptx.pack_bf16x2 hi must be an f32 register, got .u32 register %r0", lambda e: ptx.pack_bf16x2(e.f, e.r)),
    (OperandError, "ptx.pack_f16x2 lo must be an f32 register, got 1.0", lambda e: ptx.pack_f16x2(1.0, e.f)),
    (OperandError, "ptx.pack_bf16x2 relu must be True or False, got 1", lambda e: ptx.pack_bf16x2(e.f, e.f, relu=1)),
    (TypeMismatchError, "ptx.unpack_bf16x2 expects a 32-bit packed register (bf16x2, f16x2 or b32), got .f32 register %f0", lambda e: ptx.unpack_bf16x2(e.f)),
    (OperandError, "ptx.unpack_f16x2 expects a 32-bit register holding two halves, got 3", lambda e: ptx.unpack_f16x2(3)),
    # fences and cluster arrives
    (OperandError, "fence_proxy_tensormap sem must be 'release' or 'acquire', got 'acq_rel'", lambda e: ptx.fence_proxy_tensormap("acq_rel")),
    (OperandError, "fence_proxy_tensormap scope must be one of ('cta', 'cluster', 'gpu', 'sys'), got 'grid'", lambda e: ptx.fence_proxy_tensormap("release", "grid")),
    (OperandError, "fence_proxy_tensormap 'acquire' needs addr=, the tensor map's u64 generic address", lambda e: ptx.fence_proxy_tensormap("acquire")),
    (OperandError, "fence_proxy_tensormap 'release' takes no addr, got addr=Reg(%rd0: u64)", lambda e: ptx.fence_proxy_tensormap("release", addr=e.rd)),
    (TypeMismatchError, "fence_proxy_tensormap addr must be a 64-bit global address register (u64/b64), got .u32", lambda e: ptx.fence_proxy_tensormap("acquire", addr=e.r)),
    (OperandError, "fence_proxy_async space must be one of", lambda e: ptx.fence_proxy_async("shared::gpu")),
    (OperandError, "ptx.cluster.arrive_remote rank must be an int in 0..15 (a CTA rank in the cluster), got 16", lambda e: cluster.arrive_remote(e.bar, 16)),
    (OperandError, "ptx.cluster.arrive_remote bar offset 4 into bar is not a multiple of 8 bytes", lambda e: cluster.arrive_remote(ptx.addr(e.bar, 4), 1)),
    (TypeMismatchError, "ptx.cluster.arrive_remote bar must be a 32-bit shared address register, got .u64 register %rd0", lambda e: cluster.arrive_remote(e.rd, 1)),
    (OperandError, "ptx.cluster.arrive_remote count must be an int in 1..1048575", lambda e: cluster.arrive_remote(e.bar, 1, count=0)),
    (OperandError, "ptx.cluster.arrive_multicast mask must be an int in 1..65535 (one bit per CTA rank), got 0", lambda e: cluster.arrive_multicast(e.bar, 0)),
    (OperandError, "ptx.cluster.arrive_multicast mask must be an int in 1..65535 (one bit per CTA rank), got Reg(%r0: u32)", lambda e: cluster.arrive_multicast(e.bar, e.r)),
    (OperandError, "cluster_sync relaxed must be True or False, got 'yes'", lambda e: ptx.cluster_sync(relaxed="yes")),
]


@pytest.mark.parametrize("exc,fragment,case", ERRORS,
                         ids=[f"L{c.__code__.co_firstlineno}" for _, _, c in ERRORS])
def test_validation_errors(exc, fragment, case):
    with pytest.raises(exc) as ei:
        traced(case)
    msg = str(ei.value)
    assert msg.startswith(f"{case.__code__.co_filename}:{case.__code__.co_firstlineno}: "), msg
    assert fragment in msg, msg


def test_errors_point_at_the_calling_line_in_a_def_body():
    def body(x):
        a = reg.array(b32, 3)
        ptx.ldmatrix(a, smem.alloc(bf16, 64, align=16))  # the line the error must name

    k = pyptx.kernel([Tile(16, f32)], block=(32, 1, 1))(body)
    with pytest.raises(OperandError) as ei:
        k.ptx()
    line = body.__code__.co_firstlineno + 2
    assert str(ei.value).startswith(f"{__file__}:{line}: ptx.ldmatrix dst_regs must hold")


def test_new_helpers_return_their_registers():
    got = {}

    def case(e):
        got["ld"] = ptx.ldmatrix(e.b4, e.buf)
        got["mma"] = ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4)
        got["pb"] = ptx.pack_bf16x2(e.f, e.f)
        got["ph"] = ptx.pack_f16x2(e.f, e.f)
        got["ub"] = ptx.unpack_bf16x2(got["pb"])
        got["b4"], got["f4"] = e.b4, e.f4

    traced(case)
    assert got["ld"] is got["b4"] and got["mma"] is got["f4"]
    assert got["pb"].type is bf16x2 and got["ph"].type is f16x2
    assert [r.type for r in got["ub"]] == [f32, f32]


# ------------------------------------------------------------------ a realistic Ampere-style tile loop
def mma_tile_kernel():
    """One warp: C(16x8, f32) = A(16x32, bf16, row-major) @ B(32x8, bf16, stored as B^T rows) by
    cp.async tiles into shared memory, ldmatrix fragments and two m16n8k16 mma.sync steps; the
    epilogue writes the accumulator fragment (thread t: rows t//4 and t//4 + 8, columns
    2*(t%4) and 2*(t%4)+1)."""

    @pyptx.kernel([Tile(16, 32, bf16), Tile(8, 32, bf16)], [Tile(16, 8, f32)], block=(32, 1, 1),
                  name="mma_tile")
    def k(A, B, C):
        pa, pb, pc = ptx.global_ptrs(A, B, C)
        a_s = smem.alloc(bf16, (16, 32), align=128, name="a_s")
        b_s = smem.alloc(bf16, (8, 32), align=128, name="b_s")
        lane = ptx.special.laneid()
        # A: 1024 bytes = 64 chunks of 16 bytes, two per lane; B: 512 bytes, one per lane
        for j in range(2):
            chunk = lane + 32 * j
            ptx.cp_async.copy(ptx.addr(a_s.addr() + chunk * 16), ptx.addr(pa + reg.from_(chunk * 16, u64)), 16)
        ptx.cp_async.copy(ptx.addr(b_s.addr() + lane * 16), ptx.addr(pb + reg.from_(lane * 16, u64)), 16,
                          cache="cg")
        ptx.cp_async.commit_group()
        ptx.cp_async.wait_group(0)
        ptx.bar_sync(0)
        acc = reg.array(f32, 4)
        acc[:] = 0.0
        row = lane & 15
        half = lane >> 4
        brow = lane & 7
        bhalf = (lane >> 3) & 1
        for kk in range(2):
            a = ptx.ldmatrix(reg.array(b32, 4), ptx.addr(a_s.addr() + row * 64 + half * 16 + kk * 32))
            b = ptx.ldmatrix(reg.array(b32, 2), ptx.addr(b_s.addr() + brow * 64 + bhalf * 16 + kk * 32))
            ptx.mma_sync(acc, a, b, acc)
        r0 = lane >> 2
        col = (lane & 3) * 2
        for i, (dr, dc) in enumerate(((0, 0), (0, 1), (8, 0), (8, 1))):
            off = reg.from_(((r0 + dr) * 8 + col + dc) * 4, u64)
            ptx.inst.st.global_.f32(ptx.addr(pc + off), acc[i])
        ptx.ret()

    return k


def test_mma_tile_kernel_assembles(assemble):
    text = mma_tile_kernel().ptx()
    assert text.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == 2
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in text
    assert "ldmatrix.sync.aligned.m8n8.x2.shared.b16" in text
    assert "cp.async.cg.shared.global" in text and "cp.async.wait_group 0;" in text
    assemble(text)
