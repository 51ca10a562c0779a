"""Bad input: each case raises the right PyptxError subclass, and its message explains the
problem and starts with this test file's path and the offending line (``file:line: ...``)."""

from __future__ import annotations

import inspect

import pytest

import pyptx
from pyptx import Tile, ptx, reg, smem
from pyptx.errors import (
    CompileError,
    ConfigError,
    LaunchError,
    OperandError,
    PyptxError,
    RegisterScopeError,
    RuntimeUnavailableError,
    ShapeError,
    SpecError,
    ToolchainError,
    TraceError,
    TypeMismatchError,
    UnboundDimError,
)
from pyptx.types import f16, f32, f64, pred, u16, u32, u64

MARK = "# <- error"


def marked_line(fn) -> int:
    """The absolute line number of the line of ``fn`` tagged with the error marker."""
    src, start = inspect.getsourcelines(fn)
    hits = [i for i, ln in enumerate(src) if MARK in ln]
    assert len(hits) == 1, f"{fn.__name__} must mark exactly one line"
    return start + hits[0]


def trace(fn, in_specs=(), out_specs=(), **dims):
    return pyptx.kernel(in_specs, out_specs, name="k")(fn).ptx(**dims)


def check(exc, fn, *needles, in_specs=(), out_specs=(), **dims):
    line = marked_line(fn)
    with pytest.raises(exc) as ei:
        trace(fn, in_specs, out_specs, **dims)
    e = ei.value
    assert isinstance(e, PyptxError)
    msg = str(e)
    assert msg.startswith(f"{__file__}:{line}: "), msg
    for n in needles:
        assert n in msg, (n, msg)
    return e


# ---------------------------------------------------------------- helpers: operand count

def wrong_count_bar_sync():
    ptx.bar_sync(0, 64, 3)  # <- error


def wrong_count_special():
    ptx.special.tid.x(1)  # <- error


def wrong_count_addr():
    ptx.addr()  # <- error


def wrong_count_scalar():
    reg.scalar()  # <- error


def wrong_count_reduce():
    v = reg.scalar(f32)
    ptx.warp.reduce_sum(v, 16)  # <- error


@pytest.mark.parametrize("fn,needle", [
    (wrong_count_bar_sync, "bar_sync() takes from 0 to 2 positional arguments but 3 were given"),
    (wrong_count_special, "takes 1 positional argument but 2 were given"),
    (wrong_count_addr, "addr() missing 1 required positional argument: 'base'"),
    (wrong_count_scalar, "scalar() missing 1 required positional argument"),
    (wrong_count_reduce, "reduce_sum() takes 1 positional argument but 2 were given"),
], ids=lambda v: getattr(v, "__name__", ""))
def test_wrong_operand_count_in_helpers(fn, needle):
    e = check(TraceError, fn, "tracing kernel 'k' raised TypeError", needle)
    assert isinstance(e.__cause__, TypeError)


# ---------------------------------------------------------------- helpers: operand type

def bad_bar_id():
    ptx.bar_sync("0")  # <- error


def bad_global_ptrs(X):
    ptx.global_ptrs(X, 5)  # <- error


def bad_addr_base():
    f = reg.scalar(f32)
    ptx.addr(f, 4)  # <- error


def bad_if():
    r = reg.scalar(u32)
    with ptx.if_(r):  # <- error
        pass


def bad_loop_bound():
    for _ in ptx.loop(2.5):  # <- error
        pass


def bad_reduce():
    d = reg.scalar(f64)
    ptx.warp.reduce_max(d)  # <- error


def bad_smem_type():
    smem.alloc(pred, 4)  # <- error


def bad_scalar_param():
    ptx.scalar_param(f16, 1.0)  # <- error


def bad_array_len():
    reg.array(f32, -1)  # <- error


def bad_fence():
    ptx.fence("grid")  # <- error


def bad_branch_target():
    ptx.bra("L")  # <- error


def bad_special():
    ptx.special.tidd.x()  # <- error


def bad_inst_operand():
    r = reg.scalar(u32)
    ptx.inst.add.u32(r, r, None)  # <- error


def bad_inst_pred():
    r = reg.scalar(u32)
    ptx.inst.add.u32(r, r, 1, pred=r)  # <- error


def bad_opcode():
    ptx.inst.mvo.u32("%r0", 1)  # <- error


def bad_reg_type():
    reg.scalar("f32")  # <- error


def bad_immediate():
    r = reg.scalar(u16)
    ptx.inst.mov.u16(r, 70000)  # <- error


