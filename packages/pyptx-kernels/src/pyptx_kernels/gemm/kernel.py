"""Dense GEMM on Hopper tensor cores: ``D = act(alpha * (A @ B) + bias)``.

bf16 or f16 inputs, f32 accumulation, bf16/f16/f32 output. The kernel is
warp-specialised and persistent:

* warpgroup 0 is the producer: it gives registers back (``setmaxnreg.dec``) and one of
  its threads walks the tiles, issuing bulk tensor copies of A and B into an
  ``stages``-deep ring of shared-memory buffers guarded by ``full``/``empty`` mbarriers
  (``pyptx.pipeline.Pipeline``);
* warpgroups 1.. are consumers (``setmaxnreg.inc``): each owns 64 rows of the
  ``BM x BN`` tile and issues ``wgmma.mma_async`` on the ring's operand tiles
  (``pyptx.operand.OperandTile`` gives every descriptor), keeping one k-block of
  wgmma in flight while the previous stage is released;
* with ``cluster=2`` two CTAs that share an N-block form a cluster: each copies half of
  the B tile and multicasts it to both, and consumers release a stage in both CTAs;
* tiles are visited persistently (one CTA per SM) in grouped order (``group_m``
  M-blocks per band), so consecutive tiles reuse A and B in L2;
* the epilogue scales, adds the bias, applies the activation, packs to the output
  type, writes a 128-byte-swizzled tile into shared memory (bank-conflict free) and
  stores it with bulk tensor copies, which clip the ragged edges.

A and B may each be K-major or MN-major (``a_major``/``b_major``): a torch user's
``x @ w.T`` passes ``w`` as a K-major B, a plain row-major ``(K, N)`` B is MN-major.
``matmul(a, b)`` picks the layouts from the tensors' strides (torch) or the
``trans_*`` flags (JAX), pads a contiguous dimension whose rows are not 16-byte
multiples (the tensor copy engine's rule), and launches the tuned kernel; its gradients
(``GemmBackward``) are the same kernel on the other layouts.
"""

from __future__ import annotations

import functools
import sys
import typing

from pyptx import Tile, kernel, ptx, reg
from pyptx.autotune import Config, autotune
from pyptx.errors import ConfigError
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.pipeline import Pipeline
from pyptx.source import where_outside
from pyptx.types import b32, bf16, f16, f32, u32, u64
from pyptx.warpspec import (
    RingMma,
    Roles,
    drain_stores,
    grouped_tile_origin,
    load_ab_ring,
    min_u32,
    prologue,
    register_budget,
    ring_base,
    store_slabs,
    swizzled_rows,
    thread_ids,
)
from pyptx_kernels._common import PACKAGE_DIR

ACTIVATIONS = (None, "relu", "silu", "gelu_tanh")
H100_SMS = 132
SMEM_LIMIT = 227 * 1024 - 256  # less the static barriers
EPI_BUFS = 2
MAX_STAGES = 10
SCHEDULES = ("cooperative", "pingpong")
ORDER_BAR = 3  # named barriers 3 and 4: the ping-pong hand-over (1, 2: the epilogues)
FLAG_WORDS = 4096
"""Length of a split-tail kernel's ``FLAGS`` input (u32 words, zero between launches)."""


def _fail(msg):
    """A ``ConfigError`` whose message starts with the ``file:line`` of the first caller
    outside this example and pyptx (the user's call)."""
    return ConfigError(f"{where_outside(PACKAGE_DIR)}: {msg}")


def _dtype(name, what):
    table = {"bf16": bf16, "f16": f16, "f32": f32, bf16: bf16, f16: f16, f32: f32}
    if name not in table:
        raise _fail(f"build_gemm: {what} must be bf16, f16 or f32, got {name!r}")
    return table[name]


def smem_bytes(BM, BN, BK, stages, out_bytes=2, consumers=None, epi_bufs=EPI_BUFS):
    """Dynamic shared memory of a configuration: the ring, the epilogue buffers
    (``epi_bufs`` 64-row by 128-byte slabs per consumer warpgroup, ``BM // 64`` of them
    unless ``consumers`` says otherwise) and 1024 bytes of alignment slack."""
    consumers = BM // 64 if consumers is None else consumers
    return stages * (BM + BN) * BK * 2 + consumers * epi_bufs * 64 * 128 + 1024


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
            raise _fail(f"{self.name}: a split tail runs {self.ctas} CTAs that wait for each "
                        f"other, one per SM, but this GPU has {sms} SMs: build it with "
                        f"num_sms={sms}")
        self.resident = True

    def ptx(self):
        """The kernel's PTX."""
        return self.kernel.ptx()

    def specialize(self, *args, **kwargs):
        """The kernel's ``Specialization`` (``Kernel.specialize``)."""
        return self.kernel.specialize(*args, **kwargs)

    def __repr__(self):
        return f"<SplitTailGemm {self.name}>"


_FLAGS = {}


def zeroed_flags(like):
    """``FLAG_WORDS`` zeroed u32 words on ``like``'s device for a split-tail launch: for torch
    eager calls one array per (device, stream), reused (launches on one stream run in
    order, and each leaves the flags zeroed); a fresh one while a CUDA graph is being
    captured (the graph then zeroes it at each replay) or ``torch.compile`` traces; a fresh
    ``jnp.zeros`` for JAX."""
    if not type(like).__module__.startswith("torch"):
        import jax.numpy as jnp

        return jnp.zeros((FLAG_WORDS,), jnp.uint32)
    import torch

    if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return torch.zeros(FLAG_WORDS, dtype=torch.int32, device=like.device)
    key = (like.device, torch.cuda.current_stream(like.device).cuda_stream)
    flags = _FLAGS.get(key)
    if flags is None:
        flags = _FLAGS[key] = torch.zeros(FLAG_WORDS, dtype=torch.int32, device=like.device)
    return flags


