"""Control flow (labels, bra, if_, loop), barriers, fences, warp reductions, ret/exit."""

from __future__ import annotations

import pytest

import pyptx
from pyptx import Tile, ptx, reg
from pyptx.errors import OperandError, TraceError, TypeMismatchError
from pyptx.types import f16, f32, f64, pred, s32, u32, u64


def kern(fn, **kw):
    return pyptx.kernel(name="t", **kw)(fn)


def body(fn, **kw):
    return [st.text() for st in kern(fn, **kw).specialize().module.functions[0].body]


# ---------------------------------------------------------------- labels and branches

def test_labels_are_unique_and_placed():
    got = {}

    def k():
        a, b, c = ptx.label("top"), ptx.label("top"), ptx.label()
        for lbl in (a, b, c):
            ptx.place(lbl)
        got.update(a=a, b=b, c=c)

    lines = body(k)
    assert [got[x].name for x in "abc"] == ["$top", "$top_1", "$L"]
    assert lines == ["$top:", "$top_1:", "$L:"]


def test_generated_label_names_never_collide_with_user_names(assemble):
    @pyptx.kernel(name="names")
    def names():
        user = ptx.label("L_1")
        gen1, gen2 = ptx.label("L"), ptx.label("L")  # the second would be "$L_1"
        p = reg.scalar(pred, 0)
        for lbl in (user, gen1, gen2):
            ptx.bra(lbl, pred=p)
        for lbl in (user, gen1, gen2):
            ptx.place(lbl)
        with ptx.if_(p):
            pass
        end = ptx.label("L_endif")  # the stem ptx.if_ uses
        ptx.place(end)
        ptx.ret()

    src = names.ptx()
    labels = [ln[:-1] for ln in src.splitlines() if ln.endswith(":")]
    assert len(labels) == len(set(labels)) == 5
    assemble(src)


def test_branches():
    got = {}

    def k():
        lbl = ptx.label("out")
        p = reg.scalar(pred)
        ptx.bra(lbl)
        ptx.bra(lbl, pred=p)
        ptx.bra(lbl, pred=~p)
        ptx.bra(lbl, uni=True)
        ptx.place(lbl)
        got["p"] = p

    lines = body(k)
    p = got["p"].name
    assert lines == ["bra $out;", f"@{p} bra $out;", f"@!{p} bra $out;", "bra.uni $out;", "$out:"]


def test_backward_branch_loop_assembles(assemble):
    @pyptx.kernel(name="spin")
    def spin():
        i = reg.scalar(u32, 0)
        top = ptx.label("top")
        ptx.place(top)
        i += 1
        ptx.bra(top, pred=i < 10)
        ptx.ret()

    assemble(spin.ptx())


@pytest.mark.parametrize("name", ["1abc", "a-b", "", "has space"])
def test_bad_label_name(name):
    with pytest.raises(OperandError, match="label name must be an identifier"):
        body(lambda: ptx.label(name))


def test_label_errors():
    def twice():
        lbl = ptx.label()
        ptx.place(lbl)
        ptx.place(lbl)

    with pytest.raises(TraceError, match=r"label \$L is already placed"):
        body(twice)
    with pytest.raises(OperandError, match="ptx.place expects a label of this kernel"):
        body(lambda: ptx.place("L"))
    with pytest.raises(OperandError, match="ptx.bra expects a Label from ptx.label"):
        body(lambda: ptx.bra("$L"))

    leaked = []
    body(lambda: leaked.append(ptx.label("x")))
    with pytest.raises(OperandError, match="ptx.place expects a label of this kernel"):
        body(lambda: ptx.place(leaked[0]))
    with pytest.raises(TraceError, match=r"label \$x belongs to another kernel"):
        body(lambda: ptx.bra(leaked[0]))


def test_bra_pred_must_be_predicate():
    with pytest.raises(OperandError, match="pred= expects a predicate register"):
        body(lambda: ptx.bra(ptx.label(), pred=reg.scalar(u32)))


# ---------------------------------------------------------------- if_

