"""ptx.inst (any instruction), ptx.addr, ptx.special, ptx.global_ptrs, ptx.scalar_param."""

from __future__ import annotations

import inspect

import pytest

import pyptx
from pyptx import Tile, ptx, reg, smem
from pyptx.errors import OperandError, RegisterScopeError, TraceError
from pyptx.ptx.inst import ptx_spelling
from pyptx.types import b32, b64, bf16, f16, f16x2, f32, f64, pred, s32, u16, u32, u64


def body(fn, in_specs=(), out_specs=(), **kw):
    k = pyptx.kernel(in_specs, out_specs, name="t")(fn)
    return [st.text() for st in k.specialize(**kw).module.functions[0].body]


# ---------------------------------------------------------------- spelling

@pytest.mark.parametrize("attr,ptx_name", [
    ("global_", "global"), ("and_", "and"), ("or_", "or"), ("not_", "not"), ("async_", "async"),
    ("_2d", "2d"), ("_3d", "3d"), ("shared__cta", "shared::cta"),
    ("shared__cluster", "shared::cluster"), ("mbarrier__complete_tx__bytes", "mbarrier::complete_tx::bytes"),
    ("f32", "f32"), ("rn", "rn"), ("mma_async", "mma_async"),
])
def test_modifier_spelling(attr, ptx_name):
    assert ptx_spelling(attr) == ptx_name


