"""PTX -> pyptx: write a Python module whose ``build()`` re-creates a PTX file through the DSL.

    pyptx transpile kernel.ptx -o kernel_ptx.py            # equivalent PTX
    pyptx transpile kernel.ptx --exact -o kernel_ptx.py    # byte-identical PTX
    pyptx transpile kernel.ptx --sugar -o kernel_ptx.py    # idiomatic pyptx

The module builds a ``pyptx.module.PtxModule``: one ``with m.function(...)``
block per function, registers declared with ``fn.reg`` (arrays indexed by
their PTX numbers), exact labels from ``fn.labels``, and one
``ptx.inst.<opcode>(...)`` call per instruction with registers, Python
numbers, ``ptx.addr(...)`` and lists as operands. Module variables, debug
sections and body directives are written out as PTX text.

``exact=True`` adds a ``LAYOUT`` table (separators and spellings that differ
from the canonical printing) so ``build().ptx()`` equals the input byte for
byte. ``sugar=True`` uses the named helpers instead: ``reg.array`` for register
arrays, ``ptx.global_ptrs`` for ``ld.param`` + ``cvta.to.global`` pairs,
``ptx.special`` reads, ``ptx.bra``/``ptx.ret``/``ptx.bar_sync``, the Hopper
helpers (``ptx.wgmma.*``, ``ptx.tma.*``, fences, cluster barriers,
``ptx.setmaxnreg``) and demangled C++ names in comments and parameter names;
register names then change (the PTX is equivalent, not identical).
"""

from __future__ import annotations

import argparse
import keyword
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from . import imm
from .errors import ParseError, PyptxError
from .parser import parse
from .parser.nodes import (
    Block,
    Directive,
    Function,
    Instruction,
    Label,
    Module,
    RegDecl,
    Section,
)
from .parser.parser import decode_ptx
from .ptx.inst import OPCODES, ptx_spelling
from .types import _BY_NAME

__all__ = ["transpile", "main", "TranspileError"]


class TranspileError(PyptxError):
    """The input cannot be turned into pyptx code (for example ``exact`` and ``sugar`` together)."""


_RESERVED = {"ptx", "reg", "m", "fn", "build", "LAYOUT", "PtxModule", "T", "main", "sys"} | set(_BY_NAME)
_REGNUM = re.compile(r"^(%?[A-Za-z_$][\w$]*?)(\d+)$")
_INT = re.compile(r"^-?\d+$")
_FHEX = re.compile(r"^0[fF][0-9A-Fa-f]{8}$|^0[dD][0-9A-Fa-f]{16}$")
_ADDR = re.compile(r"^\[\s*([%$\w.]+)\s*(?:\+\s*(-?\d+)\s*)?\]$")
_IDENT = re.compile(r"[^0-9A-Za-z_]")


def _pyname(name: str, taken: dict[str, str], ptx_name: str) -> str:
    """A Python identifier for PTX name ``ptx_name`` (stable within one function)."""
    if ptx_name in taken:
        return taken[ptx_name]
    base = _IDENT.sub("_", name.lstrip("%$")).strip("_") or "v"
    if base[0].isdigit():
        base = "v" + base
    cand = base
    used = set(taken.values())
    i = 2
    while cand in used or cand in _RESERVED or keyword.iskeyword(cand):
        cand = f"{base}_{i}"
        i += 1
    taken[ptx_name] = cand
    return cand


def _attr(part: str) -> str | None:
    """The Python attribute spelling of one opcode part, or None if it has none."""
    name = part.replace("::", "__")
    if name and name[0].isdigit():
        name = "_" + name
    if keyword.iskeyword(name) or name in ("global", "async", "and", "or", "not"):
        name += "_"
    if not name.isidentifier() or ptx_spelling(name) != part or name.startswith("__"):
        return None
    return name


def _demangle_all(names: list[str]) -> dict[str, str]:
    """Itanium-demangled names via ``c++filt`` (if installed); identity otherwise."""
    mangled = [n for n in names if n.startswith("_Z")]
    tool = shutil.which("c++filt")
    if not mangled or tool is None:
        return {}
    try:
        p = subprocess.run([tool], input="\n".join(mangled), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    out = p.stdout.splitlines()
    if len(out) != len(mangled):
        return {}
    return {m: d for m, d in zip(mangled, out) if d != m}


def _short(demangled: str) -> str:
    """``void ns::foo<int>(float*)`` -> ``foo``."""
    head = demangled.split("(")[0]
    depth = 0
    out = []
    for ch in head:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).split("::")[-1].split()[-1] if "".join(out).strip() else head


