"""Register sugar: the exact instruction each operator emits, type rules, widening, immediates."""

from __future__ import annotations

import math

import pytest

import pyptx
from pyptx import ptx, reg
from pyptx.errors import OperandError, TraceError, TypeMismatchError
from pyptx.reg import NotPred, Reg, RegArray
from pyptx.types import (
    b32,
    b64,
    bf16,
    f16,
    f16x2,
    f32,
    f64,
    pred,
    s8,
    s16,
    s32,
    s64,
    u8,
    u16,
    u32,
    u64,
)


def body(fn):
    """Trace ``fn`` as a kernel body; return its statements as PTX text (no indentation)."""
    k = pyptx.kernel(name="t")(fn)
    return [st.text() for st in k.specialize().module.functions[0].body]


def after_decls(fn, n_setup):
    """The statements of ``fn`` after its first ``n_setup`` (the register set-up)."""
    return body(fn)[n_setup:]


# ---------------------------------------------------------------- binary operators

# (register type, operator, expected opcode)
BINARY = [
    (u32, "+", "add.u32"), (u32, "-", "sub.u32"), (u32, "*", "mul.lo.u32"),
    (u32, "//", "div.u32"), (u32, "%", "rem.u32"), (u32, "&", "and.b32"),
    (u32, "|", "or.b32"), (u32, "^", "xor.b32"),
    (s32, "+", "add.s32"), (s32, "-", "sub.s32"), (s32, "*", "mul.lo.s32"),
    (s32, "//", "div.s32"), (s32, "%", "rem.s32"), (s32, "&", "and.b32"),
    (u64, "+", "add.u64"), (u64, "*", "mul.lo.u64"), (u64, "|", "or.b64"),
    (s64, "-", "sub.s64"), (s64, "//", "div.s64"),
    (b32, "+", "add.u32"), (b32, "^", "xor.b32"), (b64, "&", "and.b64"),
    (u16, "+", "add.u16"), (s16, "*", "mul.lo.s16"),
    (f32, "+", "add.f32"), (f32, "-", "sub.f32"), (f32, "*", "mul.f32"), (f32, "/", "div.rn.f32"),
    (f64, "+", "add.f64"), (f64, "*", "mul.f64"), (f64, "/", "div.rn.f64"),
    (f16, "+", "add.f16"), (f16, "*", "mul.f16"), (f16, "-", "sub.f16"),
    (bf16, "+", "add.bf16"), (bf16, "*", "mul.bf16"),
    (f16x2, "+", "add.f16x2"),
    (pred, "&", "and.pred"), (pred, "|", "or.pred"), (pred, "^", "xor.pred"),
]

OPS = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a / b, "//": lambda a, b: a // b, "%": lambda a, b: a % b,
    "&": lambda a, b: a & b, "|": lambda a, b: a | b, "^": lambda a, b: a ^ b,
    "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b,
}


@pytest.mark.parametrize("t,op,opcode", BINARY, ids=[f"{t}{op}" for t, op, _ in BINARY])
def test_binary_register_register(t, op, opcode):
    got = {}

    def k():
        a, b = reg.scalar(t), reg.scalar(t)
        got["c"] = OPS[op](a, b)
        got["a"], got["b"] = a, b

    lines = body(k)
    a, b, c = got["a"], got["b"], got["c"]
    # exactly one instruction, a fresh destination of the operand type
    assert lines == [f"{opcode} {c.name}, {a.name}, {b.name};"]
    assert c.type is t and c is not a and c is not b


SHIFTS = [
    (u32, "<<", "shl.b32"), (u32, ">>", "shr.u32"), (s32, ">>", "shr.s32"), (s32, "<<", "shl.b32"),
    (u64, "<<", "shl.b64"), (u64, ">>", "shr.u64"), (s64, ">>", "shr.s64"), (b32, ">>", "shr.u32"),
    (u16, "<<", "shl.b16"),
]


