"""``ptx.mma_sync``: the warp-wide tensor-core MMA of Volta, Ampere and later (``mma.sync``).

One warp computes ``D = A @ B + C`` for one ``m x n x k`` tile, each thread holding fixed
fragments in registers (``ldmatrix`` loads the 16-bit ones from shared memory in that
layout). Register counts per thread:

=========  =====================  ===  ===  ================  =======  ===========
shape      A/B types              A    B    C/D               min arch layouts
=========  =====================  ===  ===  ================  =======  ===========
m8n8k4     f16                    2    2    8 f32 or 4 f16x2  sm_70    all four
m8n8k16    s8 / u8                1    1    2 s32             sm_75    row.col
m16n8k8    f16                    2    1    4 f32 or 2 f16x2  sm_75    row.col
m16n8k8    bf16                   2    1    4 f32             sm_80    row.col
m16n8k16   f16 / bf16             4    2    4 f32 (2 f16x2)   sm_80    row.col
m16n8k4    tf32                   2    1    4 f32             sm_80    row.col
m16n8k8    tf32                   4    2    4 f32             sm_80    row.col
m16n8k16   s8 / u8                2    1    4 s32             sm_80    row.col
m16n8k32   s8 / u8                4    2    4 s32             sm_80    row.col
m16n8k32   e4m3 / e5m2            4    2    4 f32             sm_89    row.col
=========  =====================  ===  ===  ================  =======  ===========

``layout=(a, b)`` names A's and B's layouts (``"row"`` or ``"col"``); PTX allows every
combination for ``m8n8k4`` f16 only and ``("row", "col")`` (A row-major, B column-major)
for every other shape. A/B registers are ``.b32`` (``reg.array(b32, n)``; f16 also takes
``.f16x2``, int8 any 32-bit integer register); C and D are the accumulator
type (f16 pairs in ``.b32``/``.f16x2``); ``m8n8k4`` f16 also takes an f16 C with an f32 D
(``dtype_c``). fp8 needs PTX ISA 8.4 (``@kernel(version="8.4")``).
"""

from __future__ import annotations

from typing import Any

from ..errors import OperandError, TypeMismatchError
from ..reg import Reg, RegArray, render
from ..source import where
from ..trace import current
from ..types import PtxType
from ._operands import check_bool, guard, reg_list, require_arch

__all__ = ["mma_sync", "SHAPES", "LAYOUTS"]

SHAPES: dict[tuple[str, str], tuple[int, int, int]] = {
    ("m8n8k4", "f16"): (2, 2, 70),
    ("m8n8k16", "s8"): (1, 1, 75),
    ("m8n8k16", "u8"): (1, 1, 75),
    ("m16n8k8", "f16"): (2, 1, 75),
    ("m16n8k8", "bf16"): (2, 1, 80),
    ("m16n8k16", "f16"): (4, 2, 80),
    ("m16n8k16", "bf16"): (4, 2, 80),
    ("m16n8k4", "tf32"): (2, 1, 80),
    ("m16n8k8", "tf32"): (4, 2, 80),
    ("m16n8k16", "s8"): (2, 1, 80),
    ("m16n8k32", "s8"): (4, 2, 80),
    ("m16n8k16", "u8"): (2, 1, 80),
    ("m16n8k32", "u8"): (4, 2, 80),
    ("m16n8k32", "e4m3"): (4, 2, 89),
    ("m16n8k32", "e5m2"): (4, 2, 89),
}
"""(shape, A/B type) -> (A registers, B registers, lowest SM) per thread."""

_ROW_COL = (("row", "col"),)
_ALL_LAYOUTS = (("row", "col"), ("row", "row"), ("col", "col"), ("col", "row"))
LAYOUTS: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {
    key: (_ALL_LAYOUTS if key == ("m8n8k4", "f16") else _ROW_COL) for key in SHAPES
}
"""(shape, A/B type) -> the ``(A layout, B layout)`` pairs PTX allows for it."""

_D_OF = {"f16": ("f32", "f16"), "bf16": ("f32",), "tf32": ("f32",), "s8": ("s32",),
         "u8": ("s32",), "e4m3": ("f32",), "e5m2": ("f32",)}
_INT8 = ("s8", "u8")
_FP8 = ("e4m3", "e5m2")


def _tname(t: Any, name: str, fn: str, allowed: tuple[str, ...]) -> str:
    s = t.name if isinstance(t, PtxType) else t
    if isinstance(s, str) and s.lstrip(".") in allowed:
        return s.lstrip(".")
    raise OperandError(f"{where(3)}: {fn} {name} must be one of {', '.join(allowed)}, got {t!r}")


def _check_regs(value: Any, name: str, fn: str, n: int, ok: Any, want: str) -> list[Reg]:
    regs = reg_list(value, name, fn)
    if len(regs) != n:
        raise OperandError(f"{where(3)}: {fn} {name} needs {n} registers per thread here, got {len(regs)}")
    for i, r in enumerate(regs):
        if not ok(r.type):
            raise TypeMismatchError(f"{where(3)}: {fn} {name} must be {want}; {name}[{i}] is "
                                    f".{r.type.name} register {r.name}")
    return regs


def _layout(layout: Any, shape: str, ta: str, fn: str) -> tuple[str, str]:
    """The checked ``(A layout, B layout)`` pair of a call."""
    if not (isinstance(layout, (tuple, list)) and len(layout) == 2
            and all(x in ("row", "col") for x in layout)):
        raise OperandError(f"{where(3)}: {fn} layout must be an (A, B) pair of 'row'/'col', "
                           f"got {layout!r}")
    pair = (layout[0], layout[1])
    allowed = LAYOUTS[(shape, ta)]
    if pair not in allowed:
        have = ", ".join(f"{a}.{b}" for a, b in allowed)
        raise OperandError(f"{where(3)}: {fn} {shape}.{ta} allows layout {have} only, got "
                           f"{pair[0]}.{pair[1]}")
    return pair


