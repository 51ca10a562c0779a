"""The bad-input suite: each mistake a user can make raises a ``PyptxError`` subclass whose
message starts with the user's ``file:line`` (this file and the case's line) where there is
one, and says what was expected. Every case is a one-line lambda, so its line is known.

Kinds of case:
- ``DSL``: the lambda runs inside a traced kernel body and gets ``c``, a ``Ctx`` of registers
  and objects to misuse;
- ``CALL``: the lambda runs as is (decoration, specs, specialization, calls outside a trace);
- ``PARSE``: PTX text (or bytes) that the parser and the transpiler must refuse;
- ``CLI``: ``pyptx`` command lines that must end in one ``pyptx: error:`` line.
"""

from __future__ import annotations

import os
import stat

import pytest

from pyptx import Tile, kernel, ptx, reg, smem
from pyptx.cli import main as cli_main
from pyptx.errors import (
    ConfigError,
    OperandError,
    ParseError,
    PyptxError,
    RegisterScopeError,
    ShapeError,
    SpecError,
    TraceError,
    TypeMismatchError,
    UnboundDimError,
)
from pyptx.parser import parse
from pyptx.transpile import TranspileError, transpile
from pyptx.types import f16, f32, pred, s32, u8, u32, u64

HERE = os.path.abspath(__file__)


class Ctx:
    """What a DSL case may misuse: registers of several types, a 128-byte shared array, a
    label that is never placed, the kernel's tensors and a register array."""

    def __init__(self, X, Y):
        self.X, self.Y = X, Y
        self.r = reg.scalar(u32, 1)
        self.s = reg.scalar(s32, 1)
        self.d = reg.scalar(u64, 1)
        self.f = reg.scalar(f32, 1.0)
        self.h = reg.scalar(f16)
        self.p = self.r < 4
        self.arr = reg.array(f32, 4)
        self.buf = smem.alloc(f32, 32, name="buf")
        self.lbl = ptx.label("never")


def _foreign():
    """A register, a shared array and a label of another kernel's trace."""
    got = {}

    @kernel(name="other")
    def other():
        got["reg"] = reg.scalar(u32, 0)
        got["smem"] = smem.alloc(f32, 4)
        got["label"] = ptx.label()

    other.ptx()
    return got


FOREIGN = _foreign()


def traced(case, N=64, **options):
    @kernel(in_specs=(Tile("N", f32),), out_specs=(Tile("N", f32),), name="bad", **options)
    def body(X, Y):
        case(Ctx(X, Y))

    return body.ptx(N=N)


def _empty():
    pass


def _one(X):
    pass


@kernel(in_specs=(Tile("M", "N", f32),), out_specs=(Tile("M", f32),))
def K(X, Y):
    ptx.ret()


@kernel(in_specs=(Tile("M", "K", f32), Tile("K", "N", f32)), out_specs=(Tile("M", "N", f32),))
def K2(A, B, C):
    ptx.ret()


@kernel(in_specs=(Tile("N", f32),), out_specs=(Tile("N", f32),))
def KT(X, Y, *, scale):
    ptx.ret()


