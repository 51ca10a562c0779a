"""``ptx.tcgen05``: Blackwell (sm_100a) tensor cores with accumulators in tensor memory.

Untested on hardware: every form is proven by ptxas for sm_100a and by the CPU PTX
simulator only (no Blackwell GPU is lent here).

Tensor memory (TMEM) is a per-CTA array of 128 lanes x 512 columns of 32-bit cells.
A TMEM address is a u32 ``lane << 16 | column``. One thread issues ``tcgen05.mma``
for the CTA (or, with ``cta_group=2``, for a pair of CTAs); the product lands in
tensor memory, and warps move it to registers with ``tcgen05.ld`` (warp ``w`` reaches
lanes ``32*(w%4)`` .. ``+31``). The canonical 1-CTA GEMM sequence::

    tm = tcgen05.alloc(slot, 128)               # one warp; writes the address to slot
    tcgen05.relinquish_alloc_permit()
    tcgen05.fence_before_thread_sync(); ptx.bar_sync(0); tcgen05.fence_after_thread_sync()
    d = tm.address()                            # ld.shared.b32 of the slot
    idesc = tcgen05.InstrDescriptor(m=128, n=128)
    for k: tcgen05.mma(d, a_tile.descriptor(sa, k, target="tcgen05"),
                       b_tile.descriptor(sb, k, target="tcgen05"), idesc,
                       enable_input_d=k > 0)    # an elected thread
    tcgen05.commit(done_bar)                    # arrives on the mbarrier when they finish
    ... wait on done_bar ...; tcgen05.fence_after_thread_sync()
    tcgen05.ld(regs, d, shape="32x32b", num=32); tcgen05.wait_ld()
    tcgen05.fence_before_thread_sync(); ptx.bar_sync(0); tm.dealloc(d)

Every helper needs an arch-specific Blackwell target (``sm_100a``, ``sm_101a``,
``sm_103a``, ``sm_110a``) and refuses others with a ``TraceError``; every helper takes
``pred=p`` (or ``~p``) and guards each instruction it emits. The ``.sync.aligned``
forms need the whole warp to agree on the guard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, OperandError, TraceError, TypeMismatchError
from ..reg import Reg, render
from ..source import where
from ..trace import current
from ..types import b16, b32, u32
from ._operands import _arch_parts, guard, int_in, is_int, predicate, reg_list, shared_addr

__all__ = ["InstrDescriptor", "TmemAllocation", "alloc", "dealloc", "relinquish_alloc_permit",
           "mma", "commit", "ld", "st", "cp", "shift", "wait_ld", "wait_st",
           "fence_before_thread_sync", "fence_after_thread_sync", "LD_SHAPES", "CP_SHAPES",
           "TMEM_LANES", "TMEM_COLUMNS"]

TMEM_LANES = 128
"""Lanes (rows) of one CTA's tensor memory."""
TMEM_COLUMNS = 512
"""32-bit columns of one CTA's tensor memory."""

_BLACKWELL_SM = (100, 101, 103, 110)

LD_SHAPES = {"32x32b": (1, 128), "16x64b": (1, 128), "16x128b": (2, 64), "16x256b": (4, 32),
             "16x32bx2": (1, 128)}
"""``tcgen05.ld``/``st`` shapes: (32-bit registers per ``.num`` step, largest ``.num``)."""

CP_SHAPES = ("128x256b", "4x256b", "128x128b", "64x128b.warpx2::02_13",
             "64x128b.warpx2::01_23", "32x128b.warpx4")
"""``tcgen05.cp`` shapes (with their warp multicast qualifier where one is required)."""

# kind -> {A/B type name: the descriptor's 3-bit format}, and the accumulator types it allows
_AB_FORMAT = {
    "f16": {"f16": 0, "bf16": 1},
    "tf32": {"tf32": 2},
    "f8f6f4": {"e4m3": 0, "e5m2": 1, "e2m3": 3, "e3m2": 4, "e2m1": 5},
}
_D_FORMAT = {"f16": 0, "f32": 1}
_D_OF_KIND = {"f16": ("f16", "f32"), "tf32": ("f32",), "f8f6f4": ("f16", "f32")}


