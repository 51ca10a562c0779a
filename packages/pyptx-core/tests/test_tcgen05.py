"""``ptx.tcgen05`` (Blackwell, untested on hardware): the exact text each helper emits, ptxas
for sm_100a accepting every form, the instruction descriptor's bits, the Blackwell
shared-memory descriptor of ``OperandTile``, and the refusals (class, message, the user's
file:line).
"""

from __future__ import annotations

import os

import pytest

import pyptx
from pyptx import ConfigError, OperandError, Tile, TraceError, TypeMismatchError, ptx, reg, smem
from pyptx.operand import OperandTile
from pyptx.ptx import tcgen05
from pyptx.types import b16, b32, b64, bf16, f32, pred, u32, u64

HERE = os.path.basename(__file__)
IDESC = tcgen05.InstrDescriptor(m=128, n=64)


class Env:
    """Operands: t=%r0 (u32 TMEM address), rd=%rd0 (u64 descriptor), p=%p0, h=%rs0 (b16),
    f=%f0 (f32), slot (4 x b32 shared, align 16), bar (b64 shared, align 8), regs (8 x b32)."""

    def __init__(self):
        self.t = reg.scalar(u32)
        self.rd = reg.scalar(u64)
        self.p = reg.scalar(pred)
        self.h = reg.scalar(b16)
        self.f = reg.scalar(f32)
        self.slot = smem.alloc(b32, 4, align=16, name="slot")
        self.bar = smem.alloc(b64, 1, align=8, name="bar")
        self.regs = reg.array(b32, 8)


def traced(case, arch="sm_100a", cluster_dims=(1, 1, 1)):
    def body(x):
        case(Env())

    return pyptx.kernel([Tile(16, f32)], block=(128, 1, 1), cluster=cluster_dims, arch=arch,
                        name="k")(body).specialize()


def lines(spec) -> list[str]:
    return [st.text() for st in spec.module.functions[0].body]


R8 = "{" + ", ".join(f"%b{i}" for i in range(8)) + "}"
R4 = "{" + ", ".join(f"%b{i}" for i in range(4)) + "}"

