"""Row sums, ``out[b] = sum(x[b, :])`` in f32: one CTA of ``threads`` threads per row.

Each thread adds the elements ``tid, tid + threads, ...`` of its row in a
device loop (coalesced, any ``N``), each warp sums its 32 partials with a
butterfly shuffle, lane 0 of every warp writes its warp's sum to shared
memory, and after ``bar.sync`` the first warp reduces those and writes the
row's total. ``threads`` must be a multiple of 32 up to 1024.

    python examples/block_reduce.py [B] [N] [--threads THREADS]
"""

from pyptx import ConfigError, Tile, kernel, ptx, reg, smem
from pyptx.types import f32, u64


def build_block_sum(B: int, N: int, threads: int = 256):
    """The kernel summing each row of a ``(B, N)`` f32 matrix into ``out[B]``."""
    if threads % 32 or not 0 < threads <= 1024:
        raise ConfigError(
            f"build_block_sum: threads must be a multiple of 32 in 32..1024, got {threads}")
    if N >= 2**31:
        raise ConfigError(f"build_block_sum: N must be below 2**31 (32-bit indices), got {N}")
    warps = threads // 32

    @kernel(
        in_specs=(Tile(B, N, f32),),
        out_specs=(Tile(B, f32),),
        grid=(B, 1, 1),
        block=(threads, 1, 1),
    )
    def block_sum(X, Out):
        px, pout = ptx.global_ptrs(X, Out)
        row = ptx.special.ctaid.x()
        tid = ptx.special.tid.x()
        row_off = reg.scalar(u64)
        ptx.inst.mul.wide.u32(row_off, row, N * 4)
        px += row_off

        acc = reg.scalar(f32, init=0.0)
        v = reg.scalar(f32)
        off = reg.scalar(u64)
        for j in ptx.loop(tid, N, threads):
            ptx.inst.mul.wide.u32(off, j, 4)
            ptx.inst.ld.global_.f32(v, ptx.addr(px + off))
            acc += v
        ptx.warp.reduce_sum(acc)

        partials = smem.alloc(f32, warps, name="partials")
        lane = tid & 31
        warp = tid >> 5
        with ptx.if_(lane == 0):
            ptx.inst.st.shared.f32(ptx.addr(partials.addr() + warp * 4), acc)
        ptx.bar_sync()

        with ptx.if_(warp == 0):
            total = reg.scalar(f32, init=0.0)
            ptx.inst.ld.shared.f32(total, ptx.addr(partials.addr() + lane * 4), pred=lane < warps)
            ptx.warp.reduce_sum(total)
            with ptx.if_(lane == 0):
                out_off = reg.scalar(u64)
                ptx.inst.mul.wide.u32(out_off, row, 4)
                ptx.inst.st.global_.f32(ptx.addr(pout + out_off), total)
        ptx.ret()

    return block_sum


def reference(x):
    """Row sums of a list of rows of floats."""
    return [sum(row) for row in x]


def main(argv=None) -> int:
    """Check on a GPU, or print the ptxas report."""
    from pyptx.testing import parse_args, run_example

    a = parse_args(__doc__.splitlines()[0], argv, B=64, N=10_000, threads=256)

    def make_inputs(torch):
        return (torch.randn(a["B"], a["N"], device="cuda"),)

    return run_example(build_block_sum(a["B"], a["N"], a["threads"]), make_inputs, reference,
                       atol=1e-3, rtol=1e-4)


if __name__ == "__main__":
    raise SystemExit(main())
