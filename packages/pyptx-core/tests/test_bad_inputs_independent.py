"""An independent bad-input check: mistakes a newcomer makes, none of them a case of the other
bad-input suites. Each must raise a ``PyptxError`` subclass whose message starts with this
file's ``path:line`` (the line of the case) and says what was expected and what was given;
none may raise a builtin exception.

Kinds of case (one line each, so the line is the lambda's):
- ``DSL``: runs inside a traced kernel body named ``bad`` with ``c``, a ``Ctx`` to misuse;
- ``OPTIONS``: the same under other ``@kernel`` options;
- ``CALL``: runs as is (specs, dims, shapes, parse());
- ``EAGER``: an eager call with CPU tensors (torch), reported before the GPU is needed;
- ``CLI``: ``pyptx`` command lines on a file of builders, ending in one ``pyptx: error:``
  line that names the user's file (or checking every kernel of a multi-kernel builder).
"""

from __future__ import annotations

import inspect
import os
import pathlib

import pytest

from pyptx import Tile, kernel, ptx, reg, smem
from pyptx.cli import main as cli_main
from pyptx.errors import (
    ConfigError,
    OperandError,
    ParseError,
    PyptxError,
    ShapeError,
    SpecError,
    TraceError,
    TypeMismatchError,
)
from pyptx.parser import parse
from pyptx.types import bf16, f16, f32, pred, s32, u16, u32, u64

HERE = os.path.abspath(__file__)


class Ctx:
    """What a DSL case may misuse: registers of several types, the thread index, a predicate,
    a 4-register array, a 128-byte shared array ``buf`` and the kernel's tensors."""

    def __init__(self, X, Y):
        self.X, self.Y = X, Y
        self.r = reg.scalar(u32, 1)
        self.s = reg.scalar(s32, 1)
        self.d = reg.scalar(u64, 1)
        self.f = reg.scalar(f32, 1.0)
        self.p = self.r < 4
        self.tid = ptx.special.tid.x()
        self.arr = reg.array(f32, 4)
        self.buf = smem.alloc(f32, 32, name="buf")


def traced(case, **options):
    @kernel(in_specs=(Tile("N", f32),), out_specs=(Tile("N", f32),), name="bad", **options)
    def body(X, Y):
        case(Ctx(X, Y))

    return body.ptx(N=64)


def _check(ei, case, text):
    msg = str(ei.value)
    assert isinstance(ei.value, PyptxError), type(ei.value)
    assert msg.startswith(f"{HERE}:{case.__code__.co_firstlineno}: "), msg
    assert text in msg, msg