TEXT = [
    (lambda e: tcgen05.alloc(e.slot, 128),
     ["tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [slot], 128;"]),
    (lambda e: tcgen05.alloc(e.slot, 512, cta_group=2, pred=e.p),
     ["@%p0 tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32 [slot], 512;"]),
    (lambda e: tcgen05.alloc(e.slot, 32).address(), ["tcgen05.alloc.cta_group::1.sync.aligned."
                                                     "shared::cta.b32 [slot], 32;",
                                                     "ld.shared.b32 %b8, [slot];"]),
    (lambda e: tcgen05.alloc(e.slot, 64).dealloc(e.t),
     ["tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [slot], 64;",
      "tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r0, 64;"]),
    (lambda e: tcgen05.dealloc(e.t, 256, cta_group=2, pred=~e.p),
     ["@!%p0 tcgen05.dealloc.cta_group::2.sync.aligned.b32 %r0, 256;"]),
    (lambda e: tcgen05.relinquish_alloc_permit(),
     ["tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;"]),
    (lambda e: tcgen05.relinquish_alloc_permit(cta_group=2, pred=e.p),
     ["@%p0 tcgen05.relinquish_alloc_permit.cta_group::2.sync.aligned;"]),
    (lambda e: tcgen05.mma(e.t, e.rd, e.rd, IDESC, enable_input_d=e.p),
     [f"mov.b32 %r1, 0x{IDESC.value:08X};", "mov.b32 %b8, %r0;",
      "tcgen05.mma.cta_group::1.kind::f16 [%b8], %rd0, %rd0, %r1, %p0;"]),
    (lambda e: tcgen05.mma(e.regs[0], e.rd, e.rd, IDESC, enable_input_d=1),
     [f"mov.b32 %r1, 0x{IDESC.value:08X};",
      "tcgen05.mma.cta_group::1.kind::f16 [%b0], %rd0, %rd0, %r1, 1;"]),
    (lambda e: tcgen05.mma(e.t, e.t, e.rd, IDESC, enable_input_d=1, pred=e.p),
     [f"@%p0 mov.b32 %r1, 0x{IDESC.value:08X};", "@%p0 mov.b32 %b8, %r0;",
      "@%p0 mov.b32 %b9, %r0;",
      "@%p0 tcgen05.mma.cta_group::1.kind::f16 [%b8], [%b9], %rd0, %r1, 1;"]),
    (lambda e: tcgen05.mma(e.t, e.rd, e.rd, e.t, enable_input_d=0, kind="tf32", cta_group=1),
     ["mov.b32 %b8, %r0;", "tcgen05.mma.cta_group::1.kind::tf32 [%b8], %rd0, %rd0, %r0, 0;"]),
    (lambda e: tcgen05.mma(e.t, e.rd, e.rd, tcgen05.InstrDescriptor(
        kind="f8f6f4", dtype_a="e4m3", dtype_b="e5m2"), enable_input_d=~e.p),
     [f"mov.b32 %r1, 0x{tcgen05.InstrDescriptor(kind='f8f6f4', dtype_a='e4m3', dtype_b='e5m2').value:08X};",
      "mov.b32 %b8, %r0;", "tcgen05.mma.cta_group::1.kind::f8f6f4 [%b8], %rd0, %rd0, %r1, !%p0;"]),
    (lambda e: tcgen05.commit(e.bar),
     ["tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [bar];"]),
    (lambda e: tcgen05.commit(e.bar, pred=e.p),
     ["@%p0 tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [bar];"]),
    (lambda e: tcgen05.commit(e.bar, multicast_mask=e.h),
     ["tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.multicast::cluster"
      ".b64 [bar], %rs0;"]),
    (lambda e: tcgen05.commit(e.bar, cta_group=2, multicast_mask=3),
     ["mov.b16 %rs1, 3;",
      "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster"
      ".b64 [bar], %rs1;"]),
    (lambda e: tcgen05.ld(e.regs, e.t), [f"tcgen05.ld.sync.aligned.32x32b.x8.b32 {R8}, [%r0];"]),
    (lambda e: tcgen05.ld(e.regs, e.t, shape="16x256b", pred=e.p),
     [f"@%p0 tcgen05.ld.sync.aligned.16x256b.x2.b32 {R8}, [%r0];"]),
    (lambda e: tcgen05.ld(e.regs, e.t, shape="16x128b", num=4, pack16=True),
     [f"tcgen05.ld.sync.aligned.16x128b.x4.pack::16b.b32 {R8}, [%r0];"]),
    (lambda e: tcgen05.ld(e.regs, e.t, shape="16x64b"),
     [f"tcgen05.ld.sync.aligned.16x64b.x8.b32 {R8}, [%r0];"]),
    (lambda e: tcgen05.ld(e.regs, e.t, shape="16x32bx2", offset=16),
     [f"tcgen05.ld.sync.aligned.16x32bx2.x8.b32 {R8}, [%r0], 16;"]),
    (lambda e: tcgen05.st(e.t, e.regs[:4]), [f"tcgen05.st.sync.aligned.32x32b.x4.b32 [%r0], {R4};"]),
    (lambda e: tcgen05.st(e.t, e.regs, shape="16x32bx2", offset=8, unpack16=True, pred=e.p),
     [f"@%p0 tcgen05.st.sync.aligned.16x32bx2.x8.unpack::16b.b32 [%r0], 8, {R8};"]),
    (lambda e: tcgen05.cp(e.t, e.rd), ["tcgen05.cp.cta_group::1.128x256b [%r0], %rd0;"]),
    (lambda e: tcgen05.cp(e.t, e.rd, shape="32x128b.warpx4", cta_group=2, pred=e.p),
     ["@%p0 tcgen05.cp.cta_group::2.32x128b.warpx4 [%r0], %rd0;"]),
    (lambda e: tcgen05.cp(e.t, e.rd, shape="64x128b.warpx2::01_23"),
     ["tcgen05.cp.cta_group::1.64x128b.warpx2::01_23 [%r0], %rd0;"]),
    (lambda e: tcgen05.shift(e.t), ["tcgen05.shift.cta_group::1.down [%r0];"]),
    (lambda e: tcgen05.wait_ld(), ["tcgen05.wait::ld.sync.aligned;"]),
    (lambda e: tcgen05.wait_st(pred=e.p), ["@%p0 tcgen05.wait::st.sync.aligned;"]),
    (lambda e: tcgen05.fence_before_thread_sync(), ["tcgen05.fence::before_thread_sync;"]),
    (lambda e: tcgen05.fence_after_thread_sync(pred=e.p),
     ["@%p0 tcgen05.fence::after_thread_sync;"]),
]


@pytest.mark.parametrize("case,expected", TEXT, ids=[f"L{c.__code__.co_firstlineno}" for c, _ in TEXT])
def test_emitted_text(case, expected):
    assert lines(traced(case)) == expected


