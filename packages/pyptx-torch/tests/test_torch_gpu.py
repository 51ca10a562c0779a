"""GPU tests of the PyTorch runtime (``pytest -m gpu`` on a machine with an NVIDIA GPU).

Every numeric check draws fresh random inputs, compares with a float64
reference, and runs with poisoned outputs (NaN / all-ones bits) so an element
the kernel never writes fails the comparison.
"""

from __future__ import annotations

import importlib
import sys

import pytest

torch = pytest.importorskip("torch")

import pyptx  # noqa: E402
from pyptx import Tile, kernel, ptx, reg  # noqa: E402
from pyptx.errors import ConfigError, LaunchError, SpecError  # noqa: E402
from pyptx.testing import build_row_scale  # noqa: E402
from pyptx.types import f32, u32  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    # conftest.py: NaN outputs; the C++ fast path then leaves every call to the poisoning path
    pytest.mark.usefixtures("poison_outputs"),
]

def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    assert not torch.isnan(out).any(), "NaN in output: an element was not written"
    return ((out - ref).norm() / ref.norm()).item()


def scale_ref(x, w):
    return x.double() * w.double()


def build_mul(B, N):
    """y = a * b elementwise, one warp per row, N a multiple of 32."""
    @kernel(in_specs=(Tile(B, N, f32), Tile(B, N, f32)), out_specs=(Tile(B, N, f32),),
            grid=(B, 1, 1), block=(32, 1, 1))
    def mul(A, Bt, Y):
        pa, pb, py = ptx.global_ptrs(A, Bt, Y)
        row = reg.from_(ptx.special.ctaid.x(), u32) * (N * 4)
        tid = reg.from_(ptx.special.tid.x(), u32)
        for i in range(N // 32):
            off = row + (tid + i * 32) * 4
            a, b = reg.scalar(f32), reg.scalar(f32)
            ptx.inst.ld.global_.f32(a, ptx.addr(pa + off))
            ptx.inst.ld.global_.f32(b, ptx.addr(pb + off))
            ptx.inst.st.global_.f32(ptx.addr(py + off), a * b)
        ptx.ret()

    return mul


def build_mul_bwd(B, N):
    """(a, b, dy) -> (dy*b, dy*a)."""
    @kernel(in_specs=(Tile(B, N, f32),) * 3, out_specs=(Tile(B, N, f32),) * 2,
            grid=(B, 1, 1), block=(32, 1, 1))
    def mul_bwd(A, Bt, DY, DA, DB):
        pa, pb, pdy, pda, pdb = ptx.global_ptrs(A, Bt, DY, DA, DB)
        row = reg.from_(ptx.special.ctaid.x(), u32) * (N * 4)
        tid = reg.from_(ptx.special.tid.x(), u32)
        for i in range(N // 32):
            off = row + (tid + i * 32) * 4
            a, b, dy = reg.scalar(f32), reg.scalar(f32), reg.scalar(f32)
            ptx.inst.ld.global_.f32(a, ptx.addr(pa + off))
            ptx.inst.ld.global_.f32(b, ptx.addr(pb + off))
            ptx.inst.ld.global_.f32(dy, ptx.addr(pdy + off))
            ptx.inst.st.global_.f32(ptx.addr(pda + off), dy * b)
            ptx.inst.st.global_.f32(ptx.addr(pdb + off), dy * a)
        ptx.ret()

    return mul_bwd


# ---------------------------------------------------------------- numerics, eager
def test_softmax():
    mod = importlib.import_module("pyptx_kernels.rows.softmax")
    B, N = 64, 1024
    k = mod.build_softmax(B, N)
    x = torch.randn(B, N, device="cuda") * 3
    assert rel_err(k(x), torch.softmax(x.double(), -1)) < 1e-5


def test_shape_change_and_repeat_calls_reuse_plan():
    k = build_row_scale(8, 256)
    for _ in range(3):
        x = torch.randn(8, 256, device="cuda")
        w = torch.randn(256, device="cuda")
        assert rel_err(k(x, w), scale_ref(x, w)) < 1e-5
    assert len(k.launcher("torch").state.plans) == 1  # one plan


def test_symbolic_dims_new_shape_new_specialization():
    @kernel(in_specs=(Tile("N", f32),), out_specs=(Tile("N", f32),),
            grid=lambda N: ((N + 127) // 128, 1, 1), block=(128, 1, 1))
    def neg(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        i = reg.from_(ptx.special.ctaid.x(), u32) * 128 + reg.from_(ptx.special.tid.x(), u32)
        n = ptx.scalar_param(u32, 0, "n")
        del n
        with ptx.if_(i < X.shape[0]):
            v = reg.scalar(f32)
            ptx.inst.ld.global_.f32(v, ptx.addr(px + i * 4))
            ptx.inst.st.global_.f32(ptx.addr(py + i * 4), -v)
        ptx.ret()

    for n in (1000, 4097, 31):
        x = torch.randn(n, device="cuda")
        assert torch.equal(neg(x), -x)
    assert len(neg.launcher("torch").state.plans) == 3  # one per shape


# ---------------------------------------------------------------- streams, graphs, devices
def test_side_stream():
    k = build_row_scale(32, 1024)
    x = torch.randn(32, 1024, device="cuda")
    w = torch.randn(1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = k(x, w)
    torch.cuda.current_stream().wait_stream(s)
    assert rel_err(out, scale_ref(x, w)) < 1e-5


def test_cuda_graph_capture_and_replay_sees_new_inputs():
    k = build_row_scale(256, 4096)
    x = torch.randn(256, 4096, device="cuda")
    w = torch.randn(4096, device="cuda")
    k(x, w)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        k(x, w)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g, stream=s):
        out = k(x, w)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        w.copy_(torch.randn_like(w))
        g.replay()
        torch.cuda.synchronize()
        assert rel_err(out, scale_ref(x, w)) < 1e-5


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device_and_mixed_devices():
    k = build_row_scale(16, 512)
    x = torch.randn(16, 512, device="cuda:1")
    w = torch.randn(512, device="cuda:1")
    out = k(x, w)
    assert out.device == x.device
    assert rel_err(out, scale_ref(x, w)) < 1e-5
    with pytest.raises(SpecError, match="all tensors must share one device"):
        k(x, w.to("cuda:0"))


# ---------------------------------------------------------------- torch.compile
def test_torch_compile_kernel_directly():
    k = build_row_scale(256, 4096)
    kc = torch.compile(k)
    x = torch.randn(256, 4096, device="cuda")
    w = torch.randn(4096, device="cuda")
    assert rel_err(kc(x, w), scale_ref(x, w)) < 1e-5


def test_torch_compile_fullgraph_with_other_ops():
    k = build_row_scale(64, 1024)

    @torch.compile(fullgraph=True)
    def f(x, w):
        return torch.relu(k(x * 2.0, w)) + 1.0

    x = torch.randn(64, 1024, device="cuda")
    w = torch.randn(1024, device="cuda")
    ref = torch.relu(scale_ref(x * 2.0, w)) + 1.0
    assert rel_err(f(x, w), ref) < 1e-5


# ---------------------------------------------------------------- autograd
def test_differentiable_kernel_gradients_match_torch():
    B, N = 8, 256
    op = pyptx.differentiable_kernel(build_mul(B, N), build_mul_bwd(B, N),
                                     save_for_backward=[0, 1])
    a = torch.randn(B, N, device="cuda", requires_grad=True)
    b = torch.randn(B, N, device="cuda", requires_grad=True)
    g = torch.randn(B, N, device="cuda")
    (op(a, b) * g).sum().backward()
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    (a64 * b64 * g.double()).sum().backward()
    assert rel_err(a.grad, a64.grad) < 1e-6
    assert rel_err(b.grad, b64.grad) < 1e-6


# ---------------------------------------------------------------- errors on a GPU
def test_arch_the_gpu_cannot_run():
    @kernel(in_specs=(Tile(32, f32),), out_specs=(Tile(32, f32),), block=(32, 1, 1),
            arch="sm_100a")
    def future(X, Y):
        ptx.ret()

    with pytest.raises(LaunchError, match=r"targets sm_100a, but cuda:\d is sm_\d+"):
        future(torch.randn(32, device="cuda"))


def test_too_much_shared_memory():
    @kernel(in_specs=(Tile(32, f32),), out_specs=(Tile(32, f32),), block=(32, 1, 1),
            smem=227 * 1024)
    def greedy(X, Y):
        from pyptx import smem
        smem.alloc(f32, 1024)
        ptx.ret()

    with pytest.raises((ConfigError, LaunchError), match="shared"):
        greedy(torch.randn(32, device="cuda"))


def test_large_dynamic_smem_raises_attribute_and_runs():
    from pyptx import smem

    @kernel(in_specs=(Tile(32, f32),), out_specs=(Tile(32, f32),), block=(32, 1, 1),
            smem=100 * 1024)
    def big(X, Y):
        buf = smem.dynamic()
        px, py = ptx.global_ptrs(X, Y)
        tid = reg.from_(ptx.special.tid.x(), u32)
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(px + tid * 4))
        base = buf.addr() + 90 * 1024
        ptx.inst.st.shared.f32(ptx.addr(base + tid * 4), v)
        ptx.bar_sync()
        ptx.inst.ld.shared.f32(v, ptx.addr(base + tid * 4))
        ptx.inst.st.global_.f32(ptx.addr(py + tid * 4), v)
        ptx.ret()

    x = torch.randn(32, device="cuda")
    assert torch.equal(big(x), x)


def test_static_plus_dynamic_smem_past_48k_runs():
    """A 48 KiB dynamic window beside static shared memory: the launch needs the opt-in
    although the dynamic part alone is within the default."""
    from pyptx import smem

    @kernel(in_specs=(Tile(32, f32),), out_specs=(Tile(32, f32),), block=(32, 1, 1),
            smem=48 * 1024)
    def both(X, Y):
        fixed = smem.alloc(f32, 1024, name="fixed")
        buf = smem.dynamic()
        px, py = ptx.global_ptrs(X, Y)
        tid = reg.from_(ptx.special.tid.x(), u32)
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(px + tid * 4))
        ptx.inst.st.shared.f32(ptx.addr(fixed.addr() + tid * 4), v)
        top = buf.addr() + (48 * 1024 - 128)
        ptx.inst.st.shared.f32(ptx.addr(top + tid * 4), v)
        ptx.bar_sync()
        w = reg.scalar(f32)
        ptx.inst.ld.shared.f32(v, ptx.addr(fixed.addr() + tid * 4))
        ptx.inst.ld.shared.f32(w, ptx.addr(top + tid * 4))
        ptx.inst.add.f32(v, v, w)
        ptx.inst.st.global_.f32(ptx.addr(py + tid * 4), v)
        ptx.ret()

    x = torch.randn(32, device="cuda")
    assert torch.equal(both(x), 2 * x)


# ---------------------------------------------------------------- programmatic dependent launch
def build_inc(pdl: bool):
    """Y = X + 1 over a symbolic length, launched with PDL when ``pdl``."""

    @kernel(in_specs=(Tile("N", f32),), out_specs=(Tile("N", f32),),
            grid=lambda N: ((N + 255) // 256, 1, 1), block=(256, 1, 1), pdl=pdl)
    def inc(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        i = reg.from_(ptx.special.ctaid.x(), u32) * 256 + reg.from_(ptx.special.tid.x(), u32)
        with ptx.if_(i < X.shape[0]):
            v = reg.scalar(f32)
            ptx.inst.ld.global_.f32(v, ptx.addr(px + i * 4))
            ptx.inst.st.global_.f32(ptx.addr(py + i * 4), v + 1.0)
        ptx.ret()

    return inc


def test_pdl_chains_read_what_the_previous_kernel_wrote():
    inc, plain = build_inc(True), build_inc(False)
    assert inc.pdl and "griddepcontrol.wait" in inc.ptx(N=8)
    x = torch.randn(1 << 22, device="cuda")
    y, ref = x, x
    for step in range(40):  # each launch reads the previous one's output
        y = (inc if step % 3 else plain)(y)
        ref = ref + 1.0
    assert torch.equal(y, ref)


def test_pdl_chain_in_a_cuda_graph():
    inc = build_inc(True)
    x = torch.randn(1 << 20, device="cuda")
    inc(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        y = x
        for _ in range(10):
            y = inc(y)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        ref = x
        for _ in range(10):
            ref = ref + 1.0
        assert torch.equal(y, ref)


# ---------------------------------------------------------------- identity across processes
def test_torch_export_round_trip_in_a_fresh_process(tmp_path, monkeypatch):
    """A program using the kernel, saved with torch.export, runs in a new process that never
    builds the kernel: the op names it by content hash, found in the disk cache."""
    import subprocess

    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path / "cache"))
    k = build_row_scale(16, 512)

    class Model(torch.nn.Module):
        def forward(self, x, w):
            return k(x * 0.5, w) + 1.0

    x = torch.randn(16, 512, device="cuda")
    w = torch.randn(512, device="cuda")
    ep = torch.export.export(Model(), (x, w))
    assert "sha:" in str(ep.graph) and k.uid not in str(ep.graph)
    torch.export.save(ep, str(tmp_path / "model.pt2"))
    x2, w2 = torch.randn(16, 512, device="cuda"), torch.randn(512, device="cuda")
    torch.save({"x": x2.cpu(), "w": w2.cpu(), "ref": (scale_ref(x2 * 0.5, w2) + 1.0).cpu()},
               tmp_path / "data.pt")
    code = (
        "import sys, torch\n"
        "import pyptx_torch.compiled\n"
        "ep = torch.export.load(sys.argv[1])\n"
        "d = torch.load(sys.argv[2])\n"
        "y = ep.module()(d['x'].cuda(), d['w'].cuda()).double().cpu()\n"
        "assert not torch.isnan(y).any()\n"
        "print(((y - d['ref']).norm() / d['ref'].norm()).item())\n"
    )
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "model.pt2"),
                          str(tmp_path / "data.pt")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert float(run.stdout.strip().splitlines()[-1]) < 1e-5


def test_alternating_shapes_do_not_replan(monkeypatch):
    """Two shapes in turn: after one call each, every call is taken by a fast launcher."""
    import pyptx_torch.eager as eager

    eager.set_poison(False)  # poisoned calls leave the fast launchers on purpose
    k = build_inc(False)
    xs = [torch.randn(n, device="cuda") for n in (1000, 4097)]
    for x in xs:
        assert torch.equal(k(x), x + 1.0)

    def no_replanning(*args, **kwargs):
        raise AssertionError("a repeated signature was planned again")

    monkeypatch.setattr(eager, "plan_for", no_replanning)
    for step in range(6):
        x = xs[step % 2]
        assert torch.equal(k(x), x + 1.0)
    assert len(k.launcher("torch").state.fast) == 2
