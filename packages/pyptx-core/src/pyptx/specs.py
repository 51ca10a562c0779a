"""``Tile``, ``Layout`` and symbolic ``Dim``: what a kernel's tensor arguments look like.

A ``Tile`` is a shape (ints or symbolic dim names) plus an element type.
``bind`` unifies the symbolic dims of several tiles with concrete shapes and
reports the first contradiction with the argument and dim it concerns.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from .errors import ShapeError, SpecError, UnboundDimError
from .source import where
from .types import PtxType, from_name


class Dim:
    """A symbolic dimension, bound to a positive int when the kernel is specialized."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise SpecError(f"{where()}: a Dim name must be a Python identifier, got {name!r}")
        self.name = name
        """The dim's name, as used in keywords: ``k.ptx(M=128)``."""

    def __repr__(self) -> str:
        return f"Dim({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dim) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("Dim", self.name))


class Layout(enum.Enum):
    """Memory order of a tile's elements; contiguous row-major is the default."""

    ROW = "row"
    """C order: the last axis is contiguous."""
    COL = "col"
    """Fortran order: the first axis is contiguous."""


DimLike = int | str | Dim
"""What a ``Tile`` dim may be given as: a size, a dim name, or a ``Dim``."""


class Tile:
    """Shape and element type of one tensor argument: ``Tile("M", "K", bf16)``."""

    __slots__ = ("dims", "dtype", "layout")

    def __init__(self, *dims_and_dtype: DimLike | PtxType, layout: Layout = Layout.ROW) -> None:
        if not dims_and_dtype:
            raise SpecError(f"{where()}: Tile needs its dims and an element type last, e.g. "
                            "Tile('M', 'K', f32)")
        *dims, dtype = dims_and_dtype
        if isinstance(dtype, str):
            try:
                dtype = from_name(dtype)
            except KeyError as e:  # UnknownTypeError
                near = _type_spelling(dtype)
                if near is not None:
                    raise SpecError(
                        f"{where()}: Tile element type {dtype!r} is not a pyptx type; did you "
                        f"mean {near!r}? (an element type is a pyptx.types name such as f32, "
                        "bf16 or u32, given last)"
                    ) from None
                if dtype.isidentifier():
                    shown = ", ".join(repr(d) for d in dims_and_dtype)
                    raise SpecError(
                        f"{where()}: Tile({shown}) has no element type: its last argument "
                        f"{dtype!r} is not a PTX type; put the type last, e.g. "
                        f"Tile({shown}, f32)"
                    ) from None
                raise SpecError(f"{where()}: Tile element type: {e.args[0]}") from None
        if not isinstance(dtype, PtxType):
            raise SpecError(
                f"{where()}: Tile's last argument must be the element type (e.g. f32), got "
                f"{dtype!r}"
            )
        if dtype.is_pred:
            raise SpecError(f"{where()}: Tile element type cannot be pred; use u8 for boolean "
                            "tensors")
        out: list[int | Dim] = []
        for i, d in enumerate(dims):
            if isinstance(d, (tuple, list)):
                shown = ", ".join([repr(x) for x in d] + [repr(dtype) if isinstance(dtype, str)
                                                          else dtype.name])
                raise SpecError(f"{where()}: Tile takes its dims as separate arguments, not as "
                                f"a {type(d).__name__}: Tile({shown}), got {d!r} as dim {i}")
            if isinstance(d, bool) or not isinstance(d, (int, str, Dim)):
                raise SpecError(f"{where()}: Tile dim {i} must be an int or a dim name, got {d!r}")
            if isinstance(d, int) and d <= 0:
                raise SpecError(f"{where()}: Tile dim {i} must be positive, got {d}")
            if isinstance(d, str) and _is_type_name(d):
                raise SpecError(f"{where()}: Tile dim {i} {d!r} is an element type, not a dim "
                                f"name; expected one element type, given last (got "
                                f"{dtype.name} last)")
            out.append(Dim(d) if isinstance(d, str) else d)
        if not isinstance(layout, Layout):
            raise SpecError(f"{where()}: Tile layout must be a Layout, got {layout!r}")
        self.dims: tuple[int | Dim, ...] = tuple(out)
        """The shape: ints and symbolic ``Dim`` s, outermost first."""
        self.dtype: PtxType = dtype
        """The element type."""
        self.layout = layout
        """The memory order (``Layout.ROW`` unless given)."""

    @property
    def rank(self) -> int:
        """Number of dims."""
        return len(self.dims)

    @property
    def symbols(self) -> tuple[str, ...]:
        """Names of the symbolic dims, in order of first appearance."""
        return tuple(dict.fromkeys(d.name for d in self.dims if isinstance(d, Dim)))

    def resolve(self, env: Mapping[str, int], what: str = "tile") -> tuple[int, ...]:
        """Concrete shape under ``env``; ``UnboundDimError`` names a missing dim."""
        shape = []
        for d in self.dims:
            if isinstance(d, Dim):
                if d.name not in env:
                    raise UnboundDimError(
                        f"{what}: dim {d.name!r} has no value; pass it as {d.name}=... "
                        f"or through an input whose spec uses it (bound: {dict(env) or 'none'})"
                    )
                shape.append(env[d.name])
            else:
                shape.append(d)
        return tuple(shape)

    def __repr__(self) -> str:
        parts = [repr(d.name) if isinstance(d, Dim) else str(d) for d in self.dims]
        parts.append(self.dtype.name)
        if self.layout is not Layout.ROW:
            parts.append(f"layout={self.layout}")
        return f"Tile({', '.join(parts)})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Tile)
            and other.dims == self.dims
            and other.dtype is self.dtype
            and other.layout is self.layout
        )

    def __hash__(self) -> int:
        return hash((self.dims, self.dtype.name, self.layout))


