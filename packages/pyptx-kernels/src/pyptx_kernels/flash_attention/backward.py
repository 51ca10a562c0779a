"""Flash-attention backward on Hopper tensor cores: ``(dq, dk, dv)`` from ``(q, k, v, o, lse, do)``.

Layouts follow the flash-attention packages: ``q``/``o``/``do`` ``(B, S, Hq, D)``,
``k``/``v`` ``(B, Sk, Hkv, D)`` (grouped-query: q head ``h`` reads kv head
``h // (Hq // Hkv)``), ``lse`` ``(B, Hq, S)`` float32 (natural log of the row sums of
``exp(scale * q k^T)``), bf16 or f16, head dim 64 or 128; ``causal`` is top-left aligned
(key ``j`` is allowed for query ``i`` iff ``j <= i``). Loads go through tensor maps, so rows
past the sequence ends read as zeros; scores past them and above the causal diagonal are
masked to ``P = 0``; gradients are stored with per-row predicates; causal CTAs skip the blocks
wholly above the diagonal.

This module gathers the builder-level names; each concept has its module:

* ``bwd_plan``: ``BackwardPlan``, the frozen choice of a valid plan (which kernels run and how
  they add dQ), its named constructors and ``parse_options`` for command lines;
* ``bwd_host``: ``build_attention_backward(..., plan=)`` -> ``AttentionBackward`` (for
  ``pyptx.differentiable_kernel``) and ``attention_backward``, the direct call;
* ``bwd_dq``: the pair's dQ kernel (``build_dq``: producer and consumer loops);
* ``bwd_dkdv``: the dK/dV kernel (``build_dkdv``) and its dQ-adding, converting and
  stats-computing modes;
* ``bwd_prep``: the stats rows and the pre/post-processing kernels (``build_prep``,
  ``build_convert``);
* ``bwd_fused``: the one-kernel backward at D=64 (``build_fused``);
* ``bwd_varlen``: the packed variable-length pair (``build_attention_backward_varlen``);
* ``bwd_common``: tile sizes, shape checks and trace-time helpers every kernel shares;
* ``bwd_reference``: float64 references; ``bwd_checks``: the GPU self-checks
  (``python -m pyptx_kernels.flash_attention.bwd_checks``).

Environment: ``PYPTX_ATTN_BWD_SAFE=1`` makes ``safe=None`` plans take the simplest schedule
(every block masked, stats read from global memory, each block's products waited for), to
bisect a failure; with it, ``PYPTX_ATTN_BWD_SYNC=1`` also makes the producer wait for each
stage's release before loading the next block.
"""

from __future__ import annotations

import sys

from pyptx_kernels.flash_attention.bwd_common import (
    BM,
    DKDV_BQ,
    LOG2E,
    check_shapes,
    dq_accumulator_width,
    padded,
    safe_default,
)
from pyptx_kernels.flash_attention.bwd_dkdv import RELEASE_ARRIVALS, build_dkdv
from pyptx_kernels.flash_attention.bwd_dq import build_dq
from pyptx_kernels.flash_attention.bwd_fused import FUSED_BKV, FUSED_BQ, build_fused
from pyptx_kernels.flash_attention.bwd_host import (
    AttentionBackward,
    attention_backward,
    build_attention_backward,
)
from pyptx_kernels.flash_attention.bwd_plan import (
    OPTIONS,
    BackwardPlan,
    default_convert_lag,
    default_dq_bkv,
    default_dq_chains,
    default_heavy_first,
    default_stats_lead,
    early_convert_share,
    parse_options,
    resolve_stats_lead,
)
from pyptx_kernels.flash_attention.bwd_prep import build_convert, build_prep
from pyptx_kernels.flash_attention.bwd_reference import reference
from pyptx_kernels.flash_attention.bwd_varlen import (
    VARLEN_REFUSED,
    AttentionBackwardVarlen,
    build_attention_backward_varlen,
    build_dkdv_varlen,
    build_dq_varlen,
    padded_varlen,
)

__all__ = [
    "BM", "DKDV_BQ", "FUSED_BKV", "FUSED_BQ", "LOG2E", "OPTIONS", "RELEASE_ARRIVALS",
    "VARLEN_REFUSED", "AttentionBackward", "AttentionBackwardVarlen", "BackwardPlan",
    "attention_backward", "build_attention_backward", "build_attention_backward_varlen",
    "build_convert", "build_dkdv", "build_dkdv_varlen", "build_dq", "build_dq_varlen",
    "build_fused", "build_prep", "check_shapes", "default_convert_lag", "default_dq_bkv",
    "default_dq_chains", "default_heavy_first", "default_stats_lead", "dq_accumulator_width",
    "early_convert_share",
    "padded", "padded_varlen", "parse_options", "reference", "resolve_stats_lead",
    "safe_default",
]

if __name__ == "__main__":   # the GPU self-checks, as ``python -m ...flash_attention.bwd_checks``
    from pyptx_kernels.flash_attention.bwd_checks import main

    sys.exit(main())
