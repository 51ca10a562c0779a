"""float64 reference of ``attention_with_kvcache`` (numpy arrays): ``reference_decode``.

It follows the kernel's contract (``decode_api``): sequence ``b`` has
``L = cache_seqlens[b] + Sq_new`` keys (the new ``k, v`` written at positions
``cache_seqlens[b] + i``), query ``i`` sits at ``L - Sq + i`` and sees keys
``pos - left <= j <= pos + right`` (``causal``: right = 0; -1 unbounded), scores
``scale * q.k`` or ``softcap * tanh(scale * q.k / softcap)``.
"""

from __future__ import annotations

import math

import numpy as np


def gather_cache(cache, b, n, block_table=None):
    """The first ``n`` rows ``(n, Hkv, D)`` of sequence ``b``'s cache (paged through
    ``block_table``)."""
    if block_table is None:
        return cache[b, :n]
    ps = cache.shape[1]
    pos = np.arange(n)
    return cache[block_table[b, pos // ps], pos % ps]


def append_to_cache(k_cache, v_cache, cache_seqlens, k, v, block_table=None):
    """Copies of the caches with the new ``k, v (B, Sq, Hkv, D)`` written at positions
    ``cache_seqlens[b] + i`` (rows past the cache's end skipped, as the kernel does)."""
    kc, vc = k_cache.copy(), v_cache.copy()
    B, Sq = k.shape[:2]
    for b in range(B):
        for i in range(Sq):
            p = int(cache_seqlens[b]) + i
            if block_table is None:
                if p < kc.shape[1]:
                    kc[b, p], vc[b, p] = k[b, i], v[b, i]
            else:
                ps = kc.shape[1]
                if p < block_table.shape[1] * ps:
                    pg = block_table[b, p // ps]
                    kc[pg, p % ps], vc[pg, p % ps] = k[b, i], v[b, i]
    return kc, vc


def reference_decode(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None, block_table=None,
                     causal=True, window=(-1, -1), softcap=0.0, scale=None):
    """float64 ``(o (B, Sq, Hq, D), lse (B, Hq, Sq), k_cache, v_cache)``: the output, the
    natural-log sums (``-inf`` for a query without keys, whose ``o`` is 0) and the caches
    after the append."""
    q = np.asarray(q, np.float64)
    B, Sq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    G = Hq // Hkv
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    kc, vc = (k_cache, v_cache) if k is None else append_to_cache(
        k_cache, v_cache, cache_seqlens, k, v, block_table)
    n_new = 0 if k is None else Sq
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    o = np.zeros((B, Sq, Hq, D))
    lse = np.full((B, Hq, Sq), -np.inf)
    for b in range(B):
        L = int(cache_seqlens[b]) + n_new
        kb = np.repeat(np.asarray(gather_cache(kc, b, L, block_table), np.float64), G, 1)
        vb = np.repeat(np.asarray(gather_cache(vc, b, L, block_table), np.float64), G, 1)
        s = np.einsum("qhd,khd->hqk", q[b], kb) * sc
        if softcap:
            s = softcap * np.tanh(s / softcap)
        pos = L - Sq + np.arange(Sq)[:, None]
        j = np.arange(L)[None, :]
        ok = np.ones((Sq, L), bool)
        if left >= 0:
            ok &= j >= pos - left
        if right >= 0:
            ok &= j <= pos + right
        s = np.where(ok[None], s, -np.inf)
        if L == 0:
            continue
        mx = s.max(-1, keepdims=True)
        mx = np.where(np.isfinite(mx), mx, 0.0)
        ex = np.exp(s - mx)
        tot = ex.sum(-1, keepdims=True)
        p = np.where(tot > 0, ex / np.where(tot > 0, tot, 1.0), 0.0)
        with np.errstate(divide="ignore"):
            lse[b] = (np.log(tot) + mx)[..., 0]
        o[b] = np.einsum("hqk,khd->qhd", p, vb)
    return o, lse, kc, vc