class _Gen:
    """Code generation state for one module."""

    def __init__(self, mod: Module, sugar: bool, opsep: str) -> None:
        self.mod = mod
        self.sugar = sugar
        self.opsep = opsep
        self.lines: list[str] = []
        self.types: set[str] = set()
        self.need_reg = False
        self.demangled = _demangle_all([f.name for f in mod.functions]) if sugar else {}

    # ------------------------------------------------------------------ module
    def module(self) -> None:
        items = list(self.mod.items)
        head = [it for it in items[:3] if type(it) is Directive]
        names = [d.name for d in head]
        if names == [".version", ".target", ".address_size"] and head[2].args.isdigit():
            self.emit(1, f"m = PtxModule({head[0].args!r}, {head[1].args!r}, {int(head[2].args)}, "
                         f"opsep={self.opsep!r}, layout=LAYOUT)")
            items = items[3:]
        else:
            self.emit(1, f"m = PtxModule(None, None, None, opsep={self.opsep!r}, layout=LAYOUT)")
        for it in items:
            cls = type(it)
            if cls is Function:
                self.function(it)
            elif cls is Section:
                self.emit(1, f"m.directive({_section_text(it)!r})")
            else:
                self.emit(1, f"m.directive({it.text()!r})")
        self.emit(1, "return m")

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line if line else "")

    # ------------------------------------------------------------------ functions
    def function(self, fn: Function) -> None:
        params = [p.raw if p.raw is not None else p.text() for p in fn.params]
        returns = [p.raw if p.raw is not None else p.text() for p in fn.returns] if fn.returns else None
        args = [repr(fn.name), f"kind={fn.kind!r}", f"linkage={fn.linkage!r}"]
        if params:
            args.append("params=[" + ", ".join(repr(p) for p in params) + "]")
        if returns is not None:
            args.append("returns=[" + ", ".join(repr(p) for p in returns) + "]")
        if fn.directives:
            args.append("directives=[" + ", ".join(repr(d.text()) for d in fn.directives) + "]")
        if not fn.has_param_list:
            args.append("param_list=False")
        self.emit(1, "")
        pretty = self.demangled.get(fn.name)
        if pretty:
            self.emit(1, f"# {pretty}")
        if not fn.defined:
            self.emit(1, f"m.declare({', '.join(args)})")
            return
        self.emit(1, f"with m.function({', '.join(args)}) as fn:")
        f = _FnGen(self, fn)
        f.prologue()
        f.body(fn.body, 2, top=True)


def _section_text(s: Section) -> str:
    from .parser.emit import _body

    out: list[str] = [s.raw if s.raw is not None else f".section {s.name}", s.open_trivia, "{"]
    _body(s.body, out)
    out += [s.close_trivia, "}"]
    return "".join(out)


