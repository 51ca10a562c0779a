"""``ptx.special.<sreg>[.x|.y|.z]()``: read a special register into a fresh register.

Each call emits one ``mov`` (PTX allows special registers only there), e.g.
``ptx.special.tid.x()`` -> ``mov.u32 %r0, %tid.x;``.
"""

from __future__ import annotations

from typing import Any

from ..errors import OperandError
from ..reg import Reg
from ..source import where
from ..trace import current
from ..types import PtxType, u32, u64

_VECTOR = ("tid", "ntid", "ctaid", "nctaid", "clusterid", "nclusterid", "cluster_ctaid",
           "cluster_nctaid")
_SCALAR: dict[str, PtxType] = {
    "laneid": u32, "warpid": u32, "nwarpid": u32, "smid": u32, "nsmid": u32, "gridid": u64,
    "lanemask_eq": u32, "lanemask_le": u32, "lanemask_lt": u32, "lanemask_ge": u32,
    "lanemask_gt": u32, "clock": u32, "clock64": u64, "globaltimer": u64,
    "globaltimer_lo": u32, "globaltimer_hi": u32, "cluster_ctarank": u32,
    "cluster_nctarank": u32, "is_explicit_cluster": u32, "dynamic_smem_size": u32,
    "total_smem_size": u32, "aggr_smem_size": u32,
}


def _read(sreg: str, t: PtxType) -> Reg:
    trace = current()
    r = Reg(trace.new_reg_name(t), t, trace)
    if sreg == "is_explicit_cluster":
        from ..types import pred
        r = Reg(trace.new_reg_name(pred), pred, trace)
        trace.inst("mov.pred", (r.name, "%" + sreg))
        return r
    trace.inst(f"mov.{t.name}", (r.name, "%" + sreg))
    return r


class _Vector:
    __slots__ = ("sreg",)

    def __init__(self, sreg: str) -> None:
        self.sreg = sreg

    def x(self) -> Reg:
        """``%<sreg>.x`` as a u32 register."""
        return _read(f"{self.sreg}.x", u32)

    def y(self) -> Reg:
        """``%<sreg>.y`` as a u32 register."""
        return _read(f"{self.sreg}.y", u32)

    def z(self) -> Reg:
        """``%<sreg>.z`` as a u32 register."""
        return _read(f"{self.sreg}.z", u32)

    def __call__(self) -> Reg:
        raise OperandError(
            f"{where()}: %{self.sreg} is a vector; read one component: "
            f"ptx.special.{self.sreg}.x(), .y() or .z()"
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise OperandError(
            f"{where()}: %{self.sreg} has components x, y and z, not {name!r}: "
            f"ptx.special.{self.sreg}.x(), .y() or .z()"
        )


class _Scalar:
    __slots__ = ("sreg", "t")

    def __init__(self, sreg: str, t: PtxType) -> None:
        self.sreg = sreg
        self.t = t

    def __call__(self) -> Reg:
        return _read(self.sreg, self.t)


class _Special:
    """The ``ptx.special`` namespace."""

    def __init__(self) -> None:
        for n in _VECTOR:
            setattr(self, n, _Vector(n))
        for n, t in _SCALAR.items():
            setattr(self, n, _Scalar(n, t))

    def __getattr__(self, name: str):
        raise OperandError(
            f"{where()}: %{name} is not a special register pyptx knows; known: "
            f"{', '.join(_VECTOR + tuple(_SCALAR))}"
        )

    def __dir__(self):
        return list(_VECTOR) + list(_SCALAR)


special = _Special()
"""The special registers: ``ptx.special.tid.x()``, ``ptx.special.laneid()``, ... each read
with one ``mov`` into a new register."""
