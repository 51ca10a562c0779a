"""PTX text -> ``pyptx.parser.nodes.Module``.

One loop over the text: each turn matches ``lexer.STATEMENT`` at the current
position (trivia, then one statement), builds a node that keeps its trivia and
spelling, and files it in the open container (module, function header,
function body, nested block, debug section). Structural mistakes (an
instruction outside a function, a missing ``}`` or ``;``, unbalanced brackets,
a malformed declaration or header) raise ``ParseError`` with line, column and
the offending text; nothing else escapes.
"""

from __future__ import annotations

import re

from ..errors import ParseError, PyptxError
from ..types import _BY_NAME
from . import lexer
from .nodes import (
    Block,
    Directive,
    Function,
    Instruction,
    Label,
    Module,
    Param,
    RegDecl,
    Section,
    VarDecl,
)

__all__ = ["parse", "parse_file"]

_TRIVIA = re.compile(lexer.TRIVIA)
_VERSION = re.compile(r"\d+\.\d+\Z")
_REG = re.compile(
    r"\.reg\s+(?:\.v(?P<vec>\d+)\s+)?\.(?P<type>[A-Za-z_]\w*)\s+"
    r"(?P<names>[$%A-Za-z_][\w$]*\s*(?:<\s*\d+\s*>)?\s*(?:,\s*[$%A-Za-z_][\w$]*\s*(?:<\s*\d+\s*>)?\s*)*)\Z"
)
_REG_NAME = re.compile(r"([$%A-Za-z_][\w$]*)\s*(?:<\s*(\d+)\s*>)?")
_LINKAGE = frozenset(("visible", "extern", "weak", "common"))
_SPACES = frozenset(("global", "const", "shared", "local", "param", "tex", "reg"))
_VAR_WORDS = _LINKAGE | (_SPACES - {"reg"})
_VECTORS = {"v2": 2, "v4": 4, "v8": 8}
_MAX_INT_DIGITS = 40


class _Fail(Exception):
    """Internal: a sub-parser rejected a statement (turned into ParseError with a position)."""


def _int(s: str) -> int:
    if len(s) > _MAX_INT_DIGITS:
        raise _Fail(f"number {s[:20]}... is too long")
    return int(s)


def _error(text: str, pos: int, message: str, source: str) -> ParseError:
    pos = min(max(pos, 0), len(text))
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    end = text.find("\n", pos)
    snippet = text[pos:end if end >= 0 else len(text)]
    if len(snippet) > 80:
        snippet = snippet[:77] + "..."
    return ParseError(message, line, col, snippet, source)


def _words(words: str) -> list[tuple[str, str | None]]:
    return [(w, n or None) for w, n in lexer.WORD.findall(words)]


def _dims(text: str) -> tuple[int | None, ...]:
    out = []
    for d in lexer.DIM.findall(text):
        if d == "":
            out.append(None)
        elif d.isdigit():
            out.append(_int(d))
        else:
            raise _Fail(f"array size must be a number, got {d!r}")
    return tuple(out)


def _param(text: str) -> Param:
    """One entry of a parameter list: ``.param [.align N] .type [.ptr [.space] [.align N]] name[dims]``."""
    clean = lexer.strip_comments(text) if "/" in text else text
    m = lexer.DECL.match(clean)
    if m is None or m.group("init") is not None or m.group("count") is not None:
        raise _Fail(f"malformed parameter {clean.strip()!r}")
    space = None
    align = ptr_align = vector = None
    type_name = None
    ptr = None
    for w, n in _words(m.group("words")):
        if w in ("param", "reg") and space is None:
            space = w
        elif w == "align":
            if n is None:
                raise _Fail(".align needs a number")
            if ptr is not None:
                ptr_align = _int(n)
            else:
                align = _int(n)
        elif w == "ptr":
            ptr = ""
        elif ptr == "" and w in _SPACES:
            ptr = w
        elif w in _VECTORS and type_name is None:
            vector = _VECTORS[w]
        elif type_name is None and n is None:
            type_name = w
        else:
            raise _Fail(f"unexpected .{w} in parameter {clean.strip()!r}")
    if space is None or type_name is None:
        raise _Fail(f"a parameter needs .param (or .reg) and a type: {clean.strip()!r}")
    dims = _dims(m.group("dims"))
    count = dims[0] if dims else None
    return Param(m.group("name"), _BY_NAME.get(type_name), align, count, type_name=type_name,
                 space=space, vector=vector, ptr=ptr, ptr_align=ptr_align, dims=dims,
                 raw=text.strip())


