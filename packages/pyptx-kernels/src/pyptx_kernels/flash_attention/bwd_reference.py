"""float64 references of attention's gradients, for the tests and the GPU checks."""

from __future__ import annotations

import math


def reference(q, k, v, do, causal=False, scale=None, window=(-1, -1), softcap=0.0):
    """float64 torch reference: ``(o, lse, dq, dk, dv)`` by autograd of attention; ``window``
    and ``softcap`` as the forward's (``fwd_reference.reference``: the cap on the scaled
    scores, before the mask)."""
    import torch

    with torch.enable_grad():  # also inside an autograd Function's forward
        return _reference(torch, q, k, v, do, causal, scale, tuple(window), softcap)


def _reference(torch, q, k, v, do, causal, scale, window=(-1, -1), softcap=0.0):
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    G = q.shape[2] // k.shape[2]
    qd = q.detach().double().requires_grad_()
    kd = k.detach().double().requires_grad_()
    vd = v.detach().double().requires_grad_()
    kx = kd.repeat_interleave(G, dim=2)
    vx = vd.repeat_interleave(G, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", qd, kx) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if causal or window != (-1, -1):
        from pyptx_kernels.flash_attention.fwd_reference import allowed_keys

        ok = allowed_keys(q.shape[1], k.shape[1], causal, window, q.device)
        s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s.detach(), dim=-1)
    empty = torch.isinf(lse)[..., None]                 # rows without keys: P = 0
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    o = torch.einsum("bhij,bjhd->bihd", p, vx)
    o.backward(do.double())
    return o.detach().contiguous(), lse.detach().contiguous(), qd.grad, kd.grad, vd.grad


def _lse(q, k, causal, chunk=512):
    """float32 log-sum-exp of scaled scores, (B, H, S), in query chunks."""
    import torch

    B, S, H, D = q.shape
    out = torch.empty(B, H, S, device=q.device, dtype=torch.float32)
    kt = k.float().permute(0, 2, 3, 1)
    for i in range(0, S, chunk):
        s = torch.einsum("bihd,bhdj->bhij", q[:, i:i + chunk].float(), kt) / math.sqrt(D)
        if causal:
            rows = torch.arange(i, min(S, i + chunk), device=q.device)[:, None]
            s = s.masked_fill(torch.arange(S, device=q.device)[None, :] > rows, float("-inf"))
        out[:, :, i:i + chunk] = torch.logsumexp(s, dim=-1)
    return out
