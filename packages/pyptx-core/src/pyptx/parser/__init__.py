"""Read any PTX: ``parse(text) -> Module`` and ``emit(module) -> text``, byte-identical.

    from pyptx.parser import parse, emit
    mod = parse(open("kernel.ptx").read())
    for fn in mod.functions:
        for inst in fn.instructions():
            print(inst.pred, inst.opcode, inst.operands)
    assert emit(mod) == text

Nodes (``pyptx.parser.nodes``) extend the DSL's IR classes (``pyptx.ir``) with
what PTX files carry beyond the DSL: module directives and variables, ``.func``
with return parameters, calls, nested blocks, debug sections, and each
statement's original trivia and spelling. Errors are ``pyptx.errors.ParseError``
with ``.line``, ``.column`` and ``.text``.
"""

from ..errors import ParseError
from .emit import emit
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
from .parser import parse, parse_file

__all__ = [
    "parse", "parse_file", "emit", "ParseError", "Module", "Function", "Param", "Instruction",
    "Label", "Directive", "RegDecl", "VarDecl", "Block", "Section",
]
