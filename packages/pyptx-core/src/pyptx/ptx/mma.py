"""``ptx.mma_sync``: the warp-wide tensor-core MMA of Ampere and later (``mma.sync``).

One warp computes ``D = A @ B + C`` for an ``m16 x n8 x k`` tile, A row-major and
B column-major (``.row.col``), each thread holding fixed fragments in 32-bit
registers (``ldmatrix`` loads them from shared memory in that layout). Register
counts per thread:

=========  =====================  ===  ===  ================  =======
shape      A/B types              A    B    C/D               min arch
=========  =====================  ===  ===  ================  =======
m16n8k8    f16                    2    1    4 f32 or 2 f16x2  sm_75
m16n8k8    bf16                   2    1    4 f32             sm_80
m16n8k16   f16 / bf16             4    2    4 f32 (2 f16x2)   sm_80
m16n8k4    tf32                   2    1    4 f32             sm_80
m16n8k8    tf32                   4    2    4 f32             sm_80
m16n8k16   s8 / u8                2    1    4 s32             sm_80
m16n8k32   s8 / u8                4    2    4 s32             sm_80
m16n8k32   e4m3 / e5m2            4    2    4 f32             sm_89
=========  =====================  ===  ===  ================  =======

A/B registers are ``.b32`` (``reg.array(b32, n)``; f16 also takes ``.f16x2``, int8
any 32-bit integer register); C and D are the accumulator type (f16 pairs in
``.b32``/``.f16x2``) and may be the same array. fp8 needs PTX ISA 8.4
(``@kernel(version="8.4")``).
"""

from __future__ import annotations

from typing import Any

from ..errors import OperandError, TypeMismatchError
from ..reg import Reg, RegArray, render
from ..source import where
from ..trace import current
from ..types import PtxType
from ._operands import check_bool, guard, reg_list, require_arch

__all__ = ["mma_sync", "SHAPES"]

SHAPES: dict[tuple[str, str], tuple[int, int, int]] = {
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


def mma_sync(d: RegArray | list[Reg], a: RegArray | list[Reg], b: RegArray | list[Reg],
             c: RegArray | list[Reg], *, shape: str = "m16n8k16", dtype_ab: Any = "bf16",
             dtype_d: Any = "f32", satfinite: bool = False,
             pred: Any = None) -> RegArray | list[Reg]:
    """``mma.sync.aligned.{shape}.row.col{.satfinite}.{d}.{a}.{b}.{c} {d..}, {a..}, {b..}, {c..};``

    ``D = A @ B + C`` for one warp; the register counts per shape and type are in the
    module's table. ``dtype_ab`` is one type or an ``(a, b)`` pair (int8 s8/u8 and fp8
    e4m3/e5m2 may mix); ``dtype_d`` ('f32', 'f16' for f16 inputs, 's32' for int8) is
    also C's type. ``satfinite`` clamps int8 results. Returns ``d``; ``pred=p`` guards
    the instruction (the warp must agree).
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
    spec = SHAPES.get((shape, ta))
    if spec is None:
        have = sorted(s for s, t in SHAPES if t == ta)
        raise OperandError(f"{where()}: {fn} shape for .{ta} inputs must be one of "
                           f"{', '.join(have)}, got {shape!r}")
    na, nb, min_sm = spec
    require_arch(trace, f"{fn} {shape}.{ta}", min_sm)
    if check_bool(satfinite, "satfinite", fn) and ta not in _INT8:
        raise OperandError(f"{where()}: {fn} satfinite is only valid for s8/u8 inputs")

    if ta in _INT8:
        ab_ok, ab_want = (lambda t: t.is_int and t.bits == 32), "32-bit integer registers"
    elif ta == "f16":
        ab_ok, ab_want = (lambda t: t.reg_decl in ("b32", "f16x2")), ".b32 or .f16x2 registers"
    else:
        ab_ok, ab_want = (lambda t: t.reg_decl == "b32"), ".b32 registers (reg.array(b32, n))"
    if td == "f32":
        acc_ok, acc_want, nacc = (lambda t: t.name == "f32"), ".f32 registers", 4
    elif td == "s32":
        acc_ok, acc_want, nacc = (lambda t: t.is_int and t.bits == 32), ".s32 (or u32/b32) registers", 4
    else:
        acc_ok, acc_want, nacc = ((lambda t: t.reg_decl in ("b32", "f16x2")),
                                  "32-bit registers holding f16 pairs (.f16x2 or .b32)", 2)
    rd = _check_regs(d, "d", fn, nacc, acc_ok, acc_want)
    ra = _check_regs(a, "a", fn, na, ab_ok, ab_want)
    rb = _check_regs(b, "b", fn, nb, ab_ok, ab_want)
    rc = _check_regs(c, "c", fn, nacc, acc_ok, acc_want)
    g = guard(pred, fn, trace)
    sat = ".satfinite" if satfinite else ""
    ops = tuple(render(x, None, trace) for x in (rd, ra, rb, rc))
    trace.inst(f"mma.sync.aligned.{shape}.row.col{sat}.{td}.{ta}.{tb}.{td}", ops, g)
    return d
