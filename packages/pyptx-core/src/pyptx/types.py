"""PTX scalar types as singletons: ``u32``, ``bf16``, ``f32``, ``pred``, ...

Each type knows its PTX name, its width in bits, its kind (``b`` bit, ``u``
unsigned, ``s`` signed, ``f`` float, ``pred``) and the type a register of it is
declared with (PTX has no ``.reg .bf16``, so those live in ``.b16`` registers).

| kind | types (bits) |
|---|---|
| untyped bits | ``b8``, ``b16``, ``b32``, ``b64``, ``b128`` |
| unsigned | ``u8``, ``u16``, ``u32``, ``u64`` |
| signed | ``s8``, ``s16``, ``s32``, ``s64`` |
| float | ``f16``, ``bf16``, ``tf32`` (32), ``f32``, ``f64``, ``e4m3`` and ``e5m2`` (fp8) |
| packed pairs | ``f16x2``, ``bf16x2`` (32) |
| predicate | ``pred`` |

``bf16``, ``bf16x2``, ``tf32``, ``e4m3`` and ``e5m2`` live in ``.b16``/``.b32``/``.b8``
registers; ``ALL_TYPES`` lists them all and ``from_name("f32")`` looks one up.
"""

from __future__ import annotations

from .errors import PyptxError


class PtxType:
    """One PTX scalar type such as ``.f32``; compare by identity."""

    __slots__ = ("name", "bits", "kind", "reg_decl", "prefix")

    def __init__(self, name: str, bits: int, kind: str, reg_decl: str, prefix: str) -> None:
        self.name = name
        """The PTX spelling without the dot: ``"f32"``."""
        self.bits = bits
        """Width in bits (1 for ``pred``)."""
        self.kind = kind
        """``"b"``, ``"u"``, ``"s"``, ``"f"`` or ``"pred"``."""
        self.reg_decl = reg_decl
        """The type registers of this type are declared with (``"b16"`` for ``bf16``)."""
        self.prefix = prefix
        """The register-name prefix pyptx numbers these registers with (``%f0``, ``%rd3``)."""

    @property
    def bytes(self) -> int:
        """Size in bytes (a predicate counts as 1)."""
        return max(self.bits // 8, 1)

    @property
    def is_float(self) -> bool:
        """True for ``f16``/``bf16``/``tf32``/``f32``/``f64``/``e4m3``/``e5m2`` and packed pairs."""
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        """True for the ``b``/``u``/``s`` integer and bit types."""
        return self.kind in ("b", "u", "s")

    @property
    def is_signed(self) -> bool:
        """True for ``s8``..``s64``."""
        return self.kind == "s"

    @property
    def is_pred(self) -> bool:
        """True for ``pred``."""
        return self.kind == "pred"

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__

    def __reduce__(self) -> str:
        return self.name


def _t(name: str, bits: int, kind: str, reg_decl: str | None = None, prefix: str = "") -> PtxType:
    return PtxType(name, bits, kind, reg_decl or name, prefix or name)


b8 = _t("b8", 8, "b", prefix="b8_")
b16 = _t("b16", 16, "b", prefix="rs")
b32 = _t("b32", 32, "b", prefix="b")
b64 = _t("b64", 64, "b", prefix="bd")
b128 = _t("b128", 128, "b", prefix="q")
u8 = _t("u8", 8, "u", prefix="uc")
u16 = _t("u16", 16, "u", prefix="us")
u32 = _t("u32", 32, "u", prefix="r")
u64 = _t("u64", 64, "u", prefix="rd")
s8 = _t("s8", 8, "s", prefix="sc")
s16 = _t("s16", 16, "s", prefix="ss")
s32 = _t("s32", 32, "s", prefix="ri")
s64 = _t("s64", 64, "s", prefix="rl")
f16 = _t("f16", 16, "f", prefix="h")
f16x2 = _t("f16x2", 32, "f", prefix="hh")
bf16 = _t("bf16", 16, "f", reg_decl="b16", prefix="bh")
bf16x2 = _t("bf16x2", 32, "f", reg_decl="b32", prefix="bhh")
tf32 = _t("tf32", 32, "f", reg_decl="b32", prefix="tf")
f32 = _t("f32", 32, "f", prefix="f")
f64 = _t("f64", 64, "f", prefix="fd")
e4m3 = _t("e4m3", 8, "f", reg_decl="b8", prefix="e4_")
e5m2 = _t("e5m2", 8, "f", reg_decl="b8", prefix="e5_")
pred = _t("pred", 1, "pred", prefix="p")

ALL_TYPES: tuple[PtxType, ...] = (
    b8, b16, b32, b64, b128, u8, u16, u32, u64, s8, s16, s32, s64,
    f16, f16x2, bf16, bf16x2, tf32, f32, f64, e4m3, e5m2, pred,
)
"""Every PTX scalar type pyptx knows."""
_BY_NAME = {t.name: t for t in ALL_TYPES}


class UnknownTypeError(PyptxError, KeyError):
    """A name that is not a PTX scalar type."""

    def __str__(self) -> str:
        return str(self.args[0])


def from_name(name: str) -> PtxType:
    """Return the type named ``name`` (``"f32"`` or ``".f32"``; also numpy/torch names)."""
    key = name.lstrip(".")
    key = _ALIASES.get(key, key)
    try:
        return _BY_NAME[key]
    except KeyError:
        raise UnknownTypeError(
            f"expected a PTX type name such as 'f32', 'bf16' or 'u32', got {name!r}; "
            f"known: {', '.join(_BY_NAME)}"
        ) from None


_ALIASES = {
    "float32": "f32", "float": "f32", "float16": "f16", "half": "f16", "bfloat16": "bf16",
    "float64": "f64", "double": "f64", "int32": "s32", "int64": "s64", "int16": "s16",
    "int8": "s8", "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "bool": "pred", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2",
}


def int_type(bits: int, signed: bool) -> PtxType:
    """The ``u``/``s`` integer type of ``bits`` width."""
    return _BY_NAME[("s" if signed else "u") + str(bits)]


_NUMPY_NAMES = {
    "f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
    "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "b8": "uint8", "b16": "int16", "b32": "int32", "b64": "int64",
    "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2",
}


def numpy_name(t: PtxType) -> str | None:
    """The numpy/torch/jax dtype name that holds elements of ``t`` (None if there is none)."""
    return _NUMPY_NAMES.get(t.name)
