"""``ptx.wgmma``: warpgroup matrix multiply-accumulate on Hopper (sm_90a).

A warpgroup (4 consecutive warps, 128 threads) computes ``D = A @ B (+ D)`` for
an ``m64 x n x k`` tile with ``wgmma.mma_async``; A and B live in shared memory
and are described by 64-bit matrix descriptors (``make_smem_desc``), or A comes
from registers. The accumulator is a register array of ``m*n/128`` registers per
thread (f32/s32) or ``m*n/256`` (f16, packed in pairs).

The canonical sequence::

    wgmma.fence()                       # before the first mma touching acc
    for ...: wgmma.mma_async(acc, da, db, n=128, scale_d=1)
    wgmma.commit_group()
    wgmma.wait_group(0)                 # before reading acc

``fence``, ``commit_group``, ``wait_group`` and ``mma_async`` need ``sm_90a`` (a
``TraceError`` names the kernel's arch otherwise). Every helper takes ``pred=p``
(or ``~p``) and guards each instruction it emits with ``@p`` / ``@!p``; the
``.sync.aligned`` forms still need the whole warp to agree on the guard.
"""

from __future__ import annotations

from typing import Any

from ..errors import OperandError, TypeMismatchError
from ..reg import Reg, RegArray, render
from ..smem import SharedArray
from ..source import where
from ..trace import current
from ..types import PtxType, u32, u64
from ._operands import check_bool, guard, int_in, is_int, predicate, reg_list, reg_of, require_arch

__all__ = ["fence", "commit_group", "wait_group", "mma_async", "make_smem_desc",
           "accumulator_count", "K_OF"]

K_OF = {"f16": 16, "bf16": 16, "tf32": 8, "e4m3": 32, "e5m2": 32, "s8": 32, "u8": 32}
"""The K of one wgmma per A/B element type."""

_FP8 = ("e4m3", "e5m2")
_INT8 = ("s8", "u8")
_D_OF = {"f16": ("f16", "f32"), "bf16": ("f32",), "tf32": ("f32",), "e4m3": ("f16", "f32"),
         "e5m2": ("f16", "f32"), "s8": ("s32",), "u8": ("s32",)}
_INT_N = frozenset([8, 16, 24] + list(range(32, 257, 16)))
_SWIZZLE = {None: 0, 0: 0, 128: 1, 64: 2, 32: 3}


def _sm90a(fn: str) -> Any:
    trace = current()
    require_arch(trace, fn, 90, arch_specific=True, max_sm=90)
    return trace


def fence(*, pred: Any = None) -> None:
    """``wgmma.fence.sync.aligned;``: order register/shared accesses before wgmma reads them."""
    trace = _sm90a("ptx.wgmma.fence")
    trace.inst("wgmma.fence.sync.aligned", (), guard(pred, "ptx.wgmma.fence", trace))


def commit_group(*, pred: Any = None) -> None:
    """``wgmma.commit_group.sync.aligned;``: close the group of issued wgmma.mma_async."""
    trace = _sm90a("ptx.wgmma.commit_group")
    trace.inst("wgmma.commit_group.sync.aligned", (), guard(pred, "ptx.wgmma.commit_group", trace))


def wait_group(n: int = 0, *, pred: Any = None) -> None:
    """``wgmma.wait_group.sync.aligned n;``: wait until at most ``n`` wgmma groups are pending."""
    trace = _sm90a("ptx.wgmma.wait_group")
    if not is_int(n) or n < 0:
        raise OperandError(f"{where()}: ptx.wgmma.wait_group n must be a non-negative int, got {n!r}")
    trace.inst("wgmma.wait_group.sync.aligned", (str(n),), guard(pred, "ptx.wgmma.wait_group", trace))


def _tname(t: Any, name: str) -> str:
    s = t.name if isinstance(t, PtxType) else t
    if isinstance(s, str):
        s = s.lstrip(".")
        if s in K_OF or s in ("f32", "s32"):
            return s
    raise OperandError(
        f"{where()}: ptx.wgmma.mma_async {name} must be one of "
        f"{', '.join(sorted(set(K_OF) | {'f32', 's32'}))}, got {t!r}"
    )


