"""The public decode function ``attention_with_kvcache`` (flash-attn's
``flash_attn_with_kvcache`` convention) and its torch custom ops.

Torch: ``torch.ops.pyptx.attention_with_kvcache`` (reads the caches) and, when new ``k, v``
are given, ``torch.ops.pyptx.attention_with_kvcache_append`` (declares
``mutates_args=("k_cache", "v_cache")``: it writes the new rows in place). Two ops, not one:
an op that declared the mutation without doing it would make ``torch.compile``'s
functionalization copy the whole cache on every call. Both return ``(out, lse)`` and have
fake implementations; the ops are defined at the first torch call. JAX arrays go to
``decode_host`` directly; JAX cannot write an input buffer, so the new rows are scattered
into copies of the caches, which the call returns.
"""

from __future__ import annotations

import functools
import math
import numbers
import sys

from pyptx.errors import ConfigError
from pyptx_kernels import _common
from pyptx_kernels._common import fail, framework
from pyptx_kernels.flash_attention.decode_config import (
    HEAD_DIMS,
    MAX_QUERIES,
    MAX_SPLITS,
    PAGE_SIZES,
    DecodeConfig,
)
from pyptx_kernels.flash_attention.decode_kernel import DecodeShape, dense_strides

FN = "attention_with_kvcache"
_MODULES = sys.modules
_DTYPES = {"bfloat16": "bf16", "float16": "f16"}


def _err(msg):
    return fail(ConfigError, FN, msg)


def _dtype_of(x):
    return str(x.dtype).replace("torch.", "")


def _check_arrays(named):
    for name, x in named:
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise _err(f"{name} must be a torch tensor or a JAX array, got {type(x).__name__}")
    if len({framework(x) for _, x in named}) != 1:
        raise _err("inputs mix torch tensors and JAX arrays")
    if framework(named[0][1]) == "torch":
        _common.check_devices(FN, *(x for _, x in named))


#: a stride's limit: 16-byte units (the kernel's s32 scalars) below 2**31
_MAX_STRIDE = 8 * 2**31


def _strides_of(name, x):
    """The element strides of torch tensor ``x`` the kernel reads and writes in place (a
    size-1 dim's taken as dense), None where ``x`` is dense or has no storage (JAX arrays
    are dense; meta and traced tensors are checked when they run); ``ConfigError`` unless
    the last dim is unit-stride, the others are multiples of 8 elements (16 bytes: TMA's
    rule) below 2**34, no two elements share an address and ``x`` starts 16-byte aligned."""
    if framework(x) != "torch" or _common.symbolic(x):
        return None
    dims, dense = tuple(x.shape), dense_strides(tuple(x.shape))
    st = tuple(d if n == 1 else s for n, s, d in zip(dims, x.stride(), dense))
    inner = sorted((s, n) for n, s in zip(dims, st) if n > 1)
    nested = all(s1 >= s0 * n0 for (s0, n0), (s1, _) in zip(inner, inner[1:]))
    if st[-1] != 1 or not nested or any(s % 8 or not 0 < s < _MAX_STRIDE for s in st[:-1]):
        raise _err(f"{name} {dims} must have a unit-stride last dim, its other strides "
                   f"multiples of 8 elements (16 bytes) below 2**34, and no two elements at "
                   f"one address, got strides {tuple(x.stride())}")
    if x.data_ptr() % 16:
        raise _err(f"{name} must start at a 16-byte aligned address, got one {x.data_ptr() % 16}"
                   f" bytes past (storage offset {x.storage_offset()})")
    return None if st == dense else st


def _check_int(name, v, lo, hi):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= int(v) <= hi:
        raise _err(f"{name} must be an int in {lo}..{hi}, got {v!r}")
    return int(v)


def _options(causal, window, softcap, scale, D, num_splits):
    """``(causal, (left, right), softcap, scale, num_splits)`` checked and resolved."""
    if not isinstance(causal, bool):
        raise _err(f"causal must be a bool, got {causal!r}")
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise _err(f"window must be a pair (left, right) of ints >= -1 (-1: unbounded), got "
                   f"{window!r}")
    left, right = (_check_int(f"window[{i}]", w, -1, 2**30) for i, w in enumerate(window))
    for name, x in (("softcap", softcap), ("scale", scale)):
        if x is None and name == "scale":
            continue
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x) \
                or (name == "softcap" and x < 0):
            raise _err(f"{name} must be a finite real number{' >= 0' if name == 'softcap' else ''}"
                       f"{' or None' if name == 'scale' else ''}, got {x!r}")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    splits = _check_int("num_splits", num_splits, 0, MAX_SPLITS)
    return causal, (left, right), float(softcap), scale, splits