def _accumulators(shape: str, t: str) -> tuple[Any, str, int]:
    """(register check, its description, registers per thread) of a C/D operand of type ``t``."""
    small = shape.startswith("m8n8")
    if t == "f32":
        return (lambda r: r.name == "f32"), ".f32 registers", 8 if shape == "m8n8k4" else 4
    if t == "s32":
        return ((lambda r: r.is_int and r.bits == 32), ".s32 (or u32/b32) registers",
                2 if small else 4)
    return ((lambda r: r.reg_decl in ("b32", "f16x2")),
            "32-bit registers holding f16 pairs (.f16x2 or .b32)", 4 if small else 2)


def mma_sync(d: RegArray | list[Reg], a: RegArray | list[Reg], b: RegArray | list[Reg],
             c: RegArray | list[Reg], *, shape: str = "m16n8k16", dtype_ab: Any = "bf16",
             dtype_d: Any = "f32", dtype_c: Any = None, layout: tuple[str, str] = ("row", "col"),
             satfinite: bool = False, pred: Any = None) -> RegArray | list[Reg]:
    """``mma.sync.aligned.{shape}.{alayout}.{blayout}{.satfinite}.{d}.{a}.{b}.{c} {d..}, {a..}, {b..}, {c..};``

    ``D = A @ B + C`` for one warp; the register counts per shape and type, and the layouts
    each allows, are in the module's table. ``dtype_ab`` is one type or an ``(a, b)`` pair
    (int8 s8/u8 and fp8 e4m3/e5m2 may mix); ``dtype_d`` is 'f32', 'f16' (f16 inputs),
    or 's32' (int8); ``dtype_c`` (default ``dtype_d``) may differ from it only
    as f16 with an f32 D of ``m8n8k4`` f16. ``layout=(a, b)``: 'row'/'col' each. ``satfinite`` clamps int8 results.
    Returns ``d``; ``pred=p`` guards the instruction (the warp must agree).
    """
    fn = "ptx.mma_sync"
    trace = current()
    if isinstance(dtype_ab, (tuple, list)):
        if len(dtype_ab) != 2:
            raise OperandError(f"{where()}: {fn} dtype_ab pair must be (a_type, b_type), got {dtype_ab!r}")
        ta, tb = (_tname(x, "dtype_ab", fn, tuple(_D_OF)) for x in dtype_ab)
    else:
        ta = tb = _tname(dtype_ab, "dtype_ab", fn, tuple(_D_OF))
    if ta != tb and not ({ta, tb} <= set(_INT8) or {ta, tb} <= set(_FP8)):
        raise OperandError(f"{where()}: {fn} A and B types must match except for int8 (s8/u8) or "
                           f"fp8 (e4m3/e5m2) mixes, got .{ta} and .{tb}")
    td = _tname(dtype_d, "dtype_d", fn, ("f32", "f16", "s32"))
    if td not in _D_OF[ta]:
        raise OperandError(f"{where()}: {fn} with .{ta} inputs accumulates in "
                           f"{' or '.join('.' + x for x in _D_OF[ta])}, got dtype_d={td!r}")
    tc = td if dtype_c is None else _tname(dtype_c, "dtype_c", fn, ("f32", "f16", "s32"))
    spec = SHAPES.get((shape, ta))
    if spec is None:
        have = sorted(s for s, t in SHAPES if t == ta)
        raise OperandError(f"{where()}: {fn} shape for .{ta} inputs must be one of "
                           f"{', '.join(have)}, got {shape!r}")
    na, nb, min_sm = spec
    if tc != td and (shape, ta, td, tc) != ("m8n8k4", "f16", "f32", "f16"):
        raise OperandError(f"{where()}: {fn} dtype_c may differ from dtype_d only as an f16 C "
                           f"with an f32 D of m8n8k4 f16, got dtype_c={tc!r} and "
                           f"dtype_d={td!r} for {shape}.{ta}")
    require_arch(trace, f"{fn} {shape}.{ta}", min_sm)
    al, bl = _layout(layout, shape, ta, fn)
    if check_bool(satfinite, "satfinite", fn) and ta not in _INT8:
        raise OperandError(f"{where()}: {fn} satfinite is only valid for s8/u8 inputs")

    if ta in _INT8:
        ab_ok, ab_want = (lambda t: t.is_int and t.bits == 32), "32-bit integer registers"
    elif ta == "f16":
        ab_ok, ab_want = (lambda t: t.reg_decl in ("b32", "f16x2")), ".b32 or .f16x2 registers"
    else:
        ab_ok, ab_want = (lambda t: t.reg_decl == "b32"), ".b32 registers (reg.array(b32, n))"
    d_ok, d_want, nd = _accumulators(shape, td)
    c_ok, c_want, nc = _accumulators(shape, tc)
    rd = _check_regs(d, "d", fn, nd, d_ok, d_want)
    ra = _check_regs(a, "a", fn, na, ab_ok, ab_want)
    rb = _check_regs(b, "b", fn, nb, ab_ok, ab_want)
    rc = _check_regs(c, "c", fn, nc, c_ok, c_want)
    g = guard(pred, fn, trace)
    sat = ".satfinite" if satfinite else ""
    ops = tuple(render(x, None, trace) for x in (rd, ra, rb, rc))
    trace.inst(f"mma.sync.aligned.{shape}.{al}.{bl}{sat}.{td}.{ta}.{tb}.{tc}", ops, g)
    return d
