"""Matrix transpose, ``y[j, i] = x[i, j]`` for an ``(M, N)`` f32 matrix, through shared memory.

Each CTA of ``tile x rows`` threads moves one ``tile x tile`` tile: it reads
the tile row by row (coalesced), stores it into a shared ``tile x (tile + 1)``
buffer, waits at ``bar.sync``, then reads the buffer column by column and
writes the transposed tile row by row (coalesced again). The extra column
puts the elements of a buffer column in different banks, so the column reads
are free of bank conflicts. Every thread handles ``tile / rows`` elements.
The grid covers ``ceil(N / tile) x ceil(M / tile)`` tiles; elements outside
the matrix are skipped, so ``M`` and ``N`` are arbitrary.

    python examples/transpose.py [M] [N] [--tile TILE] [--rows ROWS]
"""

from pyptx import ConfigError, SpecError, Tile, kernel, ptx, reg, smem
from pyptx.types import f32, u64


def build_transpose(M: int, N: int, tile: int = 32, rows: int = 8):
    """The kernel writing the ``(N, M)`` transpose of an ``(M, N)`` f32 matrix."""
    if tile % rows or tile * rows % 32 or tile * rows > 1024:
        raise ConfigError(
            f"build_transpose: rows must divide tile and tile * rows be a multiple of 32 up to "
            f"1024, got tile={tile} rows={rows}")
    if M * N >= 2**32:
        raise SpecError(f"build_transpose: M * N must be below 2**32 (32-bit indices), got {M * N}")
    pitch = tile + 1

    @kernel(
        in_specs=(Tile(M, N, f32),),
        out_specs=(Tile(N, M, f32),),
        grid=(-(-N // tile), -(-M // tile), 1),
        block=(tile, rows, 1),
    )
    def transpose(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        tx, ty = ptx.special.tid.x(), ptx.special.tid.y()
        col0 = ptx.special.ctaid.x() * tile
        row0 = ptx.special.ctaid.y() * tile
        buf = smem.alloc(f32, (tile, pitch), name="tile")
        v = reg.scalar(f32)
        off = reg.scalar(u64)

        # x[row0 + ty + k, col0 + tx] -> buf[ty + k, tx]
        r, c = row0 + ty, col0 + tx
        src = r * N + c
        dst = buf.addr() + (ty * pitch + tx) * 4
        col_ok = c < N
        for k in range(0, tile, rows):
            ok = (r + k < M) & col_ok
            ptx.inst.mul.wide.u32(off, src + k * N, 4)
            ptx.inst.ld.global_.f32(v, ptx.addr(px + off), pred=ok)
            ptx.inst.st.shared.f32(ptx.addr(dst, k * pitch * 4), v, pred=ok)
        ptx.bar_sync()

        # buf[tx, ty + k] -> y[col0 + ty + k, row0 + tx]
        r, c = col0 + ty, row0 + tx
        out = r * M + c
        src = buf.addr() + (tx * pitch + ty) * 4
        col_ok = c < M
        for k in range(0, tile, rows):
            ok = (r + k < N) & col_ok
            ptx.inst.ld.shared.f32(v, ptx.addr(src, k * 4), pred=ok)
            ptx.inst.mul.wide.u32(off, out + k * M, 4)
            ptx.inst.st.global_.f32(ptx.addr(py + off), v, pred=ok)
        ptx.ret()

    return transpose


def reference(x):
    """The transpose of a list of rows."""
    return [list(col) for col in zip(*x)]


def main(argv=None) -> int:
    """Check on a GPU, or print the ptxas report."""
    from pyptx.testing import parse_args, run_example

    a = parse_args(__doc__.splitlines()[0], argv, M=1000, N=700, tile=32, rows=8)

    def make_inputs(torch):
        return (torch.randn(a["M"], a["N"], device="cuda"),)

    return run_example(build_transpose(a["M"], a["N"], a["tile"], a["rows"]), make_inputs,
                       reference, atol=0.0, rtol=0.0)


if __name__ == "__main__":
    raise SystemExit(main())
