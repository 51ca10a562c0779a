"""Flash attention on Hopper: ``attention`` (dense batches, grouped-query heads, ``bshd`` or
``bhsd`` layout read in place, sliding ``window``, ``softcap``) and ``attention_varlen``
(packed sequences), differentiable, one torch custom op each (``api``). The forward's modules: ``fwd_config`` (its plans), ``fwd_scheduler``,
``fwd_mainloop``, ``fwd_softmax``, ``masks``, ``fwd_epilogue``, ``fwd_kernel`` (the builders),
``fwd_host`` (host functions, autograd), ``fwd_reference``."""

from pyptx_kernels.flash_attention.api import attention, attention_varlen
from pyptx_kernels.flash_attention.fwd_config import ATTENTION_CONFIGS, SCHEDULES, ForwardConfig
from pyptx_kernels.flash_attention.fwd_kernel import build_attention, build_attention_varlen
from pyptx_kernels.flash_attention.fwd_reference import reference, reference_varlen

__all__ = ["attention", "attention_varlen"]
__all__ += ["ATTENTION_CONFIGS", "SCHEDULES", "ForwardConfig", "build_attention",
            "build_attention_varlen", "reference", "reference_varlen"]
