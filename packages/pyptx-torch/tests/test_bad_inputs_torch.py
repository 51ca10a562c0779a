"""Bad input to the PyTorch runtime, checkable without a GPU: each case raises a
``PyptxError`` whose message starts with this file and the case's line (never a frame
inside ``pyptx_torch``). CUDA tensors are fake (``FakeTensorMode``), so nothing launches."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from pyptx import Tile, kernel, ptx  # noqa: E402
from pyptx.errors import PyptxError, ShapeError, SpecError  # noqa: E402
from pyptx.types import f32  # noqa: E402
from pyptx_torch import differentiable_kernel  # noqa: E402

HERE = os.path.abspath(__file__)


@kernel(in_specs=(Tile("M", "K", f32), Tile("K", "N", f32)), out_specs=(Tile("M", "N", f32),))
def mm(A, B, C):
    ptx.ret()


@kernel(in_specs=(Tile("M", "N", f32), Tile("M", "N", f32)), out_specs=(Tile("M", "N", f32),))
def fwd(X, W, Y):
    ptx.ret()


@kernel(in_specs=(Tile("M", "N", f32), Tile("M", "N", f32), Tile("M", "N", f32)),
        out_specs=(Tile("M", "N", f32), Tile("M", "N", f32)))
def bwd(X, W, G, DX, DW):
    ptx.ret()


def cuda(*shape, **kw):
    return torch.empty(*shape, device=kw.pop("device", "cuda"), **kw)


# Host-side cases (real CPU and meta tensors): (case, error, text).
HOST = [
    (lambda: mm(torch.randn(4, 8), torch.randn(8, 2)), SpecError, "argument 'A' is on cpu"),
    (lambda: mm(torch.empty(4, 8, device="meta"), torch.empty(8, 2, device="meta")), SpecError, "argument 'A' is on meta"),
    (lambda: mm(torch.empty(4, 8, device="meta"), torch.randn(8, 2)), SpecError, "is on meta"),
    (lambda: mm(torch.empty(4, 8, device="meta")), SpecError, "mm takes 2 input tensors (A, B), got 1"),
    (lambda: mm(torch.randn(4, 8), torch.randn(8, 2), torch.randn(4, 2)), SpecError, "mm takes 2 input tensors"),
    (lambda: mm(torch.randn(4, 8), 5), SpecError, ""),
    (lambda: differentiable_kernel(fwd, bwd, save_for_backward=["Q"]), SpecError, "save_for_backward index 'Q'"),
    (lambda: differentiable_kernel(fwd, bwd, save_for_backward=[2]), SpecError, "is not an input index of fwd"),
    (lambda: differentiable_kernel(fwd, bwd, save_for_backward=[True]), SpecError, "save_for_backward index True"),
    (lambda: differentiable_kernel(fwd, bwd, save_for_backward=5), SpecError, "must be a sequence"),
    (lambda: differentiable_kernel(fwd, bwd, num_grad_inputs=3), SpecError, "num_grad_inputs must be an int in 1..2"),
    (lambda: differentiable_kernel(fwd, bwd, save_outputs=[1]), SpecError, "save_outputs index 1 is not an output index of fwd"),
    (lambda: differentiable_kernel(fwd, bwd, save_outputs="Y"), SpecError, "save_outputs must be a sequence"),
    (lambda: differentiable_kernel(fwd, bwd, save_outputs=[0]), SpecError, "2 saved tensors + 1 saved outputs + 1 output"),
    (lambda: differentiable_kernel(fwd, bwd, num_grad_inputs=0), SpecError, "num_grad_inputs"),
    (lambda: differentiable_kernel(fwd, bwd, save_for_backward=[0]), SpecError, "bwd takes 3 inputs"),
    (lambda: differentiable_kernel(fwd, fwd), SpecError, "fwd takes 2 inputs"),
    (lambda: differentiable_kernel(fwd, mm, save_for_backward=[0]), SpecError, "mm returns 1 tensors"),
    (lambda: differentiable_kernel(lambda x: x, bwd), SpecError, "forward_kernel must be a pyptx Kernel"),
    (lambda: differentiable_kernel(fwd, None), SpecError, "backward_kernel must be a pyptx Kernel"),
]

# Cases on fake CUDA tensors: (case, error, text).
FAKE = [
    (lambda: mm(cuda(4, 8, dtype=torch.float16), cuda(8, 2)), SpecError, "argument 'A': expected dtype f32"),
    (lambda: mm(cuda(4, 8), cuda(8, 2, dtype=torch.int32)), SpecError, "argument 'B': expected dtype f32"),
    (lambda: mm(cuda(4, 8), cuda(9, 2)), ShapeError, "argument 'B' dim 0 ('K'): expected 8"),
    (lambda: mm(cuda(4, 8, 1), cuda(8, 2)), ShapeError, "argument 'A': expected rank 2"),
    (lambda: mm(cuda(8), cuda(8, 2)), ShapeError, "expected rank 2"),
    (lambda: mm(cuda(4, 8), cuda(8, 2), M=5), ShapeError, "expected 5 (from keyword argument)"),
    (lambda: mm(cuda(4, 8), cuda(8, 2), Q=5), SpecError, "unknown keyword 'Q'"),
    (lambda: mm(cuda(8, 4).t(), cuda(8, 2)), SpecError, "is not contiguous"),
    (lambda: mm(cuda(4, 8), cuda(8, 2, device="cuda:1")), SpecError, "all tensors must share one device"),
    (lambda: mm(cuda(4, 8), torch.randn(8, 2)), SpecError, "argument 'B' is on cpu"),
    (lambda: mm(cuda(4, 8)), SpecError, "takes 2 input tensors"),
]


def _check(case, exc, text):
    with pytest.raises(exc) as ei:
        case()
    msg = str(ei.value)
    assert isinstance(ei.value, PyptxError)
    assert msg.startswith(f"{HERE}:{case.__code__.co_firstlineno}: "), msg
    assert "pyptx_torch" not in msg.split(": ")[0], msg
    assert text in msg, msg


@pytest.mark.parametrize("case, exc, text", HOST, ids=[f"L{c.__code__.co_firstlineno}" for c, *_ in HOST])
def test_host_tensor_mistake_is_reported_at_the_callers_line(case, exc, text):
    _check(case, exc, text)


@pytest.mark.parametrize("case, exc, text", FAKE, ids=[f"L{c.__code__.co_firstlineno}" for c, *_ in FAKE])
def test_cuda_tensor_mistake_is_reported_at_the_callers_line(case, exc, text):
    with FakeTensorMode():
        _check(case, exc, text)


# --------------------------------------------------------------------- on a GPU
def _copy_scaled(wide: bool):
    """y = 2 x, one element per thread; offsets in 64 bits when ``wide``."""
    from pyptx import reg
    from pyptx.types import u32, u64

    @kernel(in_specs=(Tile("N", f32),), out_specs=(Tile("N", f32),), block=(256, 1, 1),
            grid=lambda N: ((N + 255) // 256, 1, 1), name="copy_scaled_wide" if wide else "copy_scaled")
    def copy_scaled(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        t = u64 if wide else u32
        i = reg.from_(ptx.special.ctaid.x(), t) * 256 + reg.from_(ptx.special.tid.x(), t)
        with ptx.if_(i < X.shape[0]):
            v = reg.scalar(f32)
            ptx.inst.ld.global_.f32(v, ptx.addr(px + i * 4))
            ptx.inst.st.global_.f32(ptx.addr(py + i * 4), v * 2.0)
        ptx.ret()

    return copy_scaled


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tensor_over_4_gib_is_addressed_with_64_bit_offsets():
    free, _total = torch.cuda.mem_get_info()
    n = (1 << 30) + (1 << 20)  # 4 GiB + 4 MiB of f32
    if free < 2 * 4 * n + (1 << 30):
        pytest.skip("needs about 10 GB of free GPU memory")
    x = torch.empty(n, device="cuda")
    idx = torch.tensor([0, 1, (1 << 30) - 1, 1 << 30, n - 1], device="cuda")
    x[idx] = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], device="cuda")
    y = _copy_scaled(wide=True)(x)
    torch.cuda.synchronize()
    assert y[idx].tolist() == [2.0, 4.0, 6.0, 8.0, 10.0]
    del x, y
    with pytest.raises(PyptxError, match="over 4 GiB"):  # 32-bit offsets: refused at trace time
        _copy_scaled(wide=False).ptx(N=n)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_launch_mistakes_are_refused_before_the_gpu_sees_them():
    x = torch.randn(1024, device="cuda")

    @kernel(in_specs=(Tile("N", f32),), out_specs=(Tile("N", f32),), grid=lambda N: (1, N * 100, 1))
    def tall(X, Y):
        ptx.ret()

    with pytest.raises(PyptxError, match="y and z <= 65535"):
        tall(x)
    from pyptx import smem

    @kernel(in_specs=(Tile("N", f32),), out_specs=(Tile("N", f32),))
    def no_window(X, Y):
        smem.dynamic()
        ptx.ret()

    with pytest.raises(PyptxError, match="smem=0"):
        no_window(x)
