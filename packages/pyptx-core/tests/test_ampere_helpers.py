"""The Ampere helpers' new forms: ``ptx.mma_sync`` with every operand layout PTX allows
(``m8n8k4`` f16: row/col for A and B each), C and D of different types for f16 inputs and
the ``m8n8k16`` int8 shape; and the simulator's model of ``mma.sync``, ``ldmatrix`` and the
``cp.async`` ring those kernels use.

Each form is checked for the exact text it emits, ptxas for sm_80 accepting it, and its
refusals (class, message, the user's file:line first); the simulator's numbers against
float64 and its ordering checks (reads before ``cp.async.wait_group``, refills before a
``bar.sync``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import pyptx
from pyptx import OperandError, Tile, TraceError, TypeMismatchError, ptx, reg, smem
from pyptx.ptx.mma import LAYOUTS, SHAPES
from pyptx.types import b16, b32, f32, s32, u16, u32, u64

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
import ptxsim  # noqa: E402
from test_tensorcore_helpers import lines, traced  # noqa: E402

# ------------------------------------------------------------------ emitted text
TEXT = [
    (lambda e: ptx.mma_sync(reg.array(f32, 8), e.b4[:2], e.b4[2:], reg.array(f32, 8), shape="m8n8k4", dtype_ab="f16", layout=("row", "row")),
     ['mma.sync.aligned.m8n8k4.row.row.f32.f16.f16.f32 {%f5, %f6, %f7, %f8, %f9, %f10, %f11, %f12}, {%b0, %b1}, {%b2, %b3}, {%f13, %f14, %f15, %f16, %f17, %f18, %f19, %f20};']),
    (lambda e: ptx.mma_sync(reg.array(f32, 8), e.b4[:2], e.b4[2:], reg.array(f32, 8), shape="m8n8k4", dtype_ab="f16", layout=("col", "col"), pred=e.p),
     ['@%p0 mma.sync.aligned.m8n8k4.col.col.f32.f16.f16.f32 {%f5, %f6, %f7, %f8, %f9, %f10, %f11, %f12}, {%b0, %b1}, {%b2, %b3}, {%f13, %f14, %f15, %f16, %f17, %f18, %f19, %f20};']),
    (lambda e: ptx.mma_sync(e.b4, e.b4[:2], e.b4[2:], e.b4, shape="m8n8k4", dtype_ab="f16", dtype_d="f16", layout=("col", "row")),
     ['mma.sync.aligned.m8n8k4.col.row.f16.f16.f16.f16 {%b0, %b1, %b2, %b3}, {%b0, %b1}, {%b2, %b3}, {%b0, %b1, %b2, %b3};']),
    (lambda e: ptx.mma_sync(reg.array(f32, 8), e.b4[:2], e.b4[2:], e.b4, shape="m8n8k4", dtype_ab="f16", dtype_c="f16", layout=("row", "col")),
     ['mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f16 {%f5, %f6, %f7, %f8, %f9, %f10, %f11, %f12}, {%b0, %b1}, {%b2, %b3}, {%b0, %b1, %b2, %b3};']),
    (lambda e: ptx.mma_sync(reg.array(s32, 2), [e.r], [e.r], reg.array(s32, 2), shape="m8n8k16", dtype_ab=("s8", "u8"), dtype_d="s32", satfinite=True),
     ['mma.sync.aligned.m8n8k16.row.col.satfinite.s32.s8.u8.s32 {%ri1, %ri2}, {%r0}, {%r0}, {%ri3, %ri4};']),
    (lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, layout=["row", "col"]),
     ['mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1, %f2, %f3, %f4}, {%b0, %b1, %b2, %b3}, {%b0, %b1}, {%f1, %f2, %f3, %f4};']),
]


@pytest.mark.parametrize("case,want", TEXT, ids=[f"L{c.__code__.co_firstlineno}" for c, _ in TEXT])
def test_emitted_text_and_ptxas_sm80(case, want, assemble):
    spec = traced(case, arch="sm_80", version="8.4")
    assert lines(spec)[-len(want):] == want
    assemble(spec.ptx(), arch="sm_80")


def test_every_layout_of_every_shape_assembles_for_sm80(assemble):
    """One kernel with each (shape, type, layout) the table allows on sm_80 (fp8 needs sm_89)."""
    def case(e):
        for (shape, t), (na, nb, sm) in SHAPES.items():
            if sm > 80:
                continue
            intish = t in ("s8", "u8")
            td = "s32" if intish else "f32"
            nacc = 8 if shape == "m8n8k4" else 2 if shape == "m8n8k16" else 4
            at, bt = (s32, u32) if intish else (f32, b32)
            for lay in LAYOUTS[(shape, t)]:
                ptx.mma_sync(reg.array(at, nacc), reg.array(bt, na), reg.array(bt, nb),
                             reg.array(at, nacc), shape=shape, dtype_ab=t, dtype_d=td, layout=lay)

    spec = traced(case, arch="sm_80", version="8.4")
    text = spec.ptx()
    for lay in ("row.row", "row.col", "col.row", "col.col"):
        assert f"mma.sync.aligned.m8n8k4.{lay}.f32.f16.f16.f32" in text
    assemble(text, arch="sm_80")


# ------------------------------------------------------------------ refusals
ERRORS = [
    (OperandError, "ptx.mma_sync m16n8k16.bf16 allows layout row.col only, got col.col", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, layout=("col", "col"))),
    (OperandError, "ptx.mma_sync m16n8k8.f16 allows layout row.col only, got row.row", lambda e: ptx.mma_sync(e.f4, e.b4[:2], e.b4[:1], e.f4, shape="m16n8k8", dtype_ab="f16", layout=("row", "row"))),
    (OperandError, "ptx.mma_sync layout must be an (A, B) pair of 'row'/'col', got 'row'", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, layout="row")),
    (OperandError, "ptx.mma_sync layout must be an (A, B) pair of 'row'/'col', got ('row', 'T')", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, layout=("row", "T"))),
    (OperandError, "ptx.mma_sync dtype_c may differ from dtype_d only as an f16 C with an f32 D of m8n8k4 f16, got dtype_c='f16' and dtype_d='f32' for m16n8k16.bf16", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.hx, dtype_c="f16")),
    (OperandError, "got dtype_c='f16' and dtype_d='f32' for m16n8k8.f16", lambda e: ptx.mma_sync(e.f4, e.b4[:2], e.b4[:1], e.hx, shape="m16n8k8", dtype_ab="f16", dtype_c="f16")),
    (OperandError, "got dtype_c='f32' and dtype_d='f16' for m8n8k4.f16", lambda e: ptx.mma_sync(e.b4, e.b4[:2], e.b4[2:], reg.array(f32, 8), shape="m8n8k4", dtype_ab="f16", dtype_d="f16", dtype_c="f32")),
    (OperandError, "ptx.mma_sync dtype_c must be one of f32, f16, s32, got 'x'", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4[:2], e.f4, dtype_c="x")),
    (OperandError, "ptx.mma_sync d needs 8 registers per thread here, got 4", lambda e: ptx.mma_sync(e.f4, e.b4[:2], e.b4[2:], e.f4, shape="m8n8k4", dtype_ab="f16")),
    (OperandError, "ptx.mma_sync b needs 2 registers per thread here, got 1", lambda e: ptx.mma_sync(reg.array(f32, 8), e.b4[:2], e.b4[:1], reg.array(f32, 8), shape="m8n8k4", dtype_ab="f16")),
    (TypeMismatchError, "ptx.mma_sync c must be 32-bit registers holding f16 pairs (.f16x2 or .b32); c[0] is .f32", lambda e: ptx.mma_sync(reg.array(f32, 8), e.b4[:2], e.b4[2:], e.f4, shape="m8n8k4", dtype_ab="f16", dtype_c="f16")),
    (OperandError, "ptx.mma_sync shape for .s8 inputs must be one of m16n8k16, m16n8k32, m8n8k16, got 'm8n8k4'", lambda e: ptx.mma_sync(e.f4, e.b4, e.b4, e.f4, shape="m8n8k4", dtype_ab="s8", dtype_d="s32")),
]


@pytest.mark.parametrize("exc,fragment,case", ERRORS,
                         ids=[f"L{c.__code__.co_firstlineno}" for _, _, c in ERRORS])
def test_refusals_name_the_user_line(exc, fragment, case):
    with pytest.raises(exc) as ei:
        traced(case, arch="sm_80")
    msg = str(ei.value)
    assert msg.startswith(f"{case.__code__.co_filename}:{case.__code__.co_firstlineno}: "), msg
    assert fragment in msg, msg


def test_m8n8k4_needs_sm70_and_m8n8k16_needs_sm75():
    with pytest.raises(TraceError, match="ptx.mma_sync m8n8k16.s8 needs sm_75 or newer, but this kernel targets sm_70"):
        traced(lambda e: ptx.mma_sync(reg.array(s32, 2), [e.r], [e.r], reg.array(s32, 2), shape="m8n8k16", dtype_ab="s8", dtype_d="s32"), arch="sm_70")
    spec = traced(lambda e: ptx.mma_sync(e.b4, e.b4[:2], e.b4[2:], e.b4, shape="m8n8k4", dtype_ab="f16", dtype_d="f16", layout=("col", "col")), arch="sm_70", version="8.4")
    assert "m8n8k4.col.col" in spec.ptx()


# ------------------------------------------------------------------ simulator: mma.sync
def mma_tile_kernel(shape: str, dt: str, acc: str, b_trans: bool):
    """One warp: A (16 x k) and B stored as ``(8, k)`` (n-major, ``ldmatrix``) or ``(k, 8)``
    (k-major, ``ldmatrix.trans``) b16 words go to shared memory, ``ldmatrix`` loads the
    fragments, ``mma.sync`` adds C (f32 or f16 pairs) and every thread stores its D words."""
    k = int(shape.split("k")[1])
    nacc = 4 if acc == "f32" else 2
    wt = f32 if acc == "f32" else b32

    @pyptx.kernel([Tile(16 * k, u16), Tile(8 * k, u16), Tile(32 * nacc, u32)],
                  [Tile(32 * nacc, u32)], block=(32, 1, 1), arch="sm_80", name="mma1")
    def kern(A, B, C, D):
        pa, pb, pc, pd = ptx.global_ptrs(A, B, C, D)
        sa = smem.alloc(b16, 16 * k, align=128, name="sa")
        sb = smem.alloc(b16, 8 * k, align=128, name="sb")
        lane = ptx.special.tid.x()
        off = reg.scalar(u64)
        for buf, src, n in ((sa, pa, 16 * k), (sb, pb, 8 * k)):  # 16-byte words, 8 per row
            for w in range(0, n // 8, 32):
                word = lane + w
                with ptx.if_(word < n // 8):
                    ptx.inst.mul.wide.u32(off, word, 16)
                    v = reg.array(b32, 4)
                    ptx.inst.ld.global_.v4.b32(v, ptx.addr(src + off))
                    ptx.inst.st.shared.v4.b32(ptx.addr(buf.addr() + word * 16), v)
        ptx.bar_sync(0)
        a = reg.array(b32, k // 4)
        row, col = lane & 15, (lane >> 4) * 8
        ptx.ldmatrix(a, sa.addr() + row * (2 * k) + col * 2)
        b = reg.array(b32, k // 8)
        if b_trans:   # rows are k: lanes 0-7 rows 0-7, 8-15 rows 8-15
            ptx.ldmatrix(b, sb.addr() + (lane & (k - 1)) * 16, trans=True)
        else:         # rows are n: lanes 0-7 k 0-7, lanes 8-15 k 8-15
            ptx.ldmatrix(b, sb.addr() + (lane & 7) * (2 * k) + ((lane >> 3) & 1) * 16)
        c = reg.array(wt, nacc)
        ptx.inst.mul.wide.u32(off, lane, 4 * nacc)
        getattr(ptx.inst.ld.global_, f"v{nacc}").b32(c, ptx.addr(pc + off))
        d = reg.array(wt, nacc)
        ptx.mma_sync(d, a, b, c, shape=shape, dtype_ab=dt, dtype_d=acc)
        getattr(ptx.inst.st.global_, f"v{nacc}").b32(ptx.addr(pd + off), d)
        ptx.ret()

    return kern


@pytest.mark.parametrize("shape,dt,acc,b_trans", [
    ("m16n8k16", "bf16", "f32", False), ("m16n8k16", "f16", "f32", True),
    ("m16n8k8", "bf16", "f32", True), ("m16n8k16", "f16", "f16", False)])
def test_mma_sync_in_the_simulator_matches_float64(shape, dt, acc, b_trans, assemble):
    k = int(shape.split("k")[1])
    rng = np.random.default_rng(k + len(dt))
    a = rng.standard_normal((16, k))
    b = rng.standard_normal((k, 8))
    cm = rng.standard_normal((16, 8))
    ab, bb = ptxsim.device_bits(a, dt), ptxsim.device_bits(b.T if not b_trans else b, dt)
    lane = np.arange(32)
    g, t2 = lane // 4, 2 * (lane % 4)
    pos = [(g, t2), (g, t2 + 1), (g + 8, t2), (g + 8, t2 + 1)]   # D's fragment, low half first
    if acc == "f32":
        cw = np.stack([cm[r, q] for r, q in pos], 1).astype(np.float32).view(np.uint32)
    else:
        h = np.stack([cm[r, q] for r, q in pos], 1).astype(np.float16).view(np.uint16)
        cw = h[:, 0::2].astype(np.uint32) | (h[:, 1::2].astype(np.uint32) << 16)
    kern = mma_tile_kernel(shape, dt, acc, b_trans)
    (dw,) = ptxsim.run(kern.specialize(), [ab.reshape(-1), bb.reshape(-1), cw.reshape(-1)])
    af = ptxsim.host_f64(ab, dt).reshape(16, k)
    bf = ptxsim.host_f64(bb, dt).reshape(b.T.shape if not b_trans else b.shape)
    cf = np.stack([cm[r, q] for r, q in pos], 1)       # C as the device holds it, per lane
    cf = cf.astype(np.float32 if acc == "f32" else np.float16).astype(np.float64)
    want = af @ (bf.T if not b_trans else bf)
    if acc == "f32":
        got = dw.reshape(32, 4).view(np.float32).astype(np.float64)
        ref = np.stack([want[r, q] for r, q in pos], 1) + cf
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    else:
        w = dw.reshape(32, 2)
        got = np.stack([w & 0xFFFF, w >> 16], 2).reshape(32, 4).astype(np.uint16)
        got = got.view(np.float16).astype(np.float64)
        ref = np.stack([want[r, q] for r, q in pos], 1) + cf
        np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3)
    out = assemble(kern.ptx(), arch="sm_80")
    assert "spill" not in out or "0 bytes spill" in out


# ------------------------------------------------------------------ simulator: cp.async
def cp_async_kernel(mode: str):
    """One warp copies 32 x 16 bytes with ``cp.async`` (lane ``i`` copies word ``i``, its last
    ``i % 17`` bytes zero-filled through ``src_size``), then reads back word ``(i + 1) % 32``.
    ``mode``: "ok" (wait_group 0, bar.sync, read), "no_wait" (read before the wait),
    "no_bar" (waits, but reads another thread's word with no bar.sync), "refill" (reads,
    then copies into the words again without a bar.sync)."""

    @pyptx.kernel([Tile(128, u32)], [Tile(128, u32)], block=(32, 1, 1), arch="sm_80",
                  name="cpa")
    def kern(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        buf = smem.alloc(b32, 128, align=16, name="buf")
        lane = ptx.special.tid.x()
        off = reg.scalar(u64)
        ptx.inst.mul.wide.u32(off, lane, 16)
        n = reg.scalar(u32)
        ptx.inst.rem.u32(n, lane, 17)
        keep = reg.scalar(u32)
        ptx.inst.sub.u32(keep, 16, n)
        ptx.cp_async.copy(ptx.addr(buf.addr() + lane * 16), ptx.addr(px + off), 16,
                          cache="cg", src_size=keep)
        ptx.cp_async.commit_group()
        if mode != "no_wait":
            ptx.cp_async.wait_group(0)
        if mode not in ("no_bar", "no_wait"):
            ptx.bar_sync(0)
        nxt = reg.scalar(u32)
        ptx.inst.add.u32(nxt, lane, 1)
        ptx.inst.and_.b32(nxt, nxt, 31)
        v = reg.array(b32, 4)
        ptx.inst.ld.shared.v4.b32(v, ptx.addr(buf.addr() + nxt * 16))
        if mode == "refill":
            ptx.cp_async.copy(ptx.addr(buf.addr() + lane * 16), ptx.addr(px + off), 16)
            ptx.cp_async.wait_all()
        ptx.inst.st.global_.v4.b32(ptx.addr(py + off), v)
        ptx.ret()

    return kern


def test_cp_async_copies_with_zero_fill(assemble):
    x = np.arange(128, dtype=np.uint32) * 0x01010101 + 0x10203
    (y,) = ptxsim.run(cp_async_kernel("ok").specialize(), [x])
    xb = x.view(np.uint8).reshape(32, 16).copy()
    for i in range(32):
        xb[i, 16 - i % 17:] = 0
    want = np.roll(xb, -1, axis=0).reshape(-1).view(np.uint32)
    assert y.tolist() == want.tolist()
    assemble(cp_async_kernel("ok").ptx(), arch="sm_80")


@pytest.mark.parametrize("mode,msg", [
    ("no_wait", "a cp.async is still filling"),
    ("no_bar", "needs a bar.sync after that thread's cp.async.wait_group"),
    ("refill", "cp.async overwrites buf"),
])
def test_cp_async_ordering_is_checked(mode, msg):
    x = np.arange(128, dtype=np.uint32)
    with pytest.raises(ptxsim.SimError, match=msg):
        ptxsim.run(cp_async_kernel(mode).specialize(), [x])