# --------------------------------------------------------------------- DSL cases: (case, error, text)
DSL = [
    # Reg operator sugar
    (lambda c: c.r // 0, OperandError, "by the immediate 0"),
    (lambda c: c.r % 0, OperandError, "by the immediate 0"),
    (lambda c: c.s // 0, OperandError, "by the immediate 0"),
    (lambda c: c.d % 0, OperandError, "by the immediate 0"),
    (lambda c: c.r + c.f, TypeMismatchError, "add of .u32 register"),
    (lambda c: c.f + c.r, TypeMismatchError, "add of .f32 register"),
    (lambda c: c.f * c.d, TypeMismatchError, "mul of .f32"),
    (lambda c: c.r + 1.5, TypeMismatchError, "integer registers take int immediates"),
    (lambda c: c.r + "x", TypeMismatchError, "expected a register or a Python number"),
    (lambda c: c.r + None, TypeMismatchError, "expected a register or a Python number"),
    (lambda c: c.r * [1], TypeMismatchError, "expected a register or a Python number"),
    (lambda c: c.f - {}, TypeMismatchError, "expected a register or a Python number"),
    (lambda c: c.f // c.f, TypeMismatchError, "needs integer registers"),
    (lambda c: c.f % 2.0, TypeMismatchError, "needs integer registers"),
    (lambda c: c.f & c.f, TypeMismatchError, "needs integer registers"),
    (lambda c: c.f << 1, TypeMismatchError, "needs integer registers"),
    (lambda c: c.r / c.r, TypeMismatchError, "use // for div"),
    (lambda c: c.p + c.p, TypeMismatchError, "not defined on predicates"),
    (lambda c: c.p < c.p, TypeMismatchError, "cannot compare predicates"),
    (lambda c: c.r << c.f, TypeMismatchError, "shift amount must be a 32-bit integer"),
    (lambda c: c.r << 1.5, TypeMismatchError, "shift amount must be an int"),
    (lambda c: c.r >> c.d, TypeMismatchError, "shift amount must be a 32-bit integer"),
    (lambda c: bool(c.r), TraceError, "no Python truth value"),
    (lambda c: 1 if c.p else 0, TraceError, "no Python truth value"),
    (lambda c: c.h / c.h, TypeMismatchError, "PTX has no div.f16"),
    (lambda c: c.r.__iadd__(c.f), TypeMismatchError, "add of .u32"),
    (lambda c: c.r.__iadd__(c.d), TypeMismatchError, "in-place add would change"),
    (lambda c: c.r + 2**40, OperandError, ""),
    (lambda c: c.r + FOREIGN["reg"], RegisterScopeError, "belongs to kernel 'other'"),
    (lambda c: FOREIGN["reg"] + c.r, RegisterScopeError, "belongs to kernel 'other'"),
    (lambda c: c.arr[7], OperandError, "out of range for length 4"),
    (lambda c: c.arr["0"], OperandError, "indexed by Python ints"),
    # reg.scalar / reg.array / reg.from_
    (lambda c: reg.scalar("f32x"), OperandError, "expects a PTX type"),
    (lambda c: reg.scalar(f32, "1.0"), OperandError, "init must be a Python number"),
    (lambda c: reg.scalar(u32, 1.5), TypeMismatchError, "float init"),
    (lambda c: reg.scalar(u32, c.d), TypeMismatchError, "init register"),
    (lambda c: reg.scalar(u8, 300), OperandError, ""),
    (lambda c: reg.scalar(u32, FOREIGN["reg"]), RegisterScopeError, "belongs to kernel"),
    (lambda c: reg.array(f32, 0), OperandError, "positive int"),
    (lambda c: reg.array(f32, -1), OperandError, "positive int"),
    (lambda c: reg.array(f32, 2.0), OperandError, "positive int"),
    (lambda c: reg.array(f32, True), OperandError, "positive int"),
    (lambda c: reg.array("f32", 2), OperandError, "expects a PTX type"),
    (lambda c: reg.from_("x"), OperandError, "expects a register or a number"),
    (lambda c: reg.from_(1.0), OperandError, "needs a type"),
    (lambda c: reg.from_(c.r, "f32"), OperandError, "expects a PTX type"),
    (lambda c: reg.from_(None, f32), OperandError, "expects a register or a number"),
    (lambda c: reg.from_(FOREIGN["reg"], u32), RegisterScopeError, "belongs to kernel"),
    # shared memory
    (lambda c: smem.alloc("f32", 4), OperandError, "expects an element type"),
    (lambda c: smem.alloc(pred, 4), OperandError, "expects an element type"),
    (lambda c: smem.alloc(f32, 0), OperandError, "positive ints"),
    (lambda c: smem.alloc(f32, (4, -1)), OperandError, "positive ints"),
    (lambda c: smem.alloc(f32, 4.0), OperandError, "positive ints"),
    (lambda c: smem.alloc(f32, ()), OperandError, "positive ints"),
    (lambda c: smem.alloc(f32, 4, align=3), OperandError, "power of two"),
    (lambda c: smem.alloc(f32, 4, align=0), OperandError, "power of two"),
    (lambda c: smem.alloc(f32, 4, name="1x"), OperandError, "identifier"),
    (lambda c: smem.alloc(f32, 20000), OperandError, "over the 49152-byte limit"),
    (lambda c: smem.dynamic(), ConfigError, "smem=0"),
    (lambda c: smem.dynamic(align=6), OperandError, "power of two"),
    (lambda c: ptx.addr(c.buf, 4096), OperandError, "outside shared array buf (128 bytes)"),
    (lambda c: ptx.addr(c.buf, -4), OperandError, "outside shared array buf"),
    (lambda c: ptx.addr(c.buf, 129), OperandError, "expected 0 <= offset <= 128"),
    (lambda c: ptx.addr(c.buf, 1.5), OperandError, "offset must be a Python int"),
    (lambda c: ptx.addr(c.r, c.r), OperandError, "PTX has no reg+reg addressing"),
    (lambda c: ptx.addr(c.f), OperandError, "32- or 64-bit integer register"),
    (lambda c: ptx.addr(c.h), OperandError, "32- or 64-bit integer register"),
    (lambda c: ptx.addr(1234), OperandError, "must be a register, shared array or param"),
    (lambda c: ptx.addr(None), OperandError, "must be a register, shared array or param"),
    (lambda c: ptx.inst.ld.shared.f32(c.f, ptx.addr(FOREIGN["smem"])), RegisterScopeError, "belongs to kernel 'other'"),
    # parameters and pointers
    (lambda c: ptx.global_ptrs(c.r), OperandError, "must be a tensor parameter"),
    (lambda c: ptx.global_ptrs("X"), OperandError, "must be a tensor parameter"),
    (lambda c: ptx.global_ptrs(c.X, 5), OperandError, "argument 1 must be a tensor parameter"),
    (lambda c: ptx.scalar_param("f32", 1), OperandError, "plain scalar"),
    (lambda c: ptx.scalar_param(f16, 1.0), OperandError, "plain scalar"),
    (lambda c: ptx.scalar_param(pred, 1), OperandError, "plain scalar"),
    (lambda c: ptx.scalar_param(u32, "1"), OperandError, "Python number"),
    (lambda c: ptx.scalar_param(u32, True), OperandError, "Python number"),
    (lambda c: ptx.scalar_param(u8, 300), OperandError, ""),
    (lambda c: c.X.tmap, OperandError, "has no tensor map"),
    (lambda c: ptx.bulk_prefetch_l2(c.r, 16), OperandError, "64-bit address register"),
    (lambda c: ptx.bulk_prefetch_l2(c.d, 15), OperandError, "multiple of 16"),
    (lambda c: ptx.bulk_prefetch_l2(c.d, 0), OperandError, "multiple of 16"),
    (lambda c: ptx.bulk_prefetch_l2(c.d, c.d), OperandError, "must be 32-bit"),
    (lambda c: ptx.bulk_prefetch_l2(c.d, 16, pred=c.r), OperandError, "predicate register"),
    (lambda c: ptx.bulk_prefetch_l2("x", 16), OperandError, "address register"),
    # control flow
    (lambda c: ptx.bra("L"), OperandError, "expects a Label"),
    (lambda c: ptx.bra(c.lbl), TraceError, "never placed"),
    (lambda c: ptx.bra(FOREIGN["label"]), TraceError, "belongs to another kernel"),
    (lambda c: (ptx.place(c.lbl), ptx.place(c.lbl)), TraceError, "already placed"),
    (lambda c: ptx.place("L"), OperandError, "expects a label of this kernel"),
    (lambda c: ptx.place(FOREIGN["label"]), OperandError, "expects a label of this kernel"),
    (lambda c: ptx.label("1bad"), OperandError, "identifier"),
    (lambda c: ptx.label(3), OperandError, "identifier"),
    (lambda c: ptx.if_(c.r).__enter__(), OperandError, "expects a predicate register"),
    (lambda c: ptx.if_(True).__enter__(), OperandError, "expects a predicate register"),
    (lambda c: ptx.loop(c.f), OperandError, "must be an integer"),
    (lambda c: ptx.loop(0, 10, 0), OperandError, "positive int"),
    (lambda c: ptx.loop(0, 10, -1), OperandError, "positive int"),
    (lambda c: ptx.loop(0, 10, 1.5), OperandError, "positive int"),
    (lambda c: ptx.loop("a"), OperandError, "must be an int or register"),
    (lambda c: ptx.loop(0, 2.5), OperandError, "must be an int or register"),
    # special registers
    (lambda c: ptx.special.foo(), OperandError, "not a special register pyptx knows"),
    (lambda c: ptx.special.tid(), OperandError, "is a vector"),
    (lambda c: ptx.special.ctaid(), OperandError, "is a vector"),
    # barriers, fences, warp helpers
    (lambda c: ptx.bar_sync(16), OperandError, "barrier id must be 0..15"),
    (lambda c: ptx.bar_sync(-1), OperandError, "barrier id must be 0..15"),
    (lambda c: ptx.bar_sync(0, 33), OperandError, "positive multiple of 32"),
    (lambda c: ptx.bar_sync(0, 0), OperandError, "positive multiple of 32"),
    (lambda c: ptx.bar_sync(1.5), OperandError, "barrier id must be an int or register"),
    (lambda c: ptx.bar_sync(0, "all"), OperandError, "thread count must be an int or register"),
    (lambda c: ptx.bar_arrive(0, 31), OperandError, "positive multiple of 32"),
    (lambda c: ptx.fence("galaxy"), OperandError, ""),
    (lambda c: ptx.fence(sem="weird"), OperandError, ""),
    (lambda c: ptx.warp.reduce_sum(c.p), OperandError, ""),
    (lambda c: ptx.warp.reduce_sum(c.r, width=3), OperandError, ""),
    (lambda c: ptx.warp.reduce_sum(c.r, width=64), OperandError, ""),
    (lambda c: ptx.warp.reduce_max("x"), OperandError, ""),
    (lambda c: ptx.setmaxnreg(23), OperandError, "multiple of 8 in 24..256"),
    (lambda c: ptx.setmaxnreg(264), OperandError, "multiple of 8 in 24..256"),
    (lambda c: ptx.setmaxnreg(100), OperandError, "multiple of 8 in 24..256"),
    (lambda c: ptx.setmaxnreg(c.r), OperandError, "multiple of 8 in 24..256"),
    # mbarrier, TMA, wgmma
    (lambda c: ptx.mbarrier.init(c.f, 1), TypeMismatchError, "shared address"),
    (lambda c: ptx.mbarrier.init(c.buf, -1), OperandError, ""),
    (lambda c: ptx.mbarrier.try_wait_parity(c.buf, 2), OperandError, ""),
    (lambda c: ptx.mbarrier.arrive_expect_tx(c.buf, -16), OperandError, ""),
    (lambda c: ptx.tma.wait_group(-1), OperandError, ""),
    (lambda c: ptx.tma.copy_bulk(c.buf, c.d, 15, c.buf), OperandError, ""),
    (lambda c: ptx.wgmma.wait_group(-1), OperandError, ""),
    (lambda c: ptx.wgmma.make_smem_desc(c.buf, 15, 16, 128), OperandError, ""),
    (lambda c: ptx.wgmma.make_smem_desc(c.buf, 16, 16, 7), OperandError, ""),
    # a Python mistake in the body is reported at its line, as a TraceError
    (lambda c: c.undefined_attribute, TraceError, "raised AttributeError"),
    (lambda c: 1 / 0, TraceError, "raised ZeroDivisionError"),
    (lambda c: ptx.bar_sync(0, 64, 3), TraceError, "raised TypeError"),
]


@pytest.mark.parametrize("case, exc, text", DSL, ids=[f"L{c.__code__.co_firstlineno}" for c, _, _ in DSL])
def test_dsl_mistake_is_reported_at_its_line(case, exc, text):
    with pytest.raises(exc) as ei:
        traced(case)
    msg = str(ei.value)
    assert isinstance(ei.value, PyptxError)
    assert msg.startswith(f"{HERE}:{case.__code__.co_firstlineno}: "), msg
    assert text in msg, msg


# Cases that need other kernel options or dims: (case, options, error, text).
DSL_OPTIONS = [
    (lambda c: ptx.global_ptrs(c.X)[0] + c.r * 4, dict(N=2**32), TypeMismatchError, "over 4 GiB"),
    (lambda c: ptx.global_ptrs(c.X)[0] + 8 + c.r, dict(N=2**32), TypeMismatchError, "wraps past 4 GiB"),
    (lambda c: c.r + ptx.global_ptrs(c.X)[0], dict(N=2**31), TypeMismatchError, "tensor 'X'"),
    (lambda c: (smem.dynamic(), smem.dynamic()), dict(smem=1024), OperandError, "declared once"),
    (lambda c: smem.dynamic(), dict(smem=lambda N: 0), ConfigError, "smem=0"),
    (lambda c: ptx.setmaxnreg(128), dict(arch="sm_80"), PyptxError, "sm_80"),
]


@pytest.mark.parametrize("case, options, exc, text", DSL_OPTIONS,
                         ids=[f"L{c.__code__.co_firstlineno}" for c, *_ in DSL_OPTIONS])
def test_dsl_mistake_under_options_is_reported_at_its_line(case, options, exc, text):
    options = dict(options)
    n = options.pop("N", 64)
    with pytest.raises(exc) as ei:
        traced(case, n, **options)
    msg = str(ei.value)
    assert msg.startswith(f"{HERE}:{case.__code__.co_firstlineno}: "), msg
    assert text in msg, msg


def test_wide_tensors_address_with_64_bit_offsets():
    def case(c):
        px, py = ptx.global_ptrs(c.X, c.Y)
        i = reg.from_(ptx.special.tid.x(), u64)
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(px + i * 4))
        ptx.inst.st.global_.f32(ptx.addr(py + i * 4), v)

    text = traced(case, 2**32)
    assert "mul.lo.u64" in text and "mul.lo.u32" not in text


def test_small_tensors_still_take_32_bit_offsets():
    text = traced(lambda c: ptx.global_ptrs(c.X)[0] + c.r * 4, 1024)
    assert "cvt.u64.u32" in text


# --------------------------------------------------------------------- CALL cases: (case, error, text)
CALL = [
    # launch geometry and options at decoration
    (lambda: kernel(grid=(1, 70000, 1))(_empty), ConfigError, "y and z <= 65535"),
    (lambda: kernel(grid=(1, 1, 65536))(_empty), ConfigError, "y and z <= 65535"),
    (lambda: kernel(grid=(2**31, 1, 1))(_empty), ConfigError, "x <= 2147483647"),
    (lambda: kernel(grid=(0, 1, 1))(_empty), ConfigError, "three positive ints"),
    (lambda: kernel(grid=(1, 1))(_empty), ConfigError, "three positive ints"),
    (lambda: kernel(grid="abc")(_empty), ConfigError, "three positive ints"),
    (lambda: kernel(grid=(1.5, 1, 1))(_empty), ConfigError, "three positive ints"),
    (lambda: kernel(grid=None)(_empty), ConfigError, "three positive ints"),
    (lambda: kernel(block=(1025, 1, 1))(_empty), ConfigError, "at most 1024 threads"),
    (lambda: kernel(block=(1, 1, 65))(_empty), ConfigError, "z <= 64"),
    (lambda: kernel(block=(32, 32, 2))(_empty), ConfigError, "at most 1024 threads"),
    (lambda: kernel(block=(0, 1, 1))(_empty), ConfigError, "three positive ints"),
    (lambda: kernel(block=(-32, 1, 1))(_empty), ConfigError, "three positive ints"),
    (lambda: kernel(cluster=(0, 1, 1))(_empty), ConfigError, "three positive ints"),
    (lambda: kernel(cluster=(4, 4, 2))(_empty), ConfigError, "more than 16 CTAs"),
    (lambda: kernel(cluster=(2, 1, 1), arch="sm_80")(_empty), ConfigError, "need sm_90"),
    (lambda: kernel(smem=-1)(_empty), ConfigError, "non-negative int"),
    (lambda: kernel(smem=1.5)(_empty), ConfigError, "non-negative int"),
    (lambda: kernel(smem=True)(_empty), ConfigError, "non-negative int"),
    (lambda: kernel(smem=300000)(_empty), ConfigError, "dynamic shared memory limit"),
    (lambda: kernel(arch="sm90")(_empty), ConfigError, "arch must look like"),
    (lambda: kernel(arch=90)(_empty), ConfigError, "arch must look like"),
    (lambda: kernel(version="8")(_empty), ConfigError, "version must look like"),
    (lambda: kernel(version=8.0)(_empty), ConfigError, "version must look like"),
    (lambda: kernel(name="1k")(_empty), ConfigError, "identifier"),
    (lambda: kernel(name="a-b")(_empty), ConfigError, "identifier"),
    (lambda: kernel(maxnreg=300)(_empty), ConfigError, "24..255"),
    (lambda: kernel(maxnreg=10)(_empty), ConfigError, "24..255"),
    (lambda: kernel(maxnreg=True)(_empty), ConfigError, "24..255"),
    (lambda: kernel(maxnreg=128, block=(1024, 1, 1))(_empty), ConfigError, "registers per block"),
    (lambda: kernel(pdl="yes")(_empty), ConfigError, "True or False"),
    (lambda: kernel(pdl=True, arch="sm_80")(_empty), ConfigError, "needs sm_90"),
    (lambda: kernel(tma=5)(_empty), ConfigError, "tma must map"),
    (lambda: kernel(tma={"Q": {}})(_empty), ConfigError, "not a tensor parameter"),
    (lambda: kernel((Tile("N", f32),), tma={"X": {"boxx": 1}})(_one), ConfigError, "keys from"),
    (lambda: kernel(in_specs=5)(_empty), SpecError, "sequence of Tile"),
    (lambda: kernel(in_specs=[1])(_one), SpecError, "in_specs[0] must be a Tile"),
    (lambda: kernel(out_specs=["N"])(_one), SpecError, "out_specs[0] must be a Tile"),
    (lambda: kernel()(5), ConfigError, "@kernel decorates a function"),
    (lambda: kernel(name="k")(lambda *a: None), SpecError, "may not take *args"),
    (lambda: kernel(name="k")(lambda **k: None), SpecError, "may not take *args or **kwargs"),
    (lambda: kernel(name="k")(lambda X: None), SpecError, "takes 1 tensor parameters"),
    (lambda: kernel((Tile("N", f32),), name="k")(lambda X, *, N=1: None), SpecError, "both template parameters and dims"),
    # trace-time launch limits from callables
    (lambda: kernel(grid=lambda: (1, 70000, 1))(_empty).ptx(), ConfigError, "y and z <= 65535"),
    (lambda: kernel(grid=lambda: (2**31, 1, 1))(_empty).ptx(), ConfigError, "x <= 2147483647"),
    (lambda: kernel(grid=lambda: (0, 1, 1))(_empty).ptx(), ConfigError, "three positive ints"),
    (lambda: kernel(grid=lambda Q: (Q, 1, 1))(_empty).ptx(), ConfigError, "needs 'Q'"),
    (lambda: kernel(block=lambda: (2048, 1, 1))(_empty).ptx(), ConfigError, "at most 1024 threads"),
    (lambda: kernel(block=lambda: (1, 1, 128))(_empty).ptx(), ConfigError, "z <= 64"),
    (lambda: kernel(block=lambda: (1024, 1, 1), maxnreg=255)(_empty).ptx(), ConfigError, "registers per block"),
    (lambda: kernel(smem=lambda: -1)(_empty).ptx(), ConfigError, "non-negative int"),
    (lambda: kernel(smem=lambda: 10**6)(_empty).ptx(), ConfigError, "dynamic shared memory limit"),
    # specialization
    (lambda: K.ptx(), UnboundDimError, "dim 'M' has no value"),
    (lambda: K.ptx(M=4), UnboundDimError, "dim 'N' has no value"),
    (lambda: K.ptx(M=0, N=4), SpecError, "must be a positive int"),
    (lambda: K.ptx(M=1.5, N=4), SpecError, "must be a positive int"),
    (lambda: K.ptx(M=True, N=4), SpecError, "must be a positive int"),
    (lambda: K.ptx(M=4, N=4, Q=1), SpecError, "unknown keyword 'Q'"),
    (lambda: KT.ptx(N=4), SpecError, "needs template parameter scale"),
    (lambda: KT.ptx(N=4, scale=[1]), SpecError, "must be hashable"),
    (lambda: K.specialize([(4,)]), ShapeError, "expected rank 2"),
    (lambda: K.specialize([(4, 4), (4, 4)]), SpecError, "takes 1 inputs"),
    (lambda: K2.specialize([(4, 8), (9, 2)]), ShapeError, "argument 'B' dim 0 ('K'): expected 8"),
    (lambda: K2.specialize([(4, 8), (8, 2)], M=5), ShapeError, "expected 5"),
    (lambda: K.check_dtypes([f16]), SpecError, "expected dtype f32"),
    (lambda: K.check_dtypes([]), SpecError, "takes 1 inputs"),
    (lambda: K(1, 2), SpecError, "for PTX text use kernel.ptx"),
    (lambda: K(), SpecError, "got no arguments"),
    (lambda: K("x"), SpecError, "str"),
    # Tile and Dim
    (lambda: Tile("N"), SpecError, "Tile('N') has no element type"),
    (lambda: Tile("M", "N"), SpecError, "has no element type"),
    (lambda: Tile(), SpecError, "needs its dims and an element type"),
    (lambda: Tile("N", "f33"), SpecError, "did you mean 'f32'"),
    (lambda: Tile("N", "f-32"), SpecError, "Tile element type"),
    (lambda: Tile(0, f32), SpecError, "Tile dim 0 must be positive"),
    (lambda: Tile(4, -2, f32), SpecError, "Tile dim 1 must be positive"),
    (lambda: Tile(1.5, f32), SpecError, "Tile dim 0 must be an int or a dim name"),
    (lambda: Tile(None, f32), SpecError, "Tile dim 0 must be an int or a dim name"),
    (lambda: Tile(True, f32), SpecError, "Tile dim 0 must be an int or a dim name"),
    (lambda: Tile("N-1", f32), SpecError, "Dim name must be a Python identifier"),
    (lambda: Tile("N", pred), SpecError, "cannot be pred"),
    (lambda: Tile("N", 5), SpecError, "must be the element type"),
    (lambda: Tile("N", f32, layout="row"), SpecError, "must be a Layout"),
    # DSL calls outside a kernel body
    (lambda: reg.scalar(f32), TraceError, "only valid inside a @kernel body"),
    (lambda: reg.array(f32, 2), TraceError, "only valid inside a @kernel body"),
    (lambda: smem.alloc(f32, 4), TraceError, "only valid inside a @kernel body"),
    (lambda: ptx.ret(), TraceError, "only valid inside a @kernel body"),
    (lambda: ptx.special.tid.x(), TraceError, "only valid inside a @kernel body"),
    (lambda: ptx.label(), TraceError, "only valid inside a @kernel body"),
    (lambda: ptx.bar_sync(), TraceError, "only valid inside a @kernel body"),
]


@pytest.mark.parametrize("case, exc, text", CALL, ids=[f"L{c.__code__.co_firstlineno}" for c, _, _ in CALL])
def test_call_mistake_is_reported_at_its_line(case, exc, text):
    with pytest.raises(exc) as ei:
        case()
    msg = str(ei.value)
    assert isinstance(ei.value, PyptxError)
    at = f"{HERE}:{case.__code__.co_firstlineno}"
    # Launch options that only a trace resolves name the kernel first, then where it is defined.
    assert msg.startswith(at + ": ") or msg.startswith("kernel ") and f"defined at {at}: " in msg, msg
    assert text in msg, msg


def test_bare_kernel_decorator_works_like_kernel_with_parentheses():
    @kernel
    def bare():
        ptx.ret()

    assert bare.ptx() == kernel()(bare.fn).ptx()


# --------------------------------------------------------------------- PARSE cases: (text, message)
PARSE = [
    (bytes(range(256)) * 4, "is not UTF-8"),
    (b"\x7fELF\x02\x01\x01\x00" + bytes(range(128, 256)), "ELF binary"),
    (b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 32, "binary data"),
    (b".version 8.0\n// caf\xe9\n.target sm_90a\n", "byte 0xe9 is not UTF-8"),
    (b"\xff\xfe.\x00v\x00", "is not UTF-8"),
    (".version 8.0\n.target sm_90a\n/* never closed\n.visible .entry k() { ret; }\n", "unterminated /* comment"),
    (".version 8.0\n.target sm_90a\n.visible .entry k()\n{\n\tret\n}\n", "without a terminating ';'"),
    (".version 8.0\n.target sm_90a\nadd.u32 %r1, %r2, %r3;\n", "instruction outside a function body"),
    (".version 8.0\n.target sm_90a\n.visible .entry k()\n{\n\tadd.u32 %r1, , %r2;\n}\n", "malformed operands"),
    (".version 8.0\n.target sm_90a\n.visible .entry k()\n{\n\tret;\n", "end of input"),
    (".version 8.0\n.target sm_90a\n}\n", ""),
    (".version 8.0\n.address_size 48a\n", ".address_size must be 32 or 64"),
    (".version 8.0\n.section .debug_info\n.target sm_90a\n", "expected '{' after .section"),
    (".version 8.0\n.target sm_90a\n.visible .entry k()\n{\n\t.section .x { }\n}\n", ".section inside a function body"),
    ("\x00\x01\x02", "binary data"),
    ("#include <x>\n", "expected an instruction"),
]


@pytest.mark.parametrize("text, needle", PARSE, ids=[f"P{i}" for i in range(len(PARSE))])
def test_parser_refuses_bad_text_with_a_parse_error(text, needle):
    with pytest.raises(ParseError) as ei:
        parse(text, "bad.ptx")
    assert str(ei.value).startswith("bad.ptx:"), str(ei.value)
    assert needle in str(ei.value), str(ei.value)
    with pytest.raises(ParseError):
        transpile(text if isinstance(text, str) else text.decode("latin-1") + "\x00", source="bad.ptx")


NESTED = """.version 8.0
.target sm_90a
.address_size 64

.visible .entry k(
\t.param .u64 k_param_0
)
{
\t.reg .u64 %tmp<2>;
\t.reg .u64 %rd<2>;
\tmov.u64 %tmp0, 1;
\t{
\t.reg .u64 %tmp;
\t.reg .u64 %rd1;
\tld.param.u64 %rd1, [k_param_0];
\tcvta.to.global.u64 %tmp, %rd1;
\tst.global.u64 [%tmp], %tmp0;
\t}
\tadd.u64 %tmp1, %tmp0, 1;
\tret;
}
"""


@pytest.mark.parametrize("mode", ["plain", "exact", "sugar"])
def test_transpiler_scopes_registers_redeclared_in_nested_blocks(mode, assemble):
    code = transpile(NESTED, exact=mode == "exact", sugar=mode == "sugar")
    ns: dict = {"__name__": "nested"}
    exec(compile(code, "<nested>", "exec"), ns)
    out = ns["build"]().ptx()
    if mode == "exact":
        assert out == NESTED
    assemble(out)


READ_BEFORE_WRITE = """.version 8.0
.target sm_90a
.address_size 64

.visible .entry k(
\t.param .u64 k_param_0
)
{
\t.reg .b32 %r<2>;
\t.reg .b64 %rd<3>;
\tld.param.u64 %rd1, [k_param_0];
\tcvta.to.global.u64 %rd2, %rd1;
\tst.global.u32 [%rd2], %r1;
\tmov.u32 %r1, %tid.x;
\tst.global.u32 [%rd2+4], %r1;
\tret;
}
"""


def test_sugar_keeps_registers_that_ptx_reads_before_writing(assemble):
    # Found by the fuzzer: %r1 renamed to tid_x was read before its mov (UnboundLocalError).
    code = transpile(READ_BEFORE_WRITE, sugar=True)
    ns: dict = {"__name__": "rbw"}
    exec(compile(code, "<rbw>", "exec"), ns)
    out = ns["build"]().ptx()
    assert "ptx.special.tid.x()" not in code
    assemble(out)


def test_transpiler_refuses_exact_with_sugar_and_too_deep_nesting():
    with pytest.raises(TranspileError, match="cannot be combined"):
        transpile(NESTED, exact=True, sugar=True)
    deep = NESTED.replace("\tret;", "{" * 300 + "}" * 300 + "\n\tret;")
    with pytest.raises(TranspileError, match="deeper than"):
        transpile(deep)


# --------------------------------------------------------------------- CLI cases
@pytest.fixture()
def files(tmp_path):
    (tmp_path / "syntax.py").write_text("x = 1\ndef f(:\n    pass\n")
    (tmp_path / "kern.py").write_text(
        "from pyptx import Tile, kernel, ptx\nfrom pyptx.types import f32\n\n"
        "@kernel(in_specs=(Tile('N', f32),), out_specs=(Tile('N', f32),))\n"
        "def k(X, Y):\n    ptx.ret()\n\n"
        "def raises():\n    return {}['no']\n")
    (tmp_path / "latin1.ptx").write_bytes(b".version 8.0\n// caf\xe9\n.target sm_90a\n")
    (tmp_path / "elf.ptx").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(128, 256)))
    (tmp_path / "open.ptx").write_text(".version 8.0\n/* open\n")
    (tmp_path / "nested.ptx").write_text(NESTED)
    (tmp_path / "adir").mkdir()
    fake = tmp_path / "fakeptxas"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return tmp_path


