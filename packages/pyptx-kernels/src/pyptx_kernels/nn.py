"""Drop-in ``torch.nn`` modules whose forward runs the pyptx kernels.

``RMSNorm``, ``LayerNorm`` and ``Linear`` subclass torch's own modules: same constructor,
same parameters (``weight``/``bias``) and initialisation, same ``state_dict`` and
``extra_repr``, and ``isinstance(m, torch.nn.Linear)`` still holds, so code that
initialises or inspects torch modules treats them alike. Only ``forward`` differs: it calls
``pyptx_kernels.rms_norm`` / ``layer_norm`` / ``linear``. ``from_torch(module)`` (a
classmethod of each, and a module-level function dispatching on the type) builds the pyptx
module around the *same* ``Parameter`` objects, so an optimizer and tied weights keep
working. Importing this module imports torch (``import pyptx_kernels`` does not).
"""

from __future__ import annotations

import importlib
import math
import numbers
import os
import sys

import torch

import pyptx
from pyptx.errors import ConfigError

from ._common import PACKAGE_DIR

__all__ = ["RMSNorm", "LayerNorm", "Linear", "from_torch"]


def where() -> str:
    """``file:line`` of the user's call: the nearest frame outside pyptx, pyptx_kernels, torch
    and transformers (a module's ``forward`` is called from torch's, or transformers', code)."""
    dirs = [PACKAGE_DIR, os.path.dirname(pyptx.__file__)] + [
        os.path.dirname(sys.modules[n].__file__) for n in ("torch", "transformers")
        if getattr(sys.modules.get(n), "__file__", None)]
    prefixes = tuple(os.path.abspath(d) + os.sep for d in dirs)
    f = sys._getframe(1)
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(prefixes):
        f = f.f_back
    return "<unknown>:0" if f is None else f"{f.f_code.co_filename}:{f.f_lineno}"


def _op(area: str, name: str):
    """``pyptx_kernels.<area>.api.<name>``, looked up at call time (so it can be swapped, e.g.
    in tests) in ``sys.modules``, which ``torch.compile`` traces (``import_module`` it cannot)."""
    module = f"pyptx_kernels.{area}.api"
    return getattr(sys.modules.get(module) or importlib.import_module(module), name)


def preload(area: str) -> None:
    """Import ``pyptx_kernels.<area>.api`` now (when a module is built, before any compiled
    forward needs it); an API module that does not exist yet waits for the first call."""
    module = f"pyptx_kernels.{area}.api"
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise


def _positive_int(what: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
        raise ConfigError(f"{where()}: {what} must be a positive int, got {v!r}")
    return int(v)


def _shape(cls: str, normalized_shape) -> tuple[int, ...]:
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) \
        else tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list, torch.Size)) \
        else None
    if not shape:
        raise ConfigError(f"{where()}: {cls}: normalized_shape must be an int or a non-empty "
                          f"tuple of ints, got {normalized_shape!r}")
    return tuple(_positive_int(f"{cls}: normalized_shape[{i}]", d) for i, d in enumerate(shape))


def _eps(cls: str, eps, allow_none: bool = False):
    if eps is None and allow_none:
        return None
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (
            math.isfinite(eps) and eps > 0):
        raise ConfigError(f"{where()}: {cls}: eps must be a positive finite number, got {eps!r}")
    return float(eps)


def _rows(x: torch.Tensor, shape: tuple[int, ...], cls: str) -> torch.Tensor:
    """``x`` with its normalized trailing dims flattened into one (the kernels' last dim)."""
    k = len(shape)
    if x.dim() < k or tuple(x.shape[x.dim() - k:]) != shape:
        raise ConfigError(f"{where()}: {cls}: input's trailing dims must be {shape}, "
                          f"got shape {tuple(x.shape)}")
    return x if k == 1 else x.reshape(*x.shape[:x.dim() - k], math.prod(shape))


