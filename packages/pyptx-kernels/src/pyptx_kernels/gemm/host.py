"""The GEMM's host plumbing: ``matmul`` (torch tensors of any strides or JAX arrays, with
``trans_*`` flags, padding and per-layout plans), its kernel caches and its gradient
``GemmBackward``, which ``api`` and the tests call."""

from __future__ import annotations

import functools
import typing

from pyptx.autotune import Config
from pyptx.errors import ConfigError
from pyptx_kernels import _family, _tuning
from pyptx_kernels._common import framework, where
from pyptx_kernels.gemm.config import (
    GEMM_CONFIGS,
    LONG_K,
    GemmConfig,
    default_plan,
    long_k_rates,
)
from pyptx_kernels.gemm.kernel import build_gemm, gemm_tuned
from pyptx_kernels.gemm.scheduler import SplitTailGemm

PLANNER = _tuning.Planner(
    "matmul", lambda kv: {"M": kv["M"], "N": kv["N"], "K": kv["K"]},
    {c.name: Config(config=c.name) for c in GEMM_CONFIGS}, default_plan)
"""The GEMM's plan without timing: the shipped table's for the ``M x N x K`` bucket (op
``"matmul"``), else ``config.default_plan``."""

gemm_planned = _tuning.planned(gemm_tuned, PLANNER)
"""``gemm_tuned`` whose default call takes a saved winner, else ``PLANNER``'s plan (no
timing; ``PYPTX_AUTOTUNE=1`` or ``pyptx_kernels.tune`` time the plans): what ``matmul``
launches."""


def _fail(msg):
    """A ``ConfigError`` whose message starts with the user's ``file:line``."""
    return ConfigError(f"{where()}: {msg}")


@functools.lru_cache(maxsize=256)
def _cached(M, N, K, key, config):
    kw = dict(key)
    if config is None:
        if (N, K, key) not in _warmed:
            _warmed.add((N, K, key))
            _family.in_background(functools.partial(warm_siblings, N, K, key))
        return gemm_planned(M, N, K, **kw)
    return build_gemm(M, N, K, **kw, config=config)


SIBLING_M = (1, 16, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 8192, 16384, 32768)
"""The M of a problem's other buckets whose plans ``warm_siblings`` compiles ahead."""

_warmed: set = set()


def sibling_plans(N, K, key):
    """``{plan name: M}``: each plan a default call of this ``N x K`` problem (``key``: its
    dtypes, layouts and epilogue) takes at some M of ``SIBLING_M`` (the shipped table's, else
    the heuristic's), with the first such M; from ``K >= LONG_K`` every plan the heuristic
    rates at those M (its pick moves with M inside a bucket)."""
    kv = dict(key)
    plans = {}
    for M in SIBLING_M:
        name, _ = PLANNER.choose({"M": M, "N": N, "K": K, **kv})
        plans.setdefault(name, M)
        if K >= LONG_K and M > 192:     # the long-K plan changes with M inside a bucket
            for plan in long_k_rates(M, N):
                plans.setdefault(plan.name, M)
    return plans


def warm_siblings(N, K, key):
    """Trace (once per family) and assemble into the disk cache the kernel of each of
    ``sibling_plans``, so a later call at an M of another bucket launches without running
    ptxas (the first default call of a problem queues this on the background thread)."""
    kv = dict(key)
    for name, M in sibling_plans(N, K, key).items():
        if kv.get("a_major") == "MN":   # A is (K, M): a call pads its rows to 16 bytes
            M += -M % 8
        k = build_gemm(M, N, K, **kv, config=GemmConfig.of(name))
        if not isinstance(k, SplitTailGemm):
            _family.assemble(k)


def _pad_to(x, dim, mult, lib):
    n = x.shape[dim]
    extra = -n % mult
    if not extra:
        return x
    if lib == "torch":
        import torch.nn.functional as F

        pad = [0, 0] * (x.ndim - 1 - dim) + [0, extra]
        return F.pad(x, pad)
    import jax.numpy as jnp

    widths = [(0, 0)] * x.ndim
    widths[dim] = (0, extra)
    return jnp.pad(x, widths)


