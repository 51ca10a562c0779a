"""A broad matrix of real PTX instruction forms, emitted through the DSL and assembled by
ptxas for sm_90a.

Every form is one DSL call (or a few) that must emit exactly the listed opcodes. Forms are
grouped by category; each category becomes one kernel that ptxas assembles once, so the
file stays fast. When a category's kernel is rejected, each of its forms is assembled on its
own to name the ones at fault.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest

import pyptx
from pyptx import Tile, ptx, reg, smem
from pyptx.ir import Instruction
from pyptx.trace import current
from pyptx.types import (
    b16,
    b32,
    b64,
    bf16,
    bf16x2,
    f16,
    f16x2,
    f32,
    f64,
    pred,
    s32,
    s64,
    u8,
    u16,
    u32,
    u64,
)


class Env:
    """Registers every form may read, set up (initialized) by the preamble of each kernel."""


def preamble(X, Y) -> Env:
    e = Env()
    e.gx, e.gy = ptx.global_ptrs(X, Y)
    e.tid = ptx.special.tid.x()
    e.r = reg.scalar(u32, e.tid)
    e.r2 = reg.scalar(u32, 3)
    e.s = reg.scalar(s32, -5)
    e.ud = reg.scalar(u64, 1000)
    e.sd = reg.scalar(s64, -7)
    e.b = reg.scalar(b32, 0xF0F0)
    e.bd = reg.scalar(b64, 0xFF)
    e.us = reg.scalar(u16, 9)
    e.f = reg.scalar(f32, 1.5)
    e.g = reg.scalar(f32, 0.25)
    e.d = reg.scalar(f64, 2.0)
    e.h = reg.scalar(f16, 0.5)
    e.h2 = reg.scalar(f16x2, 1.0)
    e.bh = reg.scalar(bf16, 0.5)
    e.bh2 = reg.scalar(bf16x2, 1.0)
    e.p = e.tid < 16
    e.q = e.tid > 3
    e.buf = smem.alloc(f32, 1024, align=128, name="buf")
    e.sa = e.buf.addr()
    e.mbar = smem.alloc(u64, 1, align=8, name="mbar")
    e.mba = e.mbar.addr()
    e.lbl = ptx.label("skip")
    return e


def n(t):
    """A fresh destination register."""
    return reg.scalar(t)


def A(base, off=0):
    return ptx.addr(base, off)


@dataclass(frozen=True)
class Form:
    cat: str
    expect: tuple[str, ...]
    fn: Callable[[Env], object]
    id: str


FORMS: list[Form] = []


def F(cat: str, expect: str | tuple[str, ...], fn: Callable[[Env], object]) -> None:
    exp = (expect,) if isinstance(expect, str) else tuple(expect)
    FORMS.append(Form(cat, exp, fn, f"{cat}:{'+'.join(dict.fromkeys(exp))}"))


I = ptx.inst  # noqa: E741

# ---------------------------------------------------------------- integer arithmetic
F("int", "add.u32", lambda e: I.add.u32(n(u32), e.r, 7))
F("int", "add.s32", lambda e: I.add.s32(n(s32), e.s, -1))
F("int", "add.u64", lambda e: I.add.u64(n(u64), e.ud, e.ud))
F("int", "add.s64", lambda e: I.add.s64(n(s64), e.sd, 1 << 40))
F("int", "sub.u32", lambda e: I.sub.u32(n(u32), e.r, e.r2))
F("int", "sub.s64", lambda e: I.sub.s64(n(s64), e.sd, e.sd))
F("int", "mul.lo.u32", lambda e: I.mul.lo.u32(n(u32), e.r, e.r2))
F("int", "mul.lo.s32", lambda e: I.mul.lo.s32(n(s32), e.s, 3))
F("int", "mul.hi.u32", lambda e: I.mul.hi.u32(n(u32), e.r, e.r2))
F("int", "mul.wide.u32", lambda e: I.mul.wide.u32(n(u64), e.r, 4))
F("int", "mul.wide.s32", lambda e: I.mul.wide.s32(n(s64), e.s, e.s))
F("int", "mul.lo.u64", lambda e: I.mul.lo.u64(n(u64), e.ud, 3))
F("int", "mad.lo.u32", lambda e: I.mad.lo.u32(n(u32), e.r, e.r2, 5))
F("int", "mad.lo.s32", lambda e: I.mad.lo.s32(n(s32), e.s, e.s, e.s))
F("int", "mad.wide.u32", lambda e: I.mad.wide.u32(n(u64), e.r, e.r2, e.ud))
F("int", "mad.hi.u32", lambda e: I.mad.hi.u32(n(u32), e.r, e.r2, e.r))
F("int", "div.u32", lambda e: I.div.u32(n(u32), e.r, e.r2))
F("int", "rem.s32", lambda e: I.rem.s32(n(s32), e.s, 3))
F("int", ("add.cc.u32", "addc.u32"),
  lambda e: (I.add.cc.u32(n(u32), e.r, e.r2), I.addc.u32(n(u32), e.r, 0)))
F("int", "min.u32", lambda e: I.min.u32(n(u32), e.r, e.r2))
F("int", "max.s32", lambda e: I.max.s32(n(s32), e.s, 0))
F("int", "min.u64", lambda e: I.min.u64(n(u64), e.ud, 7))
F("int", "abs.s32", lambda e: I.abs.s32(n(s32), e.s))
F("int", "neg.s32", lambda e: I.neg.s32(n(s32), e.s))
F("int", "neg.s64", lambda e: I.neg.s64(n(s64), e.sd))
F("int", "add.u16", lambda e: I.add.u16(n(u16), e.us, 1))
F("int", "sad.u32", lambda e: I.sad.u32(n(u32), e.r, e.r2, 0))
F("int", ("add.u32", "mul.lo.u32", "shl.b32", "setp.lt.u32"),  # operator sugar
  lambda e: ((e.r + 1) * e.r2 << 2) < 64)

# ---------------------------------------------------------------- floating point arithmetic
F("float", "add.f32", lambda e: I.add.f32(n(f32), e.f, e.g))
F("float", "add.rn.f32", lambda e: I.add.rn.f32(n(f32), e.f, 0.5))
F("float", "add.ftz.f32", lambda e: I.add.ftz.f32(n(f32), e.f, e.g))
F("float", "add.sat.f32", lambda e: I.add.sat.f32(n(f32), e.f, e.g))
F("float", "sub.f32", lambda e: I.sub.f32(n(f32), e.f, 1))
F("float", "mul.rn.f32", lambda e: I.mul.rn.f32(n(f32), e.f, 0.1))
F("float", "fma.rn.f32", lambda e: I.fma.rn.f32(n(f32), e.f, e.g, 1.0))
F("float", "fma.rn.ftz.sat.f32", lambda e: I.fma.rn.ftz.sat.f32(n(f32), e.f, e.g, e.f))
F("float", "div.rn.f32", lambda e: I.div.rn.f32(n(f32), e.f, e.g))
F("float", "div.approx.f32", lambda e: I.div.approx.f32(n(f32), e.f, e.g))
F("float", "div.full.f32", lambda e: I.div.full.f32(n(f32), e.f, e.g))
F("float", "add.f64", lambda e: I.add.f64(n(f64), e.d, 1 / 3))
F("float", "mul.rn.f64", lambda e: I.mul.rn.f64(n(f64), e.d, e.d))
F("float", "fma.rn.f64", lambda e: I.fma.rn.f64(n(f64), e.d, e.d, 0.5))
F("float", "div.rn.f64", lambda e: I.div.rn.f64(n(f64), e.d, e.d))
F("float", "add.f16", lambda e: I.add.f16(n(f16), e.h, e.h))
F("float", "mul.f16", lambda e: I.mul.f16(n(f16), e.h, e.h))
F("float", "fma.rn.f16", lambda e: I.fma.rn.f16(n(f16), e.h, e.h, e.h))
F("float", "add.f16x2", lambda e: I.add.f16x2(n(f16x2), e.h2, e.h2))
F("float", "fma.rn.f16x2", lambda e: I.fma.rn.f16x2(n(f16x2), e.h2, e.h2, e.h2))
F("float", "add.rn.bf16", lambda e: I.add.rn.bf16(n(bf16), e.bh, e.bh))
F("float", "mul.rn.bf16", lambda e: I.mul.rn.bf16(n(bf16), e.bh, e.bh))
F("float", "fma.rn.bf16", lambda e: I.fma.rn.bf16(n(bf16), e.bh, e.bh, e.bh))
F("float", "fma.rn.bf16x2", lambda e: I.fma.rn.bf16x2(n(bf16x2), e.bh2, e.bh2, e.bh2))
F("float", "sub.bf16x2", lambda e: I.sub.bf16x2(n(bf16x2), e.bh2, e.bh2))
F("float", "min.f32", lambda e: I.min.f32(n(f32), e.f, e.g))
F("float", "max.f32", lambda e: I.max.f32(n(f32), e.f, 0.0))
F("float", "max.f64", lambda e: I.max.f64(n(f64), e.d, e.d))
F("float", "min.f16", lambda e: I.min.f16(n(f16), e.h, e.h))
F("float", "max.bf16", lambda e: I.max.bf16(n(bf16), e.bh, e.bh))
F("float", "max.NaN.f32", lambda e: I.max.NaN.f32(n(f32), e.f, e.g))
F("float", "abs.f32", lambda e: I.abs.f32(n(f32), e.f))
F("float", "abs.f64", lambda e: I.abs.f64(n(f64), e.d))
F("float", "neg.f32", lambda e: I.neg.f32(n(f32), e.f))
F("float", "neg.f16x2", lambda e: I.neg.f16x2(n(f16x2), e.h2))
F("float", "abs.bf16", lambda e: I.abs.bf16(n(bf16), e.bh))
F("float", ("add.f32", "div.rn.f32", "add.f16", "mov.b16", "add.f16", "add.bf16"),  # sugar
  lambda e: ((e.f + e.g) / e.g, e.h + e.h, e.h + 2.0, e.bh + e.bh))

# ---------------------------------------------------------------- comparisons and selects
F("setp", "setp.lt.u32", lambda e: I.setp.lt.u32(n(pred), e.r, 100))
F("setp", "setp.ge.s32", lambda e: I.setp.ge.s32(n(pred), e.s, e.s))
F("setp", "setp.eq.u64", lambda e: I.setp.eq.u64(n(pred), e.ud, 0))
F("setp", "setp.ne.b32", lambda e: I.setp.ne.b32(n(pred), e.b, 0))
F("setp", "setp.lt.f32", lambda e: I.setp.lt.f32(n(pred), e.f, 0.5))
F("setp", "setp.gtu.f32", lambda e: I.setp.gtu.f32(n(pred), e.f, e.g))
F("setp", "setp.nan.f32", lambda e: I.setp.nan.f32(n(pred), e.f, e.g))
F("setp", "setp.le.f64", lambda e: I.setp.le.f64(n(pred), e.d, 1.0))
F("setp", "setp.lt.and.u32", lambda e: I.setp.lt.and_.u32(n(pred), e.r, e.r2, e.p))
F("setp", "setp.eq.or.s32", lambda e: I.setp.eq.or_.s32(n(pred), e.s, 0, ~e.p))
F("setp", "setp.eq.f16", lambda e: I.setp.eq.f16(n(pred), e.h, e.h))
F("setp", "setp.lt.bf16", lambda e: I.setp.lt.bf16(n(pred), e.bh, e.bh))
F("setp", "setp.lt.u32 (p|q)", lambda e: I.setp.lt.u32(f"{n(pred).name}|{n(pred).name}", e.r, 1))
F("setp", "selp.u32", lambda e: I.selp.u32(n(u32), e.r, 0, e.p))
F("setp", "selp.f32", lambda e: I.selp.f32(n(f32), 1.0, e.f, e.p))
F("setp", "selp.b64", lambda e: I.selp.b64(n(b64), e.bd, 0, ~e.q))
F("setp", "slct.f32.s32", lambda e: I.slct.f32.s32(n(f32), e.f, e.g, e.s))
F("setp", "set.lt.u32.f32", lambda e: I.set.lt.u32.f32(n(u32), e.f, e.g))

# ---------------------------------------------------------------- conversions
F("cvt", "cvt.rn.f32.s32", lambda e: I.cvt.rn.f32.s32(n(f32), e.s))
F("cvt", "cvt.rn.f32.u32", lambda e: I.cvt.rn.f32.u32(n(f32), e.r))
F("cvt", "cvt.rzi.s32.f32", lambda e: I.cvt.rzi.s32.f32(n(s32), e.f))
F("cvt", "cvt.rni.s32.f32", lambda e: I.cvt.rni.s32.f32(n(s32), e.f))
F("cvt", "cvt.rzi.f32.f32", lambda e: I.cvt.rzi.f32.f32(n(f32), e.f))
F("cvt", "cvt.rn.f16.f32", lambda e: I.cvt.rn.f16.f32(n(f16), e.f))
F("cvt", "cvt.f32.f16", lambda e: I.cvt.f32.f16(n(f32), e.h))
F("cvt", "cvt.rn.bf16.f32", lambda e: I.cvt.rn.bf16.f32(n(bf16), e.f))
F("cvt", "cvt.f32.bf16", lambda e: I.cvt.f32.bf16(n(f32), e.bh))
F("cvt", "cvt.rn.f32.f64", lambda e: I.cvt.rn.f32.f64(n(f32), e.d))
F("cvt", "cvt.f64.f32", lambda e: I.cvt.f64.f32(n(f64), e.f))
F("cvt", "cvt.rn.f64.s64", lambda e: I.cvt.rn.f64.s64(n(f64), e.sd))
F("cvt", "cvt.u64.u32", lambda e: I.cvt.u64.u32(n(u64), e.r))
F("cvt", "cvt.s64.s32", lambda e: I.cvt.s64.s32(n(s64), e.s))
F("cvt", "cvt.u32.u64", lambda e: I.cvt.u32.u64(n(u32), e.ud))
F("cvt", "cvt.u16.u32", lambda e: I.cvt.u16.u32(n(u16), e.r))
F("cvt", "cvt.u8.u32", lambda e: I.cvt.u8.u32(n(u8), e.r))
F("cvt", "cvt.sat.s32.s64", lambda e: I.cvt.sat.s32.s64(n(s32), e.sd))
F("cvt", "cvt.rn.f16x2.f32", lambda e: I.cvt.rn.f16x2.f32(n(f16x2), e.f, e.g))
F("cvt", "cvt.rn.bf16x2.f32", lambda e: I.cvt.rn.bf16x2.f32(n(bf16x2), e.f, e.g))
F("cvt", "cvt.rna.tf32.f32", lambda e: I.cvt.rna.tf32.f32(n(b32), e.f))
F("cvt", "cvt.rn.satfinite.e4m3x2.f32", lambda e: I.cvt.rn.satfinite.e4m3x2.f32(n(b16), e.f, e.g))
F("cvt", "cvt.rn.satfinite.e5m2x2.f32", lambda e: I.cvt.rn.satfinite.e5m2x2.f32(n(b16), e.f, e.g))
F("cvt", ("cvt.rn.f32.u32", "cvt.rzi.s32.f32", "cvt.rn.bf16.f32", "cvt.u64.u32"),  # reg.from_
  lambda e: (reg.from_(e.r, f32), reg.from_(e.f, s32), reg.from_(e.f, bf16), reg.from_(e.r, u64)))

# ---------------------------------------------------------------- bit manipulation
F("bits", "and.b32", lambda e: I.and_.b32(n(b32), e.b, 0xFF))
F("bits", "or.b32", lambda e: I.or_.b32(n(b32), e.b, e.r))
F("bits", "xor.b32", lambda e: I.xor.b32(n(b32), e.b, 0xFFFFFFFF))
F("bits", "not.b32", lambda e: I.not_.b32(n(b32), e.b))
F("bits", "and.b64", lambda e: I.and_.b64(n(b64), e.bd, e.bd))
F("bits", "and.pred", lambda e: I.and_.pred(n(pred), e.p, e.q))
F("bits", "or.pred", lambda e: I.or_.pred(n(pred), e.p, ~e.q))
F("bits", "not.pred", lambda e: I.not_.pred(n(pred), e.p))
F("bits", "shl.b32", lambda e: I.shl.b32(n(b32), e.b, 4))
F("bits", "shl.b64", lambda e: I.shl.b64(n(b64), e.bd, e.r2))
F("bits", "shr.u32", lambda e: I.shr.u32(n(u32), e.r, 1))
F("bits", "shr.s32", lambda e: I.shr.s32(n(s32), e.s, e.r2))
F("bits", "shf.l.wrap.b32", lambda e: I.shf.l.wrap.b32(n(b32), e.b, e.b, 8))
F("bits", "bfe.u32", lambda e: I.bfe.u32(n(u32), e.r, 8, 4))
F("bits", "bfe.s32", lambda e: I.bfe.s32(n(s32), e.s, 0, 16))
F("bits", "bfi.b32", lambda e: I.bfi.b32(n(b32), e.b, e.b, 8, 4))
F("bits", "prmt.b32", lambda e: I.prmt.b32(n(b32), e.b, e.r, 0x3210))
F("bits", "prmt.b32.f4e", lambda e: I.prmt.b32.f4e(n(b32), e.b, e.r, e.r2))
F("bits", "popc.b32", lambda e: I.popc.b32(n(u32), e.b))
F("bits", "popc.b64", lambda e: I.popc.b64(n(u32), e.bd))
F("bits", "clz.b32", lambda e: I.clz.b32(n(u32), e.b))
F("bits", "clz.b64", lambda e: I.clz.b64(n(u32), e.bd))
F("bits", "brev.b32", lambda e: I.brev.b32(n(b32), e.b))
F("bits", "bfind.u32", lambda e: I.bfind.u32(n(u32), e.r))
F("bits", "lop3.b32", lambda e: I.lop3.b32(n(b32), e.b, e.r, e.r2, 0xF8))
F("bits", "cnot.b32", lambda e: I.cnot.b32(n(b32), e.b))
F("bits", ("and.b32", "xor.b32", "or.b32", "not.b32", "shr.u32", "and.pred"),  # sugar
  lambda e: (~((e.r & 3) | e.r2 ^ e.r) >> 1, e.p & e.q))

# ---------------------------------------------------------------- loads and stores
F("mem", "ld.global.f32", lambda e: I.ld.global_.f32(n(f32), A(e.gx)))
F("mem", "ld.global.v2.f32", lambda e: I.ld.global_.v2.f32(reg.array(f32, 2), A(e.gx, 8)))
F("mem", "ld.global.v4.f32", lambda e: I.ld.global_.v4.f32(reg.array(f32, 4), A(e.gx, 16)))
F("mem", "ld.global.nc.f32", lambda e: I.ld.global_.nc.f32(n(f32), A(e.gx, 4)))
F("mem", "ld.global.nc.v4.u32", lambda e: I.ld.global_.nc.v4.u32(reg.array(u32, 4), A(e.gx, 32)))
F("mem", "ld.global.u8", lambda e: I.ld.global_.u8(n(u16), A(e.gx, 3)))
F("mem", "ld.global.b64", lambda e: I.ld.global_.b64(n(b64), A(e.gx, -8)))
F("mem", "ld.global.L1::evict_last.f32", lambda e: I.ld.global_.L1__evict_last.f32(n(f32), A(e.gx)))
F("mem", "ld.volatile.global.u32", lambda e: I.ld.volatile.global_.u32(n(u32), A(e.gx)))
F("mem", "ld.relaxed.gpu.global.u32", lambda e: I.ld.relaxed.gpu.global_.u32(n(u32), A(e.gx)))
F("mem", "ld.acquire.gpu.global.u32", lambda e: I.ld.acquire.gpu.global_.u32(n(u32), A(e.gx)))
F("mem", "st.global.f32", lambda e: I.st.global_.f32(A(e.gy), e.f))
F("mem", "st.global.v4.f32", lambda e: I.st.global_.v4.f32(A(e.gy, 16), [e.f, e.g, 0.0, 1.0]))
F("mem", "st.global.v2.u64", lambda e: I.st.global_.v2.u64(A(e.gy, 32), (e.ud, e.ud)))
F("mem", "st.release.gpu.global.u32", lambda e: I.st.release.gpu.global_.u32(A(e.gy), e.r))
F("mem", "st.global.wb.u32", lambda e: I.st.global_.wb.u32(A(e.gy, 4), 7))
F("mem", "ld.shared.f32", lambda e: I.ld.shared.f32(n(f32), A(e.sa, 4)))
F("mem", "ld.shared.f32 (symbol)", lambda e: I.ld.shared.f32(n(f32), A(e.buf, 64)))
F("mem", "st.shared.f32", lambda e: I.st.shared.f32(A(e.sa), e.f))
F("mem", "st.shared.v2.f32", lambda e: I.st.shared.v2.f32(A(e.buf, 8), [e.f, e.g]))
F("mem", "ld.shared.v4.b32", lambda e: I.ld.shared.v4.b32(reg.array(b32, 4), A(e.sa, 16)))
F("mem", "ld.shared::cta.u32", lambda e: I.ld.shared__cta.u32(n(u32), A(e.sa)))
F("mem", "ld.param.u64", lambda e: I.ld.param.u64(n(u64), "[X]"))
F("mem", ("shl.b32", "cvt.u64.u32", "add.u64", "ld.global.f32 (sugar address)"),
  lambda e: I.ld.global_.f32(n(f32), A(e.gx + (e.tid << 2))))
F("mem", "prefetch.global.L2", lambda e: I.prefetch.global_.L2(A(e.gx)))
F("mem", "cvta.to.global.u64", lambda e: I.cvta.to.global_.u64(n(u64), e.ud))
F("mem", "cvta.global.u64", lambda e: I.cvta.global_.u64(n(u64), e.gx))
F("mem", "cvta.shared.u64", lambda e: I.cvta.shared.u64(n(u64), e.buf))
F("mem", "cvta.to.shared.u64", lambda e: I.cvta.to.shared.u64(n(u64), e.ud))
F("mem", "isspacep.shared", lambda e: I.isspacep.shared(n(pred), e.ud))

# ---------------------------------------------------------------- atomics and reductions
F("atom", "atom.global.add.f32", lambda e: I.atom.global_.add.f32(n(f32), A(e.gy), 1.0))
F("atom", "atom.global.add.u32", lambda e: I.atom.global_.add.u32(n(u32), A(e.gy), 1))
F("atom", "atom.global.add.u64", lambda e: I.atom.global_.add.u64(n(u64), A(e.gy), e.ud))
F("atom", "atom.global.add.f64", lambda e: I.atom.global_.add.f64(n(f64), A(e.gy), e.d))
F("atom", "atom.global.cas.b32", lambda e: I.atom.global_.cas.b32(n(b32), A(e.gy), 0, 1))
F("atom", "atom.global.cas.b64", lambda e: I.atom.global_.cas.b64(n(b64), A(e.gy), e.bd, 1))
F("atom", "atom.global.exch.b32", lambda e: I.atom.global_.exch.b32(n(b32), A(e.gy), e.b))
F("atom", "atom.global.max.s32", lambda e: I.atom.global_.max.s32(n(s32), A(e.gy), e.s))
F("atom", "atom.global.inc.u32", lambda e: I.atom.global_.inc.u32(n(u32), A(e.gy), 100))
F("atom", "atom.acq_rel.gpu.global.add.u32",
  lambda e: I.atom.acq_rel.gpu.global_.add.u32(n(u32), A(e.gy), 1))
F("atom", "atom.shared.add.u32", lambda e: I.atom.shared.add.u32(n(u32), A(e.sa), 1))
F("atom", "atom.shared.cas.b32", lambda e: I.atom.shared.cas.b32(n(b32), A(e.buf, 4), 0, e.b))
F("atom", "atom.global.add.noftz.f16", lambda e: I.atom.global_.add.noftz.f16(n(f16), A(e.gy), e.h))
F("atom", "atom.global.add.noftz.bf16x2",
  lambda e: I.atom.global_.add.noftz.bf16x2(n(bf16x2), A(e.gy), e.bh2))
F("atom", "red.global.add.f32", lambda e: I.red.global_.add.f32(A(e.gy), e.f))
F("atom", "red.global.add.u32", lambda e: I.red.global_.add.u32(A(e.gy, 4), 1))
F("atom", "red.shared.add.u32", lambda e: I.red.shared.add.u32(A(e.sa), e.r))
F("atom", "red.release.gpu.global.add.u64", lambda e: I.red.release.gpu.global_.add.u64(A(e.gy), 1))

# ---------------------------------------------------------------- warp-level
F("warp", "shfl.sync.bfly.b32", lambda e: I.shfl.sync.bfly.b32(n(b32), e.b, 16, 0x1F, 0xFFFFFFFF))
F("warp", "shfl.sync.up.b32", lambda e: I.shfl.sync.up.b32(n(u32), e.r, 1, 0, 0xFFFFFFFF))
F("warp", "shfl.sync.down.b32", lambda e: I.shfl.sync.down.b32(n(f32), e.f, 2, 0x1F, 0xFFFFFFFF))
F("warp", "shfl.sync.idx.b32", lambda e: I.shfl.sync.idx.b32(n(u32), e.r, e.r2, 0x1F, 0xFFFFFFFF))
F("warp", "shfl.sync.bfly.b32 (d|p)",
  lambda e: I.shfl.sync.bfly.b32(f"{n(u32).name}|{n(pred).name}", e.r, 1, 0x1F, 0xFFFFFFFF))
F("warp", "vote.sync.ballot.b32", lambda e: I.vote.sync.ballot.b32(n(b32), e.p, 0xFFFFFFFF))
F("warp", "vote.sync.any.pred", lambda e: I.vote.sync.any.pred(n(pred), e.p, 0xFFFFFFFF))
F("warp", "vote.sync.all.pred", lambda e: I.vote.sync.all.pred(n(pred), ~e.p, 0xFFFFFFFF))
F("warp", "vote.sync.uni.pred", lambda e: I.vote.sync.uni.pred(n(pred), e.q, 0xFFFFFFFF))
F("warp", "activemask.b32", lambda e: I.activemask.b32(n(b32)))
F("warp", "match.any.sync.b32", lambda e: I.match.any.sync.b32(n(b32), e.b, 0xFFFFFFFF))
F("warp", "redux.sync.add.u32", lambda e: I.redux.sync.add.u32(n(u32), e.r, 0xFFFFFFFF))
F("warp", "redux.sync.min.s32", lambda e: I.redux.sync.min.s32(n(s32), e.s, 0xFFFFFFFF))
F("warp", "elect.sync", lambda e: I.elect.sync("_|" + n(pred).name, 0xFFFFFFFF))
F("warp", ("mov.f32",) + ("shfl.sync.bfly.b32", "add.f32") * 5, lambda e: ptx.warp.reduce_sum(reg.scalar(f32, e.f)))
F("warp", ("mov.s32",) + ("shfl.sync.bfly.b32", "max.s32") * 3,
  lambda e: ptx.warp.reduce_max(reg.scalar(s32, e.s), width=8))

# ---------------------------------------------------------------- barriers and fences
F("sync", "bar.sync", lambda e: ptx.bar_sync())
F("sync", "bar.sync (named, count)", lambda e: ptx.bar_sync(1, 128))
F("sync", "bar.arrive", lambda e: ptx.bar_arrive(2, 128))
F("sync", "bar.sync (inst)", lambda e: I.bar.sync(3, 64))
F("sync", "barrier.sync.aligned", lambda e: I.barrier.sync.aligned(0))
F("sync", "bar.red.popc.u32", lambda e: I.bar.red.popc.u32(n(u32), 4, e.p))
F("sync", "barrier.cluster.arrive", lambda e: I.barrier.cluster.arrive())
F("sync", "barrier.cluster.arrive.relaxed", lambda e: I.barrier.cluster.arrive.relaxed())
F("sync", "barrier.cluster.wait", lambda e: I.barrier.cluster.wait())
F("sync", "membar.cta", lambda e: I.membar.cta())
F("sync", "membar.gl", lambda e: I.membar.gl())
F("sync", "membar.sys", lambda e: I.membar.sys())
F("sync", "fence.sc.cta", lambda e: ptx.fence())
F("sync", "fence.acq_rel.gpu", lambda e: ptx.fence("gpu", sem="acq_rel"))
F("sync", "fence.acq_rel.cluster", lambda e: I.fence.acq_rel.cluster())
F("sync", "fence.proxy.async", lambda e: I.fence.proxy.async_())
F("sync", "fence.proxy.async.shared::cta", lambda e: I.fence.proxy.async_.shared__cta())
F("sync", "fence.proxy.async.global", lambda e: I.fence.proxy.async_.global_())
F("sync", "fence.mbarrier_init.release.cluster", lambda e: I.fence.mbarrier_init.release.cluster())
F("sync", "nanosleep.u32", lambda e: I.nanosleep.u32(100))

# ---------------------------------------------------------------- transcendental approximations
F("math", "ex2.approx.f32", lambda e: I.ex2.approx.f32(n(f32), e.f))
F("math", "ex2.approx.ftz.f32", lambda e: I.ex2.approx.ftz.f32(n(f32), e.f))
F("math", "ex2.approx.f16", lambda e: I.ex2.approx.f16(n(f16), e.h))
F("math", "lg2.approx.f32", lambda e: I.lg2.approx.f32(n(f32), e.f))
F("math", "rsqrt.approx.f32", lambda e: I.rsqrt.approx.f32(n(f32), e.f))
F("math", "rsqrt.approx.f64", lambda e: I.rsqrt.approx.f64(n(f64), e.d))
F("math", "sqrt.approx.f32", lambda e: I.sqrt.approx.f32(n(f32), e.f))
F("math", "sqrt.rn.f32", lambda e: I.sqrt.rn.f32(n(f32), e.f))
F("math", "sqrt.rn.f64", lambda e: I.sqrt.rn.f64(n(f64), e.d))
F("math", "rcp.approx.f32", lambda e: I.rcp.approx.f32(n(f32), e.f))
F("math", "rcp.rn.f32", lambda e: I.rcp.rn.f32(n(f32), e.f))
F("math", "rcp.approx.ftz.f64", lambda e: I.rcp.approx.ftz.f64(n(f64), e.d))
F("math", "sin.approx.f32", lambda e: I.sin.approx.f32(n(f32), e.f))
F("math", "cos.approx.f32", lambda e: I.cos.approx.f32(n(f32), e.f))
F("math", "tanh.approx.f32", lambda e: I.tanh.approx.f32(n(f32), e.f))
F("math", "copysign.f32", lambda e: I.copysign.f32(n(f32), e.f, e.g))

# ---------------------------------------------------------------- moves and special registers
F("mov", "mov.u32 %tid.y", lambda e: ptx.special.tid.y())
F("mov", "mov.u32 %ctaid.x", lambda e: ptx.special.ctaid.x())
F("mov", "mov.u32 %nctaid.z", lambda e: ptx.special.nctaid.z())
F("mov", "mov.u32 %laneid", lambda e: ptx.special.laneid())
F("mov", "mov.u32 %warpid", lambda e: ptx.special.warpid())
F("mov", "mov.u64 %clock64", lambda e: ptx.special.clock64())
F("mov", "mov.u64 %globaltimer", lambda e: ptx.special.globaltimer())
F("mov", "mov.u32 %cluster_ctarank", lambda e: ptx.special.cluster_ctarank())
F("mov", "mov.u32 %dynamic_smem_size", lambda e: ptx.special.dynamic_smem_size())
F("mov", "mov.u32 (raw sreg)", lambda e: I.mov.u32(n(u32), "%ntid.x"))
F("mov", "mov.b32 (float bits)", lambda e: I.mov.b32(n(b32), 1.0))
F("mov", "mov.f32", lambda e: I.mov.f32(n(f32), 0.1))
F("mov", "mov.f64", lambda e: I.mov.f64(n(f64), 1 / 3))
F("mov", "mov.b64 (pack)", lambda e: I.mov.b64(n(b64), [e.b, e.b]))
F("mov", "mov.b32 (unpack)", lambda e: I.mov.b32(reg.array(b16, 2), e.b))
F("mov", "mov.u32 (shared symbol)", lambda e: e.buf.addr())
F("mov", "mov.pred", lambda e: reg.scalar(pred, True))
F("mov", "mov.b16 (f16 immediate)", lambda e: reg.scalar(f16, 0.1))

# ---------------------------------------------------------------- async copies, mbarriers
F("async", "cp.async.ca.shared.global", lambda e: I.cp.async_.ca.shared.global_(A(e.sa), A(e.gx), 4))
F("async", "cp.async.ca.shared.global (8B)", lambda e: I.cp.async_.ca.shared.global_(A(e.buf, 8), A(e.gx), 8))
F("async", "cp.async.cg.shared.global", lambda e: I.cp.async_.cg.shared.global_(A(e.sa, 16), A(e.gx, 16), 16))
F("async", "cp.async.commit_group", lambda e: I.cp.async_.commit_group())
F("async", "cp.async.wait_group", lambda e: I.cp.async_.wait_group(0))
F("async", "cp.async.wait_all", lambda e: I.cp.async_.wait_all())
F("async", "mbarrier.init.shared::cta.b64", lambda e: I.mbarrier.init.shared__cta.b64(A(e.mba), 128))
F("async", "mbarrier.init.shared::cta.b64 (symbol)", lambda e: I.mbarrier.init.shared__cta.b64(A(e.mbar), 1))
F("async", "mbarrier.arrive.shared::cta.b64",
  lambda e: I.mbarrier.arrive.shared__cta.b64(n(b64), A(e.mba)))
F("async", "mbarrier.arrive.expect_tx.shared::cta.b64",
  lambda e: I.mbarrier.arrive.expect_tx.shared__cta.b64("_", A(e.mba), 1024))
F("async", "mbarrier.try_wait.parity.shared::cta.b64",
  lambda e: I.mbarrier.try_wait.parity.shared__cta.b64(n(pred), A(e.mba), 0))
F("async", "mbarrier.try_wait.parity.shared::cta.b64 (reg phase)",
  lambda e: I.mbarrier.try_wait.parity.shared__cta.b64(n(pred), A(e.mbar), e.r2))
F("async", "mbarrier.test_wait.shared::cta.b64",
  lambda e: I.mbarrier.test_wait.shared__cta.b64(n(pred), A(e.mba), e.bd))
F("async", "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
  lambda e: I.cp.async_.bulk.shared__cluster.global_.mbarrier__complete_tx__bytes(
      A(e.sa), A(e.gx), 1024, A(e.mba)))
F("async", ("cp.async.bulk.global.shared::cta.bulk_group", "cp.async.bulk.commit_group",
            "cp.async.bulk.wait_group.read"),
  lambda e: (I.cp.async_.bulk.global_.shared__cta.bulk_group(A(e.gy), A(e.sa), 256),
             I("cp.async.bulk.commit_group")(), I("cp.async.bulk.wait_group.read")(0)))
F("async", "elect.sync (helper-free)", lambda e: I("elect.sync")("_|" + n(pred).name, 0xFFFFFFFF))

# ---------------------------------------------------------------- wgmma, register reallocation, matrices
F("wgmma", "wgmma.fence.sync.aligned", lambda e: I.wgmma.fence.sync.aligned())
F("wgmma", "wgmma.commit_group.sync.aligned", lambda e: I.wgmma.commit_group.sync.aligned())
F("wgmma", "wgmma.wait_group.sync.aligned", lambda e: I.wgmma.wait_group.sync.aligned(0))
F("wgmma", "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
  lambda e: I.wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16(
      reg.array(f32, 32), e.ud, e.ud, e.p, 1, 1, 0, 1))
F("wgmma", "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16",
  lambda e: I.wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16(
      reg.array(f32, 16), e.ud, e.ud, 0, -1, 1, 0, 0))
F("wgmma", "setmaxnreg.inc.sync.aligned.u32", lambda e: I.setmaxnreg.inc.sync.aligned.u32(240))
F("wgmma", "setmaxnreg.dec.sync.aligned.u32", lambda e: I.setmaxnreg.dec.sync.aligned.u32(40))
F("wgmma", "stmatrix.sync.aligned.m8n8.x4.shared.b16",
  lambda e: I.stmatrix.sync.aligned.m8n8.x4.shared.b16(A(e.sa), [e.b, e.b, e.b, e.b]))
F("wgmma", "stmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
  lambda e: I.stmatrix.sync.aligned.m8n8.x2.trans.shared.b16(A(e.buf), [e.b, e.b]))
F("wgmma", "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
  lambda e: I.ldmatrix.sync.aligned.m8n8.x4.shared.b16(reg.array(b32, 4), A(e.sa)))
F("wgmma", "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16",
  lambda e: I.ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16([n(b32)], A(e.sa, 128)))
F("wgmma", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
  lambda e: I.mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32(
      reg.array(f32, 4), [e.b] * 4, [e.b] * 2, [e.f] * 4))

# ---------------------------------------------------------------- predication and control
F("ctrl", "add.u32 (@p)", lambda e: I.add.u32(n(u32), e.r, 1, pred=e.p))
F("ctrl", "st.global.f32 (@!p)", lambda e: I.st.global_.f32(A(e.gy), e.f, pred=~e.p))
F("ctrl", "bra (@p)", lambda e: ptx.bra(e.lbl, pred=e.q))
F("ctrl", "bra.uni", lambda e: ptx.bra(e.lbl, uni=True))
F("ctrl", ("bra", "add.u32"), lambda e: _if_block(e))
F("ctrl", ("mov.u32", "setp.ge.u32", "bra", "add.f32", "add.u32", "setp.lt.u32", "bra"),
  lambda e: _loop_block(e))
F("ctrl", "trap (@p)", lambda e: I.trap(pred=e.q))
F("ctrl", "exit (@!p)", lambda e: I.exit(pred=~e.q))
F("ctrl", "ret (@p)", lambda e: I.ret(pred=e.q))


def _if_block(e):
    with ptx.if_(e.p):
        e.r2 + 1


def _loop_block(e):
    acc = reg.scalar(f32)
    for _ in ptx.loop(e.r2, unroll=False):
        acc += e.f


# expected opcodes are the part before any " (" note
FORM_IDS = Counter(f.id for f in FORMS)
assert all(c == 1 for c in FORM_IDS.values()), [i for i, c in FORM_IDS.items() if c > 1]
CATEGORIES = list(dict.fromkeys(f.cat for f in FORMS))


def _opcodes(expect: tuple[str, ...]) -> list[str]:
    return [x.split(" (")[0].split(" %")[0] for x in expect]


def build(forms: list[Form], name: str):
    """A kernel running the preamble then ``forms``; records what each form emitted."""
    emitted: dict[str, list[str]] = {}

    @pyptx.kernel([Tile(1024, f32)], [Tile(1024, f32)], block=(128, 1, 1), name=name,
                  maxnreg=240)  # the budget setmaxnreg needs
    def k(X, Y):
        e = preamble(X, Y)
        body = current().body
        for f in forms:
            start = len(body)
            f.fn(e)
            emitted[f.id] = [st.opcode for st in body[start:] if type(st) is Instruction]
        ptx.place(e.lbl)
        ptx.ret()

    return k.ptx(), emitted


@dataclass
class Result:
    ok: bool
    log: str
    ptx: str
    emitted: dict[str, list[str]]


@pytest.fixture(scope="module")
def results(assemble):
    cache: dict[str, Result] = {}

    def get(key: str, forms: list[Form]) -> Result:
        if key not in cache:
            src, emitted = build(forms, "m_" + re.sub(r"\W", "_", key))
            try:
                assemble(src)
                cache[key] = Result(True, "", src, emitted)
            except AssertionError as err:
                cache[key] = Result(False, str(err), src, emitted)
        return cache[key]

    return get


def test_matrix_is_broad():
    assert len(FORMS) >= 80
    assert {"int", "float", "setp", "cvt", "bits", "mem", "atom", "warp", "sync", "math", "mov",
            "async", "wgmma", "ctrl"} <= set(CATEGORIES)


def test_assembler_really_runs(assemble):
    # the harness must reject bad PTX, or every test below would pass vacuously
    with pytest.raises(AssertionError, match="ptxas rejected the PTX"):
        assemble(".version 8.0\n.target sm_90a\n.address_size 64\n"
                 ".visible .entry k() { frobnicate.u32 %r0; }\n")


@pytest.mark.parametrize("cat", CATEGORIES)
def test_category_assembles(cat, results):
    forms = [f for f in FORMS if f.cat == cat]
    res = results(cat, forms)
    assert res.ok, res.log


@pytest.mark.parametrize("form", FORMS, ids=[f.id for f in FORMS])
def test_form(form, results):
    res = results(form.cat, [f for f in FORMS if f.cat == form.cat])
    # the DSL call emitted exactly these instructions, spelled as PTX spells them
    assert res.emitted[form.id] == _opcodes(form.expect)
    if not res.ok:  # find out whether this form is one ptxas rejects
        alone = results(form.id, [form])
        assert alone.ok, alone.log