class _FnGen:
    """Code generation for one function body."""

    def __init__(self, gen: _Gen, fn: Function) -> None:
        self.g = gen
        self.fn = fn
        self.sugar = gen.sugar
        self.names: dict[str, str] = {}  # PTX name -> Python name
        self.arrays: dict[str, tuple[str, int, str]] = {}  # '%r' -> (py name, count, type)
        self.singles: dict[str, tuple[str, str]] = {}  # 'temp' -> (py name, type)
        self.labels: dict[str, str] = {}
        self.params: dict[str, str] = {}
        self.renamed: dict[str, str] = {}  # sugar: PTX register -> Python variable
        self.skip: set[int] = set()  # sugar: ids of instructions folded into a helper
        self.replace: dict[int, str] = {}  # sugar: id(inst) -> replacement code
        self.defs: Counter = Counter()
        self.uses: Counter = Counter()

    def prologue(self) -> None:
        fn = self.fn
        if fn.params:
            short = _short(self.g.demangled[fn.name]) if fn.name in self.g.demangled else None
            pnames = []
            for p in fn.params:
                nm = p.name
                if nm.startswith(fn.name + "_"):
                    nm = nm[len(fn.name) + 1:]
                if short:
                    nm = f"{short}_{nm}"
                pnames.append(_pyname(nm, self.names, p.name))
                self.params[p.name] = pnames[-1]
            self.g.emit(2, f"{', '.join(pnames)}{',' if len(pnames) == 1 else ''} = fn.params")
        if fn.returns:
            rn = [_pyname(p.name, self.names, p.name) for p in fn.returns]
            for p, n in zip(fn.returns, rn):
                self.params[p.name] = n
            self.g.emit(2, f"{', '.join(rn)}{',' if len(rn) == 1 else ''} = fn.returns")
        if self.sugar:
            self._plan_sugar()

    # ------------------------------------------------------------------ sugar planning
    def _walk(self, body):
        for st in body:
            if type(st) is Block:
                yield from self._walk(st.body)
            else:
                yield st

    def _block_scoped(self, body: list, nested: bool = False) -> set[str]:
        """PTX names declared inside nested blocks: sugar never renames them (a Python
        variable would outlive the block, or shadow an outer register of the same name)."""
        out: set[str] = set()
        for st in body:
            if type(st) is Block:
                out |= self._block_scoped(st.body, True)
            elif nested and type(st) is RegDecl:
                out.update(name for name, _ in st.names)
        return out

    def _read_before(self, reg: str, st: Instruction) -> bool:
        """True if ``reg`` is read before (or by) ``st``, its defining instruction."""
        return self.first_use.get(reg, len(self.order)) <= self.order[id(st)]

    def _is_scoped(self, reg: str) -> bool:
        m = _REGNUM.match(reg)
        return reg in self.scoped or (m is not None and m.group(1) in self.scoped)

    def _plan_sugar(self) -> None:
        self.scoped = self._block_scoped(self.fn.body)
        insts = [st for st in self._walk(self.fn.body) if type(st) is Instruction]
        # Where each register is first read: a Python variable made at its definition must
        # not be read before it (PTX allows reading a register before any write).
        self.order = {id(st): i for i, st in enumerate(insts)}
        self.first_use: dict[str, int] = {}
        for i, st in enumerate(insts):
            if st.operands:
                self.defs[st.operands[0]] += 1
            for k, op in enumerate(st.operands):
                for tok in re.findall(r"%?[A-Za-z_$][\w$.]*", op):
                    if k:
                        self.uses[tok] += 1
                    if k or tok != op:
                        self.first_use.setdefault(tok, i)
            if st.pred:
                self.uses[st.pred.lstrip("!")] += 1
                self.first_use.setdefault(st.pred.lstrip("!"), i)
        tensor_idx = {p.name: i for i, p in enumerate(self.fn.params)}
        loads: dict[str, tuple[Instruction, str]] = {}
        for st in insts:
            if st.pred or (st.operands and self._is_scoped(st.operands[0])) or (
                    st.operands and self._read_before(st.operands[0], st)):
                continue
            op, ops = st.opcode, st.operands
            if op in ("ld.param.u64", "ld.param.b64") and len(ops) == 2 and self.fn.kind == "entry":
                m = _ADDR.match(ops[1])
                if m and m.group(2) is None and m.group(1) in tensor_idx and self.defs[ops[0]] == 1 \
                        and self.uses[ops[0]] == 1:
                    loads[ops[0]] = (st, m.group(1))
            elif op == "cvta.to.global.u64" and len(ops) == 2 and ops[1] in loads \
                    and self.defs[ops[0]] == 1:
                ld, pname = loads.pop(ops[1])
                var = _pyname(self.params[pname] + "_g", self.names, ops[0] + "#g")
                self.skip.add(id(ld))
                self.replace[id(st)] = f"{var}, = ptx.global_ptrs(T[{tensor_idx[pname]}])"
                self.renamed[ops[0]] = var
            elif op == "mov.u32" and len(ops) == 2 and self.defs[ops[0]] == 1:
                sm = re.match(r"^%(tid|ntid|ctaid|nctaid|clusterid|nclusterid|cluster_ctaid|"
                              r"cluster_nctaid)\.([xyz])$|^%(laneid|warpid|smid|nsmid|clock|"
                              r"lanemask_\w+)$", ops[1])
                if sm:
                    if sm.group(1):
                        call, stem = f"ptx.special.{sm.group(1)}.{sm.group(2)}()", f"{sm.group(1)}_{sm.group(2)}"
                    else:
                        call, stem = f"ptx.special.{sm.group(3)}()", sm.group(3)
                    var = _pyname(stem, self.names, ops[0] + "#s")
                    self.replace[id(st)] = f"{var} = {call}"
                    self.renamed[ops[0]] = var
        self.tensors = bool(any("global_ptrs" in v for v in self.replace.values()))
        if self.tensors:
            self.g.emit(2, "T = fn.tensor_params()")

    # ------------------------------------------------------------------ body
    def body(self, body: list, depth: int, top: bool = False, labels: bool = True) -> None:
        new = [st.name for st in body if type(st) is Label] if labels else []
        if new:
            pys = [_pyname("L_" + n.lstrip("$%").lstrip("L_"), self.labels, n) for n in new]
            for i in range(0, len(new), 6):
                chunk_n, chunk_p = new[i:i + 6], pys[i:i + 6]
                lhs = ", ".join(chunk_p) + ("," if len(chunk_p) == 1 else "")
                self.g.emit(depth, f"{lhs} = fn.labels({', '.join(repr(n) for n in chunk_n)})")
        emitted = False
        k = 0
        while k < len(body):
            st = body[k]
            k += 1
            cls = type(st)
            loop = self._loop(body, k - 1) if self.sugar and cls is Instruction else None
            if loop is not None:
                header, inner, k = loop
                self.g.emit(depth, header)
                n = len(self.g.lines)
                self.body(inner, depth + 1, labels=False)
                if len(self.g.lines) == n:
                    self.g.emit(depth + 1, "pass")
                emitted = True
                continue
            if cls is Instruction:
                if id(st) in self.skip:
                    continue
                self.g.emit(depth, self.instruction(st))
            elif cls is Label:
                self.g.emit(depth, f"ptx.place({self.labels[st.name]})")
            elif cls is RegDecl:
                self.g.emit(depth, self.regdecl(st))
            elif cls is Block:
                self.g.emit(depth, "with fn.block():")
                n = len(self.g.lines)
                # A block's declarations shadow the enclosing ones only until its '}'.
                outer = dict(self.singles), dict(self.arrays)
                self.body(st.body, depth + 1)
                self.singles, self.arrays = outer
                if len(self.g.lines) == n:
                    self.g.emit(depth + 1, "pass")
            else:
                self.g.emit(depth, f"fn.directive({st.text()!r})")
            emitted = True
        if not emitted and top:
            self.g.emit(depth, "pass")

    _LOOP_T = ("u32", "s32", "u64", "s64")

    def _loop(self, body: list, k: int):
        """Sugar: the statements ``ptx.loop`` emits, starting at ``body[k]``, as
        ``(for-header, inner statements, index after the loop)``; None if they are not there.

        The shape: ``mov i, start; setp.ge p, i, stop; @p bra END; TOP: [.pragma "nounroll";]
        body; add i, i, step; setp.lt q, i, stop; @q bra TOP; END:``.
        """
        n = len(body)
        if k + 4 >= n:
            return None
        init, guard, skip, top = body[k:k + 4]
        if type(init) is not Instruction or type(guard) is not Instruction or \
                type(skip) is not Instruction or type(top) is not Label:
            return None
        if init.pred or not init.opcode.startswith(("mov.", "cvt.")) or len(init.operands) != 2:
            return None
        i_reg, start = init.operands
        if self._is_scoped(i_reg) or self._read_before(i_reg, init):
            return None
        gm = re.match(r"^setp\.ge\.([us](?:32|64))$", guard.opcode)
        if not gm or guard.pred or len(guard.operands) != 3 or guard.operands[1] != i_reg:
            return None
        t = gm.group(1)
        p, _, stop = guard.operands
        if skip.opcode != "bra" or skip.pred != p or len(skip.operands) != 1:
            return None
        end = skip.operands[0]
        j = k + 4
        unroll = True
        if j < n and type(body[j]) is Directive and body[j].name == ".pragma" \
                and body[j].args == '"nounroll"':
            unroll = False
            j += 1
        first = j
        while j + 3 < n:
            st = body[j]
            if type(st) is Instruction and st.opcode == f"add.{t}" and not st.pred \
                    and st.operands[:2] == (i_reg, i_reg):
                break
            j += 1
        else:
            return None
        inc, again, back, endl = body[j:j + 4]
        if type(again) is not Instruction or type(back) is not Instruction or type(endl) is not Label:
            return None
        step = inc.operands[2]
        if not _INT.match(step) or int(step) <= 0 or len(step) > 18:
            return None
        if again.opcode != f"setp.lt.{t}" or again.pred or len(again.operands) != 3 or \
                again.operands[1:] != (i_reg, stop):
            return None
        q = again.operands[0]
        if back.opcode != "bra" or back.pred != q or back.operands != (top.name,) or endl.name != end:
            return None
        inner = body[first:j]
        if self.defs[i_reg] != 2 or self.uses[p] != 1 or self.uses[q] != 1 or \
                self.defs[p] != 1 or self.defs[q] != 1:
            return None
        for st in self._walk(inner):
            if type(st) is Instruction and (st.operands[:1] == (i_reg,) or
                                             any(o in (top.name, end) for o in st.operands)):
                return None
        pt = _BY_NAME[t]
        if self.reg_expr(i_reg) is None:
            return None
        start_e = self.operand(start, pt)
        stop_e = self.operand(stop, pt)
        if start_e.startswith(("'", "f'", '"')) or stop_e.startswith(("'", "f'", '"')):
            return None
        var = _pyname("i", self.names, i_reg + "#loop")
        self.renamed[i_reg] = var
        self.g.types.add(t)
        args = f"{start_e}, {stop_e}, {int(step)}, type={t}" + ("" if unroll else ", unroll=False")
        return f"for {var} in ptx.loop({args}):", inner, j + 4

    def regdecl(self, d: RegDecl) -> str:
        t = d.type_name
        ok = t in _BY_NAME and not d.vector and len(d.names) == 1
        if not ok:
            return f"fn.directive({d.text()!r})"
        name, count = d.names[0]
        self.g.types.add(t)
        key = name
        if name in self.names and (name in self.singles or name in self.arrays):
            key = f"{name}#{len(self.names)}"  # redeclared in a nested block: a fresh variable
        py = _pyname(name, self.names, key)
        if count is None:
            self.singles[name] = (py, t)
            return f"{py} = fn.reg({t}, {name!r})"
        self.arrays[name] = (py, count, t)
        if self.sugar and count > 0:
            self.g.need_reg = True
            return f"{py} = reg.array({t}, {count})"
        return f"{py} = fn.reg({t}, {name!r}, {count})"

    # ------------------------------------------------------------------ operands
    def reg_expr(self, s: str) -> str | None:
        if s in self.renamed:
            return self.renamed[s]
        if s in self.singles:
            return self.singles[s][0]
        m = _REGNUM.match(s)
        if m and m.group(1) in self.arrays:
            py, count, _ = self.arrays[m.group(1)]
            n = int(m.group(2))
            if n < count and str(n) == m.group(2):
                return f"{py}[{n}]"
        return None

    def operand(self, s: str, t) -> str:
        r = self.reg_expr(s)
        if r is not None:
            return r
        if s.startswith("!"):
            r = self.reg_expr(s[1:])
            if r is not None and self._is_pred(s[1:]):
                return f"~{r}"
            return self._fallback(s)
        if s in self.labels:
            return self.labels[s]
        if s in self.params:
            return self.params[s]
        if _INT.match(s) and len(s) < 25:
            v = int(s)
            try:
                if imm.encode(v, t, "transpile") == s:
                    return str(v)
            except PyptxError:
                pass
            return self._fallback(s)
        if _FHEX.match(s) and t is not None and t.is_float and t.bits in (32, 64):
            import struct

            if s[1] in "fF" and t.bits == 32:
                v = struct.unpack("<f", struct.pack("<I", int(s[2:], 16)))[0]
            elif s[1] in "dD" and t.bits == 64:
                v = struct.unpack("<d", struct.pack("<Q", int(s[2:], 16)))[0]
            else:
                return self._fallback(s)
            if v == v and abs(v) != float("inf") and imm.encode(v, t, "transpile") == s:
                return repr(v)
            return self._fallback(s)
        m = _ADDR.match(s)
        if m:
            base, off = m.group(1), m.group(2)
            b = self.reg_expr(base) or self.params.get(base)
            if b is None and not base.startswith("%") and base not in self.labels:
                b = repr(base)
            if b is not None:
                if off is None and s == f"[{base}]":
                    return f"ptx.addr({b})"
                if off is not None and off != "0" and s == f"[{base}+{int(off)}]":
                    return f"ptx.addr({b}, {int(off)})"
            return self._fallback(s)
        if s.startswith("{") and s.endswith("}") and "{" not in s[1:]:
            inner = s[1:-1]
            elems = [e.strip() for e in inner.split(",")]
            if all(elems) and "{" + ", ".join(elems) + "}" == s:
                conv = [self.operand(e, t) for e in elems]
                return "[" + ", ".join(conv) + "]"
        return self._fallback(s)

    _TOKEN = re.compile(r"%?[A-Za-z_$][\w$]*")

    def _fallback(self, s: str) -> str:
        """``s`` as a string operand; with sugar (registers renamed) an f-string of the
        registers' names, e.g. ``f"{r[50].name}|{p[6].name}"``."""
        if not self.sugar:
            return repr(s)
        out, last, hit = [], 0, False
        for m in self._TOKEN.finditer(s):
            expr = self.reg_expr(m.group(0))
            if expr is None:
                continue
            out.append(s[last:m.start()].replace("{", "{{").replace("}", "}}"))
            out.append("{" + expr + ".name}")
            last = m.end()
            hit = True
        if not hit:
            return repr(s)
        out.append(s[last:].replace("{", "{{").replace("}", "}}"))
        text = "".join(out)
        return "f" + repr(text) if "\\" not in text else repr(s)

    def _is_pred(self, s: str) -> bool:
        if s in self.singles:
            return self.singles[s][1] == "pred"
        m = _REGNUM.match(s)
        return bool(m and m.group(1) in self.arrays and self.arrays[m.group(1)][2] == "pred")

    def pred(self, p: str) -> str | None:
        neg = p.startswith("!")
        name = p[1:] if neg else p
        r = self.reg_expr(name)
        if r is None or not self._is_pred(name):
            return None
        return f"~{r}" if neg else r

    # ------------------------------------------------------------------ instructions
    def instruction(self, st: Instruction) -> str:
        if id(st) in self.replace:
            return self.replace[id(st)]
        op = st.opcode
        parts = op.split(".")
        t = None
        for part in reversed(parts):
            t = _BY_NAME.get(part)
            if t is not None:
                break
        ops = [self.operand(o, t) for o in st.operands]
        pred = None
        if st.pred:
            pred = self.pred(st.pred)
            if pred is None:
                args = ", ".join([repr(op)] + [repr(o) for o in st.operands] + [f"pred={st.pred!r}"])
                return f"fn.inst({args})"
        if self.sugar:
            helper = self.helper(st, ops, pred)
            if helper:
                return helper
        call_args = ", ".join(ops + ([f"pred={pred}"] if pred else []))
        if parts[0] not in OPCODES:
            args = ", ".join([repr(op)] + ops + ([f"pred={pred}"] if pred else []))
            return f"fn.inst({args})"
        attrs = [_attr(p) for p in parts]
        if all(attrs):
            return f"ptx.inst.{'.'.join(attrs)}({call_args})"
        return f"ptx.inst({op!r})({call_args})"

    def helper(self, st: Instruction, ops: list[str], pred: str | None) -> str | None:
        op, raw = st.opcode, st.operands
        if op in ("bra", "bra.uni") and len(raw) == 1 and raw[0] in self.labels:
            extra = (", uni=True" if op == "bra.uni" else "") + (f", pred={pred}" if pred else "")
            return f"ptx.bra({self.labels[raw[0]]}{extra})"
        if pred:
            return None
        ints = all(_INT.match(o) for o in raw)
        if op == "ret" and not raw:
            return "ptx.ret()"
        if op == "exit" and not raw:
            return "ptx.exit()"
        if op in ("bar.sync", "barrier.sync.aligned") and op == "bar.sync" and 1 <= len(raw) <= 2 and ints:
            b, *n = (int(x) for x in raw)
            if 0 <= b <= 15 and (not n or (n[0] > 0 and n[0] % 32 == 0)):
                return f"ptx.bar_sync({', '.join(raw)})"
        m = re.match(r"^fence\.(sc|acq_rel)\.(cta|cluster|gpu|sys)$", op)
        if m and not raw:
            return f"ptx.fence({m.group(2)!r}" + (", sem='acq_rel')" if m.group(1) == "acq_rel" else ")")
        simple = {
            "wgmma.fence.sync.aligned": "ptx.wgmma.fence()",
            "wgmma.commit_group.sync.aligned": "ptx.wgmma.commit_group()",
            "cp.async.bulk.commit_group": "ptx.tma.commit_group()",
            "fence.mbarrier_init.release.cluster": "ptx.fence_mbarrier_init()",
            "fence.proxy.async": "ptx.fence_proxy_async(None)",
            "fence.proxy.async.shared::cta": "ptx.fence_proxy_async()",
            "fence.proxy.async.shared::cluster": "ptx.fence_proxy_async('shared::cluster')",
            "fence.proxy.async.global": "ptx.fence_proxy_async('global')",
            "barrier.cluster.arrive": "ptx.cluster_arrive()",
            "barrier.cluster.arrive.aligned": "ptx.cluster_arrive(aligned=True)",
            "barrier.cluster.arrive.relaxed": "ptx.cluster_arrive(True)",
            "barrier.cluster.arrive.relaxed.aligned": "ptx.cluster_arrive(True, aligned=True)",
            "barrier.cluster.wait": "ptx.cluster_wait()",
            "barrier.cluster.wait.aligned": "ptx.cluster_wait(aligned=True)",
        }
        if op in simple and not raw:
            return simple[op]
        if len(raw) == 1 and ints:
            n = int(raw[0])
            if op == "wgmma.wait_group.sync.aligned" and n >= 0:
                return f"ptx.wgmma.wait_group({n})"
            if op == "cp.async.bulk.wait_group.read" and n >= 0:
                return f"ptx.tma.wait_group({n})"
            if op == "cp.async.bulk.wait_group" and n >= 0:
                return f"ptx.tma.wait_group({n}, read=False)"
            if op in ("setmaxnreg.inc.sync.aligned.u32", "setmaxnreg.dec.sync.aligned.u32") \
                    and 24 <= n <= 256 and n % 8 == 0:
                return f"ptx.setmaxnreg({n}, inc={op.startswith('setmaxnreg.inc')})"
        return None


