"""Vector add, ``c = a + b`` in f32: one thread per element.

Thread ``i = ctaid.x * block + tid.x`` adds element ``i``; the grid is
``ceil(N / block)`` CTAs and threads with ``i >= N`` skip the work, so ``N``
need not be a multiple of ``block``. Byte offsets are 64-bit
(``mul.wide.u32``), so any ``N`` below 2**31 works. ``block`` must be a
multiple of 32 up to 1024.

    python examples/vector_add.py [N] [--block BLOCK]
"""

from pyptx import ConfigError, Tile, kernel, ptx, reg
from pyptx.types import f32, u64


def build_vector_add(N: int, block: int = 256):
    """The kernel adding two ``(N,)`` f32 vectors."""
    if block % 32 or not 0 < block <= 1024:
        raise ConfigError(f"build_vector_add: block must be a multiple of 32 in 32..1024, got {block}")
    if N >= 2**31:
        raise ConfigError(f"build_vector_add: N must be below 2**31 (32-bit indices), got {N}")

    @kernel(
        in_specs=(Tile(N, f32), Tile(N, f32)),
        out_specs=(Tile(N, f32),),
        grid=(-(-N // block), 1, 1),
        block=(block, 1, 1),
    )
    def vector_add(A, B, C):
        pa, pb, pc = ptx.global_ptrs(A, B, C)
        i = ptx.special.ctaid.x() * block + ptx.special.tid.x()
        with ptx.if_(i < N):
            off = reg.scalar(u64)
            ptx.inst.mul.wide.u32(off, i, 4)
            a, b = reg.scalar(f32), reg.scalar(f32)
            ptx.inst.ld.global_.f32(a, ptx.addr(pa + off))
            ptx.inst.ld.global_.f32(b, ptx.addr(pb + off))
            ptx.inst.st.global_.f32(ptx.addr(pc + off), a + b)
        ptx.ret()

    return vector_add


def reference(a, b):
    """``a + b`` of two lists of floats."""
    return [x + y for x, y in zip(a, b)]


def main(argv=None) -> int:
    """Check on a GPU, or print the ptxas report."""
    from pyptx.testing import parse_args, run_example

    a = parse_args(__doc__.splitlines()[0], argv, N=100_000, block=256)

    def make_inputs(torch):
        return torch.randn(a["N"], device="cuda"), torch.randn(a["N"], device="cuda")

    return run_example(build_vector_add(a["N"], a["block"]), make_inputs, reference,
                       atol=1e-6, rtol=1e-6)


if __name__ == "__main__":
    raise SystemExit(main())
