"""``pyptx.rows``: building blocks of row-wise memory-bound kernels (norms, softmax, SwiGLU).

A row kernel reads each element of a ``(B, N)`` array once and writes each output
element once; a row's values stay in registers between a reduction over the row and
the write. This package holds what such kernels share; the kernels themselves live
in the kernel library's ``pyptx_kernels.rows`` (``rms_norm``, ``layer_norm``,
``softmax``, ``swiglu``).

* ``plan``: ``plan_rows`` picks the launch shape (``RowPlan``: vector width, threads
  per row, chunks per thread, rows per CTA) from ``(B, N, dtype)``;
  ``persistent_plan``/``persistent_ctas`` for the persistent kernels;
  ``reg_cap``/``bwd_ctas`` for the backward ones.
* ``access``: one aligned vector load or store (``load_vec``, ``load_raw_vec`` +
  ``unpack``, ``store_vec``) with explicit cache hints and L2 policies; ``Hints``
  (``hints``, which loads no tracing code) bundles a kernel's choices (``l2_load``,
  ``l2_store``, ``store``, ``pdl_prefetch``).
* ``view``: ``Rows``, the thread's place in a plan inside a kernel body: row
  location, loads and stores of its chunks, and all-reduces over the row's threads
  (shuffles, then shared memory and one ``bar.sync`` for rows of several warps).
* ``loop``: ``row_loop``, the persistent kernels' device loop with the next row's
  loads in flight, and ``row_groups``, the backward kernels' grid-stride loop.
* ``ring``: ``Ring``, rows streamed into a shared-memory ring by the bulk copy engine
  (the TMA ring), with ``ring_plan``/``ring_reg_cap``.
* ``pdl``: the PDL prologue (``entry``) and the L2 prefetch of a CTA's slice.
* ``arith``: ``tree``, ``dot``, ``mul_all``, ``rsqrt``, ``rstd``.
* ``backward``: ``build_norm_backward`` (the norms' two-stage backward skeleton),
  ``build_colsum`` (its second stage) and ``TwoStage``.

Runtime rows: the row count ``B`` is a kernel parameter (``Rows.nrows``) and the persistent
loops stride by the grid (``%nctaid.x``), so a kernel's PTX depends on ``N``, the dtype, the
plan and the arch only; ``B`` sets the grid and the parameter's value at each launch.

No module keeps a setting that changes the emitted PTX: every such choice is an
argument (``Hints``, ``cache=``, ``policy=``), so it is part of the builder's call and
of the kernel it returns. Supported: ``B >= 1``, ``1 <= N <= MAX_N`` (32768) for the
forward kernels and ``MAX_N_BWD`` (8192) for the backward ones, f32 or bf16 storage
with f32 arithmetic. Tensors must be contiguous and their base addresses 16-byte
aligned (fresh torch/jax allocations are 256-byte aligned).

``import pyptx`` does not import this package; ``import pyptx.rows`` imports none of its
modules: each name is loaded at its first use.
"""

_EXPORTS = {
    "KEEP": "hints", "L2_PRIORITIES": "hints", "PINNED": "hints", "STREAM": "hints",
    "Hints": "hints", "l2_policy": "access", "load_raw_vec": "access", "load_vec": "access",
    "store_vec": "access", "unpack": "access", "LOG2E": "arith", "NEG_INF": "arith",
    "dot": "arith", "mul_all": "arith", "rsqrt": "arith", "rstd": "arith", "tree": "arith",
    "TwoStage": "backward", "build_colsum": "backward", "build_norm_backward": "backward",
    "row_groups": "loop", "row_loop": "loop", "cta_slice": "pdl", "entry": "pdl",
    "prefetch_cta_slice": "pdl", "MAX_N": "plan", "MAX_N_BWD": "plan", "WARP": "plan",
    "RowPlan": "plan", "bwd_ctas": "plan", "dtype_of": "plan", "persistent_ctas": "plan",
    "persistent_plan": "plan", "plan_rows": "plan", "reg_cap": "plan", "MAX_RING_BYTES": "ring",
    "Ring": "ring", "ring_plan": "ring", "ring_reg_cap": "ring", "Rows": "view",
}
"""Each public name -> the submodule that defines it (imported at the name's first use)."""


__all__ = list(_EXPORTS)


_SUBMODULES = ("access", "arith", "backward", "hints", "loop", "pdl", "plan", "ring", "view")


def __getattr__(name):
    import importlib

    if name in _SUBMODULES:  # ``rows.access`` without importing it first
        return importlib.import_module(f"{__name__}.{name}")
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
