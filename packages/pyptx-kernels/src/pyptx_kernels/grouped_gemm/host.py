"""The grouped GEMM's host plumbing: the differentiable op of one shape (``grouped_op``: the
forward kernel, and the backward's two launches in ``GroupedBackward``) and ``grouped_mm`` for
torch tensors and JAX arrays (checks, zero-padding of K and N to multiples of 8, ``b``'s
layout read from its strides, and a cache of checked torch call signatures)."""

from __future__ import annotations

import functools
import sys

from pyptx.autodiff import differentiable_kernel
from pyptx.autotune import Config
from pyptx_kernels import _family, _tuning
from pyptx_kernels._common import framework
from pyptx_kernels.grouped_gemm.config import (
    GROUPED_CONFIGS,
    WGRAD_CONFIGS,
    GroupedConfig,
    WgradConfig,
    default_plan,
    error,
    wgrad_default_plan,
)
from pyptx_kernels.grouped_gemm.kernel import (
    build_grouped,
    build_grouped_wgrad,
    build_wgrad_split,
    grouped_tuned,
    wgrad_tuned,
)


def _planner(op, sizes, table, heuristic):
    return _tuning.Planner(op, lambda kv: {k: kv[k] for k in sizes},
                           {c.name: Config(**c.tuner_kwargs()) for c in table}, heuristic)


PLANNER = _planner("grouped_mm", ("M", "N", "K", "G", "b_major"), GROUPED_CONFIGS,
                   default_plan)
"""The forward's (and dA's) plan without timing: the shipped table's for the bucket (op
``"grouped_mm"``), else ``config.default_plan``."""

grouped_planned = _tuning.planned(grouped_tuned, PLANNER)
"""``grouped_tuned`` whose default call takes a saved winner, else ``PLANNER``'s plan; timed
only when asked."""

wgrad_planned = _tuning.planned(wgrad_tuned, _planner(
    "grouped_mm_wgrad", ("M", "KX", "NY", "G"), WGRAD_CONFIGS, wgrad_default_plan))
"""``wgrad_tuned`` planned the same way (op ``"grouped_mm_wgrad"``,
``config.wgrad_default_plan``)."""


def _to_bf16(x):
    if "bfloat16" in str(x.dtype):
        return x
    if framework(x) == "torch":
        import torch

        return x.to(torch.bfloat16)
    import jax.numpy as jnp

    return x.astype(jnp.bfloat16)


class GroupedBackward:
    """The backward of the grouped GEMM as one kernel-like callable for
    ``pyptx.differentiable_kernel``: ``(A, B, offs, dD) -> (dA, dB)``, two launches
    (the grouped kernel with B in the other major order, then the weight gradient)."""

    def __init__(self, forward, dgrad, wgrad, b_major):
        self.dgrad, self.wgrad, self.b_major = dgrad, wgrad, b_major
        self.in_specs = tuple(forward.in_specs) + tuple(forward.out_specs)
        self.out_specs = (forward.in_specs[0], forward.in_specs[1])
        self.name = f"{forward.name}_backward"
        self.arg_names = ("A", "B", "Offs", "dD", "dA", "dB")
        self.kernels = (dgrad, wgrad)

    def __call__(self, a, b, offs, dd):
        """``(dA, dB)`` (dB in B's own layout)."""
        dd = _to_bf16(dd)
        da = self.dgrad(dd, b, offs)
        db = self.wgrad(a, dd, offs) if self.b_major == "MN" else self.wgrad(dd, a, offs)
        return da, db

    def __repr__(self):
        return f"<GroupedBackward {self.name}>"


