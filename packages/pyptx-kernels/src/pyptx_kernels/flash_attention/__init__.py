"""Flash attention on Hopper: ``attention`` (dense batches, grouped-query heads, ``bshd`` or
``bhsd`` layout) and ``attention_varlen`` (packed sequences), differentiable, one torch custom
op each (``api``); the kernels and their host functions are in ``forward`` and ``backward``."""

from pyptx_kernels.flash_attention.api import attention, attention_varlen

__all__ = ["attention", "attention_varlen"]