def matmul(a, b, *, bias=None, alpha=1.0, activation=None, out_dtype=None, trans_a=False,
           trans_b=False, config=None):
    """``act(alpha * a @ b + bias)`` with the pyptx GEMM, for torch tensors or JAX arrays.

    torch: ``a``/``b`` may be row-major or transposed views (``w.T``); the layout is read
    off the strides. JAX: ``trans_a=True`` means ``a`` is given as ``(K, M)``,
    ``trans_b=True`` that ``b`` is given as ``(N, K)`` (``x @ w.T`` is
    ``matmul(x, w, trans_b=True)``). The tile configuration is a winner saved for the
    shape, else the shipped table's or the heuristic's (``gemm_planned``: nothing is timed
    unless asked, ``docs/tuning.md``); ``config`` fixes it (``GemmConfig.of``: a
    ``GemmConfig``, a tuned plan's name or a mapping of its fields).
    The result is ``(M, N)``; a contiguous dimension whose rows are not a multiple of
    16 bytes is zero-padded first (and the result sliced back). An ``a`` of shape
    ``(..., K)`` (activations of a batch of sequences) is one ``(prod(...), K)`` product,
    returned as ``(..., N)``.

    Differentiable (``GemmBackward``: two more GEMMs, a third that recomputes the
    pre-activation when there is an activation, and the bias gradient): in torch when grad
    mode is on and an operand requires grad, and under ``jax.grad``.
    """
    lib = framework(a)
    if len(a.shape) > 2 and len(b.shape) == 2 and not trans_a:   # (..., K) @ (K, N)
        lead = tuple(a.shape[:-1])
        d = matmul(a.reshape(-1, a.shape[-1]), b, bias=bias, alpha=alpha, activation=activation,
                   out_dtype=out_dtype, trans_b=trans_b, config=config)
        return d.reshape(*lead, d.shape[-1])
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise _fail(f"matmul expects a 2-D b and an a of shape (..., K) (2-D with trans_a), "
                    f"got {tuple(a.shape)} and {tuple(b.shape)}")
    cfg = None if config is None else GemmConfig.of(config)
    if lib == "torch":
        seen = (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype,
                None if bias is None else bias.shape, float(alpha), activation, out_dtype,
                trans_a, trans_b, cfg)
        plan = _TORCH_PLANS.get(seen)
        if plan is None:
            plan = _plan(a, b, bias, alpha, activation, out_dtype, trans_a, trans_b, cfg, lib)
            if len(_TORCH_PLANS) >= 1024:
                _TORCH_PLANS.clear()
            _TORCH_PLANS[seen] = plan
    else:
        plan = _plan(a, b, bias, alpha, activation, out_dtype, trans_a, trans_b, cfg, lib)
    if plan.swap_a:
        a = a.T
    if plan.swap_b:
        b = b.T
    if plan.copy_a:
        a = a.contiguous()
    if plan.copy_b:
        b = b.contiguous()
    if plan.pad_a:
        a = _pad_to(a, 1, 8, lib)   # the copy engine reads rows of 16-byte multiples
    if plan.pad_b:
        b = _pad_to(b, 1, 8, lib)
    args = (a, b) if bias is None else (a, b, _pad_to(bias, 0, 8, lib) if plan.pad_bias else bias)
    if _wants_grad(lib, args):
        k = _differentiable(*plan.build, plan.true_shape)
    else:
        k = _cached(*plan.build)
    d = k(*args)
    return d[:plan.M, :plan.N] if plan.crop else d


def _matmul_residual(a, b, residual, *, out_dtype=None, config=None):
    """``a @ b + residual`` for torch tensors, the add in the GEMM's epilogue (internal:
    ``linear_cross_entropy`` accumulates its f32 weight gradient over the token chunks with
    it). ``a (M, K)``, ``b (K, N)`` bf16/f16 of any strides, laid out as ``matmul`` does
    (``g.T`` of a contiguous ``g`` is read MN-major, no copy); ``residual (M, N)`` f32, or
    bf16 with bf16 inputs. Returns a new contiguous ``(M, N)`` tensor in ``out_dtype``
    (``"bf16"`` or ``"f32"``; default: ``residual``'s dtype; an f32 residual may give a
    bf16 result, the sum rounded once). The launcher allocates every output; each output
    element is read from the residual by the thread that writes it, so the kernel itself
    would also be correct writing over the residual. No autograd. Operands the plan pads
    (a contiguous extent not a multiple of 8) get a zero-padded residual and a cropped
    result."""
    from pyptx_kernels._common import dtype_name

    cfg = None if config is None else GemmConfig.of(config)
    rt = dtype_name(residual.dtype)
    out = rt if out_dtype is None else out_dtype
    if rt not in ("bf16", "f32") or tuple(residual.shape) != (a.shape[0], b.shape[1]):
        raise _fail(f"_matmul_residual: residual must be ({a.shape[0]}, {b.shape[1]}) bf16 or "
                    f"f32, got {tuple(residual.shape)} {residual.dtype}")
    if out not in ("bf16", "f32"):
        raise _fail(f"_matmul_residual: out_dtype must be 'bf16' or 'f32', got {out_dtype!r}")
    plan = _plan(a, b, None, 1.0, None, out, False, False, cfg, "torch")
    if plan.swap_a:
        a = a.T
    if plan.swap_b:
        b = b.T
    if plan.copy_a:
        a = a.contiguous()
    if plan.copy_b:
        b = b.contiguous()
    if plan.pad_a:
        a = _pad_to(a, 1, 8, "torch")
    if plan.pad_b:
        b = _pad_to(b, 1, 8, "torch")
    M, N, K, key, plan_cfg = plan.build
    key = tuple(sorted(dict(key, residual=True if rt == out else rt).items()))
    r = _fit(residual, (M, N), "torch").contiguous()
    d = _cached(M, N, K, key, plan_cfg)(a, b, r)
    return d[:plan.M, :plan.N].contiguous() if plan.crop else d


