"""Silent mistakes the DSL refuses at the user's line: register array bounds, shifts
past the width, oversized register arrays, specs that are not a tuple of tiles, misspelt
element types, CTA-wide barriers under thread-dependent branches, setmaxnreg without a
register budget, one shared-memory name given twice."""

from __future__ import annotations

import sys

import pytest

import pyptx
from pyptx import Tile, ptx, reg, smem
from pyptx.errors import OperandError
from pyptx.types import f32, u32, u64


def _trace(body):
    @pyptx.kernel([Tile(128, f32)], [Tile(128, f32)], block=(128, 1, 1))
    def k(X, Y):
        body()

    k.ptx()


def _refused(body, match: str) -> None:
    with pytest.raises(OperandError, match=match) as ei:
        _trace(body)
    assert str(ei.value).startswith(f"{__file__}:{body.line}:"), str(ei.value)


def test_negative_register_array_index():
    def body():
        a = reg.array(f32, 4)
        body.line = sys._getframe().f_lineno + 1
        a[-1]

    _refused(body, r"index -1 is negative; expected 0\.\.3")


def test_register_array_index_past_the_end():
    def body():
        a = reg.array(f32, 4)
        body.line = sys._getframe().f_lineno + 1
        a[4]

    _refused(body, "index 4 out of range for length 4")


def test_register_array_past_the_register_file():
    def body():
        body.line = sys._getframe().f_lineno + 1
        reg.array(f32, 10_000_000)

    _refused(body, "register file")


@pytest.mark.parametrize("t,amount", [(u32, 32), (u32, 40), (u64, 64), (u32, -1)])
def test_shift_past_the_width(t, amount):
    def body():
        r = reg.scalar(t, 1)
        body.line = sys._getframe().f_lineno + 1
        r << amount

    _refused(body, rf"by {amount} on the {t.bits}-bit register")


def test_shift_within_the_width_is_emitted():
    out = {}

    def body():
        r = reg.scalar(u32, 1)
        out["r"] = (r << 31, r >> 0)

    _trace(body)


def test_unnamed_shared_arrays_get_distinct_names():
    names = []

    def body():
        names.extend(smem.alloc(f32, 16).name for _ in range(3))

    _trace(body)
    assert names == ["smem", "smem_1", "smem_2"]


def test_parse_of_none_is_a_pyptx_error():
    from pyptx.errors import PyptxError
    from pyptx.parser import parse

    with pytest.raises(PyptxError, match="parse expects PTX text") as ei:
        line = sys._getframe().f_lineno + 1
        parse(None)
    assert str(ei.value).startswith(f"{__file__}:{line}:")


# ------------------------------------------------------------------ specs

def _nop(X, Y):
    pass


@pytest.mark.parametrize("where,specs", [("in_specs", "bare"), ("out_specs", "bare"),
                                         ("in_specs", "set"), ("out_specs", "str")])
def test_specs_that_are_not_a_tuple_of_tiles(where, specs):
    from pyptx.errors import SpecError

    spec = {"bare": Tile(4, f32), "set": {Tile(4, f32)}, "str": "M"}[specs]
    other = (Tile(4, f32),)
    kw = {"in_specs": other, "out_specs": other, where: spec}
    with pytest.raises(SpecError) as ei:
        line = sys._getframe().f_lineno + 1
        pyptx.kernel(**kw)(_nop)
    msg = str(ei.value)
    assert msg.startswith(f"{__file__}:{line}: {where} must be a"), msg
    if specs == "bare":
        assert f"write {where}=(Tile(4, f32),) (note the trailing comma)" in msg


@pytest.mark.parametrize("spelling,near", [("fp32", "f32"), ("fp16", "f16"), ("f33", "f32"),
                                           ("bfloat", "bf16")])
