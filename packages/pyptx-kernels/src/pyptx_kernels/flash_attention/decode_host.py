"""The decode call's host side: the plan (KV splits by a size heuristic, no timing), the
kernel cache, the split kernel's zeroed arrival counters (``zeroed_counters``), and the
launch on torch tensors or JAX arrays (``decode``; ``torch_runner``: the eager torch
launch of one checked call's sizes, what a repeated ``attention_with_kvcache`` call runs):
one kernel, whose last CTA per (batch, KV head) combines the splits.

Nothing here reads a length on the host: ``cache_seqlens`` stays on the device, the plan
depends on shapes only, so a torch call can be captured in a CUDA graph and replayed with
other lengths.
"""

from __future__ import annotations

import functools

from pyptx_kernels._common import framework, zeroed_words
from pyptx_kernels.flash_attention.decode_config import DEFAULT_CONFIG, MAX_SPLITS
from pyptx_kernels.flash_attention.decode_kernel import (
    STRIDED,
    build_decode,
    counters,
    decode_tiling,
    tensor_names,
)
from pyptx_kernels.flash_attention.fwd_config import H100_SMS

#: decode CTAs per SM the split heuristic aims for. H200 graph-replayed sweeps (32/8 heads,
#: D 128, 4x32-key rings, 3 CTAs fit an SM): one wave of ~2 CTAs per SM streams at 85-94% of
#: copy (B 1 x 32k: 33 splits), where 4 per SM (66 splits) made 1.3 waves of short CTAs and
#: reached 69%; grids already past 1.5 CTAs per SM gain nothing from splitting (B 64 x 1k:
#: 1 split 90%, 2 splits 85%)
CTAS_PER_SM = 2
#: fewest cache positions a split should cover (shorter splits cost more to combine than
#: they gain in parallelism)
MIN_SPLIT_KEYS = 256