class _MatmulPlan(typing.NamedTuple):
    """What ``matmul`` does to operands of one layout: views to transpose (``swap_*``),
    copies to make (``copy_*``), 16-byte row paddings (``pad_*``), the kernel's build
    arguments ``(M, N, K, key, config)``, the logical sizes and whether to crop the result.
    Torch plans are kept per shape, strides, dtypes and options (``_TORCH_PLANS``), so a
    repeated call skips the checks."""

    swap_a: bool
    swap_b: bool
    copy_a: bool
    copy_b: bool
    pad_a: bool
    pad_b: bool
    pad_bias: bool
    build: tuple
    true_shape: tuple
    M: int
    N: int
    crop: bool


_TORCH_PLANS: dict = {}


def _plan(a, b, bias, alpha, activation, out_dtype, trans_a, trans_b, cfg, lib):
    """``matmul``'s checks and layout decisions for these 2-D operands (a ``_MatmulPlan``)."""
    swap_a = swap_b = copy_a = copy_b = False
    if lib == "torch":
        if not a.is_contiguous() and a.T.is_contiguous():
            a, trans_a, swap_a = a.T, not trans_a, True
        if not b.is_contiguous() and b.T.is_contiguous():
            b, trans_b, swap_b = b.T, not trans_b, True
        copy_a, copy_b = not a.is_contiguous(), not b.is_contiguous()
    M, K = (a.shape[1], a.shape[0]) if trans_a else tuple(a.shape)
    Kb, N = (b.shape[1], b.shape[0]) if trans_b else tuple(b.shape)
    if Kb != K:
        raise _fail(f"matmul: inner dimensions differ: a is {M}x{K}, b is {Kb}x{N}")
    name = {"bfloat16": "bf16", "float16": "f16"}.get(str(a.dtype).replace("torch.", ""))
    if name is None or str(b.dtype) != str(a.dtype):
        raise _fail(f"matmul: inputs must both be bfloat16 or float16, got {a.dtype} "
                    f"and {b.dtype}")
    out = out_dtype or name
    pad_a, pad_b = a.shape[1] % 8 != 0, b.shape[1] % 8 != 0
    a_cols, b_cols = a.shape[1] + (-a.shape[1] % 8), b.shape[1] + (-b.shape[1] % 8)
    Mk = a_cols if trans_a else M
    Ka = a.shape[0] if trans_a else a_cols
    NB, KB = (b.shape[0], b_cols) if trans_b else (b_cols, b.shape[0])
    ND = N + (-N % 8)
    key = tuple(sorted(dict(dtype=name, out_dtype=out, a_major="MN" if trans_a else "K",
                            b_major="K" if trans_b else "MN", bias=bias is not None,
                            alpha=float(alpha), activation=activation, KB=KB, NB=NB).items()))
    return _MatmulPlan(swap_a, swap_b, copy_a, copy_b, pad_a, pad_b,
                       bias is not None and bias.shape[0] % 8 != 0, (Mk, ND, Ka, key, cfg),
                       (M, N, K, trans_a, trans_b, float(alpha), activation), M, N,
                       ND != N or Mk != M)


def _wants_grad(lib, args):
    """Whether to launch the differentiable kernel: torch when grad mode is on and an operand
    requires grad; JAX always (``jax.custom_vjp`` costs nothing until differentiated)."""
    if lib != "torch":
        return True
    import torch

    return torch.is_grad_enabled() and any(x.requires_grad for x in args)


