"""Vector loads and stores of row data: 16-byte (or narrower) accesses with cache hints.

``load_vec``/``store_vec`` do one aligned access of 1..8 elements between memory and
f32 registers (bf16 pairs unpacked with ``shl``/``and``, packed with
``cvt.rn.bf16x2.f32``); ``load_raw_vec``/``unpack`` split a load into the stored
registers and their f32 values, so a kernel can keep a row as stored (bf16 stays
packed: half the registers) and widen it where it is used.

Every setting that changes the emitted instructions is an argument: ``cache`` (the
modifier after ``ld.global``/``st.global``: ``STREAM``, ``KEEP``, ``PINNED``, ``.cs``),
``policy`` (an L2 eviction priority from ``L2_PRIORITIES``: one
``createpolicy.fractional`` register and ``.L2::cache_hint`` on the access). ``Hints``
bundles the ones a row kernel sets once for all its streamed accesses.
"""

from __future__ import annotations

import re
from typing import Any

from .. import ptx, reg
from .._dataclass import dataclass
from ..errors import ConfigError
from ..imm import bf16_bits
from ..source import where
from ..types import PtxType, b16, b32, b64, f32

__all__ = ["STREAM", "KEEP", "PINNED", "L2_PRIORITIES", "Hints", "l2_policy", "load_raw_vec",
           "unpack", "load_vec", "store_vec"]

#: load cache hints. Streamed rows use plain ``ld.global``: on the H100 it beat
#: ``.nc.L1::no_allocate`` by 1-3% at every size (measured with the retired tools/probe_variants.py; NOTES.md);
#: weights are shared by the CTAs of an SM, so they stay in L1 (``.nc``).
STREAM = ""
KEEP = ".nc"
#: the persistent kernels' row loads: coherent (no ``.nc``), so ptxas keeps them where they are
#: issued, before the previous row's ``bar.sync`` and stores; ``.nc`` loads it sinks past both
#: to shorten their live ranges, which undoes the prefetch.
PINNED = ".L1::no_allocate"
#: L2 eviction priorities of ``createpolicy.fractional`` ("" = no policy).
L2_PRIORITIES = ("evict_first", "evict_last", "evict_normal", "evict_unchanged")
_STORE_HINTS = ("", ".wb", ".cg", ".cs", ".wt")
_LOAD_HINT = re.compile(r"^(\.[A-Za-z0-9_:]+)*$")


@dataclass(frozen=True)
class Hints:
    """How a row kernel's streamed global accesses are issued; every field changes the PTX.

    ``load``: the cache modifier after ``ld.global`` of streamed row loads ("" = plain
    loads, the measured best; e.g. ``.nc.L1::no_allocate``; weights always use ``KEEP``).
    ``l2_load``/``l2_store``: L2 eviction priority of streamed row loads / of stores
    ("" = none, else one of ``L2_PRIORITIES``; weights loaded with ``KEEP`` get none).
    ``store``: the cache modifier after ``st.global`` ("" = the default write-back,
    ``.cs`` streaming, ...). ``pdl_prefetch``: ``pdl=True`` kernels ask for their CTA's
    rows in L2 (``cp.async.bulk.prefetch``) before ``griddepcontrol.wait``, so the
    loads overlap the previous grid's last wave.
    """

    l2_load: str = ""
    l2_store: str = ""
    store: str = ""
    pdl_prefetch: bool = True
    load: str = STREAM

    def __post_init__(self) -> None:
        at = where(4)  # past the generated __init__: the caller of Hints(...)
        for name in ("l2_load", "l2_store"):
            v = getattr(self, name)
            if v != "" and v not in L2_PRIORITIES:
                raise ConfigError(f"{at}: {name} must be '' or one of {L2_PRIORITIES}, "
                                  f"got {v!r}")
        if self.store not in _STORE_HINTS:
            raise ConfigError(f"{at}: store must be one of {_STORE_HINTS} (the st.global "
                              f"cache modifier), got {self.store!r}")
        if not isinstance(self.load, str) or not _LOAD_HINT.match(self.load):
            raise ConfigError(f"{at}: load must be '' or ld.global modifiers such as "
                              f"'.nc.L1::no_allocate', got {self.load!r}")
        if not isinstance(self.pdl_prefetch, bool):
            raise ConfigError(f"{at}: pdl_prefetch must be True or False, got "
                              f"{self.pdl_prefetch!r}")


def l2_policy(priority: str) -> Any:
    """A ``createpolicy.fractional.L2::<priority>.b64`` register (all accesses), or None for ""."""
    if not priority:
        return None
    if priority not in L2_PRIORITIES:
        raise ConfigError(f"{where()}: L2 priority must be one of {L2_PRIORITIES}, got {priority!r}")
    pol = reg.scalar(b64)
    ptx.inst(f"createpolicy.fractional.L2::{priority}.b64")(pol, 1.0)
    return pol


def _hinted(op: str, priority: str) -> tuple[str, tuple]:
    pol = l2_policy(priority)
    return (op, ()) if pol is None else (op + ".L2::cache_hint", (pol,))


def _bf16_word(value: float) -> int:
    b = bf16_bits(value)
    return (b << 16) | b


