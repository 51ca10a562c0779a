"""A parsed ``Module`` -> PTX text.

Each node prints its trivia and then its spelling as read; a node whose ``raw``
is ``None`` (edited, or built by a tool) prints its canonical text. With no
edits the output is the input, byte for byte.
"""

from __future__ import annotations

from .nodes import Block, Function, Module, Section

__all__ = ["emit"]


def emit(module: Module) -> str:
    """Print ``module`` as PTX text."""
    out: list[str] = []
    add = out.append
    for it in module.items:
        cls = type(it)
        if cls is Function:
            _function(it, out)
        elif cls is Section:
            add(it.trivia)
            add(it.raw if it.raw is not None else f".section {it.name}")
            add(it.open_trivia)
            add("{")
            _body(it.body, out)
            add(it.close_trivia)
            add("}")
        else:
            add(it.trivia)
            add(it.raw if it.raw is not None else it.text())
    add(module.trailing)
    return "".join(out)


def _function(fn: Function, out: list[str]) -> None:
    add = out.append
    add(fn.trivia)
    add(fn.raw if fn.raw is not None else fn.header_text())
    for d in fn.directives:
        add(d.trivia)
        add(d.raw if d.raw is not None else d.text())
    if not fn.defined:
        add(fn.close_trivia)
        add(";")
        return
    add(fn.open_trivia)
    add("{")
    _body(fn.body, out)
    add(fn.close_trivia)
    add("}")


def _body(body: list, out: list[str]) -> None:
    add = out.append
    stack = [(iter(body), None)]  # iterative: nesting depth is not limited by Python's stack
    while stack:
        it, blk = stack[-1]
        for st in it:
            if type(st) is Block:
                add(st.trivia)
                add("{")
                stack.append((iter(st.body), st))
                break
            add(st.trivia)
            raw = st.raw
            add(raw if raw is not None else st.text())
        else:
            stack.pop()
            if blk is not None:
                add(blk.close_trivia)
                add("}")