def test_tile_dtype_misspelt(spelling, near):
    from pyptx.errors import SpecError

    if near == "bf16" and spelling == "bfloat":
        near = None  # too far from any name: reported as a missing element type
    with pytest.raises(SpecError) as ei:
        line = sys._getframe().f_lineno + 1
        Tile("M", spelling)
    msg = str(ei.value)
    assert msg.startswith(f"{__file__}:{line}: "), msg
    if near:
        assert f"element type {spelling!r} is not a pyptx type; did you mean {near!r}?" in msg
    else:
        assert "has no element type" in msg


def test_tile_dims_given_as_a_tuple():
    from pyptx.errors import SpecError

    with pytest.raises(SpecError, match=r"separate arguments, not as a tuple: "
                                        r"Tile\('M', 'K', f32\)") as ei:
        line = sys._getframe().f_lineno + 1
        Tile(("M", "K"), f32)
    assert str(ei.value).startswith(f"{__file__}:{line}: ")


# ------------------------------------------------------------------ CTA barriers

def _traced(body, **kw):
    @pyptx.kernel([Tile(128, f32)], [Tile(128, f32)], block=(128, 1, 1), **kw)
    def k(X, Y):
        body()

    return k.ptx()


def _trace_refused(body, exc, match: str, **kw) -> str:
    with pytest.raises(exc, match=match) as ei:
        _traced(body, **kw)
    assert str(ei.value).startswith(f"{__file__}:{body.line}:"), str(ei.value)
    return str(ei.value)


@pytest.mark.parametrize("form", ["if_", "pred", "loop", "while_", "bra", "inst", "lane",
                                  "inst_red", "warpgroup"])
def test_cta_barrier_under_a_thread_dependent_branch(form):
    from pyptx.errors import TraceError

    def body():
        tid = ptx.special.tid.x()
        if form == "if_":
            with ptx.if_(tid < 32):
                body.line = sys._getframe().f_lineno + 1
                ptx.bar_sync(0)
        elif form == "pred":
            body.line = sys._getframe().f_lineno + 1
            ptx.bar_sync(0, pred=(tid >> 5) == 0)
        elif form == "loop":
            for _ in ptx.loop(tid, 1024, 128):
                body.line = sys._getframe().f_lineno + 1
                ptx.bar_sync()
        elif form == "while_":
            i = reg.from_(tid)
            with ptx.while_(lambda: i < 1024):
                body.line = sys._getframe().f_lineno + 1
                ptx.bar_sync(0)
                i += 128
        elif form == "bra":
            skip = ptx.label("skip")
            ptx.bra(skip, pred=tid >= 64)
            body.line = sys._getframe().f_lineno + 1
            ptx.bar_sync(0)
            ptx.place(skip)
        elif form == "inst":
            with ptx.if_(tid < 32):
                body.line = sys._getframe().f_lineno + 1
                ptx.inst.barrier.sync.aligned(0)
        elif form == "lane":
            with ptx.if_(ptx.special.laneid() == 0):
                body.line = sys._getframe().f_lineno + 1
                ptx.bar_sync(0)
        elif form == "inst_red":
            with ptx.if_(tid < 32):
                body.line = sys._getframe().f_lineno + 1
                ptx.inst.bar.red.popc.u32(reg.scalar(u32), 0, tid < 3)
        elif form == "warpgroup":
            wg = reg.from_(tid) // 128
            x = reg.scalar(u32, 0)
            with ptx.if_(wg == 0):
                x += 1
                body.line = sys._getframe().f_lineno + 1
                ptx.bar_sync(0)

    msg = _trace_refused(body, TraceError, "waits for every thread of the CTA")
    assert "depends on the thread index" in msg and "ptx.bar_sync(id, threads)" in msg


def test_cta_barriers_that_every_thread_reaches_are_emitted():
    def body():
        tid = ptx.special.tid.x()
        cta = ptx.special.ctaid.x()
        with ptx.if_(tid < 32):
            ptx.bar_sync(1, 32)  # a named barrier counting the threads that reach it
            ptx.inst.bar.sync(2, 32)
        with ptx.if_(cta < 4):  # the same for every thread of the CTA
            ptx.bar_sync(0)
        for _ in ptx.loop(0, 8):
            ptx.bar_sync(0)
        ptx.bar_sync(0)  # after the thread-dependent branch closed

    text = _traced(body)
    assert text.count("bar.sync 0;") == 3 and "bar.sync 1, 32;" in text


