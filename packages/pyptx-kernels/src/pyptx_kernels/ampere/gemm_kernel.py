"""The Ampere GEMM, ``D[M, N] = A[M, K] @ B`` on ``mma.sync`` tensor cores (sm_80 PTX: it runs
on sm_80, sm_86, sm_89 and sm_90 devices alike).

bf16 or f16 inputs, f32 accumulation, bf16/f16/f32 output. Each CTA computes one
``BM x BN`` tile (CTAs in grouped order: ``group_m`` tile rows per band, so neighbours share
A and B tiles in L2). Its threads copy the A and B tiles of each ``BK`` k-step with
``cp.async`` into a ``stages``-deep ring of swizzled shared-memory buffers
(``tiles.SmemTile``; chunks past the matrices' edges are zero-filled), and each warp loads its
``mma.sync`` m16n8k16 fragments with ``ldmatrix`` (``.trans`` for a k-major B) and keeps its
``BM / warps_m x BN / warps_n`` block in f32 registers. Per k-step: wait for the oldest
group, ``bar.sync`` (everyone is done with the previous step's buffer), refill that buffer
with the step ``stages - 1`` ahead, compute. The epilogue stores each thread's pairs of
columns straight to global memory, masked at the edges.
"""

from __future__ import annotations

from pyptx import Tile, kernel, ptx, reg, smem
from pyptx.errors import ConfigError
from pyptx.types import bf16, f16, f32, u32, u64
from pyptx.warpspec import min_u32
from pyptx_kernels._common import fail
from pyptx_kernels.ampere.gemm_config import Sm80GemmConfig
from pyptx_kernels.ampere.tiles import Fragments, SmemTile, TileCopy

_TYPES = {"bf16": bf16, "f16": f16, "f32": f32}


def _dtype(name, what, allowed):
    t = _TYPES.get(getattr(name, "name", name))
    if t is None or t.name not in allowed:
        raise fail(ConfigError, "build_sm80_gemm",
                   f"{what} must be one of {', '.join(allowed)}, got {name!r}")
    return t


