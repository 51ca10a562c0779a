"""Grouped GEMM (mixture-of-experts layers), split by concept:

* ``config``: the plans (``GroupedConfig``, ``WgradConfig``) and their tuned tables;
* ``scheduler``: the persistent walk over ragged groups' tiles, the weight gradient's units;
* ``mainloop``: the opening, the producer's tensor copies, the consumers' ``wgmma``;
* ``epilogue``: the bulk and masked stores;
* ``kernel``: the builders assembling them (``build_grouped``, ``build_grouped_wgrad``,
  ``build_split_reduce``, ``build_wgrad_split``) and their tuned forms;
* ``host``: ``grouped_op`` and the host-level ``grouped_mm`` (torch and JAX);
* ``reference``: the float64 reference;
* ``api``: the public ``grouped_mm`` (the ``pyptx::grouped_mm`` custom op for torch).
"""

from pyptx_kernels.grouped_gemm.api import grouped_mm
from pyptx_kernels.grouped_gemm.config import (
    GROUPED_CONFIGS,
    WGRAD_CONFIGS,
    GroupedConfig,
    WgradConfig,
)
from pyptx_kernels.grouped_gemm.kernel import (
    build_grouped,
    build_grouped_wgrad,
    build_split_reduce,
    build_wgrad_split,
    grouped_tuned,
    wgrad_tuned,
)
from pyptx_kernels.grouped_gemm.reference import random_offsets, reference

__all__ = ["grouped_mm", "GroupedConfig", "WgradConfig", "GROUPED_CONFIGS", "WGRAD_CONFIGS",
           "build_grouped", "build_grouped_wgrad", "build_split_reduce", "build_wgrad_split",
           "grouped_tuned", "wgrad_tuned", "reference", "random_offsets"]