def activation_grad(z, activation, xp):
    """``act'(z)`` (f32 array ``z``, ``xp`` torch or jax.numpy) of ``_activate``'s forms."""
    if activation == "relu":
        return (z > 0).astype(z.dtype) if xp.__name__.startswith("jax") else (z > 0).to(z.dtype)
    if activation == "silu":
        sig = 1.0 / (1.0 + xp.exp(-z))
        return sig * (1.0 + z * (1.0 - sig))
    c = 0.7978845608028654   # gelu_tanh
    th = xp.tanh(c * (z + 0.044715 * z * z * z))
    return 0.5 * (1.0 + th) + 0.5 * z * (1.0 - th * th) * c * (1.0 + 3 * 0.044715 * z * z)


def _crop(x, shape):
    """The leading ``shape`` block of 2-D ``x`` (``x`` itself when it is that shape)."""
    return x if x.shape == shape else x[:shape[0], :shape[1]]


def _fit(x, shape, lib):
    """``x`` cut or zero-padded to ``shape`` (2-D or 1-D)."""
    if x.shape == tuple(shape):
        return x
    x = x[tuple(slice(0, n) for n in shape)]
    for dim, n in enumerate(shape):
        x = _pad_to(x, dim, n, lib) if x.shape[dim] < n else x
    return x


class GemmBackward:
    """The backward of ``D = act(alpha * A @ B + bias)`` as one kernel-like callable for
    ``pyptx.differentiable_kernel``: ``(A, B[, bias], dD) -> (dA, dB[, dbias])``. With an
    activation, one more GEMM recomputes ``Z = alpha A B + bias`` in f32 and the gradient
    becomes ``G = dD * act'(Z)``; without one ``G = dD``. ``dA = alpha G B^T`` and ``dB =
    alpha A^T G`` are pyptx GEMMs in the layout each operand is stored in (a transposed
    operand gets the transposed product, so no copy is transposed), ``dbias`` the column
    sums of ``G`` in f32. ``G`` is rounded to the inputs' type for the GEMMs; the stored
    operands' zero padding gets zero gradient."""

    def __init__(self, forward, true_shape):
        (self.M, self.N, self.K, self.trans_a, self.trans_b, self.alpha,
         self.activation) = true_shape
        self.in_specs = tuple(forward.in_specs) + tuple(forward.out_specs)
        self.out_specs = tuple(forward.in_specs)
        self.name = f"{forward.name}_backward"
        bias = len(forward.in_specs) == 3
        self.arg_names = (("A", "B", "Bias", "dD", "dA", "dB", "dBias") if bias
                          else ("A", "B", "dD", "dA", "dB"))

    def __call__(self, a, *rest):
        b, dd = rest[0], rest[-1]
        lib = framework(a)
        M, N, K, ta, tb, alpha = self.M, self.N, self.K, self.trans_a, self.trans_b, self.alpha
        a_t = _crop(a, (K, M) if ta else (M, K))
        b_t = _crop(b, (N, K) if tb else (K, N))
        bias = rest[1][:N] if len(rest) == 3 else None
        if lib == "torch":
            import torch as xp

            f32 = xp.float32
            cast = lambda x, dt: x if x.dtype == dt else x.to(dt)  # noqa: E731
        else:
            import jax.numpy as xp

            f32 = xp.float32
            cast = lambda x, dt: x if x.dtype == dt else x.astype(dt)  # noqa: E731
        g = _crop(dd, (M, N))
        if self.activation is not None:
            z = matmul(a_t, b_t, bias=bias, alpha=alpha, out_dtype="f32", trans_a=ta,
                       trans_b=tb)
            g = cast(g, f32) * activation_grad(z, self.activation, xp)
        col = None if bias is None else xp.sum(g, 0, dtype=f32)   # dbias, summed in f32
        g = cast(g, a.dtype)     # a pass over G only where its type is not the inputs'
        if ta:   # A stored (K, M): dA^T = b @ dD^T
            da = matmul(b_t, g, alpha=alpha, trans_a=tb, trans_b=True)
        else:    # (M, K): dD @ b^T
            da = matmul(g, b_t, alpha=alpha, trans_b=not tb)
        if tb:   # stored (N, K): dD^T @ a
            db = matmul(g, a_t, alpha=alpha, trans_a=True, trans_b=ta)
        else:    # (K, N): a^T @ dD
            db = matmul(a_t, g, alpha=alpha, trans_a=not ta)
        grads = (_fit(da, a.shape, lib), _fit(db, b.shape, lib))
        if col is not None:
            grads += (_fit(col, rest[1].shape, lib),)
        return grads

    def __repr__(self):
        return f"<GemmBackward {self.name}>"


@functools.lru_cache(maxsize=256)
def _differentiable(M, N, K, key, config, true_shape):
    from pyptx.autodiff import differentiable_kernel

    fwd = _cached(M, N, K, key, config)
    return differentiable_kernel(fwd, GemmBackward(fwd, true_shape))
