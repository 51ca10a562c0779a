"""The grouped GEMM's kernel builders for mixture-of-experts layers on Hopper tensor cores.

``out[offs[g-1]:offs[g]] = a[offs[g-1]:offs[g]] @ b[g]`` for every group ``g`` (the
``torch._grouped_mm`` convention): ``a`` is ``(M, K)`` bf16 row-major, ``b`` is ``(G, K, N)``
bf16 (or its transposed view, stored ``(G, N, K)``: K-major), ``offs`` an int32 ``(G,)``
tensor on the device holding the cumulative row ends, read by the kernel itself (no host
synchronisation; a call captures in a CUDA graph). Empty groups and sizes that are not tile
multiples are fine.

Each builder assembles the pieces: the plan (``config``), the persistent tile walk
(``scheduler``), the producer's copies and the consumers' ``wgmma`` (``mainloop``) and the
stores (``epilogue``). Warpgroup 0 produces into a ``stages``-deep mbarrier ring, warpgroups
1.. consume it (64 rows each); both walk the same tile sequence ``t = cta, cta + ctas, ...``.

* ``build_grouped``: the forward and the input gradient ``dA = dOut @ b[g]^T`` (B read in the
  other major order, no copy);
* ``build_grouped_wgrad``: ``dB[g] = a_g^T @ dOut_g`` over the fixed ``(K, N)`` tiles of
  every group, reducing over the group's ragged rows (optionally split, ``build_wgrad_split``
  with ``build_split_reduce``).

Limits: rows of ``out`` (and of ``dA``) past ``offs[-1]`` are not written; ``offs`` must be
non-decreasing (values are clamped to ``[previous end, M]``).
"""

from __future__ import annotations

from pyptx import Tile, kernel
from pyptx.arch import register_budget
from pyptx.autotune import Config, autotune
from pyptx.types import b32, bf16, f32, s32, u32, u64
from pyptx_kernels import _family
from pyptx_kernels.grouped_gemm.config import (
    GROUPED_CONFIGS,
    MAX_SPLITS,
    WGRAD_CONFIGS,
    GroupedConfig,
    WgradConfig,
    error,
    out_type,
)
from pyptx_kernels.grouped_gemm.mainloop import (
    ForwardOperands,
    WgradOperands,
    copy_block,
    fill,
    open_ring,
    ring_mma,
)
from pyptx_kernels.grouped_gemm.scheduler import (
    RaggedTiles,
    forward_units,
    group_rows,
    split_blocks,
    uniform_guess,
    wgrad_tile,
    wgrad_unit,
)

PROD_REGS = 40


def _plan(config, cls, what, **default):
    """``config``, or the default plan ``cls(**default)`` for None; anything else raises."""
    if config is None:
        return cls(**default)
    if not isinstance(config, cls):
        raise error(f"{what}: config must be a {cls.__name__}, got {config!r}")
    return config