def _blackwell(fn: str) -> Any:
    trace = current()
    sm, suffix = _arch_parts(trace.arch)
    if sm not in _BLACKWELL_SM or not suffix:
        raise TraceError(
            f"{where()}: {fn} needs an arch-specific Blackwell target (sm_100a, sm_101a, "
            f"sm_103a or sm_110a), but this kernel targets {trace.arch}; choose the target "
            f"with @kernel(arch='sm_100a')")
    return trace


def _cta_group(v: Any, fn: str) -> int:
    if not is_int(v) or v not in (1, 2):
        raise OperandError(f"{where()}: {fn} cta_group must be 1 or 2, got {v!r}")
    return v


def _tmem_addr(v: Any, name: str, fn: str, trace: Any) -> str:
    if type(v) is not Reg or not v.type.is_int or v.type.bits != 32:
        got = f".{v.type.name} register {v.name}" if type(v) is Reg else repr(v)
        raise (TypeMismatchError if type(v) is Reg else OperandError)(
            f"{where()}: {fn} {name} must be a u32 tensor-memory address register "
            f"(lane << 16 | column, e.g. TmemAllocation.address()), got {got}")
    return render(v, None, trace)


def _tmem_b32(v: Any, name: str, fn: str, trace: Any, g: str | None) -> str:
    """A TMEM address for ``tcgen05.mma``'s brackets, which ptxas takes only as ``.b32``:
    a u32/s32 register is moved into a fresh ``.b32`` one first."""
    text = _tmem_addr(v, name, fn, trace)
    if v.type.name == "b32":
        return text
    r = Reg(trace.new_reg_name(b32), b32, trace)
    trace.inst("mov.b32", (r.name, text), g)
    return r.name


def _reg64(v: Any, name: str, fn: str, what: str, trace: Any) -> str:
    if type(v) is not Reg or not v.type.is_int or v.type.bits != 64:
        got = f".{v.type.name} register {v.name}" if type(v) is Reg else repr(v)
        raise (TypeMismatchError if type(v) is Reg else OperandError)(
            f"{where()}: {fn} {name} must be {what}, got {got}")
    return render(v, None, trace)


