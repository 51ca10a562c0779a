"""Addresses and kernel parameters: ``ptx.addr``, ``ptx.global_ptrs``, ``ptx.scalar_param``."""

from __future__ import annotations

import math
from typing import Any

from ..errors import OperandError, RegisterScopeError
from ..ir import Param
from ..reg import Reg, render
from ..smem import SharedArray
from ..source import where
from ..trace import Trace, current
from ..types import PtxType, u64

WIDE_TENSOR_BYTES = 2**32 - 1
"""Tensors larger than this many bytes need 64-bit offsets: sugar refuses 32-bit ones."""


class Addr:
    """A memory operand ``[base+offset]``."""

    __slots__ = ("base", "offset")

    def __init__(self, base: Any, offset: int) -> None:
        self.base = base
        self.offset = offset

    def __ptx_operand__(self, trace: Trace) -> str:
        b = render(self.base, None, trace)
        if self.offset:
            return f"[{b}+{self.offset}]"
        return f"[{b}]"

    def __repr__(self) -> str:
        return f"Addr({self.base!r}, {self.offset})"


def addr(base: Any, offset: int = 0) -> Addr:
    """``[base+offset]``: base is a 64/32-bit register, a shared array, a kernel param or a symbol."""
    if type(base) is Reg:
        if not (base.type.is_int and base.type.bits in (32, 64)):
            raise OperandError(
                f"{where()}: ptx.addr base must be a 32- or 64-bit integer register, got "
                f".{base.type.name} {base.name}"
            )
    elif not (isinstance(base, str) or hasattr(base, "__ptx_operand__")):
        raise OperandError(
            f"{where()}: ptx.addr base must be a register, shared array or param, got {base!r}"
        )
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise OperandError(
            f"{where()}: ptx.addr offset must be a Python int (PTX has no reg+reg addressing); "
            f"got {offset!r}: add registers first, then ptx.addr(sum)"
        )
    # offset == nbytes is the end address; helpers that know the access size check the fit.
    if type(base) is SharedArray and base.nbytes is not None and not 0 <= offset <= base.nbytes:
        raise OperandError(
            f"{where()}: ptx.addr offset {offset} is outside shared array {base.name} "
            f"({base.nbytes} bytes); expected 0 <= offset <= {base.nbytes}"
        )
    return Addr(base, offset)


class TensorParam:
    """A tensor argument of a kernel body: its ``.param`` name, spec and concrete shape."""

    __slots__ = ("name", "spec", "shape", "index", "trace", "_tmap", "tmap_params")

    def __init__(self, name: str, spec: Any, shape: tuple[int, ...], index: int, trace: Trace,
                 tmap: str | None = None, tmap_params: Any = None):
        self.name = name
        self.spec = spec
        self.shape = shape
        self.index = index
        self.trace = trace
        self._tmap = tmap
        #: The ``pyptx.tma.TmaParams`` of this tensor's map (None without one): what a
        #: tile filled from it checks its box and swizzle against.
        self.tmap_params = tmap_params

    @property
    def tmap(self) -> TensorMapParam:
        """This tensor's TMA descriptor parameter (``@kernel(tma={name: ...})``), for
        ``ptx.tma.load_tile``/``store_tile``."""
        if self._tmap is None:
            raise OperandError(
                f"{where()}: tensor {self.name!r} has no tensor map; declare one with "
                f"@kernel(tma={{{self.name!r}: dict(box=(...), swizzle=...)}})"
            )
        return TensorMapParam(self._tmap, self.trace)

    @property
    def dtype(self) -> PtxType:
        """Element type from the spec."""
        return self.spec.dtype

    def __ptx_operand__(self, trace: Trace) -> str:
        if trace is not self.trace:
            raise RegisterScopeError(
                f"{where(4)}: tensor parameter {self.name} belongs to kernel "
                f"{self.trace.func.name!r}, not {trace.func.name!r}"
            )
        return self.name

    def __repr__(self) -> str:
        return f"TensorParam({self.name}: {self.spec!r} = {self.shape})"


class TensorMapParam:
    """A by-value 128-byte ``CUtensorMap`` kernel parameter (``.param .align 64 .b8 name[128]``)."""

    __slots__ = ("name", "trace")

    def __init__(self, name: str, trace: Trace) -> None:
        self.name = name
        self.trace = trace

    def __ptx_operand__(self, trace: Trace) -> str:
        if trace is not self.trace:
            raise OperandError(f"{where(4)}: tensor map {self.name} belongs to another kernel")
        return self.name

    def __repr__(self) -> str:
        return f"TensorMapParam({self.name})"