SIBLING_M = (64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
"""The total rows of a problem's other buckets whose forward plans ``warm_siblings`` compiles
ahead."""

_warmed: set = set()


def sibling_plans(N, K, G, b_major):
    """``{plan name: M}``: each forward plan a default call of this problem takes at some M
    of ``SIBLING_M`` (the shipped table's, else the heuristic's), with the first such M."""
    plans = {}
    for M in SIBLING_M:
        name, _ = PLANNER.choose({"M": M, "N": N, "K": K, "G": G, "b_major": b_major})
        plans.setdefault(name, M)
    return plans


def warm_siblings(N, K, G, b_major, out_dtype):
    """Trace (once per family) and assemble into the disk cache the forward kernel of each of
    ``sibling_plans``, so a later call whose total rows fall in another bucket launches
    without running ptxas (a problem's first default call queues this in the background)."""
    by_name = {c.name: c for c in GROUPED_CONFIGS}
    for name, M in sibling_plans(N, K, G, b_major).items():
        _family.assemble(build_grouped(M, N, K, G, b_major=b_major, out_dtype=out_dtype,
                                       config=by_name[name]))


@functools.lru_cache(maxsize=128)
def grouped_op(M, N, K, G, b_major="MN", out_dtype="bf16", config=None, wgrad_config=None):
    """The differentiable grouped GEMM for one shape: a ``DifferentiableKernel`` taking
    ``(A (M, K), B (G, K, N) or (G, N, K), offs (G,))``. ``config``: the ``GroupedConfig`` of
    the forward, also the dA launch's (with bulk stores) and the dB launch's tile
    (``None``: each planned: a saved winner, else the table's or heuristic's plan). ``wgrad_config``: a ``WgradConfig`` for the dB launch alone
    (``build_wgrad_split``: ``splits > 1`` adds the split reduction), overriding ``config``
    there."""
    flip = "K" if b_major == "MN" else "MN"
    kx, ny = (K, N) if b_major == "MN" else (N, K)
    if config is None:
        if (N, K, G, b_major, out_dtype) not in _warmed:
            _warmed.add((N, K, G, b_major, out_dtype))
            _family.in_background(functools.partial(warm_siblings, N, K, G, b_major, out_dtype))
        fwd = grouped_planned(M, N, K, G, b_major=b_major, out_dtype=out_dtype)
        dgrad = grouped_planned(M, K, N, G, b_major=flip, out_dtype="bf16")
    else:
        fwd = build_grouped(M, N, K, G, b_major=b_major, out_dtype=out_dtype, config=config)
        dgrad = build_grouped(M, K, N, G, b_major=flip, out_dtype="bf16", config=config.dgrad())
    if wgrad_config is not None:
        wgrad = build_wgrad_split(M, kx, ny, G, out_dtype="bf16", config=wgrad_config)
    elif config is None:
        wgrad = wgrad_planned(M, kx, ny, G, out_dtype="bf16")
    else:
        wgrad = build_grouped_wgrad(M, kx, ny, G, out_dtype="bf16", config=config.wgrad())
    return differentiable_kernel(fwd, GroupedBackward(fwd, dgrad, wgrad, b_major),
                                 num_grad_inputs=2)


def _pad_last(x, mult, lib, dim=-1):
    n = x.shape[dim]
    extra = -n % mult
    if not extra:
        return x
    if lib == "torch":
        import torch.nn.functional as F

        d = dim % x.ndim
        return F.pad(x, [0, 0] * (x.ndim - 1 - d) + [0, extra])
    import jax.numpy as jnp

    widths = [(0, 0)] * x.ndim
    widths[dim] = (0, extra)
    return jnp.pad(x, widths)


_CALLS: dict = {}
"""Torch call signatures ``grouped_mm`` has checked (no padding, tuned config) -> whether
``b`` is read through its transpose, and the ``grouped_op`` arguments."""
_CALLS_SIZE = 256


def _call_key(a, b, offs, out_dtype, trans_b):
    """The signature of a torch call that decides all of ``grouped_mm``'s checks and
    arguments (types, shapes, dtypes, ``b``'s strides); None while torch.compile traces
    (the traced path keeps the checks) or where a dim is symbolic."""
    if sys.modules["torch"].compiler.is_compiling():
        return None
    try:
        key = (a.__class__, a.shape, a.dtype, b.__class__, b.shape, b.stride(), b.dtype,
               offs.__class__, offs.shape, offs.dtype, out_dtype, trans_b)
        hash(key)
    except (TypeError, RuntimeError):  # symbolic dims; a layout without strides
        return None
    return key


def grouped_mm(a, b, offs, *, out_dtype=None, trans_b=False, config=None, wgrad_config=None):
    """``out[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g]`` for torch tensors or JAX arrays.

    ``a``: ``(M, K)`` bf16; ``b``: ``(G, K, N)`` bf16 (torch: a transposed view of a
    ``(G, N, K)`` tensor is read K-major without a copy; JAX: ``trans_b=True`` means ``b``
    is given as ``(G, N, K)``); ``offs``: ``(G,)`` int32 on the device. ``out_dtype``:
    ``"bf16"`` (default) or ``"f32"``. Differentiable in ``a`` and ``b`` (torch autograd,
    ``jax.grad``). ``config``: a ``GroupedConfig`` (default: planned per shape without
    timing, ``docs/tuning.md``); ``wgrad_config``: a ``WgradConfig`` of the weight-gradient
    kernel alone (e.g. ``WgradConfig(splits=2)``,
    opt-in and untuned). Rows past ``offs[-1]`` are not written. K or N not a multiple of 8 is
    zero-padded.
    """
    lib = framework(a)
    plain = config is None and wgrad_config is None
    key = _call_key(a, b, offs, out_dtype, trans_b) if lib == "torch" and plain else None
    if key is not None:
        hit = _CALLS.get(key)
        if hit is not None:  # a signature checked before: skip the checks and the padding
            flip, op_args = hit
            if flip:
                b = b.transpose(-2, -1)
            return grouped_op(*op_args)(a.contiguous(), b.contiguous(), offs)
    for plan, cls, what in ((config, GroupedConfig, "config"),
                            (wgrad_config, WgradConfig, "wgrad_config")):
        if plan is not None and not isinstance(plan, cls):
            raise error(f"grouped_mm: {what} must be a {cls.__name__} or None, got {plan!r}")
    flip = False
    if len(a.shape) != 2 or len(b.shape) != 3 or len(offs.shape) != 1:
        raise error(f"grouped_mm expects a (M, K), b (G, K, N) and offs (G,), got "
                    f"{tuple(a.shape)}, {tuple(b.shape)} and {tuple(offs.shape)}")
    if lib == "torch":
        bt = b.transpose(-2, -1)
        if not b.is_contiguous() and bt.is_contiguous():
            b, trans_b, flip = bt, True, True
        a, b = a.contiguous(), b.contiguous()
    M, K = a.shape
    G = b.shape[0]
    Kb, N = (b.shape[2], b.shape[1]) if trans_b else (b.shape[1], b.shape[2])
    if Kb != K or offs.shape[0] != G:
        raise error(f"grouped_mm: a is {M}x{K}, b holds {G} groups of {Kb}x{N} and offs "
                    f"has {offs.shape[0]} entries")
    for x, what in ((a, "a"), (b, "b")):
        if "bfloat16" not in str(x.dtype):
            raise error(f"grouped_mm: {what} must be bfloat16, got {x.dtype}")
    if "int32" not in str(offs.dtype):
        raise error(f"grouped_mm: offs must be int32, got {offs.dtype}")
    out = out_dtype or "bf16"
    a = _pad_last(a, 8, lib)
    b = _pad_last(_pad_last(b, 8, lib), 8, lib, dim=1)  # both of b's matrix dims
    Kp, Np = a.shape[1], (b.shape[1] if trans_b else b.shape[2])
    op_args = (M, Np, Kp, G, "K" if trans_b else "MN", out, config, wgrad_config)
    op = grouped_op(*op_args)
    if key is not None and Np == N and Kp == K:
        if len(_CALLS) >= _CALLS_SIZE:
            _CALLS.clear()
        _CALLS[key] = (flip, op_args)
    d = op(a, b, offs)
    return d[:, :N] if Np != N else d