# ---------------------------------------------------------------------- instruction descriptor
@dataclass(frozen=True)
class InstrDescriptor:
    """The 32-bit instruction descriptor of ``tcgen05.mma`` (dense), validated at construction.

    ``kind``: 'f16' (A/B 'f16' or 'bf16'), 'tf32' ('tf32') or 'f8f6f4' ('e4m3', 'e5m2',
    'e2m3', 'e3m2', 'e2m1'); ``dtype_d``: 'f32' or 'f16' (not for tf32); ``m``/``n``: the
    shape (``cta_group=1``: m 64 with n a multiple of 8, or m 128 with n a multiple of 16,
    n in 8/16..256; ``cta_group=2``: m 128 or 256, n a multiple of 16 in 32..256);
    ``major_a``/``major_b``: 'K' or 'MN' (the operand tiles' ``major``); ``negate_a``/
    ``negate_b``: negate the operand. ``value`` packs the bits: 4-5 D format, 7-9 A
    format, 10-12 B format, 13/14 negate A/B, 15/16 A/B MN-major, 17-22 ``n >> 3``,
    24-28 ``m >> 4``.
    """

    m: int = 128
    n: int = 128
    kind: str = "f16"
    dtype_a: str = "bf16"
    dtype_b: str = "bf16"
    dtype_d: str = "f32"
    major_a: str = "K"
    major_b: str = "K"
    negate_a: bool = False
    negate_b: bool = False
    cta_group: int = 1

    def __post_init__(self) -> None:
        at = where(4)  # past the dataclass-generated __init__, to the user's line
        if not isinstance(self.kind, str) or self.kind not in _AB_FORMAT:
            raise ConfigError(f"{at}: InstrDescriptor kind must be one of "
                              f"{', '.join(_AB_FORMAT)}, got {self.kind!r}")
        fmts = _AB_FORMAT[self.kind]
        for name in ("dtype_a", "dtype_b"):
            v = getattr(self, name)
            if not isinstance(v, str) or v not in fmts:
                raise ConfigError(f"{at}: InstrDescriptor {name} for kind {self.kind!r} must "
                                  f"be one of {', '.join(fmts)}, got {v!r}")
        if self.kind == "f16" and self.dtype_a != self.dtype_b:
            raise ConfigError(f"{at}: InstrDescriptor kind 'f16' needs A and B of one type, got "
                              f"{self.dtype_a!r} and {self.dtype_b!r}")
        if not isinstance(self.dtype_d, str) or self.dtype_d not in _D_OF_KIND[self.kind]:
            raise ConfigError(f"{at}: InstrDescriptor kind {self.kind!r} accumulates in "
                              f"{' or '.join(_D_OF_KIND[self.kind])}, got dtype_d={self.dtype_d!r}")
        for name in ("major_a", "major_b"):
            if getattr(self, name) not in ("K", "MN"):
                raise ConfigError(f"{at}: InstrDescriptor {name} must be 'K' or 'MN', got "
                                  f"{getattr(self, name)!r}")
        if self.kind == "f8f6f4" and "MN" in (self.major_a, self.major_b) and \
                {self.dtype_a, self.dtype_b} - {"e4m3", "e5m2"}:
            raise ConfigError(f"{at}: InstrDescriptor sub-byte types (e2m3, e3m2, e2m1) must "
                              f"be K-major")
        for name in ("negate_a", "negate_b"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{at}: InstrDescriptor {name} must be True or False, got "
                                  f"{getattr(self, name)!r}")
        if not is_int(self.cta_group) or self.cta_group not in (1, 2):
            raise ConfigError(f"{at}: InstrDescriptor cta_group must be 1 or 2, got "
                              f"{self.cta_group!r}")
        ms = (64, 128) if self.cta_group == 1 else (128, 256)
        if not is_int(self.m) or self.m not in ms:
            raise ConfigError(f"{at}: InstrDescriptor m must be {ms[0]} or {ms[1]} with "
                              f"cta_group={self.cta_group}, got {self.m!r}")
        step = 8 if (self.cta_group, self.m) == (1, 64) else 16
        lo = 32 if self.cta_group == 2 else step
        if not is_int(self.n) or not lo <= self.n <= 256 or self.n % step:
            raise ConfigError(f"{at}: InstrDescriptor n must be a multiple of {step} in "
                              f"{lo}..256 for m={self.m}, cta_group={self.cta_group}, got "
                              f"{self.n!r}")

    @property
    def value(self) -> int:
        """The packed 32-bit descriptor."""
        f = _AB_FORMAT[self.kind]
        return (_D_FORMAT[self.dtype_d] << 4 | f[self.dtype_a] << 7 | f[self.dtype_b] << 10
                | int(self.negate_a) << 13 | int(self.negate_b) << 14
                | int(self.major_a == "MN") << 15 | int(self.major_b == "MN") << 16
                | (self.n >> 3) << 17 | (self.m >> 4) << 24)

    @property
    def k(self) -> int:
        """K of one instruction: 32 bytes of A/B elements (16 f16/bf16, 8 tf32, 32 fp8)."""
        return {"f16": 16, "tf32": 8, "f8f6f4": 32}[self.kind]

    @property
    def tmem_columns(self) -> int:
        """32-bit TMEM columns the accumulator occupies per CTA (f16 is not packed)."""
        return self.n


