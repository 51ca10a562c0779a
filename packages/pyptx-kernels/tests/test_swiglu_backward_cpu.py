"""``build_swiglu_backward`` on the CPU: every plan of its table traces and assembles for every
target without spills, the PTX does not depend on ``B`` (one family, reused == fresh trace),
the simulator runs one PTX right at several row counts, the default call settles on a plan of
the table, and ``pyptx_kernels.swiglu``'s autograd launches it with its specs."""

from __future__ import annotations

import numpy as np
import pytest
from pyptx_kernels import _common, _family
from pyptx_kernels.rows import api as rows_api
from pyptx_kernels.rows import config as C
from pyptx_kernels.rows.config import RowConfig
from pyptx_kernels.rows.swiglu import build_swiglu_backward

from pyptx import ConfigError, PyptxError, SpecError

SHAPES = ((1, 37, "f32"), (7, 1000, "bf16"), (8192, 5632, "bf16"), (3, 4096, "f32"),
          (5, 4097, "bf16"))


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch):
    monkeypatch.setenv("PYPTX_CACHE_DIR", "off")


@pytest.fixture(scope="module")
def sim():
    import ptxsim

    return ptxsim


def _ref(dy, g, u):
    dy, g, u = (a.astype(np.float64) for a in (dy, g, u))
    s = 1 / (1 + np.exp(-g))
    return dy * u * s * (1 + g * (1 - s)), dy * g * s


def _rel(out, ref):
    assert np.isfinite(out).all()
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("arch", C.ARCHS)
def test_every_plan_assembles_for_every_arch(arch, assemble):
    for B, N, dt in SHAPES:
        for c in C.SWIGLU_BACKWARD_CONFIGS:
            k = build_swiglu_backward(B, N, dt, config=c, arch=arch)
            text = k.ptx()
            assert f".target {arch}" in text and ".entry swiglu_bwd_" + dt in text
            assert ("griddepcontrol.wait" in text) == (c.pdl and arch != "sm_80")
            log = assemble(text, arch)
            assert "0 bytes spill stores" in log, (arch, c, B, N, dt, log)


def test_ptx_does_not_depend_on_the_row_count():
    for N, dt in ((1000, "f32"), (5632, "bf16"), (37, "bf16")):
        for c in C.SWIGLU_BACKWARD_CONFIGS:
            ks = [build_swiglu_backward(B, N, dt, config=c) for B in (1, 7, 1000, 8192)]
            assert len({k.ptx() for k in ks}) == 1, (N, dt, c)
            assert len({k.specialize().grid for k in ks}) > 1


def _launch_view(spec):
    return (spec.ptx(), [(n, t.name, v) for n, t, v in spec.scalar_params], spec.grid,
            spec.block, spec.smem, spec.in_shapes, spec.out_shapes, spec.name)


@pytest.mark.parametrize("config", [RowConfig(), RowConfig(threads=128, chunks=2, pdl=False)])
def test_a_new_row_count_reuses_the_family(config):
    def spec(B):
        return build_swiglu_backward(B, 4096, "bf16", config=config).specialize()

    _family.clear()
    first = spec(3)
    for B in (300, 30000):
        before = _family.stats()["reused"]
        reused = spec(B)
        assert _family.stats()["reused"] == before + 1, B
        assert reused.module is first.module
        _family.clear()
        fresh = spec(B)
        assert _launch_view(reused) == _launch_view(fresh), B
        _family.clear()
        first = spec(3)


@pytest.mark.parametrize("kw", [{}, dict(chunks=2), dict(threads=64, pdl=False)])
def test_one_ptx_runs_at_several_row_counts_in_the_simulator(sim, kw):
    texts = set()
    for B, N in ((1, 40), (3, 40), (9, 40), (2, 37)):
        spec = build_swiglu_backward(B, N, "f32", config=RowConfig(**kw)).specialize()
        if N == 40:
            texts.add(spec.ptx())
        rng = np.random.default_rng(B + N)
        dy, u = (rng.standard_normal((B, N)).astype(np.float32) for _ in range(2))
        g = (rng.standard_normal((B, N)) * 3).astype(np.float32)
        g.flat[:3] = (-100.0, 100.0, 0.0)     # saturated sigmoid: no inf * 0
        dg, du = (o.view(np.float32) for o in sim.run(spec, [dy, g, u]))
        rg, ru = _ref(dy, g, u)
        assert _rel(dg, rg) < 1e-5 and _rel(du, ru) < 1e-5, (B, N, kw)
    assert len(texts) == 1