def _param_list(text: str | None) -> list[Param]:
    if text is None:
        return []
    clean = lexer.strip_comments(text) if "/" in text else text
    if not clean.strip():
        return []
    parts = clean.split(",")
    return [_param(p) for p in parts]


def _reg_decl(body: str, trivia: str, raw: str) -> RegDecl:
    m = _REG.match(lexer.strip_comments(body).strip() if "/" in body else body.strip())
    if m is None:
        raise _Fail("malformed .reg declaration")
    vec = m.group("vec")
    names = []
    for name, count in _REG_NAME.findall(m.group("names")):
        names.append((name, _int(count) if count else None))
    return RegDecl(m.group("type"), _int(vec) if vec else None, names, trivia, raw)


def _var_decl(body: str, trivia: str, raw: str) -> VarDecl | None:
    """A variable declaration, or None when it is not one we can take apart (kept as a Directive)."""
    clean = lexer.strip_comments(body) if "/" in body else body
    m = lexer.DECL.match(clean)
    if m is None or m.group("count") is not None:
        return None
    linkage: list[str] = []
    attrs: list[str] = []
    space = None
    align = vector = None
    type_name = None
    for w, n in _words(m.group("words")):
        if n is not None:
            if w != "align":
                return None
            align = _int(n)
        elif w in _LINKAGE and space is None:
            linkage.append(w)
        elif space is None and w in _SPACES:
            space = w
        elif w in _VECTORS and type_name is None:
            vector = _VECTORS[w]
        elif type_name is None and (w in _BY_NAME or w[:1] in "bsuf" and w[1:].isdigit()
                                    or w in ("texref", "samplerref", "surfref")):
            type_name = w
        else:
            attrs.append(w)
    if space is None or type_name is None:
        return None
    init = m.group("init")
    return VarDecl(tuple(linkage), space, align, vector, type_name, m.group("name"),
                   _dims(m.group("dims")), init, tuple(attrs), trivia, raw)


class ParseInputError(PyptxError, TypeError):
    """``parse`` was given something that is not PTX text."""


def parse(text: str, source: str = "<ptx>") -> Module:
    """Parse PTX ``text`` into a ``Module``; ``emit(parse(t)) == t`` for every input it accepts.

    ``source`` names the text in error messages. Raises ``ParseError``.
    """
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = decode_ptx(bytes(text), source)
    if not isinstance(text, str):
        from ..source import where

        raise ParseInputError(
            f"{where()}: parse expects PTX text (str or UTF-8 bytes), got {type(text).__name__}"
        )
    try:
        return _parse(text, source)
    except _Fail as e:  # pragma: no cover - every _Fail is caught with its position below
        raise _error(text, 0, str(e), source) from None
    except RecursionError:  # pragma: no cover - the parser does not recurse
        raise _error(text, 0, "input too deeply nested", source) from None