@pytest.mark.parametrize("build,opcode", [
    (lambda: ptx.inst.ld.global_.v4.f32, "ld.global.v4.f32"),
    (lambda: ptx.inst.ld.global_.nc.f32, "ld.global.nc.f32"),
    (lambda: ptx.inst.fma.rn.f32, "fma.rn.f32"),
    (lambda: ptx.inst.shfl.sync.bfly.b32, "shfl.sync.bfly.b32"),
    (lambda: ptx.inst.and_.b32, "and.b32"),
    (lambda: ptx.inst.mbarrier.try_wait.parity.shared__cta.b64, "mbarrier.try_wait.parity.shared::cta.b64"),
    (lambda: ptx.inst.cp.async_.bulk.tensor._2d.global_.shared__cta.bulk_group,
     "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"),
    (lambda: ptx.inst.wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16,
     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"),
    (lambda: ptx.inst("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"),
     "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"),
    (lambda: ptx.inst("ld.global.v4.f32"), "ld.global.v4.f32"),
])
def test_opcode_spelling(build, opcode):
    ins = build()
    assert ins.opcode == opcode
    assert repr(ins) == f"ptx.inst.{opcode}"


def test_instructions_are_cached():
    assert ptx.inst.fma.rn.f32 is ptx.inst.fma.rn.f32
    assert ptx.inst("fma.rn.f32") is ptx.inst("fma.rn.f32")


def test_dunder_lookups_are_attribute_errors():
    assert not hasattr(ptx.inst, "__wrapped__")
    assert not hasattr(ptx.inst.add, "__wrapped__")


def test_instruction_type_from_opcode():
    assert ptx.inst.add.f32.type is f32
    assert ptx.inst.cvt.rn.f32.s32.type is s32  # the source type types the immediates
    assert ptx.inst.ld.global_.v4.f32.type is f32
    assert ptx.inst.bar.sync.type is None
    # mma-family immediates are plain ints (scale/transpose), whatever the element types
    assert ptx.inst.wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16.type is None


# ---------------------------------------------------------------- emission

def test_one_call_one_instruction():
    got = {}

    def k():
        a, b, c = reg.scalar(f32), reg.scalar(f32), reg.scalar(f32)
        d = reg.scalar(f32)
        ptx.inst.fma.rn.f32(d, a, b, c)
        got.update(a=a, b=b, c=c, d=d)

    lines = body(k)
    assert lines == [f"fma.rn.f32 {got['d'].name}, {got['a'].name}, {got['b'].name}, {got['c'].name};"]


def test_no_operand_instruction():
    assert body(lambda: ptx.inst.wgmma.fence.sync.aligned()) == ["wgmma.fence.sync.aligned;"]
    assert body(lambda: ptx.inst.membar.gl()) == ["membar.gl;"]


def test_string_form_emits_same_text():
    got = {}

    def k():
        r = reg.scalar(u32)
        ptx.inst("shfl.sync.bfly.b32")(r, r, 16, 0x1F, 0xFFFFFFFF)
        ptx.inst.shfl.sync.bfly.b32(r, r, 16, 0x1F, 0xFFFFFFFF)
        got["r"] = r

    lines = body(k)
    r = got["r"].name
    assert lines == [f"shfl.sync.bfly.b32 {r}, {r}, 16, 31, 4294967295;"] * 2


@pytest.mark.parametrize("build,value,text", [
    (lambda: ptx.inst.mov.f32, 1, "0f3F800000"),  # an int for an .f32 operand is the float
    (lambda: ptx.inst.mov.f32, 0.1, "0f3DCCCCCD"),
    (lambda: ptx.inst.mov.f64, 0.5, "0d3FE0000000000000"),
    (lambda: ptx.inst.mov.b32, 1.0, "0f3F800000"),  # a float into a bit type: its bit pattern
    (lambda: ptx.inst.mov.b64, -2.0, "0dC000000000000000"),
    (lambda: ptx.inst.mov.b16, 1.0, "0x3C00"),
    (lambda: ptx.inst.mov.u32, 7, "7"),
    (lambda: ptx.inst.mov.s32, -7, "-7"),
    (lambda: ptx.inst.mov.u32, 2.0, "2"),  # an integral float for an integer type
    (lambda: ptx.inst.mov.b32, 0xFFFFFFFF, "4294967295"),
    (lambda: ptx.inst.mov.pred, True, "1"),
])
def test_immediates_typed_by_opcode(build, value, text):
    def k():
        build()("%dst", value)

    assert body(k) == [f"{build().opcode} %dst, {text};"]


def test_wgmma_immediates_stay_integers(assemble):
    @pyptx.kernel(name="mma", block=(128, 1, 1))
    def mma():
        acc = reg.array(f32, 32)
        for r in acc:
            ptx.inst.mov.f32(r, 0.0)
        da, db = reg.scalar(u64, 0), reg.scalar(u64, 0)
        ptx.inst.wgmma.fence.sync.aligned()
        ptx.inst.wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16(acc, da, db, 0, 1, 1, 0, 0)
        ptx.inst.wgmma.commit_group.sync.aligned()
        ptx.inst.wgmma.wait_group.sync.aligned(0)
        ptx.ret()

    src = mma.ptx()
    assert "%rd0, %rd1, 0, 1, 1, 0, 0;" in src
    assemble(src)


def test_integer_immediate_errors():
    def frac():
        ptx.inst.mov.u32(reg.scalar(u32), 1.5)

    def big():
        ptx.inst.add.u32(reg.scalar(u32), reg.scalar(u32), 2 ** 32)

    def big_signed():
        ptx.inst.add.s32(reg.scalar(s32), reg.scalar(s32), 2 ** 32)

    with pytest.raises(OperandError, match="expected an integer immediate for .u32, got float 1.5"):
        body(frac)
    with pytest.raises(OperandError, match=r"immediate 4294967296 does not fit .u32"):
        body(big)
    with pytest.raises(OperandError, match=r"immediate 4294967296 does not fit"):
        body(big_signed)


def test_signed_instructions_take_bit_pattern_immediates(assemble):
    # a member mask of a signed instruction is a bit pattern: 0xFFFFFFFF must be accepted
    @pyptx.kernel(name="masks")
    def masks():
        s = reg.scalar(s32, -3)
        d = reg.scalar(s32)
        ptx.inst.redux.sync.min.s32(d, s, 0xFFFFFFFF)
        ptx.inst.add.s32(d, d, -2147483648)
        ptx.ret()

    src = masks.ptx()
    assert "redux.sync.min.s32 %ri1, %ri0, 4294967295;" in src
    assert "add.s32 %ri1, %ri1, -2147483648;" in src
    assemble(src)


def test_predicated_execution():
    got = {}

    def k():
        p = reg.scalar(pred)
        r = reg.scalar(u32)
        ptx.inst.add.u32(r, r, 1, pred=p)
        ptx.inst.add.u32(r, r, 2, pred=~p)
        got.update(p=p, r=r)

    lines = body(k)
    p, r = got["p"].name, got["r"].name
    assert lines == [f"@{p} add.u32 {r}, {r}, 1;", f"@!{p} add.u32 {r}, {r}, 2;"]


@pytest.mark.parametrize("bad", ["u32reg", True, 1, "%p0"])
def test_pred_must_be_a_predicate(bad):
    def k():
        r = reg.scalar(u32)
        ptx.inst.add.u32(r, r, 1, pred=r if bad == "u32reg" else bad)

    with pytest.raises(OperandError, match="pred= expects a predicate register or ~p"):
        body(k)


def test_vectors():
    got = {}

    def k():
        v = reg.array(f32, 4)
        p = reg.scalar(u64)
        ptx.inst.ld.global_.v4.f32(v, ptx.addr(p, 16))
        ptx.inst.st.global_.v2.f32(ptx.addr(p), v[2:4])
        ptx.inst.st.global_.v2.f32(ptx.addr(p, 8), (v[0], 0.5))
        ptx.inst.st.global_.v4.f32(ptx.addr(p, 32), [0.0, v[1], 1, v[3]])
        got.update(v=v, p=p)

    lines = body(k)
    f = [r.name for r in got["v"]]
    p = got["p"].name
    assert lines == [
        f"ld.global.v4.f32 {{{f[0]}, {f[1]}, {f[2]}, {f[3]}}}, [{p}+16];",
        f"st.global.v2.f32 [{p}], {{{f[2]}, {f[3]}}};",
        f"st.global.v2.f32 [{p}+8], {{{f[0]}, 0f3F000000}};",
        f"st.global.v4.f32 [{p}+32], {{0f00000000, {f[1]}, 0f3F800000, {f[3]}}};",
    ]


def test_addresses():
    got = {}

    def k(X):
        p = reg.scalar(u64)
        s = reg.scalar(u32)
        buf = smem.alloc(f32, 64, name="tile")
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(p))
        ptx.inst.ld.global_.f32(v, ptx.addr(p, -4))
        ptx.inst.ld.shared.f32(v, ptx.addr(s, 128))
        ptx.inst.ld.shared.f32(v, ptx.addr(buf, 8))
        ptx.inst.ld.shared.f32(v, ptx.addr(buf))
        ptx.inst.ld.param.u64(p, ptx.addr(X))
        ptx.inst.ld.shared.f32(v, ptx.addr("sym", 4))
        got.update(p=p, s=s, v=v)

    lines = body(k, [Tile(4, f32)])
    p, s, v = got["p"].name, got["s"].name, got["v"].name
    assert lines == [
        f"ld.global.f32 {v}, [{p}];", f"ld.global.f32 {v}, [{p}+-4];",
        f"ld.shared.f32 {v}, [{s}+128];", f"ld.shared.f32 {v}, [tile+8];",
        f"ld.shared.f32 {v}, [tile];", f"ld.param.u64 {p}, [X];", f"ld.shared.f32 {v}, [sym+4];",
    ]