def accumulator_count(m: int, n: int, dtype_d: str = "f32") -> int:
    """Registers per thread of an ``m x n`` accumulator: m*n/128 (f32, s32) or m*n/256 (f16)."""
    return m * n // (256 if dtype_d == "f16" else 128)


def _check_acc_reg(r: Reg, dtype_d: str, i: int) -> None:
    t = r.type
    if dtype_d == "f32":
        ok = t.name == "f32"
        want = ".f32 registers"
    elif dtype_d == "s32":
        ok = t.name in ("s32", "u32", "b32")
        want = ".s32 (or u32/b32) registers"
    else:
        ok = t.bits == 32 and (t.kind in ("b", "u") or t.name == "f16x2")
        want = "32-bit registers holding f16 pairs (.f16x2 or .b32)"
    if not ok:
        raise TypeMismatchError(
            f"{where()}: ptx.wgmma.mma_async accumulator for .{dtype_d} must be {want}; "
            f"acc[{i}] is .{t.name} register {r.name}"
        )


def _desc(d: Any, name: str) -> Reg:
    if type(d) is not Reg:
        raise OperandError(
            f"{where()}: ptx.wgmma.mma_async {name} must be a u64 matrix-descriptor register "
            f"(ptx.wgmma.make_smem_desc), got {d!r}"
        )
    return reg_of(d, name, "ptx.wgmma.mma_async", (64,), "a 64-bit matrix descriptor (u64/b64)")


