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

from typing import Any

from .. import ptx, reg
from ..errors import ConfigError
from ..imm import bf16_bits
from ..source import where
from ..types import PtxType, b16, b32, b64, f32
from .hints import KEEP, L2_PRIORITIES, PINNED, STREAM, Hints  # noqa: F401  (re-exported)

__all__ = ["STREAM", "KEEP", "PINNED", "L2_PRIORITIES", "Hints", "l2_policy", "load_raw_vec",
           "unpack", "load_vec", "store_vec"]


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


