"""TMA tile copy: the bulk tensor copy engine loads a tile into shared memory, the CTA
stores it back out. The smallest complete use of ``@kernel(tma=...)``.

Each CTA owns one ``box x box`` tile of an ``(M, N)`` matrix. Thread 0 arms an
mbarrier with the tile's byte count and issues ``cp.async.bulk.tensor.2d`` on the
input's tensor map (``X.tmap``: a by-value 128-byte ``CUtensorMap`` the runtime
builds for X and re-addresses at every launch); every thread waits on the barrier,
then writes its share of the tile to Y with ordinary stores. Out-of-bounds parts of
edge tiles arrive zero-filled and are not stored, so any M, N work.
"""

from __future__ import annotations

import sys

from pyptx import Tile, kernel, ptx, reg, smem
from pyptx.errors import ConfigError
from pyptx.types import b64, f32, u32

THREADS = 128


def build_tma_copy(M: int, N: int, box: int = 32):
    """Copy an (M, N) f32 matrix through shared memory in ``box x box`` TMA tiles."""
    if box not in (8, 16, 32, 64):
        raise ConfigError(f"build_tma_copy: box must be 8, 16, 32 or 64, got {box}")
    per_thread = -(-box * box // THREADS)
    tile_bytes = box * box * 4

    @kernel(
        in_specs=(Tile(M, N, f32),),
        out_specs=(Tile(M, N, f32),),
        grid=((N + box - 1) // box, (M + box - 1) // box, 1),
        block=(THREADS, 1, 1),
        tma={"X": dict(box=(box, box), swizzle=None)},
    )
    def tma_copy(X, Y):
        (py,) = ptx.global_ptrs(Y)
        tile = smem.alloc(f32, (box, box), align=128, name="tile")
        bar = smem.alloc(b64, 1, align=8, name="bar")
        tid = reg.from_(ptx.special.tid.x(), u32)
        col0 = reg.from_(ptx.special.ctaid.x(), u32) * box
        row0 = reg.from_(ptx.special.ctaid.y(), u32) * box
        leader = tid == 0
        with ptx.if_(leader):
            ptx.mbarrier.init(bar, 1)
            ptx.fence_proxy_async()
        ptx.bar_sync()
        with ptx.if_(leader):
            ptx.mbarrier.arrive_expect_tx(bar, tile_bytes)
            ptx.tma.load_tile(tile, X.tmap, (col0, row0), bar)
        ptx.mbarrier.wait(bar, 0)
        base = tile.addr()
        for i in range(per_thread):
            idx = tid + i * THREADS
            r = row0 + (idx // box)
            c = col0 + (idx % box)
            in_tile = idx < box * box
            inside = in_tile & (r < M) & (c < N)
            v = reg.scalar(f32)
            ptx.inst.ld.shared.f32(v, ptx.addr(base + idx * 4), pred=in_tile)
            ptx.inst.st.global_.f32(ptx.addr(py + reg.from_(r * N + c, u32) * 4), v, pred=inside)
        ptx.ret()

    return tma_copy


def reference(x):
    """The copy itself."""
    return [list(row) for row in x]


def main(argv=None) -> int:
    from pyptx.testing import parse_args, run_example

    a = parse_args(__doc__.splitlines()[0], argv, M=1000, N=700)
    k = build_tma_copy(a["M"], a["N"])
    return run_example(k, lambda torch: [torch.randn(a["M"], a["N"], device="cuda")],
                       lambda x: x, atol=0.0, rtol=0.0)


if __name__ == "__main__":
    sys.exit(main())