@pytest.mark.parametrize("make,needle", [
    (lambda: ptx.addr(reg.scalar(f32)), "ptx.addr base must be a 32- or 64-bit integer register, got .f32"),
    (lambda: ptx.addr(reg.scalar(u16)), "got .u16"),
    (lambda: ptx.addr(3), "ptx.addr base must be a register, shared array or param, got 3"),
    (lambda: ptx.addr(reg.scalar(u64), reg.scalar(u32)), "offset must be a Python int (PTX has no reg+reg"),
    (lambda: ptx.addr(reg.scalar(u64), 1.0), "offset must be a Python int"),
])
def test_address_errors(make, needle):
    with pytest.raises(OperandError) as ei:
        body(lambda: make())
    assert needle in str(ei.value)


def test_labels_and_raw_strings_as_operands():
    got = {}

    def k():
        lbl = ptx.label("top")
        ptx.place(lbl)
        ptx.inst.bra.uni(lbl)
        p = reg.scalar(pred)
        ptx.inst("elect.sync")("_|" + p.name, 0xFFFFFFFF)
        got["p"] = p

    lines = body(k)
    assert lines == ["$top:", "bra.uni $top;", f"elect.sync _|{got['p'].name}, 4294967295;"]


def test_bad_operand_kind():
    def k():
        ptx.inst.add.u32(reg.scalar(u32), object(), 1)

    with pytest.raises(OperandError) as ei:
        body(k)
    msg = str(ei.value)
    assert "expected a register, Python number, ptx.addr(...), label or vector" in msg
    assert "got object" in msg