def build_gemm(M: int, N: int, K: int, *, dtype="bf16", out_dtype="bf16", a_major="K",
               b_major="MN", BM=128, BN=256, BK=64, stages=None, cluster=2, group_m=8,
               num_sms=H100_SMS, bias=False, alpha=1.0, activation=None, KB=None, NB=None,
               multicast=True, split="rows", remote_sem="release.cta", wait_scope=None,
               epilogue="stmatrix", schedule="cooperative", cluster_along="m", wg_rows=64,
               split_tail=False, epi_bufs=EPI_BUFS):
    """The GEMM kernel for ``D[M, N] = A[M, K] @ B[K, N]``.

    Tensor arguments: A as ``(M, K)`` (``a_major="K"``) or ``(K, M)`` (``"MN"``), B as
    ``(KB, NB)`` (``b_major="MN"``) or ``(NB, KB)`` (``"K"``), then ``bias`` ``(N,)`` f32
    if ``bias``; output D ``(M, N)``. ``KB``/``NB`` (default ``K``/``N``) are B's extents
    when a zero-padded operand is larger than the product needs: copies past a
    tensor's edge read zeros, so the k-loop runs over the larger K and D gets N columns.

    Tiles: ``BM`` (64 rows per consumer warpgroup) x ``BN`` x ``BK``, ``stages`` ring
    buffers (default: as many as fit), ``cluster`` CTAs along ``cluster_along`` (``"m"``:
    neighbouring m-blocks of one n-block, sharing its B tile; ``"n"``: neighbouring
    n-blocks of one m-block, sharing its A tile: for few m-blocks, where every CTA would
    otherwise read all of A; opt-in: at 128 x 8192 x 8192 on the H100 it measured 282 vs 290
    TFLOP/s for 128x64 tiles without a cluster: the two CTAs' independent streams of B wait
    for each other), ``group_m`` (cluster) rows per band of the persistent order over
    ``num_sms`` SMs. Epilogue: D = ``activation(alpha * A@B + bias)`` in ``out_dtype``.
    Cluster switches (measured in
    ``docs/dev/tensor-cores.md``): ``multicast`` (B copied once per cluster),
    ``split`` ('rows' of every slab or whole 'slabs' per CTA), ``remote_sem`` (ordering of
    the consumers' remote releases), ``wait_scope`` (acquire scope of barrier waits).
    ``epilogue``: how a 16-bit output tile reaches shared memory, ``"stmatrix"`` (one
    ``stmatrix.x4`` per four 8x8 blocks) or ``"st"`` (one ``st.shared.b32`` per column
    pair); an f32 output always uses ``st.shared.v2.f32``.
    ``schedule``: ``"cooperative"`` (the consumer warpgroups split each ``BM x BN`` tile,
    64 rows each) or ``"pingpong"`` (opt-in, slower on the H100 where timed: two consumer
    warpgroups take alternate ``BM x BN`` tiles, ``BM`` 64 or 128 with ``BM * BN <= 16384``,
    so one's epilogue runs while the other's wgmma do; named barriers hand the main loop
    from one to the other, which keeps every ring wait within one phase of its barrier).
    ``wg_rows`` (cooperative): rows of the tile per consumer warpgroup, 64 (one ``m64``
    accumulator each) or 128 (two, ``BN <= 128``: e.g. 256 x 128 tiles on two consumer
    warpgroups instead of four, each B read from shared memory serving 128 rows).
    ``epi_bufs``: epilogue slab buffers per consumer warpgroup, 2 (a slab's bulk store
    drains while the next is written) or 1 (the shared memory it frees goes to the ring:
    64 x 128 tiles get 9 stages instead of 8, for skinny shapes that stream B from memory).
    """
    dt = _dtype(dtype, "dtype")
    if dt is f32:
        raise _fail("build_gemm: inputs must be bf16 or f16")
    ot = _dtype(out_dtype, "out_dtype")
    if activation not in ACTIVATIONS:
        raise _fail(f"build_gemm: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if BM not in (64, 128, 192, 256) or BN % 64 or not 64 <= BN <= 256 or BK % 64 or BK > 128:
        raise _fail(f"build_gemm: unsupported tile {BM}x{BN}x{BK}")
    if cluster_along not in ("m", "n"):
        raise _fail(f"build_gemm: cluster_along must be 'm' or 'n', got {cluster_along!r}")
    if cluster not in (1, 2):
        raise _fail(f"build_gemm: cluster must be 1 or 2, got {cluster!r}")
    if split not in ("rows", "slabs"):
        raise _fail(f"build_gemm: split must be 'rows' or 'slabs', got {split!r}")
    if epilogue not in ("stmatrix", "st"):
        raise _fail(f"build_gemm: epilogue must be 'stmatrix' or 'st', got {epilogue!r}")
    if a_major not in ("K", "MN") or b_major not in ("K", "MN"):
        raise _fail("build_gemm: a_major and b_major must be 'K' or 'MN'")
    if schedule not in SCHEDULES:
        raise _fail(f"build_gemm: schedule must be one of {SCHEDULES}, got {schedule!r}")
    pingpong = schedule == "pingpong"
    if pingpong and (BM not in (64, 128) or BM * BN > 16384):
        raise _fail(f"build_gemm: a ping-pong warpgroup holds a whole BM x BN tile: BM "
                          f"64 or 128 and BM * BN <= 16384 (128 accumulator registers), got "
                          f"{BM}x{BN}")
    if epi_bufs not in (1, 2):
        raise _fail(f"build_gemm: epi_bufs must be 1 or 2, got {epi_bufs!r}")
    if not isinstance(split_tail, bool):
        raise _fail(f"build_gemm: split_tail must be True or False, got {split_tail!r}")
    if split_tail and pingpong:
        raise _fail("build_gemm: split_tail needs the cooperative schedule")
    if wg_rows not in (64, 128) or BM % wg_rows or (wg_rows == 128 and (pingpong or BN > 128)):
        raise _fail(f"build_gemm: wg_rows must be 64, or 128 with the cooperative schedule, "
                          f"BM a multiple of it and BN <= 128 (two accumulators of BN columns "
                          f"per thread), got wg_rows={wg_rows!r} for {BM}x{BN} ({schedule})")
    KB = K if KB is None else KB
    multicast = multicast and cluster > 1
    NB = N if NB is None else NB
    consumers = 2 if pingpong else BM // wg_rows
    bands = BM // 64 if pingpong else wg_rows // 64   # 64-row accumulators per warpgroup
    threads = 128 * (1 + consumers)
    e_out = ot.bytes
    if stages is None:  # the deepest ring that fits beside the epilogue tiles
        fixed = smem_bytes(BM, BN, BK, 0, consumers=consumers, epi_bufs=epi_bufs)
        per_stage = smem_bytes(BM, BN, BK, 1, consumers=consumers, epi_bufs=epi_bufs) - fixed
        stages = max(2, min(MAX_STAGES, (SMEM_LIMIT - fixed) // per_stage))
    smem_total = smem_bytes(BM, BN, BK, stages, consumers=consumers, epi_bufs=epi_bufs)
    if smem_total > SMEM_LIMIT:
        raise _fail(f"build_gemm: {BM}x{BN}x{BK} with {stages} stages needs {smem_total} "
                          f"bytes of shared memory, over {SMEM_LIMIT}")

    a_tile = OperandTile(BM, BK, dt, major=a_major, swizzle=128)
    b_tile = OperandTile(BN, BK, dt, major=b_major, swizzle=128)
    a_bytes, b_bytes = a_tile.nbytes, b_tile.nbytes
    stage_bytes = a_bytes + b_bytes
    ring_bytes = stages * stage_bytes
    out_cols = 128 // e_out                    # output columns per 128-byte swizzled slab
    out_slabs = BN // out_cols
    out_slab_bytes = 64 * 128                  # 64 rows x 128 bytes
    wg_out_bytes = epi_bufs * out_slab_bytes   # one consumer's epilogue buffers

    num_m = -(-M // BM)
    num_n = -(-N // BN)
    along_n = cluster_along == "n" and cluster > 1
    num_mc = num_m if along_n else -(-num_m // cluster)   # cluster rows of tiles
    num_nc = -(-num_n // cluster) if along_n else num_n   # cluster columns
    tiles = num_mc * num_nc
    num_kb = -(-max(K, KB) // BK)
    plan = split_tail_plan(tiles, max(1, num_sms // cluster), num_kb) if split_tail else None
    # the persistent grid: a cluster per tile up to the SMs' worth (all of them with a split
    # tail, whose pieces may outnumber the tiles)
    clusters = max(1, num_sms // cluster if plan else min(tiles, num_sms // cluster))
    ctas = clusters * cluster
    gm = max(1, min(group_m, num_mc))
    prod_regs = 40 if consumers <= 2 else 24
    maxnreg, cons_regs = register_budget(consumers, prod_regs)

    a_spec = Tile(M, K, dt) if a_major == "K" else Tile(K, M, dt)
    b_spec = Tile(KB, NB, dt) if b_major == "MN" else Tile(NB, KB, dt)
    in_specs = (a_spec, b_spec) + ((Tile(N, f32),) if bias else ())
    out_specs = (Tile(M, N, ot),)
    if plan:
        per_tile = cluster * consumers                 # warpgroups of a cluster tile
        flags = plan[1] * per_tile                     # one per warpgroup of a tail tile
        if flags > FLAG_WORDS:
            raise _fail(f"build_gemm: split_tail needs {flags} flags, over {FLAG_WORDS}")
        part_bytes = bands * 64 * BN * 4               # a warpgroup's f32 partial tile
        in_specs += (Tile(FLAG_WORDS, u32),)
        out_specs += (Tile(flags * (plan[2] - 1) * part_bytes // 4, f32),)
    d_box = (64, out_cols)
    parts = cluster if multicast and split == "rows" else 1
    tma = {"A": a_tile.tma_options(parts if along_n else 1),
           "B": b_tile.tma_options(1 if along_n else parts),
           "D": {"box": d_box, "swizzle": "128B"}}

    def body(A, B, Bias, D, Flags=None, WS=None):
        base = ring_base()
        readers = 1 if pingpong else consumers    # warpgroups that read each stage
        pipe = Pipeline(stages, consumer_arrivals=readers * (cluster if multicast else 1))
        tid, wg = thread_ids()
        rank, cid = prologue(pipe, tid, cluster)

        def tile_coords(t):
            """(m0, n0) of cluster tile ``t``, grouped ``gm`` cluster rows per band."""
            if along_n:  # the cluster tile spans cluster * BN columns; this CTA's part
                m0, n0 = grouped_tile_origin(t, 0, num_mc=num_mc, num_n=num_nc, gm=gm,
                                             cluster=1, BM=BM, BN=BN * cluster)
                return m0, n0 + rank * BN
            return grouped_tile_origin(t, rank, num_mc=num_mc, num_n=num_n, gm=gm,
                                       cluster=cluster, BM=BM, BN=BN)

        def schedule():
            """``(loop range, items)`` of this cluster's work: the plain persistent walk
            (``items`` None: the loop index is the tile), or with a split tail its whole
            tiles then its pieces of the tail (``items(j) = (t, kb0, kb1, chunk)``, ``chunk``
            ``nsplit`` for a whole tile)."""
            if not plan:
                return (cid, tiles, clusters), None
            waves, rest, nsplit = plan
            pieces = (rest * nsplit + clusters - 1 - cid) // clusters

            def item(j):
                whole = j < waves
                p = (j - waves) * clusters + cid
                t, chunk, kb0, kb1 = (reg.scalar(u32) for _ in range(4))
                ptx.inst.selp.u32(t, j * clusters + cid, p % rest + waves * clusters, whole)
                ptx.inst.selp.u32(chunk, nsplit, p // rest, whole)
                ptx.inst.selp.u32(kb0, 0, chunk * num_kb // nsplit, whole)
                ptx.inst.selp.u32(kb1, num_kb, (chunk + 1) * num_kb // nsplit, whole)
                return t, kb0, kb1, chunk
            return (0, waves + pieces), item

        roles = Roles(wg, prod_regs)
        # ---------------------------------------------------------------- producer
        with ptx.if_(tid == 0):
            work, items = schedule()
            load_ab_ring(pipe, A, B, a_tile, b_tile, base=base, tile_range=work,
                         coords=tile_coords, num_kb=num_kb, BK=BK, rank=rank, cluster=cluster,
                         multicast=multicast, split=split, wait_scope=wait_scope,
                         shared="A" if along_n else "B",
                         items=items and (lambda j: items(j)[:3]))
        # ---------------------------------------------------------------- consumers
        roles.consumers(cons_regs)
        w = wg - 1
        t_wg = tid & 127
        leader = t_wg == 0
        bar_id = w + 1
        accs = [Accumulator(BN) for _ in range(bands)]
        acc = accs[0]
        row0, col0 = acc.thread_origin(t_wg)
        lane = tid & 31
        cbuf = base + ring_bytes + w * wg_out_bytes
        if pingpong:  # every 64-row band of the tile
            a_descs = [a_tile.descriptor(base + h * a_tile.offset(0, 64) if h else base)
                       for h in range(bands)]
        elif bands > 1:  # this warpgroup's bands of 64 rows of A
            rows0 = base + w * a_tile.offset(0, 64 * bands) if consumers > 1 else base
            a_descs = [a_tile.descriptor(rows0 + h * a_tile.offset(0, 64) if h else rows0)
                       for h in range(bands)]
        else:  # this warpgroup's 64 rows of A
            a_descs = [a_tile.descriptor(base + w * a_tile.offset(0, 64) if consumers > 1
                                         else base)]
        b_desc0 = b_tile.descriptor(base, offset=a_bytes)
        mma = RingMma(pipe, accs if bands > 1 else acc, a_tile, b_tile,
                      a_descs if bands > 1 else a_descs[0], b_desc0, stage_bytes, n=BN,
                      dtype=dt.name, leader=leader, wait_scope=wait_scope,
                      cta_ranks=range(cluster) if multicast else None, sem=remote_sem)
        sw = swizzled_rows(cbuf, row0, lane, e_out)
        use_stmatrix = epilogue == "stmatrix" and ot is not f32
        if use_stmatrix:
            # stmatrix.x4 of 8-column blocks (q, q+1), rows r and r+8: lane l gives row
            # l % 8 of matrix l // 8, i.e. tile row 16w + 8*((l//8) % 2) + l % 8 and block
            # q + l // 16, whose 16-byte chunk is swizzled by XOR with the row % 8 = l % 8
            mrow_t = ((tid & 96) >> 1) + ((lane >> 3) & 1) * 8 + (lane & 7)
            ybits = (lane >> 4) ^ (lane & 7)
            sm_rows = cbuf + mrow_t * 128
            smx = {q: ((ybits ^ q) << 4) + sm_rows for q in range(0, 8, 2)}
        if bias:
            (pbias,) = ptx.global_ptrs(Bias)
        d_map = ptx.tma.tensormap_ptr(D.tmap)

        # ---------------------------------------------------------------- epilogue
        def tile_epilogue(m0, n0):
            # one 64 x out_cols slab at a time through two buffers: the bulk store of
            # slab j-1 drains while slab j is written
            ncol = n0 + col0 if bias else None
            mrow = m0 if pingpong else m0 + w * (64 * bands)

            def write(j, buf, ncol=ncol):
                packs = {}
                band, j = divmod(j, out_slabs)
                acc = accs[band]
                for i, dr, dc in acc.pairs():
                    if dc // out_cols != j:
                        continue
                    v0, v1 = acc[i], acc[i + 1]
                    if alpha != 1.0:
                        v0 = v0 * float(alpha)
                        v1 = v1 * float(alpha)
                    if bias:
                        c0 = ncol + dc
                        b0 = reg.scalar(f32, init=0.0)
                        b1 = reg.scalar(f32, init=0.0)
                        ptx.inst.ld.global_.nc.f32(b0, ptx.addr(pbias + c0 * 4), pred=c0 < N)
                        ptx.inst.ld.global_.nc.f32(b1, ptx.addr(pbias + c0 * 4 + 4),
                                                   pred=c0 < N - 1)
                        v0 = v0 + b0
                        v1 = v1 + b1
                    v0, v1 = _activate(v0, activation), _activate(v1, activation)
                    q = dc % out_cols * e_out // 16  # the pair's 16-byte chunk, unswizzled
                    off = buf + dr * 128
                    if ot is f32:
                        ptx.inst.st.shared.v2.f32(ptx.addr(sw[q], off), [v0, v1])
                        continue
                    packed = reg.scalar(b32)
                    ptx.inst(f"cvt.rn.{ot.name}x2.f32")(packed, v1, v0)
                    if not use_stmatrix:
                        ptx.inst.st.shared.b32(ptx.addr(sw[q], off), packed)
                        continue
                    packs[i] = packed
                    blk = i // 4 % 8  # the 8-column block within this slab
                    if blk % 2 == 1 and i % 4 == 2:  # blocks blk-1, blk complete
                        first = i - 6
                        ptx.stmatrix(ptx.addr(smx[blk - 1], buf),
                                     [packs[first], packs[first + 2], packs[first + 4],
                                      packs[first + 6]], num=4)

            def coords(j, n0=n0, mrow=mrow):
                band, j = divmod(j, out_slabs)
                return n0 + j * out_cols, (mrow + band * 64 if band else mrow)

            store_slabs(out_slabs * bands, leader=leader, bar_id=bar_id, cbuf=cbuf, tmap=d_map,
                        write=write, bufs=epi_bufs, coords=coords)

        if pingpong:
            # warpgroup w takes the CTA's tiles w, w + 2, ...: its ring position starts past
            # the other's first tile, and it skips the other's k-blocks after each of its own
            with ptx.if_(w == 1):
                mma.cons.advance(num_kb)
                mma.rel.advance(num_kb)
            for t in ptx.loop(cid + w * clusters, tiles, 2 * clusters):
                m0, n0 = tile_coords(t)
                # the other warpgroup has issued its last k-block (not before the first tile)
                ptx.bar_sync(ORDER_BAR + w, 256, pred=t >= cid + clusters)
                mma.run(num_kb, issued=lambda t=t: ptx.bar_arrive(
                    ORDER_BAR + 1 - w, 256, pred=t + clusters < tiles))
                mma.cons.advance(num_kb)
                mma.rel.advance(num_kb)
                tile_epilogue(m0, n0)
        elif not plan:
            for t in ptx.loop(cid, tiles, clusters):
                m0, n0 = tile_coords(t)
                mma.run(num_kb)
                tile_epilogue(m0, n0)
        else:
            # split tail: a piece other than a tile's last chunk leaves its partial sum in
            # the workspace (slot: tail tile, chunk) and counts it on the tile's flag; the
            # last chunk's cluster waits for nsplit - 1 counts, adds the sums, and stores
            waves, rest, nsplit = plan
            (pflags, pws) = ptx.global_ptrs(Flags, WS)
            mine = rank * consumers + w if cluster > 1 else w
            chunks = BN // 8                      # 16-byte chunks per thread and accumulator
            lane_off = reg.from_(t_wg, u64) * 16

            def flag_of(tail):
                return reg.from_(tail * (cluster * consumers) + mine, u64) * 4 + pflags

            def part_of(tail, chunk):
                idx = (tail * (nsplit - 1) + chunk) * (cluster * consumers) + mine
                return reg.from_(idx, u64) * part_bytes + pws + lane_off

            def share(tail, chunk):
                part = part_of(tail, chunk)
                for b, a in enumerate(accs):
                    for q in range(chunks):
                        ptx.inst.st.global_.v4.f32(ptx.addr(part, (b * chunks + q) * 2048),
                                                   [a[4 * q + i] for i in range(4)])
                ptx.bar_sync(bar_id, 128)
                with ptx.if_(leader):
                    ptx.inst("red.release.gpu.global.add.u32")(ptx.addr(flag_of(tail)), 1)

            def take(tail):
                with ptx.if_(leader):
                    flag = flag_of(tail)
                    now = reg.scalar(u32)

                    def pending():
                        ptx.inst("ld.acquire.gpu.global.u32")(now, ptx.addr(flag))
                        return now != nsplit - 1

                    with ptx.while_(pending):
                        pass
                    ptx.inst("st.relaxed.gpu.global.u32")(ptx.addr(flag), 0)
                ptx.bar_sync(bar_id, 128)
                # a device loop over the other chunks keeps one partial tile's loads in flight
                # (unrolled, ptxas hoists them all and spills)
                for chunk in ptx.loop(0, nsplit - 1):
                    part = part_of(tail, chunk)
                    for b, a in enumerate(accs):
                        for q in range(chunks):
                            got = [reg.scalar(f32) for _ in range(4)]
                            ptx.inst("ld.relaxed.gpu.global.v4.f32")(
                                got, ptx.addr(part, (b * chunks + q) * 2048))
                            for i in range(4):
                                ptx.inst.add.f32(a[4 * q + i], a[4 * q + i], got[i])

            work, items = schedule()
            for j in ptx.loop(*work):
                t, kb0, kb1, chunk = items(j)
                mma.run(kb1 - kb0)
                tail = t - waves * clusters
                with ptx.if_(chunk < nsplit - 1):
                    share(tail, chunk)
                with ptx.else_():
                    with ptx.if_(chunk == nsplit - 1):
                        take(tail)
                    m0, n0 = tile_coords(t)
                    tile_epilogue(m0, n0)
        drain_stores(leader)
        roles.end()
        if cluster > 1:
            ptx.cluster_sync()
        ptx.ret()

    name = (f"gemm_{dt.name}_{ot.name}_{a_major}{b_major}_{BM}x{BN}x{BK}_s{stages}_c{cluster}"
            f"{'n' if along_n else ''}{'_pp' if pingpong else ''}"
            f"{'_w128' if wg_rows == 128 else ''}{f'_st{plan[2]}' if plan else ''}")
    deco = kernel(in_specs=in_specs, out_specs=out_specs, grid=(ctas, 1, 1),
                  block=(threads, 1, 1), cluster=(cluster, 1, 1), smem=smem_total,
                  maxnreg=maxnreg, tma=tma, name=name)
    if plan and bias:
        def gemm(A, B, Bias, Flags, D, WS):
            body(A, B, Bias, D, Flags, WS)
        return SplitTailGemm(deco(gemm), ctas)
    if plan:
        def gemm(A, B, Flags, D, WS):
            body(A, B, None, D, Flags, WS)
        return SplitTailGemm(deco(gemm), ctas)
    if bias:
        def gemm(A, B, Bias, D):
            body(A, B, Bias, D)
    else:
        def gemm(A, B, D):
            body(A, B, None, D)
    return deco(gemm)


ptx_min = min_u32
"""``min.u32 d, r, v`` (``pyptx.warpspec.min_u32``)."""


def _activate(v, activation):
    if activation is None:
        return v
    if activation == "relu":
        out = reg.scalar(f32)
        ptx.inst.max.f32(out, v, 0.0)
        return out
    if activation == "silu":  # v * sigmoid(v) = v / (1 + 2^(-v * log2 e))
        t = v * -1.4426950408889634
        ex = reg.scalar(f32)
        ptx.inst.ex2.approx.ftz.f32(ex, t)
        den = ex + 1.0
        r = reg.scalar(f32)
        ptx.inst.rcp.approx.ftz.f32(r, den)
        return v * r
    # gelu (tanh form): 0.5 v (1 + tanh(0.7978845608 (v + 0.044715 v^3)))
    v3 = v * v * v
    inner = (v3 * 0.044715 + v) * 0.7978845608028654
    th = reg.scalar(f32)
    ptx.inst.tanh.approx.f32(th, inner)
    return (th + 1.0) * v * 0.5


# ------------------------------------------------------------------------ host side
GEMM_CONFIGS = [
    Config(BM=128, BN=256, cluster=2),
    Config(BM=128, BN=256, cluster=1),
    Config(BM=128, BN=128, cluster=1),
    Config(BM=64, BN=256, cluster=1),
    Config(BM=128, BN=64, cluster=1),
    Config(BM=192, BN=192, cluster=1),
    Config(BM=192, BN=192, cluster=2),
    Config(BM=256, BN=128, cluster=1, wg_rows=128),
    Config(BM=128, BN=128, cluster=1, split_tail=True),
    Config(BM=64, BN=128, cluster=1, epi_bufs=1),
]
"""The tile configurations the tuner times per shape; the first is the default when
``PYPTX_AUTOTUNE=0``. 192x192 tiles (three consumer warpgroups, 3 stages; the tile cuBLAS
picks at 6144^3 and 8192x28672x8192) measured on the H100: 8192x28672x8192 758 TFLOP/s
(cuBLAS 724 beside it), 6144^3 713 (688) without a cluster. 256x128 tiles on two consumer
warpgroups of 128 rows (``wg_rows=128``, cuBLAS's tile at 2048^3 and 4096^3): 2048^3 627
(cuBLAS 608; 128x256 in pairs 596 in the same call). 128x128 tiles with a split tail (the
partial wave's tiles cut along K over all SMs; a split-K where tiles are fewer than SMs):
1024x1024x16384 614 TFLOP/s against 460 for the tuned list without it; where it does not
apply it is the plain 128x128 kernel, which the tuner skips as a duplicate. 64x128 tiles
with one epilogue buffer (9 stages) for skinny products, which stream B from memory and go
as fast as the bytes of B in flight: 128x8192x8192 on the H200 386-390 TFLOP/s (cuBLAS
389-392; paired 1.002-1.006x) against 376-380 for 128x64 tiles, whose stages hold half as
much of B (0.978x paired); 6 stages instead of 8 lost 5%, 9 measured like 8. The ping-pong schedule is opt-in (``schedule="pingpong"``): on the H100
it trailed the cooperative 128x256 tiles at every size it was timed (4096^3 670 vs 706,
8192^3 662 vs 678, 8192x28672x8192 587 vs 698 TFLOP/s)."""

gemm_tuned = autotune(GEMM_CONFIGS, key=["M", "N", "K", "dtype", "out_dtype", "a_major",
                                         "b_major", "bias", "activation", "KB", "NB"])(build_gemm)
"""``build_gemm`` with its tile configuration chosen on the device at the first launch."""


@functools.lru_cache(maxsize=256)
def _cached(M, N, K, key, config):
    kw = dict(key)
    if config is None:
        return gemm_tuned(M, N, K, **kw)
    return build_gemm(M, N, K, **kw, **dict(config))


def reference(a, b, bias=None, alpha=1.0, activation=None):
    """float64 reference of ``act(alpha * a @ b + bias)`` (torch tensors)."""
    import torch

    d = (a.double() @ b.double()) * alpha
    if bias is not None:
        d = d + bias.double()
    if activation == "relu":
        d = torch.relu(d)
    elif activation == "silu":
        d = torch.nn.functional.silu(d)
    elif activation == "gelu_tanh":
        d = torch.nn.functional.gelu(d, approximate="tanh")
    return d


def _pad_to(x, dim, mult, lib):
    n = x.shape[dim]
    extra = -n % mult
    if not extra:
        return x
    if lib == "torch":
        import torch.nn.functional as F

        pad = [0, 0] * (x.ndim - 1 - dim) + [0, extra]
        return F.pad(x, pad)
    import jax.numpy as jnp

    widths = [(0, 0)] * x.ndim
    widths[dim] = (0, extra)
    return jnp.pad(x, widths)


def matmul(a, b, *, bias=None, alpha=1.0, activation=None, out_dtype=None, trans_a=False,
           trans_b=False, config=None):
    """``act(alpha * a @ b + bias)`` with the pyptx GEMM, for torch tensors or JAX arrays.

    torch: ``a``/``b`` may be row-major or transposed views (``w.T``); the layout is read
    off the strides. JAX: ``trans_a=True`` means ``a`` is given as ``(K, M)``,
    ``trans_b=True`` that ``b`` is given as ``(N, K)`` (``x @ w.T`` is
    ``matmul(x, w, trans_b=True)``). The tile configuration is tuned per shape on the
    device (``gemm_tuned``); ``config`` (a dict of ``build_gemm`` keywords) fixes it.
    The result is ``(M, N)``; a contiguous dimension whose rows are not a multiple of
    16 bytes is zero-padded first (and the result sliced back). An ``a`` of shape
    ``(..., K)`` (activations of a batch of sequences) is one ``(prod(...), K)`` product,
    returned as ``(..., N)``.

    Differentiable (``GemmBackward``: two more GEMMs, a third that recomputes the
    pre-activation when there is an activation, and the bias gradient): in torch when grad
    mode is on and an operand requires grad, and under ``jax.grad``.
    """
    lib = "torch" if type(a).__module__.startswith("torch") else "jax"
    if len(a.shape) > 2 and len(b.shape) == 2 and not trans_a:   # (..., K) @ (K, N)
        lead = tuple(a.shape[:-1])
        d = matmul(a.reshape(-1, a.shape[-1]), b, bias=bias, alpha=alpha, activation=activation,
                   out_dtype=out_dtype, trans_b=trans_b, config=config)
        return d.reshape(*lead, d.shape[-1])
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise _fail(f"matmul expects a 2-D b and an a of shape (..., K) (2-D with trans_a), "
                    f"got {tuple(a.shape)} and {tuple(b.shape)}")
    cfg = tuple(sorted(config.items())) if config else None
    if lib == "torch":
        seen = (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype,
                None if bias is None else bias.shape, float(alpha), activation, out_dtype,
                trans_a, trans_b, cfg)
        plan = _TORCH_PLANS.get(seen)
        if plan is None:
            plan = _plan(a, b, bias, alpha, activation, out_dtype, trans_a, trans_b, cfg, lib)
            if len(_TORCH_PLANS) >= 1024:
                _TORCH_PLANS.clear()
            _TORCH_PLANS[seen] = plan
    else:
        plan = _plan(a, b, bias, alpha, activation, out_dtype, trans_a, trans_b, cfg, lib)
    if plan.swap_a:
        a = a.T
    if plan.swap_b:
        b = b.T
    if plan.copy_a:
        a = a.contiguous()
    if plan.copy_b:
        b = b.contiguous()
    if plan.pad_a:
        a = _pad_to(a, 1, 8, lib)   # the copy engine reads rows of 16-byte multiples
    if plan.pad_b:
        b = _pad_to(b, 1, 8, lib)
    args = (a, b) if bias is None else (a, b, _pad_to(bias, 0, 8, lib) if plan.pad_bias else bias)
    if _wants_grad(lib, args):
        k = _differentiable(*plan.build, plan.true_shape)
    else:
        k = _cached(*plan.build)
    d = k(*args)
    return d[:plan.M, :plan.N] if plan.crop else d


class _MatmulPlan(typing.NamedTuple):
    """What ``matmul`` does to operands of one layout: views to transpose (``swap_*``),
    copies to make (``copy_*``), 16-byte row paddings (``pad_*``), the kernel's build
    arguments ``(M, N, K, key, config)``, the logical sizes and whether to crop the result.
    Torch plans are kept per shape, strides, dtypes and options (``_TORCH_PLANS``), so a
    repeated call skips the checks."""

    swap_a: bool
    swap_b: bool
    copy_a: bool
    copy_b: bool
    pad_a: bool
    pad_b: bool
    pad_bias: bool
    build: tuple
    true_shape: tuple
    M: int
    N: int
    crop: bool


_TORCH_PLANS: dict = {}


def _plan(a, b, bias, alpha, activation, out_dtype, trans_a, trans_b, cfg, lib):
    """``matmul``'s checks and layout decisions for these 2-D operands (a ``_MatmulPlan``)."""
    swap_a = swap_b = copy_a = copy_b = False
    if lib == "torch":
        if not a.is_contiguous() and a.T.is_contiguous():
            a, trans_a, swap_a = a.T, not trans_a, True
        if not b.is_contiguous() and b.T.is_contiguous():
            b, trans_b, swap_b = b.T, not trans_b, True
        copy_a, copy_b = not a.is_contiguous(), not b.is_contiguous()
    M, K = (a.shape[1], a.shape[0]) if trans_a else tuple(a.shape)
    Kb, N = (b.shape[1], b.shape[0]) if trans_b else tuple(b.shape)
    if Kb != K:
        raise _fail(f"matmul: inner dimensions differ: a is {M}x{K}, b is {Kb}x{N}")
    name = {"bfloat16": "bf16", "float16": "f16"}.get(str(a.dtype).replace("torch.", ""))
    if name is None or str(b.dtype) != str(a.dtype):
        raise _fail(f"matmul: inputs must both be bfloat16 or float16, got {a.dtype} "
                    f"and {b.dtype}")
    out = out_dtype or name
    pad_a, pad_b = a.shape[1] % 8 != 0, b.shape[1] % 8 != 0
    a_cols, b_cols = a.shape[1] + (-a.shape[1] % 8), b.shape[1] + (-b.shape[1] % 8)
    Mk = a_cols if trans_a else M
    Ka = a.shape[0] if trans_a else a_cols
    NB, KB = (b.shape[0], b_cols) if trans_b else (b_cols, b.shape[0])
    ND = N + (-N % 8)
    key = tuple(sorted(dict(dtype=name, out_dtype=out, a_major="MN" if trans_a else "K",
                            b_major="K" if trans_b else "MN", bias=bias is not None,
                            alpha=float(alpha), activation=activation, KB=KB, NB=NB).items()))
    return _MatmulPlan(swap_a, swap_b, copy_a, copy_b, pad_a, pad_b,
                       bias is not None and bias.shape[0] % 8 != 0, (Mk, ND, Ka, key, cfg),
                       (M, N, K, trans_a, trans_b, float(alpha), activation), M, N,
                       ND != N or Mk != M)


def _wants_grad(lib, args):
    """Whether to launch the differentiable kernel: torch when grad mode is on and an operand
    requires grad; JAX always (``jax.custom_vjp`` costs nothing until differentiated)."""
    if lib != "torch":
        return True
    import torch

    return torch.is_grad_enabled() and any(x.requires_grad for x in args)


def activation_grad(z, activation, xp):
    """``act'(z)`` (f32 array ``z``, ``xp`` torch or jax.numpy) of ``_activate``'s forms."""
    if activation == "relu":
        return (z > 0).astype(z.dtype) if xp.__name__.startswith("jax") else (z > 0).to(z.dtype)
    if activation == "silu":
        sig = 1.0 / (1.0 + xp.exp(-z))
        return sig * (1.0 + z * (1.0 - sig))
    c = 0.7978845608028654   # gelu_tanh
    th = xp.tanh(c * (z + 0.044715 * z * z * z))
    return 0.5 * (1.0 + th) + 0.5 * z * (1.0 - th * th) * c * (1.0 + 3 * 0.044715 * z * z)


def _crop(x, shape):
    """The leading ``shape`` block of 2-D ``x`` (``x`` itself when it is that shape)."""
    return x if x.shape == shape else x[:shape[0], :shape[1]]


def _fit(x, shape, lib):
    """``x`` cut or zero-padded to ``shape`` (2-D or 1-D)."""
    if x.shape == tuple(shape):
        return x
    x = x[tuple(slice(0, n) for n in shape)]
    for dim, n in enumerate(shape):
        x = _pad_to(x, dim, n, lib) if x.shape[dim] < n else x
    return x


class GemmBackward:
    """The backward of ``D = act(alpha * A @ B + bias)`` as one kernel-like callable for
    ``pyptx.differentiable_kernel``: ``(A, B[, bias], dD) -> (dA, dB[, dbias])``. With an
    activation, one more GEMM recomputes ``Z = alpha A B + bias`` in f32 and the gradient
    becomes ``G = dD * act'(Z)``; without one ``G = dD``. ``dA = alpha G B^T`` and ``dB =
    alpha A^T G`` are pyptx GEMMs in the layout each operand is stored in (a transposed
    operand gets the transposed product, so no copy is transposed), ``dbias`` the column
    sums of ``G`` in f32. ``G`` is rounded to the inputs' type for the GEMMs; the stored
    operands' zero padding gets zero gradient."""

    def __init__(self, forward, true_shape):
        (self.M, self.N, self.K, self.trans_a, self.trans_b, self.alpha,
         self.activation) = true_shape
        self.in_specs = tuple(forward.in_specs) + tuple(forward.out_specs)
        self.out_specs = tuple(forward.in_specs)
        self.name = f"{forward.name}_backward"
        bias = len(forward.in_specs) == 3
        self.arg_names = (("A", "B", "Bias", "dD", "dA", "dB", "dBias") if bias
                          else ("A", "B", "dD", "dA", "dB"))

    def __call__(self, a, *rest):
        b, dd = rest[0], rest[-1]
        lib = "torch" if type(a).__module__.startswith("torch") else "jax"
        M, N, K, ta, tb, alpha = self.M, self.N, self.K, self.trans_a, self.trans_b, self.alpha
        a_t = _crop(a, (K, M) if ta else (M, K))
        b_t = _crop(b, (N, K) if tb else (K, N))
        bias = rest[1][:N] if len(rest) == 3 else None
        if lib == "torch":
            import torch as xp

            f32 = xp.float32
            cast = lambda x, dt: x if x.dtype == dt else x.to(dt)  # noqa: E731
        else:
            import jax.numpy as xp

            f32 = xp.float32
            cast = lambda x, dt: x if x.dtype == dt else x.astype(dt)  # noqa: E731
        g = _crop(dd, (M, N))
        if self.activation is not None:
            z = matmul(a_t, b_t, bias=bias, alpha=alpha, out_dtype="f32", trans_a=ta,
                       trans_b=tb)
            g = cast(g, f32) * activation_grad(z, self.activation, xp)
        col = None if bias is None else xp.sum(g, 0, dtype=f32)   # dbias, summed in f32
        g = cast(g, a.dtype)     # a pass over G only where its type is not the inputs'
        if ta:   # A stored (K, M): dA^T = b @ dD^T
            da = matmul(b_t, g, alpha=alpha, trans_a=tb, trans_b=True)
        else:    # (M, K): dD @ b^T
            da = matmul(g, b_t, alpha=alpha, trans_b=not tb)
        if tb:   # stored (N, K): dD^T @ a
            db = matmul(g, a_t, alpha=alpha, trans_a=True, trans_b=ta)
        else:    # (K, N): a^T @ dD
            db = matmul(a_t, g, alpha=alpha, trans_a=not ta)
        grads = (_fit(da, a.shape, lib), _fit(db, b.shape, lib))
        if col is not None:
            grads += (_fit(col, rest[1].shape, lib),)
        return grads

    def __repr__(self):
        return f"<GemmBackward {self.name}>"


@functools.lru_cache(maxsize=256)
def _differentiable(M, N, K, key, config, true_shape):
    from pyptx.autodiff import differentiable_kernel

    fwd = _cached(M, N, K, key, config)
    return differentiable_kernel(fwd, GemmBackward(fwd, true_shape))


def main(argv=None) -> int:
    import torch

    torch.manual_seed(0)
    fails = 0
    for (M, N, K) in [(256, 512, 320), (1000, 520, 136), (4095, 4097, 4100)]:
        for tb in (False, True):
            a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).T if tb else \
                torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
            d = matmul(a, b)
            ref = reference(a, b)
            err = ((d.double() - ref).norm() / ref.norm()).item()
            ok = err < 1e-2
            fails += not ok
            print(f"{M}x{N}x{K} b{'.T' if tb else ''}: rel err {err:.2e} {'PASS' if ok else 'FAIL'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