# ---------------------------------------------------------------------- allocation
@dataclass(frozen=True)
class TmemAllocation:
    """``ncols`` TMEM columns allocated by ``alloc``; the address is in shared ``slot``.

    ``address()`` reads it back (after the allocating warp's
    ``fence_before_thread_sync``, a barrier and ``fence_after_thread_sync``);
    ``dealloc(addr)`` frees the columns (the allocating warp, once no tcgen05
    instruction reads or writes them).
    """

    slot: Any
    ncols: int
    cta_group: int = 1

    def address(self, *, pred: Any = None) -> Reg:
        """``ld.shared.b32`` of the allocated TMEM address (lane 0, first column), a ``.b32``
        register (the type ``tcgen05.mma`` takes as is)."""
        fn = "TmemAllocation.address"
        trace = _blackwell(fn)
        g = guard(pred, fn, trace)
        a = shared_addr(self.slot, "slot", fn, trace, align=4, size=4)
        r = Reg(trace.new_reg_name(b32), b32, trace)
        trace.inst("ld.shared.b32", (r.name, a), g)
        return r

    def dealloc(self, taddr: Reg, *, pred: Any = None) -> None:
        """``tcgen05.dealloc`` of these ``ncols`` columns at ``taddr`` (see ``dealloc``)."""
        dealloc(taddr, self.ncols, cta_group=self.cta_group, pred=pred)


def _ncols(ncols: Any, fn: str) -> int:
    if not is_int(ncols) or ncols < 32 or ncols > TMEM_COLUMNS or ncols & (ncols - 1):
        raise OperandError(f"{where()}: {fn} ncols must be a power of 2 in 32..512, got {ncols!r}")
    return ncols


def alloc(slot: Any, ncols: int, *, cta_group: int = 1, pred: Any = None) -> TmemAllocation:
    """``tcgen05.alloc.cta_group::G.sync.aligned.shared::cta.b32 [slot], ncols;``.

    One whole warp allocates ``ncols`` (a power of 2 in 32..512) TMEM columns and the
    address is written to the 4-byte shared ``slot`` (a shared array, ``ptx.addr`` or a
    u32 register). Returns the ``TmemAllocation``.
    """
    fn = "ptx.tcgen05.alloc"
    trace = _blackwell(fn)
    g = guard(pred, fn, trace)
    cg = _cta_group(cta_group, fn)
    n = _ncols(ncols, fn)
    a = shared_addr(slot, "slot", fn, trace, align=4, size=4)
    trace.inst(f"tcgen05.alloc.cta_group::{cg}.sync.aligned.shared::cta.b32", (a, str(n)), g)
    return TmemAllocation(slot, n, cg)


def dealloc(taddr: Reg, ncols: int, *, cta_group: int = 1, pred: Any = None) -> None:
    """``tcgen05.dealloc.cta_group::G.sync.aligned.b32 taddr, ncols;`` (one whole warp)."""
    fn = "ptx.tcgen05.dealloc"
    trace = _blackwell(fn)
    g = guard(pred, fn, trace)
    cg = _cta_group(cta_group, fn)
    t = _tmem_addr(taddr, "taddr", fn, trace)
    trace.inst(f"tcgen05.dealloc.cta_group::{cg}.sync.aligned.b32", (t, str(_ncols(ncols, fn))), g)


def relinquish_alloc_permit(*, cta_group: int = 1, pred: Any = None) -> None:
    """``tcgen05.relinquish_alloc_permit.cta_group::G.sync.aligned;``: this CTA allocates no more."""
    fn = "ptx.tcgen05.relinquish_alloc_permit"
    trace = _blackwell(fn)
    g = guard(pred, fn, trace)
    cg = _cta_group(cta_group, fn)
    trace.inst(f"tcgen05.relinquish_alloc_permit.cta_group::{cg}.sync.aligned", (), g)