def _share(new: torch.nn.Module, old: torch.nn.Module, names=("weight", "bias")):
    """``new`` holding ``old``'s Parameters themselves (not copies), in ``old``'s mode."""
    for name in names:
        if name in new._parameters:
            new._parameters[name] = getattr(old, name, None)
    return new.train(old.training)


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` through ``pyptx_kernels.rms_norm``: ``y = x / sqrt(mean(x**2) +
    eps) * weight`` over the trailing ``normalized_shape`` dims. ``eps=None`` takes torch's
    convention (``torch.finfo(x.dtype).eps``); the default here is ``1e-6``."""

    def __init__(self, normalized_shape, eps: float | None = 1e-6, elementwise_affine: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__(_shape("RMSNorm", normalized_shape), _eps("RMSNorm", eps, True),
                         bool(elementwise_affine), device=device, dtype=dtype)
        preload("rows")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = tuple(self.normalized_shape)
        rows = _rows(x, shape, "RMSNorm")
        w = rows.new_ones(rows.shape[-1]) if self.weight is None else self.weight.reshape(-1)
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        return _op("rows", "rms_norm")(rows, w, eps).reshape(x.shape)

    @classmethod
    def from_torch(cls, module: torch.nn.RMSNorm) -> RMSNorm:
        """A pyptx ``RMSNorm`` sharing ``module``'s ``weight`` (a ``torch.nn.RMSNorm``)."""
        _check_type(module, torch.nn.RMSNorm)
        w = module.weight
        new = cls(module.normalized_shape, module.eps, module.elementwise_affine, device="meta",
                  dtype=None if w is None else w.dtype)
        return _share(new, module, ("weight",))


class LayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` through ``pyptx_kernels.layer_norm`` over the trailing
    ``normalized_shape`` dims."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(_shape("LayerNorm", normalized_shape), _eps("LayerNorm", eps),
                         bool(elementwise_affine), bool(bias), device=device, dtype=dtype)
        preload("rows")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = _rows(x, tuple(self.normalized_shape), "LayerNorm")
        w = rows.new_ones(rows.shape[-1]) if self.weight is None else self.weight.reshape(-1)
        b = None if self.bias is None else self.bias.reshape(-1)
        return _op("rows", "layer_norm")(rows, w, b, self.eps).reshape(x.shape)

    @classmethod
    def from_torch(cls, module: torch.nn.LayerNorm) -> LayerNorm:
        """A pyptx ``LayerNorm`` sharing ``module``'s ``weight`` and ``bias``."""
        _check_type(module, torch.nn.LayerNorm)
        w = module.weight
        new = cls(module.normalized_shape, module.eps, module.elementwise_affine,
                  module.bias is not None, device="meta", dtype=None if w is None else w.dtype)
        return _share(new, module)


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` through ``pyptx_kernels.linear``: ``y = x @ weight.T + bias``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(_positive_int("Linear: in_features", in_features),
                         _positive_int("Linear: out_features", out_features), bool(bias),
                         device=device, dtype=dtype)
        preload("gemm")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _op("gemm", "linear")(x, self.weight, self.bias)

    @classmethod
    def from_torch(cls, module: torch.nn.Linear) -> Linear:
        """A pyptx ``Linear`` sharing ``module``'s ``weight`` and ``bias``."""
        _check_type(module, torch.nn.Linear)
        new = cls(module.in_features, module.out_features, module.bias is not None,
                  device="meta", dtype=module.weight.dtype)
        return _share(new, module)


def _check_type(module, kind) -> None:
    if not isinstance(module, kind):
        raise ConfigError(f"{where()}: from_torch: expected a {kind.__module__}.{kind.__name__}, "
                          f"got {type(module).__name__}")


def from_torch(module: torch.nn.Module) -> torch.nn.Module:
    """The pyptx module for a ``torch.nn.RMSNorm``, ``LayerNorm`` or ``Linear`` (subclasses
    included), sharing its Parameters; a pyptx module comes back as is. Other modules raise
    ``ConfigError``."""
    for cls in (RMSNorm, LayerNorm, Linear):
        if isinstance(module, cls):
            return module
    for cls in (RMSNorm, LayerNorm, Linear):
        if isinstance(module, cls.__mro__[1]):
            return cls.from_torch(module)
    raise ConfigError(f"{where()}: from_torch: no pyptx module for {type(module).__name__} "
                      f"(torch.nn.RMSNorm, LayerNorm and Linear have one)")
