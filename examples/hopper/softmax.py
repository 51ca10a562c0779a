"""Row softmax, ``y = exp(x - max(x)) / sum(exp(x - max(x)))`` in f32: one warp per row.

Each of the ``B`` CTAs is one warp that owns one row; every lane keeps its
``N / 32`` elements in registers (strided by 32 for coalescing). The row
maximum and the sum of exponentials come from butterfly-shuffle reductions;
``exp(x - m)`` is ``ex2.approx((x - m) * log2(e))`` with the scaling folded
into one ``fma``, and the normalization multiplies by ``rcp.approx`` of the
sum. ``N`` must be a multiple of 32; large ``N`` spills registers.

    python examples/hopper/softmax.py [B] [N]
"""

import math

from pyptx import SpecError, Tile, kernel, ptx, reg
from pyptx.types import f32, u64

WARP_SIZE = 32
LOG2E = 1.0 / math.log(2.0)


def build_softmax(B: int, N: int):
    """The kernel taking the softmax of each row of a ``(B, N)`` f32 matrix."""
    if N % WARP_SIZE:
        raise SpecError(f"build_softmax: N must be a multiple of {WARP_SIZE}, got {N}")
    items = N // WARP_SIZE
    stride = WARP_SIZE * 4

    @kernel(
        in_specs=(Tile(B, N, f32),),
        out_specs=(Tile(B, N, f32),),
        grid=(B, 1, 1),
        block=(WARP_SIZE, 1, 1),
    )
    def softmax(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        off = reg.scalar(u64)
        ptx.inst.mul.wide.u32(off, ptx.special.ctaid.x(), N * 4)
        ptx.inst.mad.wide.u32(off, ptx.special.tid.x(), 4, off)
        px += off
        py += off

        x = reg.array(f32, items)
        for i in range(items):
            ptx.inst.ld.global_.f32(x[i], ptx.addr(px, i * stride))
        m = reg.scalar(f32, init=x[0])
        for i in range(1, items):
            ptx.inst.max.f32(m, m, x[i])
        ptx.warp.reduce_max(m)

        neg_m = reg.scalar(f32)
        ptx.inst.mul.f32(neg_m, m, -LOG2E)
        total = reg.scalar(f32, init=0.0)
        for i in range(items):
            ptx.inst.fma.rn.f32(x[i], x[i], LOG2E, neg_m)
            ptx.inst.ex2.approx.ftz.f32(x[i], x[i])
            total += x[i]
        ptx.warp.reduce_sum(total)

        inv = reg.scalar(f32)
        ptx.inst.rcp.approx.ftz.f32(inv, total)
        for i in range(items):
            ptx.inst.mul.f32(x[i], x[i], inv)
            ptx.inst.st.global_.f32(ptx.addr(py, i * stride), x[i])
        ptx.ret()

    return softmax


def reference(x):
    """Softmax of each row of a list of rows, in Python floats."""
    out = []
    for row in x:
        m = max(row)
        e = [math.exp(v - m) for v in row]
        s = sum(e)
        out.append([v / s for v in e])
    return out


def main(argv=None) -> int:
    """Check on a GPU, or print the ptxas report."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _harness import parse_args, run_example

    a = parse_args(__doc__.splitlines()[0], argv, B=64, N=1024)

    def make_inputs(torch):
        return (torch.randn(a["B"], a["N"], device="cuda") * 3.0,)

    return run_example(build_softmax(a["B"], a["N"]), make_inputs, reference,
                       atol=1e-6, rtol=1e-5)


if __name__ == "__main__":
    raise SystemExit(main())