def global_ptrs(*tensors: TensorParam) -> tuple[Reg, ...]:
    """Load each tensor's pointer param and convert it to a global address (two instructions each)."""
    trace = current()
    out = []
    for i, t in enumerate(tensors):
        if type(t) is not TensorParam:
            raise OperandError(
                f"{where()}: ptx.global_ptrs argument {i} must be a tensor parameter of the "
                f"kernel, got {t!r}"
            )
        if t.trace is not trace:
            raise OperandError(f"{where()}: tensor parameter {t.name} belongs to another kernel")
        raw = Reg(trace.new_reg_name(u64), u64, trace)
        g = Reg(trace.new_reg_name(u64), u64, trace)
        trace.inst("ld.param.u64", (raw.name, f"[{t.name}]"))
        trace.inst("cvta.to.global.u64", (g.name, raw.name))
        nbytes = math.prod(t.shape) * t.spec.dtype.bytes if t.spec is not None and t.shape else 0
        if nbytes > WIDE_TENSOR_BYTES:  # sugar refuses 32-bit offsets into it (reg.py)
            if not hasattr(trace, "wide_pointers"):
                trace.wide_pointers = {}
            trace.wide_pointers[g.name] = (t.name, nbytes)
        out.append(g)
    return tuple(out)


def scalar_param(t: PtxType, value: int | float, name: str = "arg") -> Reg:
    """Declare a scalar ``.param`` passed ``value`` at every launch; return it loaded in a register."""
    trace = current()
    if (not isinstance(t, PtxType) or t.is_pred or t.bits > 64 or t.reg_decl != t.name
            or t.name in ("f16", "f16x2")):  # no ld.param.f16: ptxas rejects both
        raise OperandError(f"{where()}: scalar_param type must be a plain scalar such as u32 or f32, got {t!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OperandError(f"{where()}: scalar_param value must be a Python number, got {value!r}")
    from .. import imm
    imm.encode(value, t)
    pname = trace.unique(name)
    trace.func.params.append(Param(pname, t))
    trace.scalar_params.append((pname, t, value))
    r = Reg(trace.new_reg_name(t), t, trace)
    trace.inst(f"ld.param.{t.name}", (r.name, f"[{pname}]"))
    return r


def bulk_prefetch_l2(src: Any, nbytes: int | Reg, *, pred: Reg | None = None) -> None:
    """``cp.async.bulk.prefetch.L2.global [src], nbytes;``: ask the copy engine to bring
    ``nbytes`` of global memory at ``src`` into L2 (sm_90+). A hint: nothing waits for it.

    ``src`` is a u64 global address register (or ``ptx.addr``), 16-byte aligned at run
    time; ``nbytes`` a positive multiple of 16 below 2**32, or a u32 register holding one;
    ``pred`` issues it only where that predicate holds (say one thread of the CTA).
    """
    trace = current()
    if type(src) is Reg:
        if src.type.bits != 64 or not src.type.is_int:
            raise OperandError(f"{where()}: bulk_prefetch_l2 src must be a 64-bit address register, "
                               f"got .{src.type.name} {src.name}")
        src = Addr(src, 0)
    elif type(src) is not Addr:
        raise OperandError(f"{where()}: bulk_prefetch_l2 src must be an address register or "
                           f"ptx.addr(...), got {src!r}")
    if type(nbytes) is Reg:
        if nbytes.type.bits != 32 or not nbytes.type.is_int:
            raise OperandError(f"{where()}: bulk_prefetch_l2 nbytes register must be 32-bit, got "
                               f".{nbytes.type.name} {nbytes.name}")
    elif isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 < nbytes < 2**32 \
            or nbytes % 16:
        raise OperandError(f"{where()}: bulk_prefetch_l2 nbytes must be a positive multiple of 16 "
                           f"below 2**32, got {nbytes!r}")
    if pred is not None and not (type(pred) is Reg and pred.type.is_pred):
        raise OperandError(f"{where()}: bulk_prefetch_l2 pred must be a predicate register, got {pred!r}")
    trace.inst("cp.async.bulk.prefetch.L2.global",
               (render(src, None, trace), render(nbytes, None, trace)),
               None if pred is None else render(pred, None, trace))
