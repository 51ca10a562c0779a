"""GPU tests of the row-wise memory-bound examples (RMSNorm, LayerNorm, softmax, SwiGLU).

Each check draws fresh random inputs, runs with poisoned outputs (NaN) so an
element the kernel never writes fails, and compares with a float64 reference
by ``||out - ref|| / ||ref||``: below 1e-5 for f32 storage, 1e-2 for bf16
(the output is rounded to bf16; the reference takes the same bf16 inputs).
Backward kernels are compared with torch autograd in float64: 1e-5 (f32),
2e-2 (bf16).

    pytest -m gpu packages/pyptx-torch/tests/test_rowwise_gpu.py
"""

from __future__ import annotations

import pytest
from pyptx_kernels._modules import kernel_module
from pyptx_kernels.rows import RowConfig

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    # conftest.py: NaN outputs; the C++ fast path then leaves every call to the poisoning path
    pytest.mark.usefixtures("poison_outputs"),
]

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
TOL = {"f32": 1e-5, "bf16": 1e-2}
BWD_TOL = {"f32": 1e-5, "bf16": 2e-2}
# ragged and regular N, rows that do and do not fill the last CTA, the benchmark shapes
SIZES = [(1, 1), (3, 7), (5, 33), (7, 1000), (3, 4097), (16, 8192), (256, 4096), (2, 32768),
         (1024, 8192)]
BWD_SIZES = [(3, 7), (5, 33), (7, 1000), (3, 4097), (300, 64), (64, 8192), (1024, 4096)]


@pytest.fixture(autouse=True)
def first_config(monkeypatch):
    """The default calls take the builders' first config (the planner's one-row kernel): these
    tests check numerics, every variant by name; test_autotune_gpu.py checks the tuning."""
    monkeypatch.setenv("PYPTX_AUTOTUNE", "0")


_mods: dict[str, object] = {}


def load(name: str):
    mod = _mods.get(name)
    if mod is None:
        mod = _mods[name] = kernel_module(name)
    return mod


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite output: an element was not written"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def rand(*shape, dt, scale=1.0, shift=0.0):
    return (torch.randn(*shape, device="cuda") * scale + shift).to(DTYPES[dt])


# ----------------------------------------------------------------------------- forward
# TMA ring: rows of 16-byte multiples; more CTAs than rows, rows wrapping the ring many
# times, and the benchmark shape at two CTAs per SM
RING_CASES = [(B, N, ctas, stages, dt)
              for B, N, ctas, stages in [(3, 1000, 264, 2), (7, 1000, 2, 3), (600, 1000, 5, 2),
                                         (257, 96, 8, 4), (2048, 8192, 264, 4), (2048, 8192, 264, 3)]
              for dt in DTYPES
              if 2 * stages * N * (4 if dt == "f32" else 2) <= 200 * 1024]  # two CTAs per SM


@pytest.mark.parametrize("bulk_store", [False, True])
@pytest.mark.parametrize("B,N,ctas,stages,dt", RING_CASES)
def test_ring_rms_norm_then_layer_norm(B, N, ctas, stages, dt, bulk_store):
    ring = RowConfig(ctas=ctas, stages=stages, bulk_store=bulk_store)
    x, w = rand(B, N, dt=dt, scale=2, shift=0.3), rand(N, dt=dt, scale=0.1, shift=1.0)
    b = rand(N, dt=dt, scale=0.1)
    y = load("rms_norm").build_rms_norm_fast(B, N, dt, config=ring)(x, w)
    z = load("layer_norm").build_layer_norm(B, N, dt, config=ring)(y, w, b)  # PDL: reads y
    x64, w64 = x.double(), w.double()
    ref = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + 1e-6) * w64
    assert rel_err(y, ref) < TOL[dt]
    ref = torch.nn.functional.layer_norm(y.double(), (N,), w64, b.double(), 1e-5)
    assert rel_err(z, ref) < TOL[dt]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,N", SIZES)
