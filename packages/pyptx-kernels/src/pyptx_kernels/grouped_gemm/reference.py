"""float64 references of the grouped GEMM and the group ends of given sizes (torch)."""

from __future__ import annotations


def reference(a, b, offs):
    """float64 reference (torch tensors): ``b`` as ``(G, K, N)``; rows past ``offs[-1]`` zero."""
    import torch

    out = torch.zeros(a.shape[0], b.shape[-1], dtype=torch.float64, device=a.device)
    ends = offs.tolist()
    s = 0
    for g, e in enumerate(ends):
        if e > s:
            out[s:e] = a[s:e].double() @ b[g].double()
        s = max(s, e)
    return out


def random_offsets(sizes, device="cuda"):
    """int32 cumulative row ends of ``sizes`` (a list of group sizes)."""
    import itertools

    import torch

    return torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32, device=device)