CLI = [
    (["ptx", "{d}/missing.py:k"], "no such file"),
    (["ptx", "{d}/adir:k"], "is a directory; expected a Python file"),
    (["ptx", "{d}/syntax.py:f"], "raised SyntaxError at {d}/syntax.py:2"),
    (["ptx", "{d}/kern.py:k", "N=8", "-o", "{d}/nodir/k.ptx"], "directory {d}/nodir does not exist"),
    (["ptx", "{d}/kern.py:k", "N=8", "-o", "{d}/adir"], "is a directory"),
    (["ptx", "{d}/kern.py:k", "N"], "expected name=value"),
    (["ptx", "{d}/kern.py:k", "N=1", "N=2"], "given twice"),
    (["ptx", "{d}/kern.py:k", "N=8", "Q=1"], "not a parameter"),
    (["ptx", "{d}/kern.py:k", "N=0"], "must be a positive int"),
    (["ptx", "{d}/kern.py:k"], "needs N=..."),
    (["ptx", "{d}/kern.py"], "expected FILE:NAME"),
    (["ptx", "{d}/kern.py:nothing"], "has no attribute 'nothing'"),
    (["ptx", "{d}/kern.py:raises"], "raised KeyError at {d}/kern.py:9"),
    (["ptx", "no_such_module_xyz:k"], "neither a .py file nor an importable module"),
    (["check", "{d}/kern.py:k", "N=8"], "wrote no cubin", {"PYPTX_PTXAS": "{d}/fakeptxas"}),
    (["check", "{d}/kern.py:k", "N=8"], "PYPTX_PTXAS", {"PYPTX_PTXAS": "{d}/none"}),
    (["transpile", "{d}/missing.ptx"], "No such file"),
    (["transpile", "{d}/adir"], "is a directory; expected a PTX file"),
    (["transpile", "{d}/latin1.ptx"], "latin1.ptx:2:7: byte 0xe9 is not UTF-8"),
    (["transpile", "{d}/elf.ptx"], "ELF binary"),
    (["transpile", "{d}/open.ptx"], "unterminated /* comment"),
    (["transpile", "{d}/nested.ptx", "-o", "{d}/nodir/out.py"], "does not exist"),
]


@pytest.mark.parametrize("case", CLI, ids=[f"C{i}" for i in range(len(CLI))])
def test_cli_mistake_ends_in_one_error_line(case, files, capsys, monkeypatch):
    argv, needle, *env = case
    d = str(files)
    for k, v in (env[0] if env else {}).items():
        monkeypatch.setenv(k, v.format(d=d))
    code = cli_main([a.format(d=d) for a in argv])
    err = capsys.readouterr().err
    assert code in (1, 2), err
    assert err.startswith(("pyptx: error: ", "pyptx transpile: ")), err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert needle.format(d=d) in err, err


def test_cli_reports_a_bug_in_one_line(monkeypatch, capsys):
    import pyptx.cli as cli

    def broken(args):
        raise RuntimeError("boom")

    monkeypatch.delenv("PYPTX_DEBUG", raising=False)
    monkeypatch.setattr(cli, "_cmd_doctor", broken)
    assert cli.main(["doctor"]) == 3
    assert "internal error: RuntimeError: boom" in capsys.readouterr().err


def test_suite_is_large_enough():
    assert len(DSL) + len(DSL_OPTIONS) + len(CALL) + len(PARSE) + len(CLI) >= 150