@pytest.mark.parametrize("t,op,opcode", SHIFTS, ids=[f"{t}{op}" for t, op, _ in SHIFTS])
def test_shifts(t, op, opcode):
    got = {}

    def k():
        a, n = reg.scalar(t), reg.scalar(u32)
        got.update(a=a, n=n, by_reg=OPS[op](a, n), by_int=OPS[op](a, 3))

    lines = body(k)
    a, n = got["a"], got["n"]
    # the shift amount is always a u32 register or a plain int, whatever the value's width
    assert lines == [
        f"{opcode} {got['by_reg'].name}, {a.name}, {n.name};",
        f"{opcode} {got['by_int'].name}, {a.name}, 3;",
    ]
    assert got["by_reg"].type is t


def test_shift_amount_rules():
    def wide_amount():
        reg.scalar(u64) << reg.scalar(u64)

    def float_amount():
        reg.scalar(u32) << 1.0

    def float_value():
        reg.scalar(f32) << 1

    with pytest.raises(TypeMismatchError, match="shift amount must be a 32-bit integer register"):
        body(wide_amount)
    with pytest.raises(TypeMismatchError, match="shift amount must be an int, got 1.0"):
        body(float_amount)
    with pytest.raises(TypeMismatchError, match="'shl' needs integer registers, got .f32"):
        body(float_value)


def test_reflected_operators_keep_operand_order():
    got = {}

    def k():
        a = reg.scalar(u32)
        f = reg.scalar(f32)
        got.update(a=a, f=f, radd=3 + a, rsub=3 - a, rmul=3 * a, rand=3 & a, ror=3 | a,
                   rxor=3 ^ a, rfsub=1.5 - f)

    lines = body(k)
    a, f = got["a"].name, got["f"].name
    assert lines == [
        f"add.u32 {got['radd'].name}, {a}, 3;",
        f"sub.u32 {got['rsub'].name}, 3, {a};",  # 3 - a, not a - 3
        f"mul.lo.u32 {got['rmul'].name}, {a}, 3;",
        f"and.b32 {got['rand'].name}, {a}, 3;",
        f"or.b32 {got['ror'].name}, {a}, 3;",
        f"xor.b32 {got['rxor'].name}, {a}, 3;",
        f"sub.f32 {got['rfsub'].name}, 0f3FC00000, {f};",
    ]


# ---------------------------------------------------------------- in-place

INPLACE = [
    ("+=", "add.u32"), ("-=", "sub.u32"), ("*=", "mul.lo.u32"), ("&=", "and.b32"),
    ("|=", "or.b32"), ("^=", "xor.b32"), ("<<=", "shl.b32"), (">>=", "shr.u32"),
]


@pytest.mark.parametrize("op,opcode", INPLACE, ids=[o for o, _ in INPLACE])
def test_inplace_writes_the_same_register(op, opcode):
    got = {}

    def k():
        a = reg.scalar(u32)
        before = a
        ns = {"a": a}
        exec(f"a {op} 5", {}, ns)
        got.update(a=before, after=ns["a"])

    lines = body(k)
    a = got["a"].name
    assert got["after"] is got["a"]  # the Python name still holds the same register
    assert lines == [f"{opcode} {a}, {a}, 5;"]


def test_inplace_float_and_pointer():
    got = {}

    def k():
        f = reg.scalar(f32)
        f += 0.5
        p = reg.scalar(u64)
        off = reg.scalar(u32)
        p += off  # pointer += 32-bit offset: widen, then add into p
        got.update(f=f, p=p, off=off)

    lines = body(k)
    f, p, off = got["f"].name, got["p"].name, got["off"].name
    assert lines[0] == f"add.f32 {f}, {f}, 0f3F000000;"
    assert lines[1].startswith("cvt.u64.u32 %rd") and lines[1].endswith(f", {off};")
    wide = lines[1].split()[1].rstrip(",")
    assert lines[2] == f"add.u64 {p}, {p}, {wide};"
    assert len(lines) == 3


