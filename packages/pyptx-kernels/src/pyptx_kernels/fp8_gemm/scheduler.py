"""The FP8 GEMM's work decomposition: output tiles, the persistent grid of clusters and the
grouped tile order."""

from __future__ import annotations

from pyptx.warpspec import grouped_tile_origin
from pyptx_kernels.fp8_gemm.config import BK
from pyptx_kernels.fp8_gemm.scales import SCALE_BLOCK


class Geometry:
    """The tiling of one problem: tiles, the persistent grid and the scale-block counts."""

    def __init__(self, M, N, K, BM, BN, cluster, group_m, num_sms):
        self.BM, self.BN, self.cluster = BM, BN, cluster
        self.num_n = -(-N // BN)
        self.num_m = -(-M // BM)
        self.num_mc = -(-self.num_m // cluster)          # cluster rows of tiles
        self.tiles = self.num_mc * self.num_n
        self.clusters = max(1, min(self.tiles, num_sms // cluster))
        self.ctas = self.clusters * cluster
        self.num_kb = -(-K // BK)
        self.KS = -(-K // SCALE_BLOCK)                   # scale columns (block kind)
        self.NS = -(-N // SCALE_BLOCK)                   # scale rows of B (block kind)
        self.gm = max(1, min(group_m, self.num_mc))

    @classmethod
    def of(cls, M, N, K, config):
        """The geometry of ``M x N x K`` under plan ``config`` (an ``Fp8GemmConfig``)."""
        return cls(M, N, K, config.BM, config.BN, config.cluster, config.group_m,
                   config.num_sms)


def tile_origin(t, rank, g):
    """``(m0, n0)`` of cluster tile ``t`` for cluster CTA ``rank``: ``g.gm`` cluster rows per
    band, walked column by column. Works on Python ints (the CPU model) and on u32
    registers (the kernel)."""
    return grouped_tile_origin(t, rank, num_mc=g.num_mc, num_n=g.num_n, gm=g.gm,
                               cluster=g.cluster, BM=g.BM, BN=g.BN)
