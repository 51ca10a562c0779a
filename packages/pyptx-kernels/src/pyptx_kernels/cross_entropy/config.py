"""The fused linear + cross-entropy's configuration: ``CrossEntropyConfig`` (a frozen,
validated plan: tokens per chunk and the row kernel's launch shape)."""

from __future__ import annotations

from dataclasses import dataclass

from pyptx.errors import ConfigError
from pyptx_kernels._common import where

#: bytes of one chunk's logits when the config leaves ``chunk_tokens`` to the host
LOGITS_BYTES = 1 << 30
#: the largest vocabulary the row kernel takes (its row loop is 32-bit indexed)
MAX_VOCAB = 1 << 20


@dataclass(frozen=True)
class CrossEntropyConfig:
    """How ``linear_cross_entropy`` walks the tokens and a row of logits.

    * ``chunk_tokens``: tokens per chunk (the logits of one chunk exist at a time); None:
      as many as keep a chunk's logits within ``logits_bytes`` (a multiple of 256, at least
      256), so the transient memory is bounded whatever the vocabulary.
    * ``threads``: threads of the row kernel's CTA (one CTA per token's row; a multiple of
      32 up to 1024); ``unroll``: 16-byte vectors each thread loads per slab of the row loop.
    A bad value raises ``ConfigError`` at the caller's line."""

    chunk_tokens: int | None = None
    logits_bytes: int = LOGITS_BYTES
    threads: int = 512
    unroll: int = 2

    def __post_init__(self) -> None:
        for name in ("chunk_tokens", "logits_bytes", "threads", "unroll"):
            v = getattr(self, name)
            if v is None and name == "chunk_tokens":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{where()}: CrossEntropyConfig: {name} must be a positive "
                                  f"int, got {v!r}")
        if self.threads % 32 or self.threads > 1024:
            raise ConfigError(f"{where()}: CrossEntropyConfig: threads must be a multiple of 32 "
                              f"up to 1024, got {self.threads}")
        if self.unroll > 8:
            raise ConfigError(f"{where()}: CrossEntropyConfig: unroll must be at most 8, got "
                              f"{self.unroll}")

    def chunk(self, tokens: int, vocab: int, elem_bytes: int = 2) -> int:
        """Tokens per chunk for ``tokens`` rows of ``vocab`` logits (never more than
        ``tokens``)."""
        if self.chunk_tokens is not None:
            return min(tokens, self.chunk_tokens)
        fit = self.logits_bytes // max(1, vocab * elem_bytes)
        return min(tokens, max(256, fit // 256 * 256))


#: The default plan.
DEFAULT = CrossEntropyConfig()

__all__ = ["CrossEntropyConfig", "DEFAULT", "LOGITS_BYTES", "MAX_VOCAB"]