def test_if_branches_around_the_block():
    got = {}

    def k():
        p = reg.scalar(pred)
        r = reg.scalar(u32)
        with ptx.if_(p):
            r += 1
        with ptx.if_(~p):
            r += 2
        got.update(p=p, r=r)

    lines = body(k)
    p, r = got["p"].name, got["r"].name
    assert lines == [
        f"@!{p} bra $L_endif;", f"add.u32 {r}, {r}, 1;", "$L_endif:",
        f"@{p} bra $L_endif_1;", f"add.u32 {r}, {r}, 2;", "$L_endif_1:",
    ]


def test_nested_if_assembles(assemble):
    @pyptx.kernel([Tile(32, u32)], block=(32, 1, 1), name="nested")
    def nested(Y):
        (y,) = ptx.global_ptrs(Y)
        t = ptx.special.tid.x()
        with ptx.if_(t < 16):
            with ptx.if_(~(t < 8)):
                ptx.inst.st.global_.u32(ptx.addr(y + (t << 2)), t)
        ptx.ret()

    src = nested.ptx()
    assert src.count("$L_endif") == 4
    assemble(src)


@pytest.mark.parametrize("bad", [lambda: reg.scalar(u32), lambda: True, lambda: 1])
def test_if_needs_predicate(bad):
    def k():
        with ptx.if_(bad()):
            pass

    with pytest.raises(OperandError, match="ptx.if_ expects a predicate register"):
        body(k)


# ---------------------------------------------------------------- loop

def test_loop_exact_shape():
    seen = []

    def k():
        acc = reg.scalar(u32, 0)
        for i in ptx.loop(10):
            seen.append(i)
            acc += i

    lines = body(k)
    assert len(seen) == 1 and seen[0].type is u32  # body traced once, i is a register
    assert lines == [
        "mov.u32 %r0, 0;",
        "mov.u32 %r1, 0;",
        "setp.ge.u32 %p0, %r1, 10;",
        "@%p0 bra $L_loop_end;",
        "$L_loop:",
        "add.u32 %r0, %r0, %r1;",
        "add.u32 %r1, %r1, 1;",
        "setp.lt.u32 %p1, %r1, 10;",
        "@%p1 bra $L_loop;",
        "$L_loop_end:",
    ]


def test_loop_start_stop_step_and_type():
    def k():
        for _ in ptx.loop(-4, 20, 3, type=s32):
            pass

    assert body(k) == [
        "mov.s32 %ri0, -4;", "setp.ge.s32 %p0, %ri0, 20;", "@%p0 bra $L_loop_end;", "$L_loop:",
        "add.s32 %ri0, %ri0, 3;", "setp.lt.s32 %p1, %ri0, 20;", "@%p1 bra $L_loop;",
        "$L_loop_end:",
    ]


def test_loop_nounroll():
    def k():
        for _ in ptx.loop(4, unroll=False):
            pass

    lines = body(k)
    assert lines[3:5] == ["$L_loop:", '.pragma "nounroll";']
    assert body(lambda: [None for _ in ptx.loop(4)]).count('.pragma "nounroll";') == 0


def test_loop_register_bounds():
    got = {}

    def k():
        lo, hi = reg.scalar(u32), reg.scalar(u32)
        for i in ptx.loop(lo, hi, 2):
            got["i"] = i
        got.update(lo=lo, hi=hi)

    lines = body(k)
    i, lo, hi = got["i"].name, got["lo"].name, got["hi"].name
    assert lines == [
        f"mov.u32 {i}, {lo};",  # the counter is a copy: the bound register is not modified
        f"setp.ge.u32 %p0, {i}, {hi};", "@%p0 bra $L_loop_end;", "$L_loop:",
        f"add.u32 {i}, {i}, 2;", f"setp.lt.u32 %p1, {i}, {hi};", "@%p1 bra $L_loop;",
        "$L_loop_end:",
    ]


def test_loop_signed_register_bound_of_unsigned_loop():
    got = {}

    def k():
        n = reg.scalar(s32)
        for i in ptx.loop(n):
            got["i"] = i
        got["n"] = n

    lines = body(k)
    assert got["i"].type is u32
    # the bound is brought to the loop's type once, before the loop
    assert lines[1].startswith("mov.b32 %r") and lines[1].endswith(f", {got['n'].name};")
    conv = lines[1].split()[1].rstrip(",")
    assert lines[2] == f"setp.ge.u32 %p0, {got['i'].name}, {conv};"