def _opsep(mod: Module) -> str:
    """The separator between opcode and operands used by most instructions of ``mod``."""
    seps: Counter = Counter()
    for fn in mod.functions[:20]:
        for i, st in enumerate(fn.instructions()):
            if i > 200:
                break
            if st.operands and st.raw:
                head = st.raw[: len(st.raw) - len(st.raw.lstrip())]
                rest = st.raw[len(head):]
                k = rest.find(st.opcode)
                if k >= 0:
                    after = rest[k + len(st.opcode):]
                    seps[after[: len(after) - len(after.lstrip(" \t"))]] += 1
    return seps.most_common(1)[0][0] if seps else " "


def _tokens(mod: Module) -> list[tuple[str, str]]:
    """The parsed module as ``(trivia, spelling)`` per printed statement, matching
    ``PtxModule.statements()`` one for one."""
    out: list[tuple[str, str]] = []
    add = out.append

    def body(stmts):
        for st in stmts:
            if type(st) is Block:
                add((st.trivia, "{"))
                body(st.body)
                add((st.close_trivia, "}"))
            else:
                add((st.trivia, st.raw if st.raw is not None else st.text()))

    for it in mod.items:
        cls = type(it)
        if cls is Function:
            add((it.trivia, it.raw if it.raw is not None else it.header_text()))
            for d in it.directives:
                add((d.trivia, d.raw if d.raw is not None else d.text()))
            if not it.defined:
                add((it.close_trivia, ";"))
                continue
            add((it.open_trivia, "{"))
            body(it.body)
            add((it.close_trivia, "}"))
        elif cls is Section:
            add((it.trivia, _section_text(it)))
        else:
            add((it.trivia, it.raw if it.raw is not None else it.text()))
    return out