def _is_type_name(name: str) -> bool:
    try:
        from_name(name)
    except KeyError:
        return False
    return True


def _type_spelling(name: str) -> str | None:
    """The pyptx type name ``name`` looks like a misspelling of (``'fp32'`` -> ``'f32'``), or
    None when it looks like a dim name instead (short names such as ``'M'`` or ``'b'``)."""
    import difflib

    from .types import ALL_TYPES

    if len(name) < 3:
        return None
    known = [t.name for t in ALL_TYPES if not t.is_pred]
    hit = difflib.get_close_matches(name.lower().lstrip("."), known, n=1, cutoff=0.66)
    return hit[0] if hit else None


def bind(
    specs: Sequence[Tile],
    shapes: Sequence[Sequence[int]],
    names: Sequence[str],
    env: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Unify ``specs`` with concrete ``shapes``; return the dim environment.

    ``names`` label the arguments in error messages; ``env`` holds dims already
    known (keyword arguments), which the shapes must agree with.
    """
    out = dict(env or {})
    origin = {k: "keyword argument" for k in out}
    for spec, shape, name in zip(specs, shapes, names):
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__"):
            raise ShapeError(f"argument {name!r}: expected a shape (a tuple of ints) for "
                             f"{spec!r}, got {type(shape).__name__} {shape!r}")
        shape = tuple(shape)
        bad = [n for n in shape
               if isinstance(n, bool) or not hasattr(type(n), "__index__") or n < 0]
        if bad:
            raise ShapeError(f"argument {name!r}: a shape holds non-negative ints, got "
                             f"{bad[0]!r} in {shape}")
        if len(shape) != spec.rank:
            raise ShapeError(
                f"argument {name!r}: expected rank {spec.rank} for {spec!r}, got shape {shape}"
            )
        for axis, (d, n) in enumerate(zip(spec.dims, shape)):
            if isinstance(d, Dim):
                have = out.get(d.name)
                if have is None:
                    out[d.name] = n
                    origin[d.name] = f"argument {name!r} dim {axis}"
                elif have != n:
                    raise ShapeError(
                        f"argument {name!r} dim {axis} ({d.name!r}): expected {have} "
                        f"(from {origin[d.name]}), got {n}"
                    )
            elif d != n:
                raise ShapeError(
                    f"argument {name!r} dim {axis}: expected {d} for {spec!r}, got {n} "
                    f"(shape {shape})"
                )
    return out