# --------------------------------------------------------------------- DSL: (case, error, text)
DSL = [
    # raw ptx.inst: operand counts, types, modifiers
    (lambda c: ptx.inst.mad.lo.u32(c.r, c.r, c.r), OperandError, "takes 4 operands (destination:.u32 source:.u32 source:.u32 source:.u32), got 3"),
    (lambda c: ptx.inst.cvt.rn.f32.u32.u32(c.f, c.r), OperandError, "too many type suffixes: .u32"),
    (lambda c: ptx.inst.membar.cta.gl(), OperandError, ".cta and .gl exclude each other in membar"),
    (lambda c: ptx.inst.mul.wide.u32(c.r, c.r, c.r), TypeMismatchError, "operand 1 (destination) must be a .u64 register"),
    (lambda c: ptx.inst.selp.u32(c.r, c.r, c.r, c.r), OperandError, "operand 4 (predicate) must be a predicate register or ~p, got .u32 register"),
    (lambda c: ptx.inst.shl.b64(c.d, c.d, c.d), TypeMismatchError, "operand 3 (shift amount) must be a .u32 register"),
    (lambda c: ptx.inst.st.global_.v2.f32(ptx.addr(c.d), [c.f]), OperandError, "must be a vector of 2 registers"),
    (lambda c: ptx.inst.cvta.to.global_.u32(c.r, c.d), TypeMismatchError, "must be a .u32 register"),
    (lambda c: ptx.inst.add.u32(c.r, c.r, c.r, pred=c.r), OperandError, "pred= expects a predicate register or ~p, got Reg(%r0: u32)"),
    (lambda c: ptx.inst.mov.u32(c.r, ""), OperandError, "must name something (a register, symbol or label), got the empty text ''"),
    (lambda c: ptx.inst.add.u32(c.r, c.r, "  "), OperandError, "got the empty text '  '"),
    # immediates ptxas limits
    (lambda c: ptx.inst.bar.sync(16), OperandError, "operand 1 (source) must be an int in 0..15, got 16"),
    (lambda c: ptx.inst.barrier.sync.aligned(1, 48), OperandError, "must be an int in 32..1024, a multiple of 32, got 48"),
    (lambda c: ptx.inst.bar.arrive(2, 2048), OperandError, "an int in 32..1024, a multiple of 32, got 2048"),
    (lambda c: ptx.inst.bar.red.popc.u32(c.r, 16, c.p), OperandError, "operand 2 (source) must be an int in 0..15, got 16"),
    (lambda c: ptx.inst("cp.async.ca.shared.global")(ptx.addr(c.buf), ptx.addr(c.d), 12), OperandError, "operand 3 (immediate) must be one of 4, 8, 16, got 12"),
    # state spaces and addresses
    (lambda c: ptx.inst.ld.global_.shared.f32(c.f, ptx.addr(c.d)), OperandError, ".global and .shared exclude each other in ld"),
    (lambda c: ptx.inst.ld.local.u32(c.r, ptx.addr(c.buf)), OperandError, "must be a .local address; buf is a shared array (use .shared)"),
    (lambda c: ptx.inst.st.param.f32(ptx.addr(c.buf, 4), c.f), OperandError, "must be a .param address; buf is a shared array"),
    (lambda c: ptx.inst.ld.shared.u64(c.d, ptx.addr(c.X)), OperandError, "must be a .shared address; X is a kernel parameter, read with ld.param"),
    (lambda c: ptx.inst.ld.u64(c.d, ptx.addr(c.X)), OperandError, "X is a kernel parameter"),
    (lambda c: ptx.inst.atom.shared.add.u32(c.r, ptx.addr(c.Y), c.r), OperandError, "must be a .shared address; Y is a kernel parameter"),
    # register arrays
    (lambda c: c.arr[1:9], OperandError, "slice [1:9] of length 4: stop 9 is outside it; expected in 0..4"),
    (lambda c: c.arr[-2:], OperandError, "start -2 is outside it; expected in 0..4"),
    (lambda c: c.arr[::0], OperandError, "step 0 is outside it; expected a positive int"),
    (lambda c: c.arr[0:"2"], OperandError, "slice stop must be a Python int, got '2'"),
    (lambda c: c.arr[True], OperandError, "indexed by Python ints at trace time, got True"),
    (lambda c: c.arr.__setitem__(slice(2, 6), 0.0), OperandError, "stop 6 is outside it"),
    (lambda c: reg.array(u64, 2**31), OperandError, "more 32-bit registers than an SM's register file has"),
    # shift amounts
    (lambda c: c.r.__ilshift__(32), OperandError, "<< by 32 on the 32-bit register %r0; expected a shift amount in 0..31"),
    (lambda c: reg.scalar(u16, 1) << 16, OperandError, "expected a shift amount in 0..15"),
    (lambda c: c.s >> -2, OperandError, ">> by -2 on the 32-bit register"),
    (lambda c: ptx.inst.shr.b16(reg.scalar(u16), reg.scalar(u16), 16), OperandError, "(shift amount) 16 is outside 0..15 for .b16"),
    # predicates
    (lambda c: reg.scalar(pred, 2), OperandError, "a predicate register takes True/False or 0/1, got 2"),
    (lambda c: reg.scalar(pred, 1.0), OperandError, "True/False or 0/1, got 1.0"),
    (lambda c: c.p ^ 2, OperandError, "xor of predicate %p0 with 2; expected a predicate register, ~p, True/False or 0/1"),
    (lambda c: c.p & -1, OperandError, "and of predicate %p0 with -1"),
    (lambda c: ptx.while_(c.r).__enter__(), TypeMismatchError, "condition must be a predicate (e.g. i < n), got .u32 register"),
    # shared allocation names
    (lambda c: smem.alloc(f32, 4, name="bad"), OperandError, "shared array name 'bad' is the name of the kernel"),
    (lambda c: smem.alloc(f32, 4, name="buf"), OperandError, "already allocated a shared array named 'buf'"),
    # CTA-wide barriers under thread-dependent control flow
    (lambda c: ptx.bar_sync(0, pred=ptx.special.warpid() < 2), TraceError, "its guard @%p1 depends on the thread index"),
    (lambda c: ptx.inst.barrier.sync(0, pred=~(c.tid < 32)), TraceError, "its guard @!%p1 depends on the thread index"),
    (lambda c: [ptx.bar_sync(0) for _ in ptx.loop(0, c.tid)], TraceError, "inside a branch on %p1, which depends on the thread index"),
    (lambda c: ptx.bar_sync(0, pred=reg.from_(ptx.special.tid.y()) == 0), TraceError, "waits for every thread of the CTA"),
    # setmaxnreg without a budget
    (lambda c: ptx.inst.setmaxnreg.dec.sync.aligned.u32(40), ConfigError, "declares no register budget; expected @kernel(maxnreg="),
]


