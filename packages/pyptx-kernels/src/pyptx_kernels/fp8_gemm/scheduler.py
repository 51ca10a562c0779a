"""The FP8 GEMM's work decomposition: output tiles, the persistent grid of clusters and the
grouped tile order. The host's part imports no tracing code: ``bind`` and ``tile_origin``
import it."""

from __future__ import annotations

import copy

from pyptx.types import u32
from pyptx_kernels.fp8_gemm.config import BK
from pyptx_kernels.fp8_gemm.scales import SCALE_BLOCK


class Geometry:
    """The tiling of one problem: tiles, the persistent grid and the scale-block counts.

    Runtime M: the kernel reads ``M``, ``num_mc`` and ``tiles`` from kernel parameters
    (``bind``), so every M of an ``(N, K)`` family has one PTX; its persistent loop strides
    by the constant ``stride = num_sms // cluster``, the cluster count whenever a cluster has
    more than one tile."""

    def __init__(self, M, N, K, BM, BN, cluster, group_m, num_sms):
        self.M, self.BM, self.BN, self.cluster = M, BM, BN, cluster
        self.num_n = -(-N // BN)
        self.num_m = -(-M // BM)
        self.num_mc = -(-self.num_m // cluster)          # cluster rows of tiles
        self.tiles = self.num_mc * self.num_n
        self.stride = max(1, num_sms // cluster)
        self.clusters = max(1, min(self.tiles, self.stride))
        self.ctas = self.clusters * cluster
        self.num_kb = -(-K // BK)
        self.KS = -(-K // SCALE_BLOCK)                   # scale columns (block kind)
        self.NS = -(-N // SCALE_BLOCK)                   # scale rows of B (block kind)
        # a band of group_m cluster rows where fewer remain is the same order as one of fewer
        self.gm = group_m

    def bind(self):
        """This geometry as the kernel sees it (call inside the kernel body): a copy whose
        ``M``, ``num_mc`` and ``tiles`` are registers loaded from kernel parameters."""
        from pyptx import ptx

        bound = copy.copy(self)
        for name, value in self.params().items():
            setattr(bound, name, ptx.scalar_param(u32, value, name))
        return bound

    def params(self):
        """The kernel parameters ``bind`` declares, by name (a kernel of another M reuses the
        traced code with these values: ``pyptx_kernels._family``)."""
        return {"M": self.M, "num_mc": self.num_mc, "tiles": self.tiles}

    @classmethod
    def of(cls, M, N, K, config):
        """The geometry of ``M x N x K`` under plan ``config`` (an ``Fp8GemmConfig``)."""
        return cls(M, N, K, config.BM, config.BN, config.cluster, config.group_m,
                   config.num_sms)


def tile_origin(t, rank, g):
    """``(m0, n0)`` of cluster tile ``t`` for cluster CTA ``rank``: ``g.gm`` cluster rows per
    band, walked column by column. Works on Python ints (the CPU model) and on u32
    registers (the kernel)."""
    from pyptx.warpspec import grouped_tile_origin

    return grouped_tile_origin(t, rank, num_mc=g.num_mc, num_n=g.num_n, gm=g.gm,
                               cluster=g.cluster, BM=g.BM, BN=g.BN)