def test_loops_with_register_bounds_assemble(assemble):
    @pyptx.kernel([Tile("N", f32)], [Tile("N", f32)], block=(128, 1, 1), name="loops")
    def loops(X, Y, *, BLOCK=128):
        x, y = ptx.global_ptrs(X, Y)
        n = ptx.scalar_param(u32, 1000, name="n")
        ns = ptx.scalar_param(s32, 10, name="ns")
        n64 = ptx.scalar_param(u64, 10, name="n64")
        acc = reg.scalar(f32, 0.0)
        for i in ptx.loop(ptx.special.tid.x(), n, BLOCK):
            v = reg.scalar(f32)
            ptx.inst.ld.global_.f32(v, ptx.addr(x + (i << 2)))
            acc += v
        for _j in ptx.loop(ns, unroll=False):
            for _k in ptx.loop(2, 6, 2, type=s32):
                acc += 1.0
        for _ in ptx.loop(n64):
            acc *= 0.5
        ptx.inst.st.global_.f32(ptx.addr(y), acc)
        ptx.ret()

    src = loops.ptx(N=1000)
    assert src.count('.pragma "nounroll";') == 1
    assert "$L_loop_end_3:" in src  # four loops, four distinct label pairs
    assemble(src)


@pytest.mark.parametrize("args,kw,needle", [
    ((10,), {"step": 0}, "step must be a positive int, got 0"),
    ((10,), {"step": -1}, "step must be a positive int, got -1"),
    ((10,), {"step": 1.0}, "step must be a positive int, got 1.0"),
    ((2.5,), {}, "ptx.loop stop must be an int or register, got 2.5"),
    ((0, "8"), {}, "ptx.loop stop must be an int or register"),
    ((True,), {}, "ptx.loop stop must be an int or register, got True"),
])
def test_loop_errors(args, kw, needle):
    def k():
        for _ in ptx.loop(*args, **kw):
            pass

    with pytest.raises(OperandError) as ei:
        body(k)
    assert needle in str(ei.value)
    assert __file__ in str(ei.value)


def test_loop_float_register_bound():
    def k():
        for _ in ptx.loop(reg.scalar(f32)):
            pass

    with pytest.raises(OperandError, match="ptx.loop stop must be an integer, got .f32"):
        body(k)


# ---------------------------------------------------------------- barriers and fences

def test_bar_sync_and_arrive():
    got = {}

    def k():
        b = reg.scalar(u32)
        ptx.bar_sync()
        ptx.bar_sync(1, 64)
        ptx.bar_sync(b, 128)
        ptx.bar_arrive(2, 96)
        got["b"] = b

    assert body(k) == ["bar.sync 0;", "bar.sync 1, 64;", f"bar.sync {got['b'].name}, 128;",
                       "bar.arrive 2, 96;"]


@pytest.mark.parametrize("call,needle", [
    (lambda: ptx.bar_sync(16), "barrier id must be 0..15, got 16"),
    (lambda: ptx.bar_sync(-1), "barrier id must be 0..15, got -1"),
    (lambda: ptx.bar_sync(0, 33), "thread count must be a positive multiple of 32, got 33"),
    (lambda: ptx.bar_sync(0, 0), "positive multiple of 32, got 0"),
    (lambda: ptx.bar_sync("0"), "barrier id must be an int or register"),
    (lambda: ptx.bar_arrive(0, 1.0), "thread count must be an int or register"),
])
def test_barrier_errors(call, needle):
    with pytest.raises(OperandError) as ei:
        body(call)
    assert needle in str(ei.value)


def test_fences():
    def k():
        ptx.fence()
        ptx.fence("gpu", sem="acq_rel")
        ptx.fence("cluster")
        ptx.fence("sys")

    assert body(k) == ["fence.sc.cta;", "fence.acq_rel.gpu;", "fence.sc.cluster;", "fence.sc.sys;"]


@pytest.mark.parametrize("args,kw", [(("grid",), {}), (("cta",), {"sem": "release"})])
def test_fence_errors(args, kw):
    with pytest.raises(OperandError, match="fence expects sem in"):
        body(lambda: ptx.fence(*args, **kw))