@pytest.mark.parametrize("case, exc, text", DSL, ids=[f"L{c.__code__.co_firstlineno}" for c, _, _ in DSL])
def test_dsl_mistake(case, exc, text):
    with pytest.raises(exc) as ei:
        traced(case)
    _check(ei, case, text)


OPTIONS = [
    (lambda c: ptx.inst.setmaxnreg.inc.sync.aligned.u32(23), dict(maxnreg=128), OperandError, "must be an int in 24..256, a multiple of 8, got 23"),
    (lambda c: ptx.inst.setmaxnreg.inc.sync.aligned.u32(c.r), dict(maxnreg=128), OperandError, "must be an immediate Python int, got .u32 register"),
    (lambda c: smem.dynamic(name="bad"), dict(smem=1024), OperandError, "is the name of the kernel it is allocated in"),
    (lambda c: ptx.inst.setmaxnreg.inc.sync.aligned.u32(240), dict(maxnreg=128, arch="sm_90"), TraceError, "needs sm_90a (an arch-specific target), but this kernel targets sm_90"),
    (lambda c: ptx.inst.wgmma.fence.sync.aligned(c.r), dict(arch="sm_90a"), OperandError, "ptx.inst.wgmma.fence.sync.aligned: takes 0 operands, got 1"),
    (lambda c: ptx.inst.wgmma.wait_group.sync.aligned(), dict(arch="sm_90a"), OperandError, "takes 1 operands, got 0"),
    (lambda c: ptx.inst.tcgen05.fence__before_thread_sync(c.r), dict(arch="sm_100a"), OperandError, "tcgen05.fence::before_thread_sync: takes 0 operands, got 1"),
]


@pytest.mark.parametrize("case, options, exc, text", OPTIONS,
                         ids=[f"L{c.__code__.co_firstlineno}" for c, *_ in OPTIONS])
def test_dsl_mistake_under_options(case, options, exc, text):
    with pytest.raises(exc) as ei:
        traced(case, **options)
    _check(ei, case, text)


def test_the_same_forms_within_their_limits_are_emitted(assemble):
    def case(c):
        ptx.inst.bar.sync(15, 1024)
        ptx.inst.barrier.sync.aligned(1, 64)
        ptx.inst("cp.async.ca.shared.global")(ptx.addr(c.buf), ptx.addr(ptx.global_ptrs(c.X)[0]), 8)
        ptx.inst("cp.async.wait_all")()
        ptx.inst.ld.param.u64(c.d, ptx.addr(c.X))
        ptx.inst.ld.shared.f32(c.f, ptx.addr(c.buf, 4))
        ptx.inst.ld.f32(c.f, ptx.addr(c.buf, 8))  # generic addressing of a shared symbol
        ptx.inst.selp.u32(c.r, c.r, c.r, c.p)
        ptx.inst.shl.b64(c.d, c.d, c.r)
        c.arr[0:4] = 0.0
        assert len(c.arr[4:]) == 0 and len(c.arr[1:3]) == 2
        reg.scalar(pred, True)
        c.p | 1

    assemble(traced(case), "sm_90a")


# --------------------------------------------------------------------- CALL: (case, error, text)
def _nop(X, Y):
    pass


K1 = kernel(in_specs=(Tile("N", f32),), out_specs=(Tile("N", f32),), name="k1")(_nop)

