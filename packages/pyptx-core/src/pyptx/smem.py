"""Shared memory: static allocations with alignment, and the dynamic (extern) window."""

from __future__ import annotations

import math
import sys

from .errors import OperandError, RegisterScopeError
from .ir import SharedDecl
from .reg import Reg
from .source import _is_internal, where
from .trace import Trace, current
from .types import PtxType, b8, u32

STATIC_SMEM_LIMIT = 48 * 1024

__all__ = ["SharedArray", "alloc", "dynamic", "STATIC_SMEM_LIMIT"]


class SharedArray:
    """A named ``.shared`` allocation; use it in ``ptx.addr(buf, off)`` or take ``buf.addr()``."""

    __slots__ = ("name", "type", "shape", "align", "trace")

    def __init__(self, name: str, type: PtxType, shape: tuple[int, ...] | None, align: int,
                 trace: Trace) -> None:
        self.name = name
        self.type = type
        self.shape = shape
        self.align = align
        self.trace = trace

    @property
    def nbytes(self) -> int | None:
        """Size in bytes; None for the dynamic window (its size is set at launch)."""
        if self.shape is None:
            return None
        return math.prod(self.shape) * self.type.bytes

    def addr(self) -> Reg:
        """Emit ``mov.u32 r, name`` and return ``r``: the 32-bit shared-window address."""
        trace = current()
        self.__ptx_operand__(trace)
        r = Reg(trace.new_reg_name(u32), u32, trace)
        trace.inst("mov.u32", (r.name, self.name))
        return r

    def __ptx_operand__(self, trace: Trace) -> str:
        if trace is not self.trace:
            raise RegisterScopeError(
                f"{where(4)}: shared array {self.name} belongs to kernel {self.trace.func.name!r}, "
                f"not {trace.func.name!r}"
            )
        return self.name

    def __repr__(self) -> str:
        return f"SharedArray({self.name}: {self.type.name}{list(self.shape or [])})"


def _check_align(align: int) -> None:
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise OperandError(f"{where(3)}: shared alignment must be a power of two, got {align!r}")


def alloc(t: PtxType, shape: int | tuple[int, ...], *, align: int = 16,
          name: str | None = None) -> SharedArray:
    """Declare a static ``.shared`` array of ``shape`` elements of type ``t``.

    Its PTX symbol is ``name`` (``smem`` if not given), made unique within the kernel
    (``smem_1``, ...) when pyptx's own helpers or unnamed allocations reuse it. A name
    the kernel's code gives twice is refused: two allocations meant to be one buffer.
    """
    trace = current()
    given = name is not None and not _is_internal(sys._getframe(1).f_code.co_filename)
    if name is None:
        name = "smem"
    if not isinstance(t, PtxType) or t.is_pred:
        raise OperandError(f"{where()}: smem.alloc expects an element type such as f32, got {t!r}")
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in dims):
        raise OperandError(f"{where()}: smem.alloc shape must be positive ints, got {shape!r}")
    _check_align(align)
    if not isinstance(name, str) or not name.isidentifier():
        raise OperandError(f"{where()}: shared array name must be an identifier, got {name!r}")
    if given:
        _claim_name(trace, name)
    arr = SharedArray(_symbol(trace, name, given), t, dims, align, trace)
    size = arr.nbytes or 0
    trace.shared_bytes = -(-trace.shared_bytes // align) * align + size
    if trace.shared_bytes > STATIC_SMEM_LIMIT:
        raise OperandError(
            f"{where()}: static shared memory would be {trace.shared_bytes} bytes, over the "
            f"{STATIC_SMEM_LIMIT}-byte limit; use smem.dynamic() with @kernel(smem=...) for more"
        )
    decl_t = b8 if t.reg_decl != t.name or t.bits < 8 else t
    count = size if decl_t is b8 else math.prod(dims)
    trace.shared.append(SharedDecl(arr.name, decl_t, align, count))
    return arr


def _symbol(trace: Trace, name: str, given: bool) -> str:
    """A fresh module symbol for ``name`` that is not the kernel's own name (ptxas:
    "inconsistent redefinition"); ``OperandError`` if the kernel's code asked for that name."""
    sym = trace.unique(name)
    if sym == trace.func.name:
        if given:
            raise OperandError(
                f"{where(4)}: shared array name {name!r} is the name of the kernel it is "
                "allocated in (PTX has one namespace for both); expected another name"
            )
        sym = trace.unique(name)
    return sym


def _claim_name(trace: Trace, name: str) -> None:
    """Record ``name`` as given by the kernel's code; ``OperandError`` if it was already."""
    given = trace.smem_names
    first = given.get(name)
    if first is not None:
        raise OperandError(
            f"{where(3)}: smem.alloc(name={name!r}) in kernel {trace.func.name!r}, but {first} "
            f"already allocated a shared array named {name!r}; expected one name per "
            "allocation (reuse the first array, or give this one another name)"
        )
    given[name] = where(3)


def dynamic(t: PtxType = b8, *, align: int = 16, name: str = "dyn_smem") -> SharedArray:
    """The dynamic shared-memory window; its size is ``@kernel(smem=...)`` bytes."""
    trace = current()
    _check_align(align)
    if trace.dynamic_smem:
        raise OperandError(f"{where()}: smem.dynamic() may be declared once per kernel")
    trace.dynamic_smem = where()  # truthy; kernel.py names this line if smem=0
    arr = SharedArray(_symbol(trace, name, name != "dyn_smem"), t, None, align, trace)
    trace.shared.append(SharedDecl(arr.name, b8 if t.reg_decl != t.name else t, align, None))
    return arr