def load_raw_vec(ptr: Any, off: int, dtype: PtxType, n: int, *, pred: Any = None,
                 fill: float | None = 0.0, cache: str = "", dst: list | None = None,
                 space: str = "global", policy: str = "") -> list:
    """Load ``n`` consecutive elements at ``[ptr+off]`` as they are stored: raw registers.

    f32: ``n`` f32 registers; bf16: ``n // 2`` b32 words (element ``2i`` in the low
    half), or one b16 for ``n == 1``. Where ``pred`` is false the registers are
    ``fill`` (``fill=None``: left as they were, for a guard whose result is unused).
    ``dst`` is a list of registers from an earlier call of the same shape to load
    into (a loop-carried register set); by default fresh registers. ``space="shared"``
    reads shared memory (``ptr`` a u32 shared address; ``cache`` is ignored). ``policy``
    is an L2 eviction priority ("" = none).
    """
    hint: tuple = ()
    if space == "global":
        ld, hint = _hinted(f"ld.global{cache}", policy)
    else:
        ld = f"ld.{space}"
    out: list = []
    if dtype is f32:
        per = min(n, 4)
        for p in range(0, n, per):
            regs = reg.array(f32, per) if dst is None else dst[p:p + per]
            if pred is not None and fill is not None:
                for r in regs:
                    ptx.inst.mov.f32(r, fill)
            v = f".v{per}" if per > 1 else ""
            ptx.inst(f"{ld}{v}.f32")(regs if per > 1 else regs[0],
                                     ptx.addr(ptr, off + 4 * p), *hint, pred=pred)
            out.extend(regs)
        return out
    if n == 1:  # one bf16
        h = reg.scalar(b16) if dst is None else dst[0]
        if pred is not None and fill is not None:
            ptx.inst.mov.b16(h, bf16_bits(fill))
        ptx.inst(f"{ld}.b16")(h, ptx.addr(ptr, off), *hint, pred=pred)
        return [h]
    words = n // 2
    for p in range(0, words, 4):
        per = min(words - p, 4)
        w = reg.array(b32, per) if dst is None else dst[p:p + per]
        if pred is not None and fill is not None:
            for r in w:
                ptx.inst.mov.b32(r, _bf16_word(fill))
        v = f".v{per}" if per > 1 else ""
        ptx.inst(f"{ld}{v}.b32")(w if per > 1 else w[0], ptx.addr(ptr, off + 4 * p), *hint,
                                 pred=pred)
        out.extend(w)
    return out


def unpack(raw: list, dtype: PtxType) -> list:
    """f32 registers of the elements in ``raw`` (from ``load_raw_vec``): f32 as they are;
    bf16 words split with ``shl``/``and`` (no conversion instruction), a b16 with ``cvt``."""
    if dtype is f32:
        return list(raw)
    if len(raw) == 1 and raw[0].type is b16:
        f = reg.scalar(f32)
        ptx.inst.cvt.f32.bf16(f, raw[0])
        return [f]
    out: list = []
    for r in raw:
        lo, hi = reg.scalar(f32), reg.scalar(f32)
        ptx.inst.shl.b32(lo, r, 16)             # element 2i: the low half
        ptx.inst.and_.b32(hi, r, 0xFFFF0000)    # element 2i+1: the high half
        out += [lo, hi]
    return out


def load_vec(ptr: Any, off: int, dtype: PtxType, n: int, *, pred: Any = None,
             fill: float = 0.0, cache: str = "", policy: str = "",
             space: str = "global") -> list:
    """Load ``n`` consecutive elements at ``[ptr+off]`` (aligned to their size) as f32 registers.

    Where ``pred`` is false the values are ``fill``. ``cache`` is a modifier
    string after ``ld.global`` (``STREAM``, ``KEEP`` or ""); ``policy`` and ``space`` as in
    ``load_raw_vec``.
    """
    kw = dict(pred=pred, fill=fill, cache=cache, policy=policy, space=space)
    if dtype is f32 or n == 1:
        return unpack(load_raw_vec(ptr, off, dtype, n, **kw), dtype)
    out: list = []
    for p in range(0, n // 2, 4):  # each load's words unpacked right after it
        per = min(n // 2 - p, 4)
        out += unpack(load_raw_vec(ptr, off + 4 * p, dtype, 2 * per, **kw), dtype)
    return out


def store_vec(ptr: Any, off: int, dtype: PtxType, vals: list, *, pred: Any = None,
              cache: str = "", space: str = "global", policy: str = "") -> None:
    """Store f32 registers ``vals`` as ``len(vals)`` consecutive ``dtype`` elements at ``[ptr+off]``
    (``cache``: a modifier after ``st.global``, "" for none; ``policy``: an L2 eviction
    priority, "" for none; ``space="shared"``: ``ptr`` is a u32 shared address and
    ``cache`` and ``policy`` are ignored)."""
    n = len(vals)
    hint: tuple = ()
    if space == "global":
        st, hint = _hinted(f"st.global{cache}", policy)
    else:
        st = f"st.{space}"
    if dtype is f32:
        per = min(n, 4)
        for p in range(0, n, per):
            v = f".v{per}" if per > 1 else ""
            ptx.inst(f"{st}{v}.f32")(ptx.addr(ptr, off + 4 * p),
                                     list(vals[p:p + per]) if per > 1 else vals[p], *hint,
                                     pred=pred)
        return
    if n == 1:
        h = reg.scalar(b16)
        ptx.inst.cvt.rn.bf16.f32(h, vals[0])
        ptx.inst(f"{st}.b16")(ptx.addr(ptr, off), h, *hint, pred=pred)
        return
    words = []
    for i in range(0, n, 2):
        w = reg.scalar(b32)
        ptx.inst.cvt.rn.bf16x2.f32(w, vals[i + 1], vals[i])  # a -> high half, b -> low half
        words.append(w)
    for p in range(0, len(words), 4):
        per = min(len(words) - p, 4)
        v = f".v{per}" if per > 1 else ""
        ptx.inst(f"{st}{v}.b32")(ptx.addr(ptr, off + 4 * p),
                                 words[p:p + per] if per > 1 else words[p], *hint, pred=pred)