def test_inplace_bit_register_with_unsigned_operand():
    got = {}

    def k():
        b = reg.scalar(b32)
        u = reg.scalar(u32)
        b ^= u
        b += u
        got.update(b=b, u=u)

    lines = body(k)
    b, u = got["b"].name, got["u"].name
    assert lines == [f"xor.b32 {b}, {b}, {u};", f"add.u32 {b}, {b}, {u};"]


def test_inplace_cannot_change_type():
    def k():
        a = reg.scalar(u32)
        a += reg.scalar(u64)

    with pytest.raises(TypeMismatchError, match="in-place add would change %r0 from .u32 to .u64"):
        body(k)


# ---------------------------------------------------------------- comparisons

CMPS = [("<", "lt"), ("<=", "le"), (">", "gt"), (">=", "ge"), ("==", "eq"), ("!=", "ne")]
CMP_FN = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


@pytest.mark.parametrize("t,ty", [(u32, "u32"), (s32, "s32"), (u64, "u64"), (f32, "f32"),
                                  (f64, "f64"), (b32, "u32"), (s16, "s16")])
@pytest.mark.parametrize("op,cmp", CMPS)
def test_comparison_gives_a_predicate(t, ty, op, cmp):
    got = {}

    def k():
        a, b = reg.scalar(t), reg.scalar(t)
        got.update(a=a, b=b, p=CMP_FN[op](a, b))

    lines = body(k)
    p = got["p"]
    assert isinstance(p, Reg) and p.type is pred
    assert lines == [f"setp.{cmp}.{ty} {p.name}, {got['a'].name}, {got['b'].name};"]


def test_comparison_with_immediates():
    got = {}

    def k():
        a = reg.scalar(s32)
        f = reg.scalar(f32)
        got.update(a=a, f=f, p1=a < -1, p2=5 < a, p3=f >= 0.1)

    lines = body(k)
    a, f = got["a"].name, got["f"].name
    assert lines == [
        f"setp.lt.s32 {got['p1'].name}, {a}, -1;",
        f"setp.gt.s32 {got['p2'].name}, {a}, 5;",  # 5 < a is a > 5
        f"setp.ge.f32 {got['p3'].name}, {f}, 0f3DCCCCCD;",
    ]


def test_predicates_cannot_be_ordered():
    def k():
        p = reg.scalar(pred)
        _ = p < reg.scalar(pred)

    with pytest.raises(TypeMismatchError, match="cannot compare predicates with 'lt'"):
        body(k)


# ---------------------------------------------------------------- unary

def test_negation_and_not():
    got = {}

    def k():
        s, f, u = reg.scalar(s32), reg.scalar(f32), reg.scalar(u64)
        got.update(s=s, f=f, u=u, ns=-s, nf=-f, inv=~u)

    assert body(k) == [
        f"neg.s32 {got['ns'].name}, {got['s'].name};",
        f"neg.f32 {got['nf'].name}, {got['f'].name};",
        f"not.b64 {got['inv'].name}, {got['u'].name};",
    ]


@pytest.mark.parametrize("t", [u32, b32, pred])
def test_negating_unsigned_is_an_error(t):
    def k():
        -reg.scalar(t)

    with pytest.raises(TypeMismatchError, match=f"cannot negate .{t.name} register"):
        body(k)


def test_invert_float_is_an_error():
    def k():
        ~reg.scalar(f32)

    with pytest.raises(TypeMismatchError, match="~ needs an integer register, got .f32"):
        body(k)


def test_not_pred_emits_nothing_until_combined():
    got = {}

    def k():
        p, q = reg.scalar(pred), reg.scalar(pred)
        n = ~p
        got.update(p=p, q=q, n=n, nn=~n, both=n & q)

    lines = body(k)
    n = got["n"]
    assert isinstance(n, NotPred) and n.reg is got["p"]
    assert got["nn"] is got["p"]  # ~~p is p again
    assert len(lines) == 2
    assert lines[0].startswith("not.pred %p") and lines[0].endswith(f", {got['p'].name};")
    tmp = lines[0].split()[1].rstrip(",")
    assert lines[1] == f"and.pred {got['both'].name}, {tmp}, {got['q'].name};"


