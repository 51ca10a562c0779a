"""The row-wise memory-bound examples on the CPU: ptxas, resources, plans, and numerics in a simulator.

* every builder (RMSNorm, LayerNorm, softmax, SwiGLU forward; RMSNorm and
  LayerNorm backward) for f32 and bf16 at ragged and regular N assembles for
  sm_90a;
* at the benchmark sizes ptxas reports no spills and no stack frame, and the
  hot loads and stores are 16 bytes wide;
* launch plans and the errors naming the supported N;
* with numpy, ``ptxsim`` runs the kernels' PTX on small inputs and compares
  with float64 references (1e-6 relative for f32, 1e-2 for bf16), checking
  that every access is in bounds and aligned and every output byte is written.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from pyptx import ConfigError, SpecError
from pyptx.types import bf16, f32

HOPPER = Path(__file__).resolve().parents[3] / "examples" / "hopper"
TESTS = Path(__file__).resolve().parent
DTS = ("f32", "bf16")
RAGGED_N = (1, 7, 33, 1000, 4097, 8192)
BENCH = ((256, 4096), (1024, 8192), (2048, 8192), (8192, 8192))

_mods: dict[str, object] = {}


def load(name: str):
    mod = _mods.get(name)
    if mod is None:
        sys.path.insert(0, str(HOPPER))
        spec = importlib.util.spec_from_file_location(f"rowwise_{name}", HOPPER / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _mods[name] = mod
    return mod


def forward_builders():
    return {
        "rms_norm": load("rms_norm").build_rms_norm_fast,
        "layer_norm": load("layer_norm").build_layer_norm,
        "softmax": load("softmax").build_softmax_fast,
        "swiglu": load("swiglu").build_swiglu,
    }


def backward_builders():
    return {
        "rms_norm_bwd": load("rms_norm").build_rms_norm_bwd,
        "layer_norm_bwd": load("layer_norm").build_layer_norm_bwd,
    }


def kernels_of(k):
    return list(k.kernels) if hasattr(k, "kernels") else [k]


# ----------------------------------------------------------------------------- ptxas
@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("N", RAGGED_N)
def test_every_builder_assembles(N, dt, assemble):
    B = 5
    built = [b(B, N, dt) for b in forward_builders().values()]
    built += [b(B, N, dt) for b in backward_builders().values()]
    for k in built:
        for kk in kernels_of(k):
            log = assemble(kk.specialize().ptx())
            assert re.search(r"Used \d+ registers", log), log
            assert "0 bytes spill stores" in log, f"{kk.name} B={B} N={N} {dt}:\n{log}"


@pytest.mark.parametrize("dt", DTS)
def test_benchmark_sizes_have_no_spills(dt):
    from pyptx.ptxas import check

    seen = set()
    for B, N in BENCH + ((2, 32768),):
        for name, build in forward_builders().items():
            specs = [build(B, N, dt).specialize()]
            if N <= 8192 and name in ("rms_norm", "layer_norm"):
                specs += [k.specialize() for k in kernels_of(backward_builders()[name + "_bwd"](B, N, dt))]
            for spec in specs:
                key = (spec.ptx(),)
                if key in seen:
                    continue
                seen.add(key)
                try:
                    e = check(spec).entries[0]
                except Exception as exc:  # ToolchainError without ptxas
                    pytest.skip(f"no ptxas: {exc}")
                threads = spec.block[0] * spec.block[1] * spec.block[2]
                assert e.spill_stores == e.spill_loads == e.stack == 0, (spec.name, B, N, e)
                assert e.registers <= min(128, 65536 // threads), (spec.name, B, N, e)


@pytest.mark.parametrize("dt", DTS)
def test_hot_accesses_are_16_bytes(dt):
    B, N = 2048, 8192
    vec = "v4.f32" if dt == "f32" else "v4.b32"
    for name, build in forward_builders().items():
        text = build(B, N, dt).ptx()
        loads = re.findall(r"ld\.global\.nc\.L1::no_allocate\.(\S+)", text)
        stores = re.findall(r"st\.global\.(\S+)", text)
        assert loads and set(loads) == {vec}, (name, set(loads))
        assert stores and set(stores) == {vec}, (name, set(stores))
        assert "bar.sync" in text or name == "swiglu"


# ----------------------------------------------------------------------------- plans
def test_plans():
    rw = load("rms_norm")._rowwise()
    p = rw.plan_rows(2048, 8192, f32, who="t")
    assert (p.vec, p.threads, p.chunks, p.rows) == (4, 512, 4, 1)
    assert p.block == (512, 1, 1) and p.grid == (2048, 1, 1) and p.tail_threads == p.threads
    p = rw.plan_rows(2048, 8192, bf16, who="t")
    assert (p.vec, p.threads, p.chunks) == (8, 256, 4)
    p = rw.plan_rows(7, 1000, f32, who="t")  # 250 vectors: 64 threads x 4, two rows per CTA
    assert (p.vec, p.threads, p.chunks, p.rows, p.grid[0]) == (4, 64, 4, 2, 4)
    assert p.tail_threads == 250 - 3 * 64 and p.ragged_rows
    p = rw.plan_rows(3, 4097, f32, who="t")  # odd N: scalar accesses
    assert p.vec == 1 and p.threads % 32 == 0 and p.threads * p.chunks >= 4097
    p = rw.plan_rows(3, 4100, bf16, who="t")
    assert p.vec == 4
    p = rw.plan_rows(9, 1, f32, who="t")
    assert (p.vec, p.threads, p.chunks, p.rows) == (1, 1, 1, 128)
    p = rw.plan_rows(64, 8192, f32, who="t", chunks=8)
    assert (p.threads, p.chunks) == (256, 8)


def test_unsupported_sizes_name_the_limit():
    fwd = forward_builders()
    for name in ("rms_norm", "layer_norm", "softmax"):
        with pytest.raises(SpecError, match=r"N=32769 is not supported.*1\.\.32768"):
            fwd[name](2, 32769)
    for build in backward_builders().values():
        with pytest.raises(SpecError, match=r"1\.\.8192"):
            build(2, 8200)
    with pytest.raises(SpecError, match="dtype must be f32 or bf16"):
        fwd["rms_norm"](2, 64, "f16")
    with pytest.raises(SpecError, match="B must be a positive int"):
        fwd["softmax"](0, 64)
    with pytest.raises(ConfigError, match="threads per row"):
        fwd["rms_norm"](2, 4096, threads=48)
    with pytest.raises(SpecError, match=r"B \* N must be below 2\*\*32"):
        fwd["swiglu"](1 << 16, 1 << 16)


def test_seed_builders_are_unchanged():
    """The fast builders live beside the seeds; the seeds' PTX is the golden file's."""
    golden = TESTS / "golden"
    assert load("rms_norm").build_rms_norm(16, 512).ptx() == (golden / "rms_norm_B16_N512.ptx").read_text()
    assert load("softmax").build_softmax(16, 256).ptx() == (golden / "softmax_B16_N256.ptx").read_text()


def test_backward_is_a_two_stage_callable():
    bwd = load("layer_norm").build_layer_norm_bwd(300, 1000, "bf16")
    k1, k2 = bwd.kernels
    assert len(bwd.in_specs) == 3 and len(bwd.out_specs) == 3
    assert [s.dtype for s in bwd.out_specs] == [bf16, bf16, bf16]
    assert k1.specialize().out_shapes[1] == (2 * k1.specialize().grid[0] * bwd.plan.rows, 1000)
    assert k2.specialize().grid[1] == 2


# ----------------------------------------------------------------------------- simulator
np = None


@pytest.fixture(scope="module")
def sim():
    global np
    np = pytest.importorskip("numpy")
    sys.path.insert(0, str(TESTS))
    import ptxsim

    return ptxsim


def to_dev(sim, x, dt):
    x = np.asarray(x, np.float32)
    return x if dt == "f32" else sim._bf16_rne(x)


def f64(a, dt):
    if dt == "f32":
        return a.view(np.float32).astype(np.float64)
    return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


SIM_SIZES = [(3, 1), (5, 7), (4, 33), (3, 1000), (2, 4097), (2, 8192), (130, 24)]
SIM_TOL = {"f32": 1e-6, "bf16": 1e-2}


@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("B,N", SIM_SIZES)
def test_forward_numerics_in_simulator(sim, B, N, dt):
    rng = np.random.default_rng(B * 7919 + N)
    x = to_dev(sim, rng.standard_normal((B, N)) * 2 + 0.3, dt)
    w = to_dev(sim, rng.standard_normal(N) * 0.1 + 1, dt)
    b = to_dev(sim, rng.standard_normal(N) * 0.1, dt)
    u = to_dev(sim, rng.standard_normal((B, N)), dt)
    x64, w64, b64, u64 = (f64(a, dt) for a in (x, w, b, u))
    fwd = forward_builders()

    (y,) = sim.run(fwd["rms_norm"](B, N, dt).specialize(), [x, w])
    ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w64
    assert rel(f64(y, dt), ref) < SIM_TOL[dt], "rms_norm"

    (y,) = sim.run(fwd["layer_norm"](B, N, dt).specialize(), [x, w, b])
    mu = x64.mean(-1, keepdims=True)
    ref = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w64 + b64
    assert rel(f64(y, dt), ref) < SIM_TOL[dt], "layer_norm"

    (y,) = sim.run(fwd["softmax"](B, N, dt).specialize(), [x])
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    assert rel(f64(y, dt), e / e.sum(-1, keepdims=True)) < SIM_TOL[dt], "softmax"

    (y,) = sim.run(fwd["swiglu"](B, N, dt).specialize(), [x, u])
    assert rel(f64(y, dt), x64 / (1 + np.exp(-x64)) * u64) < SIM_TOL[dt], "swiglu"


@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("B,N,ctas", [(5, 7, None), (4, 33, 2), (7, 1000, 2), (2, 4097, None),
                                      (9, 8192, 4), (300, 64, None)])
def test_backward_numerics_in_simulator(sim, B, N, ctas, dt):
    rng = np.random.default_rng(B * 31 + N)
    x = to_dev(sim, rng.standard_normal((B, N)) * 2 + 0.3, dt)
    w = to_dev(sim, rng.standard_normal(N) * 0.1 + 1, dt)
    dy = to_dev(sim, rng.standard_normal((B, N)), dt)
    x64, w64, dy64 = f64(x, dt), f64(w, dt), f64(dy, dt)
    g = w64 * dy64
    tol = 1e-6 if dt == "f32" else 1e-2

    def two_stage(bwd):
        k1, k2 = bwd.kernels
        dx, part = sim.run(k1.specialize(), [x, w, dy])
        return dx, sim.run(k2.specialize(), [part])

    dx, (dw,) = two_stage(backward_builders()["rms_norm_bwd"](B, N, dt, ctas=ctas))
    r = 1 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6)
    assert rel(f64(dx, dt), r * g - x64 * r ** 3 * (g * x64).mean(-1, keepdims=True)) < tol
    assert rel(f64(dw, dt), (dy64 * x64 * r).sum(0)) < tol

    dx, (dw, db) = two_stage(backward_builders()["layer_norm_bwd"](B, N, dt, ctas=ctas))
    mu = x64.mean(-1, keepdims=True)
    xh = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    ref_dx = (g - g.mean(-1, keepdims=True) - xh * (g * xh).mean(-1, keepdims=True)) / np.sqrt(
        ((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    assert rel(f64(dx, dt), ref_dx) < tol
    assert rel(f64(dw, dt), (dy64 * xh).sum(0)) < tol
    assert rel(f64(db, dt), dy64.sum(0)) < tol


def test_simulator_catches_out_of_bounds_and_unwritten_outputs(sim):
    from pyptx import Tile, kernel, ptx, reg
    from pyptx.types import u64

    @kernel(in_specs=(Tile(33, f32),), out_specs=(Tile(33, f32),), block=(64, 1, 1))
    def copy_unmasked(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        off = reg.scalar(u64)
        ptx.inst.mul.wide.u32(off, ptx.special.tid.x(), 4)
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(px + off))
        ptx.inst.st.global_.f32(ptx.addr(py + off), v)
        ptx.ret()

    with pytest.raises(sim.SimError, match="out of bounds"):
        sim.run(copy_unmasked.specialize(), [np.ones(33, np.float32)])

    @kernel(in_specs=(Tile(64, f32),), out_specs=(Tile(64, f32),), block=(32, 1, 1))
    def copy_half(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        off = reg.scalar(u64)
        ptx.inst.mul.wide.u32(off, ptx.special.tid.x(), 4)
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(px + off))
        ptx.inst.st.global_.f32(ptx.addr(py + off), v)
        ptx.ret()

    with pytest.raises(sim.SimError, match="never written"):
        sim.run(copy_half.specialize(), [np.ones(64, np.float32)])
    # and a correct kernel passes through the same checks
    (out,) = sim.run(copy_half.specialize(), [np.arange(64, dtype=np.float32)], poison=False)
    assert out.view(np.float32)[:32].tolist() == list(range(32))