def bad_int_init():
    reg.scalar(u32, 4294967296)  # <- error


def bad_float_imm_for_int():
    ptx.inst.mov.u32("%r0", 0.5)  # <- error


@pytest.mark.parametrize("fn,exc,needles", [
    (bad_bar_id, OperandError, ["barrier id must be an int or register, got '0'"]),
    (bad_global_ptrs, OperandError, ["ptx.global_ptrs argument 1 must be a tensor parameter", "got 5"]),
    (bad_addr_base, OperandError, ["ptx.addr base must be a 32- or 64-bit integer register, got .f32"]),
    (bad_if, OperandError, ["ptx.if_ expects a predicate register, got Reg(%r0: u32)"]),
    (bad_loop_bound, OperandError, ["ptx.loop stop must be an int or register, got 2.5"]),
    (bad_reduce, OperandError, ["warp.reduce_max needs a 32-bit f32/u32/s32 register, got .f64"]),
    (bad_smem_type, OperandError, ["smem.alloc expects an element type such as f32, got pred"]),
    (bad_scalar_param, OperandError, ["scalar_param type must be a plain scalar", "got f16"]),
    (bad_array_len, OperandError, ["reg.array length must be a positive int, got -1"]),
    (bad_fence, OperandError, ["fence expects sem in ('sc', 'acq_rel')", "scope='grid'"]),
    (bad_branch_target, OperandError, ["ptx.bra expects a Label from ptx.label(), got 'L'"]),
    (bad_special, OperandError, ["%tidd is not a special register pyptx knows"]),
    (bad_inst_operand, OperandError, ["expected a register, Python number", "got NoneType None"]),
    (bad_inst_pred, OperandError, ["pred= expects a predicate register or ~p, got Reg(%r0: u32)"]),
    (bad_opcode, OperandError, ["'mvo' is not a PTX opcode"]),
    (bad_reg_type, OperandError, ["reg.scalar expects a PTX type such as f32, got 'f32'"]),
    (bad_immediate, OperandError, ["immediate 70000 does not fit .u16 (range -32768..65535)"]),
    (bad_int_init, OperandError, ["immediate 4294967296 does not fit .u32"]),
    (bad_float_imm_for_int, OperandError, ["expected an integer immediate for .u32, got float 0.5"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_wrong_operand_type_in_helpers(fn, exc, needles):
    e = check(exc, fn, *needles, in_specs=[Tile(4, f32)] if fn is bad_global_ptrs else ())
    assert isinstance(e, TraceError) and isinstance(e, TypeError)


# ---------------------------------------------------------------- type mismatches in sugar

def sugar_float_plus_int():
    a, b = reg.scalar(f32), reg.scalar(u32)
    a + b  # <- error


def sugar_f32_f64():
    a, b = reg.scalar(f32), reg.scalar(f64)
    b * a  # <- error


def sugar_signedness():
    from pyptx.types import s32
    a, b = reg.scalar(u32), reg.scalar(s32)
    _ = a < b  # <- error


def sugar_float_imm_on_int():
    a = reg.scalar(u32)
    a += 0.5  # <- error


def sugar_pred_arith():
    p = reg.scalar(pred)
    p - p  # <- error


def sugar_neg_unsigned():
    a = reg.scalar(u32)
    _ = -a  # <- error


def sugar_int_truediv():
    a = reg.scalar(u32)
    a / 2  # <- error


def sugar_float_mod():
    a = reg.scalar(f32)
    a % 2.0  # <- error


def sugar_half_div():
    a = reg.scalar(f16)
    a / a  # <- error


def sugar_wide_shift():
    a = reg.scalar(u32)
    a << reg.scalar(u64)  # <- error


def sugar_inplace_widening():
    a = reg.scalar(u32)
    a += reg.scalar(u64)  # <- error


def sugar_invert_float():
    ~reg.scalar(f32)  # <- error


def sugar_str_operand():
    reg.scalar(u32) & "0xff"  # <- error


def sugar_init_width():
    reg.scalar(u32, reg.scalar(f64))  # <- error


@pytest.mark.parametrize("fn,needles", [
    (sugar_float_plus_int, ["add of .f32 register %f0 and .u32 register %r0", "convert one first"]),
    (sugar_f32_f64, ["mul of .f64 register", "and .f32 register"]),
    (sugar_signedness, ["lt of .u32 register %r0 and .s32 register %ri0"]),
    (sugar_float_imm_on_int, ["add of .u32 register %r0 with float 0.5"]),
    (sugar_pred_arith, ["'sub' is not defined on predicates"]),
    (sugar_neg_unsigned, ["cannot negate .u32 register %r0"]),
    (sugar_int_truediv, ["'/' on integer registers is ambiguous; use // for div.u32"]),
    (sugar_float_mod, ["'rem' needs integer registers, got .f32"]),
    (sugar_half_div, ["PTX has no div.f16"]),
    (sugar_wide_shift, ["shift amount must be a 32-bit integer register or int, got .u64"]),
    (sugar_inplace_widening, ["in-place add would change %r0 from .u32 to .u64"]),
    (sugar_invert_float, ["~ needs an integer register, got .f32"]),
    (sugar_str_operand, ["and of register %r0 with str '0xff'"]),
    (sugar_init_width, ["init register %fd0 is .f64, expected .u32; use reg.from_"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_type_mismatch_in_sugar(fn, needles):
    e = check(TypeMismatchError, fn, *needles)
    assert isinstance(e, TraceError) and isinstance(e, TypeError)


# ---------------------------------------------------------------- registers outside their kernel

LEAKED: dict[str, object] = {}


def _leak(X):
    LEAKED["r"] = reg.scalar(u32)
    LEAKED["p"] = reg.scalar(pred)
    LEAKED["smem"] = smem.alloc(f32, 4)
    LEAKED["X"] = X
    LEAKED["label"] = ptx.label("x")


@pytest.fixture(scope="module", autouse=True)
def leaked():
    trace(_leak, [Tile(4, f32)])
    return LEAKED


def foreign_sugar():
    r = reg.scalar(u32)
    r + LEAKED["r"]  # <- error


def foreign_sugar_lhs():
    LEAKED["r"] + 1  # <- error


def foreign_inplace():
    r = LEAKED["r"]
    r += 1  # <- error


def foreign_inst():
    ptx.inst.add.u32(LEAKED["r"], LEAKED["r"], 1)  # <- error


def foreign_pred():
    r = reg.scalar(u32)
    ptx.inst.add.u32(r, r, 1, pred=LEAKED["p"])  # <- error


def foreign_if():
    with ptx.if_(~LEAKED["p"]):  # <- error
        pass


def foreign_from():
    reg.from_(LEAKED["r"], f32)  # <- error


def foreign_init():
    reg.scalar(u32, LEAKED["r"])  # <- error


def foreign_smem():
    smem.alloc(f32, 4)
    ptx.inst.ld.shared.f32(reg.scalar(f32), ptx.addr(LEAKED["smem"]))  # <- error


def foreign_tensor(X):
    ptx.inst.ld.param.u64(reg.scalar(u64), ptx.addr(LEAKED["X"]))  # <- error


def foreign_loop_bound():
    for _ in ptx.loop(LEAKED["r"]):  # <- error
        pass


@pytest.mark.parametrize("fn,needle", [
    (foreign_sugar, "register %r0 (u32) belongs to kernel 'k', not 'k'; registers cannot cross kernels"),
    (foreign_sugar_lhs, "register %r0 (u32) belongs to kernel 'k'"),
    (foreign_inplace, "register %r0 (u32) belongs to kernel 'k'"),
    (foreign_inst, "register %r0 (u32) belongs to kernel 'k'"),
    (foreign_pred, "register %p0 (pred) belongs to kernel 'k'"),
    (foreign_if, "register %p0 (pred) belongs to kernel 'k'"),
    (foreign_from, "register %r0 (u32) belongs to kernel 'k'"),
    (foreign_init, "register %r0 (u32) belongs to kernel 'k'"),
    (foreign_smem, "shared array smem belongs to kernel 'k'"),
    (foreign_tensor, "tensor parameter X belongs to kernel 'k'"),
    (foreign_loop_bound, "register %r0 (u32) belongs to kernel 'k'"),
], ids=lambda v: getattr(v, "__name__", ""))
def test_register_used_outside_its_kernel(fn, needle):
    e = check(RegisterScopeError, fn, needle, in_specs=[Tile(4, f32)] if fn is foreign_tensor else ())
    assert isinstance(e, TraceError)


def test_foreign_label():
    def body():
        ptx.bra(LEAKED["label"])  # <- error

    check(TraceError, body, "label $x belongs to another kernel")


def test_dsl_outside_any_kernel():
    cases = [
        lambda: LEAKED["r"] + 1,
        lambda: reg.scalar(u32),
        lambda: ptx.inst.ret(),
        lambda: ptx.special.laneid(),
        lambda: smem.alloc(f32, 4),
        lambda: ptx.bar_sync(),
        lambda: LEAKED["smem"].addr(),
    ]
    for case in cases:
        line = inspect.getsourcelines(case)[1]
        with pytest.raises(TraceError) as ei:
            case()
        msg = str(ei.value)
        assert msg.startswith(f"{__file__}:{line}: "), msg
        assert "only valid inside a @kernel body while it is traced" in msg


# ---------------------------------------------------------------- dims, shapes, grid

def test_unbound_symbolic_dim():
    k = pyptx.kernel([Tile("M", "K", f32)], [Tile("M", "N", f32)])(lambda_free_body)
    with pytest.raises(UnboundDimError) as ei:
        line = inspect.currentframe().f_lineno + 1
        k.ptx(M=4)
    msg = str(ei.value)
    assert msg.startswith(f"{__file__}:{line}: input 'A': dim 'K' has no value")
    assert "pass it as K=..." in msg and "(bound: {'M': 4})" in msg
    assert isinstance(ei.value, SpecError) and isinstance(ei.value, TypeError)


def lambda_free_body(A, C):
    pass


def test_shape_conflict_from_runtime_shapes():
    k = pyptx.kernel([Tile("M", "K", f32), Tile("K", "N", f32)], [Tile("M", "N", f32)])(
        matmul_body)
    with pytest.raises(ShapeError) as ei:
        line = inspect.currentframe().f_lineno + 1
        k.specialize([(2, 3), (4, 5)])
    msg = str(ei.value)
    assert msg == (f"{__file__}:{line}: argument 'B' dim 0 ('K'): expected 3 "
                   "(from argument 'A' dim 1), got 4")
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, SpecError)


def matmul_body(A, B, C):
    pass


@pytest.mark.parametrize("grid", [(1, 1), (0, 1, 1), (1, -1, 1), (1.5, 1, 1), "111", None, 4])
def test_grid_not_three_positive_ints(grid):
    with pytest.raises(ConfigError) as ei:
        line = inspect.currentframe().f_lineno + 1
        pyptx.kernel(grid=grid)(lambda_free_body_0)
    msg = str(ei.value)
    assert msg == f"{__file__}:{line}: grid must be three positive ints (x, y, z), got {grid!r}"
    assert isinstance(ei.value, ValueError)


def lambda_free_body_0():
    pass


def test_grid_callable_returning_garbage():
    line = inspect.currentframe().f_lineno + 1
    k = pyptx.kernel([Tile("N", f32)], grid=lambda N: (N, 0, 1))(one_input)
    with pytest.raises(ConfigError) as ei:
        k.ptx(N=3)
    assert str(ei.value) == (f"kernel 'one_input' defined at {__file__}:{line}: grid must be "
                             "three positive ints (x, y, z), got (3, 0, 1)")


def one_input(X):
    pass


def test_python_exception_in_body():
    def body():
        r = reg.scalar(u32)
        [r][3]  # <- error

    e = check(TraceError, body, "tracing kernel 'k' raised IndexError: list index out of range")
    assert isinstance(e.__cause__, IndexError)


def test_error_in_a_helper_function_points_at_the_helper_line():
    def helper(v):
        return v + reg.scalar(f64)  # <- error

    def body():
        helper(reg.scalar(f32))

    line = marked_line(helper)
    with pytest.raises(TypeMismatchError) as ei:
        trace(body)
    assert str(ei.value).startswith(f"{__file__}:{line}: add of .f32 register")


# ---------------------------------------------------------------- hierarchy

@pytest.mark.parametrize("cls,bases", [
    (SpecError, (PyptxError, TypeError)),
    (ShapeError, (SpecError, ValueError)),
    (UnboundDimError, (SpecError,)),
    (ConfigError, (PyptxError, ValueError)),
    (TraceError, (PyptxError,)),
    (OperandError, (TraceError, TypeError)),
    (TypeMismatchError, (TraceError, TypeError)),
    (RegisterScopeError, (TraceError,)),
    (CompileError, (PyptxError,)),
    (ToolchainError, (PyptxError,)),
    (RuntimeUnavailableError, (PyptxError, RuntimeError)),
    (LaunchError, (PyptxError, RuntimeError)),
])
def test_hierarchy(cls, bases):
    for b in bases:
        assert issubclass(cls, b)
    assert issubclass(cls, Exception)
    assert getattr(pyptx, cls.__name__) is cls
