"""Scaled FP8 GEMM on Hopper tensor cores: ``D = scale(A @ B)``.

A is ``(M, K)`` e4m3/e5m2 row-major, B is given as ``w`` ``(N, K)`` (K contiguous: both
fp8 wgmma operands must be K-major; torch's ``b = w.t()`` column-major ``(K, N)``),
f32 accumulation, bf16 or f32 output. Three kinds of scale (``scale=``):

* ``"tensor"``: ``sa``, ``sb`` one f32 each (device tensors), ``D = sa * sb * (A @ B)``;
* ``"row"``: ``sa`` ``(M,)`` and ``sb`` ``(N,)`` f32, ``D[m, n] = sa[m] * sb[n] * (A @ B)[m, n]``;
* ``"block"``: ``sa`` ``(M, ceil(K/128))`` (1 x 128 blocks of A), ``sb``
  ``(ceil(N/128), ceil(K/128))`` (128 x 128 blocks of B), ``D[m, n] = sum_kb
  sa[m, kb] * sb[n // 128, kb] * (A @ B over k-block kb)[m, n]``.

The kernel is the warp-specialised persistent design of ``gemm.py``: warpgroup 0
produces (one thread issues bulk tensor copies into an mbarrier ring), warpgroups 1-2
consume 64 rows each, clusters of 2 CTAs along M multicast B, tiles run in grouped
order, the epilogue stores through 128-byte-swizzled shared slabs and bulk tensor
stores. One k-block is ``BK = 128`` fp8 elements: one 128-byte swizzle span per row,
four ``m64nNk32`` wgmma.

Long-K accuracy: the tensor core's fp8 accumulator keeps fewer mantissa bits than f32,
so each k-block's wgmma sum goes into a *partial* accumulator (the first wgmma
overwrites it) and is then added to an f32 register accumulator (``main += part``, or
``main += sa*sb*part`` with block scales): a promotion every 128 K. The partial
accumulator covers at most 128 columns; a 256-column tile runs two column halves
through it per k-block (registers: 128 main + 64 partial). ``fast_accum=True`` skips
the promotion and accumulates in the tensor core over all of K (gemm.py's loop).

Debugging: ``PYPTX_FP8_CONFIG='{"BN": 128, "cluster": 1}'`` fixes the configuration of
every call; ``python fp8_gemm.py simple`` runs the checks with that simplest tile.
"""

from __future__ import annotations

import functools
import json
import os
import sys

from pyptx import Tile, kernel, ptx, reg
from pyptx.autotune import Config, autotune
from pyptx.errors import ConfigError
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.pipeline import Pipeline
from pyptx.source import where_outside
from pyptx.types import b32, bf16, e4m3, e5m2, f32, u32, u64
from pyptx.warpspec import (
    Roles,
    drain_stores,
    grouped_tile_origin,
    load_ab_ring,
    prologue,
    register_budget,
    ring_base,
    store_slabs,
    swizzled_rows,
    thread_ids,
)
from pyptx_kernels._common import PACKAGE_DIR
from pyptx_kernels.gemm import kernel as gemm  # noqa: E402

SCALES = ("tensor", "row", "block")
H100_SMS = 132
SMEM_LIMIT = 227 * 1024 - 256
EPI_BUFS = 2
BK = 128
SCALE_BLOCK = 128
FP8 = {"e4m3": e4m3, "e5m2": e5m2, e4m3: e4m3, e5m2: e5m2}


def _fail(msg):
    """A ``ConfigError`` whose message starts with the ``file:line`` of the first caller
    outside this example and pyptx (the user's call)."""
    return ConfigError(f"{where_outside(PACKAGE_DIR)}: {msg}")