def _uses_cta_pair(case) -> bool:
    return any("cta_group::2" in t for c, texts in TEXT if c is case for t in texts)


@pytest.mark.parametrize("group", [1, 2])
def test_all_emitted_forms_assemble_for_sm_100a(assemble, group):
    """Every form of the table through ptxas for sm_100a: one kernel of the cta_group::1
    forms, one (a cluster of 2) of the cta_group::2 forms (ptxas refuses a mix)."""

    def case(e):
        for c, _ in TEXT:
            if _uses_cta_pair(c) == (group == 2):
                c(e)
        tile = OperandTile(128, 64, bf16)
        sa = smem.alloc(bf16, (128, 64), align=1024, name="sa")
        d = tile.descriptor(sa, 1, target="tcgen05")
        tcgen05.mma(e.t, d, d, tcgen05.InstrDescriptor(m=128 * group, n=256, cta_group=group),
                    enable_input_d=1)

    ptx_text = traced(case, cluster_dims=(group, 1, 1)).ptx()
    assert ptx_text.count(f"cta_group::{group}") >= (4 if group == 1 else 6)
    assemble(ptx_text, arch="sm_100a")


def test_instruction_descriptor_bits():
    d = tcgen05.InstrDescriptor(m=128, n=256)
    assert d.value == (1 << 4) | (1 << 7) | (1 << 10) | (32 << 17) | (8 << 24)
    assert d.k == 16 and d.tmem_columns == 256
    f16 = tcgen05.InstrDescriptor(m=64, n=8, dtype_a="f16", dtype_b="f16", dtype_d="f16",
                                  major_a="MN", major_b="MN", negate_a=True, negate_b=True)
    assert f16.value == (1 << 13) | (1 << 14) | (1 << 15) | (1 << 16) | (1 << 17) | (4 << 24)
    tf = tcgen05.InstrDescriptor(kind="tf32", dtype_a="tf32", dtype_b="tf32", m=256, n=32,
                                 cta_group=2)
    assert tf.value == (1 << 4) | (2 << 7) | (2 << 10) | (4 << 17) | (16 << 24) and tf.k == 8
    fp4 = tcgen05.InstrDescriptor(kind="f8f6f4", dtype_a="e2m1", dtype_b="e3m2")
    assert (fp4.value >> 7) & 7 == 5 and (fp4.value >> 10) & 7 == 4 and fp4.k == 32


def test_blackwell_smem_descriptor_is_hoppers_plus_the_version_bit():
    for major, sw in (("K", 128), ("K", 64), ("K", 32), ("K", None), ("MN", 128), ("MN", None)):
        t = OperandTile(64, 64, bf16, major=major, swizzle=sw)
        assert t.descriptor_constant("tcgen05") == t.descriptor_constant() | (1 << 46)
    t = OperandTile(128, 64, bf16)
    assert t.descriptor_constant("tcgen05") >> 61 == 2  # Blackwell's SWIZZLE_128B code

    def case(e):
        sa = smem.alloc(bf16, (128, 64), align=1024, name="sa")
        t.descriptor(sa, target="tcgen05")

    assert lines(traced(case))[-1].endswith(f"0x{t.descriptor_constant('tcgen05'):016X};")


def test_tmem_allocation_knows_its_columns():
    got = {}

    def case(e):
        got["a"] = tcgen05.alloc(e.slot, 256, cta_group=2)

    traced(case, cluster_dims=(2, 1, 1))
    assert got["a"].ncols == 256 and got["a"].cta_group == 2


