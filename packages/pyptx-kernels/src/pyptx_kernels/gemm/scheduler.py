"""The GEMM's tile scheduler: the persistent grid and its grouped tile order
(``TileSchedule``), the split-tail work decomposition (``split_tail_plan``, its host model
``split_tail_items``, the partial-sum fix-up ``SplitTailFixup``) and the split-tail
kernel's host wrapper (``SplitTailGemm``, ``zeroed_flags``).

The host side (the schedule's sizes, plan, grid and parameters) imports no tracing code: the
methods that emit code import it (a kernel built from its family's stored code never does)."""

from __future__ import annotations

import copy

from pyptx.errors import ConfigError
from pyptx.types import f32, u32, u64
from pyptx_kernels._common import fail, zeroed_words

FLAG_WORDS = 4096
"""Length of a split-tail kernel's ``FLAGS`` input (u32 words, zero between launches)."""


def split_tail_plan(tiles, clusters, num_kb, max_split=8, min_blocks=4):
    """``(waves, rest, split)`` of a split-tail schedule, or None where it gains nothing.

    The persistent walk runs ``waves = tiles // clusters`` whole waves; the ``rest`` tiles
    of the partial wave after them are cut along K into ``split`` chunks of at least
    ``min_blocks`` k-blocks (2..``max_split``, the count whose ``rest * split`` pieces fill
    the clusters' last rounds best), handed out round-robin: piece ``p`` is chunk ``p //
    rest`` of tile ``p % rest``, so the clusters of a round work on at most two chunks (their
    operands shared in L2 as in a whole wave). The tail then takes ``ceil(rest * split /
    clusters) / split`` of a tile's time instead of a whole one."""
    waves, rest = divmod(tiles, clusters)
    if not rest:
        return None
    best, split = 1.0, 0
    for s in range(2, max_split + 1):
        if num_kb // s < min_blocks:
            break
        cost = -(-rest * s // clusters) / s
        if cost < best - 1e-9:
            best, split = cost, s
    return (waves, rest, split) if split else None


def split_tail_items(tiles, clusters, num_kb):
    """The host model of ``split_tail_plan``'s schedule: per cluster, its ``(tile, kb0,
    kb1)`` items in order (its whole tiles, then its pieces of the tail), or None."""
    plan = split_tail_plan(tiles, clusters, num_kb)
    if plan is None:
        return None
    waves, rest, split = plan
    out = []
    for c in range(clusters):
        items = [(c + i * clusters, 0, num_kb) for i in range(waves)]
        for p in range(c, rest * split, clusters):
            chunk = p // rest
            items.append((waves * clusters + p % rest, chunk * num_kb // split,
                          (chunk + 1) * num_kb // split))
        out.append(items)
    return out


class TileSchedule:
    """The work of an ``M x N`` product (``K`` deep, B's extents ``KB``/``NB``) under a
    ``GemmConfig``: cluster tiles ``tiles`` (``num_mc`` rows x ``num_nc`` columns), k-blocks
    ``num_kb``, the split-tail ``plan`` (None: the plain persistent walk) and the grid of
    ``clusters`` clusters (``ctas`` CTAs): a cluster per tile up to the SMs' worth, all of
    them with a split tail, whose pieces may outnumber the tiles.

    Runtime M and K: the plain walk's kernel reads what depends on M or K from kernel
    parameters (``bind``: ``M``, ``num_mc``, ``tiles``, ``num_kb``), so one PTX serves every
    ``M x K`` of an N (a weight gradient's K is the token count); only the grid differs. Its
    loop strides by the constant ``num_sms // cluster``, which is the cluster count whenever
    a cluster has more than one tile (with fewer tiles than that each cluster has one, and
    any stride ends its loop). A split-tail kernel keeps its shape-specific constants (its
    plan is chosen per shape)."""

    def __init__(self, M, N, K, KB, cfg):
        self.cfg = cfg
        BM, BN, cluster = cfg.BM, cfg.BN, cfg.cluster
        self.M = M
        num_m, self.num_n = -(-M // BM), -(-N // BN)
        self.num_mc = -(-num_m // cluster)   # cluster rows of tiles
        self.tiles = self.num_mc * self.num_n
        self.num_kb = -(-max(K, KB) // cfg.BK)
        self.stride = max(1, cfg.num_sms // cluster)
        self.plan = (split_tail_plan(self.tiles, self.stride, self.num_kb)
                     if cfg.split_tail else None)
        self.clusters = self.stride if self.plan else max(1, min(self.tiles, self.stride))
        self.ctas = self.clusters * cluster
        # a band of group_m cluster rows where fewer remain is the same order as one of fewer
        self.gm = cfg.group_m

    def bind(self):
        """This schedule as the kernel sees it, emitting its parameter loads (call inside the
        kernel body): a copy whose ``M``, ``num_mc``, ``tiles`` and ``num_kb`` are registers
        loaded from the kernel parameters of those names (the plain walk), or itself (a split
        tail)."""
        if self.plan:
            return self
        from pyptx import ptx

        bound = copy.copy(self)
        for name, value in self.params().items():
            setattr(bound, name, ptx.scalar_param(u32, value, name))
        return bound

    def params(self):
        """The kernel parameters of the plain walk, by name (``bind`` declares them; a kernel
        of another M or K reuses the traced code with these values: ``pyptx_kernels._family``);
        empty for a split tail, whose constants are in the code."""
        if self.plan:
            return {}
        return {name: getattr(self, name) for name in ("M", "num_mc", "tiles", "num_kb")}

    def coords(self, t, rank):
        """(m0, n0) of CTA ``rank``'s part of cluster tile ``t``, grouped ``gm`` cluster rows
        per band."""
        from pyptx.warpspec import grouped_tile_origin

        cfg = self.cfg
        return grouped_tile_origin(t, rank, num_mc=self.num_mc, num_n=self.num_n, gm=self.gm,
                                   cluster=cfg.cluster, BM=cfg.BM, BN=cfg.BN)

    def work(self, cid):
        """``(loop range, items)`` of cluster ``cid``'s work: the plain persistent walk
        (``items`` None: the loop index is the tile), or with a split tail its whole tiles
        then its pieces of the tail (``items(j) = (t, kb0, kb1, chunk)``, ``chunk`` ``nsplit``
        for a whole tile)."""
        clusters, num_kb = self.clusters, self.num_kb
        if not self.plan:
            return (cid, self.tiles, self.stride), None
        waves, rest, nsplit = self.plan
        pieces = (rest * nsplit + clusters - 1 - cid) // clusters

        def item(j):
            from pyptx import ptx, reg

            whole = j < waves
            p = (j - waves) * clusters + cid
            t, chunk, kb0, kb1 = (reg.scalar(u32) for _ in range(4))
            ptx.inst.selp.u32(t, j * clusters + cid, p % rest + waves * clusters, whole)
            ptx.inst.selp.u32(chunk, nsplit, p // rest, whole)
            ptx.inst.selp.u32(kb0, 0, chunk * num_kb // nsplit, whole)
            ptx.inst.selp.u32(kb1, num_kb, (chunk + 1) * num_kb // nsplit, whole)
            return t, kb0, kb1, chunk
        return (0, waves + pieces), item


class SplitTailFixup:
    """The split tail's partial sums, device side: a piece other than a tile's last chunk
    leaves its f32 partial tile in the workspace ``WS`` (slot: tail tile, chunk) and counts
    it on the tile's flag in ``Flags`` (``share``); the last chunk's warpgroup waits for
    ``nsplit - 1`` counts, zeroes the flag and adds the partials into its accumulators
    (``take``)."""

    def __init__(self, Flags, WS, *, accs, plan, cluster, consumers, rank, w, t_wg, leader,
                 bar_id, part_bytes, BN):
        from pyptx import ptx, reg

        self.nsplit = plan[2]
        (self.pflags, self.pws) = ptx.global_ptrs(Flags, WS)
        self.mine = rank * consumers + w if cluster > 1 else w
        self.chunks = BN // 8                      # 16-byte chunks per thread and accumulator
        self.lane_off = reg.from_(t_wg, u64) * 16
        self.accs, self.per_tile, self.part_bytes = accs, cluster * consumers, part_bytes
        self.leader, self.bar_id = leader, bar_id

    def _flag(self, tail):
        from pyptx import reg

        return reg.from_(tail * self.per_tile + self.mine, u64) * 4 + self.pflags

    def _part(self, tail, chunk):
        from pyptx import reg

        idx = (tail * (self.nsplit - 1) + chunk) * self.per_tile + self.mine
        return reg.from_(idx, u64) * self.part_bytes + self.pws + self.lane_off

    def share(self, tail, chunk):
        """Store this warpgroup's partial sum of ``chunk`` of tail tile ``tail`` and count it."""
        from pyptx import ptx

        part = self._part(tail, chunk)
        for b, a in enumerate(self.accs):
            for q in range(self.chunks):
                ptx.inst.st.global_.v4.f32(ptx.addr(part, (b * self.chunks + q) * 2048),
                                           [a[4 * q + i] for i in range(4)])
        ptx.bar_sync(self.bar_id, 128)
        with ptx.if_(self.leader):
            ptx.inst("red.release.gpu.global.add.u32")(ptx.addr(self._flag(tail)), 1)

    def take(self, tail):
        """Wait for the other chunks of tail tile ``tail`` and add their partial sums."""
        from pyptx import ptx, reg

        with ptx.if_(self.leader):
            flag = self._flag(tail)
            now = reg.scalar(u32)

            def pending():
                ptx.inst("ld.acquire.gpu.global.u32")(now, ptx.addr(flag))
                return now != self.nsplit - 1

            with ptx.while_(pending):
                pass
            ptx.inst("st.relaxed.gpu.global.u32")(ptx.addr(flag), 0)
        ptx.bar_sync(self.bar_id, 128)
        # a device loop over the other chunks keeps one partial tile's loads in flight
        # (unrolled, ptxas hoists them all and spills)
        for chunk in ptx.loop(0, self.nsplit - 1):
            part = self._part(tail, chunk)
            for b, a in enumerate(self.accs):
                for q in range(self.chunks):
                    got = [reg.scalar(f32) for _ in range(4)]
                    ptx.inst("ld.relaxed.gpu.global.v4.f32")(
                        got, ptx.addr(part, (b * self.chunks + q) * 2048))
                    for i in range(4):
                        ptx.inst.add.f32(a[4 * q + i], a[4 * q + i], got[i])


class SplitTailGemm:
    """A split-tail GEMM kernel behind the plain GEMM's call: ``gemm(a, b[, bias]) -> d``.

    It passes the kernel a zeroed flag array (``zeroed_flags``: one per device and stream
    for torch eager calls, which the kernel leaves zeroed; a fresh one in a CUDA-graph
    capture, a ``torch.compile`` trace or JAX) and drops the partial sums' workspace from
    the results. Kernel-like (``in_specs``, ``out_specs``, ``name``, ``arg_names``,
    ``kernels``) for the tuner and ``differentiable_kernel``."""

    def __init__(self, kernel, ctas):
        self.kernel = kernel
        self.kernels = (kernel,)
        self.in_specs = kernel.in_specs[:-1]
        self.out_specs = kernel.out_specs[:1]
        self.name = kernel.name
        n_in = len(kernel.in_specs)
        self.arg_names = kernel.arg_names[:n_in - 1] + kernel.arg_names[n_in:n_in + 1]
        self.ctas = ctas
        self.resident = False

    def __call__(self, *args):
        if not self.resident:
            self._check_resident()
        d, _ = self.kernel(*args, zeroed_flags(args[0]))
        return d

    def _check_resident(self):
        """The last chunk of a tile waits for CTAs of the same grid: every CTA must be on an
        SM at once (one per SM), so a GPU with fewer SMs than the grid is refused rather
        than left to hang."""
        from pyptx import driver

        n = driver.device_count()
        sms = min(driver.multiprocessor_count(i) for i in range(n)) if n else self.ctas
        if self.ctas > sms:
            raise fail(ConfigError, self.name,
                       f"a split tail runs {self.ctas} CTAs that wait for each other, one per "
                       f"SM, but this GPU has {sms} SMs: build it with "
                       f"GemmConfig(num_sms={sms})")
        self.resident = True

    def ptx(self):
        """The kernel's PTX."""
        return self.kernel.ptx()

    def specialize(self, *args, **kwargs):
        """The kernel's ``Specialization`` (``Kernel.specialize``)."""
        return self.kernel.specialize(*args, **kwargs)

    def __repr__(self):
        return f"<SplitTailGemm {self.name}>"


def zeroed_flags(like):
    """``FLAG_WORDS`` zeroed u32 words on ``like``'s device for a split-tail launch
    (``_common.zeroed_words``: reused per device and stream in torch eager)."""
    return zeroed_words(like, FLAG_WORDS, jax_dtype="uint32")