def check_call(q, k_cache, v_cache, cache_seqlens, k, v, block_table):
    """``(DecodeShape, dtype name)`` of a valid call, or ``ConfigError`` at the user's line."""
    named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
             ("cache_seqlens", cache_seqlens)]
    if (k is None) != (v is None):
        raise _err("give both k and v (the new rows to append) or neither")
    if k is not None:
        named += [("k", k), ("v", v)]
    if block_table is not None:
        named.append(("block_table", block_table))
    _check_arrays(named)
    if len(q.shape) != 4:
        raise _err(f"q must be (B, Sq, Hq, D), got shape {tuple(q.shape)}")
    B, Sq, Hq, D = (int(d) for d in q.shape)
    if tuple(k_cache.shape) != tuple(v_cache.shape) or len(k_cache.shape) != 4:
        raise _err(f"k_cache and v_cache must have one 4-D shape ((B, Sk_max, Hkv, D), or "
                   f"(num_pages, page_size, Hkv, D) with block_table), got "
                   f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    cache = tuple(int(d) for d in k_cache.shape)
    Hkv = cache[2]
    if not 1 <= Sq <= MAX_QUERIES:
        raise _err(f"q must have 1..{MAX_QUERIES} queries per sequence (q.shape[1]), got {Sq}")
    if D not in HEAD_DIMS or cache[3] != D:
        raise _err(f"head dim must be one of {HEAD_DIMS} and equal in q and the caches, got "
                   f"q {tuple(q.shape)}, caches {cache}")
    if min(B, Hq, Hkv, cache[0], cache[1]) < 1 or Hq % Hkv:
        raise _err(f"the query heads ({Hq}) must be a positive multiple of the cache's KV "
                   f"heads ({Hkv}), with non-empty shapes (q {tuple(q.shape)}, caches {cache})")
    dtypes = {_dtype_of(x) for x in (q, k_cache, v_cache, k, v) if x is not None}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _DTYPES:
        raise _err(f"q, the caches and k/v must share one dtype, bfloat16 or float16, got "
                   f"{', '.join(sorted(dtypes))}")
    if tuple(cache_seqlens.shape) != (B,) or "int32" not in str(cache_seqlens.dtype):
        raise _err(f"cache_seqlens must be int32 of shape ({B},), got {cache_seqlens.dtype} "
                   f"{tuple(cache_seqlens.shape)}")
    max_pages = 0
    if block_table is not None:
        if len(block_table.shape) != 2 or int(block_table.shape[0]) != B \
                or "int32" not in str(block_table.dtype):
            raise _err(f"block_table must be int32 of shape (B={B}, max_pages), got "
                       f"{block_table.dtype} {tuple(block_table.shape)}")
        max_pages = int(block_table.shape[1])
        if max_pages < 1 or cache[1] not in PAGE_SIZES:
            raise _err(f"a paged cache needs page sizes of 16..256 in steps of 16 and a "
                       f"non-empty block_table, got page size {cache[1]}, block_table "
                       f"{tuple(block_table.shape)}")
    elif cache[0] != B:
        raise _err(f"a contiguous cache (no block_table) must be (B={B}, Sk_max, Hkv, D), got "
                   f"{cache}")
    if k is not None:
        want = (B, Sq, Hkv, D)
        if tuple(k.shape) != want or tuple(v.shape) != want:
            raise _err(f"k and v must be (B, Sq, Hkv, D) = {want}, got {tuple(k.shape)} and "
                       f"{tuple(v.shape)}")
    given = (("Q", "q", q), ("KC", "k_cache", k_cache), ("VC", "v_cache", v_cache),
             ("KN", "k", k), ("VN", "v", v))
    strides = tuple((n, st) for n, st in ((n, _strides_of(name, x)) for n, name, x in given
                                          if x is not None) if st is not None)
    return DecodeShape(B, Sq, Hq, Hkv, D, cache, max_pages, k is not None, 0, strides), \
        _DTYPES[next(iter(dtypes))]


# ------------------------------------------------------------------ torch
_SCHEMA_TAIL = ("Tensor cache_seqlens, Tensor? block_table, bool causal, int window_left, "
                "int window_right, float softcap, float scale, int num_splits")
SCHEMAS = {
    "attention_with_kvcache": f"(Tensor q, Tensor k_cache, Tensor v_cache, {_SCHEMA_TAIL}) "
                              f"-> (Tensor, Tensor)",
    "attention_with_kvcache_append": f"(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, "
                                     f"Tensor k, Tensor v, {_SCHEMA_TAIL}) -> (Tensor, Tensor)",
}
_REGISTERED = False


@functools.cache
def _plan(num_splits):
    """The public call's decode plan (torch and JAX) with ``num_splits``."""
    return DecodeConfig(num_splits=num_splits)


def _torch_launch(shape, dtype, causal, left, right, softcap, scale, num_splits, q,
                  dense=False):
    """The launch of a checked call: a function of ``(q, k_cache, v_cache, cache_seqlens,
    k, v, block_table)`` (torch CUDA tensors of ``shape``) returning ``(out, lse)``
    (``decode_host.torch_runner``; ``dense``: the caller knows q, the caches and k/v dense
    (no ``shape.strides``) and the lengths and the table contiguous)."""
    from pyptx_kernels.flash_attention import decode_host

    return _runner(shape, dtype, causal, left, right, softcap, scale, num_splits,
                   q.get_device(), decode_host.device_sms(q), dense)


@functools.lru_cache(maxsize=64)
def _runner(shape, dtype, causal, left, right, softcap, scale, num_splits, index, sms, dense):
    from pyptx_kernels.flash_attention import decode_host

    return decode_host.torch_runner(shape, dtype=dtype, causal=causal, window=(left, right),
                                    softcap=softcap, scale=scale, config=_plan(num_splits),
                                    device_index=index, num_sms=sms, dense=dense)


def _run_torch(q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal, left, right,
               softcap, scale, num_splits):
    shape, dtype = check_call(q, k_cache, v_cache, cache_seqlens, k, v, block_table)
    return _torch_launch(shape, dtype, causal, left, right, softcap, scale, num_splits, q)(
        q, k_cache, v_cache, cache_seqlens, k, v, block_table)


#: eager calls on CUDA tensors already checked: ``_eager_key`` -> ``_torch_launch``'s function
_EAGER = {}
_EAGER_SLOTS = 64
def _eager_key(q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal, window,
               softcap, scale, num_splits):
    """The key of an eager call: each tensor's class, shape, dtype, device, and strides (q,
    the caches, k and v: ``check_call``'s ``DecodeShape.strides``) or contiguity (the
    lengths, the table), each option with its type (so ``1`` never finds the entry of
    ``True``, nor ``-1.0`` a window's ``-1``), the window's container and items likewise.
    Only the keys of calls on plain CUDA tensors that passed every check are stored, so a
    hit needs no check (a start address is checked once per key: torch's views of aligned
    storage at 16-byte strides stay aligned).
    Raises AttributeError, IndexError or TypeError for arguments no stored key can match
    (a non-tensor, a window that is not a pair); an unhashable option makes looking the key
    up raise TypeError. Those calls take the checked path."""
    key = (q.shape, q.dtype, q.device, q.stride(),
           k_cache.__class__, k_cache.shape, k_cache.dtype, k_cache.device, k_cache.stride(),
           v_cache.__class__, v_cache.shape, v_cache.dtype, v_cache.device, v_cache.stride(),
           cache_seqlens.__class__, cache_seqlens.shape, cache_seqlens.dtype,
           cache_seqlens.device, cache_seqlens.is_contiguous(),
           None if k is None else (k.__class__, k.shape, k.dtype, k.device, k.stride()),
           None if v is None else (v.__class__, v.shape, v.dtype, v.device, v.stride()),
           None if block_table is None else (block_table.__class__, block_table.shape,
                                             block_table.dtype, block_table.device,
                                             block_table.is_contiguous()),
           causal.__class__, causal, window.__class__, window[0].__class__,
           window[1].__class__, window if window.__class__ is tuple else tuple(window),
           softcap.__class__, softcap, scale.__class__, scale, num_splits.__class__,
           num_splits)
    return key


def _fake(q):
    import torch

    B, Sq, Hq, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, Hq, Sq), dtype=torch.float32)