def smem_bytes(BM, BN, stages):
    """Dynamic shared memory: the ring (``BK`` bytes per row of A and B), two 64 x 128-byte
    epilogue slabs per consumer warpgroup and 1024 bytes of alignment slack."""
    return stages * (BM + BN) * BK + (BM // 64) * EPI_BUFS * 64 * 128 + 1024


class Geometry:
    """The tiling of one problem: tiles, the persistent grid and the scale-block counts."""

    def __init__(self, M, N, K, BM, BN, cluster, group_m, num_sms):
        self.BM, self.BN, self.cluster = BM, BN, cluster
        self.num_n = -(-N // BN)
        self.num_m = -(-M // BM)
        self.num_mc = -(-self.num_m // cluster)          # cluster rows of tiles
        self.tiles = self.num_mc * self.num_n
        self.clusters = max(1, min(self.tiles, num_sms // cluster))
        self.num_kb = -(-K // BK)
        self.KS = -(-K // SCALE_BLOCK)                   # scale columns (block kind)
        self.NS = -(-N // SCALE_BLOCK)                   # scale rows of B (block kind)
        self.gm = max(1, min(group_m, self.num_mc))


def tile_origin(t, rank, g):
    """``(m0, n0)`` of cluster tile ``t`` for cluster CTA ``rank``: ``g.gm`` cluster rows per
    band, walked column by column. Works on Python ints (the CPU model) and on u32
    registers (the kernel)."""
    return grouped_tile_origin(t, rank, num_mc=g.num_mc, num_n=g.num_n, gm=g.gm,
                               cluster=g.cluster, BM=g.BM, BN=g.BN)


def partial_columns(BN, fast_accum=False):
    """Columns of the partial (tensor-core) accumulator: the whole tile without promotion,
    else at most 128 (a 192- or 256-column tile runs in two halves per k-block)."""
    return BN if fast_accum or BN <= 128 else BN // 2


PINGPONG_DEPTH = 4
"""Promotion units per ping-pong chain for ``pingpong=True``."""


def check_variant(scale, BN, fast_accum, pingpong, promote_kb, scale_prefetch):
    """Refuse main-loop options that do not apply (``ConfigError``); the chain length of
    ``pingpong`` (0 when off)."""
    if promote_kb not in (1, 2) or isinstance(promote_kb, bool):
        raise _fail(f"build_fp8_gemm: promote_kb must be 1 or 2 (k-blocks of 128 per "
                          f"promotion), got {promote_kb!r}")
    if fast_accum and (pingpong or promote_kb != 1 or scale_prefetch):
        raise _fail("build_fp8_gemm: pingpong, promote_kb and scale_prefetch change the "
                          "promotion; fast_accum has none")
    if promote_kb != 1 and scale == "block":
        raise _fail("build_fp8_gemm: block scales change every 128 K, so they need "
                          "promote_kb=1")
    if pingpong is True:
        pingpong = PINGPONG_DEPTH
    if pingpong and (isinstance(pingpong, bool) or not isinstance(pingpong, int)
                     or not 2 <= pingpong <= 16):
        raise _fail(f"build_fp8_gemm: pingpong must be False, True or the promotion "
                          f"units per chain (2 to 16), got {pingpong!r}")
    if pingpong and partial_columns(BN) != BN:
        raise _fail(f"build_fp8_gemm: pingpong keeps two partial accumulators of the "
                          f"whole tile, so it needs BN <= 128, got {BN}")
    if scale_prefetch and (scale != "block" or pingpong):
        raise _fail("build_fp8_gemm: scale_prefetch is for block scales without "
                          "pingpong (pingpong loads them a k-block ahead already)")
    return int(pingpong or 0)


def promotion_units(num_kb, promote_kb):
    """k-blocks per promotion, in order: ``promote_kb`` each, the last one shorter."""
    units = [promote_kb] * (num_kb // promote_kb)
    return units + ([num_kb % promote_kb] if num_kb % promote_kb else [])


def pingpong_plan(num_kb, promote_kb, depth):
    """``(chains, tail)`` of the ping-pong main loop: ``chains`` device-loop iterations of
    ``depth`` full promotion units each, then the k-block counts of the units left over
    (run as one more chain, statically)."""
    units = promotion_units(num_kb, promote_kb)
    chains = (num_kb // promote_kb) // depth
    return chains, units[chains * depth:]


def chain_events(counts, promote_kb):
    """One ping-pong chain of promotion units (k-block counts ``counts``): unit ``i`` goes
    into partial ``i % 2`` while unit ``i - 1`` is promoted; nothing stays in flight after
    the chain (ptxas serialises every wgmma when a group crosses a loop's back edge).

    Events (``mainloop_plan``): ``("scales", set, kb offset, clamp)``, ``("take", n)``
    ring stages, ``("issue", partial, half)`` one commit group over the stages taken,
    ``("wait", n)`` groups left in flight, ``("release", n)`` oldest held stages,
    ``("promote", partial, half, scale set)``, ``("rotate",)`` scale set 0 = set 1."""
    ev = []
    for i, n in enumerate(counts):
        ev += [("scales", i % 2, i * promote_kb, False), ("take", n), ("issue", i % 2, 0)]
        if i:
            ev += [("wait", 1), ("release", counts[i - 1]), ("promote", (i - 1) % 2, 0, (i - 1) % 2)]
    last = len(counts) - 1
    return ev + [("wait", 0), ("release", counts[last]), ("promote", last % 2, 0, last % 2)]


def unit_events(n, halves, prefetch):
    """One promotion unit of ``n`` k-blocks without ping-pong: each column half's group
    is waited for and promoted before the next; block scales of this unit (``prefetch``:
    of the next one, into set 1, then rotated into set 0)."""
    ev = [("scales", 1, 1, True)] if prefetch else [("scales", 0, 0, False)]
    ev.append(("take", n))
    for h in range(halves):
        ev += [("issue", 0, h), ("wait", 0)]
        if h == halves - 1:
            ev.append(("release", n))
        ev.append(("promote", 0, h, 0))
    return ev + ([("rotate",)] if prefetch else [])


def mainloop_plan(num_kb, promote_kb, pingpong, halves, prefetch):
    """The opt-in main loop of one tile as segments ``(trips, kb step, kb base, events)``:
    ``trips`` None runs the events once at k-block ``base``, else in a device loop at
    k-block ``base + trip * step``; scale offsets are relative to that k-block."""
    units = promotion_units(num_kb, promote_kb)
    full = num_kb // promote_kb
    if pingpong:
        chains, tail = pingpong_plan(num_kb, promote_kb, pingpong)
        plan = [(chains, pingpong * promote_kb, 0, chain_events(units[:pingpong], promote_kb))]
        if tail:
            plan.append((None, 0, chains * pingpong * promote_kb, chain_events(tail, promote_kb)))
        return [seg for seg in plan if seg[0] != 0]
    plan = [(None, 0, 0, [("scales", 0, 0, False)])] if prefetch else []
    if full:
        plan.append((full, promote_kb, 0, unit_events(promote_kb, halves, prefetch)))
    if num_kb % promote_kb:
        plan.append((None, 0, full * promote_kb, unit_events(num_kb % promote_kb, halves, prefetch)))
    return plan


def build_fp8_gemm(M: int, N: int, K: int, *, scale="tensor", dtype="e4m3", dtype_b=None,
                   out_dtype="bf16", BM=128, BN=256, stages=None, cluster=2, group_m=8,
                   num_sms=H100_SMS, fast_accum=False, ND=None, pingpong=False, promote_kb=1,
                   scale_prefetch=False):
    """The scaled FP8 GEMM kernel ``D[M, ND] = scale(A[M, K] @ W[N, K]^T)``.

    Tensor arguments: A ``(M, K)`` and W ``(N, K)`` fp8 (``dtype``, ``dtype_b``: 'e4m3' or
    'e5m2'; K a multiple of 16, the copy engine's row rule), then the scales (module
    docstring: ``scale`` 'tensor' takes two ``(1,)`` f32 tensors); output D ``(M, ND)``
    in ``out_dtype`` ('bf16' or 'f32'), ``ND >= N`` (a padded row; columns past N are 0).
    Tiles: ``BM`` = 128 (two consumer warpgroups) or 64, ``BN`` 64/128/192/256 (with
    block scales 64, 128 or 256), ``stages`` ring buffers (default: as many as fit),
    ``cluster`` 1 or 2 CTAs along M sharing B, ``group_m`` cluster rows per band,
    ``num_sms`` persistent CTAs at most. ``fast_accum``: no promotion (tensor/row only).

    Opt-in main-loop variants (not yet measured on a GPU; docs/dev/fp8-gemm.md):
    ``pingpong`` (BN <= 128) two partial accumulators, so the promotion of one k-block
    runs while the next k-block's wgmma does, in chains of ``pingpong`` promotions
    (``True``: ``PINGPONG_DEPTH``; block scales then load a k-block ahead);
    ``promote_kb`` = 2 (tensor/row) promotes every 256 K instead of 128;
    ``scale_prefetch`` (block, without pingpong) loads the next k-block's scales one
    k-block ahead.
    """
    at = dtype
    dt_a = FP8.get(dtype)
    dt_b = FP8.get(dtype if dtype_b is None else dtype_b)
    if dt_a is None or dt_b is None:
        raise _fail(f"build_fp8_gemm: dtype/dtype_b must be 'e4m3' or 'e5m2', got "
                          f"{at!r}/{dtype_b!r}")
    if scale not in SCALES:
        raise _fail(f"build_fp8_gemm: scale must be one of {SCALES}, got {scale!r}")
    ot = {"bf16": bf16, "f32": f32, bf16: bf16, f32: f32}.get(out_dtype)
    if ot is None:
        raise _fail(f"build_fp8_gemm: out_dtype must be 'bf16' or 'f32', got {out_dtype!r}")
    for name, v in (("M", M), ("N", N), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise _fail(f"build_fp8_gemm: {name} must be a positive int, got {v!r}")
    if K % 16:
        raise _fail(f"build_fp8_gemm: K must be a multiple of 16 (16-byte rows for the "
                          f"copy engine), got {K}; zero-pad A and W along K")
    ND = N if ND is None else ND
    if ND < N or ND * ot.bytes % 16:
        raise _fail(f"build_fp8_gemm: ND must be >= N = {N} with 16-byte output rows, "
                          f"got {ND}")
    if BM not in (64, 128) or BN not in (64, 128, 192, 256):
        raise _fail(f"build_fp8_gemm: unsupported tile {BM}x{BN}")
    if scale == "block" and BN not in (64, 128, 256):
        raise _fail(f"build_fp8_gemm: block scales need BN in 64, 128, 256, got {BN}")
    if fast_accum and scale == "block":
        raise _fail("build_fp8_gemm: block scales are applied at each promotion; "
                          "fast_accum is for 'tensor'/'row' scales")
    if cluster not in (1, 2):
        raise _fail(f"build_fp8_gemm: cluster must be 1 or 2, got {cluster!r}")
    pingpong = check_variant(scale, BN, fast_accum, pingpong, promote_kb, scale_prefetch)
    consumers = BM // 64
    threads = 128 * (1 + consumers)
    if stages is None:
        per_stage = (BM + BN) * BK
        stages = max(2, min(8, (SMEM_LIMIT - smem_bytes(BM, BN, 0)) // per_stage))
    smem_total = smem_bytes(BM, BN, stages)
    if smem_total > SMEM_LIMIT:
        raise _fail(f"build_fp8_gemm: {BM}x{BN} with {stages} stages needs {smem_total} "
                          f"bytes of shared memory, over {SMEM_LIMIT}")

    a_tile = OperandTile(BM, BK, dt_a, major="K", swizzle=128)
    b_tile = OperandTile(BN, BK, dt_b, major="K", swizzle=128)
    a_bytes, b_bytes = a_tile.nbytes, b_tile.nbytes
    stage_bytes = a_bytes + b_bytes
    ring_bytes = stages * stage_bytes
    e_out = ot.bytes
    out_cols = 128 // e_out
    out_slabs = BN // out_cols
    out_slab_bytes = 64 * 128
    wg_out_bytes = EPI_BUFS * out_slab_bytes
    promote = not fast_accum
    NH = partial_columns(BN, fast_accum)
    halves = BN // NH
    variant = pingpong or promote_kb != 1 or scale_prefetch

    g = Geometry(M, N, K, BM, BN, cluster, group_m, num_sms)
    tiles, clusters, num_kb, KS, NS = g.tiles, g.clusters, g.num_kb, g.KS, g.NS
    ctas = clusters * cluster
    prod_regs = 40
    maxnreg, cons_regs = register_budget(consumers, prod_regs)
    multicast = cluster > 1

    if scale == "tensor":
        s_specs = (Tile(1, f32), Tile(1, f32))
    elif scale == "row":
        s_specs = (Tile(M, f32), Tile(N, f32))
    else:
        s_specs = (Tile(M, KS, f32), Tile(NS, KS, f32))
    in_specs = (Tile(M, K, dt_a), Tile(N, K, dt_b)) + s_specs
    tma = {"A": a_tile.tma_options(), "B": b_tile.tma_options(cluster if multicast else 1),
           "D": {"box": (64, out_cols), "swizzle": "128B"}}
    ab = (dt_a.name, dt_b.name)

    def fp8_gemm(A, B, SA, SB, D):
        base = ring_base()
        pipe = Pipeline(stages, consumer_arrivals=consumers * (cluster if multicast else 1))
        tid, wg = thread_ids()
        rank, cid = prologue(pipe, tid, cluster)

        def tile_coords(t):
            return tile_origin(t, rank, g)

        roles = Roles(wg, prod_regs)
        # ---------------------------------------------------------------- producer
        with ptx.if_(tid == 0):
            load_ab_ring(pipe, A, B, a_tile, b_tile, base=base, tile_range=(cid, tiles, clusters),
                         coords=tile_coords, num_kb=num_kb, BK=BK, rank=rank, cluster=cluster,
                         multicast=multicast)
        # ---------------------------------------------------------------- consumers
        roles.consumers(cons_regs)
        w = wg - 1
        t_wg = tid & 127
        leader = t_wg == 0
        bar_id = w + 1
        acc = Accumulator(BN)                       # the f32 register accumulator
        part = Accumulator(NH) if promote else acc  # one k-block's tensor-core sum
        parts = (part, Accumulator(NH)) if pingpong else None
        row0, col0 = acc.thread_origin(t_wg)
        lane = tid & 31
        cbuf = base + ring_bytes + w * wg_out_bytes
        a_desc0 = a_tile.descriptor(base + w * a_tile.offset(0, 64) if consumers > 1 else base)
        b_desc0 = b_tile.descriptor(base, offset=a_bytes)
        cons = pipe.consumer_state()
        rel = pipe.consumer_state()
        release_ranks = range(cluster) if multicast else None
        sw = swizzled_rows(cbuf, row0, lane, e_out)
        psa, psb = ptx.global_ptrs(SA, SB)
        d_map = ptx.tma.tensormap_ptr(D.tmap)
        if scale == "tensor":
            s_a = reg.scalar(f32)
            s_b = reg.scalar(f32)
            ptx.inst.ld.global_.nc.f32(s_a, ptx.addr(psa))
            ptx.inst.ld.global_.nc.f32(s_b, ptx.addr(psb))
            s_ab = s_a * s_b

        def load_f32(ptr, index, ok):
            """``ptr[index]`` (f32) where ``ok`` holds, else 0."""
            v = reg.scalar(f32, init=0.0)
            ptx.inst.ld.global_.nc.f32(v, ptx.addr(ptr + index * 4), pred=ok)
            return v

        def mma_group(da, db, h, first_scale_d):
            ptx.wgmma.fence()
            for kk in range(a_tile.k_steps):
                ptx.wgmma.mma_async(part.regs, a_tile.advance(da, kk),
                                    b_tile.advance(db, kk, mn_start=h * NH), n=NH,
                                    dtype_ab=ab, scale_d=first_scale_d if kk == 0 else 1)
            ptx.wgmma.commit_group()

        def take_stage():
            """Wait for the next ring stage; its A and B descriptors."""
            pipe.wait(cons)
            soff64 = reg.from_(reg.from_(cons.stage * (stage_bytes >> 4), u32), u64)
            cons.advance()
            return a_desc0 + soff64, b_desc0 + soff64

        def issue(p, h, stages_or_count):
            """One commit group: the k-blocks of a promotion unit into partial ``p`` (the
            first wgmma overwrites it), column half ``h``. ``stages_or_count``: descriptors
            already taken, or how many stages to take between the wgmma."""
            ptx.wgmma.fence()
            taken = isinstance(stages_or_count, list)
            n = len(stages_or_count) if taken else stages_or_count
            for kb in range(n):
                da, db = stages_or_count[kb] if taken else take_stage()
                for kk in range(a_tile.k_steps):
                    ptx.wgmma.mma_async(p.regs, a_tile.advance(da, kk),
                                        b_tile.advance(db, kk, mn_start=h * NH), n=NH,
                                        dtype_ab=ab, scale_d=0 if kb == 0 and kk == 0 else 1)
            ptx.wgmma.commit_group()

        def release(n):
            for _ in range(n):
                pipe.release(rel, pred=leader, cta_ranks=release_ranks, sem="release.cta")
                rel.advance()

        def zero_scales():
            return [reg.scalar(f32, init=0.0) for _ in range(2 + halves)]

        def load_scales(regs, ra, nbs, kb, r0):
            """Block scales of k-block ``kb`` into ``regs`` (sa rows r0, r0 + 8, then sb per
            half); a predicate that fails leaves the register as it was (0 from
            ``zero_scales``: the predicates hold or fail for the whole tile)."""
            ptrs = [(psa, ra + kb, r0 < M), (psa, ra + kb + 8 * KS, r0 + 8 < M)]
            ptrs += [(psb, nbk * KS + kb, nbk < NS) for nbk in nbs]
            for v, (ptr, index, ok) in zip(regs, ptrs):
                ptx.inst.ld.global_.nc.f32(v, ptx.addr(ptr + index * 4), pred=ok)

        def promote_into(p, h, sc):
            """``acc[half h] += p`` (times the block scales ``sc``)."""
            if sc is not None:
                s0 = sc[0] * sc[2 + h]
                s1 = sc[1] * sc[2 + h]
            for i in range(len(p)):
                j = h * (NH // 2) + i
                if sc is not None:
                    ptx.inst.fma.rn.f32(acc[j], p[i], s1 if (i // 2) % 2 else s0, acc[j])
                else:
                    ptx.inst.add.f32(acc[j], acc[j], p[i])

        def mainloop_variant(n0, r0):
            """The opt-in main loops (``pingpong``, ``promote_kb``, ``scale_prefetch``),
            emitted from ``mainloop_plan``'s events."""
            block = scale == "block"
            ra = r0 * KS
            nbs = [(n0 + h * NH) >> 7 for h in range(halves)]
            sets = (zero_scales(), zero_scales()) if block else (None, None)
            ps = parts if pingpong else (part, part)

            def emit(kb, events):
                taken = 0
                for ev in events:
                    op = ev[0]
                    if op == "scales" and block:
                        at = kb + ev[2] if ev[2] else kb
                        if ev[3]:
                            at = gemm.ptx_min(at, num_kb - 1) if not isinstance(at, int) \
                                else min(at, num_kb - 1)
                        load_scales(sets[ev[1]], ra, nbs, at, r0)
                    elif op == "take":
                        taken = [take_stage() for _ in range(ev[1])] if halves > 1 else ev[1]
                    elif op == "issue":
                        issue(ps[ev[1]], ev[2], taken)
                    elif op == "wait":
                        ptx.wgmma.wait_group(ev[1])
                    elif op == "release":
                        release(ev[1])
                    elif op == "promote":
                        promote_into(ps[ev[1]], ev[2], sets[ev[3]])
                    elif op == "rotate" and block:
                        for c, v in zip(*sets):
                            ptx.inst.mov.f32(c, v)

            for trips, step, base, events in mainloop_plan(num_kb, promote_kb, pingpong,
                                                           halves, scale_prefetch):
                if trips is None:
                    emit(base, events)
                    continue
                for c in ptx.loop(0, trips):
                    kb = c * step if step != 1 else c
                    emit(kb + base if base else kb, events)

        for t in ptx.loop(cid, tiles, clusters):
            m0, n0 = tile_coords(t)
            r0 = m0 + w * 64 + row0                 # this thread's rows r0 and r0 + 8
            if variant:
                acc.zero()
                mainloop_variant(n0, r0)
            elif promote:
                acc.zero()

                if scale == "block":
                    ra = r0 * KS  # row r0's scales; row r0 + 8's are 8 * KS further
                    nbs = [(n0 + h * NH) >> 7 for h in range(halves)]  # B's scale rows
                for kb in ptx.loop(0, num_kb):
                    if scale == "block":
                        sa0 = load_f32(psa, ra + kb, r0 < M)
                        sa1 = load_f32(psa, ra + kb + 8 * KS, r0 + 8 < M)
                        sbs = [load_f32(psb, nbk * KS + kb, nbk < NS) for nbk in nbs]
                    pipe.wait(cons)
                    soff64 = reg.from_(reg.from_(cons.stage * (stage_bytes >> 4), u32), u64)
                    da = a_desc0 + soff64
                    db = b_desc0 + soff64
                    for h in range(halves):
                        mma_group(da, db, h, 0)
                        ptx.wgmma.wait_group(0)
                        if h == halves - 1:
                            pipe.release(rel, pred=leader, cta_ranks=release_ranks,
                                         sem="release.cta")
                            rel.advance()
                        if scale == "block":
                            s0 = sa0 * sbs[h]
                            s1 = sa1 * sbs[h]
                        for i in range(len(part)):
                            j = h * (NH // 2) + i
                            if scale == "block":
                                s = s1 if (i // 2) % 2 else s0
                                ptx.inst.fma.rn.f32(acc[j], part[i], s, acc[j])
                            else:
                                ptx.inst.add.f32(acc[j], acc[j], part[i])
                    cons.advance()

            else:
                def k_block(first):
                    pipe.wait(cons)
                    soff64 = reg.from_(reg.from_(cons.stage * (stage_bytes >> 4), u32), u64)
                    mma_group(a_desc0 + soff64, b_desc0 + soff64, 0, 0 if first else 1)
                    if not first:
                        ptx.wgmma.wait_group(1)
                        pipe.release(rel, pred=leader, cta_ranks=release_ranks,
                                     sem="release.cta")
                        rel.advance()
                    cons.advance()

                k_block(True)
                for _kb in ptx.loop(1, num_kb):
                    k_block(False)
                ptx.wgmma.wait_group(0)
                pipe.release(rel, pred=leader, cta_ranks=release_ranks, sem="release.cta")
                rel.advance()

            # ------------------------------------------------------------ epilogue
            sr = ncol = None
            if scale == "row":
                sr = (load_f32(psa, r0, r0 < M), load_f32(psa, r0 + 8, r0 + 8 < M))
                ncol = n0 + col0
            mrow = m0 + w * 64

            def write(j, buf, sr=sr, ncol=ncol):
                col_scale = {}
                for i, dr, dc in acc.pairs():
                    if dc // out_cols != j:
                        continue
                    v0, v1 = acc[i], acc[i + 1]
                    if scale == "tensor":
                        v0, v1 = v0 * s_ab, v1 * s_ab
                    elif scale == "row":
                        if dc not in col_scale:  # once per column pair, for both rows
                            c0 = ncol + dc
                            col_scale[dc] = (load_f32(psb, c0, c0 < N),
                                             load_f32(psb, c0 + 1, c0 + 1 < N))
                        rs = sr[1] if dr else sr[0]
                        v0 = v0 * rs * col_scale[dc][0]
                        v1 = v1 * rs * col_scale[dc][1]
                    q = dc % out_cols * e_out // 16
                    off = buf + dr * 128
                    if ot is f32:
                        ptx.inst.st.shared.v2.f32(ptx.addr(sw[q], off), [v0, v1])
                    else:
                        packed = reg.scalar(b32)
                        ptx.inst("cvt.rn.bf16x2.f32")(packed, v1, v0)
                        ptx.inst.st.shared.b32(ptx.addr(sw[q], off), packed)

            store_slabs(out_slabs, leader=leader, bar_id=bar_id, cbuf=cbuf, tmap=d_map,
                        write=write, bufs=EPI_BUFS,
                        coords=lambda j, n0=n0, mrow=mrow: (n0 + j * out_cols, mrow))
        drain_stores(leader)
        roles.end()
        if cluster > 1:
            ptx.cluster_sync()
        ptx.ret()

    name = (f"fp8_gemm_{scale}_{dt_a.name}{dt_b.name}_{ot.name}_{BM}x{BN}_s{stages}_c{cluster}"
            f"{'_fast' if fast_accum else ''}{f'_pp{pingpong}' if pingpong else ''}"
            f"{f'_k{promote_kb * BK}' if promote_kb != 1 else ''}{'_pf' if scale_prefetch else ''}")
    fp8_gemm.__name__ = name
    deco = kernel(in_specs=in_specs, out_specs=(Tile(M, ND, ot),), grid=(ctas, 1, 1),
                  block=(threads, 1, 1), cluster=(cluster, 1, 1), smem=smem_total,
                  maxnreg=maxnreg, tma=tma, name=name)
    return deco(fp8_gemm)


# ------------------------------------------------------------------------ host side
FP8_CONFIGS = [
    Config(BN=256, cluster=2),
    Config(BN=256, cluster=1),
    Config(BN=128, cluster=1),
    Config(BN=128, cluster=2),
]
"""The tile configurations the tuner times per shape (BM = 128: two consumer warpgroups);
the first is the default when ``PYPTX_AUTOTUNE=0``."""

fp8_gemm_tuned = autotune(FP8_CONFIGS, key=["M", "N", "K", "scale", "dtype", "dtype_b",
                                             "out_dtype", "fast_accum", "ND"])(build_fp8_gemm)
"""``build_fp8_gemm`` with its tile configuration chosen on the device at the first launch."""

_TORCH_FP8 = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def _env_config():
    text = os.environ.get("PYPTX_FP8_CONFIG")
    return json.loads(text) if text else None


@functools.lru_cache(maxsize=256)
def _cached(M, N, K, key, config):
    kw = dict(key)
    if config is None:
        return fp8_gemm_tuned(M, N, K, **kw)
    return build_fp8_gemm(M, N, K, **kw, **dict(config))


def scale_kind(sa_shape, sb_shape, M, N, K):
    """'tensor', 'row' or 'block' from the scales' shapes (``scaled_mm``'s rules), or None.
    Where two kinds fit (M = N = 1, or K <= 128 and N = 1) they compute the same thing."""
    sa, sb = tuple(sa_shape), tuple(sb_shape)
    ks, ns = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    if sa in ((), (1,), (1, 1)) and sb in ((), (1,), (1, 1)):
        return "tensor"
    if sa in ((M, 1), (M,)) and sb in ((1, N), (N,)):
        return "row"
    if sa == (M, ks) and sb == (ns, ks):
        return "block"
    return None


def _fp8_name(x, what):
    name = _TORCH_FP8.get(str(x.dtype).replace("torch.", ""))
    if name is None:
        raise _fail(f"scaled_mm: {what} must be float8_e4m3fn or float8_e5m2, got {x.dtype}")
    return name


def scaled_mm(a, b, scale_a, scale_b, *, out_dtype="bf16", scale=None, fast_accum=False,
              trans_b=False, config=None):
    """``D = scale(a @ b)`` with the pyptx FP8 GEMM, for torch tensors or JAX arrays.

    ``a``: ``(M, K)`` fp8, K contiguous. ``b``: ``(K, N)`` with N-stride K (torch's
    ``_scaled_mm`` convention, ``b = w.t()`` for a contiguous ``w`` ``(N, K)``); a
    row-major ``(K, N)`` torch ``b`` is transposed into a copy first; ``trans_b=True``
    passes ``w`` ``(N, K)`` itself (the JAX spelling). Scales (f32): one each
    (``"tensor"``), ``(M, 1)`` and ``(1, N)`` (``"row"``), or ``(M, ceil(K/128))`` and
    ``(ceil(N/128), ceil(K/128))`` (``"block"``); ``scale`` names the kind where the
    shapes are ambiguous. ``out_dtype``: 'bf16' or 'f32'. K is zero-padded to a multiple
    of 16 when needed; ``config`` (dict of ``build_fp8_gemm`` keywords) fixes the tile.
    """
    lib = "torch" if type(a).__module__.startswith("torch") else "jax"
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise _fail(f"scaled_mm expects 2-D operands, got {tuple(a.shape)} and "
                          f"{tuple(b.shape)}")
    M, K = tuple(a.shape)
    if lib == "torch":
        if trans_b:
            w = b.contiguous()
        else:
            w = b.T if b.T.is_contiguous() else b.T.contiguous()
        a = a.contiguous()
    else:
        import jax.numpy as jnp

        w = b if trans_b else jnp.transpose(b)
    N, Kb = tuple(w.shape)
    if Kb != K:
        raise _fail(f"scaled_mm: inner dimensions differ: a is {M}x{K}, b is {Kb}x{N}")
    da, db = _fp8_name(a, "a"), _fp8_name(w, "b")
    if out_dtype not in ("bf16", "f32"):
        raise _fail(f"scaled_mm: out_dtype must be 'bf16' or 'f32', got {out_dtype!r}")
    found = scale_kind(scale_a.shape, scale_b.shape, M, N, K)
    kind = scale or found
    if kind not in SCALES or found is None:
        raise _fail(
            f"scaled_mm: scale shapes {tuple(scale_a.shape)} and {tuple(scale_b.shape)} fit no "
            f"scale kind for {M}x{N}x{K}: want one element each, (M, 1) and (1, N), or "
            f"(M, ceil(K/128)) and (ceil(N/128), ceil(K/128))")
    ND = N + (-N % (8 if out_dtype == "bf16" else 4))
    if K % 16:
        a, w = _pad_k(a, lib), _pad_k(w, lib)
    KP = a.shape[1]
    if lib == "torch":
        sa = scale_a.float().reshape(-1 if kind != "block" else scale_a.shape).contiguous()
        sb = scale_b.float().reshape(-1 if kind != "block" else scale_b.shape).contiguous()
    else:
        import jax.numpy as jnp

        sa = jnp.asarray(scale_a, jnp.float32)
        sb = jnp.asarray(scale_b, jnp.float32)
        if kind != "block":
            sa, sb = sa.reshape(-1), sb.reshape(-1)
    key = tuple(sorted(dict(scale=kind, dtype=da, dtype_b=db, out_dtype=out_dtype,
                            fast_accum=bool(fast_accum), ND=ND).items()))
    config = config or _env_config()
    k = _cached(M, N, KP, key, tuple(sorted(config.items())) if config else None)
    d = k(a, w, sa, sb)
    return d[:, :N] if ND != N else d


def _pad_k(x, lib):
    extra = -x.shape[1] % 16
    if lib == "torch":
        import torch.nn.functional as F

        return F.pad(x.view(__import__("torch").uint8), (0, extra)).view(x.dtype)
    import jax.numpy as jnp

    return jnp.pad(x, ((0, 0), (0, extra)))


def reference(a, w, sa, sb, kind):
    """float64 ``scale(a @ w.T)`` of the dequantised inputs (torch; ``w`` is ``(N, K)``)."""
    a64, w64 = a.double(), w.double()
    sa64, sb64 = sa.double(), sb.double()
    M, K = a.shape
    N = w.shape[0]
    if kind == "tensor":
        return (a64 @ w64.T) * sa64.reshape(()) * sb64.reshape(())
    if kind == "row":
        return (a64 @ w64.T) * sa64.reshape(M, 1) * sb64.reshape(1, N)
    ea = sa64.repeat_interleave(SCALE_BLOCK, 1)[:, :K]
    eb = sb64.repeat_interleave(SCALE_BLOCK, 0).repeat_interleave(SCALE_BLOCK, 1)[:N, :K]
    return (a64 * ea) @ (w64 * eb).T


def make_inputs(M, N, K, kind, dtype="e4m3", dtype_b=None, device="cuda", seed=0,
                positive=False):
    """Random fp8 ``a`` (M, K), ``w`` (N, K) and f32 scales of ``kind`` (torch)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    tdt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}

    def rnd(*shape):
        x = torch.rand(*shape, generator=g) if positive else torch.randn(*shape, generator=g)
        return x

    a = (rnd(M, K) * 2).to(tdt[dtype]).to(device)
    w = (rnd(N, K) * 2).to(tdt[dtype_b or dtype]).to(device)
    return (a, w) + make_scales(M, N, K, kind, device=device, generator=g)


def make_scales(M, N, K, kind, *, device="cuda", generator=None):
    """Random f32 scales in [0.5, 1.5) of ``kind``'s shapes (torch)."""
    import torch

    ks, ns = -(-K // SCALE_BLOCK), -(-N // SCALE_BLOCK)
    shapes = {"tensor": ((), ()), "row": ((M, 1), (1, N)), "block": ((M, ks), (ns, ks))}[kind]
    sa = (torch.rand(shapes[0], generator=generator) + 0.5).to(device)
    sb = (torch.rand(shapes[1], generator=generator) + 0.5).to(device)
    return sa, sb


TOL = {"bf16": 8e-3, "f32": 3e-3}
"""Tolerances on ``||D - ref|| / ||ref||``: bf16 output rounding (~2**-9 per element),
f32 output: the tensor core's fp8 accumulation inside one 128-K block."""


def rel_err(d, ref):
    """``||d - ref|| / ||ref||`` in float64; NaN (poisoned, unwritten) elements give inf."""
    import torch

    if torch.isnan(d).any():
        return float("inf")
    return ((d.double() - ref).norm() / ref.norm()).item()


def long_k_errors(M=256, N=256, K=16384, positive=False, seed=1, config=None):
    """Errors against float64 at long K (per-tensor scales, f32 output): ours promoted
    (with ``config``, e.g. an opt-in main loop), ours without promotion,
    ``torch._scaled_mm`` (exact and fast accumulation)."""
    import torch

    a, w, sa, sb = make_inputs(M, N, K, "tensor", seed=seed, positive=positive)
    ref = reference(a, w, sa, sb, "tensor")
    out = {"pyptx (promoted)": scaled_mm(a, w.t(), sa, sb, out_dtype="f32", config=config),
           "pyptx fast_accum": scaled_mm(a, w.t(), sa, sb, out_dtype="f32", fast_accum=True)}
    for fast in (False, True):
        try:
            out[f"torch._scaled_mm{' fast' if fast else ''}"] = torch._scaled_mm(
                a, w.t(), scale_a=sa, scale_b=sb,
                out_dtype=torch.float32, use_fast_accum=fast)
        except Exception as e:  # noqa: BLE001 - report what this torch lacks
            print(f"torch._scaled_mm(use_fast_accum={fast}) unavailable: {e}")
    return {k: rel_err(v, ref) for k, v in out.items()}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "simple" in argv:
        os.environ["PYPTX_FP8_CONFIG"] = json.dumps({"BN": 128, "cluster": 1})
    cfg = _env_config()
    if cfg:
        print(f"config fixed: {cfg}")
    fails = 0

    def check(label, d, ref, tol):
        nonlocal fails
        err = rel_err(d, ref)
        ok = err < tol
        fails += not ok
        print(f"{label}: rel err {err:.2e} (tol {tol:.0e}) {'PASS' if ok else 'FAIL'}", flush=True)

    cases = [(256, 512, 384, "e4m3", "e4m3", "bf16"), (1000, 520, 400, "e4m3", "e4m3", "f32"),
             (200, 328, 136, "e5m2", "e5m2", "bf16"), (129, 65, 16, "e4m3", "e5m2", "f32"),
             (4095, 4097, 4112, "e4m3", "e4m3", "bf16")]
    for kind in SCALES:
        for M, N, K, da, db, out in cases:
            a, w, sa, sb = make_inputs(M, N, K, kind, da, db)
            ref = reference(a, w, sa, sb, kind)
            d = scaled_mm(a, w.t(), sa, sb, out_dtype=out)
            check(f"{kind} {M}x{N}x{K} {da}x{db} -> {out}", d, ref, TOL[out])
            if kind != "block" and M < 4000:
                d = scaled_mm(a, w.t(), sa, sb, out_dtype=out, fast_accum=True)
                check(f"{kind} {M}x{N}x{K} {da}x{db} -> {out} fast_accum", d, ref, TOL[out])
    for explicit in ({"BN": 128, "cluster": 1}, {"BN": 256, "cluster": 2}, {"BN": 64, "cluster": 2}):
        a, w, sa, sb = make_inputs(777, 1500, 1000, "block")
        d = scaled_mm(a, w.t(), sa, sb, config=explicit)
        check(f"block 777x1500x1000 config {explicit}", d, reference(a, w, sa, sb, "block"), TOL["bf16"])
    # long K: promotion against the tensor core's own accumulation, and torch._scaled_mm
    for positive in (False, True):
        errs = long_k_errors(positive=positive)
        print(f"K=16384 {'uniform[0,1)' if positive else 'normal'} inputs, f32 out, rel err vs "
              f"float64: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
        ok = errs["pyptx (promoted)"] < TOL["f32"]
        fails += not ok
        print(f"K=16384 promoted rel err {errs['pyptx (promoted)']:.2e} {'PASS' if ok else 'FAIL'}")
    print("all PASS" if not fails else f"{fails} FAIL")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