def test_rms_norm(B, N, dt):
    k = load("rms_norm").build_rms_norm_fast(B, N, dt)
    x, w = rand(B, N, dt=dt, scale=2, shift=0.3), rand(N, dt=dt, scale=0.1, shift=1.0)
    y = k(x, w)
    assert y.shape == (B, N) and y.dtype == DTYPES[dt]
    x64, w64 = x.double(), w.double()
    ref = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + 1e-6) * w64
    assert rel_err(y, ref) < TOL[dt]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,N,kw", [(256, 4096, {}), (256, 4096, dict(chunks=1, pdl=False)),
                                    (2048, 8192, dict(chunks=8)), (130, 24, {}), (9, 256, {}),
                                    (256, 4096, dict(ctas=264, pdl=False)),
                                    (1000, 8192, dict(ctas=7, pdl=False))])
def test_layer_norm_welford(B, N, kw, dt):
    """The one-pass variants (one all-reduce of (mean, m2) pairs) of the tuned list,
    one-row and persistent."""
    k = load("layer_norm").build_layer_norm(B, N, dt, config=RowConfig(welford=True, **kw))
    x = rand(B, N, dt=dt, scale=2, shift=40.0)
    w, b = rand(N, dt=dt, scale=0.1, shift=1.0), rand(N, dt=dt, scale=0.1)
    y = k(x, w, b)
    ref = torch.nn.functional.layer_norm(x.double(), (N,), w.double(), b.double(), 1e-5)
    assert rel_err(y, ref) < (2e-5 if dt == "f32" else TOL[dt])


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,N", SIZES)
def test_layer_norm(B, N, dt):
    k = load("layer_norm").build_layer_norm(B, N, dt)
    x = rand(B, N, dt=dt, scale=2, shift=0.5)
    w, b = rand(N, dt=dt, scale=0.1, shift=1.0), rand(N, dt=dt, scale=0.1)
    y = k(x, w, b)
    ref = torch.nn.functional.layer_norm(x.double(), (N,), w.double(), b.double(), 1e-5)
    assert rel_err(y, ref) < TOL[dt]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,N", SIZES)
def test_softmax(B, N, dt):
    k = load("softmax").build_softmax_fast(B, N, dt)
    x = rand(B, N, dt=dt, scale=3)
    y = k(x)
    assert rel_err(y, torch.softmax(x.double(), -1)) < TOL[dt]


def test_softmax_large_and_negative_values():
    k = load("softmax").build_softmax_fast(4, 1000, "f32")
    x = torch.randn(4, 1000, device="cuda") * 50 - 1000
    assert rel_err(k(x), torch.softmax(x.double(), -1)) < 1e-5


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,N", SIZES)
def test_swiglu(B, N, dt):
    k = load("swiglu").build_swiglu(B, N, dt)
    g, u = rand(B, N, dt=dt, scale=3), rand(B, N, dt=dt)
    y = k(g, u)
    g64 = g.double()
    assert rel_err(y, torch.nn.functional.silu(g64) * u.double()) < TOL[dt]


@pytest.mark.parametrize("bulk_store", [False, True])
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,N,threads", [(3, 1000, 256), (8192, 8192, 512), (7, 4104, 128)])
def test_swiglu_bulk(B, N, threads, dt, bulk_store):
    """Slices by bulk copy (and Y by bulk store): ragged last CTA, benchmark size."""
    k = load("swiglu").build_swiglu(B, N, dt, config=RowConfig(bulk=True, bulk_store=bulk_store,
                                                              threads=threads))
    g, u = rand(B, N, dt=dt, scale=3), rand(B, N, dt=dt)
    y = k(g, u)
    assert rel_err(y, torch.nn.functional.silu(g.double()) * u.double()) < TOL[dt]


@pytest.mark.parametrize("dt", DTYPES)
def test_l2_eviction_policies(dt):
    """Streamed loads evict_first, stores evict_last: same results."""
    x, w, u = rand(33, 4096, dt=dt), rand(4096, dt=dt, shift=1.0), rand(33, 4096, dt=dt)
    hints = RowConfig(l2_load="evict_first", l2_store="evict_last")
    k = load("rms_norm").build_rms_norm_fast(33, 4096, dt, config=hints)
    s = load("swiglu").build_swiglu(33, 4096, dt, config=hints)
    assert "cache_hint" in k.ptx() and "cache_hint" in s.ptx()
    y, z = k(x, w), s(x, u)
    x64 = x.double()
    ref = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert rel_err(y, ref) < TOL[dt]
    assert rel_err(z, torch.nn.functional.silu(x64) * u.double()) < TOL[dt]


