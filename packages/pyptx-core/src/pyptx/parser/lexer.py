"""The regular expressions that cut PTX into statements, and operand splitting.

The parser is statement-at-a-time: one compiled regex (``STATEMENT``) matches the
trivia in front of the next statement and the statement itself, and names
which kind it is (instruction, label, line directive, ``;`` directive, function
header, brace). Instructions come out with predicate, opcode and operand text
already separated, so most lines cost one ``match`` call and a ``split``.

Every pattern is written so that a failing match cannot backtrack
exponentially: repeated alternatives each start with a distinct character.
"""

from __future__ import annotations

import re

# Comments, each matching one way only: a line comment runs to the end of its line, a
# block comment stops at its first '*/' (a pattern that could also end earlier or later
# lets a failing match retry every split of every comment: exponential time).
_LINE_COMMENT = r"//[^\n]*(?![^\n])"
_BLOCK_COMMENT = r"/\*[^*]*\*+(?:[^/*][^*]*\*+)*/"

# Whitespace and comments before a statement.
TRIVIA = rf"\s*(?:(?:{_LINE_COMMENT}|{_BLOCK_COMMENT})\s*)*"

# Text up to a ';' that may hold strings and comments (unrolled: no nested quantifiers).
_TO_SEMI = rf'[^;"/]*(?:(?:"[^"\n]*"|{_LINE_COMMENT}|{_BLOCK_COMMENT}|/(?![/*]))[^;"/]*)*'
# The rest of a line (for directives without ';'): strings allowed; a trailing comment and
# braces ('.section .debug_x { }' on one line) excluded.
_TO_EOL = r'[^\n;"/{}]*(?:(?:"[^"\n]*"|/(?![/*]))[^\n;"/{}]*)*'

# Directives that end at the end of their line rather than at ';'.
LINE_DIRECTIVES = (
    "version", "target", "address_size", "file", "loc", "section", "maxntid", "reqntid",
    "minnctapersm", "maxnctapersm", "maxnreg", "reqnctapercluster", "explicitcluster",
    "maxclusterrank", "noreturn", "blocksareclusters", "abi_preserve", "abi_preserve_control",
)

STATEMENT = re.compile(
    rf"(?P<triv>{TRIVIA})(?:"
    # a label 'name:' (an opcode is followed by '.', space or ';', so this fails fast)
    r"(?P<L>(?P<lname>[$%A-Za-z_][\w$]*)[ \t]*:(?!:))"
    # an instruction: optional guard, opcode with modifiers, operands up to ';'
    rf"|(?P<I>(?:@(?P<pn>!?)[ \t]*(?P<pr>[%$\w]+)\s+)?(?P<op>[A-Za-z_][\w.:]*)(?P<args>{_TO_SEMI});)"
    # a directive that ends with its line
    rf"|(?P<D>\.(?P<dname>{'|'.join(LINE_DIRECTIVES)})\b(?P<dargs>{_TO_EOL})(?P<dsemi>[ \t]*;)?)"
    # a function header: linkage words, .entry/.func (the rest is parsed by parser.py)
    r"|(?P<F>(?:\.(?:visible|extern|weak)\s+)*\.(?P<fkind>entry|func)\b)"
    # any other directive or declaration, up to ';'
    rf"|(?P<S>\.(?P<sname>[A-Za-z_]\w*)(?P<sargs>{_TO_SEMI});)"
    r"|(?P<O>\{)|(?P<C>\})|(?P<E>;)|(?P<Z>\Z))"
)

# A statement inside a debug '.section { ... }': labels and data lines, ';' optional.
SECTION_STATEMENT = re.compile(
    rf"(?P<triv>{TRIVIA})(?:"
    r"(?P<L>(?P<lname>[$%A-Za-z_][\w$]*)[ \t]*:(?!:))"
    rf"|(?P<D>\.(?P<dname>[A-Za-z_]\w*)\b(?P<dargs>{_TO_EOL})(?P<dsemi>[ \t]*;)?)"
    r"|(?P<C>\})|(?P<Z>\Z))"
)

# After '.entry'/'.func': return list, name, parameter list.
FUNC_REST = re.compile(
    r"(?:\s*\((?P<ret>[^()]*)\))?\s*(?P<name>[$%A-Za-z_][\w$]*)(?:\s*\((?P<params>[^()]*)\))?"
)

# One declaration: dotted words (with '.align N'), a name, dims, '<n>' count, initializer.
DECL = re.compile(
    r"\s*(?P<words>(?:\.[A-Za-z_][\w:]*(?:\s+\d+)?\s*)*)"
    r"(?P<name>[$%A-Za-z_][\w$]*)\s*(?P<dims>(?:\[\s*\w*\s*\]\s*)*)"
    r"(?:<\s*(?P<count>\d+)\s*>)?\s*(?:=\s*(?P<init>[\s\S]*\S))?\s*\Z"
)
WORD = re.compile(r"\.([A-Za-z_][\w:]*)(?:\s*(\d+))?")
DIM = re.compile(r"\[\s*(\w*)\s*\]")

COMMENT = re.compile(r"//[^\n]*|/\*[\s\S]*?\*/")
_SPACE = re.compile(r"\s+")
_CLOSE = {"]": "[", "}": "{", ")": "("}


def strip_comments(text: str) -> str:
    """``text`` with ``//`` and ``/* */`` comments replaced by a space."""
    return COMMENT.sub(" ", text)


def split_operands(args: str) -> tuple[str, ...] | None:
    """Split an instruction's operand text at top-level commas; ``None`` if brackets do not balance.

    Operands come back stripped; inside ``{}``/``()`` lists whitespace is
    normalized to ``a, b``; ``[...]`` keeps its spelling minus outer spaces.
    """
    if "/" in args:
        args = strip_comments(args)
    if "{" not in args and "(" not in args:
        if "[" in args and "," in args and args.find(",", args.find("[")) < args.find("]"):
            pass  # a comma inside [...] (texture/TMA coordinates): take the careful path
        else:
            if not args or args.isspace():
                return ()
            ops = [a.strip() for a in args.split(",")]
            if "" in ops or ("[" in args or "]" in args) and args.count("[") != args.count("]"):
                return None
            if "\n" in args and any("\n" in o for o in ops):
                return None  # a line break inside one operand: a ';' is missing
            return tuple(ops)
    out = []
    depth = []
    start = 0
    for i, ch in enumerate(args):
        if ch in "[{(":
            depth.append(ch)
        elif ch in "]})":
            if not depth or depth.pop() != _CLOSE[ch]:
                return None
        elif ch == "," and not depth:
            out.append(args[start:i])
            start = i + 1
    if depth:
        return None
    out.append(args[start:])
    ops = []
    for op in out:
        op = op.strip()
        if not op or "\n" in op and op[0] not in "[{(" and op[-1] not in "]})":
            return None
        if ("{" in op or "(" in op) and ("," in op or "\n" in op or "  " in op):
            op = _normalize_list(op)
        ops.append(op)
    return tuple(ops)


def _normalize_list(op: str) -> str:
    """``{ %r1,%r2 }`` -> ``{%r1, %r2}`` (and the same for ``( ... )``), recursively flat."""
    out = []
    text = _SPACE.sub(" ", op)
    for piece in re.split(r"([{}()\[\],])", text):
        piece = piece.strip()
        if not piece:
            continue
        if piece == ",":
            out.append(", ")
        else:
            out.append(piece)
    return "".join(out)
