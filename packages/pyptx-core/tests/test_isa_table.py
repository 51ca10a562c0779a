"""The instruction table behind ``ptx.inst`` (``pyptx.ptx._isa``) against ptxas.

Every ``ok`` spelling of every row becomes one call with operands generated from the
row's roles (or its ``sample``); each arch the row supports (sm_80, sm_90a, sm_100a)
assembles all of its calls in one kernel, and a kernel ptxas rejects is re-assembled one
call at a time to name the rows that disagree with ptxas. Every row also has refused
calls (an unknown modifier, one operand too many, a register of the wrong type), each
checked for its message and for the file:line of the call. Every generated module also
declares the functions ``call`` reaches (``CALLEES``) and, in the kernel, the ``.param``
arguments and the prototype an indirect call names.
"""

from __future__ import annotations

import re
import sys

import pytest

import pyptx
from pyptx import Tile, ptx, reg, smem
from pyptx.errors import OperandError, PyptxError, TraceError, TypeMismatchError
from pyptx.ptx import _isa as isa
from pyptx.ptx._check import Form, compatible
from pyptx.ptx.inst import OPCODES
from pyptx.trace import current
from pyptx.types import _BY_NAME, b16, f32, int_type, pred, u32, u64

ARCHS = ("sm_80", "sm_90a", "sm_100a")
#: Rows without a generated accepted call. Textures and surfaces are sampled through 64-bit
#: object handles; ``brx`` through the ``.branchtargets`` table every generated kernel
#: declares; ``call`` reaches the ``CALLEES`` of every generated module.
NO_SAMPLE: set[str] = set()
CALLS = [(row, sp) for row in isa.TABLE.values() for sp in row.ok]
#: The functions every generated module defines ahead of its kernel, for ``call``: one with a
#: return value and a parameter (direct and indirect calls) and one with neither.
CALLEES = """
.func (.param .b32 isa_ret) isa_callee(.param .b32 isa_arg)
{
	.reg .b32 %c<2>;
	ld.param.b32 %c0, [isa_arg];
	add.u32 %c1, %c0, 1;
	st.param.b32 [isa_ret], %c1;
	ret;
}

.func isa_nop()
{
	ret;
}
"""
#: What a kernel declares for its calls: the argument and return ``.param`` variables and the
#: prototype of an indirect call.
CALL_DECLS = (".param .b32 call_arg;", ".param .b32 call_ret;",
              "isa_proto: .callprototype (.param .b32 _) _ (.param .b32 _);")


def _samples(row, spelling: str) -> tuple:
    """The operand samples of ``spelling`` (one generated call each), or ``(None,)``."""
    sample = row.sample.get(spelling)
    return sample if isinstance(sample, tuple) else (sample,)


def _supports(form: Form, arch: str) -> bool:
    m = re.match(r"sm_(\d+)(a?)", arch)
    sm = int(m.group(1))
    top = form.row.sm_max
    return sm >= form.sm and (m.group(2) == "a" or not form.arch_a) and not (top and sm > top)


def _reg_type(ty: str):
    t = _BY_NAME.get(ty)
    if t is None:
        return _BY_NAME[f"b{max(isa.EXTRA_BITS[ty], 16)}"]
    if t.bits == 8:  # no 8-bit arithmetic registers: the 16-bit register the relaxed rules take
        return int_type(16, t.is_signed) if t.kind in "us" else b16
    return t


class Env:
    """What generated operands read: addresses, a predicate, a label, the kernel params."""