def mma_async(acc: RegArray | list[Reg], a_desc: Reg | RegArray | list[Reg], b_desc: Reg, *,
              m: int = 64, n: int | None = None, k: int | None = None, dtype_d: Any = "f32",
              dtype_ab: Any = "bf16", scale_d: Any = 1, imm_scale_a: int = 1,
              imm_scale_b: int = 1, trans_a: int = 0, trans_b: int = 0,
              satfinite: bool = False, pred: Any = None) -> None:
    """One ``wgmma.mma_async.sync.aligned.m64n{n}k{k}.{d}.{a}.{b}``: ``acc = A @ B + scale_d * acc``.

    * ``acc``: m*n/128 registers (f32/s32) or m*n/256 (f16 pairs); ``n`` defaults
      to what ``acc`` holds and must be a multiple of 8 in 8..256 (for s8/u8:
      8, 16, 24, then multiples of 16).
    * ``a_desc``: a u64 descriptor of A in shared memory, or 4 32-bit registers
      holding this thread's A fragment. ``b_desc``: a u64 descriptor of B.
    * ``dtype_ab``: 'f16', 'bf16' (k=16), 'tf32' (k=8), 'e4m3'/'e5m2', 's8'/'u8'
      (k=32), or an ``(a, b)`` pair for mixed fp8/int8. ``dtype_d``: 'f32', 'f16'
      (f16 and fp8 inputs) or 's32' (int8). ``k`` defaults to the type's K.
    * ``scale_d``: 1 (accumulate), 0 (overwrite) or a predicate register / ``~p``.
    * ``imm_scale_a``/``imm_scale_b``: 1 or -1 (not for int8); ``trans_a``/``trans_b``:
      0 or 1, transposes A/B (f16/bf16 only, trans_a only with a descriptor).
    * ``satfinite``: saturate s32 results (int8 only).
    """
    fn = "ptx.wgmma.mma_async"
    trace = _sm90a(fn)
    g = guard(pred, fn, trace)
    if isinstance(dtype_ab, (tuple, list)):
        if len(dtype_ab) != 2:
            raise OperandError(f"{where()}: {fn} dtype_ab pair must be (a_type, b_type), got {dtype_ab!r}")
        ta, tb = _tname(dtype_ab[0], "dtype_ab"), _tname(dtype_ab[1], "dtype_ab")
    else:
        ta = tb = _tname(dtype_ab, "dtype_ab")
    td = _tname(dtype_d, "dtype_d")
    for t in (ta, tb):
        if t not in K_OF:
            raise OperandError(f"{where()}: {fn} dtype_ab must be an input type such as 'bf16', got {t!r}")
    if ta != tb and not ({ta, tb} <= set(_FP8) or {ta, tb} <= set(_INT8)):
        raise OperandError(
            f"{where()}: {fn} A and B types must match except for fp8 (e4m3/e5m2) or int8 "
            f"(s8/u8) mixes, got .{ta} and .{tb}"
        )
    if td not in _D_OF[ta]:
        raise OperandError(
            f"{where()}: {fn} with .{ta} inputs accumulates in {' or '.join('.' + d for d in _D_OF[ta])}, "
            f"got dtype_d={td!r}"
        )
    if m != 64:
        raise OperandError(f"{where()}: {fn} m must be 64 (wgmma shapes are m64nNkK), got {m!r}")
    kk = K_OF[ta]
    if k is not None and k != kk:
        raise OperandError(f"{where()}: {fn} k must be {kk} for .{ta} inputs, got {k!r}")

    regs = reg_list(acc, "acc", fn)
    per = 256 if td == "f16" else 128
    if n is None:
        n = len(regs) * per // m
    is_int8 = ta in _INT8
    if not is_int(n) or not (8 <= n <= 256 and n % 8 == 0) or (is_int8 and n not in _INT_N):
        allowed = "8, 16, 24, 32, 48, ..., 256 (multiples of 16 above 32)" if is_int8 else \
            "a multiple of 8 in 8..256"
        raise OperandError(f"{where()}: {fn} n must be {allowed} for .{ta}, got {n!r}")
    want = accumulator_count(m, n, td)
    if len(regs) != want:
        raise OperandError(
            f"{where()}: {fn} m{m}n{n}k{kk}.{td} needs {want} accumulator registers per thread "
            f"(m*n/{per}), got {len(regs)}"
        )
    for i, r in enumerate(regs):
        _check_acc_reg(r, td, i)

    a_in_regs = type(a_desc) is not Reg
    if a_in_regs:
        if type(a_desc) is not RegArray and not isinstance(a_desc, (list, tuple)):
            raise OperandError(
                f"{where()}: {fn} a_desc must be a u64 matrix-descriptor register or 4 32-bit "
                f"A-fragment registers, got {a_desc!r}"
            )
        a_regs = reg_list(a_desc, "a_desc", fn)
        if len(a_regs) != 4:
            raise OperandError(f"{where()}: {fn} A from registers takes 4 32-bit registers, got {len(a_regs)}")
        for i, r in enumerate(a_regs):
            if r.type.bits != 32 or r.type.is_pred or (r.type.name == "f32" and ta != "tf32"):
                raise TypeMismatchError(
                    f"{where()}: {fn} A fragment registers must be 32-bit registers holding packed "
                    f".{ta} values; a_desc[{i}] is .{r.type.name} register {r.name}"
                )
        a = render(a_regs, None, trace)
    else:
        a = render(_desc(a_desc, "a_desc"), None, trace)
    b = render(_desc(b_desc, "b_desc"), None, trace)
    sd = predicate(scale_d, "scale_d", fn, trace)

    for name, v in (("imm_scale_a", imm_scale_a), ("imm_scale_b", imm_scale_b)):
        if not is_int(v) or v not in (1, -1):
            raise OperandError(f"{where()}: {fn} {name} must be 1 or -1, got {v!r}")
        if is_int8 and v != 1:
            raise OperandError(f"{where()}: {fn} {name} must be 1 for integer inputs (no scale operand)")
    for name, v in (("trans_a", trans_a), ("trans_b", trans_b)):
        if not isinstance(v, (int, bool)) or v not in (0, 1):
            raise OperandError(f"{where()}: {fn} {name} must be 0 or 1, got {v!r}")
        if v and ta not in ("f16", "bf16"):
            raise OperandError(f"{where()}: {fn} {name}=1 is only supported for .f16/.bf16 inputs")
    if trans_a and a_in_regs:
        raise OperandError(f"{where()}: {fn} trans_a=1 needs A in shared memory (a descriptor)")
    check_bool(satfinite, "satfinite", fn)
    if satfinite and not is_int8:
        raise OperandError(f"{where()}: {fn} satfinite is only valid for s8/u8 inputs")

    ops = [render(regs, None, trace), a, b, sd]
    if not is_int8:
        ops += [str(imm_scale_a), str(imm_scale_b)]
        if ta in ("f16", "bf16"):
            if not a_in_regs:
                ops.append(str(int(trans_a)))
            ops.append(str(int(trans_b)))
    sat = ".satfinite" if satfinite else ""
    trace.inst(f"wgmma.mma_async.sync.aligned.m{m}n{n}k{kk}{sat}.{td}.{ta}.{tb}", tuple(ops), g)


