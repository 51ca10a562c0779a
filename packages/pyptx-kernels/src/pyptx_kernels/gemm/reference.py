"""The GEMM's float64 reference."""

from __future__ import annotations


def reference(a, b, bias=None, alpha=1.0, activation=None):
    """float64 ``activation(alpha * a @ b + bias)`` of torch tensors (the kernel's math)."""
    import torch

    d = (a.double() @ b.double()) * alpha
    if bias is not None:
        d = d + bias.double()
    if activation == "relu":
        d = torch.relu(d)
    elif activation == "silu":
        d = torch.nn.functional.silu(d)
    elif activation == "gelu_tanh":
        d = torch.nn.functional.gelu(d, approximate="tanh")
    return d