def _render(gen: _Gen, source: str, exact: bool, layout: str) -> str:
    types = sorted(gen.types, key=list(_BY_NAME).index)
    flags = " --exact" if exact else (" --sugar" if gen.sugar else "")
    head = [
        f'"""pyptx code transpiled from {source} by `pyptx transpile{flags}`.',
        "",
        "``build()`` returns the ``PtxModule``; ``python this_file.py`` prints its PTX.",
        '"""',
        "",
        "from pyptx import ptx" + (", reg" if gen.need_reg else ""),
        "from pyptx.module import PtxModule",
    ]
    if types:
        head.append(f"from pyptx.types import {', '.join(types)}")
    head += ["", f"LAYOUT = {layout}", "", "", "def build() -> PtxModule:",
             '    """Build the module statement by statement."""']
    tail = ["", "", 'if __name__ == "__main__":', '    print(build().ptx(), end="")', ""]
    return "\n".join(head + gen.lines + tail)


_MAX_DEPTH = 12


def _depth(body: list) -> int:
    deepest, stack = 0, [(body, 0)]
    while stack:
        b, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((st.body, d + 1) for st in b if type(st) is Block)
    return deepest


def transpile(text: str | Module, *, exact: bool = False, sugar: bool = False,
              source: str = "<ptx>") -> str:
    """Python source of a pyptx module that rebuilds ``text`` (PTX or a parsed ``Module``)."""
    if exact and sugar:
        raise TranspileError("--exact and --sugar cannot be combined: sugar renames registers")
    mod = text if isinstance(text, Module) else parse(text, source)
    for fn in mod.functions:
        if _depth(fn.body) > _MAX_DEPTH:
            raise TranspileError(f"{source}: {fn.name} nests {{ }} blocks deeper than {_MAX_DEPTH} "
                                 "levels, more than Python can nest 'with' statements")
    opsep = _opsep(mod) if exact else " "
    gen = _Gen(mod, sugar, opsep)
    gen.module()
    if not exact:
        return _render(gen, source, False, "None")
    code = _render(gen, source, True, "None")
    ns: dict = {"__name__": "pyptx_transpiled"}
    try:
        exec(compile(code, f"<transpiled {source}>", "exec"), ns)
        canon = ns["build"]().statements()
    except PyptxError as e:
        raise TranspileError(f"{source}: the generated module cannot rebuild this PTX: {e}"
                             ) from None
    except Exception as e:  # a construct the generator mistranslates: say so, do not crash
        raise TranspileError(f"{source}: the generated module cannot rebuild this PTX "
                             f"({type(e).__name__}: {e}); please report it") from e
    want = _tokens(mod)
    if len(canon) != len(want):  # pragma: no cover - the generator emits one call per statement
        raise TranspileError(f"{source}: statement count mismatch ({len(canon)} vs {len(want)})")
    trivia = {i: w[0] for i, (c, w) in enumerate(zip(canon, want)) if c[0] != w[0]}
    spell = {i: w[1] for i, (c, w) in enumerate(zip(canon, want)) if c[1] != w[1]}
    layout = {"trivia": trivia, "spell": spell, "trailing": mod.trailing}
    return _render(gen, source, True, _layout_repr(layout))