# ---------------------------------------------------------------------- mma
def mma(d_tmem: Reg, a: Reg, b_desc: Reg, idesc: InstrDescriptor | Reg, *,
        enable_input_d: Any, kind: str | None = None, cta_group: int | None = None,
        pred: Any = None) -> None:
    """``tcgen05.mma.cta_group::G.kind::K [d_tmem], a, b_desc, idesc, enable_input_d;``.

    ``D = A @ B (+ D)``, issued by one thread. ``d_tmem``: u32 TMEM address of D;
    ``a``: a u64 shared-memory descriptor of A (``OperandTile.descriptor(...,
    target="tcgen05")``) or a u32 TMEM address of A (emitted as ``[a]``; ptxas takes only
    ``.b32`` TMEM addresses there, so a u32/s32 ``d_tmem`` or ``a`` is moved into a ``.b32``
    register first); ``b_desc``: the
    u64 descriptor of B; ``idesc``: an ``InstrDescriptor`` (moved into a register with
    ``mov.b32`` first; it gives ``kind`` and ``cta_group``) or a u32 register (then
    ``kind`` and ``cta_group`` are required); ``enable_input_d``: 0 (overwrite D), 1
    (accumulate), or a predicate / ``~p``. Asynchronous: ``commit`` tracks completion.
    """
    fn = "ptx.tcgen05.mma"
    trace = _blackwell(fn)
    g = guard(pred, fn, trace)
    if type(idesc) is InstrDescriptor:
        for name, v, want in (("kind", kind, idesc.kind), ("cta_group", cta_group, idesc.cta_group)):
            if v is not None and v != want:
                raise OperandError(f"{where()}: {fn} {name}={v!r} disagrees with the "
                                   f"InstrDescriptor's {name}={want!r}")
        kind, cg = idesc.kind, idesc.cta_group
        if type(a) is Reg and a.type.bits == 32 and idesc.major_a != "K":
            raise OperandError(f"{where()}: {fn} A in tensor memory must be K-major; the "
                               f"InstrDescriptor says major_a='MN'")
        r = Reg(trace.new_reg_name(u32), u32, trace)
        trace.inst("mov.b32", (r.name, f"0x{idesc.value:08X}"), g)
        ides = r.name
    elif type(idesc) is Reg:
        if not idesc.type.is_int or idesc.type.bits != 32:
            raise TypeMismatchError(f"{where()}: {fn} idesc must be an InstrDescriptor or a "
                                    f"u32 register, got .{idesc.type.name} register {idesc.name}")
        if not isinstance(kind, str) or kind not in _AB_FORMAT:
            raise OperandError(f"{where()}: {fn} with idesc in a register needs kind= one of "
                               f"{', '.join(_AB_FORMAT)}, got {kind!r}")
        if cta_group is None:
            raise OperandError(f"{where()}: {fn} with idesc in a register needs cta_group= 1 or 2")
        cg = _cta_group(cta_group, fn)
        ides = render(idesc, None, trace)
    else:
        raise OperandError(f"{where()}: {fn} idesc must be a tcgen05.InstrDescriptor or a u32 "
                           f"register, got {idesc!r}")
    d = _tmem_b32(d_tmem, "d_tmem", fn, trace, g)
    if type(a) is Reg and a.type.is_int and a.type.bits == 32:
        av = f"[{_tmem_b32(a, 'a', fn, trace, g)}]"
    else:
        av = _reg64(a, "a", fn, "a u64 shared-memory matrix descriptor or a u32 TMEM address "
                    "register", trace)
    bv = _reg64(b_desc, "b_desc", fn, "a u64 shared-memory matrix descriptor register "
                "(OperandTile.descriptor(..., target='tcgen05'))", trace)
    en = predicate(enable_input_d, "enable_input_d", fn, trace)
    trace.inst(f"tcgen05.mma.cta_group::{cg}.kind::{kind}", (f"[{d}]", av, bv, ides, en), g)


def commit(bar: Any, *, cta_group: int = 1, multicast_mask: Any = None, pred: Any = None) -> None:
    """``tcgen05.commit.cta_group::G.mbarrier::arrive::one.shared::cluster.b64 [bar];``.

    The mbarrier ``bar`` (8-byte aligned shared address) gets one arrival when every
    tcgen05 async instruction this thread issued before it has finished.
    ``multicast_mask`` (an int in 1..0xFFFF or a 16-bit register) arrives on the barrier at
    the same offset in each CTA of the mask (``.multicast::cluster``; an int is moved into
    a ``.b16`` register first).
    """
    fn = "ptx.tcgen05.commit"
    trace = _blackwell(fn)
    g = guard(pred, fn, trace)
    cg = _cta_group(cta_group, fn)
    b = shared_addr(bar, "bar", fn, trace, align=8, size=8)
    op = f"tcgen05.commit.cta_group::{cg}.mbarrier::arrive::one.shared::cluster"
    if multicast_mask is None:
        trace.inst(op + ".b64", (b,), g)
        return
    if type(multicast_mask) is Reg:
        if not multicast_mask.type.is_int or multicast_mask.type.bits != 16:
            raise TypeMismatchError(f"{where()}: {fn} multicast_mask must be a 16-bit register "
                                    f"or an int, got .{multicast_mask.type.name} register "
                                    f"{multicast_mask.name}")
        mask = render(multicast_mask, None, trace)
    else:
        int_in(multicast_mask, "multicast_mask", fn, 1, 0xFFFF)
        r = Reg(trace.new_reg_name(b16), b16, trace)
        trace.inst("mov.b16", (r.name, str(multicast_mask)), g)
        mask = r.name
    trace.inst(op + ".multicast::cluster.b64", (b, mask), g)