def decode_ptx(data: bytes, source: str) -> str:
    """UTF-8 PTX text; ``ParseError`` at the line and column of the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        what = "an ELF binary (a cubin?), not PTX text" if data[:4] == b"\x7fELF" else (
            f"byte 0x{data[e.start]:02x} is not UTF-8; PTX files are UTF-8 (ASCII) text")
        raise ParseError(what, line, column, repr(data[e.start:e.start + 8]), source) from None


def _parse(text: str, source: str) -> Module:
    mod = Module("", "", [], items=[], source=source)
    items = mod.items
    functions = mod.functions
    match = lexer.STATEMENT.match
    split = lexer.split_operands
    body: list | None = None  # the statement list being filled (function body or block)
    stack: list[tuple[list, Block]] = []  # enclosing bodies of open nested blocks
    fn: Function | None = None  # the function whose body is open
    pending: Function | None = None  # a header waiting for '{' or ';'
    section: Section | None = None  # a '.section' waiting for '{'
    labels: dict[str, int] = {}  # the labels of the open body (PTX scopes them per block)
    outer_labels: list[dict[str, int]] = []  # those of the enclosing bodies
    pos = 0

    def fail(at: int, message: str) -> ParseError:
        return _error(text, at, message, source)

    while True:
        m = match(text, pos)
        if m is None:
            at = _TRIVIA.match(text, pos).end()
            c = text[at:at + 1]
            if section is not None:
                raise fail(at, f"expected '{{' after .section {section.name}")
            if text.startswith("/*", at):
                raise fail(at, "unterminated /* comment: no closing */ before the end of input")
            if c == "\x00" or text.startswith("\x7fELF", at):
                raise fail(at, "binary data, not PTX text")
            if c.isalpha() or c in "@._":
                raise fail(at, "statement without a terminating ';'")
            raise fail(at, "expected an instruction, label, directive or brace")
        kind = m.lastgroup
        if kind == "I":
            triv, raw, pn, pr, op, args = m.group("triv", "I", "pn", "pr", "op", "args")
            if body is None:
                raise fail(m.start("I"), "instruction outside a function body" if pending is None
                           else f"expected '{{' or ';' after the header of {pending.name}")
            ops = split(args)
            if ops is None:
                raise fail(m.start("I"), "malformed operands (unbalanced brackets, empty "
                                         "operand, or a missing ';')")
            body.append(Instruction(op, ops, ("!" + pr if pn else pr) if pr else None, triv, raw))
        elif kind == "D":
            triv, raw, name, args, semi = m.group("triv", "D", "dname", "dargs", "dsemi")
            node = Directive("." + name, args.strip(), semi is not None, triv, raw)
            if body is not None:
                if name == "section":
                    raise fail(m.start("D"), ".section inside a function body")
                body.append(node)
            elif pending is not None:
                pending.directives.append(node)
            elif section is not None:
                raise fail(m.start("D"), f"expected '{{' after .section {section.name}")
            elif name == "section":
                section = Section(node.args, triv, raw)
                items.append(section)
            else:
                if name == "version":
                    if not _VERSION.match(node.args):
                        raise fail(m.start("D"), ".version must be a PTX ISA version "
                                   f"major.minor such as 8.0, got {node.args!r}")
                    mod.version = node.args
                elif name == "target":
                    if not node.args:
                        raise fail(m.start("D"), ".target needs an architecture such as sm_90a")
                    mod.target = node.args
                elif name == "address_size":
                    if not node.args.isdigit() or len(node.args) > 3:
                        raise fail(m.start("D"), ".address_size must be 32 or 64")
                    mod.address_size = int(node.args)
                items.append(node)
        elif kind == "L":
            if body is None:
                raise fail(m.start("L"), "label outside a function body")
            triv, raw, name = m.group("triv", "L", "lname")
            first = labels.get(name)
            if first is not None:
                line = text.count("\n", 0, first) + 1
                raise fail(m.start("L"), f"label {name} is defined twice in one block (first at "
                                         f"line {line}); expected each label once")
            labels[name] = m.start("L")
            body.append(Label(name, triv, raw))
        elif kind == "S":
            triv, raw, name = m.group("triv", "S", "sname")
            at = m.start("S")
            if pending is not None:
                raise fail(at, f"expected '{{' or ';' after the header of {pending.name}")
            if section is not None:
                raise fail(at, f"expected '{{' after .section {section.name}")
            inner = raw[:-1]
            try:
                if name == "reg":
                    node = _reg_decl(inner, triv, raw)
                elif name in _VAR_WORDS:
                    node = _var_decl(inner, triv, raw)
                    if node is None:
                        node = Directive("." + name, m.group("sargs").strip(), True, triv, raw)
                else:
                    node = Directive("." + name, m.group("sargs").strip(), True, triv, raw)
            except _Fail as e:
                raise fail(at, str(e)) from None
            (body if body is not None else items).append(node)
        elif kind == "F":
            at = m.start("F")
            if body is not None:
                raise fail(at, "a function cannot be declared inside another function")
            if pending is not None:
                raise fail(at, f"expected '{{' or ';' after the header of {pending.name}")
            if section is not None:
                raise fail(at, f"expected '{{' after .section {section.name}")
            rest = lexer.FUNC_REST.match(text, m.end())
            if rest is None:
                raise fail(m.end(), "expected a function name (and parameter list)")
            triv, head, fkind = m.group("triv", "F", "fkind")
            linkage = tuple(w for w, _ in _words(head[:head.rfind(".")]))
            try:
                if fkind == "entry" and rest.group("ret") is not None:
                    raise _Fail(".entry functions have no return parameters")
                returns = _param_list(rest.group("ret"))
            except _Fail as e:
                raise fail(rest.start("ret") if rest.group("ret") is not None else m.end(),
                           str(e)) from None
            try:
                params = _param_list(rest.group("params"))
            except _Fail as e:
                raise fail(rest.start("params"), str(e)) from None
            pending = Function(rest.group("name"), params=params, kind=fkind, linkage=linkage,
                               returns=returns, has_param_list=rest.group("params") is not None,
                               trivia=triv, raw=text[at:rest.end()])
            items.append(pending)
            functions.append(pending)
            pos = rest.end()
            continue
        elif kind == "O":
            triv = m.group("triv")
            if body is not None:
                blk = Block(triv)
                body.append(blk)
                stack.append((body, blk))
                body = blk.body
                outer_labels.append(labels)
                labels = {}
            elif pending is not None:
                fn, pending = pending, None
                fn.open_trivia = triv
                body = fn.body
                labels = {}
            elif section is not None:
                section.open_trivia = triv
                pos = _parse_section(text, m.end(), section, fail)
                section = None
                continue
            else:
                raise fail(m.start("O"), "'{' outside a function")
        elif kind == "C":
            triv = m.group("triv")
            if stack:
                body, blk = stack.pop()
                blk.close_trivia = triv
                labels = outer_labels.pop()
            elif fn is not None:
                fn.close_trivia = triv
                fn = None
                body = None
            else:
                raise fail(m.start("C"), "unmatched '}'")
        elif kind == "E":
            triv = m.group("triv")
            if pending is not None:
                pending.defined = False
                pending.close_trivia = triv
                pending = None
            elif body is not None:
                body.append(Directive("", "", True, triv, ";"))
            elif section is not None:
                raise fail(m.start("E"), f"expected '{{' after .section {section.name}")
            else:
                items.append(Directive("", "", True, triv, ";"))
        else:  # Z: end of input
            if pending is not None:
                raise fail(m.start("Z"), f"unexpected end of input: the header of {pending.name} "
                                         "needs '{' or ';'")
            if section is not None:
                raise fail(m.start("Z"), f"unexpected end of input: .section {section.name} needs '{{'")
            if body is not None:
                raise fail(m.start("Z"), f"unexpected end of input: missing '}}' of {fn.name}")
            mod.trailing = m.group("triv")
            return mod
        pos = m.end()


def _parse_section(text: str, pos: int, section: Section, fail) -> int:
    match = lexer.SECTION_STATEMENT.match
    out = section.body
    while True:
        m = match(text, pos)
        if m is None:
            at = _TRIVIA.match(text, pos).end()
            raise fail(at, f"expected a label or a data directive in .section {section.name}")
        kind = m.lastgroup
        if kind == "D":
            triv, raw, name, args, semi = m.group("triv", "D", "dname", "dargs", "dsemi")
            out.append(Directive("." + name, args.strip(), semi is not None, triv, raw))
        elif kind == "L":
            triv, raw, name = m.group("triv", "L", "lname")
            out.append(Label(name, triv, raw))
        elif kind == "C":
            section.close_trivia = m.group("triv")
            return m.end()
        else:
            raise fail(m.start("Z"), f"unexpected end of input: missing '}}' of .section {section.name}")
        pos = m.end()


def parse_file(path, source: str | None = None) -> Module:
    """Read and parse a PTX file (UTF-8, newlines kept as they are)."""
    with open(path, "rb") as f:
        data = f.read()
    return parse(decode_ptx(data, source or str(path)), source or str(path))
