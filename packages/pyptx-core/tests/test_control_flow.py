"""Structured control flow beyond ``if_``/``loop``: ``ptx.else_``, ``ptx.while_`` (with
``break_``/``continue_``) and ``ptx.unrolled`` (k body copies per iteration plus a tail), and
``RegArray`` item assignment.

Each form is checked for its exact emitted shape, ptxas accepting it, its errors (the user's
file:line first), and its results in the PTX simulator for every residue of the trip count.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import pyptx
from pyptx import Tile, ptx, reg
from pyptx.errors import OperandError, RegisterScopeError, TraceError, TypeMismatchError
from pyptx.types import b32, f16, f32, pred, s32, u8, u32, u64

TESTS = Path(__file__).resolve().parent
HERE = __file__


def body(fn, **kw) -> list[str]:
    """The statements ``fn`` traces, as PTX text."""
    return [st.text() for st in pyptx.kernel(name="t", **kw)(fn).specialize().module.functions[0].body]


@pytest.fixture(scope="module")
def sim():
    global np
    np = pytest.importorskip("numpy")
    sys.path.insert(0, str(TESTS))
    import ptxsim

    return ptxsim


def per_thread_kernel(n_threads, fn, out_dtype=u32):
    """A kernel whose thread t computes ``fn(t)`` (a u32 register) and stores it to Y[t]."""

    @pyptx.kernel([Tile(n_threads, u32)], [Tile(n_threads, out_dtype)], block=(n_threads, 1, 1),
                  name="per_thread")
    def k(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        tid = ptx.special.tid.x()
        off = reg.scalar(u64)
        ptx.inst.mul.wide.u32(off, tid, 4)
        x = reg.scalar(u32)
        ptx.inst.ld.global_.u32(x, ptx.addr(px + off))
        out = fn(x)
        ptx.inst.st.global_.b32(ptx.addr(py + off), out)
        ptx.ret()

    return k


def run_per_thread(sim, fn, xs, out_dtype=u32):
    xs = np.asarray(xs, np.uint32)
    (y,) = sim.run(per_thread_kernel(len(xs), fn, out_dtype).specialize(), [xs])
    return y


# ---------------------------------------------------------------- else_

def test_if_else_exact_shape():
    got = {}

    def k():
        p = reg.scalar(pred)
        r = reg.scalar(u32, 0)
        with ptx.if_(p):
            r += 1
        with ptx.else_():
            r += 2
        got.update(p=p.name, r=r.name)

    lines = body(k)
    p, r = got["p"], got["r"]
    assert lines == [
        f"mov.u32 {r}, 0;", f"@!{p} bra $L_endif;", f"add.u32 {r}, {r}, 1;", "bra $L_endelse;",
        "$L_endif:", f"add.u32 {r}, {r}, 2;", "$L_endelse:",
    ]


def test_else_after_negated_and_nested_ifs():
    def k():
        p = reg.scalar(pred)
        q = reg.scalar(pred)
        r = reg.scalar(u32, 0)
        with ptx.if_(~p):
            with ptx.if_(q):
                r += 1
            with ptx.else_():  # belongs to the inner if_
                r += 2
        with ptx.else_():  # belongs to the outer if_
            r += 3

    lines = body(k)
    assert lines == [
        "mov.u32 %r0, 0;", "@%p0 bra $L_endif;",
        "@!%p1 bra $L_endif_1;", "add.u32 %r0, %r0, 1;", "bra $L_endelse;", "$L_endif_1:",
        "add.u32 %r0, %r0, 2;", "$L_endelse:",
        "bra $L_endelse_1;", "$L_endif:", "add.u32 %r0, %r0, 3;", "$L_endelse_1:",
    ]


def test_else_must_follow_an_if_block():
    def alone():
        with ptx.else_():
            pass

    def after_other_code():
        p = reg.scalar(pred)
        r = reg.scalar(u32, 0)
        with ptx.if_(p):
            r += 1
        r += 5
        with ptx.else_():
            pass

    def twice():
        p = reg.scalar(pred)
        with ptx.if_(p):
            pass
        with ptx.else_():
            pass
        with ptx.else_():
            pass

    for fn, line in ((alone, 1), (after_other_code, 6), (twice, 6)):
        with pytest.raises(TraceError) as ei:
            body(fn)
        msg = str(ei.value)
        assert msg.startswith(f"{HERE}:{fn.__code__.co_firstlineno + line}: "), msg
        assert "ptx.else_() must directly follow a `with ptx.if_(p):` block" in msg


def test_if_else_runs_both_branches(sim, assemble):
    def fn(x):
        r = reg.scalar(u32)
        with ptx.if_((x & 1) == 0):
            ptx.inst.mul.lo.u32(r, x, 2)
        with ptx.else_():
            ptx.inst.add.u32(r, x, 100)
        return r

    xs = list(range(64))
    y = run_per_thread(sim, fn, xs)
    assert y.tolist() == [2 * x if x % 2 == 0 else x + 100 for x in xs]
    assemble(per_thread_kernel(64, fn).ptx())


# ---------------------------------------------------------------- while_

def test_while_exact_shape_and_re_evaluated_condition():
    def k():
        i = reg.scalar(u32, 0)
        n = reg.scalar(u32, 10)
        with ptx.while_(lambda: i < n) as w:
            i += 3
            w.break_(pred=i == 7)
            w.continue_(pred=~(i == 4))

    assert body(k) == [
        "mov.u32 %r0, 0;", "mov.u32 %r1, 10;",
        "$L_while:", "setp.lt.u32 %p0, %r0, %r1;", "@!%p0 bra $L_while_end;",
        "add.u32 %r0, %r0, 3;", "setp.eq.u32 %p1, %r0, 7;", "@%p1 bra $L_while_end;",
        "setp.eq.u32 %p2, %r0, 4;", "@!%p2 bra $L_while;",
        "bra $L_while;", "$L_while_end:",
    ]


def test_while_on_a_predicate_register_and_its_negation():
    def k():
        p = reg.scalar(pred, 1)
        with ptx.while_(~p):
            pass
        with ptx.while_(p):
            ptx.inst.mov.pred(p, 0)

    assert body(k) == [
        "mov.pred %p0, 1;",
        "$L_while:", "@%p0 bra $L_while_end;", "bra $L_while;", "$L_while_end:",
        "$L_while_1:", "@!%p0 bra $L_while_end_1;", "mov.pred %p0, 0;", "bra $L_while_1;",
        "$L_while_end_1:",
    ]


def test_while_counts_and_breaks(sim, assemble):
    def collatz_steps(x):
        """Steps of the Collatz map from x + 1 down to 1, stopping early at 20 steps."""
        v = x + 1
        steps = reg.scalar(u32, 0)
        with ptx.while_(lambda: v != 1) as w:
            odd = (v & 1) == 1
            with ptx.if_(odd):
                ptx.inst.mad.lo.u32(v, v, 3, 1)
            with ptx.else_():
                ptx.inst.shr.u32(v, v, 1)
            steps += 1
            w.break_(pred=steps == 20)
        return steps

    def ref(x):
        v, s = x + 1, 0
        while v != 1 and s < 20:
            v = 3 * v + 1 if v % 2 else v // 2
            s += 1
        return s

    xs = list(range(32))
    y = run_per_thread(sim, collatz_steps, xs)
    assert y.tolist() == [ref(x) for x in xs]
    assemble(per_thread_kernel(32, collatz_steps).ptx())


def test_while_errors():
    def not_a_predicate():
        i = reg.scalar(u32, 0)
        with ptx.while_(lambda: i + 1):
            pass

    def not_callable():
        with ptx.while_(3):
            pass

    for fn, exc, needle in ((not_a_predicate, TypeMismatchError,
                             "ptx.while_ condition must be a predicate (e.g. i < n), got .u32"),
                            (not_callable, OperandError, "function returning one (lambda: i < n), got 3")):
        with pytest.raises(exc) as ei:
            body(fn)
        msg = str(ei.value)
        line = fn.__code__.co_firstlineno + (2 if fn is not_a_predicate else 1)
        assert msg.startswith(f"{HERE}:{line}: "), msg
        assert needle in msg


def test_while_break_of_another_kernel_is_refused():
    stash = {}

    def first():
        with ptx.while_(reg.scalar(pred, 0)) as w:
            stash["w"] = w

    body(first)

    def second():
        stash["w"].break_()

    with pytest.raises(TraceError, match="belongs to a loop of another kernel"):
        body(second)


# ---------------------------------------------------------------- unrolled

def test_unrolled_register_bound_shape():
    def k():
        n = reg.scalar(u32, 10)
        acc = reg.scalar(u32, 0)
        for i in ptx.unrolled(n, unroll=3):
            acc += i

    assert body(k) == [
        "mov.u32 %r0, 10;", "mov.u32 %r1, 0;", "mov.u32 %r2, 0;",
        "$L_unroll:", "add.u32 %r3, %r2, 2;", "setp.ge.u32 %p0, %r3, %r0;",
        "@%p0 bra $L_unroll_tail;",
        "add.u32 %r1, %r1, %r2;", "add.u32 %r2, %r2, 1;",
        "add.u32 %r1, %r1, %r2;", "add.u32 %r2, %r2, 1;",
        "add.u32 %r1, %r1, %r2;", "add.u32 %r2, %r2, 1;",
        "bra $L_unroll;",
        "$L_unroll_tail:", "setp.ge.u32 %p1, %r2, %r0;", "@%p1 bra $L_unroll_end;",
        "add.u32 %r1, %r1, %r2;", "add.u32 %r2, %r2, 1;", "bra $L_unroll_tail;",
        "$L_unroll_end:",
    ]


@pytest.mark.parametrize("start,stop,step,k,passes,tail", [
    (0, 0, 1, 4, 0, 0), (0, 3, 1, 4, 0, 3), (0, 4, 1, 4, 1, 0), (2, 13, 1, 4, 2, 3),
    (0, 17, 2, 4, 2, 1), (5, 1, 1, 2, 0, 0), (0, 12, 1, 1, 12, 0),
])
def test_unrolled_static_bounds_shape(start, stop, step, k, passes, tail):
    """Known trip count: ``passes`` of the k-copy body (a loop only for 2+), then ``tail``
    straight copies; no tail loop."""
    copies = []

    def kern():
        acc = reg.scalar(u32, 0)
        for i in ptx.unrolled(start, stop, step, unroll=k):
            copies.append(i)
            acc += i

    lines = body(kern)
    assert len(copies) == (k if passes else 0) + tail
    assert len({c.name for c in copies}) <= 1  # one induction register
    loops = [ln for ln in lines if ln.endswith(":")]
    assert loops == (["$L_unroll:"] if passes > 1 else [])
    if passes > 1:
        assert f"setp.lt.u32 %p0, %r1, {start + passes * k * step};" in lines
    assert sum(ln.startswith("add.u32 %r0, %r0,") for ln in lines) == len(copies)


@pytest.mark.parametrize("unroll", [1, 2, 3, 4, 8])
def test_unrolled_sums_every_residue(sim, assemble, unroll):
    """Thread t sums i*i over [t & 7, t) in steps of 1 and 2 with register bounds."""

    def fn(x):
        acc = reg.scalar(u32, 0)
        start = x & 7
        for i in ptx.unrolled(start, x, unroll=unroll):
            acc += i * i
        for i in ptx.unrolled(start, x, 2, unroll=unroll):
            acc += i
        return acc

    xs = list(range(40))
    y = run_per_thread(sim, fn, xs)
    assert y.tolist() == [sum(i * i for i in range(x & 7, x)) + sum(range(x & 7, x, 2)) for x in xs]
    assemble(per_thread_kernel(40, fn).ptx())


def test_unrolled_static_bounds_run(sim):
    def fn(x):
        acc = reg.scalar(u32, 0)
        for i in ptx.unrolled(3, 30, 3, unroll=4):  # 9 iterations: 2 passes + 1 tail copy
            acc += x * i
        return acc

    y = run_per_thread(sim, fn, list(range(32)))
    assert y.tolist() == [x * sum(range(3, 30, 3)) for x in range(32)]


def test_unrolled_signed_loop(sim):
    def fn(x):
        acc = reg.scalar(s32, 0)
        lo = reg.scalar(s32, -5)
        for i in ptx.unrolled(lo, reg.from_(x, s32), unroll=4, type=s32):
            acc += i
        return acc

    y = run_per_thread(sim, fn, list(range(16)))
    assert [int(v) for v in y.view(np.int32)] == [sum(range(-5, x)) for x in range(16)]


@pytest.mark.parametrize("args,kw,needle", [
    ((8,), {"unroll": 0}, "ptx.unrolled unroll must be a positive int, got 0"),
    ((8,), {"unroll": True}, "ptx.unrolled unroll must be a positive int, got True"),
    ((8,), {"unroll": 2.0}, "ptx.unrolled unroll must be a positive int, got 2.0"),
    ((0, 8, 0), {}, "ptx.unrolled step must be a positive int, got 0"),
    ((2.5,), {}, "ptx.unrolled stop must be an int or register, got 2.5"),
    ((8,), {"type": f32}, "ptx.unrolled type must be an integer PTX type"),
])
def test_unrolled_errors(args, kw, needle):
    def k():
        for _ in ptx.unrolled(*args, **kw):
            pass

    with pytest.raises(OperandError) as ei:
        body(k)
    assert str(ei.value).startswith(f"{HERE}:{k.__code__.co_firstlineno + 1}: ")
    assert needle in str(ei.value)


def test_unrolled_float_register_bound():
    def k():
        for _ in ptx.unrolled(reg.scalar(f32)):
            pass

    with pytest.raises(OperandError, match="ptx.unrolled stop must be an integer, got .f32"):
        body(k)


def test_control_flow_forms_assemble(assemble):
    @pyptx.kernel([Tile("N", u32)], [Tile("N", u32)], block=(128, 1, 1), name="flow")
    def flow(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        tid = ptx.special.tid.x()
        n = reg.scalar(u32, X.shape[0])
        acc = reg.scalar(u32, 0)
        for i in ptx.unrolled(tid, n, 128, unroll=4):
            v = reg.scalar(u32)
            ptx.inst.ld.global_.u32(v, ptx.addr(px + reg.from_(i, u64) * 4))
            with ptx.if_(v > 10):
                acc += v
            with ptx.else_():
                acc -= 1
        with ptx.while_(lambda: acc > 1000) as w:
            acc -= 1000
            w.continue_(pred=acc > 5000)
            w.break_()
        with ptx.if_(tid < n):
            ptx.inst.st.global_.u32(ptx.addr(py + reg.from_(tid, u64) * 4), acc)
        ptx.ret()

    assemble(flow.ptx(N=1000))


# ---------------------------------------------------------------- RegArray item assignment

def test_regarray_item_assignment_text():
    def k():
        acc = reg.array(f32, 4)
        acc[:] = 0.0
        acc[1] = 2.5
        acc[2] *= 0.5
        acc[3] += acc[0]
        acc[3] = acc[1]
        acc[0] = reg.scalar(b32)
        acc[0] = acc[0]
        acc[1:3] = [1, acc[3]]
        ps = reg.array(pred, 2)
        ps[0] = 1
        ps[1] = ~ps[0]
        bytes_ = reg.array(u8, 1)
        bytes_[0] = 7

    assert body(k) == [
        "mov.f32 %f0, 0f00000000;", "mov.f32 %f1, 0f00000000;", "mov.f32 %f2, 0f00000000;",
        "mov.f32 %f3, 0f00000000;", "mov.f32 %f1, 0f40200000;", "mul.f32 %f2, %f2, 0f3F000000;",
        "add.f32 %f3, %f3, %f0;", "mov.f32 %f3, %f1;", "mov.b32 %f0, %b0;",
        "mov.f32 %f1, 0f3F800000;", "mov.f32 %f2, %f3;",
        "mov.pred %p0, 1;", "not.pred %p1, %p0;", "cvt.u8.u32 %uc0, 7;",
    ]


def test_regarray_in_place_ops_emit_one_instruction_each():
    def k():
        acc = reg.array(u32, 3)
        acc[0] += 1
        acc[1] *= 3
        acc[2] ^= acc[0]

    assert body(k) == ["add.u32 %r0, %r0, 1;", "mul.lo.u32 %r1, %r1, 3;", "xor.b32 %r2, %r2, %r0;"]


def test_regarray_assignment_runs(sim, assemble):
    def fn(x):
        acc = reg.array(u32, 4)
        acc[:] = 0
        for j in range(4):
            acc[j] += x
            acc[j] *= j + 1
        acc[0] = acc[3]
        total = reg.scalar(u32, 0)
        for r in acc:
            total += r
        return total

    y = run_per_thread(sim, fn, list(range(32)))
    assert y.tolist() == [x * (4 + 2 + 3 + 4) for x in range(32)]
    assemble(per_thread_kernel(32, fn).ptx())


def test_regarray_assignment_errors():
    cases = [
        (TypeMismatchError, "cannot assign .f16 register %h0 to .f32 register %f0 of a register "
                            "array; convert first: reg.from_(%h0, f32)",
         lambda: reg.array(f32, 2).__setitem__(0, reg.scalar(f16))),
        (TypeMismatchError, "cannot assign float 1.5 to .u32 register %r0",
         lambda: reg.array(u32, 2).__setitem__(0, 1.5)),
        (TypeMismatchError, "cannot assign ~%p0 to .u32 register %r0",
         lambda: reg.array(u32, 2).__setitem__(0, ~reg.scalar(pred))),
        (OperandError, "a register array element takes a register or a Python number, got str 'x'",
         lambda: reg.array(u32, 2).__setitem__(0, "x")),
        (OperandError, "register array index 2 out of range for length 2",
         lambda: reg.array(u32, 2).__setitem__(2, 0)),
        (OperandError, "register arrays are indexed by Python ints at trace time, got 'a'",
         lambda: reg.array(u32, 2).__setitem__("a", 0)),
        (OperandError, "register array slice of 2 registers cannot take 4 values",
         lambda: reg.array(u32, 3).__setitem__(slice(0, 2), [1, 2, 3, 4])),
        (TypeMismatchError, "cannot assign .pred register %p0 to .b32 register %b0",
         lambda: reg.array(b32, 1).__setitem__(0, reg.scalar(pred))),
    ]
    for exc, needle, case in cases:
        with pytest.raises(exc) as ei:
            body(case)
        msg = str(ei.value)
        assert msg.startswith(f"{HERE}:{case.__code__.co_firstlineno}: "), msg
        assert needle in msg, msg


def test_regarray_slice_times_int_is_refused():
    def k():
        acc = reg.array(u32, 4)
        acc[0:2] *= 2  # list repetition in Python, not a multiply: refused by length

    with pytest.raises(OperandError, match="slice of 2 registers cannot take 4 values"):
        body(k)


def test_regarray_assignment_across_kernels_is_refused():
    stash = {}

    def first():
        stash["acc"] = reg.array(u32, 2)

    body(first)

    def second():
        stash["acc"][0] = 1

    with pytest.raises(RegisterScopeError):
        body(second)


# ---------------------------------------------------------------- guarded ret / exit

def test_guarded_ret_and_exit(assemble):
    def k():
        p = reg.scalar(pred, 0)
        ptx.exit(pred=~p)
        ptx.ret(pred=p)
        ptx.ret()

    assert body(k) == ["mov.pred %p0, 0;", "@!%p0 exit;", "@%p0 ret;", "ret;"]
    assemble(pyptx.kernel(name="t")(k).ptx())

    def bad():
        ptx.ret(pred=reg.scalar(u32))

    with pytest.raises(OperandError) as ei:
        body(bad)
    assert str(ei.value).startswith(f"{HERE}:{bad.__code__.co_firstlineno + 1}: pred= expects a "
                                    "predicate register or ~p")


def test_guarded_ret_runs(sim):
    """Threads with an odd input leave before the store: the simulator sees their output
    bytes unwritten (poisoned NaN bits), the others' written."""

    def fn(x):
        ptx.ret(pred=(x & 1) == 1)
        return x + 1

    xs = np.arange(32, dtype=np.uint32)
    (y,) = sim.run(per_thread_kernel(32, fn).specialize(), [xs], poison=False)
    assert y.tolist() == [x + 1 if x % 2 == 0 else 0 for x in range(32)]
