"""The PTX instruction table ``ptx.inst`` checks every call against, written from the PTX ISA.

One ``Row`` per opcode (or opcode prefix such as ``cp.async.bulk``) records:

- ``ops``: the operands in order, each ``role[:type][?]``. Roles: ``d`` destination
  register, ``s`` source (register or immediate), ``r`` source register, ``a`` address
  ``[...]``, ``p`` predicate source (``p`` or ``~p``), ``q`` predicate destination,
  ``i`` immediate, ``l`` label or symbol, ``x`` any operand (forms too varied to check
  here). ``?`` marks an optional trailing operand, ``*`` any number of further ``x``.
  Types: ``T`` the instruction's type suffix, ``T0``/``T1`` the first/second of two,
  ``W`` twice the width of ``T`` (``mul.wide``), ``D`` ``W`` with ``.wide`` else ``T``,
  or a fixed type (``u32``, ``b64``). A ``v`` after the role (``dv``) takes a vector
  ``{...}`` of as many registers as the ``.v2``/``.v4``/``.x4`` modifier says.
- ``types``: the allowed type suffixes and ``ntypes`` how many the spelling carries.
- ``mods``: the modifiers, space separated: ``name`` optional, ``[a|b]`` at most one
  of, ``<a|b>`` exactly one of; ``@t1,t2`` restricts a modifier (or group) to those types
  (``@+mod`` to spellings that also carry ``.mod``). ``pattern`` is a regex for
  parameterised modifiers (``m64n128k16``).
- ``spaces``: the state spaces the spelling may name (a subset of ``mods``).
- ``sm`` / ``ptx``: the minimum arch and PTX ISA version; ``arch_a`` needs an
  arch-specific target (``sm_90a``); ``sm_max`` the newest arch that has it; ``bump``
  raises the minimum arch for one type or modifier.

Register types are checked against the instruction's types by the PTX ISA type rules
(``compatible``): ``.bN`` instructions take any ``N``-bit register, ``.uN``/``.sN``
take ``b``/``u``/``s`` registers of ``N`` bits, ``.fN`` take ``f`` or ``b`` registers
of ``N`` bits; ``ld``, ``st`` and ``cvt`` also take wider integer registers (the
relaxed rules of "Operand Size Exceeding Instruction-Type Size").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ._types import EXTRA_BITS, TYPE_INFO  # noqa: F401  (part of the table)

INT = "u16 u32 u64 s16 s32 s64"
INT32 = "u32 s32 u64 s64"
BITS = "b16 b32 b64"
FLT = "f32 f64"
HALF = "f16 f16x2 bf16 bf16x2"
LDST = "b8 b16 b32 b64 b128 u8 u16 u32 u64 s8 s16 s32 s64 f16 f16x2 f32 f64"
CVT = ("u8 u16 u32 u64 s8 s16 s32 s64 f16 f32 f64 bf16 tf32 f16x2 bf16x2 e4m3x2 e5m2x2 "
       "e2m1x2 e2m3x2 e3m2x2 ue8m0x2 b16 b32")
RND = "rn|rz|rm|rp"
SCOPE = "[cta|cluster|gpu|sys]"
CACHE_HINTS = ("L1::evict_normal L1::evict_unchanged L1::evict_first L1::evict_last "
               "L1::no_allocate L2::evict_first L2::evict_last L2::evict_normal L2::64B "
               "L2::128B L2::256B L2::cache_hint")



@dataclass
class Row:
    """One opcode of the instruction table (see the module docstring for the fields)."""

    op: str
    ops: str = ""
    types: str = ""
    mods: str = ""
    ntypes: tuple[int, ...] = (1,)
    spaces: str = ""
    sm: int = 20
    ptx: str = "2.0"
    arch_a: bool = False
    sm_max: int = 0
    """The newest arch that has the instruction (0: every newer arch): ``wgmma`` is sm_90a only."""
    bump: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    """Modifiers, types or ``"dtype.atype"`` pairs that make optional operands required:
    the least operand count with them (``setp.and`` takes its fourth, ``atom.cas`` its
    fourth, ``cvt.rn.bf16x2.f32`` two sources)."""
    most: dict[str, int] = field(default_factory=dict)
    """Modifiers that bound the operand count of an ``x*`` row: the most operands a spelling
    with them takes (``wgmma.fence`` none, ``wgmma.wait_group`` one)."""
    imms: dict[int, range | tuple[int, ...]] = field(default_factory=dict)
    """Immediates ptxas limits, by operand position: the ints operand ``k`` may be (a
    barrier id 0..15, a thread count that is a multiple of 32)."""
    pattern: str = ""
    ok: tuple[str, ...] = ()
    sample: dict[str, str | tuple[str, ...]] = field(default_factory=dict)
    """Operands for the generated accepted call of an ``ok`` spelling whose roles are ``x``:
    space-separated ``r:TYPE``, ``v:TYPE:N``, ``g`` (global address), ``sh`` (shared
    address), ``i:VALUE``, ``l`` (label) or ``t:TEXT``; a tuple of them for one call each."""

    def __post_init__(self) -> None:
        self.type_set = frozenset(self.types.split())
        self.allowed: dict[str, frozenset[str] | None] = {}   # modifier -> types it needs
        self.requires: dict[str, str] = {}                     # modifier -> another modifier
        self.groups: list[tuple[frozenset[str], bool, frozenset[str] | None]] = []
        for tok in self.mods.split():
            body, _, cond = tok.partition("@")
            conds = cond.split(",") if cond else []
            need_mod = [c[1:] for c in conds if c.startswith("+")]
            tys = frozenset(t for c in conds if not c.startswith("+") for t in _expand(c))
            if body[0] in "[<":
                names = frozenset(body[1:-1].split("|"))
                self.groups.append((names, body[0] == "<", tys or None))
            else:
                names = frozenset([body])
            for n in names:
                self.allowed[n] = tys or None
                if need_mod:
                    self.requires[n] = need_mod[0]
        self.regex = re.compile(self.pattern) if self.pattern else None
        self.roles = self.ops.split()


_CLASSES = {"INT": INT, "INT32": INT32, "BITS": BITS, "FLT": FLT, "HALF": HALF, "LDST": LDST}


def _expand(name: str) -> list[str]:
    return _CLASSES[name].split() if name in _CLASSES else [name]


_VIDEO_OK = {v: f"{v}.s32.s32.s32" for v in "vabsdiff vadd vmax vmin vsub".split()}
_VIDEO_OK.update({v: f"{v}.s32.s32.s32.add" for v in
                  "vabsdiff2 vabsdiff4 vadd2 vadd4 vmax2 vmax4 vmin2 vmin4 vsub2 vsub4".split()})
_VIDEO_OK.update({"vavrg2": "vavrg2.s32.s32.s32.add", "vavrg4": "vavrg4.s32.s32.s32.add",
                  "vmad": "vmad.s32.s32.s32", "vset": "vset.s32.s32.eq",
                  "vset2": "vset2.s32.s32.eq.add", "vset4": "vset4.s32.s32.eq.add",
                  "vshl": "vshl.u32.u32.u32.clamp", "vshr": "vshr.u32.u32.u32.clamp"})
_VIDEO_SAMPLE = {v: "r:s32 r:s32 r:s32" + (" r:s32" if (v[-1] in "24" or v == "vmad") else "")
                 for v in _VIDEO_OK}
_VIDEO_SAMPLE.update({"vshl": "r:u32 r:u32 r:u32", "vshr": "r:u32 r:u32 r:u32"})

#: bar/barrier operands: the barrier id (0..15) and the thread count (a multiple of the warp
#: size, at most a CTA).
_BAR_IMMS = {0: range(16), 1: range(32, 1025, 32)}

_ROWS: list[Row] = [
    # ---------------------------------------------------------------- integer and float arithmetic
    Row("add", "d:T s:T s:T", f"{INT} {FLT} {HALF} u16x2 s16x2",
        f"[{RND}]@FLT,HALF ftz@f32,f16,f16x2 sat@s32,f32,f16,f16x2 cc@INT32",
        bump={"bf16": 90, "bf16x2": 90, "f16": 53, "f16x2": 53, "u16x2": 90, "s16x2": 90},
        ok=("add.u32", "add.s64", "add.rn.f32", "add.sat.s32", "add.cc.u32", "add.f16x2",
            "add.bf16")),
    Row("sub", "d:T s:T s:T", f"{INT} {FLT} {HALF}",
        f"[{RND}]@FLT,HALF ftz@f32,f16,f16x2 sat@s32,f32,f16,f16x2 cc@INT32",
        bump={"bf16": 90, "bf16x2": 90, "f16": 53, "f16x2": 53}, ok=("sub.s32", "sub.f64")),
    Row("addc", "d:T s:T s:T", INT32, "cc", ok=("addc.cc.u32", "addc.u64")),
    Row("subc", "d:T s:T s:T", INT32, "cc", ok=("subc.cc.s32",)),
    Row("mul", "d:D s:T s:T", f"{INT} {FLT} {HALF}",
        f"<lo|hi|wide>@INT [{RND}]@FLT,HALF ftz@f32,f16,f16x2 sat@f32,f16,f16x2",
        bump={"bf16": 90, "bf16x2": 90, "f16": 53, "f16x2": 53},
        ok=("mul.lo.u32", "mul.wide.s32", "mul.hi.u64", "mul.f32", "mul.rn.f16")),
    Row("mad", "d:D s:T s:T s:D", f"{INT} {FLT}",
        f"<lo|hi|wide>@INT sat@s32,f32 cc@INT32 <{RND}>@FLT ftz@f32",
        ok=("mad.lo.s32", "mad.wide.u32", "mad.rn.f32", "mad.hi.cc.u32")),
    Row("madc", "d:T s:T s:T s:T", INT32, "<lo|hi> cc", ok=("madc.lo.cc.u32",)),
    Row("mul24", "d:T s:T s:T", "u32 s32", "<lo|hi>", ok=("mul24.lo.u32",)),
    Row("mad24", "d:T s:T s:T s:T", "u32 s32", "<lo|hi> sat@s32", ok=("mad24.lo.s32",)),
    Row("sad", "d:T s:T s:T s:T", INT, ok=("sad.u32",)),
    Row("div", "d:T s:T s:T", f"{INT} {FLT}", f"<approx|full|{RND}>@FLT ftz@f32",
        ok=("div.u32", "div.s64", "div.rn.f32", "div.approx.f32", "div.full.ftz.f32")),
    Row("rem", "d:T s:T s:T", INT, ok=("rem.s32", "rem.u64")),
    Row("abs", "d:T s:T", f"s16 s32 s64 {FLT} {HALF}", "ftz@f32,f16,f16x2 relu",
        bump={"bf16": 80, "bf16x2": 80, "f16": 65, "f16x2": 65}, ok=("abs.s32", "abs.f32")),
    Row("neg", "d:T s:T", f"s16 s32 s64 {FLT} {HALF}", "ftz@f32,f16,f16x2",
        bump={"bf16": 80, "bf16x2": 80, "f16": 53, "f16x2": 53}, ok=("neg.s32", "neg.f64")),
    Row("min", "d:T s:T s:T s:T?", f"{INT} {FLT} {HALF} u16x2 s16x2",
        "ftz@f32,f16,f16x2 NaN xorsign relu abs",
        bump={"bf16": 80, "bf16x2": 80, "f16": 80, "f16x2": 80, "u16x2": 90, "s16x2": 90},
        ok=("min.u32", "min.s64", "min.f32", "min.NaN.f32")),
    Row("max", "d:T s:T s:T s:T?", f"{INT} {FLT} {HALF} u16x2 s16x2",
        "ftz@f32,f16,f16x2 NaN xorsign relu abs",
        bump={"bf16": 80, "bf16x2": 80, "f16": 80, "f16x2": 80, "u16x2": 90, "s16x2": 90},
        ok=("max.s32", "max.ftz.f32", "max.u16")),
    Row("popc", "d:u32 s:T", "b32 b64", ok=("popc.b32", "popc.b64")),
    Row("clz", "d:u32 s:T", "b32 b64", ok=("clz.b32",)),
    Row("bfind", "d:u32 s:T", "u32 u64 s32 s64", "shiftamt", ok=("bfind.u32", "bfind.shiftamt.s64")),
    Row("fns", "d:b32 s:b32 s:u32 s:s32", "b32", sm=30, ptx="6.0", ok=("fns.b32",)),
    Row("brev", "d:T s:T", "b32 b64", ok=("brev.b32",)),
    Row("bfe", "d:T s:T s:u32 s:u32", "u32 u64 s32 s64", ok=("bfe.u32", "bfe.s64")),
    Row("bfi", "d:T s:T s:T s:u32 s:u32", "b32 b64", ok=("bfi.b32",)),
    Row("szext", "d:T s:T s:u32", "u32 s32", "<clamp|wrap>", sm=70, ptx="7.6",
        ok=("szext.wrap.u32",)),
    Row("bmsk", "d:b32 s:u32 s:u32", "b32", "<clamp|wrap>", sm=70, ptx="7.6",
        ok=("bmsk.clamp.b32",)),
    Row("dp4a", "d:u32 s:b32 s:b32 s:u32", "u32 s32", ntypes=(2,), sm=61, ptx="5.0",
        ok=("dp4a.u32.u32",)),
    Row("dp2a", "d:u32 s:b32 s:b32 s:u32", "u32 s32", "<lo|hi>", ntypes=(2,), sm=61, ptx="5.0",
        ok=("dp2a.lo.s32.s32",)),
    Row("copysign", "d:T s:T s:T", FLT, ok=("copysign.f32",)),
    Row("testp", "q s:T", FLT, "<finite|infinite|number|notanumber|normal|subnormal>",
        ok=("testp.finite.f32",)),
    Row("rcp", "d:T s:T", FLT, f"<approx|{RND}> ftz", ok=("rcp.rn.f32", "rcp.approx.ftz.f32")),
    Row("sqrt", "d:T s:T", FLT, f"<approx|{RND}> ftz@f32", ok=("sqrt.rn.f64", "sqrt.approx.f32")),
    Row("rsqrt", "d:T s:T", FLT, "<approx> ftz", ok=("rsqrt.approx.f32",)),
    Row("sin", "d:T s:T", "f32", "<approx> ftz", ok=("sin.approx.f32",)),
    Row("cos", "d:T s:T", "f32", "<approx> ftz", ok=("cos.approx.ftz.f32",)),
    Row("lg2", "d:T s:T", "f32", "<approx> ftz", ok=("lg2.approx.f32",)),
    Row("ex2", "d:T s:T", f"f32 {HALF}", "<approx> ftz",
        bump={"f16": 75, "f16x2": 75, "bf16": 90, "bf16x2": 90}, ok=("ex2.approx.ftz.f32",)),
    Row("tanh", "d:T s:T", f"f32 {HALF}", "<approx>", sm=75, ptx="7.0",
        bump={"bf16": 90, "bf16x2": 90}, ok=("tanh.approx.f32",)),
    Row("fma", "d:T s:T s:T s:T", f"{FLT} {HALF}",
        f"<{RND}> ftz@f32,f16,f16x2 sat@f32,f16,f16x2 relu@HALF oob@HALF",
        bump={"bf16": 80, "bf16x2": 80, "f16": 53, "f16x2": 53},
        ok=("fma.rn.f32", "fma.rz.f64", "fma.rn.f16", "fma.rn.bf16x2")),
    # ---------------------------------------------------------------- comparison and selection
    Row("set", "d:T0 s:T1 s:T1 p?", f"u32 s32 f32 {BITS} {INT} {FLT}", ntypes=(2,),
        mods="<eq|ne|lt|le|gt|ge|lo|ls|hi|hs|equ|neu|ltu|leu|gtu|geu|num|nan> [and|or|xor] ftz",
        ok=("set.lt.u32.s32",)),
    Row("setp", "q s:T s:T p?", f"{BITS} {INT} {FLT} {HALF}",
        "<eq|ne|lt|le|gt|ge|lo|ls|hi|hs|equ|neu|ltu|leu|gtu|geu|num|nan> [and|or|xor] ftz",
        bump={"bf16": 90, "bf16x2": 90, "f16": 53, "f16x2": 53},
        counts={"and": 4, "or": 4, "xor": 4},
        ok=("setp.lt.s32", "setp.ne.u64", "setp.gt.f32", "setp.eq.and.u32", "setp.ne.b32")),
    Row("selp", "d:T s:T s:T p", f"{BITS} {INT} {FLT}", ok=("selp.u32", "selp.f32", "selp.b64")),
    Row("slct", "d:T0 s:T0 s:T0 s:T1", f"{BITS} {INT} {FLT}", "ftz", ntypes=(2,),
        ok=("slct.u32.s32",)),
    # ---------------------------------------------------------------- logic and shifts
    Row("and", "d:T s:T s:T", f"pred {BITS}", ok=("and.b32", "and.pred")),
    Row("or", "d:T s:T s:T", f"pred {BITS}", ok=("or.b64", "or.pred")),
    Row("xor", "d:T s:T s:T", f"pred {BITS}", ok=("xor.b32",)),
    Row("not", "d:T s:T", f"pred {BITS}", ok=("not.b32", "not.pred")),
    Row("cnot", "d:T s:T", BITS, ok=("cnot.b32",)),
    Row("lop3", "d:T s:T s:T s:T i", "b32 b64", ok=("lop3.b32",)),
    Row("shf", "d:b32 s:b32 s:b32 h:u32", "b32", "<l|r> <clamp|wrap>", sm=32, ptx="3.1",
        ok=("shf.l.wrap.b32",)),
    Row("shl", "d:T s:T h:u32", BITS, ok=("shl.b32", "shl.b64")),
    Row("shr", "d:T s:T h:u32", f"{BITS} {INT}", ok=("shr.u32", "shr.s64", "shr.b16")),
    Row("prmt", "d:b32 s:b32 s:b32 s:b32", "b32", "[f4e|b4e|rc8|ecl|ecr|rc16]",
        ok=("prmt.b32", "prmt.b32.f4e")),
    # ---------------------------------------------------------------- data movement and conversion
    Row("mov", "dv:T sv:T", f"pred {BITS} b128 {INT} f16 f32 f64 u8 s8", "[v2|v4]",
        bump={"b128": 90}, ok=("mov.u32", "mov.b64", "mov.f32", "mov.pred", "mov.b16")),
    Row("cvt", "d:T0 s:T1 s:T1?", CVT, ntypes=(2,),
        mods=("[rn|rz|rm|rp|rni|rzi|rmi|rpi|rna|rs] ftz sat satfinite relu"),
        counts={f"{d}.f32": 3 for d in "f16x2 bf16x2 e4m3x2 e5m2x2 e2m1x2 e2m3x2 e3m2x2".split()},
        ok=("cvt.rn.f32.s32", "cvt.rzi.s32.f32", "cvt.u64.u32", "cvt.f32.f16",
            "cvt.rn.bf16x2.f32", "cvt.s32.s8")),
    Row("cvta", "d:T s:T", "u32 u64", "to <global|shared|local|const|param|shared::cta|"
        "shared::cluster>", spaces="global shared local const param shared::cta shared::cluster",
        ok=("cvta.to.global.u64", "cvta.shared.u64")),
    Row("isspacep", "q s:u64", "",
        "<global|shared|local|const|param|shared::cta|shared::cluster>", ntypes=(0,),
        spaces="global shared local const param shared::cta shared::cluster",
        ok=("isspacep.global",)),
    Row("ld", "dv:T a x?", LDST,
        f"[global|shared|shared::cta|shared::cluster|local|param|param::entry|param::func|const] "
        f"nc@+global [weak|relaxed|acquire|volatile|mmio] {SCOPE} [v2|v4|v8] "
        f"[ca|cg|cs|lu|cv] {CACHE_HINTS} unified",
        spaces="global shared shared::cta shared::cluster local param param::entry param::func "
        "const", bump={"v8": 100, "b128": 90},
        ok=("ld.global.u32", "ld.global.nc.v4.f32", "ld.shared.b64", "ld.param.u64",
            "ld.global.v2.f32", "ld.global.u8", "ld.acquire.gpu.global.u32")),
    Row("ldu", "dv:T a", LDST, "global [v2|v4]", spaces="global", ok=("ldu.global.f32",)),
    Row("st", "a sv:T x?", LDST,
        f"[global|shared|shared::cta|shared::cluster|local|param] "
        f"[weak|relaxed|release|volatile|mmio] {SCOPE} [v2|v4|v8] [wb|cg|cs|wt] {CACHE_HINTS}",
        spaces="global shared shared::cta shared::cluster local param",
        bump={"v8": 100, "b128": 90},
        ok=("st.global.f32", "st.shared.v4.b32", "st.global.v2.u32", "st.global.u8",
            "st.release.gpu.global.u32")),
    Row("st.async", "a sv:T a", "b32 b64 u32 s32 f32 u64 s64 f64",
        "weak shared::cluster mbarrier::complete_tx::bytes [v2|v4]", spaces="shared::cluster",
        sm=90, ptx="8.1",
        ok=("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32",)),
    Row("red.async", "a s:T a", "u32 s32 u64 b32 b64",
        "relaxed cluster shared::cluster mbarrier::complete_tx::bytes "
        "<add|min|max|inc|dec|and|or|xor>", spaces="shared::cluster", sm=90, ptx="8.1",
        ok=("red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.add.u32",)),
    Row("atom", "d:T a s:T s:T? x?", f"b32 b64 b128 u32 u64 s32 s64 {FLT} {HALF}",
        f"[global|shared|shared::cta|shared::cluster] [relaxed|acquire|release|acq_rel|sc] "
        f"{SCOPE} <and|or|xor|cas|exch|add|inc|dec|min|max> noftz [v2|v4|v8] L2::cache_hint",
        spaces="global shared shared::cta shared::cluster",
        bump={"bf16": 90, "bf16x2": 90, "f16": 70, "f16x2": 60, "f64": 60, "b128": 90},
        counts={"cas": 4}, ok=("atom.global.add.u32", "atom.shared.cas.b32", "atom.global.add.f32",
            "atom.acq_rel.gpu.global.exch.b64", "atom.global.max.s32")),
    Row("red", "a sv:T x?", f"b32 b64 u32 u64 s32 s64 {FLT} {HALF}",
        f"[global|shared|shared::cta|shared::cluster] [relaxed|release] {SCOPE} "
        f"<and|or|xor|add|inc|dec|min|max> noftz [v2|v4|v8] L2::cache_hint",
        spaces="global shared shared::cta shared::cluster",
        bump={"bf16": 90, "bf16x2": 90, "f16": 70, "f16x2": 60, "f64": 60, "v2": 90, "v4": 90},
        ok=("red.global.add.u32", "red.release.gpu.global.add.u32", "red.shared.min.s32")),
    Row("prefetch", "a", "", "[global|local|param|const|shared|shared::cta|shared::cluster] "
        "<L1|L2|L2::evict_last|L2::evict_normal|tensormap>", ntypes=(0,),
        spaces="global local param const shared shared::cta shared::cluster", ok=("prefetch.global.L2", "prefetch.L1")),
    Row("prefetchu", "a", "", "<L1>", ntypes=(0,), ok=("prefetchu.L1",)),
    Row("applypriority", "a i", "", "global <L2::evict_normal>", ntypes=(0,), spaces="global",
        sm=80, ptx="7.4", ok=("applypriority.global.L2::evict_normal",),
        sample={"applypriority.global.L2::evict_normal": "g i:128"}),
    Row("discard", "a i", "", "global <L2>", ntypes=(0,), spaces="global", sm=80, ptx="7.4",
        ok=("discard.global.L2",), sample={"discard.global.L2": "g i:128"}),
    Row("createpolicy", "d:b64 x x?", "b64",
        "<fractional|range|cvt> global L2::evict_last L2::evict_normal L2::evict_first "
        "L2::evict_unchanged L2", sm=80, ptx="7.4",
        ok=("createpolicy.fractional.L2::evict_last.b64",), sample={
            "createpolicy.fractional.L2::evict_last.b64": "r:b64 t:0f3F800000"}),
    Row("alloca", "d:T s:T i?", "u32 u64", "local", sm=52, ptx="7.3", ok=("alloca.u64",)),
    Row("stacksave", "d:T", "u32 u64", sm=52, ptx="7.3", ok=("stacksave.u64",)),
    Row("stackrestore", "r:T", "u32 u64", sm=52, ptx="7.3", ok=("stackrestore.u64",)),
    # ---------------------------------------------------------------- matrix load and store
    Row("ldmatrix", "dv:b32 a", "b16 b8", "sync aligned <m8n8|m16n16|m8n16> <x1|x2|x4> trans "
        "shared shared::cta", spaces="shared shared::cta", sm=75, ptx="6.5",
        pattern=r"^(b8x16\.b[46]x16_p(32|64)|b[46]x16_p(32|64))$",
        ok=("ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16")),
    Row("stmatrix", "a sv:b32", "b16 b8", "sync aligned <m8n8|m16n8> <x1|x2|x4> trans "
        "shared shared::cta", spaces="shared shared::cta", sm=90, ptx="7.8",
        ok=("stmatrix.sync.aligned.m8n8.x4.shared.b16",)),
    Row("movmatrix", "d:b32 s:b32", "b16", "sync aligned m8n8 trans", sm=75, ptx="7.8",
        ok=("movmatrix.sync.aligned.m8n8.trans.b16",)),
    # ---------------------------------------------------------------- control flow
    Row("bra", "l", "", "uni", ntypes=(0,), ok=("bra", "bra.uni")),
    Row("brx", "r:u32 l", "", "<idx> uni", ntypes=(0,), sm=30, ptx="6.0", ok=("brx.idx",),
        sample={"brx.idx": "r:u32 t:bt_table"}),
    # call{.uni} [(ret),] func|fptr[, (params)][, flist|fproto]: the generated accepted calls
    # run against the callees every generated test module declares (tests/test_isa_table.py)
    Row("call", "x x? x? x?", "", "uni", ntypes=(0,), ok=("call", "call.uni"),
        sample={"call": ("t:(call_ret) t:isa_callee t:(call_arg)",
                         "t:(call_ret) t:{rd} t:(call_arg) t:isa_proto"),
                "call.uni": "t:isa_nop"}),
    Row("ret", "", "", "uni", ntypes=(0,), ok=("ret",)),
    Row("exit", "", "", "", ntypes=(0,), ok=("exit",)),
    Row("trap", "", "", "", ntypes=(0,), ok=("trap",)),
    Row("brkpt", "", "", "", ntypes=(0,), sm=11, ok=("brkpt",)),
    Row("pmevent", "i", "", "mask", ntypes=(0,), ok=("pmevent",), sample={"pmevent": "i:1"}),
    Row("nanosleep", "s:u32", "u32", sm=70, ptx="6.3", ok=("nanosleep.u32",)),
    # ---------------------------------------------------------------- barriers and fences
    Row("bar.sync", "s:u32 s:u32?", "", "cta aligned", ntypes=(0,), imms=_BAR_IMMS, ok=("bar.sync",),
        sample={"bar.sync": "i:0"}),
    Row("bar.arrive", "s:u32 s:u32", "", "cta aligned", ntypes=(0,), imms=_BAR_IMMS, ok=("bar.arrive",),
        sample={"bar.arrive": "i:1 i:128"}),
    Row("bar.red", "d:T s:u32 x x?", "u32 pred", "cta aligned <popc|and|or>", ntypes=(1,),
        imms={1: _BAR_IMMS[0]},
        ok=("bar.red.popc.u32",), sample={"bar.red.popc.u32": "r:u32 i:0 t:{p}"}),
    Row("bar.warp.sync", "s:b32", "", "", ntypes=(0,), sm=30, ptx="6.0",
        ok=("bar.warp.sync",), sample={"bar.warp.sync": "i:4294967295"}),
    Row("barrier.sync", "s:u32 s:u32?", "", "aligned", ntypes=(0,), sm=30, ptx="6.0",
        imms=_BAR_IMMS,
        ok=("barrier.sync.aligned",), sample={"barrier.sync.aligned": "i:1"}),
    Row("barrier.arrive", "s:u32 s:u32", "", "aligned", ntypes=(0,), sm=30, ptx="6.0",
        imms=_BAR_IMMS,
        ok=("barrier.arrive.aligned",), sample={"barrier.arrive.aligned": "i:1 i:64"}),
    Row("barrier.red", "d:T s:u32 x x?", "u32 pred", "aligned <popc|and|or>",
        sm=30, ptx="6.0", imms={1: _BAR_IMMS[0]}, ok=("barrier.red.popc.aligned.u32",),
        sample={"barrier.red.popc.aligned.u32": "r:u32 i:0 t:{p}"}),
    Row("barrier.cluster", "", "", "<arrive|wait> relaxed@+arrive aligned acquire release",
        ntypes=(0,), sm=90, ptx="7.8",
        ok=("barrier.cluster.arrive", "barrier.cluster.wait.aligned")),
    Row("membar", "", "", "<cta|gl|sys>", ntypes=(0,), ok=("membar.gl", "membar.cta")),
    Row("fence", "x? x?", "",
        "[sc|acq_rel|acquire|release|relaxed] [cta|cluster|gpu|sys] proxy "
        "mbarrier_init async alias tensormap::generic global shared::cta shared::cluster "
        "async.global async.shared::cta async.shared::cluster sync_restrict::shared::cta "
        "sync_restrict::shared::cluster proxy::generic op_restrict",
        ntypes=(0,), sm=70, ptx="6.0",
        bump={"proxy": 90, "mbarrier_init": 90, "cluster": 90, "async": 90},
        ok=("fence.sc.gpu", "fence.acq_rel.cta", "fence.proxy.async",
            "fence.mbarrier_init.release.cluster")),
    Row("griddepcontrol", "", "", "<launch_dependents|wait>", ntypes=(0,), sm=90, ptx="7.8",
        ok=("griddepcontrol.wait", "griddepcontrol.launch_dependents")),
    Row("setmaxnreg", "i", "u32", "sync aligned <inc|dec>", sm=90, ptx="8.0", arch_a=True,
        imms={0: range(24, 257, 8)},
        ok=("setmaxnreg.inc.sync.aligned.u32",),
        sample={"setmaxnreg.inc.sync.aligned.u32": "i:232"}),
    # ---------------------------------------------------------------- warp-level
    Row("activemask", "d:b32", "b32", sm=30, ptx="6.2", ok=("activemask.b32",)),
    Row("vote", "d:T p s:b32?", "pred b32", "sync <all|any|uni|ballot> ballot@b32",
        sm=30, ptx="6.0", counts={"sync": 3}, ok=("vote.sync.any.pred", "vote.sync.ballot.b32")),
    Row("shfl", "d:b32 s:b32 s:u32 s:u32 s:b32?", "b32", "sync <up|down|bfly|idx>",
        sm=30, ptx="6.0", counts={"sync": 5}, ok=("shfl.sync.bfly.b32", "shfl.sync.idx.b32")),
    Row("match", "d:b32 s:T s:b32", "b32 b64", "<any|all> sync", sm=70, ptx="6.0",
        ok=("match.any.sync.b32",)),
    Row("redux", "d:T s:T s:b32", "u32 s32 b32 f32", "sync <add|min|max|and|or|xor> abs NaN",
        sm=80, ptx="7.0", bump={"f32": 100}, ok=("redux.sync.add.u32", "redux.sync.or.b32")),
    Row("elect", "x s:b32", "", "sync", ntypes=(0,), sm=90, ptx="8.0", ok=("elect.sync",),
        sample={"elect.sync": "t:_|{p} i:4294967295"}),
    Row("getctarank", "d:u32 s:T", "u32 u64", "shared::cluster", spaces="shared::cluster",
        sm=90, ptx="7.8", ok=("getctarank.u32", "getctarank.shared::cluster.u32")),
    Row("mapa", "d:T x s:u32", "u32 u64", "shared::cluster", spaces="shared::cluster",
        sm=90, ptx="7.8", ok=("mapa.u32", "mapa.shared::cluster.u32"),
        sample={"mapa.u32": "r:u32 r:u32 r:u32", "mapa.shared::cluster.u32": "r:u32 r:u32 i:1"}),
    # ---------------------------------------------------------------- asynchronous copies
    Row("cp.async", "a a i x? x?", "", "<ca|cg> shared shared::cta global "
        "L2::64B L2::128B L2::256B L2::cache_hint", ntypes=(0,),
        spaces="shared shared::cta global", sm=80, ptx="7.0", imms={2: (4, 8, 16)},
        ok=("cp.async.ca.shared.global",), sample={"cp.async.ca.shared.global": "sh g i:16"}),
    Row("cp.async.commit_group", "", "", "", ntypes=(0,), sm=80, ptx="7.0",
        ok=("cp.async.commit_group",)),
    Row("cp.async.wait_group", "i", "", "", ntypes=(0,), sm=80, ptx="7.0",
        ok=("cp.async.wait_group",), sample={"cp.async.wait_group": "i:0"}),
    Row("cp.async.wait_all", "", "", "", ntypes=(0,), sm=80, ptx="7.0",
        ok=("cp.async.wait_all",)),
    Row("cp.async.mbarrier", "a", "", "arrive noinc shared shared::cta b64", ntypes=(0,),
        sm=80, ptx="7.0", ok=("cp.async.mbarrier.arrive.shared.b64",),
        sample={"cp.async.mbarrier.arrive.shared.b64": "sh"}),
    Row("cp.async.bulk", "x x x? x? x? x? x?", "",
        "tensor prefetch commit_group wait_group read shared::cluster shared::cta shared "
        "global mbarrier::complete_tx::bytes bulk_group tile im2col im2col_no_offs "
        "multicast::cluster L2::cache_hint cta_group::1 cta_group::2 1d 2d 3d 4d 5d L2 "
        "gather4 scatter4 tile::gather4 tile::scatter4 cp_mask",
        ntypes=(0,), sm=90, ptx="8.0", ok=("cp.async.bulk.shared::cluster.global."
                                          "mbarrier::complete_tx::bytes",),
        sample={"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes":
                "sh g i:16 sh"}),
    Row("cp.async.bulk.commit_group", "", "", "", ntypes=(0,), sm=90, ptx="8.0",
        ok=("cp.async.bulk.commit_group",)),
    Row("cp.async.bulk.wait_group", "i", "", "read", ntypes=(0,), sm=90, ptx="8.0",
        ok=("cp.async.bulk.wait_group.read",), sample={"cp.async.bulk.wait_group.read": "i:0"}),
    Row("cp.reduce.async.bulk", "x x x? x? x?", "u32 s32 u64 f32 f64 f16 bf16 b32 b64",
        "tensor global shared::cta shared::cluster bulk_group mbarrier::complete_tx::bytes "
        "<add|min|max|inc|dec|and|or|xor> tile im2col_no_offs noftz L2::cache_hint "
        "1d 2d 3d 4d 5d", ntypes=(0, 1), sm=90, ptx="8.0",
        ok=("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32",),
        sample={"cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u32": "g sh i:16"}),
    Row("mbarrier", "x x? x? x?", "", "[init|arrive|arrive_drop|test_wait|try_wait|pending_count|"
        "inval] expect_tx complete_tx parity shared shared::cta shared::cluster "
        "[release|acquire|relaxed] [cta|cluster] noComplete b64",
        ntypes=(0,), spaces="shared shared::cta shared::cluster", sm=80, ptx="7.0",
        bump={"expect_tx": 90, "try_wait": 90, "complete_tx": 90, "cluster": 90,
              "shared::cluster": 90},
        ok=("mbarrier.init.shared::cta.b64", "mbarrier.arrive.shared::cta.b64"),
        sample={"mbarrier.init.shared::cta.b64": "sh i:1",
                "mbarrier.arrive.shared::cta.b64": "r:b64 sh"}),
    Row("tensormap", "x x x?", "", "replace tile global shared::cta b1024 b128 b32 b64 s32 "
        "global_address rank box_dim global_dim global_stride element_stride elemtype "
        "interleave_layout swizzle_mode fill_mode swizzle_atomicity cp_fenceproxy "
        "tensormap::generic shared::cluster release acquire proxy sync aligned gpu cta "
        "cluster sys", ntypes=(0,), sm=90, ptx="8.3", arch_a=True,
        ok=("tensormap.replace.tile.global_address.shared::cta.b1024.b64",),
        sample={"tensormap.replace.tile.global_address.shared::cta.b1024.b64": "sh r:b64"}),
    Row("clusterlaunchcontrol", "x x x?", "", "try_cancel query_cancel async shared::cta "
        "mbarrier::complete_tx::bytes multicast::cluster::all b128 is_canceled get_first_ctaid "
        "get_first_ctaid::x get_first_ctaid::y get_first_ctaid::z v4 b32 pred", ntypes=(0,),
        sm=100, ptx="8.6",
        ok=("clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes"
            ".b128",),
        sample={"clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes"
                ".b128": "sh sh"}),
    # ---------------------------------------------------------------- tensor cores
    Row("mma", "x x x x x? x? x?", "", "sync aligned sp sp::ordered_metadata row col "
        "satfinite f32 f16 bf16 tf32 f64 s32 s8 u8 s4 u4 b1 e4m3 e5m2 xor popc and "
        "kind::f8f6f4 block_scale", ntypes=(0,), sm=80, ptx="7.0",
        pattern=r"^m\d+n\d+k\d+$",
        ok=("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",),
        sample={"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32":
                "v:f32:4 v:b32:4 v:b32:2 v:f32:4"}),
    Row("wmma", "x x x? x?", "", "load store mma sync aligned a b c d row col global "
        "shared shared::cta f16 f32 bf16 tf32 f64 s32 s8 u8 s4 u4 b1 satfinite xor popc and",
        ntypes=(0,), sm=70, ptx="6.0", pattern=r"^m\d+n\d+k\d+$",
        ok=("wmma.load.a.sync.aligned.row.m16n16k16.global.f16",),
        sample={"wmma.load.a.sync.aligned.row.m16n16k16.global.f16": "v:b32:8 g"}),
    Row("wgmma", "x*", "", "mma_async sp sync aligned fence commit_group wait_group f32 f16 "
        "bf16 tf32 e4m3 e5m2 s32 s8 u8 b1 and popc satfinite", ntypes=(0,), sm=90,
        ptx="8.0", arch_a=True, sm_max=90, pattern=r"^m64n\d+k\d+$",
        most={"fence": 0, "commit_group": 0, "wait_group": 1}, counts={"wait_group": 1},
        ok=("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned")),
    Row("tcgen05", "x*", "", "alloc dealloc relinquish_alloc_permit ld st mma shift cp "
        "commit fence wait sync aligned cta_group::1 cta_group::2 shared::cta shared::cluster "
        "b32 b64 u32 kind::f16 kind::tf32 kind::f8f6f4 kind::i8 kind::mxf8f6f4 kind::mxf4 "
        "kind::mxf4nvf4 block_scale ws pack::16b unpack::16b before_thread_sync "
        "after_thread_sync mbarrier::arrive::one multicast::cluster 128x256b 4x256b 128x128b "
        "64x128b warpx2::02_13 warpx2::01_23 warpx4 down collector::a::fill "
        "collector::a::use collector::a::lastuse collector::a::discard scale_vec::1X "
        "scale_vec::2X scale_vec::4X 16x64b 16x128b 16x256b 32x32b 16x32bx2 sp "
        "fence::before_thread_sync fence::after_thread_sync wait::ld wait::st",
        ntypes=(0,), sm=100, ptx="8.6", arch_a=True, pattern=r"^(x\d+|b\d+x\d+(_p\d+)?)$",
        most={"fence::before_thread_sync": 0, "fence::after_thread_sync": 0, "wait::ld": 0,
              "wait::st": 0, "relinquish_alloc_permit": 0},
        ok=("tcgen05.fence::before_thread_sync",
            "tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned")),
    Row("multimem", "x x x?", "", "ld_reduce st red global weak relaxed acquire release "
        "cta cluster gpu sys min max add and or xor acc::f32 v2 v4 v8 f32 f16 f16x2 bf16 "
        "bf16x2 u32 s32 u64 b32 b64 e4m3 e5m2", ntypes=(0,), sm=90, ptx="8.1",
        ok=("multimem.ld_reduce.relaxed.sys.global.add.f32",),
        sample={"multimem.ld_reduce.relaxed.sys.global.add.f32": "r:f32 g"}),
    # ---------------------------------------------------------------- textures and surfaces
    Row("tex", "x x x? x? x?", "", "base level grad 1d 2d 3d a1d a2d cube acube 2dms a2dms v4 "
        "v2 s32 u32 f32 f16 f16x2", ntypes=(0,), ok=("tex.2d.v4.f32.f32",),
        sample={"tex.2d.v4.f32.f32": "v:f32:4 t:[{rd},{{f},{f}}]"}),
    Row("tld4", "x x x? x?", "", "r g b a 2d a2d cube acube v4 s32 u32 f32", ntypes=(0,),
        ok=("tld4.r.2d.v4.f32.f32",),
        sample={"tld4.r.2d.v4.f32.f32": "v:f32:4 t:[{rd},{{f},{f}}]"}),
    Row("txq", "x x x?", "", "level width height depth channel_data_type channel_order "
        "normalized_coords filter_mode addr_mode_0 addr_mode_1 addr_mode_2 samples "
        "array_size num_mipmap_levels num_samples force_unnormalized_coords b32", ntypes=(0,),
        ok=("txq.width.b32",), sample={"txq.width.b32": "r:b32 t:[{rd}]"}),
    Row("suld", "x x", "", "b 1d 2d 3d a1d a2d v2 v4 b8 b16 b32 b64 trap clamp zero ca cg "
        "cs cv", ntypes=(0,), ok=("suld.b.2d.b32.trap",),
        sample={"suld.b.2d.b32.trap": "r:b32 t:[{rd},{{r},{r}}]"}),
    Row("sust", "x x", "", "b p 1d 2d 3d a1d a2d v2 v4 b8 b16 b32 b64 trap clamp zero wb cg "
        "cs wt", ntypes=(0,), ok=("sust.b.2d.b32.trap",),
        sample={"sust.b.2d.b32.trap": "t:[{rd},{{r},{r}}] r:b32"}),
    Row("sured", "x x", "", "b p add min max and or 1d 2d 3d u32 u64 s32 b32 b64 trap clamp "
        "zero", ntypes=(0,), ok=("sured.b.add.2d.u32.trap",),
        sample={"sured.b.add.2d.u32.trap": "t:[{rd},{{r},{r}}] r:u32"}),
    Row("suq", "x x", "", "width height depth channel_data_type channel_order array_size "
        "memory_layout b32", ntypes=(0,), ok=("suq.width.b32",),
        sample={"suq.width.b32": "r:b32 t:[{rd}]"}),
    Row("istypep", "q x", "", "texref samplerref surfref", ntypes=(0,), ok=("istypep.texref",),
        sample={"istypep.texref": "r:pred r:u64"}),
    # ---------------------------------------------------------------- video instructions
    *[Row(v, "x x x x?", "", "u32 s32 sat b0 b1 b2 b3 h0 h1 h10 add min max "
          "eq ne lt le gt ge lo ls hi hs clamp wrap", ntypes=(0,), pattern=r"^[bh][0-3]+$",
          ok=(_VIDEO_OK[v],), sample={_VIDEO_OK[v]: _VIDEO_SAMPLE[v]})
      for v in ("vabsdiff vabsdiff2 vabsdiff4 vadd vadd2 vadd4 vavrg2 vavrg4 vmad vmax vmax2 "
                "vmax4 vmin vmin2 vmin4 vset vset2 vset4 vshl vshr vsub vsub2 vsub4").split()],
]

TABLE: dict[str, Row] = {row.op: row for row in _ROWS}
"""The rows by opcode key (``"add"``, ``"cp.async.bulk"``)."""


def row_for(opcode: str) -> tuple[Row, list[str]] | None:
    """The row of a full spelling and the parts after its key, or None if no row has it."""
    parts = opcode.split(".")
    for n in (4, 3, 2, 1):
        key = ".".join(parts[:n])
        row = TABLE.get(key)
        if row is not None:
            return row, parts[n:]
    return None


# --- tcgen05 ---
# ``ptx.tcgen05.cp`` emits the ``32x128b.warpx4`` shape, which the row above lacks (ptxas
# accepts it for sm_100a: tests/test_tcgen05.py).
_tcgen05 = TABLE["tcgen05"]
TABLE["tcgen05"] = Row(**{**{f: getattr(_tcgen05, f) for f in _tcgen05.__dataclass_fields__},
                          "mods": _tcgen05.mods + " 32x128b"})
_ROWS[_ROWS.index(_tcgen05)] = TABLE["tcgen05"]
del _tcgen05
# --- end tcgen05 ---
