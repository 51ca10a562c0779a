"""CPU checks of the flash-attention forward example (``examples/hopper/flash_attention.py``).

* The block plan (which KV blocks a query block visits, which of them need a mask) is
  checked exhaustively against the causal/tail rule on small sizes: every skipped key and
  every key of an unmasked block is decided correctly for every query row of the block.
* The register layouts the kernel relies on: the S accumulator's pairs packed as wgmma's
  A fragment (PTX ISA, m64k16 16-bit A from registers) and the epilogue's swizzled shared
  addresses (the tensor copy's 128-byte swizzle of a 64-row slab).
* A numpy model of the kernel's algorithm (same plan, masks, ex2-domain online softmax
  with the dead-row guard, P rounded to bf16/f16 before P V, output rounding) against a
  float64 reference: max |o - ref| / max(1, |ref|) <= 2e-2 (bf16) / 1e-2 (f16), lse
  relative <= 1e-3 (the tolerances the GPU tests use; see ``check`` in the example).
* Every schedule, head dim, causal or not, dense or packed, traces and assembles with
  ptxas for sm_90a without spills; bad configurations raise ``ConfigError``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from pyptx.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
from pyptx_kernels.flash_attention import fwd_config, fwd_host, fwd_kernel, fwd_softmax, masks
from pyptx_kernels.flash_attention.fwd_config import ForwardConfig


# ------------------------------------------------------------------ block plan
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("BN", [64, 128, 176, 192])
def test_block_plan_covers_exactly_the_allowed_keys(causal, BN):
    for seqlen_q in (1, 2, 77, 127, 128, 129, 200, 333, 512):
        for seqlen_k in (1, 5, 77, 128, 200, 333, 512) if not causal else (seqlen_q, 1, 333):
            for m0 in range(0, seqlen_q, fwd_config.BM):
                first, lo, n_unm, n_blocks = masks.block_plan(m0, seqlen_q, seqlen_k, BN, causal)
                assert first == lo == 0 and 0 <= n_unm <= n_blocks
                rows = np.arange(m0, min(m0 + fwd_config.BM, seqlen_q))
                lim = np.array([masks.row_limit(int(r), seqlen_k, causal)[1] for r in rows])
                assert n_blocks >= 1
                # keys past the visited blocks are masked for every stored row
                assert (lim <= n_blocks * BN).all()
                # unmasked blocks hold only allowed keys, for every row of the CTA's block
                all_rows = np.arange(m0, m0 + fwd_config.BM)
                all_lim = np.array([masks.row_limit(int(r), seqlen_k, causal)[1]
                                    for r in all_rows])
                assert (all_lim >= n_unm * BN).all()


def test_block_plan_causal_diagonal_only():
    # S = Sk = 1024, BN = BM = 128: block m visits m + 1 blocks, masks only the diagonal
    for mb in range(8):
        assert masks.block_plan(mb * 128, 1024, 1024, 128, True) == (0, 0, mb, mb + 1)
    assert masks.block_plan(256, 1024, 1024, 128, False) == (0, 0, 8, 8)
    assert masks.block_plan(0, 1000, 1000, 128, False) == (0, 0, 7, 8)


# ------------------------------------------------------------------ register layouts
def test_s_accumulator_pairs_are_the_wgmma_a_fragment():
    """Register pair (lo, hi) of a_fragment(kk)[q] holds the A elements the PTX ISA puts in
    register a_q of m64k16 (16-bit A): row 16*warp + lane/4 + 8*(q%2), columns
    16*kk + 2*(lane%4) + 8*(q//2) + {0, 1}."""
    from pyptx.fragment import accumulator_coord

    for kk in range(8):
        for q, (lo, hi) in enumerate(fwd_softmax.a_fragment(kk)):
            for warp in range(4):
                for lane in range(32):
                    row = 16 * warp + lane // 4 + 8 * (q % 2)
                    col = 16 * kk + 2 * (lane % 4) + 8 * (q // 2)
                    assert accumulator_coord(lo, warp, lane) == (row, col)
                    assert accumulator_coord(hi, warp, lane) == (row, col + 1)


def test_frag_half_and_col_match_the_accumulator():
    from pyptx.fragment import accumulator_coord

    for i in range(64):
        r, c = accumulator_coord(i, 0, 0)
        assert masks.frag_half(i) == r // 8 and masks.frag_col(i) == c


@pytest.mark.parametrize("D", [64, 128, 256])
def test_epilogue_addresses_are_the_tma_128b_swizzle(D):
    """The kernel writes pair (dr, dc) of thread t at
    obuf + row0*128 + colb + ((lane/4) ^ q)*16 + (dc/64)*slab + dr*128 (q = (dc%64)/8);
    a 128-byte-swizzled box of 64 rows puts element (r, c) of slab c/64 at
    r*128 + (((c%64)*2/16) ^ (r%8))*16 + (c*2)%16. Every element lands once, where the copy
    engine reads it."""
    from pyptx.fragment import Accumulator, accumulator_coord

    slab = fwd_config.BM * 128
    seen = {}
    for t in range(128):
        warp, lane = t // 32, t % 32
        row0 = 16 * warp + lane // 4
        colb = (lane & 3) * 4
        xr = lane >> 2
        for i in range(0, D // 2, 2):
            dr, dc = Accumulator.coord(i)
            q = (dc % 64) * 2 // 16
            addr = row0 * 128 + colb + ((xr ^ q) << 4) + (dc // 64) * slab + dr * 128
            r, c = accumulator_coord(i, warp, lane)
            want = (c // 64) * slab + r * 128 + ((((c % 64) * 2) // 16) ^ (r % 8)) * 16 + (c * 2) % 16
            assert addr == want
            assert addr not in seen
            seen[addr] = (r, c)
    assert len(seen) == 64 * D // 2


# ------------------------------------------------------------------ numpy model of the algorithm
def _round(x, dtype):
    x = np.asarray(x, dtype=np.float32)
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000  # round to nearest even
    return u.astype(np.uint32).view(np.float32)


def model_forward(q, k, v, causal, scale, dtype, BN, rescale_threshold=None):
    """The kernel's algorithm on one (batch, head): q (S, D), k/v (Sk, D), f32 state.
    ``rescale_threshold`` models the opt-in lazy rescale: a row keeps its max unless the
    block raises it by more than the threshold, and O is multiplied only for warps (16
    rows) where some row moved its max."""
    S, D = q.shape
    Sk = k.shape[0]
    sl2 = np.float32(scale * fwd_config.LOG2E)
    o_all = np.zeros((S, D), np.float32)
    lse_all = np.zeros(S, np.float32)
    for m0 in range(0, S, fwd_config.BM):
        _, _, n_unm, n_blocks = masks.block_plan(m0, S, Sk, BN, causal)
        rows = np.arange(m0, m0 + fwd_config.BM)
        qb = np.zeros((fwd_config.BM, D), np.float32)
        valid = rows < S
        qb[valid] = q[rows[valid]]                        # copies past S read zeros
        lim = np.array([masks.row_limit(int(r), Sk, causal)[1] for r in rows])
        m = np.full(fwd_config.BM, -np.inf, np.float32)
        ls = np.zeros(fwd_config.BM, np.float32)
        o = np.zeros((fwd_config.BM, D), np.float32)
        for j in range(n_blocks):
            cols = j * BN + np.arange(BN)
            kb = np.zeros((BN, D), np.float32)
            vb = np.zeros((BN, D), np.float32)
            ok = cols < Sk
            kb[ok], vb[ok] = k[cols[ok]], v[cols[ok]]
            s = qb @ kb.T
            if j >= n_unm or j == 0:                      # the kernel masks these
                s = np.where(cols[None, :] >= lim[:, None], -np.inf, s)
            m_new = np.maximum(s.max(axis=1) * sl2, m)
            moved = np.ones(fwd_config.BM, bool)
            if rescale_threshold is not None:
                moved = m_new > m + np.float32(rescale_threshold)
                m_new = np.where(moved, m_new, m)
            m_use = np.where(m_new == -np.inf, np.float32(0), m_new)
            alpha = np.exp2(m - m_use)
            p = np.exp2(s * sl2 - m_use[:, None])
            ls = ls * alpha + p.sum(axis=1)
            m = m_new
            warp_moved = np.repeat(moved.reshape(-1, 16).any(axis=1), 16)
            if rescale_threshold is not None:   # rows that kept their max have alpha == 1
                assert (alpha[~moved & (m > -np.inf)] == 1).all()
            o = np.where(warp_moved[:, None], o * alpha[:, None], o) + _round(p, dtype) @ vb
        inv = np.where(ls > 0, 1 / np.where(ls > 0, ls, 1), 0)
        with np.errstate(divide="ignore"):
            lse = np.where(ls > 0, (m + np.log2(np.where(ls > 0, ls, 1))) * fwd_config.LN2, -np.inf)
        n = min(fwd_config.BM, S - m0)
        o_all[m0:m0 + n] = _round(o * inv[:, None], dtype)[:n]
        lse_all[m0:m0 + n] = lse[:n]
    return o_all, lse_all


def reference64(q, k, v, causal, scale):
    s = (q.astype(np.float64) @ k.astype(np.float64).T) * scale
    if causal:
        i = np.arange(q.shape[0])[:, None]
        j = np.arange(k.shape[0])[None, :]
        s = np.where(j > i, -np.inf, s)
    mx = s.max(axis=1, keepdims=True)
    e = np.exp(s - mx)
    lse = np.log(e.sum(axis=1)) + mx[:, 0]
    return (e / e.sum(axis=1, keepdims=True)) @ v.astype(np.float64), lse


@pytest.mark.parametrize("S,Sk,D,causal,dtype", [
    (1, 1, 64, True, "bf16"), (77, 77, 64, True, "bf16"), (200, 200, 128, False, "bf16"),
    (333, 333, 128, True, "f16"), (256, 333, 64, False, "f16"), (128, 5, 64, False, "bf16"),
    (300, 300, 256, True, "bf16"),
])
def test_model_matches_float64(S, Sk, D, causal, dtype):
    rng = np.random.default_rng(S * 7 + D)
    q = _round(rng.standard_normal((S, D)), dtype)
    k = _round(rng.standard_normal((Sk, D)), dtype)
    v = _round(rng.standard_normal((Sk, D)), dtype)
    scale = 1 / math.sqrt(D)
    o, lse = model_forward(q, k, v, causal, scale, dtype, fwd_config.default_bn(D))
    ro, rl = reference64(q, k, v, causal, scale)
    tol = 2e-2 if dtype == "bf16" else 1e-2
    assert (np.abs(o - ro) / np.maximum(np.abs(ro), 1)).max() <= tol
    assert (np.abs(lse - rl) / np.maximum(np.abs(rl), 1)).max() <= 1e-3


@pytest.mark.parametrize("S,Sk,D,causal,dtype", [
    (77, 77, 64, True, "bf16"), (333, 333, 128, True, "f16"), (256, 333, 128, False, "bf16"),
    (1, 1, 128, False, "bf16"), (128, 5, 64, False, "f16"),
])
def test_lazy_rescale_model(S, Sk, D, causal, dtype):
    """rescale_threshold=0 is bit-identical to the default (alpha is exactly 1 where the
    rescale is skipped); 8 and 16 stay within the same tolerances against float64 (P values
    grow to at most 2**t, bf16/f16 rounding is relative). Inputs scaled by 4 so maxima keep
    moving across blocks."""
    rng = np.random.default_rng(S + Sk + D)
    q, k, v = (_round(4 * rng.standard_normal((n, D)), dtype) for n in (S, Sk, Sk))
    scale = 1 / math.sqrt(D)
    base = model_forward(q, k, v, causal, scale, dtype, 128)
    exact = model_forward(q, k, v, causal, scale, dtype, 128, rescale_threshold=0)
    assert np.array_equal(base[0], exact[0]) and np.array_equal(base[1], exact[1])
    ro, rl = reference64(q, k, v, causal, scale)
    tol = 2e-2 if dtype == "bf16" else 1e-2
    for t in (8, 16):
        o, lse = model_forward(q, k, v, causal, scale, dtype, 128, rescale_threshold=t)
        assert (np.abs(o - ro) / np.maximum(np.abs(ro), 1)).max() <= tol
        assert (np.abs(lse - rl) / np.maximum(np.abs(rl), 1)).max() <= 1e-3


def test_model_row_without_keys_gives_zero_and_minus_inf():
    """A packed sequence with no keys visits no block: o = 0 and lse = -inf (the contract)."""
    assert masks.block_plan(0, 3, 0, 128, False) == (0, 0, 0, 0)
    q = np.ones((3, 64), np.float32)
    empty = np.zeros((0, 64), np.float32)
    o, lse = model_forward(q, empty, empty, False, 0.125, "bf16", 128)
    assert (o == 0).all() and (lse == -np.inf).all()


# ------------------------------------------------------------------ tracing and ptxas
@pytest.mark.parametrize("schedule", fwd_config.SCHEDULES)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_kernel_assembles(assemble, schedule, D, causal):
    k = fwd_kernel.build_attention(2, 200, 4, 2, D, causal=causal, dtype="f16" if D == 64 else "bf16", config=ForwardConfig(schedule=schedule))
    ptx_text = k.ptx()
    assert "cp.async.bulk.tensor.4d" in ptx_text
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.(bf16|f16)\.(bf16|f16) "
                     r"\{[^}]*\}, \{%\w+, %\w+, %\w+, %\w+\}", ptx_text), "P V with A from registers"
    assert ("bar.arrive" in ptx_text) == (schedule == "pingpong")
    log = assemble(ptx_text)
    assert "0 bytes spill stores" in log


@pytest.mark.parametrize("schedule", fwd_config.SCHEDULES)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_persistent_kernel_assembles(assemble, schedule, D, causal):
    k = fwd_kernel.build_attention(2, 300, 4, 2, D, causal=causal, config=ForwardConfig(schedule=schedule, persistent=True))
    bm = 64 * fwd_config.default_consumers(D)
    assert k.grid == (-(-300 // bm) * 8, 1, 1) and "persistent" in k.name
    assert "0 bytes spill stores" in assemble(k.ptx())


def test_persistent_tile_order_covers_every_block_once():
    """Tile t of the persistent order is (b, h, m-block): heads outermost, longest first."""
    B, Hq, num_m = 3, 5, 7
    seen = set()
    for t in range(B * Hq * num_m):
        bh, mi = divmod(t, num_m)
        b, h = divmod(bh, Hq)
        seen.add((b, h, num_m - 1 - mi))
    assert len(seen) == B * Hq * num_m


@pytest.mark.parametrize("schedule", fwd_config.SCHEDULES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_kernel_assembles(assemble, schedule, causal):
    k = fwd_kernel.build_attention_varlen(700, 900, 3, 4, 2, 128, 333, causal=causal, config=ForwardConfig(schedule=schedule))
    ptx_text = k.ptx()
    assert "cp.async.bulk.tensor.3d" in ptx_text and "st.global.b32" in ptx_text
    assert "0 bytes spill stores" in assemble(ptx_text)


@pytest.mark.parametrize("D,BN,stages", [(128, 176, 2), (128, 128, 3), (64, 192, 2), (64, 128, 4),
                                         (256, 80, 2)])
def test_block_shapes_assemble(assemble, D, BN, stages):
    k = fwd_kernel.build_attention(1, 500, 2, 1, D, causal=True, config=ForwardConfig(BN=BN, stages=stages))
    assert f"m64n{BN}k16" in k.ptx()
    assert "0 bytes spill stores" in assemble(k.ptx())


@pytest.mark.parametrize("schedule", fwd_config.SCHEDULES)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("opts", [dict(pin_overlap=True), dict(rescale_threshold=None),
                                  dict(pin_overlap=True, rescale_threshold=0)])
def test_tuning_options_assemble(assemble, schedule, D, causal, opts):
    """The tuning options trace, assemble without spills and emit what they promise: a
    ``fence.acq_rel.cta`` before the P V wait (overlapped schedules only) and a warp vote
    around the O rescale unless ``rescale_threshold=None`` (the exact schedule)."""
    k = fwd_kernel.build_attention(2, 300, 4, 2, D, causal=causal, config=ForwardConfig(schedule=schedule, **opts))
    text = k.ptx()
    pinned = opts.get("pin_overlap", False) and schedule != "simple"
    assert ("fence.acq_rel.cta" in text) == pinned
    assert ("vote.sync.any.pred" in text) == (opts.get("rescale_threshold", 8) is not None)
    assert ("_pinned" in k.name) == opts.get("pin_overlap", False)
    assert "0 bytes spill stores" in assemble(text)


@pytest.mark.parametrize("kw", [dict(BN=176, stages=2), dict(BN=128, stages=3),
                                dict(persistent=True)])
def test_tuning_options_with_block_shapes_assemble(assemble, kw):
    k = fwd_kernel.build_attention(1, 500, 2, 1, 128,
                                   config=ForwardConfig(pin_overlap=True, rescale_threshold=8, **kw))
    assert "0 bytes spill stores" in assemble(k.ptx())


def test_tuning_options_varlen_assemble(assemble):
    k = fwd_kernel.build_attention_varlen(
        700, 900, 3, 4, 2, 128, 333, causal=True,
        config=ForwardConfig(pin_overlap=True, rescale_threshold=4))
    assert k.name.endswith("_pinned_rt4")
    assert "0 bytes spill stores" in assemble(k.ptx())


def test_default_kernel_rescales_lazily_and_exact_on_request():
    """The default is ``rescale_threshold=8`` (a warp vote, no tag in the name); ``None``
    builds the exact schedule (no vote, ``_exact`` in the name); neither pins the overlap."""
    k = fwd_kernel.build_attention(2, 300, 4, 2, 128)
    assert fwd_config.RESCALE_THRESHOLD == 8 and "vote.sync.any.pred" in k.ptx()
    assert "fence.acq_rel" not in k.ptx() and "_rt" not in k.name and "_exact" not in k.name
    exact = fwd_kernel.build_attention(2, 300, 4, 2, 128, config=ForwardConfig(rescale_threshold=None))
    assert "vote.sync" not in exact.ptx() and exact.name.endswith("_exact")


# ------------------------------------------------------------------ the ping-pong protocol
def _pingpong_programs(batches_per_tile, wgs=2):
    """The consumers' named-barrier operations in the kernel's order (barriers ``base + w``,
    ``base`` 3 for two warpgroups, ``wgs + 1`` otherwise): the last warpgroup arrives on
    warpgroup 0's barrier once, then each warpgroup waits on its own barrier before every
    batch of GEMMs and arrives on the next one's after it; warpgroup 0 waits on its barrier
    once at the end."""
    n = sum(batches_per_tile)
    base = 3 if wgs == 2 else wgs + 1
    progs = [[("sync", base + w), ("arrive", base + (w + 1) % wgs)] * n for w in range(wgs)]
    progs[-1].insert(0, ("arrive", base))
    progs[0].append(("sync", base))
    return progs


def _run_named_barriers(programs, rng):
    """Random interleavings of hardware named barriers (bar.sync / bar.arrive, 128 threads a
    warpgroup, 256 expected): fails on a deadlock or a barrier completed by one warpgroup."""
    wgs = range(len(programs))
    pcs = [0 for _ in wgs]
    waiting = [None for _ in wgs]
    pending = {}                                   # barrier -> warpgroups arrived so far
    while True:
        ready = [w for w in wgs if pcs[w] < len(programs[w]) and waiting[w] is None]
        if not ready:
            assert all(pcs[w] == len(programs[w]) for w in wgs), f"deadlock at {pcs}"
            assert all(not v for v in pending.values()), f"unmatched arrivals {pending}"
            return
        w = ready[rng.integers(len(ready))]
        op, bar = programs[w][pcs[w]]
        pcs[w] += 1
        arrived = pending.setdefault(bar, [])
        arrived.append(w)
        if op == "sync":
            waiting[w] = bar
        if len(arrived) == 2:
            assert arrived[0] != arrived[1], f"barrier {bar} completed by warpgroup {w} alone"
            arrived.clear()
            for v in wgs:
                if waiting[v] == bar:
                    waiting[v] = None


@pytest.mark.parametrize("wgs", fwd_config.CONSUMERS)
@pytest.mark.parametrize("tiles", [[0], [1], [2], [5], [3, 3, 3], [1, 4, 2, 7]])
def test_pingpong_protocol_is_balanced_and_alternates(tiles, wgs):
    # per tile the overlapped schedule issues n_blocks + 1 batches (none for an empty tile)
    batches = [n + 1 if n else 0 for n in tiles]
    rng = np.random.default_rng(len(tiles))
    for _ in range(200):
        _run_named_barriers(_pingpong_programs(batches, wgs), rng)


def test_pingpong_kernel_emits_that_protocol():
    for persistent in (False, True):
        text = fwd_kernel.build_attention(2, 300, 4, 2, 128, causal=True, config=ForwardConfig(schedule="pingpong", persistent=persistent, consumers=2)).ptx()
        ops = [ln.strip() for ln in text.splitlines() if re.search(r"\bbar\.(sync|arrive)", ln)]
        named = [op for op in ops if op.endswith(", 256;")]
        assert re.fullmatch(r"@!%p\d+ bar\.arrive 3, 256;", named[0])     # warpgroup 1, once
        assert re.fullmatch(r"@%p\d+ bar\.sync 3, 256;", named[-1])       # warpgroup 0, once
        body = named[1:-1]
        assert body and all(op.startswith(("bar.sync %r", "bar.arrive %r")) for op in body)
        assert body[0::2] == [body[0]] * (len(body) // 2)                   # wait, signal, ...
        assert body[1::2] == [body[1]] * (len(body) // 2)


@pytest.mark.parametrize("persistent", [False, True])
def test_three_consumer_pingpong_kernel_emits_that_protocol(persistent):
    """Three consumers: epilogue barriers 1-3, turns on 4-6; warpgroup 2 gives warpgroup 0
    the first turn and warpgroup 0 takes the last one back."""
    text = fwd_kernel.build_attention(2, 300, 4, 2, 64, causal=True, config=ForwardConfig(schedule="pingpong", persistent=persistent, consumers=3)).ptx()
    named = [ln.strip() for ln in text.splitlines()
             if re.search(r"\bbar\.(sync|arrive)", ln) and ln.strip().endswith(", 256;")]
    assert re.fullmatch(r"@%p\d+ bar\.arrive 4, 256;", named[0])
    assert re.fullmatch(r"@%p\d+ bar\.sync 4, 256;", named[-1])
    assert ".maxnreg 128" in text and "setmaxnreg.inc.sync.aligned.u32 160" in text


@pytest.mark.parametrize("schedule", fwd_config.SCHEDULES)
@pytest.mark.parametrize("causal", [False, True])
def test_three_consumers_assemble_without_spills(assemble, schedule, causal):
    """192-row blocks: 512 threads, 160 registers per consumer thread, no spills."""
    k = fwd_kernel.build_attention(2, 500, 4, 2, 64, causal=causal, config=ForwardConfig(schedule=schedule, consumers=3))
    assert "_c3" in k.name and "0 bytes spill stores" in assemble(k.ptx())
    v = fwd_kernel.build_attention_varlen(700, 900, 3, 4, 2, 64, 333, causal=causal, config=ForwardConfig(schedule=schedule, consumers=3))
    assert "0 bytes spill stores" in assemble(v.ptx())


def test_register_budget_of_each_consumer_count():
    assert fwd_config.consumer_regs(2) == (168, 240) and fwd_config.consumer_regs(3) == (128, 160)
    assert fwd_config.smem_bytes(64, 128, 2, consumers=3) == 192 * 128 + 2 * 2 * 128 * 128 + 1024


def test_env_var_selects_persistence(monkeypatch):
    monkeypatch.setenv("PYPTX_ATTN_PERSISTENT", "1")
    assert fwd_host._persistent(None, 128) and not fwd_host._persistent(None, 256)
    assert not fwd_host._persistent(False, 128)
    monkeypatch.setenv("PYPTX_ATTN_PERSISTENT", "0")
    assert not fwd_host._persistent(None, 64) and fwd_host._persistent(True, 64)
    monkeypatch.delenv("PYPTX_ATTN_PERSISTENT")
    assert fwd_host._persistent(None, 128) == fwd_config.DEFAULT_PERSISTENT


def test_env_var_selects_the_schedule(monkeypatch):
    monkeypatch.setenv("PYPTX_ATTN_SCHEDULE", "simple")
    assert "simple" in fwd_kernel.build_attention(1, 128, 1, 1, 64).name
    monkeypatch.delenv("PYPTX_ATTN_SCHEDULE")
    assert fwd_config.DEFAULT_SCHEDULE in fwd_kernel.build_attention(1, 128, 1, 1, 64).name


@pytest.mark.parametrize("kw", [dict(D=96), dict(D=128, BN=192), dict(D=256, BN=128),
                                dict(D=64, BN=200), dict(D=64, schedule="fast"), dict(D=64, dtype="f32"),
                                dict(D=64, Hkv=3), dict(D=128, stages=6),
                                dict(D=256, persistent=True), dict(D=128, rescale_threshold=-1),
                                dict(D=128, rescale_threshold=17), dict(D=128, rescale_threshold="8"),
                                dict(D=128, rescale_threshold=True), dict(D=64, pin_overlap="yes"),
                                dict(D=64, consumers=4), dict(D=64, consumers=True),
                                dict(D=128, BN=128, consumers=3), dict(D=64, BN=192, consumers=3),
                                dict(D=256, consumers=3)])
def test_bad_configurations(kw):
    kw = dict(kw)
    D = kw.pop("D")
    Hkv = kw.pop("Hkv", 1)
    dtype = kw.pop("dtype", "bf16")
    with pytest.raises(ConfigError) as e:
        fwd_kernel.build_attention(1, 128, 4, Hkv, D, dtype=dtype, config=ForwardConfig(**kw))
    assert str(e.value).startswith(f"{__file__}:"), "the message starts at the caller's line"


def test_bad_host_calls_name_the_callers_line():
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 8, 4, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 8, 3, 64, dtype=torch.bfloat16)
    cases = [
        lambda: fwd_host.attention(q, k, k),                                  # Hq % Hkv
        lambda: fwd_host.attention(q[0], q[0], q[0]),                         # rank
        lambda: fwd_host.attention(q.float(), q.float(), q.float()),          # dtype
        lambda: fwd_host.attention(q, q.half(), q.half()),                    # mixed dtypes
        lambda: fwd_host.attention(q, q, q, config=ForwardConfig(consumers=4)),                     # consumer count
        lambda: fwd_host.attention_forward(q, q, q, config=ForwardConfig(BN=192, consumers=3)),     # BN over 3's room
        lambda: fwd_host.attention_varlen(q[0], q[0], q[0], torch.zeros(3, dtype=torch.int32),
                                    torch.zeros(2, dtype=torch.int32), 8, 8),
    ]
    for call in cases:
        with pytest.raises(ConfigError) as e:
            call()
        assert str(e.value).startswith(f"{__file__}:")


def test_default_tiles_per_head_dim():
    """Three consumers where the block fits (BN 128 at D=64, 80 at D=128), two at D=256; a
    given BN that does not fit three gets two; a given consumer count gets its own BN."""
    assert [(fwd_config.default_consumers(D), fwd_config.default_bn(D, fwd_config.default_consumers(D)))
            for D in (64, 128, 256)] == [(3, 128), (3, 80), (2, 64)]
    assert fwd_config.default_consumers(128, 128) == 2 and fwd_config.default_consumers(64, 192) == 2
    k = fwd_kernel.build_attention(1, 300, 2, 1, 128)
    assert "_c3" in k.name and "_bn80_" in k.name and k.block == (512, 1, 1)
    k = fwd_kernel.build_attention(1, 300, 2, 1, 128, config=ForwardConfig(BN=128))
    assert "_c3" not in k.name and k.block == (384, 1, 1)
    assert "_bn128_" in fwd_kernel.build_attention(1, 300, 2, 1, 128, config=ForwardConfig(consumers=2)).name
    with pytest.raises(ConfigError):
        fwd_kernel.build_attention(1, 300, 2, 1, 256, config=ForwardConfig(consumers=3))
