"""Call plumbing of ``linear_cross_entropy`` (torch): the chunk loop over tokens, the row
kernel's plan cache, and the gradients formed in the forward.

Per chunk of ``C`` tokens: ``logits = x_c @ W.T (+ b)`` (the library's GEMM, in ``x``'s
dtype), the row kernel (loss per token; the logits overwritten by their scaled gradient
``g``), then ``grad_x_c = g @ W``, ``grad_W += g.T @ x_c`` and ``grad_b += sum(g)``. Only
one chunk's logits exist at a time. The scale (``1 / #valid`` for ``"mean"``) is a device
tensor: nothing waits on the GPU.

``grad_W`` over several chunks (``_weight_grad``) is summed in f32 without a pass of its
own: the first chunk's GEMM writes its product in f32, each middle chunk's GEMM adds the
running sum in its epilogue (``gemm.host._matmul_residual``: f32 in, f32 out), and the last
chunk's GEMM adds it and writes ``W``'s dtype (f32 in, the sum rounded once). Beyond the
product's own write, a ``(V, H)`` gradient moves ``4VH`` bytes for the first chunk, ``8VH``
for a middle one and ``4VH`` for the last (a product in ``W``'s dtype added by torch to a
zeroed f32 sum moved ``12VH`` per chunk: 2.66 vs 2.11 ms per middle chunk at
``V = 128256, H = 2048``, 2048 tokens). A middle chunk holds two f32 sums (the launcher
allocates the GEMM's output).
"""

from __future__ import annotations

import functools

from pyptx_kernels._common import dtype_name


@functools.lru_cache(maxsize=128)
def _row_kernel(T, V, dtype, ignore_index, label_smoothing, z_loss, grad, threads, unroll):
    from pyptx_kernels.cross_entropy.config import CrossEntropyConfig
    from pyptx_kernels.cross_entropy.kernel import build_cross_entropy_rows

    return build_cross_entropy_rows(
        T, V, dtype, ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
        grad=grad, config=CrossEntropyConfig(threads=threads, unroll=unroll))


def rows(logits, target, scale, ignore_index, label_smoothing, z_loss, grad, threads, unroll):
    """``(loss, lse)`` per token of dense ``logits (T, V)``; with ``grad`` the logits are
    overwritten by ``scale * dloss/dlogits`` (the row kernel, ``build_cross_entropy_rows``)."""
    T, V = logits.shape
    k = _row_kernel(T, V, dtype_name(logits.dtype), int(ignore_index), float(label_smoothing),
                    float(z_loss), bool(grad), int(threads), int(unroll))
    return k(logits, target, scale)


def forward(x, weight, target, bias, ignore_index, label_smoothing, z_loss, reduction,
            need_x, need_w, need_b, chunk, threads, unroll):
    """``(loss, grad_x, grad_weight, grad_bias)`` of the mean/sum cross-entropy of
    ``x (T, H) @ weight.T (+ bias)`` against ``target (T,)``; a gradient not asked for is an
    empty tensor. ``loss`` is an f32 scalar; the gradients are in their inputs' dtypes."""
    import torch

    from pyptx_kernels.gemm import api as gemm

    T, V = x.shape[0], weight.shape[0]
    dt = dtype_name(x.dtype)
    target = target.long()
    if reduction == "mean":
        valid = (target != ignore_index).sum(dtype=torch.float32)
        scale = (1.0 / valid.clamp(min=1.0)).reshape(1)
    else:
        scale = torch.ones(1, dtype=torch.float32, device=x.device)
    grad = need_x or need_w or need_b
    empty = lambda: x.new_empty((0,))  # noqa: E731
    several = T > chunk
    gx = (torch.empty_like(x) if several else None) if need_x else empty()
    gw = None if need_w else empty()
    gb = torch.zeros(V, dtype=torch.float32, device=x.device) if need_b else empty()
    losses = []
    wt = weight.T
    with torch.no_grad():
        for start in range(0, T, chunk):
            xc, tc = x[start:start + chunk], target[start:start + chunk]
            logits = gemm._mm(xc, wt, bias, dt)
            loss, _ = rows(logits, tc, scale, ignore_index, label_smoothing, z_loss, grad,
                           threads, unroll)
            losses.append(loss)
            if need_x:
                if several:
                    gx[start:start + chunk] = gemm._mm(logits, weight, None, dt)
                else:
                    gx = gemm._mm(logits, weight, None, dt)
            if need_w:
                gw = _weight_grad(gemm, logits, xc, gw, start == 0, start + chunk >= T,
                                  dtype_name(weight.dtype))
            if need_b:
                gb += logits.sum(0, dtype=torch.float32)
            del logits
        total = (torch.cat(losses).sum() * scale[0]).float()
    if need_b:
        gb = gb.to(bias.dtype)
    return total, gx, gw, gb


def _weight_grad(gemm, g, xc, acc, first, last, dt):
    """The weight gradient after one chunk: ``g.T @ xc`` (``g (C, V)`` the chunk's logits'
    gradient, ``xc (C, H)`` its tokens; ``g.T`` is read MN-major, no copy) plus ``acc``, the
    f32 sum of the chunks before (None on the first). One chunk alone: the product in ``dt``;
    the first of several: in f32; a later one: ``acc`` added in the GEMM's epilogue, f32 out
    (middle) or ``dt`` (last). Where ``V`` or ``H`` is not a multiple of 8 the GEMM would pad
    the sum and crop its result (two more f32 passes): the product is added by torch."""
    from pyptx_kernels.gemm import host

    if first and last:
        return gemm._mm(g.T, xc, None, dt)
    if first:
        return gemm._mm(g.T, xc, None, "f32")
    if g.shape[1] % 8 or xc.shape[1] % 8:
        if not last:
            return acc.add_(gemm._mm(g.T, xc, None, dt))
        return gemm._mm(g.T, xc, None, dt).add_(acc)   # rounded to dt once
    return host._matmul_residual(g.T, xc, acc, out_dtype="f32" if not last else dt)


__all__ = ["forward", "rows"]