def build_grouped(M: int, N: int, K: int, G: int, *, b_major="MN", out_dtype="bf16",
                  config: GroupedConfig | None = None):
    """The grouped GEMM kernel ``D[rows of g] = A[rows of g] @ B[g]``.

    Tensor arguments: A ``(M, K)`` bf16, B ``(G, K, N)`` (``b_major="MN"``) or ``(G, N, K)``
    (``"K"``) bf16, offs ``(G,)`` int32 cumulative row ends; output D ``(M, N)`` in
    ``out_dtype`` (``"bf16"`` or ``"f32"``; rows past ``offs[-1]`` are not written). ``N`` and
    ``K`` must be multiples of 8. ``config``: the tile, ring and schedule (a
    ``GroupedConfig``; None: its defaults).
    """
    what = "build_grouped"
    cfg = _plan(config, GroupedConfig, what)
    ot = out_type(out_dtype)
    if b_major not in ("K", "MN"):
        raise error(f"{what}: b_major must be 'K' or 'MN', got {b_major!r}")
    if N % 8 or K % 8:
        raise error(f"{what}: N and K must be multiples of 8 (16-byte rows for the tensor "
                    f"copies), got N={N}, K={K}; pad them (grouped_mm does)")
    BM, BN, BK, cluster = cfg.BM, cfg.BN, cfg.BK, cfg.cluster
    stages, smem_total = cfg.ring_stages, cfg.smem
    consumers = BM // 64
    threads = 128 * (1 + consumers)
    along_m = cluster > 1 and cfg.cluster_along == "m"
    along_n = cluster > 1 and not along_m
    ops = ForwardOperands(BM, BN, BK, b_major, cluster, along_m)
    a_tile, b_tile, stage_bytes = ops.a_tile, ops.b_tile, ops.stage_bytes
    ring_bytes = stages * stage_bytes
    out_cols = 128 // ot.bytes
    unit_m, unit_n, num_n, clusters = forward_units(M, N, G, BM, BN, cluster, along_m,
                                                    cfg.num_sms)
    num_kb = -(-K // BK)
    ctas = clusters * cluster
    maxnreg, cons_regs = register_budget(consumers, PROD_REGS)
    b_spec = Tile(G, K, N, bf16) if b_major == "MN" else Tile(G, N, K, bf16)
    tma = {**ops.tma(), "D": {"box": (64, out_cols), "swizzle": "128B"}}
    spec = min(cfg.speculate, num_kb)

    stride = max(1, cfg.num_sms // cluster)   # the walk's step: see forward_units

    def grouped(A, B, Offs, D):
        # The tracing code, loaded at the first trace: a kernel built from its family's code
        # (this process's or the disk cache's) never imports it (``mainloop`` and
        # ``scheduler`` import it where they emit code).
        from pyptx import ptx, reg
        from pyptx.warpspec import drain_stores
        from pyptx_kernels.grouped_gemm.epilogue import Consumer

        M_rows = ptx.scalar_param(u32, M, "M")   # every M of a family has one PTX
        # the rank comes from the opening, before the role split: the consumers use it too
        base, pipe, tid, wg, rank, cid, p_offs, roles = open_ring(
            stages, consumers, Offs, PROD_REGS, cluster,
            prefetch=(A.tmap, B.tmap, D.tmap) if cfg.prefetch else (),
            early=(lambda: ops.warm(A, B, min(cfg.warm, num_kb), M=M_rows, G=G, BM=BM, BN=BN,
                                    unit_m=unit_m, unit_n=unit_n, num_n=num_n))
            if cfg.warm else None)

        def origin(walk, t):
            """``(g, m0, n0)`` of this CTA's tile in unit ``t``."""
            g, m0, n0 = walk.tile(t, unit_n)
            if along_m:
                return g, m0 + rank * BM, n0
            return g, m0, (n0 + rank * BN if along_n else n0)

        def guess():
            """The guessed first tile ``(g, m0, n0)``, whether it is a tile at all, and a
            first-tile flag: made on each side of the role split (the code before it is the
            producer's), from the CTA index, so both sides agree."""
            gs, ms, ns = uniform_guess(cid, M=M_rows, G=G, BM=BM, BN=BN, num_n=num_n)
            return (gs, ms, ns), gs < G, reg.scalar(u32, init=1)

        def guessed(walk, t, tile, first):
            """Predicate: this is the CTA's first tile and the guess named it."""
            g, m0, n0 = origin(walk, t)
            return (first != 0) & (g == tile[0]) & (m0 == tile[1]) & (n0 == tile[2])

        # ---------------------------------------------------------------- producer
        with ptx.if_(tid == 0):
            st = pipe.producer_state()
            a_map = ptx.tma.tensormap_ptr(A.tmap)
            b_map = ptx.tma.tensormap_ptr(B.tmap)
            hint_a = hint_b = None
            if cfg.l2_hint == "stream_b":
                hint_a, hint_b = ptx.tma.cache_policy("last"), ptx.tma.cache_policy("first")
            walk = RaggedTiles(p_offs, G, M_rows, unit_m, num_n)
            t = reg.scalar(u32, init=cid)
            load = ops.loader(A, a_map, b_map, rank, hint_a, hint_b)

            if spec:    # before any group end is read
                tile, spec_ok, first = guess()
                with ptx.if_(spec_ok):
                    for kb in range(spec):
                        copy_block(pipe, st, base, stage_bytes, kb * BK,
                                   lambda sb, k0, bar: load(sb, *tile, k0, bar))
            top, out = ptx.label("ptile"), ptx.label("pend")
            ptx.place(top)
            walk.seek(t)
            ptx.bra(out, pred=walk.done(t))
            g, m0, n0 = origin(walk, t)
            kb0 = 0
            if spec:    # a hit: the guessed k-blocks are this tile's first
                kb0 = reg.scalar(u32)
                ptx.inst.selp.u32(kb0, spec, 0, spec_ok & guessed(walk, t, tile, first))
                ptx.inst.mov.u32(first, 0)
            fill(pipe, st, base, stage_bytes, kb0, num_kb, lambda kb: kb * BK,
                 lambda sb, k0, bar: load(sb, g, m0, n0, k0, bar))
            t += stride
            ptx.bra(top)
            ptx.place(out)
        # ---------------------------------------------------------------- consumers
        roles.consumers(cons_regs)
        c = Consumer(base, ring_bytes, wg, tid, BN, ot, out_cols)
        mma = ring_mma(c, pipe, a_tile, b_tile, base, stage_bytes, consumers, cluster)
        d_map = ptx.tma.tensormap_ptr(D.tmap)
        (p_d,) = ptx.global_ptrs(D)
        walk = RaggedTiles(p_offs, G, M_rows, unit_m, num_n)
        t = reg.scalar(u32, init=cid)
        if spec:
            tile, spec_ok, first = guess()
        top, out = ptx.label("ctile"), ptx.label("cend")
        ptx.place(top)
        walk.seek(t)
        if spec:    # a miss (or no tile at all): the guessed stages go back unread
            hit = reg.scalar(u32, init=0)
            with ptx.if_(~walk.done(t)):
                ptx.inst.selp.u32(hit, 1, 0, guessed(walk, t, tile, first))
            with ptx.if_(spec_ok & (first != 0) & (hit == 0)):
                for _ in range(spec):
                    mma.skip()
            ptx.inst.mov.u32(first, 0)
        ptx.bra(out, pred=walk.done(t))
        _g, m0, n0 = origin(walk, t)

        mma.run(num_kb)

        mrow = m0 + c.w * 64
        if cfg.store == "masked":
            c.store_masked(p_d, N, mrow, n0, walk.end)
        else:
            with ptx.if_(mrow + 64 <= walk.end):  # the warpgroup's 64 rows lie in the group
                c.store_tma(d_map, lambda j: (n0 + j * out_cols, mrow))
            with ptx.else_():
                c.store_masked(p_d, N, mrow, n0, walk.end)
        t += stride
        ptx.bra(top)
        ptx.place(out)
        drain_stores(c.leader)
        roles.end()
        if cluster > 1:  # the peer may still arrive on this CTA's barriers
            ptx.cluster_sync()
        ptx.ret()

    name = (f"grouped_{ot.name}_{b_major}_{BM}x{BN}x{BK}_s{stages}"
            f"{'_masked' if cfg.store == 'masked' else ''}"
            f"{'_l2' + cfg.l2_hint if cfg.l2_hint else ''}"
            f"{f'_c{cluster}' if cluster > 1 else ''}{'m' if along_m else ''}"
            f"{'_pf' if cfg.prefetch else ''}"
            f"{f'_w{cfg.warm}' if cfg.warm else ''}"
            f"{f'_spec{cfg.speculate}' if cfg.speculate else ''}")
    k = kernel(in_specs=(Tile(M, K, bf16), b_spec, Tile(G, s32)), out_specs=(Tile(M, N, ot),),
               grid=(ctas, 1, 1), block=(threads, 1, 1), cluster=(cluster, 1, 1),
               smem=smem_total, maxnreg=maxnreg, tma=tma, name=name)(grouped)
    return _family.specialized(k, ("grouped", N, K, G, b_major, ot.name, cfg), {"M": M})


def build_grouped_wgrad(M: int, KX: int, NY: int, G: int, *, out_dtype="bf16",
                        config: WgradConfig | None = None):
    """The weight-gradient kernel ``W[g] = X[rows of g]^T @ Y[rows of g]``.

    Tensor arguments: X ``(M, KX)`` bf16, Y ``(M, NY)`` bf16, offs ``(G,)`` int32; output W
    ``(G, KX, NY)`` in ``out_dtype`` (an empty group's W is zero); ``KX`` and ``NY`` multiples
    of 8. Tiles of W are ``BM x BN``; the reduction runs in ``BK``-row blocks over the group's
    rows, the rows of the last block past the group end zeroed in X's shared tile first.

    ``config``: a ``WgradConfig`` (None: its defaults). ``config.splits = S > 1``: ``S`` work
    units per tile, each a contiguous run of the group's row blocks; the output is then ``S``
    f32 partial sums, ``(S * G, KX, NY)`` with split ``s`` of group ``g`` at ``s * G + g``
    (``out_dtype`` must be ``"f32"``), which ``build_split_reduce`` adds in a fixed order
    (deterministic).
    """
    what = "build_grouped_wgrad"
    cfg = _plan(config, WgradConfig, what)
    ot = out_type(out_dtype)
    if KX % 8 or NY % 8:
        raise error(f"{what}: KX and NY must be multiples of 8, got KX={KX}, NY={NY}")
    splits = cfg.splits
    if splits > 1 and ot is not f32:
        raise error(f"{what}: splits={splits} writes f32 partial sums: out_dtype must be "
                    f"'f32', got {out_dtype!r}")
    BM, BN, BK = cfg.BM, cfg.BN, cfg.BK
    stages, smem_total = cfg.ring_stages, cfg.smem
    consumers = BM // 64
    threads = 128 * (1 + consumers)
    ops = WgradOperands(BM, BN, BK)
    a_tile, b_tile, stage_bytes = ops.a_tile, ops.b_tile, ops.stage_bytes
    ring_bytes = stages * stage_bytes
    out_cols = 128 // ot.bytes
    num_m = -(-KX // BM)
    num_n = -(-NY // BN)
    per_group = num_m * num_n
    tiles = G * per_group
    units = tiles * splits  # split-major: unit u is split u // tiles of tile u % tiles
    ctas = max(1, min(cfg.num_sms, units))
    maxnreg, cons_regs = register_budget(consumers, PROD_REGS)
    tma = {**ops.tma(), "W": {"box": (1, 64, out_cols), "swizzle": "128B"}}

    def work(u, p_offs, M_rows):
        """``(g, m0, n0, split, start, end, lo, hi)`` of unit ``u``: its tile, split, group rows
        (clamped to ``M_rows``, the kernel parameter) and row-block run."""
        t, split = wgrad_unit(u, tiles, splits)
        g, m0, n0 = wgrad_tile(t, per_group, num_m, BM, BN)
        start, end = group_rows(p_offs, g, M_rows)
        lo, hi = split_blocks(split, start, end, splits)
        return g, m0, n0, split, start, end, lo, hi

    def wgrad(X, Y, Offs, W):
        from pyptx import ptx
        from pyptx.warpspec import drain_stores
        from pyptx_kernels.grouped_gemm.epilogue import Consumer

        M_rows = ptx.scalar_param(u32, M, "M")   # every M of a family has one PTX
        base, pipe, tid, wg, _, cid, p_offs, roles = open_ring(stages, consumers, Offs,
                                                               PROD_REGS)
        # ---------------------------------------------------------------- producer
        with ptx.if_(tid == 0):
            st = pipe.producer_state()
            x_map = ptx.tma.tensormap_ptr(X.tmap)
            y_map = ptx.tma.tensormap_ptr(Y.tmap)
            for u in ptx.loop(cid, units, ctas):
                g, m0, n0, split, start, end, lo, hi = work(u, p_offs, M_rows)
                fill(pipe, st, base, stage_bytes, lo, hi, lambda kb, start=start: start + kb * BK,
                     ops.loader(X, Y, x_map, y_map, m0, n0))
        # ---------------------------------------------------------------- consumers
        roles.consumers(cons_regs)
        c = Consumer(base, ring_bytes, wg, tid, BN, ot, out_cols)
        mma = ring_mma(c, pipe, a_tile, b_tile, base, stage_bytes, consumers)
        w_map = ptx.tma.tensormap_ptr(W.tmap)
        block = ops.zeroer(c, mma, base, consumers)

        for u in ptx.loop(cid, units, ctas):
            g, m0, n0, split, start, end, lo, hi = work(u, p_offs, M_rows)
            with ptx.if_(hi != lo):
                block(True, lo, start, end)
                for kb in ptx.loop(lo + 1 if splits > 1 else 1, hi):
                    block(False, kb, start, end)
                mma.drain()
            with ptx.else_():
                c.acc.zero()
            mrow = m0 + c.w * 64
            gz = g if split is None else split * G + g
            c.store_tma(w_map, lambda j, n0=n0, mrow=mrow, gz=gz: (n0 + j * out_cols, mrow, gz))
        drain_stores(c.leader)
        roles.end()
        ptx.ret()

    name = f"grouped_wgrad_{ot.name}_{BM}x{BN}x{BK}_s{stages}" + (
        f"_split{splits}" if splits > 1 else "")
    return kernel(in_specs=(Tile(M, KX, bf16), Tile(M, NY, bf16), Tile(G, s32)),
                  out_specs=(Tile(splits * G, KX, NY, ot),), grid=(ctas, 1, 1),
                  block=(threads, 1, 1), smem=smem_total, maxnreg=maxnreg, tma=tma,
                  name=name)(wgrad)
def build_split_reduce(G: int, KX: int, NY: int, splits: int, *, out_dtype="bf16"):
    """The deterministic reduction of ``build_grouped_wgrad(..., splits=S)``'s partial sums:
    ``W[g] = P[g] + P[G + g] + ... + P[(S - 1) * G + g]`` added in that order, in f32, then
    rounded to ``out_dtype``. Tensor arguments: P ``(S * G, KX, NY)`` f32; output W
    ``(G, KX, NY)``. One thread per 8 consecutive elements (``NY % 8 == 0``)."""
    what = "build_split_reduce"
    ot = out_type(out_dtype)
    if KX % 8 or NY % 8:
        raise error(f"{what}: KX and NY must be multiples of 8, got KX={KX}, NY={NY}")
    if isinstance(splits, bool) or not isinstance(splits, int) or not 1 <= splits <= MAX_SPLITS:
        raise error(f"{what}: splits must be an int in 1..{MAX_SPLITS}, got {splits!r}")
    n = G * KX * NY
    if n // 8 >= 2**31:
        raise error(f"{what}: {n} elements are too many for 32-bit thread indices")
    block = 256
    blocks = max(1, -(-n // (block * 8)))

    def reduce(P, W):
        from pyptx import ptx, reg

        pp, pw = ptx.global_ptrs(P, W)
        i = reg.from_(ptx.special.ctaid.x(), u32) * block + reg.from_(ptx.special.tid.x(), u32)
        with ptx.if_(i < n // 8):
            src = reg.from_(i, u64) * 32 + pp
            acc = reg.array(f32, 8)
            ptx.inst.ld.global_.nc.v4.f32(list(acc)[:4], ptx.addr(src))
            ptx.inst.ld.global_.nc.v4.f32(list(acc)[4:], ptx.addr(src, 16))
            for sp in range(1, splits):
                part = reg.array(f32, 8)
                at = src + sp * n * 4
                ptx.inst.ld.global_.nc.v4.f32(list(part)[:4], ptx.addr(at))
                ptx.inst.ld.global_.nc.v4.f32(list(part)[4:], ptx.addr(at, 16))
                for e in range(8):
                    ptx.inst.add.rn.f32(acc[e], acc[e], part[e])
            if ot is f32:
                dst = reg.from_(i, u64) * 32 + pw
                ptx.inst.st.global_.v4.f32(ptx.addr(dst), list(acc)[:4])
                ptx.inst.st.global_.v4.f32(ptx.addr(dst, 16), list(acc)[4:])
            else:
                dst = reg.from_(i, u64) * 16 + pw
                packed = reg.array(b32, 4)
                for m in range(4):
                    ptx.inst("cvt.rn.bf16x2.f32")(packed[m], acc[2 * m + 1], acc[2 * m])
                ptx.inst.st.global_.v4.b32(ptx.addr(dst), list(packed))
        ptx.ret()

    return kernel(in_specs=(Tile(splits * G, KX, NY, f32),), out_specs=(Tile(G, KX, NY, ot),),
                  grid=(blocks, 1, 1), block=(block, 1, 1),
                  name=f"grouped_split_reduce_{ot.name}_s{splits}")(reduce)


class SplitWgrad:
    """The split weight gradient as one kernel-like callable ``(X, Y, offs) -> W``: the
    ``splits``-way ``build_grouped_wgrad`` (f32 partials), then ``build_split_reduce``."""

    def __init__(self, wgrad, reduce):
        self.wgrad, self.reduce = wgrad, reduce
        self.in_specs = tuple(wgrad.in_specs)
        self.out_specs = tuple(reduce.out_specs)
        self.name = f"{wgrad.name}_reduced"
        self.arg_names = ("X", "Y", "Offs", "W")
        self.kernels = (wgrad, reduce)

    def __call__(self, x, y, offs):
        """``W`` (the reduced gradient)."""
        return self.reduce(self.wgrad(x, y, offs))

    def __repr__(self):
        return f"<SplitWgrad {self.name}>"


def build_wgrad_split(M: int, KX: int, NY: int, G: int, *, out_dtype="bf16",
                      config: WgradConfig | None = None):
    """``build_grouped_wgrad`` with ``config`` (None: ``WgradConfig(splits=2)``) writing f32
    partials, followed by their reduction to ``out_dtype``, as one ``SplitWgrad``;
    ``splits=1``: the plain kernel."""
    cfg = _plan(config, WgradConfig, "build_wgrad_split", splits=2)
    if cfg.splits == 1:
        return build_grouped_wgrad(M, KX, NY, G, out_dtype=out_dtype, config=cfg)
    w = build_grouped_wgrad(M, KX, NY, G, out_dtype="f32", config=cfg)
    return SplitWgrad(w, build_split_reduce(G, KX, NY, cfg.splits, out_dtype=out_dtype))


def _grouped_plan(M, N, K, G, *, b_major="MN", out_dtype="bf16", **plan):
    """``build_grouped`` with its plan given as ``GroupedConfig`` keywords (the tuner's
    ``Config`` form)."""
    return build_grouped(M, N, K, G, b_major=b_major, out_dtype=out_dtype,
                         config=GroupedConfig(**plan))


def _wgrad_plan(M, KX, NY, G, *, out_dtype="bf16", **plan):
    """``build_grouped_wgrad`` with its plan given as ``WgradConfig`` keywords."""
    return build_grouped_wgrad(M, KX, NY, G, out_dtype=out_dtype, config=WgradConfig(**plan))


grouped_tuned = autotune([Config(**c.tuner_kwargs()) for c in GROUPED_CONFIGS],
                         key=["M", "N", "K", "G", "b_major", "out_dtype"])(_grouped_plan)
"""``build_grouped`` with its plan chosen from ``GROUPED_CONFIGS`` on the device at the first
launch."""

wgrad_tuned = autotune([Config(**c.tuner_kwargs()) for c in WGRAD_CONFIGS],
                       key=["M", "KX", "NY", "G", "out_dtype"])(_wgrad_plan)
"""``build_grouped_wgrad`` tuned the same way over ``WGRAD_CONFIGS``."""