def test_unknown_opcode():
    line = {}

    def k():
        line["n"] = inspect.currentframe().f_lineno + 1
        ptx.inst.frobnicate.u32()

    with pytest.raises(OperandError) as ei:
        body(k)
    msg = str(ei.value)
    assert "'frobnicate' is not a PTX opcode" in msg
    assert msg.startswith(f"{__file__}:{line['n']}:")


@pytest.mark.parametrize("spelling", ["foo.bar", "", "LD.global.f32"])
def test_unknown_opcode_string_form(spelling):
    def k():
        ptx.inst(spelling)

    with pytest.raises(OperandError) as ei:
        body(k)
    assert __file__ in str(ei.value)


def test_inst_outside_a_kernel():
    with pytest.raises(TraceError, match="only valid inside a @kernel body"):
        ptx.inst.add.u32("%r0", "%r0", 1)


def test_register_of_another_kernel():
    leaked = []

    def a():
        leaked.append(reg.scalar(u32))
        leaked.append(reg.scalar(pred))

    body(a)

    def b():
        ptx.inst.add.u32(leaked[0], leaked[0], 1)

    def c():
        ptx.inst.add.u32(reg.scalar(u32), 1, 1, pred=leaked[1])

    def d():
        ptx.inst.add.u32(reg.scalar(u32), 1, 1, pred=~leaked[1])

    for fn in (b, c, d):
        with pytest.raises(RegisterScopeError, match="belongs to kernel 't'"):
            body(fn)


# ---------------------------------------------------------------- special registers

@pytest.mark.parametrize("read,sreg,reg_t", [
    (lambda: ptx.special.tid.x(), "%tid.x", u32), (lambda: ptx.special.tid.y(), "%tid.y", u32),
    (lambda: ptx.special.tid.z(), "%tid.z", u32), (lambda: ptx.special.ctaid.x(), "%ctaid.x", u32),
    (lambda: ptx.special.ctaid.y(), "%ctaid.y", u32), (lambda: ptx.special.ntid.z(), "%ntid.z", u32),
    (lambda: ptx.special.nctaid.x(), "%nctaid.x", u32),
    (lambda: ptx.special.cluster_ctaid.x(), "%cluster_ctaid.x", u32),
    (lambda: ptx.special.laneid(), "%laneid", u32), (lambda: ptx.special.warpid(), "%warpid", u32),
    (lambda: ptx.special.smid(), "%smid", u32), (lambda: ptx.special.clock(), "%clock", u32),
    (lambda: ptx.special.clock64(), "%clock64", u64), (lambda: ptx.special.gridid(), "%gridid", u64),
    (lambda: ptx.special.globaltimer(), "%globaltimer", u64),
    (lambda: ptx.special.lanemask_lt(), "%lanemask_lt", u32),
    (lambda: ptx.special.cluster_ctarank(), "%cluster_ctarank", u32),
    (lambda: ptx.special.dynamic_smem_size(), "%dynamic_smem_size", u32),
    (lambda: ptx.special.is_explicit_cluster(), "%is_explicit_cluster", pred),
])
def test_special_registers(read, sreg, reg_t):
    got = {}
    lines = body(lambda: got.setdefault("r", read()))
    r = got["r"]
    assert r.type is reg_t
    assert lines == [f"mov.{reg_t.name} {r.name}, {sreg};"]


def test_special_registers_assemble(assemble):
    @pyptx.kernel(name="sregs", cluster=(2, 1, 1))
    def sregs():
        for v in ("tid", "ntid", "ctaid", "nctaid", "cluster_ctaid", "clusterid"):
            for c in "xyz":
                getattr(getattr(ptx.special, v), c)()
        for s in ("laneid", "warpid", "nwarpid", "smid", "nsmid", "gridid", "lanemask_eq",
                  "lanemask_le", "lanemask_lt", "lanemask_ge", "lanemask_gt", "clock", "clock64",
                  "globaltimer", "cluster_ctarank", "cluster_nctarank", "is_explicit_cluster",
                  "dynamic_smem_size", "total_smem_size"):
            getattr(ptx.special, s)()
        ptx.ret()

    assemble(sregs.ptx())


def test_special_register_errors():
    with pytest.raises(OperandError, match=r"%tid is a vector; read one component: ptx.special.tid.x\(\)"):
        body(lambda: ptx.special.tid())
    with pytest.raises(OperandError, match="%tidx is not a special register pyptx knows"):
        body(lambda: ptx.special.tidx())