CALL = [
    # spec construction and dtype strings
    (lambda: Tile("N", "f32", f16), SpecError, "Tile dim 1 'f32' is an element type, not a dim name; expected one element type, given last (got f16 last)"),
    (lambda: Tile("M", "float32", bf16), SpecError, "'float32' is an element type"),
    (lambda: Tile("N", "torch.float32"), SpecError, "expected a PTX type name such as 'f32', 'bf16' or 'u32', got 'torch.float32'"),
    (lambda: kernel(in_specs=(Tile("N", f32),), out_specs=(f32,))(_nop), SpecError, "out_specs[0] must be a Tile, got f32"),
    (lambda: kernel(in_specs={"X": Tile("N", f32)}, out_specs=(Tile("N", f32),))(_nop), SpecError, "in_specs must be a sequence of Tile"),
    # dims given as strings or None
    (lambda: K1.ptx(N="64"), SpecError, "dim 'N' must be a positive int, got '64'"),
    (lambda: K1.ptx(N=None), SpecError, "dim 'N' must be a positive int, got None"),
    # shapes handed to specialize (what a runtime does)
    (lambda: K1.specialize([64]), ShapeError, "argument 'X': expected a shape (a tuple of ints) for Tile('N', f32), got int 64"),
    (lambda: K1.specialize([("64",)]), ShapeError, "argument 'X': a shape holds non-negative ints, got '64'"),
    (lambda: K1.specialize([(-1,)]), ShapeError, "got -1 in (-1,)"),
    (lambda: K1.specialize(["N"]), ShapeError, "expected a shape (a tuple of ints) for Tile('N', f32), got str 'N'"),
    # parse() on what is not PTX text
    (lambda: parse(5), PyptxError, "parse expects PTX text (str or UTF-8 bytes), got int"),
    (lambda: parse(pathlib.Path("k.ptx")), PyptxError, "got PosixPath"),
]


@pytest.mark.parametrize("case, exc, text", CALL, ids=[f"L{c.__code__.co_firstlineno}" for c, _, _ in CALL])
def test_call_mistake(case, exc, text):
    with pytest.raises(exc) as ei:
        case()
    _check(ei, case, text)


# --------------------------------------------------------------------- PARSE: (text, message)
HEAD = ".version 8.0\n.target sm_90a\n.address_size 64\n"
PARSE = [
    (".version eight\n.target sm_90a\n", "1:1: .version must be a PTX ISA version major.minor such as 8.0, got 'eight'"),
    (".version 8.0.1\n.target sm_90a\n", "got '8.0.1'"),
    (".version 8.0\n.target\n", "2:1: .target needs an architecture such as sm_90a"),
    (HEAD + ".visible .entry k()\n{\nL1:\n\tret;\nL1:\n\tret;\n}\n", "8:1: label L1 is defined twice in one block (first at line 6)"),
]


@pytest.mark.parametrize("text, needle", PARSE, ids=[f"P{i}" for i in range(len(PARSE))])
def test_parse_mistake(text, needle):
    with pytest.raises(ParseError) as ei:
        parse(text, "bad.ptx")
    assert str(ei.value).startswith("bad.ptx:") and needle in str(ei.value), str(ei.value)


def test_labels_are_scoped_per_block():
    text = HEAD + ".visible .entry k()\n{\n\t{\n\tL1:\n\tbra L1;\n\t}\n\t{\n\tL1:\n\tbra L1;\n\t}\n\tret;\n}\n"
    assert [f.name for f in parse(text).functions] == ["k"]


# --------------------------------------------------------------------- EAGER: wrong CPU tensors
try:
    import torch
except ImportError:  # the core suite also runs without torch
    torch = None


@kernel(in_specs=(Tile("N", f32), Tile("N", f32)), out_specs=(Tile("N", f32),), block=(32, 1, 1))
def K2(X, W, Y):
    ptx.ret()


@kernel(in_specs=(Tile("M", "N", bf16),), out_specs=(Tile("M", f32),), block=(32, 1, 1))
def KM(X, Y):
    ptx.ret()


