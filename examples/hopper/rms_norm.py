"""RMSNorm, one warp per row: ``y = x * rsqrt(mean(x**2) + eps) * w`` in f32.

The kernel of the Torch runtime guide, unchanged. Each of the ``B`` CTAs is one
warp that owns one row: every lane keeps its ``N / 32`` elements in registers
(strided by 32, so loads coalesce), accumulates their squares with ``fma``,
sums across the warp with a butterfly shuffle, and scales by ``rsqrt.approx``
and the weight. ``N`` must be a multiple of 32; large ``N`` spills registers.

    python examples/hopper/rms_norm.py [B] [N] [--eps EPS]
"""

from pyptx import Tile, kernel, ptx, reg
from pyptx.types import f32, u32

WARP_SIZE = 32


def build_rms_norm(B: int, N: int, eps: float = 1e-6):
    """The RMSNorm kernel for a ``(B, N)`` f32 input and an ``(N,)`` weight."""
    items_per_thread = N // WARP_SIZE

    @kernel(
        in_specs=(Tile(B, N, f32), Tile(N, f32)),
        out_specs=(Tile(B, N, f32),),
        grid=(B, 1, 1),
        block=(WARP_SIZE, 1, 1),
        arch="sm_90a",
    )
    def rms_norm(X, W, Y):
        px, pw, py = ptx.global_ptrs(X, W, Y)
        row = reg.from_(ptx.special.ctaid.x(), u32)
        row_byte_off = row * (N * 4)
        px += row_byte_off
        py += row_byte_off

        tid = reg.from_(ptx.special.tid.x(), u32)
        sum_sq = reg.scalar(f32, init=0.0)
        x_vals = reg.array(f32, items_per_thread)

        for i in range(items_per_thread):
            idx = tid + i * WARP_SIZE
            ptr = px + idx * 4
            ptx.inst.ld.global_.f32(x_vals[i], ptx.addr(ptr))
            ptx.inst.fma.rn.f32(sum_sq, x_vals[i], x_vals[i], sum_sq)

        ptx.warp.reduce_sum(sum_sq)
        mean_sq = reg.scalar(f32)
        inv_n = reg.scalar(f32, init=1.0 / N)
        eps_reg = reg.scalar(f32, init=eps)
        rstd = reg.scalar(f32)
        ptx.inst.mul.f32(mean_sq, sum_sq, inv_n)
        ptx.inst.add.f32(mean_sq, mean_sq, eps_reg)
        ptx.inst.rsqrt.approx.f32(rstd, mean_sq)

        for i in range(items_per_thread):
            idx = tid + i * WARP_SIZE
            off = idx * 4
            w_val = reg.scalar(f32)
            y_val = reg.scalar(f32)
            ptx.inst.ld.global_.f32(w_val, ptx.addr(pw + off))
            ptx.inst.mul.f32(y_val, x_vals[i], rstd)
            ptx.inst.mul.f32(y_val, y_val, w_val)
            ptx.inst.st.global_.f32(ptx.addr(py + off), y_val)
        ptx.ret()

    return rms_norm


def reference(x, w, eps=1e-6):
    """RMSNorm of nested lists of floats, in Python (float64) arithmetic."""
    out = []
    for row in x:
        rstd = (sum(v * v for v in row) / len(row) + eps) ** -0.5
        out.append([v * rstd * wv for v, wv in zip(row, w)])
    return out


def main(argv=None) -> int:
    """Check on a GPU, or print the ptxas report."""
    from pyptx.testing import parse_args, run_example

    a = parse_args(__doc__.splitlines()[0], argv, B=16, N=512, eps=1e-6)
    B, N, eps = a["B"], a["N"], a["eps"]

    def make_inputs(torch):
        x = torch.randn(B, N, device="cuda") * 0.3
        w = torch.randn(N, device="cuda") * 0.1 + 1.0
        return x, w

    return run_example(build_rms_norm(B, N, eps), make_inputs,
                       lambda x, w: reference(x, w, eps), atol=1e-4, rtol=1e-4)


if __name__ == "__main__":
    raise SystemExit(main())