# ---------------------------------------------------------------- kernel params

def test_global_ptrs():
    got = {}

    def k(X, W, Y):
        got["ptrs"] = ptx.global_ptrs(X, W, Y)

    lines = body(k, [Tile(4, f32), Tile(4, f32)], [Tile(4, f32)])
    ptrs = got["ptrs"]
    assert [r.type for r in ptrs] == [u64] * 3
    assert lines == [
        "ld.param.u64 %rd0, [X];", "cvta.to.global.u64 %rd1, %rd0;",
        "ld.param.u64 %rd2, [W];", "cvta.to.global.u64 %rd3, %rd2;",
        "ld.param.u64 %rd4, [Y];", "cvta.to.global.u64 %rd5, %rd4;",
    ]
    assert [r.name for r in ptrs] == ["%rd1", "%rd3", "%rd5"]


def test_global_ptrs_errors():
    with pytest.raises(OperandError, match="argument 1 must be a tensor parameter of the kernel"):
        body(lambda X: ptx.global_ptrs(X, reg.scalar(u64)), [Tile(4, f32)])

    leaked = []
    body(lambda X: leaked.append(X), [Tile(4, f32)])
    with pytest.raises(OperandError, match="tensor parameter X belongs to another kernel"):
        body(lambda X: ptx.global_ptrs(leaked[0]), [Tile(4, f32)])
    with pytest.raises(RegisterScopeError, match="tensor parameter X belongs to kernel"):
        body(lambda X: ptx.inst.ld.param.u64(reg.scalar(u64), ptx.addr(leaked[0])), [Tile(4, f32)])


def test_scalar_params(assemble):
    got = {}

    @pyptx.kernel([Tile(4, f32)], name="sp")
    def sp(X):
        got["a"] = ptx.scalar_param(f32, 0.5, name="alpha")
        got["n"] = ptx.scalar_param(u32, 7)
        got["m"] = ptx.scalar_param(s32, -3)
        ptx.ret()

    s = sp.specialize()
    src = s.ptx()
    assert "\t.param .u64 X,\n\t.param .f32 alpha,\n\t.param .u32 arg,\n\t.param .s32 arg_1\n)" in src
    assert s.scalar_params == [("alpha", f32, 0.5), ("arg", u32, 7), ("arg_1", s32, -3)]
    assert f"ld.param.f32 {got['a'].name}, [alpha];" in src
    assert f"ld.param.s32 {got['m'].name}, [arg_1];" in src
    assert got["a"].type is f32 and got["n"].type is u32
    assemble(src)


def test_scalar_param_name_never_shadows_a_tensor_param(assemble):
    @pyptx.kernel([Tile(4, f32)], name="shadow")
    def shadow(X):
        ptx.scalar_param(u32, 1, name="X")
        ptx.ret()

    src = shadow.ptx()
    assert "\t.param .u64 X,\n\t.param .u32 X_1\n)" in src
    assert "ld.param.u32 %r0, [X_1];" in src
    assemble(src)


@pytest.mark.parametrize("args,needle", [
    ((pred, 1), "scalar_param type must be a plain scalar"),
    ((f16, 1.0), "scalar_param type must be a plain scalar"),  # ptxas has no ld.param.f16
    ((f16x2, 1.0), "scalar_param type must be a plain scalar"),
    ((bf16, 1.0), "scalar_param type must be a plain scalar"),
    ((u32, "7"), "scalar_param value must be a Python number"),
    ((u32, True), "scalar_param value must be a Python number"),
    ((u32, 2 ** 40), "immediate 1099511627776 does not fit .u32"),
    ((u32, 1.5), "expected an integer immediate for .u32"),
])
def test_scalar_param_errors(args, needle):
    with pytest.raises(OperandError) as ei:
        body(lambda: ptx.scalar_param(*args))
    assert needle in str(ei.value)
    assert __file__ in str(ei.value)


def test_bit_types_as_scalar_params():
    lines = body(lambda: (ptx.scalar_param(b32, 1), ptx.scalar_param(b64, 2), ptx.scalar_param(f64, 0.5)))
    assert lines == ["ld.param.b32 %b0, [arg];", "ld.param.b64 %bd0, [arg_1];",
                     "ld.param.f64 %fd0, [arg_2];"]
