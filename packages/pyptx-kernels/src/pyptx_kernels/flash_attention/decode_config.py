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
MAX_ROWS = 8              # query rows (heads x queries) one CTA keeps in registers
MAX_SPLITS = 128
PAGE_SIZES = tuple(range(16, 257, 16))


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
      1..``MAX_ROWS``; ``None``: all of a KV head's rows up to ``MAX_ROWS`` (more rows are
      split over CTAs as evenly as possible, each reading the KV head once).
    * ``keys_per_step``: keys each lane group loads per step (1..8); ``None``: 4 for up to
      4 rows, else 2 (the registers of the rows' state).
    * ``num_splits``: KV splits per (batch, KV head), each a CTA writing a partial O and
      log-sum-exp that ``decode_combine`` reduces in a fixed order; ``0``: the heuristic of
      ``decode_host.choose_splits``.
    """

    rows: int | None = None
    keys_per_step: int | None = None
    num_splits: int = 0

    def __post_init__(self):
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

    def row_tiling(self, total_rows):
        """``(rows per CTA, CTAs per KV head)`` for ``total_rows`` query rows of a KV head."""
        most = MAX_ROWS if self.rows is None else self.rows
        chunks = -(-total_rows // most)
        return -(-total_rows // chunks), chunks

    def step_keys(self, rows):
        """Keys per lane group per step at ``rows`` rows per CTA."""
        if self.keys_per_step is not None:
            return self.keys_per_step
        return 4 if rows <= 4 else 2


DEFAULT_CONFIG = DecodeConfig()
