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
  bundles a kernel's choices (``l2_load``, ``l2_store``, ``store``, ``pdl_prefetch``).
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

``import pyptx`` does not import this package; ``import pyptx.rows`` does.
"""

from .access import (
    KEEP,
    L2_PRIORITIES,
    PINNED,
    STREAM,
    Hints,
    l2_policy,
    load_raw_vec,
    load_vec,
    store_vec,
    unpack,
)
from .arith import LOG2E, NEG_INF, dot, mul_all, rsqrt, rstd, tree
from .backward import TwoStage, build_colsum, build_norm_backward
from .loop import row_groups, row_loop
from .pdl import cta_slice, entry, prefetch_cta_slice
from .plan import (
    MAX_N,
    MAX_N_BWD,
    WARP,
    RowPlan,
    bwd_ctas,
    dtype_of,
    persistent_ctas,
    persistent_plan,
    plan_rows,
    reg_cap,
)
from .ring import MAX_RING_BYTES, Ring, ring_plan, ring_reg_cap
from .view import Rows

__all__ = [
    "KEEP", "L2_PRIORITIES", "PINNED", "STREAM", "Hints", "l2_policy", "load_raw_vec", "load_vec",
    "store_vec", "unpack", "LOG2E", "NEG_INF", "dot", "mul_all", "rsqrt", "rstd", "tree",
    "TwoStage", "build_colsum", "build_norm_backward", "row_loop", "row_groups", "cta_slice", "entry", "prefetch_cta_slice", "MAX_N",
    "MAX_N_BWD", "WARP", "RowPlan", "bwd_ctas", "dtype_of", "persistent_ctas", "persistent_plan",
    "plan_rows", "reg_cap", "MAX_RING_BYTES", "Ring", "ring_plan", "ring_reg_cap", "Rows",
]