@pytest.mark.parametrize("chunks", [1, 2, 8])
def test_other_launch_shapes(chunks):
    """The plans the benchmark may pick beside the default."""
    B, N = 33, 8192
    x, w = rand(B, N, dt="f32"), rand(N, dt="f32", shift=1.0)
    y = load("rms_norm").build_rms_norm_fast(B, N, "f32", config=RowConfig(chunks=chunks))(x, w)
    x64 = x.double()
    ref = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert rel_err(y, ref) < 1e-5
    y = load("softmax").build_softmax_fast(B, N, "bf16", config=RowConfig(chunks=chunks))(
        x.bfloat16())
    assert rel_err(y, torch.softmax(x.bfloat16().double(), -1)) < 1e-2


def test_same_kernel_twice_gives_identical_bits():
    k = load("layer_norm").build_layer_norm(64, 4096, "f32")
    x, w, b = rand(64, 4096, dt="f32"), rand(4096, dt="f32"), rand(4096, dt="f32")
    assert torch.equal(k(x, w, b), k(x, w, b))


# ----------------------------------------------------------------------------- backward
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,N", BWD_SIZES)
def test_rms_norm_backward(B, N, dt):
    op = load("rms_norm").rms_norm_op(B, N, dt)
    x = rand(B, N, dt=dt, scale=2, shift=0.3).requires_grad_()
    w = rand(N, dt=dt, scale=0.1, shift=1.0).requires_grad_()
    dy = rand(B, N, dt=dt)
    op(x, w).backward(dy)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    torch.nn.functional.rms_norm(x64, (N,), w64, 1e-6).backward(dy.double())
    assert x.grad.dtype == DTYPES[dt] and w.grad.dtype == DTYPES[dt]
    assert rel_err(x.grad, x64.grad) < BWD_TOL[dt]
    assert rel_err(w.grad, w64.grad) < BWD_TOL[dt]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("B,N", BWD_SIZES)
def test_layer_norm_backward(B, N, dt):
    op = load("layer_norm").layer_norm_op(B, N, dt)
    x = rand(B, N, dt=dt, scale=2, shift=0.5).requires_grad_()
    w = rand(N, dt=dt, scale=0.1, shift=1.0).requires_grad_()
    b = rand(N, dt=dt, scale=0.1).requires_grad_()
    dy = rand(B, N, dt=dt)
    op(x, w, b).backward(dy)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    torch.nn.functional.layer_norm(x64, (N,), w64, b64, 1e-5).backward(dy.double())
    for got, want in ((x.grad, x64.grad), (w.grad, w64.grad), (b.grad, b64.grad)):
        assert got.dtype == DTYPES[dt]
        assert rel_err(got, want) < BWD_TOL[dt]


@pytest.mark.parametrize("ctas", [1, 3, 1000])
def test_backward_any_number_of_persistent_ctas(ctas):
    B, N = 50, 1000
    bwd = load("rms_norm").build_rms_norm_bwd(B, N, "f32", config=RowConfig(ctas=ctas))
    x, w, dy = rand(B, N, dt="f32"), rand(N, dt="f32", shift=1.0), rand(B, N, dt="f32")
    dx, dw = bwd(x, w, dy)
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    torch.nn.functional.rms_norm(x64, (N,), w64, 1e-6).backward(dy.double())
    assert rel_err(dx, x64.grad) < 1e-5 and rel_err(dw, w64.grad) < 1e-5


# ----------------------------------------------------------------------------- runtime rows
#: every plan of the norms at one N, at row counts below, at and past the grid of the
#: persistent and ring plans (264 CTAs), and ragged against rows per CTA
RUNTIME_PLANS = [{}, dict(chunks=8), dict(ctas=264, pdl=False), dict(ctas=264, stages=3),
                 dict(ctas=264, stages=4, bulk_store=True)]