def test_default_call_is_tuned_over_the_table_and_plans_from_it():
    from pyptx.autotune import TunedKernel

    assert isinstance(build_swiglu_backward(8192, 5632, "bf16"), TunedKernel)
    assert build_swiglu_backward.configs == C.SWIGLU_BACKWARD_CONFIGS
    assert set(C.SWIGLU_BACKWARD_CONFIGS) <= set(C.SWIGLU_CONFIGS)
    assert all(c.plan == "row" for c in C.SWIGLU_BACKWARD_CONFIGS)
    for rows, N in ((1, 37), (7, 1000), (8192, 5632), (256, 4096)):
        for dt in ("f32", "bf16"):
            for arch in C.ARCHS:
                p = C.default_plan("swiglu_backward", rows, N, dt, arch)
                assert p == C.default_plan("swiglu", rows, N, dt, arch)
                assert p in C.SWIGLU_BACKWARD_CONFIGS, (rows, N, dt, arch, p)


def test_bad_plans_and_sizes_fail_at_the_callers_line():
    for bad, kind in ((RowConfig(bulk=True), ConfigError), (RowConfig(ctas=4), ConfigError)):
        with pytest.raises(kind) as info:
            build_swiglu_backward(4, 64, "bf16", config=bad)
        assert str(info.value).startswith(__file__), str(info.value)
    for args in ((0, 64), (4, 0), (2**16, 2**16)):
        with pytest.raises(SpecError) as info:
            build_swiglu_backward(*args, "f32", config=RowConfig())
        assert str(info.value).startswith(__file__), str(info.value)
    with pytest.raises(PyptxError):
        build_swiglu_backward(4, 64, "e4m3", config=RowConfig())


# ------------------------------------------------------------- the torch op's wiring (CPU)
torch = pytest.importorskip("torch")


def _grads64(dy, g, u):
    dy, gd, ud = dy.double(), g.double(), u.double()
    s = torch.sigmoid(gd)
    return (dy * ud * s * (1 + gd * (1 - s))).to(g.dtype), (dy * gd * s).to(u.dtype)


class _SpecChecked:
    """The real builder's kernel checks each argument against its ``in_specs``; a float64
    model computes the result."""

    def __init__(self, built, model):
        self.built, self.model = built, model

    def __call__(self, *args):
        specs = self.built.in_specs
        assert len(args) == len(specs)
        for x, spec in zip(args, specs):
            assert tuple(x.shape) == tuple(spec.dims), (x.shape, spec)
            assert _common.dtype_name(x.dtype) == spec.dtype.name
            assert x.is_contiguous()
        return self.model(*args)


@pytest.fixture
def launched(monkeypatch):
    import importlib

    built = []
    models = {"build_swiglu": lambda g, u: (torch.nn.functional.silu(g.double())
                                            * u.double()).to(g.dtype),
              "build_swiglu_backward": _grads64}

    def build(module, builder, B, N, dtype, *extra):
        real = getattr(importlib.import_module(f"pyptx_kernels.rows.{module}"), builder)
        kernel = real(B, N, dtype, *extra)
        built.append((builder, B, N, dtype))
        return _SpecChecked(getattr(kernel, "kernel", kernel), models[builder])

    monkeypatch.setattr(_common, "check_devices", lambda *a: None)
    monkeypatch.setattr(rows_api, "_build", build)
    monkeypatch.setattr(rows_api, "_swiglu_kernel_takes", lambda *a: True)
    return built


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_swiglu_autograd_launches_the_backward_kernel(launched, dtype, tol):
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(2, 37, 192, generator=gen).to(dtype).requires_grad_()
    gate, up = h.chunk(2, -1)          # views with a row stride of 192
    import pyptx_kernels as pk

    y = pk.swiglu(gate, up)
    dy = torch.randn(y.shape, generator=gen).to(dtype).expand(2, 37, 96)
    (dh,) = torch.autograd.grad(y, h, dy)
    hd = h.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(torch.nn.functional.silu(hd[..., :96]) * hd[..., 96:], hd,
                                 dy.double())
    assert dh.dtype == dtype
    assert ((dh.double() - ref).norm() / ref.norm()).item() < tol
    assert ("build_swiglu_backward", 74, 96, _common.dtype_name(dtype)) in launched


def test_backward_falls_back_to_torch_where_the_kernel_cannot_take_the_tensors():
    gen = torch.Generator().manual_seed(1)
    g, u = (torch.randn(5, 33, generator=gen) for _ in range(2))
    dy = torch.randn(5, 33, generator=gen, dtype=torch.float64)
    assert not rows_api._swiglu_kernel_takes(dy, g, u)
    assert not rows_api._swiglu_kernel_takes(g, g, u)           # CPU tensors
    dg, du = rows_api._swiglu_backward(dy, g, u)
    rg, ru = _grads64(dy, g, u)
    torch.testing.assert_close(dg, rg, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(du, ru, rtol=1e-5, atol=1e-6)


def test_ptx_lists_the_backward_where_an_input_requires_grad():
    import pyptx_kernels as pk

    g = torch.empty(2, 37, 768, dtype=torch.bfloat16, device="meta")
    assert [n.split("_bf16")[0] for n in pk.ptx(pk.swiglu, g, g)] == ["swiglu"]
    gr = g.clone().requires_grad_()
    assert [n.split("_bf16")[0] for n in pk.ptx(pk.swiglu, gr, g)] == ["swiglu", "swiglu_bwd"]