# ---------------------------------------------------------------------- data movement
def _ld_st_shape(fn: str, shape: Any, num: Any, regs: list[Reg], offset: Any) -> tuple[int, str]:
    if not isinstance(shape, str) or shape not in LD_SHAPES:
        raise OperandError(f"{where()}: {fn} shape must be one of {', '.join(LD_SHAPES)}, got "
                           f"{shape!r}")
    per, top = LD_SHAPES[shape]
    if num is None:
        num = len(regs) // per
    if not is_int(num) or num < 1 or num > top or num & (num - 1):
        raise OperandError(f"{where()}: {fn} num must be a power of 2 in 1..{top} for {shape}, "
                           f"got {num!r}")
    if len(regs) != per * num:
        raise OperandError(f"{where()}: {fn} {shape}.x{num} moves {per * num} 32-bit registers "
                           f"per thread, got {len(regs)}")
    for i, r in enumerate(regs):
        if r.type.bits != 32 or r.type.is_pred:
            raise TypeMismatchError(f"{where()}: {fn} registers must be 32-bit; regs[{i}] is "
                                    f".{r.type.name} register {r.name}")
    if shape == "16x32bx2":
        int_in(offset, "offset", fn, 0, 0xFFFF, " (the second half's column offset, needed by "
               "16x32bx2)")
    elif offset is not None:
        raise OperandError(f"{where()}: {fn} offset is only for shape 16x32bx2, got "
                           f"offset={offset!r} with {shape}")
    return num, shape


def ld(regs: Any, taddr: Reg, *, shape: str = "32x32b", num: int | None = None,
       pack16: bool = False, offset: int | None = None, pred: Any = None) -> None:
    """``tcgen05.ld.sync.aligned.SHAPE.xNUM{.pack::16b}.b32 {regs}, [taddr]{, offset};``.

    Each thread of the warp receives ``regs`` (per ``num``: 1 register for 32x32b, 16x64b
    and 16x32bx2, 2 for 16x128b, 4 for 16x256b; ``num`` defaults to what ``regs`` holds).
    32x32b: thread ``t`` reads lane ``lane(taddr) + t``, columns ``col(taddr)`` ..
    ``+num-1``. ``pack16`` packs two 16-bit cells into each register. ``offset``: the
    16x32bx2 second half's column offset. Wait with ``wait_ld`` before using ``regs``.
    """
    fn = "ptx.tcgen05.ld"
    trace = _blackwell(fn)
    g = guard(pred, fn, trace)
    rs = reg_list(regs, "regs", fn)
    num, shape = _ld_st_shape(fn, shape, num, rs, offset)
    if not isinstance(pack16, bool):
        raise OperandError(f"{where()}: {fn} pack16 must be True or False, got {pack16!r}")
    t = _tmem_addr(taddr, "taddr", fn, trace)
    ops = [render(rs, None, trace), f"[{t}]"] + ([str(offset)] if offset is not None else [])
    pk = ".pack::16b" if pack16 else ""
    trace.inst(f"tcgen05.ld.sync.aligned.{shape}.x{num}{pk}.b32", tuple(ops), g)