@_common.defines_ops
def _register():
    """Define the ``pyptx::attention_with_kvcache*`` custom ops (once)."""
    global _REGISTERED
    if _REGISTERED:
        return True
    import torch

    @torch.library.custom_op("pyptx::attention_with_kvcache", mutates_args=(),
                             schema=SCHEMAS["attention_with_kvcache"])
    def read_op(q, k_cache, v_cache, cache_seqlens, block_table, causal, window_left,
                window_right, softcap, scale, num_splits):
        return _run_torch(q, k_cache, v_cache, cache_seqlens, None, None, block_table, causal,
                          window_left, window_right, softcap, scale, num_splits)

    @read_op.register_fake
    def _(q, *args):
        return _fake(q)

    @torch.library.custom_op("pyptx::attention_with_kvcache_append",
                             mutates_args=("k_cache", "v_cache"),
                             schema=SCHEMAS["attention_with_kvcache_append"])
    def append_op(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, window_left,
                  window_right, softcap, scale, num_splits):
        return _run_torch(q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal,
                          window_left, window_right, softcap, scale, num_splits)

    @append_op.register_fake
    def _(q, *args):
        return _fake(q)

    _REGISTERED = True
    return True


# ------------------------------------------------------------------ JAX
def _jax_append(k_cache, v_cache, cache_seqlens, k, v, block_table):
    """Copies of the caches with ``k, v`` scattered at ``cache_seqlens[b] + i`` (rows past
    the cache's end dropped, as the kernel drops them)."""
    import jax.numpy as jnp

    B, Sq = k.shape[:2]
    pos = cache_seqlens[:, None] + jnp.arange(Sq, dtype=jnp.int32)[None, :]
    if block_table is None:
        rows = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32)[:, None], (B, Sq))
        slots, cap = pos, k_cache.shape[1]
    else:
        ps, mp = k_cache.shape[1], block_table.shape[1]
        cap = ps * mp
        rows = jnp.take_along_axis(block_table, jnp.clip(pos // ps, 0, mp - 1), axis=1)
        slots = pos % ps
    slots = jnp.where(pos < cap, slots, k_cache.shape[1])      # out of range: dropped
    kc = k_cache.at[rows, slots].set(k, mode="drop")
    vc = v_cache.at[rows, slots].set(v, mode="drop")
    return kc, vc


def _run_jax(q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal, window, softcap,
             scale, num_splits):
    from dataclasses import replace

    from pyptx_kernels.flash_attention import decode_host

    shape, dtype = check_call(q, k_cache, v_cache, cache_seqlens, k, v, block_table)
    if k is not None:   # appended functionally; the kernel counts them as already written
        k_cache, v_cache = _jax_append(k_cache, v_cache, cache_seqlens, k, v, block_table)
        shape = replace(shape, append=False, n_new=shape.Sq)
    arrays = [q, k_cache, v_cache, cache_seqlens] + ([block_table] if block_table is not None
                                                     else [])
    out, lse = decode_host.decode(shape, arrays, dtype=dtype, causal=causal, window=window,
                                  softcap=softcap, scale=scale, config=_plan(num_splits))
    return out, lse, k_cache, v_cache


# ------------------------------------------------------------------ public function
def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None,
                           block_table=None, causal=True, window=(-1, -1), softcap=0.0,
                           scale=None, num_splits=0, return_softmax_lse=False):
    """Decode attention of a few new queries against a KV cache (flash-attn's
    ``flash_attn_with_kvcache`` convention). Forward only: decoding needs no backward, and
    the function is not differentiable.

    * ``q (B, Sq, Hq, D)``, 1..16 queries per sequence; bfloat16 or float16, ``D`` 64 or 128.
    * ``k_cache, v_cache``: ``(B, Sk_max, Hkv, D)``, or paged ``(num_pages, page_size, Hkv,
      D)`` (page size 16..256, a multiple of 16) with ``block_table (B, max_pages)`` int32:
      position ``j`` of sequence ``b`` is row ``j % page_size`` of page
      ``block_table[b, j // page_size]``. ``Hq % Hkv == 0``; the query heads of a KV head
      share one read of it.
    * Torch ``q``, caches and ``k, v`` are read (and written) in place with any strides
      whose last dim is unit-stride, the others multiples of 8 elements (16 bytes), no
      two elements at one address, 16-byte aligned: a ``(B, Hkv, S, D)`` cache is passed
      as its ``.transpose(1, 2)``. The strides are kernel parameters (a new layout
      compiles nothing); other strides raise ``ConfigError``.
    * ``cache_seqlens (B,)`` int32: the keys already in each cache, read on the device (no
      host sync; a call can be captured in a CUDA graph and replayed with new lengths). A
      sequence with no keys gets a zero output and ``lse = -inf``.
    * ``k, v (B, Sq, Hkv, D)``: new keys and values, written into the caches at positions
      ``cache_seqlens[b] + i`` inside the kernel (torch; rows past a cache's end are
      dropped), and attended to. ``cache_seqlens`` is not updated: add ``Sq`` yourself, as
      with flash-attn. JAX arrays cannot be written in place: the call returns the updated
      caches after the result, ``(out, k_cache, v_cache)`` (``(out, lse, k_cache, v_cache)``
      with ``return_softmax_lse``).
    * Sequence ``b`` has ``L = cache_seqlens[b] (+ Sq with k, v)`` keys; query ``i`` sits at
      position ``L - Sq + i`` (bottom-right aligned). ``causal``: it sees keys up to its
      position. ``window=(left, right)``: keys in ``[pos - left, pos + right]`` (``-1``:
      unbounded; ``causal`` makes ``right`` 0); only the window's keys are read.
      ``softcap > 0``: scores ``softcap * tanh(s / softcap)``. ``scale`` defaults to
      ``1/sqrt(D)``.
    * ``num_splits``: KV splits per (batch, KV head) combined in a fixed order
      (deterministic); 0 chooses by size and SM count.

    Returns ``out (B, Sq, Hq, D)`` in q's dtype, and with ``return_softmax_lse`` also
    ``lse (B, Hq, Sq)`` float32 (natural log). Bad input raises ``ConfigError`` naming the
    caller's line."""
    torch = _MODULES.get("torch")    # eager torch (never imported here): a checked call?
    if torch is not None and not torch.compiler.is_compiling() and q.__class__ is torch.Tensor:
        try:
            run = _EAGER.get(_eager_key(q, k_cache, v_cache, cache_seqlens, k, v, block_table,
                                        causal, window, softcap, scale, num_splits))
        except (AttributeError, IndexError, TypeError):
            run = None
        if run is not None:
            out, lse = run(q, k_cache, v_cache, cache_seqlens, k, v, block_table)
            return (out, lse) if return_softmax_lse else out
    shape, dtype = check_call(q, k_cache, v_cache, cache_seqlens, k, v, block_table)
    options = (causal, window, softcap, scale, num_splits)
    causal, window, softcap, scale, splits = _options(causal, window, softcap, scale, shape.D,
                                                      num_splits)
    if framework(q) == "jax":
        out, lse, kc, vc = _run_jax(q, k_cache, v_cache, cache_seqlens, k, v, block_table,
                                    causal, window, softcap, scale, splits)
        head = (out, lse) if return_softmax_lse else (out,)
        return (*head, kc, vc) if k is not None else (head if return_softmax_lse else out)
    import torch

    _register()
    tail = (cache_seqlens, block_table, causal, window[0], window[1], softcap, scale, splits)
    tensors = (q, k_cache, v_cache, cache_seqlens, k, v, block_table)
    if not _compiling() and all(type(t) is torch.Tensor and t.is_cuda
                                for t in tensors if t is not None):
        dense = not shape.strides and cache_seqlens.is_contiguous() and \
            (block_table is None or block_table.is_contiguous())
        run = _torch_launch(shape, dtype, *tail[2:], q, dense=dense)
        try:
            key = _eager_key(q, k_cache, v_cache, cache_seqlens, k, v, block_table, *options)
            hash(key)
        except (AttributeError, IndexError, TypeError):
            key = None
        if key is not None:
            if len(_EAGER) >= _EAGER_SLOTS:
                _EAGER.clear()
            _EAGER[key] = run
        out, lse = run(*tensors)
    elif k is None:
        out, lse = torch.ops.pyptx.attention_with_kvcache(q, k_cache, v_cache, *tail)
    else:
        out, lse = torch.ops.pyptx.attention_with_kvcache_append(q, k_cache, v_cache, k, v,
                                                                 *tail)
    return (out, lse) if return_softmax_lse else out


def _compiling():
    import torch

    return torch.compiler.is_compiling()