def _operands(form: Form, sample: str | None, e: Env) -> list:
    if sample is not None:
        out = []
        for tok in sample.split():
            kind, _, rest = tok.partition(":")
            if kind == "r":
                out.append(reg.scalar(_reg_type(rest)))
            elif kind == "v":
                ty, n = rest.split(":")
                out.append(reg.array(_reg_type(ty), int(n)))
            elif kind == "g":
                out.append(ptx.addr(e.rd))
            elif kind == "sh":
                out.append(ptx.addr(e.buf))
            elif kind == "i":
                out.append(int(rest))
            elif kind == "t":  # PTX text naming the kernel's registers
                for key, r in (("{p}", e.p), ("{rd}", e.rd), ("{r}", e.r), ("{f}", e.f)):
                    rest = rest.replace(key, r.name)
                out.append(rest)
        return out
    out = []
    for role, ty, vec in form.roles[: form.nmin]:
        if role in "dsrh" and ty:
            t = _reg_type(ty)
            out.append(reg.array(t, form.vec) if vec and form.vec else reg.scalar(t))
        elif role == "a":
            space = form.space
            out.append(ptx.addr(e.buf) if space.startswith("shared") else
                       ptx.addr(e.X) if space == "param" else ptx.addr(e.rd))
        elif role in "pq":
            out.append(e.p)
        elif role == "i":
            out.append(0)
        elif role == "l":
            out.append(e.lbl)
        else:
            raise AssertionError(f"{form.fn}: a role-{role} operand needs a sample")
    return out


def _emit(spelling: str, e: Env) -> int:
    """Emit the generated calls of ``spelling``; returns the line of the ``ptx.inst`` call."""
    row = isa.row_for(spelling)[0]
    for sample in _samples(row, spelling):
        ops = _operands(Form(spelling), sample, e)
        line = sys._getframe().f_lineno + 1
        ptx.inst(spelling)(*ops)
    return line


def _kernel(arch: str, body, name: str = "isa"):
    @pyptx.kernel([Tile(1024, f32)], [Tile(1024, f32)], block=(128, 1, 1), arch=arch,
                  version="8.8", name=name, maxnreg=232)  # setmaxnreg needs a budget
    def k(X, Y):
        e = Env()
        e.X = X
        e.rd = reg.scalar(u64, 0)
        e.r = reg.scalar(u32, 0)
        e.p = e.r < 3
        e.f = reg.scalar(f32, 0.0)
        e.buf = smem.alloc(f32, 1024, align=128, name="buf")
        e.lbl = ptx.label("end")
        current().raw(f"bt_table: .branchtargets {e.lbl.name};")  # what brx.idx jumps through
        for decl in CALL_DECLS:
            current().raw(decl)
        body(e)
        ptx.place(e.lbl)
        ptx.ret()

    text = k.ptx()
    entry = text.index("\n.visible .entry")
    return text[:entry] + CALLEES + text[entry:]


def test_every_opcode_has_a_row():
    keys = {k.split(".")[0] for k in isa.TABLE} | set(isa.TABLE)
    assert sorted(op for op in OPCODES if op not in keys) == []


def test_every_row_has_an_accepted_call():
    assert sorted(r.op for r in isa.TABLE.values() if not r.ok) == sorted(NO_SAMPLE)


@pytest.mark.parametrize("arch", ARCHS)
def test_accepted_calls_assemble(arch, assemble):
    calls = [sp for _, sp in CALLS if _supports(Form(sp), arch)]
    assert len(calls) > 100 if arch != "sm_80" else len(calls) > 80
    text = _kernel(arch, lambda e: [_emit(sp, e) for sp in calls])
    try:
        assemble(text, arch)
    except AssertionError:
        bad = []
        for sp in calls:
            try:
                assemble(_kernel(arch, lambda e, sp=sp: _emit(sp, e)), arch)
            except AssertionError as err:
                bad.append(f"{sp}: {str(err).splitlines()[1]}")
        assert bad == [], "the table accepts calls ptxas rejects"


def test_table_forms_below_their_arch_are_refused():
    for _row, sp in CALLS:
        form = Form(sp)
        if form.sm <= 80 and not form.arch_a:
            continue
        with pytest.raises(TraceError, match=r"needs sm_\d+") as ei:
            _kernel("sm_80", lambda e, sp=sp: _emit(sp, e))
        assert str(ei.value).startswith(f"{__file__}:"), sp


