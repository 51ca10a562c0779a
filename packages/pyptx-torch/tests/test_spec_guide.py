"""The Torch runtime guide's examples (shared/spec/torch_runtime_guide.txt), run as written."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from pyptx import Tile, kernel, ptx, reg  # noqa: E402
from pyptx.types import f32, u32  # noqa: E402

WARP_SIZE = 32


def build_rms_norm(B: int, N: int, eps: float = 1e-6):
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


def ref(x, w, eps=1e-6):
    x64 = x.double()
    return x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w.double()


def close(out, expected):
    assert not torch.isnan(out).any()
    assert ((out.double() - expected).norm() / expected.norm()).item() < 1e-5


def test_what_it_looks_like():
    k = build_rms_norm(16, 512)
    x = torch.randn(16, 512, device="cuda") * 0.3
    w = torch.randn(512, device="cuda") * 0.1 + 1.0
    out = k(x, w)
    close(out, ref(x, w))


def test_cuda_graphs_tier():
    k = build_rms_norm(256, 4096)
    x = torch.randn(256, 4096, device="cuda")
    w = torch.randn(4096, device="cuda")

    # Warm up
    k(x, w)

    # Capture
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        k(x, w)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g, stream=s):
        out = k(x, w)

    # Replay
    g.replay()
    torch.cuda.synchronize()
    close(out, ref(x, w))


def test_turbo_eager_tier():
    k = build_rms_norm(256, 4096)
    x = torch.randn(256, 4096, device="cuda")
    w = torch.randn(4096, device="cuda")
    out = k(x, w)
    out = k(x, w)
    close(out, ref(x, w))


def test_torch_compile_tier():
    k = build_rms_norm(256, 4096)
    k_compiled = torch.compile(k)

    x = torch.randn(256, 4096, device="cuda")
    w = torch.randn(4096, device="cuda")
    out = k_compiled(x, w)
    close(out, ref(x, w))


def test_autograd_tier():
    from test_torch_gpu import build_mul, build_mul_bwd

    from pyptx import differentiable_kernel

    M, N = 64, 256

    def build_my_forward(M, N):
        return build_mul(M, N)

    def build_my_backward(M, N):
        return build_mul_bwd(M, N)

    fwd = build_my_forward(M, N)
    bwd = build_my_backward(M, N)

    my_op = differentiable_kernel(
        fwd, bwd,
        save_for_backward=[0, 1],  # save input indices 0 and 1 for backward
    )

    x = torch.randn(M, N, device="cuda", requires_grad=True)
    w = torch.randn(M, N, device="cuda", requires_grad=True)
    out = my_op(x, w)
    out.sum().backward()  # calls bwd kernel with saved tensors + grad_output
    assert torch.allclose(x.grad, w.detach()) and torch.allclose(w.grad, x.detach())