RUNTIME_ROWS = (1, 7, 263, 265, 1000, 1001, 4099)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("kw", RUNTIME_PLANS, ids=lambda kw: RowConfig(**kw).describe())
def test_one_cubin_serves_every_row_count(kw, dt):
    """The kernels of one plan at different row counts share their PTX and cubin (the row count
    and grid are launch arguments) and each launch is right."""
    N = 2048
    w, b = rand(N, dt=dt, scale=0.1, shift=1.0), rand(N, dt=dt, scale=0.1)
    for module, builder in (("rms_norm", "build_rms_norm_fast"), ("layer_norm", "build_layer_norm")):
        cubins = set()
        for B in RUNTIME_ROWS:
            k = getattr(load(module), builder)(B, N, dt, config=RowConfig(**kw))
            x = rand(B, N, dt=dt, scale=2, shift=0.3)
            x64, w64 = x.double(), w.double()
            if module == "rms_norm":
                y = k(x, w)
                ref = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + 1e-6) * w64
            else:
                y = k(x, w, b)
                ref = torch.nn.functional.layer_norm(x64, (N,), w64, b.double(), 1e-5)
            assert rel_err(y, ref) < TOL[dt], (module, B, kw)
            rec = k.specialize().record
            cubins.add((rec.ptx_source, rec.cubin_bytes))
        assert len(cubins) == 1, (module, kw)


@pytest.mark.parametrize("dt", DTYPES)
def test_softmax_swiglu_and_backward_at_many_row_counts(dt):
    N = 1024
    w = rand(N, dt=dt, scale=0.1, shift=1.0)
    for B in (1, 5, 1000, 1001, 5000):
        x, u = rand(B, N, dt=dt, scale=2), rand(B, N, dt=dt)
        y = load("softmax").build_softmax_fast(B, N, dt, config=RowConfig(chunks=8))(x)
        assert rel_err(y, torch.softmax(x.double(), -1)) < TOL[dt]
        for c in (RowConfig(threads=128), RowConfig(bulk=True, threads=512)):
            y = load("swiglu").build_swiglu(B, N, dt, config=c)(x, u)
            assert rel_err(y, torch.nn.functional.silu(x.double()) * u.double()) < TOL[dt]
        dy = rand(B, N, dt=dt)
        dx, dw = load("rms_norm").build_rms_norm_bwd(B, N, dt)(x, w, dy)
        x64 = x.double().requires_grad_()
        w64 = w.double().requires_grad_()
        ref = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + 1e-6) * w64
        ref.backward(dy.double())
        assert rel_err(dx, x64.grad) < BWD_TOL[dt] and rel_err(dw, w64.grad) < BWD_TOL[dt], B


def test_a_default_call_on_a_new_shape_times_nothing(monkeypatch, tmp_path):
    """Without PYPTX_AUTOTUNE a default call settles on the table's or the heuristic's plan
    (nothing timed, nothing saved); PYPTX_AUTOTUNE=1 times the table for the exact shape."""
    import pyptx_kernels as pk

    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PYPTX_AUTOTUNE", raising=False)
    B, N = 1537, 4096
    x, w = rand(B, N, dt="bf16", scale=2), rand(N, dt="bf16", scale=0.1, shift=1.0)
    k = load("rms_norm").build_rms_norm_fast(B, N, "bf16", 1e-6)
    y = k(x, w)
    assert k.choice.source in ("default", "first") and k.choice.us is None
    assert not list((tmp_path / "autotune").glob("*.json"))
    x64, w64 = x.double(), w.double()
    ref = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + 1e-6) * w64
    assert rel_err(y, ref) < TOL["bf16"]
    assert rel_err(pk.rms_norm(x, w), ref) < TOL["bf16"]
    monkeypatch.setenv("PYPTX_AUTOTUNE", "1")
    k2 = load("rms_norm").build_rms_norm_fast(B + 1, N, "bf16", 1e-6)
    k2(rand(B + 1, N, dt="bf16"), w)
    assert k2.choice.source == "timed" and k2.choice.us > 0


def test_device_arch_of_this_gpu():
    from pyptx_kernels.rows.config import device_arch

    major = torch.cuda.get_device_capability()[0]
    want = {8: "sm_80", 9: "sm_90a", 10: "sm_100a"}.get(major, "sm_90a")
    assert device_arch(torch.zeros(1, device="cuda")) == want