ERRORS = [
    (OperandError, "ncols must be a power of 2 in 32..512, got 96", lambda e: tcgen05.alloc(e.slot, 96)),
    (OperandError, "ncols must be a power of 2 in 32..512, got 1024", lambda e: tcgen05.dealloc(e.t, 1024)),
    (OperandError, "cta_group must be 1 or 2, got 4", lambda e: tcgen05.relinquish_alloc_permit(cta_group=4)),
    (TypeMismatchError, "slot must be a 32/64-bit integer register holding a shared address, got .f32", lambda e: tcgen05.alloc(e.f, 32)),
    (TypeMismatchError, "taddr must be a u32 tensor-memory address register (lane << 16 | column, e.g. TmemAllocation.address()), got .u64 register %rd0", lambda e: tcgen05.dealloc(e.rd, 32)),
    (OperandError, "d_tmem must be a u32 tensor-memory address register", lambda e: tcgen05.mma(5, e.rd, e.rd, IDESC, enable_input_d=1)),
    (TypeMismatchError, "b_desc must be a u64 shared-memory matrix descriptor register (OperandTile.descriptor(..., target='tcgen05')), got .u32 register %r0", lambda e: tcgen05.mma(e.t, e.rd, e.t, IDESC, enable_input_d=1)),
    (TypeMismatchError, "a must be a u64 shared-memory matrix descriptor or a u32 TMEM address register, got .f32", lambda e: tcgen05.mma(e.t, e.f, e.rd, IDESC, enable_input_d=1)),
    (TypeMismatchError, "enable_input_d must be a predicate register, ~p, 0 or 1, got .u32 register %r0", lambda e: tcgen05.mma(e.t, e.rd, e.rd, IDESC, enable_input_d=e.t)),
    (OperandError, "enable_input_d must be a predicate register, ~p, 0 or 1, got 2", lambda e: tcgen05.mma(e.t, e.rd, e.rd, IDESC, enable_input_d=2)),
    (OperandError, "kind='tf32' disagrees with the InstrDescriptor's kind='f16'", lambda e: tcgen05.mma(e.t, e.rd, e.rd, IDESC, enable_input_d=1, kind="tf32")),
    (OperandError, "cta_group=2 disagrees with the InstrDescriptor's cta_group=1", lambda e: tcgen05.mma(e.t, e.rd, e.rd, IDESC, enable_input_d=1, cta_group=2)),
    (OperandError, "with idesc in a register needs kind= one of f16, tf32, f8f6f4, got None", lambda e: tcgen05.mma(e.t, e.rd, e.rd, e.t, enable_input_d=1)),
    (OperandError, "with idesc in a register needs cta_group= 1 or 2", lambda e: tcgen05.mma(e.t, e.rd, e.rd, e.t, enable_input_d=1, kind="f16")),
    (TypeMismatchError, "idesc must be an InstrDescriptor or a u32 register, got .u64", lambda e: tcgen05.mma(e.t, e.rd, e.rd, e.rd, enable_input_d=1)),
    (OperandError, "idesc must be a tcgen05.InstrDescriptor or a u32 register, got 5", lambda e: tcgen05.mma(e.t, e.rd, e.rd, 5, enable_input_d=1)),
    (OperandError, "A in tensor memory must be K-major", lambda e: tcgen05.mma(e.t, e.t, e.rd, tcgen05.InstrDescriptor(major_a="MN"), enable_input_d=1)),
    (OperandError, "bar offset 4 into slot is not a multiple of 8 bytes", lambda e: tcgen05.commit(ptx.addr(e.slot, 4))),
    (OperandError, "multicast_mask must be an int in 1..65535, got 0", lambda e: tcgen05.commit(e.bar, multicast_mask=0)),
    (TypeMismatchError, "multicast_mask must be a 16-bit register or an int, got .u32 register %r0", lambda e: tcgen05.commit(e.bar, multicast_mask=e.t)),
    (OperandError, "shape must be one of 32x32b, 16x64b, 16x128b, 16x256b, 16x32bx2, got '32x64b'", lambda e: tcgen05.ld(e.regs, e.t, shape="32x64b")),
    (OperandError, "num must be a power of 2 in 1..32 for 16x256b, got 64", lambda e: tcgen05.ld(reg.array(b32, 256), e.t, shape="16x256b")),
    (OperandError, "num must be a power of 2 in 1..128 for 32x32b, got 3", lambda e: tcgen05.ld(e.regs[:3], e.t)),
    (OperandError, "16x128b.x2 moves 4 32-bit registers per thread, got 8", lambda e: tcgen05.ld(e.regs, e.t, shape="16x128b", num=2)),
    (TypeMismatchError, "registers must be 32-bit; regs[0] is .u64 register %rd0", lambda e: tcgen05.st(e.t, [e.rd])),
    (OperandError, "offset must be an int in 0..65535 (the second half's column offset, needed by 16x32bx2), got None", lambda e: tcgen05.ld(e.regs, e.t, shape="16x32bx2")),
    (OperandError, "offset is only for shape 16x32bx2, got offset=4 with 32x32b", lambda e: tcgen05.st(e.t, e.regs, offset=4)),
    (OperandError, "pack16 must be True or False, got 1", lambda e: tcgen05.ld(e.regs, e.t, pack16=1)),
    (OperandError, "shape must be one of 128x256b, 4x256b", lambda e: tcgen05.cp(e.t, e.rd, shape="64x128b")),
    (TypeMismatchError, "s_desc must be a u64 shared-memory matrix descriptor register, got .u32", lambda e: tcgen05.cp(e.t, e.t)),
    (TypeMismatchError, "taddr must be a u32 tensor-memory address register", lambda e: tcgen05.shift(e.f)),
    (TypeMismatchError, "pred= must be a predicate register or ~p, got .u32 register %r0", lambda e: tcgen05.wait_ld(pred=e.t)),
    (ConfigError, "InstrDescriptor n must be a multiple of 16 in 16..256 for m=128, cta_group=1, got 72", lambda e: tcgen05.InstrDescriptor(n=72)),
    (ConfigError, "InstrDescriptor n must be a multiple of 16 in 32..256 for m=256, cta_group=2, got 16", lambda e: tcgen05.InstrDescriptor(m=256, n=16, cta_group=2)),
    (ConfigError, "InstrDescriptor m must be 64 or 128 with cta_group=1, got 256", lambda e: tcgen05.InstrDescriptor(m=256)),
    (ConfigError, "InstrDescriptor kind must be one of f16, tf32, f8f6f4, got 'i8'", lambda e: tcgen05.InstrDescriptor(kind="i8")),
    (ConfigError, "InstrDescriptor dtype_a for kind 'f16' must be one of f16, bf16, got 'tf32'", lambda e: tcgen05.InstrDescriptor(dtype_a="tf32")),
    (ConfigError, "InstrDescriptor kind 'f16' needs A and B of one type, got 'f16' and 'bf16'", lambda e: tcgen05.InstrDescriptor(dtype_a="f16")),
    (ConfigError, "InstrDescriptor kind 'tf32' accumulates in f32, got dtype_d='f16'", lambda e: tcgen05.InstrDescriptor(kind="tf32", dtype_a="tf32", dtype_b="tf32", dtype_d="f16")),
    (ConfigError, "InstrDescriptor sub-byte types (e2m3, e3m2, e2m1) must be K-major", lambda e: tcgen05.InstrDescriptor(kind="f8f6f4", dtype_a="e2m1", dtype_b="e4m3", major_b="MN")),
    (ConfigError, "InstrDescriptor negate_a must be True or False, got 1", lambda e: tcgen05.InstrDescriptor(negate_a=1)),
    (OperandError, "OperandTile descriptor target must be 'wgmma' or 'tcgen05', got 'umma'", lambda e: OperandTile(64, 64, bf16).descriptor_constant("umma")),
]