def grouped_tile(MT: int, NT: int, group_m: int):
    """``(pid_m, pid_n)`` u32 registers of this CTA's tile: ``%ctaid.x`` walked in bands of
    ``group_m`` tile rows (column by column inside a band)."""
    pid = reg.from_(ptx.special.ctaid.x(), u32)
    per_band = group_m * NT
    first_m = (pid // per_band) * group_m
    rows = min_u32(MT - first_m, group_m)
    r = pid % per_band
    return first_m + r % rows, r // rows


def build_sm80_gemm(M: int, N: int, K: int, *, dtype="bf16", out_dtype="bf16", b_major="MN",
                    config=None):
    """The Ampere GEMM kernel for ``D[M, N] = A[M, K] @ B``.

    Tensor arguments: A ``(M, K)`` row-major, B ``(K, N)`` (``b_major="MN"``, row-major) or
    ``(N, K)`` (``b_major="K"``: ``x @ w.T`` of a ``(N, K)`` weight); output D ``(M, N)`` in
    ``out_dtype``. The contiguous extents must be multiples of 8 (16-byte rows): ``K`` and,
    for ``b_major="MN"``, ``N``; any ``M`` and ragged ``N``/``K`` edges of a tile are masked.
    ``config``: a ``Sm80GemmConfig``, a plan's name or a mapping of its fields."""
    who = "build_sm80_gemm"
    dt = _dtype(dtype, "dtype", ("bf16", "f16"))
    ot = _dtype(out_dtype, "out_dtype", ("bf16", "f16", "f32"))
    if b_major not in ("MN", "K"):
        raise fail(ConfigError, who, f"b_major must be 'MN' or 'K', got {b_major!r}")
    for name, v in (("M", M), ("N", N), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise fail(ConfigError, who, f"{name} must be a positive int, got {v!r}")
    if K % 8 or (b_major == "MN" and N % 8) or N % 2:
        raise fail(ConfigError, who, f"K{' and N' if b_major == 'MN' else ''} must be "
                   f"multiples of 8 (16-byte rows; N even), got M={M}, N={N}, K={K}")
    cfg = Sm80GemmConfig.of(config)
    BM, BN, BK, S = cfg.BM, cfg.BN, cfg.BK, cfg.stages
    T = cfg.threads
    WM, WN = BM // cfg.warps_m, BN // cfg.warps_n
    MI, NJ = WM // 16, WN // 8
    MT, NT, KT = -(-M // BM), -(-N // BN), -(-K // BK)
    a_tile = SmemTile(BM, BK)
    b_tile = SmemTile(BK, BN) if b_major == "MN" else SmemTile(BN, BK)
    stage_bytes = a_tile.nbytes + b_tile.nbytes
    es = ot.bytes
    ragged_m, ragged_n, ragged_k = M % BM != 0, N % BN != 0, K % BK != 0

    def body(A, B, D):
        pa, pb, pd = ptx.global_ptrs(A, B, D)
        tid = reg.from_(ptx.special.tid.x(), u32)
        lane, warp = tid & 31, tid >> 5
        wm = warp >> (cfg.warps_n.bit_length() - 1)
        wn = warp & (cfg.warps_n - 1)
        pid_m, pid_n = grouped_tile(MT, NT, cfg.group_m)
        m0, n0 = pid_m * BM, pid_n * BN
        base = (smem.dynamic(align=128, name="ring").addr() + 127) & 0xFFFFFF80
        ca = TileCopy(a_tile, T, tid, pa, K, rows_total=M if ragged_m else None,
                      cols_total=K if ragged_k else None)
        if b_major == "MN":
            cb = TileCopy(b_tile, T, tid, pb, N, rows_total=K if ragged_k else None,
                          cols_total=N if ragged_n else None)
            fb = Fragments(b_tile, "b_kn", lane, 0, wn * WN, range(0, WN, 16))
        else:
            cb = TileCopy(b_tile, T, tid, pb, K, rows_total=N if ragged_n else None,
                          cols_total=K if ragged_k else None)
            fb = Fragments(b_tile, "b_nk", lane, wn * WN, 0, range(0, BK, 16))
        fa = Fragments(a_tile, "a", lane, wm * WM, 0, range(0, BK, 16))

        def load(stage, k0):
            ca.issue(stage, m0, k0)
            b_at = stage + a_tile.nbytes
            if b_major == "MN":
                cb.issue(b_at, k0, n0)
            else:
                cb.issue(b_at, n0, k0)

        acc = [[reg.array(f32, 4) for _ in range(NJ)] for _ in range(MI)]
        for row in acc:
            for a in row:
                for r in a:
                    ptx.inst.mov.f32(r, 0.0)

        def compute(stage):
            b_base = stage + a_tile.nbytes
            b_cols = [fb.at(b_base, jj * 16) for jj in range(NJ // 2)] if b_major == "MN" else None
            for kk in range(BK // 16):
                at_a = fa.at(stage, kk * 16)
                af = [fa.load(at_a, i * 16) for i in range(MI)]
                if b_major == "MN":
                    bf = [fb.load(b_cols[jj], kk * 16) for jj in range(NJ // 2)]
                else:
                    at_b = fb.at(b_base, kk * 16)
                    bf = [fb.load(at_b, jj * 16) for jj in range(NJ // 2)]
                for i in range(MI):
                    for j in range(NJ):
                        b = bf[j // 2][2 * (j % 2):2 * (j % 2) + 2]
                        ptx.mma_sync(acc[i][j], af[i], b, acc[i][j], dtype_ab=dt.name)

        for s in range(S - 1):
            if s < KT:
                load(base + s * stage_bytes, s * BK)
            ptx.cp_async.commit_group()
        end = base + S * stage_bytes
        rd = reg.scalar(u32, init=base)
        wr = base + (S - 1) * stage_bytes
        kload = reg.scalar(u32, init=(S - 1) * BK)
        for _ in ptx.loop(0, KT):
            ptx.cp_async.wait_group(S - 2)
            ptx.bar_sync(0)
            with ptx.if_(kload < KT * BK):
                load(wr, kload)
            ptx.cp_async.commit_group()
            compute(rd)
            for ptr in (rd, wr):
                ptr += stage_bytes
                ptx.inst.selp.u32(ptr, base, ptr, ptr == end)
            kload += BK
        ptx.cp_async.wait_all()

        g, t = lane >> 2, lane & 3
        row_t = m0 + wm * WM + g
        col_t = n0 + wn * WN + t * 2
        dptr = reg.scalar(u64)
        ptx.inst.mul.wide.u32(dptr, row_t, N * es)
        dptr = pd + dptr + col_t * es
        for i in range(MI):
            for h in range(2):
                dr = i * 16 + 8 * h
                if ragged_m and M - dr <= 0:       # no tile has a row here
                    continue
                row_ok = row_t < M - dr if ragged_m else None
                for j in range(NJ):
                    if ragged_n and N - j * 8 <= 0:
                        continue
                    ok = row_ok
                    if ragged_n:
                        col_ok = col_t < N - j * 8
                        ok = col_ok if ok is None else (ok & col_ok)
                    lo, hi = acc[i][j][2 * h], acc[i][j][2 * h + 1]
                    at = ptx.addr(dptr, (dr * N + j * 8) * es)
                    if ot is f32:
                        ptx.inst.st.global_.v2.f32(at, [lo, hi], pred=ok)
                    else:
                        pack = ptx.pack_bf16x2 if ot is bf16 else ptx.pack_f16x2
                        ptx.inst.st.global_.b32(at, pack(lo, hi), pred=ok)
        ptx.ret()

    b_spec = Tile(K, N, dt) if b_major == "MN" else Tile(N, K, dt)
    name = f"sm80_gemm_{dt.name}_{ot.name}_{b_major}_{BM}x{BN}x{BK}_s{S}"
    deco = kernel(in_specs=(Tile(M, K, dt), b_spec), out_specs=(Tile(M, N, ot),),
                  grid=(MT * NT, 1, 1), block=(T, 1, 1), smem=cfg.smem_bytes, arch="sm_80",
                  name=name)

    def sm80_gemm(A, B, D):
        body(A, B, D)

    return deco(sm80_gemm)