def test_predicate_arithmetic_is_an_error():
    def k():
        reg.scalar(pred) + reg.scalar(pred)

    with pytest.raises(TypeMismatchError, match="'add' is not defined on predicates"):
        body(k)


def test_register_has_no_truth_value():
    def k():
        if reg.scalar(u32) < 3:
            pass

    with pytest.raises(TraceError, match="has no Python truth value while tracing"):
        body(k)


# ---------------------------------------------------------------- widening and type rules

@pytest.mark.parametrize("wide,narrow,cvt", [
    (u64, u32, "cvt.u64.u32"), (u64, s32, "cvt.u64.s32"), (s64, s32, "cvt.s64.s32"),
    (s64, u32, "cvt.s64.u32"), (u32, u16, "cvt.u32.u16"), (b64, u32, "cvt.u64.u32"),
])
def test_wider_integer_wins(wide, narrow, cvt):
    got = {}

    def k():
        w, n = reg.scalar(wide), reg.scalar(narrow)
        got.update(w=w, n=n, s1=w + n, s2=n + w)

    lines = body(k)
    w, n = got["w"].name, got["n"].name
    assert got["s1"].type is wide and got["s2"].type is wide
    add = "add.u64" if wide is b64 else f"add.{wide.name}"
    # a + b and b + a each widen the narrow operand once, then add (operand order kept)
    assert lines[0].startswith(cvt + " ") and lines[0].endswith(f", {n};")
    c1 = lines[0].split()[1].rstrip(",")
    assert lines[1] == f"{add} {got['s1'].name}, {w}, {c1};"
    c2 = lines[2].split()[1].rstrip(",")
    assert lines[2] == f"{cvt} {c2}, {n};"
    assert lines[3] == f"{add} {got['s2'].name}, {c2}, {w};"
    assert len(lines) == 4


@pytest.mark.parametrize("wide,narrow,cvt", [(u64, u32, "cvt.u64.u32"), (s64, s32, "cvt.s64.s32")])
def test_wider_integer_wins_in_subtraction_both_ways(wide, narrow, cvt):
    got = {}

    def k():
        w, n = reg.scalar(wide), reg.scalar(narrow)
        got.update(w=w, n=n, d1=w - n, d2=n - w)

    lines = body(k)
    w, n = got["w"].name, got["n"].name
    c1, c2 = lines[0].split()[1].rstrip(","), lines[2].split()[1].rstrip(",")
    assert lines == [f"{cvt} {c1}, {n};", f"sub.{wide.name} {got['d1'].name}, {w}, {c1};",
                     f"{cvt} {c2}, {n};", f"sub.{wide.name} {got['d2'].name}, {c2}, {w};"]
    assert got["d1"].type is wide and got["d2"].type is wide


def test_pointer_plus_offset_end_to_end(assemble):
    @pyptx.kernel([pyptx.Tile(64, f32)], [pyptx.Tile(64, f32)], block=(64, 1, 1))
    def copy(X, Y):
        x, y = ptx.global_ptrs(X, Y)
        off = ptx.special.tid.x() << 2  # u32 byte offset
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(x + off))
        ptx.inst.st.global_.f32(ptx.addr(y + off), v)
        ptx.ret()

    src = copy.ptx()
    assert "cvt.u64.u32" in src and "add.u64" in src
    assemble(src)