def _refused(spelling: str, ops_of, exc, match: str) -> None:
    def body(e):
        ops = ops_of(e)
        body.line = sys._getframe().f_lineno + 1
        ptx.inst(spelling)(*ops)

    found = isa.row_for(spelling)
    arch = "sm_90a" if found and found[0].sm_max == 90 else "sm_100a"  # wgmma: sm_90a only
    with pytest.raises(exc, match=match) as ei:
        _kernel(arch, body)
    assert isinstance(ei.value, PyptxError)
    assert str(ei.value).startswith(f"{__file__}:{body.line}: ptx.inst."), str(ei.value)


@pytest.mark.parametrize("row,spelling", [(r, r.ok[0]) for r in isa.TABLE.values() if r.ok],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_refused_calls(row, spelling):
    sample = _samples(row, spelling)[0]
    gen = lambda e: _operands(Form(spelling), sample, e)  # noqa: E731
    _refused(spelling + ".bogus", gen, OperandError, r"\.bogus is not a modifier of")
    form = Form(spelling)
    if form.nmax < 1 << 16:
        _refused(spelling, lambda e: gen(e) + [reg.scalar(u32)] * (form.nmax + 1 - form.nmin),
                 OperandError, "takes .* operands")
    typed = [k for k, (role, ty, vec) in enumerate(form.roles[: form.nmin])
             if role in "dsr" and ty and not (vec and form.vec) and sample is None]
    if typed:
        k = typed[0]
        ty = form.roles[k][1]

        def wrong(e):
            ops = gen(e)
            ops[k] = reg.scalar(u32 if ty == "pred" else pred)
            return ops

        _refused(spelling, wrong, TypeMismatchError, rf"operand {k + 1} .* must be a \.{ty}")


@pytest.mark.parametrize("spelling,ops,match", [
    ("add.u32", lambda e: [reg.scalar(u32), e.r], "takes 3 operands"),
    ("add.f32", lambda e: [reg.scalar(f32), e.r, e.r], r"must be a \.f32 register"),
    ("add.bogus.u32", lambda e: [e.r, e.r, e.r], r"\.bogus is not a modifier of add"),
    ("ld.global.u32", lambda e: [reg.scalar(u32), e.rd], "must be an address"),
    ("ld.global.u32", lambda e: [reg.scalar(u32), ptx.addr(e.r)], "64-bit address"),
    ("ld.global.v4.f32", lambda e: [reg.array(f32, 2), ptx.addr(e.rd)], "vector of 4"),
    ("st.global.f32", lambda e: [ptx.addr(e.rd), ptx.addr(e.rd)], "not an address"),
    ("mul.u32", lambda e: [e.r, e.r, e.r], r"needs one of \.hi, \.lo, \.wide"),
    ("add.sat.u32", lambda e: [e.r, e.r, e.r], r"\.sat is not valid with \.u32"),
    ("shl.b32", lambda e: [e.r, e.r, 32], r"shift amount\) 32 is outside 0\.\.31"),
    ("shr.u64", lambda e: [e.rd, e.rd, -1], "outside 0..63"),
    ("setp.lt.u32", lambda e: [e.r, e.r, e.r], "must be a predicate register"),
    ("mov.b32", lambda e: [reg.array(b16, 3), e.r], "totalling 32 bits"),
    ("add.u32", lambda e: [1, e.r, e.r], "must be a register"),
    ("cvt", lambda e: [e.r, e.r], "needs a type suffix"),
    ("fma.rn.rz.f32", lambda e: [e.p] * 4, "exclude each other"),
    ("call", lambda e: [], r"takes 1 to 4 operands \(operand operand operand operand\), got 0"),
    ("call.uni", lambda e: ["(call_ret)", "isa_callee", "(call_arg)", "isa_proto", "x"],
     "takes 1 to 4 operands"),
    ("call.unit", lambda e: ["isa_nop"], r"\.unit is not a modifier of call; expected one of "
     r"\.uni"),
    ("wgmma.fence.sync.aligned", lambda e: [e.r], "takes 0 operands, got 1"),
    ("wgmma.wait_group.sync.aligned", lambda e: [], "takes 1 operands, got 0"),
    ("tcgen05.wait::st.sync.aligned", lambda e: [e.r], "takes 0 operands, got 1"),
    ("bar.sync", lambda e: [16], r"operand 1 \(source\) must be an int in 0\.\.15, got 16"),
    ("bar.sync", lambda e: [0, 100], r"must be an int in 32\.\.1024, a multiple of 32, got 100"),
    ("setmaxnreg.dec.sync.aligned.u32", lambda e: [20], r"an int in 24\.\.256, a multiple of 8"),
])
def test_issue_examples_refused(spelling, ops, match):
    _refused(spelling, ops, PyptxError, match)


def test_bit_size_compatible_registers_pass():
    assert compatible(u32, "b32") and compatible(f32, "b32") and compatible(u32, "s32")
    assert not compatible(u32, "f32") and not compatible(f32, "u32")
    assert not compatible(u64, "b32") and compatible(u64, "u32", relaxed=True)
    assert compatible(_BY_NAME["bf16"], "b16") and compatible(_BY_NAME["bf16x2"], "bf16x2")
    assert not compatible(pred, "b32") and compatible(pred, "pred")


def test_ptx_version_is_checked():
    def body(e):
        ptx.inst("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32")(
            ptx.addr(e.buf), e.r, ptx.addr(e.buf))

    @pyptx.kernel([Tile(1024, f32)], [Tile(1024, f32)], arch="sm_90a", version="8.0")
    def k(X, Y):
        e = Env()
        e.r = reg.scalar(u32, 0)
        e.buf = smem.alloc(f32, 16, name="b")
        body(e)

    with pytest.raises(TraceError, match=r"needs PTX ISA 8\.1"):
        k.ptx()


def _helper_kernels():
    """Kernels written with the named helpers (ptx.wgmma, ptx.tma, ptx.mbarrier, the
    pipelines, setmaxnreg, barriers): the hopper examples and, where installed, the
    library's GEMM and attention forward and backward."""
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parents[3] / "examples" / "hopper"
    ex = {p.stem: runpy.run_path(str(p)) for p in sorted(root.glob("*.py"))}
    out = [ex["wgmma_tile"]["build_wgmma_tile"](), ex["tma_copy"]["build_tma_copy"](256, 256),
           ex["grouped_gemm"]["build_grouped_gemm"](256, 256, 128, 2),
           ex["rms_norm"]["build_rms_norm"](4, 64)]
    try:
        from pyptx_kernels.flash_attention import build_attention
        from pyptx_kernels.flash_attention.bwd_host import build_attention_backward
        from pyptx_kernels.gemm import build_gemm
    except ImportError:
        return out
    out += [build_gemm(M=1024, N=1024, K=1024),
            build_attention(B=1, S=256, Hq=2, Hkv=2, D=64, causal=True),
            *build_attention_backward(1, 256, 2, 2, 64).kernels]
    return out


def test_named_helpers_emit_forms_the_table_accepts():
    """Where the named helpers and ``ptx.inst`` overlap they agree: every instruction a
    helper emits is a spelling of the table, with an operand count and a target (arch and
    PTX version) its row allows."""
    from types import SimpleNamespace

    from pyptx.parser import parse

    seen, bad = set(), []
    for k in _helper_kernels():
        spec = k.specialize()
        module = parse(spec.ptx())  # the text: a family loaded from disk was never traced here
        target = SimpleNamespace(arch=spec.arch, version=module.version)
        for st in module.functions[0].instructions():
            if (st.opcode, len(st.operands)) in seen:
                continue
            seen.add((st.opcode, len(st.operands)))
            try:
                form = Form(st.opcode)
                form.check_target(target)
                if not form.nmin <= len(st.operands) <= form.nmax:
                    raise OperandError(f"{len(st.operands)} operands, row takes "
                                       f"{form.nmin}..{form.nmax}")
            except PyptxError as e:
                bad.append(f"{k.name}: {st.opcode} {', '.join(st.operands)}: {e}")
    assert len(seen) > 80 and bad == []
