"""One wgmma tile: ``D[64, N] = A[64, K] @ B[K, N]`` by one warpgroup, for any operand layout.

The smallest complete use of the tensor-core layer: thread 0 fills an A and a B
``OperandTile`` with bulk tensor copies (their maps come from ``tile.tma_options()``),
the warpgroup issues ``K / 16`` ``wgmma.mma_async`` on the tiles' descriptors, and
every thread stores its accumulator registers at the (row, col) the ``Accumulator``
fragment gives. It checks a layout end to end: ``a_major``/``b_major`` ('K' or 'MN')
and ``swizzle`` (128, 64, 32 or None bytes) pick the canonical layout of both tiles.
"""

from __future__ import annotations

import sys

from pyptx import Tile, kernel, ptx, reg, smem
from pyptx.fragment import Accumulator
from pyptx.operand import OperandTile
from pyptx.types import b64, bf16, f32, u32


def build_wgmma_tile(N: int = 64, K: int = 64, *, a_major="K", b_major="K", swizzle=128,
                     dtype=bf16, a_view="2d"):
    """The one-tile kernel: A is ``(64, K)`` (K-major) or ``(K, 64)``, B ``(N, K)`` (K-major)
    or ``(K, N)``, D ``(64, N)`` f32. ``a_view="3d"`` fills a K-major, 128-byte-swizzled A
    of any K with one 3-D copy (``@kernel(tma={"A": dict(view="3d", ...)})``)."""
    a = OperandTile(64, K, dtype, major=a_major, swizzle=swizzle)
    b = OperandTile(N, K, dtype, major=b_major, swizzle=swizzle)
    b_off = -(-a.nbytes // 1024) * 1024
    a_spec = Tile(64, K, dtype) if a_major == "K" else Tile(K, 64, dtype)
    b_spec = Tile(N, K, dtype) if b_major == "K" else Tile(K, N, dtype)

    @kernel(in_specs=(a_spec, b_spec), out_specs=(Tile(64, N, f32),), block=(128, 1, 1),
            smem=b_off + b.nbytes + 1024,
            tma={"A": dict(view="3d", box=(64, K)) if a_view == "3d" else a.tma_options(),
                 "B": b.tma_options()},
            name=f"wgmma_tile_{a_major}{b_major}_sw{swizzle}_n{N}_k{K}_{a_view}")
    def wgmma_tile(A, B, D):
        (pd,) = ptx.global_ptrs(D)
        buf = (smem.dynamic(align=128, name="tiles").addr() + 1023) & 0xFFFFFC00
        bar = smem.alloc(b64, 1, align=8, name="bar")
        tid = reg.from_(ptx.special.tid.x(), u32)
        with ptx.if_(tid == 0):
            ptx.mbarrier.init(bar, 1)
        ptx.bar_sync(0)
        with ptx.if_(tid == 0):
            ptx.mbarrier.arrive_expect_tx(bar, a.nbytes + b.nbytes)
            a.load(buf, A, 0, 0, bar)
            b.load(buf + b_off, B, 0, 0, bar)
        ptx.mbarrier.wait(bar, 0)
        acc = Accumulator(N)
        da = a.descriptor(buf)
        db = b.descriptor(buf, offset=b_off)
        ptx.wgmma.fence()
        for kk in range(a.k_steps):
            ptx.wgmma.mma_async(acc.regs, a.advance(da, kk), b.advance(db, kk), n=N,
                                dtype_ab=dtype.name, scale_d=0 if kk == 0 else 1,
                                trans_a=a.trans, trans_b=b.trans)
        ptx.wgmma.commit_group()
        ptx.wgmma.wait_group(0)
        row, col = acc.thread_origin(tid)
        first = reg.from_(row * N + col, u32)
        for i in range(len(acc)):
            r, c = Accumulator.coord(i)
            ptx.inst.st.global_.f32(ptx.addr(pd + first * 4, (r * N + c) * 4), acc[i])
        ptx.ret()

    return wgmma_tile


def _t(m):
    return [list(col) for col in zip(*m)]


def main(argv=None) -> int:
    """Check every layout (or those named like ``KMN128``) on a GPU against float64, or
    print their ptxas reports."""
    from pyptx.testing import run_example

    fails = 0
    only = list(argv if argv is not None else sys.argv[1:])
    for sw in (128, 64, 32, None):
        for am in ("K", "MN"):
            for bm in ("K", "MN"):
                if only and f"{am}{bm}{sw}" not in only:
                    continue
                print(f"A {am}-major, B {bm}-major, swizzle {sw}:")

                def make_inputs(torch, am=am, bm=bm):
                    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
                    b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
                    return (a.contiguous() if am == "K" else a.T.contiguous(),
                            b.T.contiguous() if bm == "K" else b.contiguous())

                def reference(a, b, am=am, bm=bm):
                    a, b = (a if am == "K" else _t(a)), (_t(b) if bm == "K" else b)
                    return [[sum(x * y for x, y in zip(row, col)) for col in zip(*b)]
                            for row in a]

                k = build_wgmma_tile(64, 64, a_major=am, b_major=bm, swizzle=sw)
                fails += run_example(k, make_inputs, reference, atol=1e-3, rtol=1e-3) != 0
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