def st(taddr: Reg, regs: Any, *, shape: str = "32x32b", num: int | None = None,
       unpack16: bool = False, offset: int | None = None, pred: Any = None) -> None:
    """``tcgen05.st.sync.aligned.SHAPE.xNUM{.unpack::16b}.b32 [taddr]{, offset}, {regs};``.

    The inverse of ``ld`` (same shapes and counts); ``unpack16`` splits each register into
    two 16-bit cells. Wait with ``wait_st`` before a tcgen05 instruction reads them.
    """
    fn = "ptx.tcgen05.st"
    trace = _blackwell(fn)
    g = guard(pred, fn, trace)
    rs = reg_list(regs, "regs", fn)
    num, shape = _ld_st_shape(fn, shape, num, rs, offset)
    if not isinstance(unpack16, bool):
        raise OperandError(f"{where()}: {fn} unpack16 must be True or False, got {unpack16!r}")
    t = _tmem_addr(taddr, "taddr", fn, trace)
    ops = [f"[{t}]"] + ([str(offset)] if offset is not None else []) + [render(rs, None, trace)]
    up = ".unpack::16b" if unpack16 else ""
    trace.inst(f"tcgen05.st.sync.aligned.{shape}.x{num}{up}.b32", tuple(ops), g)


def cp(taddr: Reg, s_desc: Reg, *, shape: str = "128x256b", cta_group: int = 1,
       pred: Any = None) -> None:
    """``tcgen05.cp.cta_group::G.SHAPE [taddr], s_desc;``: copy a shared-memory matrix
    (u64 descriptor ``s_desc``) into tensor memory, asynchronously (``commit`` tracks it).
    ``shape``: one of ``CP_SHAPES``."""
    fn = "ptx.tcgen05.cp"
    trace = _blackwell(fn)
    g = guard(pred, fn, trace)
    cg = _cta_group(cta_group, fn)
    if shape not in CP_SHAPES:
        raise OperandError(f"{where()}: {fn} shape must be one of {', '.join(CP_SHAPES)}, got "
                           f"{shape!r}")
    t = _tmem_addr(taddr, "taddr", fn, trace)
    s = _reg64(s_desc, "s_desc", fn, "a u64 shared-memory matrix descriptor register", trace)
    trace.inst(f"tcgen05.cp.cta_group::{cg}.{shape}", (f"[{t}]", s), g)


def shift(taddr: Reg, *, cta_group: int = 1, pred: Any = None) -> None:
    """``tcgen05.shift.cta_group::G.down [taddr];``: shift 32-byte rows of the matrix at
    ``taddr`` down one lane, asynchronously."""
    fn = "ptx.tcgen05.shift"
    trace = _blackwell(fn)
    g = guard(pred, fn, trace)
    cg = _cta_group(cta_group, fn)
    trace.inst(f"tcgen05.shift.cta_group::{cg}.down", (f"[{_tmem_addr(taddr, 'taddr', fn, trace)}]",), g)


def _plain(fn: str, op: str, pred: Any) -> None:
    trace = _blackwell(fn)
    trace.inst(op, (), guard(pred, fn, trace))


def wait_ld(*, pred: Any = None) -> None:
    """``tcgen05.wait::ld.sync.aligned;``: this thread's earlier ``ld`` results are in registers."""
    _plain("ptx.tcgen05.wait_ld", "tcgen05.wait::ld.sync.aligned", pred)


def wait_st(*, pred: Any = None) -> None:
    """``tcgen05.wait::st.sync.aligned;``: this thread's earlier ``st`` are in tensor memory."""
    _plain("ptx.tcgen05.wait_st", "tcgen05.wait::st.sync.aligned", pred)


def fence_before_thread_sync(*, pred: Any = None) -> None:
    """``tcgen05.fence::before_thread_sync;``: order earlier tcgen05 work before a following
    barrier or mbarrier arrival."""
    _plain("ptx.tcgen05.fence_before_thread_sync", "tcgen05.fence::before_thread_sync", pred)


def fence_after_thread_sync(*, pred: Any = None) -> None:
    """``tcgen05.fence::after_thread_sync;``: order later tcgen05 work after a preceding
    barrier or mbarrier wait."""
    _plain("ptx.tcgen05.fence_after_thread_sync", "tcgen05.fence::after_thread_sync", pred)