@pytest.mark.parametrize("exc,fragment,case", ERRORS,
                         ids=[f"L{c.__code__.co_firstlineno}" for _, _, c in ERRORS])
def test_validation_errors(exc, fragment, case):
    with pytest.raises(exc) as ei:
        traced(case)
    msg = str(ei.value)
    line = case.__code__.co_firstlineno
    assert msg.startswith(f"{case.__code__.co_filename}:{line}: "), msg
    assert fragment in msg, msg


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100", "sm_120a", "sm_80"])
def test_helpers_refuse_a_non_blackwell_arch(arch):
    def case(e):
        tcgen05.fence_after_thread_sync()  # the line the error must name

    with pytest.raises(TraceError) as ei:
        traced(case, arch=arch)
    line = case.__code__.co_firstlineno + 1
    msg = str(ei.value)
    assert msg.startswith(f"{__file__}:{line}: ptx.tcgen05.fence_after_thread_sync needs an "
                          f"arch-specific Blackwell target"), msg
    assert f"this kernel targets {arch}" in msg


def test_every_emitted_form_is_a_spelling_of_the_instruction_table():
    """Where ``ptx.tcgen05`` and ``ptx.inst`` overlap they agree: each tcgen05 instruction the
    helpers emit (both cta groups) is accepted by the raw layer's row, operand count and
    target included."""
    from types import SimpleNamespace

    from pyptx.errors import PyptxError
    from pyptx.ir import Instruction
    from pyptx.ptx._check import Form

    bad = []
    for group in (1, 2):
        def case(e, group=group):
            for c, _ in TEXT:
                if _uses_cta_pair(c) == (group == 2):
                    c(e)

        spec = traced(case, cluster_dims=(group, 1, 1))
        target = SimpleNamespace(arch=spec.arch, version=spec.module.version)
        for st in spec.module.functions[0].body:
            if type(st) is not Instruction or not st.opcode.startswith("tcgen05"):
                continue
            try:
                form = Form(st.opcode)
                form.check_target(target)
                assert form.nmin <= len(st.operands) <= form.nmax, st.text()
            except PyptxError as e:
                bad.append(f"{st.text()}: {e}")
    assert not bad, "\n".join(bad)