def _layout_repr(layout: dict) -> str:
    def block(d: dict) -> str:
        if not d:
            return "{}"
        return "{\n" + "".join(f"        {k}: {v!r},\n" for k, v in d.items()) + "    }"

    return ("{\n    'trivia': " + block(layout["trivia"]) + ",\n    'spell': " + block(layout["spell"])
            + f",\n    'trailing': {layout['trailing']!r},\n}}")


def main(argv: list[str] | None = None) -> int:
    """``pyptx transpile kernel.ptx [-o out.py] [--exact | --sugar] [--check]``."""
    ap = argparse.ArgumentParser(prog="pyptx transpile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The ``transpile`` subcommand's arguments (shared with ``pyptx.cli``)."""
    ap.add_argument("input", help="a PTX file ('-' reads stdin)")
    ap.add_argument("-o", "--output", help="write the Python module here (default: stdout)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--exact", action="store_true", help="re-emit the input byte for byte")
    g.add_argument("--sugar", action="store_true",
                   help="use loops helpers, global_ptrs, reg.array, named Hopper helpers, demangled names")
    ap.add_argument("--check", action="store_true",
                    help="run the generated module and compare its PTX with the input (exact) "
                         "or re-parse it (otherwise)")


def run(args: argparse.Namespace) -> int:
    """Execute a parsed ``transpile`` command line."""
    try:
        if args.input == "-":
            text, source = sys.stdin.read(), "<stdin>"
        else:
            if os.path.isdir(args.input):
                raise TranspileError(f"{args.input} is a directory; expected a PTX file")
            source = Path(args.input).name
            with open(args.input, "rb") as f:
                data = f.read()
            text = decode_ptx(data, source)
        code = transpile(text, exact=args.exact, sugar=args.sugar, source=source)
        if args.check:
            ns: dict = {"__name__": "pyptx_transpiled"}
            exec(compile(code, "<transpiled>", "exec"), ns)
            out = ns["build"]().ptx()
            if args.exact and out != text:
                print("pyptx transpile: --check: output differs from the input", file=sys.stderr)
                return 1
            parse(out, "<re-emitted>")
        if args.output:
            from .cli import write_output

            write_output(args.output, code)
        else:
            sys.stdout.write(code)
    except (ParseError, PyptxError) as e:
        print(f"pyptx transpile: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"pyptx transpile: {args.input}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