EAGER = [
    (lambda: K2(torch.arange(4), torch.zeros(4)), SpecError, "argument 'X': expected dtype f32 for Tile('N', f32), got int64"),
    (lambda: K2(torch.zeros(4), torch.zeros(4, dtype=torch.float64)), SpecError, "argument 'W': expected dtype f32"),
    (lambda: K2(torch.zeros(4), torch.zeros(5)), ShapeError, "argument 'W' dim 0 ('N'): expected 4"),
    (lambda: K2(torch.tensor(1.0), torch.tensor(1.0)), ShapeError, "expected rank 1 for Tile('N', f32), got shape ()"),
    (lambda: K2(torch.zeros(4)), SpecError, "takes 2 input tensors (X, W), got 1"),
    (lambda: KM(torch.zeros(4, 8, dtype=torch.bfloat16).t()), SpecError, "argument 'X' is not contiguous (strides (1, 8))"),
    (lambda: K2(torch.zeros(4), 3), SpecError, "argument 'W': expected an array of the same runtime"),
    (lambda: K2(torch.zeros(4), torch.zeros(4), N=8), ShapeError, "argument 'X' dim 0 ('N'): expected 8 (from keyword argument), got 4"),
]


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("case, exc, text", EAGER, ids=[f"L{c.__code__.co_firstlineno}" for c, _, _ in EAGER])
def test_eager_call_with_wrong_cpu_tensors(case, exc, text):
    with pytest.raises(exc) as ei:
        case()
    _check(ei, case, text)
    assert "is on cpu" not in str(ei.value)


# --------------------------------------------------------------------- CLI
BUILDERS = '''\
from types import SimpleNamespace
from pyptx import Tile, kernel, ptx
from pyptx.types import f32

@kernel(in_specs=(Tile('N', f32),), out_specs=(Tile('N', f32),))
def first(X, Y):
    ptx.ret()

@kernel(in_specs=(Tile('N', f32),), out_specs=(Tile('N', f32),))
def second(X, Y):
    ptx.ret()

def as_dict(N):
    return SimpleNamespace(kernels={"a": first, "b": second})

def as_generator(N):
    return SimpleNamespace(kernels=(k for k in (first, second)))

def with_junk(N):
    return SimpleNamespace(kernels=(first, 5))

def with_none(N):
    return SimpleNamespace(kernels=())

def shared_named_as_kernel(N):
    from pyptx import smem

    @kernel(in_specs=(Tile('N', f32),), out_specs=(Tile('N', f32),))
    def tile(X, Y):
        smem.alloc(f32, 4, name="tile")

    return tile
'''
SMEM_LINE = next(i for i, ln in enumerate(BUILDERS.splitlines(), 1) if 'name="tile"' in ln)


@pytest.fixture()
def builders(tmp_path):
    path = tmp_path / "builders.py"
    path.write_text(BUILDERS)
    return str(path)


@pytest.mark.parametrize("name", ["as_dict", "as_generator"])
def test_check_checks_every_kernel_of_a_multi_kernel_builder(name, builders, capsys, ptxas_path):
    code = cli_main(["check", f"{builders}:{name}", "N=8"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert [ln.split()[0] for ln in out.splitlines()[2:4]] == ["first", "second"], out


@pytest.mark.parametrize("argv, needle", [
    (["check", "{f}:with_junk", "N=8"], "builder with_junk returned int in its .kernels; expected a Kernel"),
    (["ptx", "{f}:with_none", "N=8"], "builder with_none returned an empty tuple in its .kernels"),
    (["ptx", "{f}:shared_named_as_kernel", "N=8"], f"{{f}}:{SMEM_LINE}: shared array name 'tile' is the name of the kernel"),
    (["ptx", "{f}:first", "N=abc"], "dim N of kernel first must be a positive int, got N='abc'"),
])
def test_cli_mistake_ends_in_one_error_line(argv, needle, builders, capsys):
    code = cli_main([a.format(f=builders) for a in argv])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("pyptx: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert needle.format(f=builders) in err, err


def test_suite_is_large_enough():
    assert len(DSL) + len(OPTIONS) + len(CALL) + len(PARSE) + len(EAGER) + 6 >= 40


def test_unknown_kernel_option_is_named_at_the_decorator():
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(ConfigError, match=rf"test_bad_inputs_independent\.py:{line}: @kernel got unknown option 'bogus'"):
        kernel(in_specs=(Tile(4, f32),), out_specs=(), bogus=1)


def test_check_dtypes_takes_type_names_and_refuses_other_objects():
    @kernel(in_specs=(Tile(4, f32),), out_specs=())
    def k(x):
        ptx.ret()

    k.check_dtypes(["float32"])        # a dtype name maps through pyptx.types.from_name
    with pytest.raises(SpecError, match="expected a pyptx type or its name .* got 'nonsense'"):
        k.check_dtypes(["nonsense"])
    with pytest.raises(SpecError, match="expected a pyptx type or its name"):
        k.check_dtypes([3.5])
