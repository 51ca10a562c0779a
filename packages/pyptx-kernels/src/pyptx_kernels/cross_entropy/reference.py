"""float64 reference of ``linear_cross_entropy`` (torch): what the chunked kernels compute."""


def linear_cross_entropy(x, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0,
                         z_loss=0.0, reduction="mean"):
    """``F.cross_entropy(F.linear(x, weight, bias), target, ...)`` in float64, plus ``z_loss *
    logsumexp(logits)**2`` averaged (or summed) over the non-ignored tokens as the
    cross-entropy is; differentiable (torch autograd)."""
    import torch
    import torch.nn.functional as F

    logits = F.linear(x.double().reshape(-1, x.shape[-1]), weight.double(),
                      None if bias is None else bias.double())
    t = target.reshape(-1)
    loss = F.cross_entropy(logits, t, ignore_index=ignore_index,
                           label_smoothing=label_smoothing, reduction=reduction)
    if z_loss:
        valid = t != ignore_index
        z = torch.logsumexp(logits, -1).pow(2) * valid
        z = z.sum() / valid.sum().clamp(min=1) if reduction == "mean" else z.sum()
        loss = loss + z_loss * z
    return loss


__all__ = ["linear_cross_entropy"]
