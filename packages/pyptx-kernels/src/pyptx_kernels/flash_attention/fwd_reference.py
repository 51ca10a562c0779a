"""float64 references of the forward (dense and packed) and the check of a kernel's
``(o, lse)`` against them."""

from __future__ import annotations

import math


def allowed_keys(S, Sk, causal=False, window=(-1, -1), device=None):
    """``(S, Sk)`` bool: key ``j`` allowed for query ``i`` (top-left aligned): ``j <= i``
    causal, ``i - left <= j <= i + right`` with a ``window`` (``-1`` unbounded)."""
    import torch

    from pyptx_kernels.flash_attention.masks import right_reach

    i = torch.arange(S, device=device)[:, None]
    j = torch.arange(Sk, device=device)[None, :]
    ok = torch.ones(S, Sk, dtype=torch.bool, device=device)
    right = right_reach(causal, window)
    if right is not None:
        ok &= j <= i + right
    if window[0] >= 0:
        ok &= j >= i - window[0]
    return ok


def reference(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0):
    """float64 ``(o, lse)`` of dense attention (torch tensors, ``(B, S, H, D)`` layout);
    ``window`` and ``softcap`` as ``build_attention``'s (the soft cap acts on the scaled
    scores: ``softcap * tanh(scale q.k / softcap)``, FlashAttention-3's)."""
    import torch

    B, S, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    qd = q.double().transpose(1, 2)
    kd = k.double().transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    vd = v.double().transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    s = (qd @ kd.transpose(-1, -2)) * sc
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if causal or tuple(window) != (-1, -1):
        s = s.masked_fill(~allowed_keys(S, Sk, causal, window, q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    o = (p @ vd).transpose(1, 2)
    return o, lse


def reference_varlen(q, k, v, cu_q, cu_k, causal=False, scale=None, window=(-1, -1),
                     softcap=0.0):
    """float64 ``(o, lse)`` of packed attention, sequence by sequence."""
    import torch

    cq, ck = cu_q.tolist(), cu_k.tolist()
    Tq, Hq, D = q.shape
    o = torch.zeros(Tq, Hq, D, dtype=torch.float64, device=q.device)
    lse = torch.full((Hq, Tq), float("-inf"), dtype=torch.float64, device=q.device)
    for bi in range(len(cq) - 1):
        a, e, ka, ke = cq[bi], cq[bi + 1], ck[bi], ck[bi + 1]
        if e == a or ke == ka:
            continue
        ob, lb = reference(q[None, a:e], k[None, ka:ke], v[None, ka:ke], causal, scale, window,
                           softcap)
        o[a:e] = ob[0]
        lse[:, a:e] = lb[0]
    return o, lse


def check(o, lse, ref_o, ref_lse, dtype):
    """``(ok, o error, lse error)``. The o error is ``max |o - ref| / max(1, |ref|)``: at most
    2e-2 for bf16 output (P rounded to bf16 before ``P V``: 2**-9 of max |v| <~ 5, plus the
    output's own rounding, 2**-9 relative), 1e-2 for f16 (2**-11 each). lse: relative error
    at most 1e-3 (f32 softmax state, ``ex2``/``lg2.approx`` ~2**-22), -inf exactly where the
    reference is (rows without keys). NaN anywhere (poisoned, unwritten) fails."""
    import torch

    o64 = o.double()
    finite = torch.isfinite(ref_lse)
    if torch.isnan(o64).any():
        return False, float("nan"), float("nan")
    err_o = ((o64 - ref_o).abs() / ref_o.abs().clamp(min=1.0)).max().item() if o.numel() else 0.0
    l64 = lse.double()
    if (torch.isfinite(l64) != finite).any():
        return False, err_o, float("inf")
    err_l = ((l64[finite] - ref_lse[finite]).abs() / ref_lse[finite].abs().clamp(min=1.0)).max().item() \
        if finite.any() else 0.0
    tol = 2e-2 if dtype == "bf16" else 1e-2
    return err_o <= tol and err_l <= 1e-3, err_o, err_l