def choose_splits(shape, config=None, num_sms=H100_SMS):
    """KV splits per (batch, KV head): ``config.num_splits`` if set, else the count that
    brings the grid nearest ``CTAS_PER_SM`` CTAs per SM (1 when the grid has that many
    already), but no split shorter than ``MIN_SPLIT_KEYS`` of the cache's capacity (lengths
    are on the device: the capacity bounds them). The kernel deals each split an equal
    share of whole blocks (``decode_kernel._split_range``), so every CTA of one wave streams
    about the same bytes."""
    config = DEFAULT_CONFIG if config is None else config
    if config.num_splits:
        return config.num_splits
    _, chunks, _ = decode_tiling(shape, config)
    ctas = shape.B * shape.Hkv * chunks
    capacity = (shape.max_pages * shape.page_size if shape.paged else shape.cache[1]) \
        + shape.n_new
    want = int(CTAS_PER_SM * num_sms / ctas + 0.5)
    return max(1, min(want, capacity // MIN_SPLIT_KEYS, MAX_SPLITS))


@functools.lru_cache(maxsize=16)
def _sms_of(index):
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def device_sms(x):
    """The SM count of torch tensor ``x``'s CUDA device (``H100_SMS`` otherwise: JAX arrays,
    CPU and meta tensors)."""
    if framework(x) == "torch" and x.device.type == "cuda":
        import torch

        index = x.device.index
        return _sms_of(torch.cuda.current_device() if index is None else index)
    return H100_SMS


def zeroed_counters(like, n):
    """``n`` zeroed int32 arrival counters on ``like``'s device for a split decode launch
    (``_common.zeroed_words``: reused per device and stream in torch eager; each launch
    leaves them zeroed)."""
    return zeroed_words(like, n)


@functools.lru_cache(maxsize=256)
def decode_kernel(shape, dtype, causal, window, softcap, scale, config, num_sms=H100_SMS):
    """``(kernel, splits)``: the one-launch decode kernel of one call's sizes and options
    and its KV split count (a new size reuses its family's trace and cubin: no trace, no
    ptxas; a repeated one is a cache hit)."""
    splits = choose_splits(shape, config, num_sms)
    return build_decode(shape, dtype=dtype, causal=causal, window=window, softcap=softcap,
                        scale=scale, splits=splits, config=config), splits


def memory_view(x, span):
    """Torch tensor ``x`` as the kernel takes it: itself (``span`` None: dense), or the flat
    view of the ``span`` elements from its first to its last (``DecodeShape.span``: the
    kernel reads its strides from scalar parameters)."""
    return x if span is None else x.as_strided((span,), (1,))


def kernel_inputs(shape, arrays):
    """``arrays`` (``build_decode``'s inputs in order, without the counters) with each
    tensor of ``shape.strides`` as its ``memory_view``."""
    names = tensor_names(shape, 1)[0]
    return [memory_view(x, shape.span(n)) if n in STRIDED else x for n, x in zip(names, arrays)]


def launcher(shape, *, dtype, causal, window, softcap, scale, config, num_sms=H100_SMS):
    """A function of the decode kernel's inputs (``build_decode``'s order, without the
    counters; the tensors of ``shape.strides`` as their ``memory_view``) returning
    ``(o (B, Sq, Hq, D), lse (B, Hq, Sq))``: one launch of the kernel of one call's sizes
    and options, looked up once (a caller that keeps it launches with no Python
    planning)."""
    dec, splits = decode_kernel(shape, dtype, causal, window, softcap, scale, config, num_sms)
    if splits == 1:
        return dec
    n = counters(shape, config)

    def run(*arrays):
        o, lse, _, _ = dec(*arrays, zeroed_counters(arrays[0], n))
        return o, lse
    return run


def torch_runner(shape, *, dtype, causal, window, softcap, scale, config, device_index,
                 num_sms=H100_SMS, dense=True):
    """The eager torch launch of one checked call's sizes and options on CUDA device
    ``device_index``: a function of ``(q, k_cache, v_cache, cache_seqlens, k, v,
    block_table)`` (``attention_with_kvcache``'s order; None for an absent one) returning
    ``(o, lse)``, doing per call only what ``launcher``'s function does on those arguments:
    the inputs in ``build_decode``'s order (``dense=False``: the ``memory_view`` of each
    tensor of ``shape.strides`` and ``.contiguous()`` of the lengths and the table;
    ``dense``: taken as they are, the caller knows them dense), with KV splits the stream's
    zeroed counters, and the kernel's launch.

    The counters: per raw CUDA stream the ``_common.zeroed_words`` tensor of this device and
    size (a launch leaves it zeroed; launches on one stream run in order), looked up with
    ``torch._C``'s raw stream query (no ``torch.cuda.Stream`` object per call); a fresh
    zeroed tensor while the current stream captures a CUDA graph (the graph owns it)."""
    dec, splits = decode_kernel(shape, dtype, causal, window, softcap, scale, config, num_sms)
    paged, append = shape.paged, shape.append
    if splits == 1:
        cnt = None
    else:
        import torch

        n, per_stream = counters(shape, config), {}
        C, int32 = torch._C, torch.int32

        def cnt(like):
            raw = getattr(C, "_cuda_getCurrentRawStream", None)
            capturing = getattr(C, "_cuda_isCurrentStreamCapturing", None)
            if raw is None or capturing is None:    # a torch without the raw queries
                return zeroed_words(like, n)
            if capturing():
                return torch.zeros(n, dtype=int32, device=like.device)
            stream = raw(device_index)
            words = per_stream.get(stream)
            if words is None:
                if len(per_stream) >= 16:
                    per_stream.clear()
                words = per_stream[stream] = zeroed_words(like, n)
            return words

    if dense:
        def run(q, k_cache, v_cache, cache_seqlens, k, v, block_table):
            if paged:
                arrays = (q, k_cache, v_cache, cache_seqlens, block_table, k, v) if append \
                    else (q, k_cache, v_cache, cache_seqlens, block_table)
            else:
                arrays = (q, k_cache, v_cache, cache_seqlens, k, v) if append \
                    else (q, k_cache, v_cache, cache_seqlens)
            if cnt is None:
                return dec(*arrays)
            out = dec(*arrays, cnt(q))
            return out[0], out[1]
    else:
        sq, skc, svc, skn, svn = (shape.span(n) for n in STRIDED)

        def run(q, k_cache, v_cache, cache_seqlens, k, v, block_table):
            arrays = [memory_view(q, sq), memory_view(k_cache, skc),
                      memory_view(v_cache, svc), cache_seqlens.contiguous()]
            if paged:
                arrays.append(block_table.contiguous())
            if append:
                arrays += [memory_view(k, skn), memory_view(v, svn)]
            if cnt is None:
                return dec(*arrays)
            out = dec(*arrays, cnt(q))
            return out[0], out[1]
    return run


def decode(shape, arrays, *, dtype, causal, window, softcap, scale, config, num_sms=H100_SMS):
    """``(o (B, Sq, Hq, D), lse (B, Hq, Sq))`` of the decode kernel on ``arrays`` (its
    inputs, in ``build_decode``'s order, without the counters; the tensors of
    ``shape.strides`` as the caller has them). With ``shape.append`` the kernel also writes
    the new rows into the caches (torch only: the buffers are written in place)."""
    return launcher(shape, dtype=dtype, causal=causal, window=window, softcap=softcap,
                    scale=scale, config=config, num_sms=num_sms)(*kernel_inputs(shape, arrays))
