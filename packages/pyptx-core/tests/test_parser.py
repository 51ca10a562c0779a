"""pyptx.parser: structure of parsed PTX, error positions, and a no-crash fuzz test."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyptx import ir
from pyptx.errors import ParseError, PyptxError
from pyptx.parser import (
    Block,
    Directive,
    Function,
    Instruction,
    Label,
    RegDecl,
    Section,
    VarDecl,
    emit,
    parse,
    parse_file,
)
from pyptx.types import b8, u32, u64

CORPUS = Path(__file__).parent / "corpus"

KERNEL = """\
//
// header comment
//
.version 8.0
.target sm_90a
.address_size 64

.global .align 4 .u32 counter = 0;
.const .align 16 .f32 table[4] = {1.0, 2.0, 3.0, 4.0};
.extern .shared .align 16 .b8 dyn[];

.func (.param .b32 ret0) twice(.param .b32 x)
{
\t.reg .b32 t<2>;
\tld.param.b32 t0, [x];
\tshl.b32 t1, t0, 1;
\tst.param.b32 [ret0], t1;
\tret;
}

.visible .entry k(
\t.param .u64 .ptr .global .align 16 out,
\t.param .align 16 .b8 blob[32],
\t.param .u32 n
)
.maxntid 128, 1, 1
{
\t.reg .pred \t%p<3>;
\t.reg .b32 \t%r<9>;
\t.reg .b64 \t%rd<4>;
\t.loc\t1 5 3
\tld.param.u64 \t%rd1, [out];
\tld.param.v4.u32 {%r1, %r2, %r3, %r4}, [blob+16];
\tsetp.ge.u32 \t%p1, %r1, %r2;
\t@!%p1 bra \t$L__BB0_2;
\t{
\t.param .b32 param0;
\tst.param.b32 [param0], %r1;
\t.param .b32 retval0;
\tcall.uni (retval0),
\ttwice,
\t(
\tparam0
\t);
\tld.param.b32 %r5, [retval0];
\t}
\tsetp.ne.and.b32 %p2|%p1, %r5, 0, %p1;
$L__BB0_2:
\tst.global.u32 [%rd1+-4], %r5;  // store
\tret;
}
\t.section\t.debug_str
\t{
$L__info_string0:
.b8 107,0
\t}
"""


def test_module_structure():
    m = parse(KERNEL)
    assert (m.version, m.target, m.address_size) == ("8.0", "sm_90a", 64)
    assert [f.name for f in m.functions] == ["twice", "k"]
    assert isinstance(m, ir.Module) and isinstance(m.functions[0], ir.Function)
    kinds = [type(it).__name__ for it in m.items]
    assert kinds == ["Directive"] * 3 + ["VarDecl"] * 3 + ["Function", "Function", "Section"]
    counter, table, dyn = m.variables
    assert (counter.space, counter.align, counter.type_name, counter.var, counter.init) == \
        ("global", 4, "u32", "counter", "0")
    assert table.dims == (4,) and table.init == "{1.0, 2.0, 3.0, 4.0}" and table.space == "const"
    assert dyn.linkage == ("extern",) and dyn.dims == (None,) and dyn.type is b8
    sec = m.items[-1]
    assert isinstance(sec, Section) and sec.name == ".debug_str"
    assert [type(x) for x in sec.body] == [Label, Directive]


def test_functions_and_params():
    m = parse(KERNEL)
    twice, k = m.functions
    assert twice.kind == "func" and twice.linkage == () and twice.defined
    assert [p.name for p in twice.returns] == ["ret0"] and twice.params[0].name == "x"
    assert k.kind == "entry" and k.linkage == ("visible",)
    out, blob, n = k.params
    assert isinstance(out, ir.Param)
    assert (out.type, out.ptr, out.ptr_align) == (u64, "global", 16)
    assert (blob.align, blob.type, blob.count, blob.dims) == (16, b8, 32, (32,))
    assert n.type is u32 and n.ptr is None
    assert [d.text() for d in k.directives] == [".maxntid 128, 1, 1"]


def test_instructions():
    k = parse(KERNEL).function("k")
    regs = [st for st in k.body if isinstance(st, RegDecl)]
    assert [(r.type_name, r.names) for r in regs] == [("pred", [("%p", 3)]), ("b32", [("%r", 9)]),
                                                       ("b64", [("%rd", 4)])]
    insts = list(k.instructions())
    ld = insts[0]
    assert isinstance(ld, ir.Instruction)
    assert (ld.opcode, ld.operands, ld.pred, ld.base, ld.modifiers) == \
        ("ld.param.u64", ("%rd1", "[out]"), None, "ld", ("param", "u64"))
    assert insts[1].operands == ("{%r1, %r2, %r3, %r4}", "[blob+16]")
    bra = insts[3]
    assert (bra.opcode, bra.pred, bra.operands) == ("bra", "!%p1", ("$L__BB0_2",))
    call = next(i for i in insts if i.base == "call")
    assert call.opcode == "call.uni" and call.operands == ("(retval0)", "twice", "(param0)")
    setp = next(i for i in insts if i.opcode == "setp.ne.and.b32")
    assert setp.operands[0] == "%p2|%p1"
    st = insts[-2]
    assert st.operands == ("[%rd1+-4]", "%r5")
    blocks = [st for st in k.body if isinstance(st, Block)]
    assert len(blocks) == 1 and isinstance(blocks[0].body[0], VarDecl)
    assert blocks[0].body[0].space == "param"
    labels = [st.name for st in k.body if isinstance(st, Label)]
    assert labels == ["$L__BB0_2"]
    loc = next(st for st in k.body if isinstance(st, Directive) and st.name == ".loc")
    assert loc.args == "1 5 3" and not loc.semicolon


def test_round_trip_and_edit():
    m = parse(KERNEL)
    assert emit(m) == KERNEL and m.emit() == KERNEL
    ld = next(m.function("k").instructions())
    ld.edit(operands=("%rd2", "[out]"))
    text = emit(m)
    assert "\tld.param.u64 %rd2, [out];" in text and text.count("\n") == KERNEL.count("\n")
    m.function("k").edit(name="renamed")
    assert ".visible .entry renamed(\n\t.param .u64 .ptr .global .align 16 out," in emit(m)
    parse(emit(m))


def test_labels_share_lines_and_crlf():
    src = ".version 8.0\r\n.target sm_80\r\n.address_size 64\r\n.entry e()\r\n{\r\nL1: ret;\r\n}"
    m = parse(src)
    body = m.functions[0].body
    assert isinstance(body[0], Label) and isinstance(body[1], Instruction)
    assert emit(m) == src and not m.functions[0].params


def test_declaration_without_body():
    src = (".extern .func (.param .b32 func_retval0) vprintf\n(\n\t.param .b64 vprintf_param_0,\n"
           "\t.param .b64 vprintf_param_1\n)\n;\n")
    m = parse(src)
    f = m.functions[0]
    assert isinstance(f, Function) and not f.defined and f.linkage == ("extern",)
    assert [p.name for p in f.params] == ["vprintf_param_0", "vprintf_param_1"]
    assert emit(m) == src


@pytest.mark.parametrize("text, line, col, message", [
    (".version 8.0\nadd.s32 %r1, %r2, %r3;\n", 2, 1, "instruction outside a function body"),
    (".entry k()\n{\n\tmov.u32 %r1, %r2\n}\n", 3, 2, "terminating ';'"),
    (".entry k()\n{\n\tmov.u32 %r1, %r2\n\tret;\n}\n", 3, 2, "malformed operands"),
    (".entry k()\n{\n\tret;\n", 4, 1, "missing '}'"),
    ("}\n", 1, 1, "unmatched '}'"),
    (".entry k(.param .u64)\n{\n}\n", 1, 10, "parameter"),
    (".entry k()\n{\n\t.reg .b32 %r<x>;\n}\n", 3, 2, "malformed .reg"),
    (".entry k()\n\tret;\n", 2, 2, "expected '{' or ';'"),
    (".entry k()\n{\n\t\"str\"\n}\n", 3, 2, "expected an instruction"),
    (".section .debug_info\n.b8 1\n", 2, 1, "expected '{'"),
    (".address_size 99999\n", 1, 1, ".address_size"),
])
def test_errors_have_positions(text, line, col, message):
    with pytest.raises(ParseError) as ei:
        parse(text, "bad.ptx")
    e = ei.value
    assert isinstance(e, PyptxError)
    assert (e.line, e.column) == (line, col), str(e)
    assert message in e.message and str(e).startswith(f"bad.ptx:{line}:{col}: ")
    assert e.text == text.split("\n")[line - 1][col - 1:][:80] or e.text.endswith("...")


def test_bytes_input_and_type_errors():
    assert emit(parse(b".version 8.0\n")) == ".version 8.0\n"
    with pytest.raises(ParseError):
        parse(b"\xff\xfe")
    with pytest.raises(TypeError):
        parse(12)  # type: ignore[arg-type]


def test_parse_file_keeps_newlines(tmp_path):
    p = tmp_path / "k.ptx"
    p.write_bytes(b".version 8.0\r\n.target sm_80\r\n")
    assert emit(parse_file(p)) == ".version 8.0\r\n.target sm_80\r\n"


# ---------------------------------------------------------------- fuzz: only ParseError escapes
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

_PIECES = [
    ".version 8.0", ".target sm_90a", ".address_size 64", ".visible", ".entry", ".func", ".extern",
    ".reg", ".b32", ".pred", ".param", ".u64", ".align", "16", ".shared", ".global", ".section",
    ".loc", ".file", "\"a;b\"", "%r1", "%r<4>", "%p1", "@%p1", "@!", "bra", "$L__BB0_1", ":", ";",
    ",", "{", "}", "(", ")", "[", "]", "+", "-4", "0f3F800000", "0x1F", "mov.u32", "ld.global.f32",
    "call.uni", "//", "/*", "*/", "\n", "\t", " ", "=", "<", ">", "|", "_", "k", "x", "99999999999",
    ".maxntid 1, 1, 1", ".pragma \"nounroll\";", "ret;", "\r\n", "\\", "\x00", "é",
]


def _lines() -> list[str]:
    out = []
    for name in ("hand_syntax_zoo.ptx", "hand_indirect_calls.ptx", "nvcc_vector_add_sm_80_debug.ptx"):
        out += (CORPUS / name).read_text().splitlines(keepends=True)[:400]
    return out


_LINES = _lines()


def _check(text: str) -> None:
    try:
        m = parse(text)
    except ParseError as e:
        assert e.line >= 1 and e.column >= 1
        return
    assert emit(m) == text


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(st.lists(st.sampled_from(_PIECES), max_size=60))
def test_fuzz_token_soup(pieces):
    _check("".join(pieces))


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.lists(st.sampled_from(_LINES), max_size=40),
                  st.integers(0, 10_000), st.text(max_size=8))
def test_fuzz_mutated_corpus_lines(lines, at, insert):
    text = "".join(lines)
    at = at % (len(text) + 1)
    _check(text[:at] + insert + text[at:])
    _check(text[:at] + text[at + len(insert):])


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.text(max_size=300))
def test_fuzz_any_text(text):
    _check(text)


def test_deep_nesting_and_unbalanced_brackets():
    deep = ".entry k()\n{\n" + "{\n" * 5000 + "}\n" * 5000 + "}\n"
    assert emit(parse(deep)) == deep
    with pytest.raises(ParseError, match="malformed operands"):
        parse(".entry k()\n{\n\tmov.u32 %r1, [[%r2;\n}\n")
