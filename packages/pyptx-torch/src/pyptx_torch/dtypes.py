"""torch dtype <-> PTX element type, through core's one dtype table (``pyptx.plan.DTYPES``)."""

from __future__ import annotations

from typing import Any

from pyptx.plan import compatible, dtype_name_of
from pyptx.plan import ptx_type_of as _ptx_type_of_name
from pyptx.types import PtxType

__all__ = ["ptx_type_of", "torch_dtype_of", "compatible"]


def ptx_type_of(dtype: Any) -> PtxType | None:
    """The PTX type of a torch dtype, or None if PTX has no such element type."""
    return _ptx_type_of_name(str(dtype).removeprefix("torch."))


def torch_dtype_of(t: PtxType) -> Any:
    """The torch dtype used to allocate tensors of PTX type ``t``."""
    import torch

    return getattr(torch, dtype_name_of(t))
