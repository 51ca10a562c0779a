"""The decode kernel's plan: ``DecodeConfig`` (query rows per CTA, keys each lane group
takes per step, the split-KV policy) and the lane layout a head dim implies.

A decode CTA is 4 warps. Each key row of ``D`` 16-bit elements is read by ``D // 8`` lanes,
16 bytes each (``lanes_per_key``), so a warp reads ``32 // lanes_per_key`` keys per load
and the CTA ``key_groups`` keys side by side; every lane group takes ``keys_per_step``
keys per step (loads in flight), so one step of the CTA covers ``keys_per_cta_step`` keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyptx.errors import ConfigError
from pyptx_kernels._common import where

WARPS = 4
THREADS = 32 * WARPS
HEAD_DIMS = (64, 128)
MAX_QUERIES = 16          # new queries per sequence (``Sq``)
MAX_ROWS = 8              # query rows (heads x queries) one CTA may keep in registers
DEFAULT_ROWS = 4          # by default: 18 registers a row, ~128 a thread at 4 rows
MAX_SPLITS = 128
PAGE_SIZES = tuple(range(16, 257, 16))
MMA_ROWS = 16             # the tensor-core plan: one m16 tile of query rows per CTA
MMA_BLOCK = 64            # keys per ring block, 16 per consumer warp
MMA_SLAB = 64             # columns of one 128-byte swizzled slab of a ring block
MMA_RING_BYTES = 96 * 1024  # its ring's most shared bytes (two CTAs per SM)


def lanes_per_key(D):
    """Lanes reading one key row (16 bytes each)."""
    return D // 8


def key_groups(D):
    """Lane groups of a CTA: keys it reads side by side."""
    return WARPS * (32 // lanes_per_key(D))


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class DecodeConfig:
    """One plan of ``attention_with_kvcache``'s decode kernel, checked at construction
    (``ConfigError`` at the caller's line).

    * ``rows``: query rows (the group's query heads x the new queries) one CTA computes,
      1..``MAX_ROWS``; ``None``: all of a KV head's rows up to ``DEFAULT_ROWS`` (more rows
      are split over CTAs as evenly as possible, each reading the KV head once; at 8 rows
      a thread needs ~255 registers).
    * ``keys_per_step``: keys each lane group folds into its softmax per step (1..8; the
      direct loads' loads in flight); ``None``: with the ring 4 for up to 2 rows, else 2;
      direct 4 for up to 4 rows, else 2.
    * ``num_splits``: KV splits per (batch, KV head), each a CTA writing a partial O and
      log-sum-exp that the last of them to finish reduces in split order (in the same
      launch, ``decode_combine.combine_row``); ``0``: the heuristic of
      ``decode_host.choose_splits``.
    * ``ring_stages``: blocks of keys in flight per CTA: a producer warp copies K and V
      blocks by TMA into a ``ring_stages``-deep shared ring (2..8); ``0``: every lane loads
      its keys from global memory itself (no ring, no producer warp).
    * ``block_keys``: keys per ring block, a power of two in 16..256 that divides the page
      size; ``None``: ``ring_block``'s choice (64 KiB rings).
    * ``mma``: the tensor-core plan (``decode_mma``): ``mma.sync`` products over blocks of
      ``MMA_BLOCK`` keys of a swizzled ring, up to ``MMA_ROWS`` rows per CTA; ``rows`` and
      ``keys_per_step`` must be None, ``block_keys`` None or 64, and ``ring_stages`` (at
      least 2) is capped at the stages that fit ``MMA_RING_BYTES`` (3 at D=128, 6 at D=64).
      ``False``: the CUDA-core plan (lane groups per key, FMAs and shuffles). ``None``
      (default): the tensor-core plan unless a field only the CUDA-core plan has is set
      (``rows``, ``keys_per_step``, ``block_keys`` other than 64, ``ring_stages=0``); it is
      resolved at construction, so ``mma`` is a bool afterwards.
    """

    rows: int | None = None
    keys_per_step: int | None = None
    num_splits: int = 0
    ring_stages: int = 4
    block_keys: int | None = None
    mma: bool | None = None

    def __post_init__(self):
        if self.mma is None:
            core_only = (self.rows is not None or self.keys_per_step is not None
                         or self.block_keys not in (None, MMA_BLOCK) or self.ring_stages == 0)
            object.__setattr__(self, "mma", not core_only)
        if not isinstance(self.mma, bool):
            raise ConfigError(f"{where()}: DecodeConfig: mma must be a bool or None, got "
                              f"{self.mma!r}")
        if self.mma and (self.rows is not None or self.keys_per_step is not None
                         or self.block_keys not in (None, MMA_BLOCK) or self.ring_stages == 0):
            raise ConfigError(f"{where()}: DecodeConfig: mma=True takes rows=None, "
                              f"keys_per_step=None, block_keys None or {MMA_BLOCK} and a ring "
                              f"(ring_stages >= 2), got {self!r}")
        if not _is_int(self.ring_stages) or self.ring_stages not in (0, *range(2, 9)):
            raise ConfigError(f"{where()}: DecodeConfig: ring_stages must be 0 (direct loads) "
                              f"or an int in 2..8, got {self.ring_stages!r}")
        bk = self.block_keys
        if bk is not None and (not _is_int(bk) or bk not in (16, 32, 64, 128, 256)):
            raise ConfigError(f"{where()}: DecodeConfig: block_keys must be None or a power of "
                              f"two in 16..256, got {bk!r}")
        if self.rows is not None and (not _is_int(self.rows) or not 1 <= self.rows <= MAX_ROWS):
            raise ConfigError(f"{where()}: DecodeConfig: rows must be None or an int in "
                              f"1..{MAX_ROWS}, got {self.rows!r}")
        if self.keys_per_step is not None and (not _is_int(self.keys_per_step)
                                               or not 1 <= self.keys_per_step <= 8):
            raise ConfigError(f"{where()}: DecodeConfig: keys_per_step must be None or an int "
                              f"in 1..8, got {self.keys_per_step!r}")
        if not _is_int(self.num_splits) or not 0 <= self.num_splits <= MAX_SPLITS:
            raise ConfigError(f"{where()}: DecodeConfig: num_splits must be an int in "
                              f"0..{MAX_SPLITS} (0: chosen by size), got {self.num_splits!r}")

    def ring_block(self, D, page_size=None):
        """Keys per ring block at head dim ``D`` (``page_size``: of a paged cache, which a
        block may not cross): ``block_keys``, else 32 at D=128 and 64 at D=64, cut to the
        largest power of two dividing the page size; at least ``key_groups(D)``."""
        bn = self.block_keys or (32 if D == 128 else 64)
        if page_size is not None:
            bn = min(bn, page_size & -page_size)
        if bn < key_groups(D) or (page_size is not None and page_size % bn):
            raise ConfigError(f"{where()}: DecodeConfig: blocks of {bn} keys do not fit head "
                              f"dim {D} (at least {key_groups(D)}) and page size {page_size}")
        return bn

    def row_tiling(self, total_rows):
        """``(rows per CTA, CTAs per KV head)`` for ``total_rows`` query rows of a KV head."""
        most = MMA_ROWS if self.mma else DEFAULT_ROWS if self.rows is None else self.rows
        chunks = -(-total_rows // most)
        return -(-total_rows // chunks), chunks

    def mma_stages(self, D):
        """Ring stages of the tensor-core plan at head dim ``D``."""
        return min(self.ring_stages, MMA_RING_BYTES // (2 * MMA_BLOCK * D * 2))

    def step_keys(self, rows):
        """Keys per lane group per step at ``rows`` rows per CTA."""
        if self.keys_per_step is not None:
            return self.keys_per_step
        return 4 if rows <= (2 if self.ring_stages else 4) else 2


DEFAULT_CONFIG = DecodeConfig()