def test_ret_and_exit():
    assert body(lambda: (ptx.exit(), ptx.ret())) == ["exit;", "ret;"]


# ---------------------------------------------------------------- warp reductions

@pytest.mark.parametrize("fn,t,op", [
    (ptx.warp.reduce_sum, f32, "add.f32"), (ptx.warp.reduce_max, f32, "max.f32"),
    (ptx.warp.reduce_min, s32, "min.s32"), (ptx.warp.reduce_sum, u32, "add.u32"),
])
def test_warp_reduce_full_width(fn, t, op):
    got = {}

    def k():
        v = reg.scalar(t)
        got.update(v=v, out=fn(v))

    lines = body(k)
    v = got["v"].name
    assert got["out"] is got["v"]  # in place
    tmp = lines[0].split()[1].rstrip(",")
    expect = []
    for off in (16, 8, 4, 2, 1):
        expect += [f"shfl.sync.bfly.b32 {tmp}, {v}, {off}, 0x1f, 0xffffffff;",
                   f"{op} {v}, {v}, {tmp};"]
    assert lines == expect


def test_warp_reduce_partial_width_and_mask():
    got = {}

    def k():
        v = reg.scalar(f32)
        ptx.warp.reduce_sum(v, width=8, mask=0x0000FFFF)
        got["v"] = v

    lines = body(k)
    shfl = [ln for ln in lines if ln.startswith("shfl")]
    # width 8: three steps, and the clamp segments the warp into groups of 8 lanes
    assert [ln.split(", ")[2] for ln in shfl] == ["4", "2", "1"]
    assert all(ln.endswith(", 0x181f, 0x0000ffff;") for ln in shfl)
    assert len(lines) == 6


@pytest.mark.parametrize("make,kw,needle", [
    (lambda: reg.scalar(f64), {}, "needs a 32-bit f32/u32/s32 register, got .f64"),
    (lambda: reg.scalar(u64), {}, "needs a 32-bit f32/u32/s32 register, got .u64"),
    (lambda: reg.scalar(f16), {}, "needs a 32-bit"),
    (lambda: 1.0, {}, "expects a register, got 1.0"),
    (lambda: reg.scalar(f32), {"width": 3}, "width must be 2, 4, 8, 16 or 32, got 3"),
    (lambda: reg.scalar(f32), {"mask": 0}, "member mask must be a nonzero 32-bit int"),
    (lambda: reg.scalar(f32), {"mask": 2 ** 32}, "member mask must be a nonzero 32-bit int"),
])
def test_warp_reduce_errors(make, kw, needle):
    with pytest.raises(OperandError) as ei:
        body(lambda: ptx.warp.reduce_sum(make(), **kw))
    assert needle in str(ei.value)


def test_sync_and_reductions_assemble(assemble):
    @pyptx.kernel([Tile(256, f32)], [Tile(8, f32)], block=(256, 1, 1), name="reduce")
    def reduce(X, Y):
        x, y = ptx.global_ptrs(X, Y)
        t = ptx.special.tid.x()
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(x + (t << 2)))
        ptx.warp.reduce_sum(v)
        m = reg.scalar(f32, v)
        ptx.warp.reduce_max(m, width=16)
        u = reg.from_(t, s32)
        ptx.warp.reduce_min(u, width=4)
        ptx.bar_sync()
        ptx.bar_sync(1, 256)
        ptx.fence("gpu", sem="acq_rel")
        with ptx.if_((t & 31) == 0):
            ptx.inst.st.global_.f32(ptx.addr(y + ((t >> 5) << 2)), v)
        ptx.bar_arrive(2, 64)
        ptx.ret()

    assemble(reduce.ptx())


def test_bool_of_comparison_in_python_if_is_refused():
    def k():
        a = reg.scalar(u32)
        while a < 3:
            break

    with pytest.raises(TraceError, match=r"ptx.if_\(p\)"):
        body(k)


def test_sugar_types_in_loops_are_checked():
    def k():
        for i in ptx.loop(4):
            i + reg.scalar(f32)

    with pytest.raises(TypeMismatchError):
        body(k)