def test_same_width_bit_type_adopts_the_other_type():
    got = {}

    def k():
        b, s = reg.scalar(b32), reg.scalar(s32)
        got.update(x=b + s, y=s // b, z=b < s)

    lines = body(k)
    assert got["x"].type is s32 and got["y"].type is s32
    assert lines[0].startswith("add.s32 ") and lines[1].startswith("div.s32 ")
    assert lines[2].startswith("setp.lt.s32 ")  # and the comparison is signed


@pytest.mark.parametrize("ta,tb", [(f32, u32), (f32, f64), (u32, s32), (f16, bf16),
                                   (u64, f64), (pred, u32), (f32, pred)])
def test_incompatible_types(ta, tb):
    def k():
        reg.scalar(ta) + reg.scalar(tb)

    with pytest.raises(TypeMismatchError) as ei:
        body(k)
    msg = str(ei.value)
    assert f".{ta.name} register" in msg and f".{tb.name} register" in msg
    assert "convert one first" in msg


def test_float_immediate_on_integer_register():
    def k():
        reg.scalar(u32) + 0.5

    with pytest.raises(TypeMismatchError, match=r"add of .u32 register %r0 with float 0.5"):
        body(k)


def test_non_number_operand():
    def k():
        reg.scalar(u32) + "7"

    with pytest.raises(TypeMismatchError, match=r"with str '7'; expected a register or a Python number"):
        body(k)


def test_integer_true_division_is_ambiguous():
    def k():
        reg.scalar(s32) / 2

    with pytest.raises(TypeMismatchError, match="use // for div.s32"):
        body(k)


@pytest.mark.parametrize("op", ["//", "%"])
def test_integer_only_ops_on_floats(op):
    def k():
        OPS[op](reg.scalar(f32), reg.scalar(f32))

    with pytest.raises(TypeMismatchError, match="needs integer registers, got .f32"):
        body(k)


@pytest.mark.parametrize("t", [f16, bf16, f16x2])
def test_no_16bit_float_division(t):
    def k():
        a = reg.scalar(t)
        a / a

    with pytest.raises(TypeMismatchError, match=f"PTX has no div.{t.name}"):
        body(k)


# ---------------------------------------------------------------- immediates, exactly

@pytest.mark.parametrize("t,value,text", [
    (f32, 0.1, "0f3DCCCCCD"), (f32, 1.0, "0f3F800000"), (f32, -2.5, "0fC0200000"),
    (f32, 3, "0f40400000"), (f32, -0.0, "0f80000000"), (f32, math.inf, "0f7F800000"),
    (f32, -math.inf, "0fFF800000"), (f32, math.nan, "0f7FC00000"), (f32, 1e300, "0f7F800000"),
    (f32, 1e-45, "0f00000001"),
    (f64, 1 / 3, "0d3FD5555555555555"), (f64, 0.1, "0d3FB999999999999A"), (f64, 1, "0d3FF0000000000000"),
    (f64, -math.inf, "0dFFF0000000000000"),
])
def test_float_immediates_exact(t, value, text):
    got = {}

    def k():
        a = reg.scalar(t)
        got.update(a=a, c=a + value)

    assert body(k) == [f"add.{t.name} {got['c'].name}, {got['a'].name}, {text};"]


@pytest.mark.parametrize("t,value,text", [
    (f32, 0.1, "mov.f32 {r}, 0f3DCCCCCD;"),
    (f64, 1 / 3, "mov.f64 {r}, 0d3FD5555555555555;"),
    (f16, 1.0, "mov.b16 {r}, 0x3C00;"), (f16, 0.1, "mov.b16 {r}, 0x2E66;"),
    (f16, -2.0, "mov.b16 {r}, 0xC000;"), (f16, 65504.0, "mov.b16 {r}, 0x7BFF;"),
    (f16, 1e6, "mov.b16 {r}, 0x7C00;"), (f16, -1e6, "mov.b16 {r}, 0xFC00;"),
    (bf16, 1.0, "mov.b16 {r}, 0x3F80;"), (bf16, 0.1, "mov.b16 {r}, 0x3DCD;"),
    (bf16, 3.0, "mov.b16 {r}, 0x4040;"), (bf16, -1.5, "mov.b16 {r}, 0xBFC0;"),
    (bf16, math.nan, "mov.b16 {r}, 0x7FC0;"), (bf16, math.inf, "mov.b16 {r}, 0x7F80;"),
    (f16x2, 1.0, "mov.b32 {r}, 0x3C003C00;"),
    (u32, 0xFFFFFFFF, "mov.u32 {r}, 4294967295;"), (u32, 0, "mov.u32 {r}, 0;"),
    (s32, -(2 ** 31), "mov.s32 {r}, -2147483648;"), (s32, 2 ** 31 - 1, "mov.s32 {r}, 2147483647;"),
    (u64, 2 ** 64 - 1, "mov.u64 {r}, 18446744073709551615;"),
    (s64, -(2 ** 63), "mov.s64 {r}, -9223372036854775808;"),
    (u16, 65535, "mov.u16 {r}, 65535;"), (b32, 0xDEADBEEF, "mov.b32 {r}, 3735928559;"),
    (u8, 255, "cvt.u8.u32 {r}, 255;"), (s8, -128, "cvt.s8.s32 {r}, -128;"),
    (pred, True, "mov.pred {r}, 1;"), (pred, 0, "mov.pred {r}, 0;"),
])
def test_scalar_init_encoded_exactly(t, value, text):
    got = {}

    def k():
        got["r"] = reg.scalar(t, init=value)

    assert body(k) == [text.format(r=got["r"].name)]


def test_scalar_init_assembles(assemble):
    @pyptx.kernel(name="inits")
    def inits():
        for t, v in [(f32, 0.1), (f64, 1 / 3), (f16, 0.1), (bf16, 0.1), (f16x2, 1.0),
                     (u32, 0xFFFFFFFF), (s32, -5), (u64, 2 ** 64 - 1), (u16, 7), (u8, 200),
                     (s8, -100), (b32, 1), (pred, 1)]:
            reg.scalar(t, init=v)
        ptx.ret()

    assemble(inits.ptx())


@pytest.mark.parametrize("t,value,rng", [
    (u32, 2 ** 32, "range -2147483648..4294967295"),
    (s32, 2 ** 31, "range -2147483648..2147483647"),
    (s32, -(2 ** 31) - 1, "range -2147483648..2147483647"),
    (u8, 256, "range -128..255"), (s8, 128, "range -128..127"),
    (u16, 70000, "range -32768..65535"), (u64, 2 ** 64, "range"),
])
def test_integer_immediate_range(t, value, rng):
    def k():
        reg.scalar(t, init=value)

    with pytest.raises(OperandError) as ei:
        body(k)
    msg = str(ei.value)
    assert f"immediate {value} does not fit .{t.name}" in msg and rng in msg
    assert __file__ in msg  # the message points at this test file


def test_integer_immediate_range_in_sugar():
    def k():
        reg.scalar(u16) + 70000

    with pytest.raises(OperandError, match="immediate 70000 does not fit .u16"):
        body(k)


def test_float_init_of_integer_register():
    def k():
        reg.scalar(u32, init=1.5)

    with pytest.raises(TypeMismatchError, match="float init 1.5 for integer register type .u32"):
        body(k)


def test_bad_init_and_type():
    def bad_init():
        reg.scalar(u32, init="1")

    def bad_type():
        reg.scalar("u32")

    with pytest.raises(OperandError, match="init must be a Python number or a register"):
        body(bad_init)
    with pytest.raises(OperandError, match="reg.scalar expects a PTX type"):
        body(bad_type)


def test_16bit_float_immediates_are_loaded_first(assemble):
    got = {}

    @pyptx.kernel(name="half")
    def half():
        h, b = reg.scalar(f16, 1.0), reg.scalar(bf16, 1.0)
        got.update(h=h, b=b, h2=h + 2.0, p=h < 0.5, b2=b * 3.0)
        ptx.ret()

    lines = [st.text() for st in half.specialize().module.functions[0].body]
    h, b = got["h"].name, got["b"].name
    # PTX's f16/bf16 arithmetic takes no immediates: each is moved into a register first
    assert lines[2].endswith(", 0x4000;") and lines[2].startswith("mov.b16 %h")
    assert lines[3] == f"add.f16 {got['h2'].name}, {h}, {lines[2].split()[1].rstrip(',')};"
    assert lines[4].endswith(", 0x3800;")
    assert lines[5].startswith(f"setp.lt.f16 {got['p'].name}, {h}, %h")
    assert lines[6].endswith(", 0x4040;")
    assert lines[7].startswith(f"mul.bf16 {got['b2'].name}, {b}, %bh")
    assemble(half.ptx())


# ---------------------------------------------------------------- init from a register, from_

def test_scalar_init_from_register():
    got = {}

    def k():
        u = reg.scalar(u32)
        got.update(u=u, a=reg.scalar(u32, u), f=reg.scalar(f32, u), s=reg.scalar(s32, u))

    lines = body(k)
    u = got["u"].name
    assert lines == [
        f"mov.u32 {got['a'].name}, {u};",
        f"mov.b32 {got['f'].name}, {u};",  # a bit copy: mov.f32 %f, %r is rejected by ptxas
        f"mov.b32 {got['s'].name}, {u};",
    ]


def test_scalar_init_from_register_of_other_width():
    def k():
        reg.scalar(u32, reg.scalar(u64))

    with pytest.raises(TypeMismatchError, match="is .u64, expected .u32; use reg.from_"):
        body(k)


@pytest.mark.parametrize("src,dst,text", [
    (u32, f32, "cvt.rn.f32.u32 {d}, {s};"), (s32, f32, "cvt.rn.f32.s32 {d}, {s};"),
    (s32, f64, "cvt.rn.f64.s32 {d}, {s};"), (f32, s32, "cvt.rzi.s32.f32 {d}, {s};"),
    (f32, u32, "cvt.rzi.u32.f32 {d}, {s};"), (f64, s64, "cvt.rzi.s64.f64 {d}, {s};"),
    (f32, f16, "cvt.rn.f16.f32 {d}, {s};"), (f16, f32, "cvt.f32.f16 {d}, {s};"),
    (f32, bf16, "cvt.rn.bf16.f32 {d}, {s};"), (bf16, f32, "cvt.f32.bf16 {d}, {s};"),
    (f64, f32, "cvt.rn.f32.f64 {d}, {s};"), (f32, f64, "cvt.f64.f32 {d}, {s};"),
    (f16, bf16, "cvt.rn.bf16.f16 {d}, {s};"),
    (u32, u64, "cvt.u64.u32 {d}, {s};"), (s32, s64, "cvt.s64.s32 {d}, {s};"),
    (u64, u32, "cvt.u32.u64 {d}, {s};"), (u16, u32, "cvt.u32.u16 {d}, {s};"),
    (u32, s32, "mov.b32 {d}, {s};"), (b64, u64, "mov.b64 {d}, {s};"),
    (f32, f32, "mov.f32 {d}, {s};"), (f16, f16, "mov.b16 {d}, {s};"),
    (pred, u32, "selp.u32 {d}, 1, 0, {s};"),
    (pred, f32, "selp.f32 {d}, 0f3F800000, 0f00000000, {s};"),
    (pred, f16, "selp.b16 {d}, 0x3C00, 0x0000, {s};"),
    (u32, pred, "setp.ne.u32 {d}, {s}, 0;"),
    (f32, pred, "setp.ne.f32 {d}, {s}, 0f00000000;"),
])
def test_from_conversions(src, dst, text):
    got = {}

    def k():
        s = reg.scalar(src)
        got.update(s=s, d=reg.from_(s, dst))

    lines = body(k)
    assert got["d"].type is dst
    assert lines == [text.format(d=got["d"].name, s=got["s"].name)]


def test_from_conversions_assemble(assemble):
    pairs = [(u32, f32), (f32, s32), (f32, f16), (f16, f32), (f32, bf16), (bf16, f32),
             (f64, f32), (f16, bf16), (u32, u64), (u64, u32), (pred, u32), (pred, f32),
             (pred, f16), (u32, pred), (f32, pred), (f16, pred), (bf16, pred), (s32, s64)]

    @pyptx.kernel(name="convs")
    def convs():
        for a, b in pairs:
            init = True if a is pred else 1
            reg.from_(reg.scalar(a, init), b)
        ptx.ret()

    assemble(convs.ptx())


def test_from_python_number_and_notpred():
    got = {}

    def k():
        p = reg.scalar(pred)
        got.update(p=p, x=reg.from_(7, u32), y=reg.from_(~p))

    lines = body(k)
    assert lines[0] == f"mov.u32 {got['x'].name}, 7;"
    assert lines[1].startswith("not.pred ") and lines[1].endswith(f", {got['p'].name};")
    assert lines[2].startswith(f"mov.pred {got['y'].name}, %p")
    assert got["y"].type is pred


def test_from_errors():
    def no_type():
        reg.from_(3)

    def bad_value():
        reg.from_("x", u32)

    with pytest.raises(OperandError, match=r"needs a type: reg.from_\(3, f32\)"):
        body(no_type)
    with pytest.raises(OperandError, match="reg.from_ expects a register or a number"):
        body(bad_value)


# ---------------------------------------------------------------- arrays

def test_array_registers():
    got = {}

    def k():
        a = reg.array(f32, 4)
        b = reg.array(f32, 2)
        got.update(a=a, b=b)

    body(k)
    a, b = got["a"], got["b"]
    assert isinstance(a, RegArray) and len(a) == 4 and a.type is f32
    assert [r.name for r in a] == ["%f0", "%f1", "%f2", "%f3"]
    assert [r.name for r in b] == ["%f4", "%f5"]  # consecutive numbering continues
    assert a[1].name == "%f1" and a[3].name == "%f3"
    assert [r.name for r in a[1:3]] == ["%f1", "%f2"]
    assert repr(a) == "RegArray(4 x f32)"


def test_array_errors():
    def oob():
        reg.array(u32, 2)[2]

    def bad_index():
        reg.array(u32, 2)[reg.scalar(u32)]

    def bad_len():
        reg.array(u32, 0)

    with pytest.raises(OperandError, match="index 2 out of range for length 2"):
        body(oob)
    with pytest.raises(OperandError, match="indexed by Python ints at trace time"):
        body(bad_index)
    with pytest.raises(OperandError, match="length must be a positive int, got 0"):
        body(bad_len)


# ---------------------------------------------------------------- the whole sugar set assembles

def test_all_sugar_assembles(assemble):
    @pyptx.kernel(name="sugar")
    def sugar():
        a, b = reg.scalar(u32, 7), reg.scalar(u32, 3)
        s = reg.scalar(s32, -7)
        w = reg.scalar(u64, 1)
        f, g = reg.scalar(f32, 1.5), reg.scalar(f32, 0.25)
        d = reg.scalar(f64, 1 / 3)
        h = reg.scalar(f16, 1.0)
        bh = reg.scalar(bf16, 2.0)
        for _x in (a + b, a - b, a * b, a // b, a % b, a & b, a | b, a ^ b, a << b, a >> 2,
                  s >> 1, s // 3, -s, ~a, 5 - a, w + a, w + s, w << 3):
            pass
        for _x in (f + g, f - 1.0, f * 0.1, f / g, -f, 2.0 - f, d / d, d + 0.1, h + 0.5, h * h,
                  h - 1.0, bh + 1.0, -bh):
            pass
        p = a < b
        q = f >= 0.0
        r = (p & q) | ~p
        _ = (d != 0.5) ^ r
        _ = h == 1.0
        _ = bh > 0.0
        a += 1
        a <<= 1
        w += a
        f *= 2.0
        ptx.ret()

    assemble(sugar.ptx())