def test_cta_barrier_checks_assemble(assemble):
    def body():
        tid = ptx.special.tid.x()
        with ptx.if_(tid < 32):
            ptx.bar_sync(1, 32)
        ptx.bar_sync(0)

    assemble(_traced(body), "sm_90a")


# ------------------------------------------------------------------ setmaxnreg

@pytest.mark.parametrize("how", ["helper", "inst"])
def test_setmaxnreg_needs_a_register_budget(how):
    from pyptx.errors import ConfigError

    def body():
        body.line = sys._getframe().f_lineno + 1
        (ptx.setmaxnreg(240) if how == "helper" else ptx.inst.setmaxnreg.inc.sync.aligned.u32(240))

    msg = _trace_refused(body, ConfigError, "declares no register budget")
    assert "expected @kernel(maxnreg=" in msg


def test_setmaxnreg_with_a_budget_assembles(assemble):
    def body():
        ptx.setmaxnreg(240)
        ptx.inst.setmaxnreg.dec.sync.aligned.u32(24)

    text = _traced(body, maxnreg=168)
    assert ".maxnreg 168" in text and "setmaxnreg.inc.sync.aligned.u32 240;" in text
    assemble(text, "sm_90a")


# ------------------------------------------------------------------ shared names

def test_one_shared_name_given_twice():
    def body():
        smem.alloc(f32, 16, name="tile")
        body.line = sys._getframe().f_lineno + 1
        smem.alloc(f32, 16, name="tile")

    msg = _trace_refused(body, OperandError, r"smem.alloc\(name='tile'\)")
    assert f"but {__file__}:{body.line - 2} already allocated a shared array named 'tile'" in msg


def test_helper_names_and_the_default_stay_unique_without_refusal():
    from pyptx.pipeline import BarrierArray

    names = []

    def body():
        names.append(smem.alloc(f32, 16, name="full_bar").name)
        names.extend(BarrierArray(2, name="full_bar").array.name for _ in range(2))
        names.extend(smem.alloc(f32, 16).name for _ in range(2))

    _traced(body)
    assert names == ["full_bar", "full_bar_1", "full_bar_2", "smem", "smem_1"]


# ------------------------------------------------------------------ arrays on the CPU

@pytest.mark.parametrize("x,w,match", [
    (("float64", (4,), None), ("float32", (4,), None), "'X': expected dtype f32 .* got float64"),
    (("float32", (4, 2), None), ("float32", (4,), None), "'X': expected rank 1"),
    (("float32", (4,), None), ("float32", (5,), None), r"'W' dim 0 \('N'\): expected 4"),
    (("float32", (4,), (2,)), ("float32", (4,), None), "'X' is not contiguous"),
    (("float32", (4,), None), ("float32", (4,), None), "'X' is on cpu"),
])
def test_cpu_arrays_report_what_needs_no_gpu_first(x, w, match):
    """An eager call with CPU arrays names a wrong dtype, rank, length or contiguity before
    "is on cpu": those need no GPU to find (``pyptx.plan.bind``, every runtime's first step)."""
    from pyptx.errors import SpecError
    from pyptx.plan import ArgInfo, bind

    @pyptx.kernel((Tile("N", f32), Tile("N", f32)), (Tile("N", f32),), block=(32, 1, 1))
    def k(X, W, Y):
        ptx.ret()

    def describe(a):
        return ArgInfo(a[1], a[0], "cpu", a[2])

    with pytest.raises(SpecError, match=match) as ei:  # ShapeError is a SpecError
        line = sys._getframe().f_lineno + 1
        bind(k, (x, w), {}, describe)
    assert str(ei.value).startswith(f"{__file__}:{line}:"), str(ei.value)