def make_smem_desc(addr: Reg | SharedArray, leading_byte_offset: int, stride_byte_offset: int,
                   swizzle: int | None, *, base_offset: int = 0, pred: Any = None) -> Reg:
    """The 64-bit wgmma matrix descriptor of a shared-memory tile, as a u64 register.

    Layout: bits 0-13 ``(addr & 0x3FFFF) >> 4``, 16-29 ``leading_byte_offset >> 4``,
    32-45 ``stride_byte_offset >> 4``, 49-51 ``base_offset``, 62-63 the swizzle mode
    (``swizzle`` in bytes: None/0 none, 128, 64 or 32). Emits four instructions
    (``and``, ``shr``, ``cvt.u64.u32``, ``or.b64`` with the constant fields), five
    for a shared array (its ``mov.u32`` address first). ``addr`` is a shared array or
    a u32 shared address register; offsets are byte counts, multiples of 16 below
    2**18. To step along K inside a swizzle atom add ``bytes >> 4`` to the result.
    ``pred=`` guards every instruction of the sequence (the result is undefined where
    the guard is false).
    """
    fn = "ptx.wgmma.make_smem_desc"
    trace = current()
    g = guard(pred, fn, trace)
    if type(addr) is SharedArray:
        sym = render(addr, None, trace)
        addr = Reg(trace.new_reg_name(u32), u32, trace)
        trace.inst("mov.u32", (addr.name, sym), g)
    elif type(addr) is Reg:
        reg_of(addr, "addr", fn, (32, 64), "a u32 shared address register")
        render(addr, None, trace)  # ownership check
    else:
        raise OperandError(
            f"{where()}: {fn} addr must be a shared array or a u32 shared address register, got {addr!r}"
        )
    for name, v in (("leading_byte_offset", leading_byte_offset),
                    ("stride_byte_offset", stride_byte_offset)):
        int_in(v, name, fn, 0, (1 << 18) - 16, " (bytes)")
        if v % 16:
            raise OperandError(f"{where()}: {fn} {name} must be a multiple of 16 bytes, got {v}")
    if isinstance(swizzle, bool) or swizzle not in _SWIZZLE:
        raise OperandError(f"{where()}: {fn} swizzle must be None, 0, 32, 64 or 128 (bytes), got {swizzle!r}")
    int_in(base_offset, "base_offset", fn, 0, 7)
    const = ((leading_byte_offset >> 4) << 16) | ((stride_byte_offset >> 4) << 32) \
        | (base_offset << 49) | (_SWIZZLE[swizzle] << 62)
    bits = addr.type.bits
    if bits == 32:
        masked = Reg(trace.new_reg_name(u32), u32, trace)
        lo = Reg(trace.new_reg_name(u32), u32, trace)
        trace.inst("and.b32", (masked.name, addr.name, "0x3FFFF"), g)
        trace.inst("shr.u32", (lo.name, masked.name, "4"), g)
        wide = Reg(trace.new_reg_name(u64), u64, trace)
        trace.inst("cvt.u64.u32", (wide.name, lo.name), g)
    else:
        masked = Reg(trace.new_reg_name(u64), u64, trace)
        wide = Reg(trace.new_reg_name(u64), u64, trace)
        trace.inst("and.b64", (masked.name, addr.name, "0x3FFFF"), g)
        trace.inst("shr.u64", (wide.name, masked.name, "4"), g)
    desc = Reg(trace.new_reg_name(u64), u64, trace)
    trace.inst("or.b64", (desc.name, wide.name, f"0x{const:016X}"), g)
    return desc
