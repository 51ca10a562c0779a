"""The PyTorch runtime up to the point a GPU is needed: argument checks, the custom op
under fake tensors, torch.compile tracing, autograd wiring, the public facade."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import pyptx  # noqa: E402
from pyptx import Tile, kernel, ptx, reg  # noqa: E402
from pyptx.errors import ShapeError, SpecError  # noqa: E402
from pyptx.types import f32, u32  # noqa: E402


def build_scale(B, N):
    @kernel(in_specs=(Tile(B, N, f32),), out_specs=(Tile(B, N, f32),), grid=(B, 1, 1),
            block=(32, 1, 1))
    def scale(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        tid = reg.from_(ptx.special.tid.x(), u32)
        off = tid * 4
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(px + off))
        ptx.inst.st.global_.f32(ptx.addr(py + off), v * 2.0)
        ptx.ret()

    return scale


@kernel(in_specs=(Tile("M", "K", f32), Tile("K", "N", f32)),
        out_specs=(Tile("M", "N", f32), Tile("N", f32)), grid=(1, 1, 1), block=(32, 1, 1))
def matmul_like(A, B, C, D):
    ptx.ret()


def test_cpu_tensor_is_refused_with_the_argument_named():
    k = build_scale(4, 32)
    with pytest.raises(SpecError, match=r"argument 'X' is on cpu.*CUDA tensors"):
        k(torch.randn(4, 32))


def test_meta_tensor_is_refused():
    k = build_scale(4, 32)
    with pytest.raises(SpecError, match="is on meta"):
        k(torch.empty(4, 32, device="meta"))


def test_wrong_arity():
    with pytest.raises(SpecError, match=r"takes 2 input tensors \(A, B\), got 1"):
        matmul_like(torch.empty(2, 3, device="meta"))


def test_wrong_dtype_names_argument_and_types():
    k = build_scale(4, 32)
    with FakeTensorMode():
        x = torch.empty(4, 32, device="cuda", dtype=torch.float16)
        with pytest.raises(SpecError, match=r"argument 'X': expected dtype f32 for Tile\(4, 32, f32\), got float16$"):
            k(x)


def test_non_contiguous_is_refused():
    k = build_scale(4, 32)
    with FakeTensorMode():
        x = torch.empty(32, 4, device="cuda").t()
        with pytest.raises(SpecError, match="not contiguous"):
            k(x)


def test_shape_against_spec_and_conflicting_dims():
    with FakeTensorMode():
        k = build_scale(4, 32)
        with pytest.raises(ShapeError, match=r"argument 'X' dim 1: expected 32"):
            k(torch.empty(4, 64, device="cuda"))
        with pytest.raises(ShapeError, match=r"argument 'X': expected rank 2"):
            k(torch.empty(128, device="cuda"))
        a = torch.empty(8, 16, device="cuda")
        b = torch.empty(17, 4, device="cuda")
        with pytest.raises(ShapeError, match=r"argument 'B' dim 0 \('K'\): expected 16"):
            matmul_like(a, b)


def test_custom_op_fake_shape_inference():
    from pyptx_torch.compiled import _fake_outputs

    with FakeTensorMode():
        a = torch.empty(8, 16, device="cuda")
        b = torch.empty(16, 5, device="cuda")
        c, d = _fake_outputs(matmul_like, {}, [a, b])
    assert tuple(c.shape) == (8, 5) and tuple(d.shape) == (5,)
    assert c.dtype == torch.float32 and c.device.type == "cuda"


def test_torch_compile_traces_one_custom_op_fullgraph():
    k = build_scale(16, 32)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x):
        return k(x) + 1.0

    mode = FakeTensorMode()
    with mode:
        x = torch.empty(16, 32, device="cuda")
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    with mode:
        out = compiled(x)
    assert tuple(out.shape) == (16, 32)
    code = graphs[0].code
    # one output, one tensor: the fixed-arity op, not the Tensor[] one
    assert code.count("torch.ops.pyptx.launch1") == 1 and "pyptx.launch(" not in code
    assert "add" in code


def test_torch_compile_records_multi_output_kernels_with_the_list_op():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    mode = FakeTensorMode()
    with mode:
        a = torch.empty(8, 16, device="cuda")
        b = torch.empty(16, 5, device="cuda")
    compiled = torch.compile(lambda a, b: matmul_like(a, b), backend=backend, fullgraph=True)
    with mode:
        c, d = compiled(a, b)
    assert tuple(c.shape) == (8, 5) and tuple(d.shape) == (5,)
    code = graphs[0].code
    assert "torch.ops.pyptx.launch.default" in code or "torch.ops.pyptx.launch(" in code
    assert "launch1" not in code and "launch2" not in code


def test_fixed_arity_ops_split_the_variant_string():
    from pyptx_torch.compiled import MAX_FIXED, _split

    assert _split("scale#3") == ("scale#3", "")
    assert _split("scale#3|(('BLOCK', 64),)") == ("scale#3", "(('BLOCK', 64),)")
    for n in range(1, MAX_FIXED + 1):
        schema = str(getattr(torch.ops.pyptx, f"launch{n}").default._schema)
        assert schema.count("Tensor t") == n and schema.endswith("-> Tensor")


def test_handle_op_is_registered_once_with_fake_impl():
    from pyptx.errors import LaunchError
    from pyptx.registry import get_cubin_registry
    from pyptx_torch import get_or_register_torch_op

    h = get_cubin_registry().register("// ptx", "k", grid=(1, 1, 1), block=(32, 1, 1))
    out = (Tile("B", 4, f32),)
    op = get_or_register_torch_op(h, out, {"B": 3}, (1, 1, 1), (32, 1, 1), (1, 1, 1), 0)
    assert get_or_register_torch_op(h, out, {"B": 3}, (1, 1, 1), (32, 1, 1), (1, 1, 1), 0) is op
    assert hasattr(torch.ops.pyptx, f"handle_{h}")
    with FakeTensorMode():
        y = op(torch.empty(3, device="cuda"))
    assert tuple(y.shape) == (3, 4)
    # the geometry and outputs given are honoured: a mismatch is an error, not ignored
    with pytest.raises(LaunchError, match=r"registered with block=\(32, 1, 1\), got block=\(1, 1, 1\)"):
        get_or_register_torch_op(h, out, {"B": 3}, (1, 1, 1), (1, 1, 1), (1, 1, 1), 0)
    with pytest.raises(LaunchError, match=r"registered with smem_bytes=0, got smem_bytes=64"):
        get_or_register_torch_op(h, out, {"B": 3}, (1, 1, 1), (32, 1, 1), (1, 1, 1), 64)
    with pytest.raises(LaunchError, match=r"returns \(3, 4\) torch.float32, got out_specs for "
                                          r"\(5, 4\)"):
        get_or_register_torch_op(h, out, {"B": 5}, (1, 1, 1), (32, 1, 1), (1, 1, 1), 0)
    with pytest.raises(LaunchError, match="no registered kernel has handle 987001"):
        get_or_register_torch_op(987001, out, {"B": 3}, (1, 1, 1), (32, 1, 1), (1, 1, 1), 0)


def test_differentiable_kernel_validates_pairing():
    fwd = build_scale(4, 32)
    with pytest.raises(SpecError, match="save_for_backward index 3"):
        pyptx.differentiable_kernel(fwd, fwd, save_for_backward=[3])
    with pytest.raises(SpecError, match="takes 1 inputs, but backward passes 1 saved"):
        pyptx.differentiable_kernel(fwd, fwd)


def test_facade_resolves_to_the_plugin():
    import pyptx.torch_support as ts
    import pyptx_torch

    for name in pyptx_torch.__all__:
        assert getattr(ts, name) is getattr(pyptx_torch, name)
    assert pyptx.differentiable_kernel is pyptx_torch.differentiable_kernel


def test_launch_state_keeps_bounded_mru_fast_launchers_and_lru_plans(monkeypatch):
    import pyptx_torch.eager as eager

    monkeypatch.setattr(eager, "FAST_SLOTS", 3)
    monkeypatch.setattr(eager, "PLAN_SLOTS", 4)
    state = eager.LaunchState()
    fasts = [object() for _ in range(5)]
    for i, f in enumerate(fasts):
        state.remember(("sig", i), (None, f))
        state.use_fast(f)
    assert state.fast == [fasts[4], fasts[3], fasts[2]]  # most recent first, three kept
    state.use_fast(fasts[2])
    assert state.fast == [fasts[2], fasts[4], fasts[3]]
    assert list(state.plans) == [("sig", i) for i in range(1, 5)]  # the oldest plan dropped
    state.remember(("sig", 5), (None, object()))  # drops ("sig", 1) ...
    state.remember(("sig", 6), (None, object()))  # ... and ("sig", 2), whose launcher goes too
    assert fasts[2] not in state.fast and state.fast == [fasts[4], fasts[3]]


def test_differentiable_kernel_traces_fullgraph_under_torch_compile():
    """The autograd glue exists before the first call, so torch.compile traces op(a, b) into
    one graph (an autograd_function_apply around the pyptx op)."""
    @kernel(in_specs=(Tile("N", f32), Tile("N", f32)), out_specs=(Tile("N", f32),),
            block=(32, 1, 1))
    def mul(A, B, Y):
        ptx.ret()

    @kernel(in_specs=(Tile("N", f32),) * 3, out_specs=(Tile("N", f32),) * 2, block=(32, 1, 1))
    def mul_bwd(A, B, DY, DA, DB):
        ptx.ret()

    op = pyptx.differentiable_kernel(mul, mul_bwd, save_for_backward=[0, 1])
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    a = torch.empty(16, device="meta", requires_grad=True)
    b = torch.empty(16, device="meta")
    y = torch.compile(lambda a, b: op(a, b) * 2, backend=backend, fullgraph=True)(a, b)
    assert tuple(y.shape) == (16,) and y.requires_grad
    (gm,) = graphs
    assert "autograd_function_apply" in gm.code
    assert not mul._launchers and not mul._runtime_launchers  # no state made while tracing


def test_op_naming_a_dead_kernel_says_why():
    from pyptx.errors import LaunchError
    from pyptx_torch.compiled import _launch_fake

    with pytest.raises(LaunchError, match=r"no live pyptx kernel is called 'gone#0'.*non-strict"):
        _launch_fake([torch.empty(4, device="meta")], "gone#0", "")


class _CpuKernelLike:
    """A kernel-like stand-in (the attributes ``differentiable_kernel`` checks) computing
    on CPU tensors, so the autograd glue runs without a GPU."""

    def __init__(self, name, n_in, n_out, fn):
        self.name, self.fn = name, fn
        self.in_specs = (Tile("N", f32),) * n_in
        self.out_specs = (Tile("N", f32),) * n_out
        self.arg_names = tuple(f"t{i}" for i in range(n_in + n_out))

    def __call__(self, *args):
        return self.fn(*args)


def test_save_outputs_pass_forward_outputs_to_the_backward_kernel():
    """y, z = exp(a), 0 with backward (a, y, dy, dz) -> dy * y: the saved output y (index 0)
    reaches the backward kernel after the saved input and before the gradients."""
    seen = []

    def bwd(a, y, dy, dz):
        seen.append((a, y, dy, dz))
        return dy * y + dz

    fwd = _CpuKernelLike("expo", 1, 2, lambda a: (torch.exp(a), torch.zeros_like(a)))
    op = pyptx.differentiable_kernel(fwd, _CpuKernelLike("expo_bwd", 4, 1, bwd),
                                     save_for_backward=[0], save_outputs=[0])
    assert op.saved_outputs == (0,) and "saved_outputs=[0]" in repr(op)
    a = torch.linspace(-1, 1, 8, requires_grad=True)
    y, _ = op(a)
    (y * 3).sum().backward()
    torch.testing.assert_close(a.grad, 3 * torch.exp(a.detach()))
    (sa, sy, dy, dz) = seen[0]
    torch.testing.assert_close(sa, a.detach())
    torch.testing.assert_close(sy, torch.exp(a.detach()))
    torch.testing.assert_close(dz, torch.zeros(8))


def test_save_outputs_is_checked_at_construction():
    fwd = _CpuKernelLike("expo", 1, 2, None)
    bwd = _CpuKernelLike("expo_bwd", 4, 1, None)
    with pytest.raises(SpecError, match="save_outputs index 2 is not an output index of expo"):
        pyptx.differentiable_kernel(fwd, bwd, save_outputs=[2])
    with pytest.raises(SpecError, match="save_outputs must be a sequence"):
        pyptx.differentiable_kernel(fwd, bwd, save_outputs=1)
    with pytest.raises(SpecError, match=r"1 saved tensors \+ 2 saved outputs \+ 2 output grad"):
        pyptx.differentiable_kernel(fwd, bwd, save_outputs=[0, 1])
    pyptx.differentiable_kernel(fwd, bwd, save_outputs=[1])
