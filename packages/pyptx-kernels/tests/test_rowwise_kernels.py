"""The row-wise memory-bound examples on the CPU: ptxas, resources, plans, and numerics in a simulator.

* every builder (RMSNorm, LayerNorm, softmax, SwiGLU forward; RMSNorm and
  LayerNorm backward) for f32 and bf16 at ragged and regular N assembles for
  sm_90a;
* at the benchmark sizes ptxas reports no spills and no stack frame, and the
  hot loads and stores are 16 bytes wide;
* launch plans and the errors naming the supported N;
* with numpy, ``ptxsim`` runs the kernels' PTX on small inputs and compares
  with float64 references (1e-6 relative for f32, 1e-2 for bf16), checking
  that every access is in bounds and aligned and every output byte is written;
* the TMA-ring RMSNorm/LayerNorm (``ctas=P, stages=S``): ptxas, two CTAs per SM at
  the benchmark size, plan errors, and the simulator's bulk copy / mbarrier model on
  the kernels, on edited copies of them missing one protocol step, and on a tiny
  hand-written bulk copy.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from pyptx_kernels._modules import kernel_module
from pyptx_kernels.rows import RowConfig

from pyptx import ConfigError, SpecError
from pyptx import rows as rw
from pyptx.types import bf16, f32

TESTS = Path(__file__).resolve().parent
DTS = ("f32", "bf16")
RAGGED_N = (1, 7, 33, 1000, 4097, 8192)
BENCH = ((256, 4096), (1024, 8192), (2048, 8192), (8192, 8192))

_mods: dict[str, object] = {}


def load(name: str):
    mod = _mods.get(name)
    if mod is None:
        mod = _mods[name] = kernel_module(name)
    return mod


def planned(build):
    """``build(B, N, dtype, *problem, **fields)``: the fields name its ``config=RowConfig(...)``
    (none: ``RowConfig()``, the plain kernel; a default call's plan depends on the shape)."""
    def call(B, N, dt="f32", *problem, **fields):
        return build(B, N, dt, *problem, config=RowConfig(**fields))

    return call


def forward_builders():
    return {
        "rms_norm": planned(load("rms_norm").build_rms_norm_fast),
        "layer_norm": planned(load("layer_norm").build_layer_norm),
        "softmax": planned(load("softmax").build_softmax_fast),
        "swiglu": planned(load("swiglu").build_swiglu),
    }


def backward_builders():
    return {
        "rms_norm_bwd": planned(load("rms_norm").build_rms_norm_bwd),
        "layer_norm_bwd": planned(load("layer_norm").build_layer_norm_bwd),
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
        loads = re.findall(r"ld\.global\.(v\d\.\S+)", text)  # streamed: plain ld.global
        stores = re.findall(r"st\.global\.(\S+)", text)
        assert loads and set(loads) == {vec}, (name, set(loads))
        assert stores and set(stores) == {vec}, (name, set(stores))
        assert "bar.sync" in text or name == "swiglu"
        assert "no_allocate" not in text  # measured slower than plain loads on the H100


# ----------------------------------------------------------------------------- plans
def test_plans():
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
    """The one-warp softmax beside the fast builders emits its golden PTX (the RMSNorm seed is
    the example's, checked by core's test_examples.py)."""
    golden = TESTS / "golden"
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
    check_forward_in_simulator(sim, B, N, dt)


# the PDL kernels' L2 prefetch covers this CTA's rows: the simulator checks every prefetch
# range lies inside its buffer (ragged B with several rows per CTA, ragged flat swiglu)
@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("B,N", [(5, 8), (130, 24), (3, 1000), (2, 4097), (7, 96)])
def test_pdl_forward_numerics_in_simulator(sim, B, N, dt):
    check_forward_in_simulator(sim, B, N, dt, pdl=True)


def check_forward_in_simulator(sim, B, N, dt, **kw):
    rng = np.random.default_rng(B * 7919 + N)
    x = to_dev(sim, rng.standard_normal((B, N)) * 2 + 0.3, dt)
    w = to_dev(sim, rng.standard_normal(N) * 0.1 + 1, dt)
    b = to_dev(sim, rng.standard_normal(N) * 0.1, dt)
    u = to_dev(sim, rng.standard_normal((B, N)), dt)
    x64, w64, b64, u64 = (f64(a, dt) for a in (x, w, b, u))
    fwd = forward_builders()

    (y,) = sim.run(fwd["rms_norm"](B, N, dt, **kw).specialize(), [x, w])
    ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w64
    assert rel(f64(y, dt), ref) < SIM_TOL[dt], "rms_norm"

    (y,) = sim.run(fwd["layer_norm"](B, N, dt, **kw).specialize(), [x, w, b])
    mu = x64.mean(-1, keepdims=True)
    ref = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w64 + b64
    assert rel(f64(y, dt), ref) < SIM_TOL[dt], "layer_norm"

    (y,) = sim.run(fwd["softmax"](B, N, dt, **kw).specialize(), [x])
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    assert rel(f64(y, dt), e / e.sum(-1, keepdims=True)) < SIM_TOL[dt], "softmax"

    (y,) = sim.run(fwd["swiglu"](B, N, dt, **kw).specialize(), [x, u])
    assert rel(f64(y, dt), x64 / (1 + np.exp(-x64)) * u64) < SIM_TOL[dt], "swiglu"


@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("B,N,kw", [
    (5, 4096, {}), (3, 4096, dict(chunks=1, pdl=False)), (2, 8192, dict(chunks=8)),
    (130, 24, {}),             # 6 threads per row, many rows per CTA, ragged B
    (9, 256, dict(chunks=2)),  # 32 threads per row: no shared-memory pass
    (4, 96 * 8, {}),           # 24 threads per row (a non-power-of-two warp share)
    (3, 1280, dict(threads=160, chunks=2)),  # 5 warps: an uneven merge tree
    (9, 4096, dict(ctas=4, pdl=False)),      # persistent: rows walked by 4 CTAs
    (300, 64, dict(ctas=3, pdl=False)),
])
def test_layer_norm_welford_in_simulator(sim, B, N, kw, dt):
    """``welford=True``: one all-reduce of (mean, m2) pairs gives the two-pass result, also
    for rows offset far from zero (where a one-pass sum of squares would cancel)."""
    rng = np.random.default_rng(B * 31 + N)
    for offset in (0.3, 300.0):
        x = to_dev(sim, rng.standard_normal((B, N)) * 2 + offset, dt)
        w = to_dev(sim, rng.standard_normal(N) * 0.1 + 1, dt)
        b = to_dev(sim, rng.standard_normal(N) * 0.1, dt)
        x64, w64, b64 = (f64(a, dt) for a in (x, w, b))
        k = forward_builders()["layer_norm"](B, N, dt, welford=True, **kw)
        assert "_welford" in k.name
        (y,) = sim.run(k.specialize(), [x, w, b])
        mu = x64.mean(-1, keepdims=True)
        ref = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w64 + b64
        tol = SIM_TOL[dt] if offset < 1 else {"f32": 2e-5, "bf16": 1e-2}[dt]
        assert rel(f64(y, dt), ref) < tol, (offset, k.plan.describe())


def test_layer_norm_welford_refusals():
    """``welford=True`` needs equal values per thread and the one-row or persistent kernel: a
    partial last chunk or the TMA ring variant is refused at the caller's line."""
    from pyptx.errors import ConfigError

    ln = forward_builders()["layer_norm"]
    with pytest.raises(ConfigError, match="same number of values") as e:
        ln(2, 4097, "f32", welford=True)
    assert str(e.value).startswith(f"{Path(__file__).resolve()}:"), str(e.value)
    with pytest.raises(ConfigError, match="variant of the one-row and persistent") as e:
        ln(2, 4096, "f32", welford=True, ctas=2, stages=2)
    assert str(e.value).startswith(f"{Path(__file__).resolve()}:"), str(e.value)


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

    def copy_element_tid(px, py):
        """Y[tid] = X[tid] (f32), then ret."""
        off = reg.scalar(u64)
        ptx.inst.mul.wide.u32(off, ptx.special.tid.x(), 4)
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(px + off))
        ptx.inst.st.global_.f32(ptx.addr(py + off), v)
        ptx.ret()

    def copy_per_thread(n, threads):
        """Thread t copies element t of an n-element array, unmasked."""

        @kernel(in_specs=(Tile(n, f32),), out_specs=(Tile(n, f32),), block=(threads, 1, 1))
        def copy(X, Y):
            copy_element_tid(*ptx.global_ptrs(X, Y))

        return copy

    with pytest.raises(sim.SimError, match="out of bounds"):  # 64 threads over 33 elements
        sim.run(copy_per_thread(33, 64).specialize(), [np.ones(33, np.float32)])

    copy_half = copy_per_thread(64, 32)  # half of the output is never written
    with pytest.raises(sim.SimError, match="never written"):
        sim.run(copy_half.specialize(), [np.ones(64, np.float32)])
    # and a correct kernel passes through the same checks
    (out,) = sim.run(copy_half.specialize(), [np.arange(64, dtype=np.float32)], poison=False)
    assert out.view(np.float32)[:32].tolist() == list(range(32))

    def prefetching(nbytes):
        @kernel(in_specs=(Tile(64, f32),), out_specs=(Tile(64, f32),), block=(64, 1, 1), pdl=True)
        def k(X, Y):
            with ptx.pdl_prologue():
                px, py = ptx.global_ptrs(X, Y)
                ptx.bulk_prefetch_l2(px, nbytes)
            copy_element_tid(px, py)
        return k.specialize()

    with pytest.raises(sim.SimError, match="bulk prefetch past the end"):
        sim.run(prefetching(272), [np.ones(64, np.float32)])
    sim.run(prefetching(256), [np.ones(64, np.float32)])


# ----------------------------------------------------------------------------- persistent (ctas=P)
PERSISTENT_MAX_N = {"rms_norm": 16384, "layer_norm": 8192, "softmax": 16384}


def persistent_builders():
    fwd = forward_builders()
    return {name: fwd[name] for name in PERSISTENT_MAX_N}


def occupancy(registers: int, threads: int) -> int:
    """Threads per SM that the register file allows (64K registers, 2048 threads per SM)."""
    per = -(-registers // 8) * 8
    ctas = min(65536 // (per * threads), 2048 // threads)
    return ctas * threads


@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("N", RAGGED_N)
def test_persistent_builders_assemble(N, dt, assemble):
    for name, build in persistent_builders().items():
        for B, P in ((5, 2), (300, 7)):
            k = build(B, N, dt, ctas=P)
            log = assemble(k.specialize().ptx())
            assert "0 bytes spill stores" in log and "0 bytes stack frame" in log, (
                f"{name} B={B} N={N} {dt} ctas={P}:\n{log}")


@pytest.mark.parametrize("dt", DTS)
def test_persistent_sizes_have_no_spills_and_two_rows_per_sm(dt):
    """At the benchmark sizes the persistent kernels (two row register sets + weights) fit in
    64 registers: 1024 threads per SM (two 512-thread CTAs or one of 1024), no local memory."""
    from pyptx.ptxas import check

    seen = set()
    for name, build in persistent_builders().items():
        for B, N in BENCH + ((2, PERSISTENT_MAX_N[name]),):
            for P in (132, 264, 396):
                spec = build(B, N, dt, ctas=P).specialize()
                key = spec.ptx()
                if key in seen:
                    continue
                seen.add(key)
                try:
                    e = check(spec).entries[0]
                except Exception as exc:  # ToolchainError without ptxas
                    pytest.skip(f"no ptxas: {exc}")
                threads = spec.block[0]
                assert e.spill_stores == e.spill_loads == e.stack == 0, (name, B, N, P, e)
                assert occupancy(e.registers, threads) >= 1024, (name, B, N, P, threads, e)


def test_persistent_plans_and_grid():
    shapes = {  # (op, dtype) -> (threads per row, chunks) at 2048x8192
        ("rms_norm", "f32"): (512, 4), ("rms_norm", "bf16"): (512, 2),
        ("layer_norm", "f32"): (1024, 2), ("layer_norm", "bf16"): (1024, 1),
        ("softmax", "f32"): (512, 4), ("softmax", "bf16"): (512, 2),
    }
    for (name, dt), (g, k) in shapes.items():
        build = persistent_builders()[name]
        kern = build(2048, 8192, dt, ctas=264)
        assert (kern.plan.threads, kern.plan.chunks, kern.plan.rows) == (g, k, 1), (name, dt)
        spec = kern.specialize()
        assert spec.grid == (264, 1, 1) and kern.ctas == 264
        assert spec.block == (g, 1, 1)
        text = spec.ptx()
        # the row loads are coherent (pinned before the barrier), the weights .nc, two halves
        assert "ld.global.L1::no_allocate." in text and "ld.global.nc.L1::no_allocate" not in text
        assert text.count("bra.uni") == 2 and '.pragma "nounroll"' in text
    build = persistent_builders()["rms_norm"]
    assert build(3, 4096, ctas=264).specialize().grid == (3, 1, 1)     # never more CTAs than rows
    k = build(300, 64, ctas=4)  # 4 threads x 32 rows per CTA: 10 row groups
    assert (k.plan.threads, k.plan.rows) == (4, 32) and k.specialize().grid == (4, 1, 1)
    assert build(300, 64, ctas=400).specialize().grid == (10, 1, 1)
    # ctas=None is today's kernel, untouched
    assert build(64, 1024).ptx() == build(64, 1024, ctas=None).ptx()
    assert build(64, 1024).name == "rms_norm_f32" and k.name == "rms_norm_persist_f32"


def test_persistent_unsupported_sizes_name_the_limit():
    for name, build in persistent_builders().items():
        n = PERSISTENT_MAX_N[name]
        with pytest.raises(SpecError, match=rf"ctas=8.*N={n + 1} is not supported.*1\.\.{n}\b"):
            build(2, n + 1, ctas=8)
        build(2, n + 1)  # the one-row-per-CTA kernel still takes it
        with pytest.raises(SpecError, match="ctas must be a positive int"):
            build(2, 64, ctas=0)
        with pytest.raises(SpecError, match="ctas must be a positive int"):
            build(2, 64, ctas=True)


def nvdisasm():
    import shutil

    path = shutil.which("nvdisasm")
    if path is None:
        spec = importlib.util.find_spec("nvidia")
        for root in (spec.submodule_search_locations if spec else []) or []:
            cand = Path(root) / "cu13" / "bin" / "nvdisasm"
            if cand.exists():
                path = str(cand)
    return path


def sass_lines(cubin: bytes, tool: str) -> tuple[list[str], dict[str, int]]:
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.cubin"
        f.write_bytes(cubin)
        text = subprocess.run([tool, "-c", str(f)], capture_output=True, text=True,
                              check=True).stdout
    out: list[str] = []
    labels: dict[str, int] = {}
    for line in text.splitlines():
        if m := re.match(r"^\s*(\.L_x_\d+):", line):
            labels[m.group(1)] = len(out)
        elif m := re.match(r"^\s+/\*[0-9a-f]{4}\*/\s+(.*?)\s*;", line):
            out.append(m.group(1))
    return out, labels


def prefetch_distances(cubin: bytes, tool: str) -> list[int]:
    """For each predicated row load in the loop: how many stores run between it and the first
    instruction that reads its destination registers (0: the load was sunk to its use)."""
    ins, labels = sass_lines(cubin, tool)
    top = None
    for i, s in enumerate(ins):
        m = re.match(r"@!?P\d BRA `\((\.L_x_\d+)\)", s)
        if m and labels.get(m.group(1), len(ins)) < i:
            top = labels[m.group(1)]
    assert top is not None, "no backward branch: no loop"
    out = []
    for i in range(top, len(ins)):
        m = re.match(r"@!?P\d+ LDG\.E(?:\.NA)?\.(\d+)(?:\.CONSTANT)? R(\d+),", ins[i])
        if not m:
            continue
        dst = set(range(int(m.group(2)), int(m.group(2)) + int(m.group(1)) // 32))
        stores = 0
        for j in list(range(i + 1, len(ins))) + list(range(top, i)):
            op, _, args = re.sub(r"^@!?P\d+\s+", "", ins[j]).partition(" ")
            parts = [p.strip() for p in args.split(",")]
            srcs = parts if op.startswith(("ST", "BRA", "BAR", "EXIT")) else parts[1:]
            if any(dst & {int(r) for r in re.findall(r"\bR(\d+)\b", p)} for p in srcs):
                break
            stores += op.startswith("STG")
        out.append(stores)
    return out


@pytest.mark.parametrize("dt", DTS)
def test_persistent_prefetch_runs_ahead_of_the_stores(dt):
    """In the machine code, each row load of the loop is issued before the previous row's
    stores: ptxas kept the software pipeline (needs nvdisasm; skipped without it)."""
    from pyptx.ptxas import check

    tool = nvdisasm()
    if tool is None:
        pytest.skip("no nvdisasm (pip install nvidia-cuda-nvdisasm)")
    for name, build in persistent_builders().items():
        for B, N in ((2048, 8192), (256, 4096)):
            try:
                rep = check(build(B, N, dt, ctas=264).specialize())
            except Exception as exc:
                pytest.skip(f"no ptxas: {exc}")
            dist = prefetch_distances(rep.cubin, tool)
            assert dist and min(dist) > 0, (name, dt, B, N, dist)


PERSISTENT_SIM = [  # (B, N, ctas): B=1, B < P, B not a multiple of P (odd and even row counts
    # per CTA: both loop exits), ragged N, several rows per CTA with a ragged last group
    (1, 7, 3), (1, 1000, 1), (2, 4097, 4), (9, 64, 4), (7, 1000, 3), (5, 33, 2),
    (9, 2048, 4), (4, 8192, 3), (130, 24, 3), (6, 256, 2)]


@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("B,N,ctas", PERSISTENT_SIM)
def test_persistent_numerics_in_simulator(sim, B, N, ctas, dt):
    rng = np.random.default_rng(B * 7919 + N * 13 + ctas)
    x = to_dev(sim, rng.standard_normal((B, N)) * 2 + 0.3, dt)
    w = to_dev(sim, rng.standard_normal(N) * 0.1 + 1, dt)
    b = to_dev(sim, rng.standard_normal(N) * 0.1, dt)
    x64, w64, b64 = (f64(a, dt) for a in (x, w, b))
    fwd = persistent_builders()

    (y,) = sim.run(fwd["rms_norm"](B, N, dt, ctas=ctas).specialize(), [x, w])
    ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w64
    assert rel(f64(y, dt), ref) < SIM_TOL[dt], "rms_norm"

    (y,) = sim.run(fwd["layer_norm"](B, N, dt, ctas=ctas).specialize(), [x, w, b])
    mu = x64.mean(-1, keepdims=True)
    ref = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w64 + b64
    assert rel(f64(y, dt), ref) < SIM_TOL[dt], "layer_norm"

    (y,) = sim.run(fwd["softmax"](B, N, dt, ctas=ctas).specialize(), [x])
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    assert rel(f64(y, dt), e / e.sum(-1, keepdims=True)) < SIM_TOL[dt], "softmax"


def test_persistent_results_match_the_one_row_kernels(sim):
    """Same plan, same arithmetic up to the order of the cross-warp sum (a lane tree in the
    persistent kernel, warp by warp in the other): the outputs agree to about an ulp."""
    rng = np.random.default_rng(5)
    B, N = 5, 2048
    x = rng.standard_normal((B, N)).astype(np.float32)
    w = (rng.standard_normal(N) * 0.1 + 1).astype(np.float32)
    build = persistent_builders()["softmax"]
    (a,) = sim.run(build(B, N, threads=128).specialize(), [x])
    (p,) = sim.run(build(B, N, threads=128, ctas=2).specialize(), [x])
    np.testing.assert_allclose(p.view(np.float32), a.view(np.float32), rtol=1e-6, atol=0)
    build = persistent_builders()["rms_norm"]
    (a,) = sim.run(build(B, N, threads=128).specialize(), [x, w])
    (p,) = sim.run(build(B, N, threads=128, ctas=3).specialize(), [x, w])
    np.testing.assert_allclose(p.view(np.float32), a.view(np.float32), rtol=1e-6, atol=0)


# ----------------------------------------------------------------------------- TMA ring (ctas=P, stages=S)
def ring_builders():
    """RMSNorm and LayerNorm with rows streamed into shared memory by cp.async.bulk."""
    return {"rms_norm": planned(load("rms_norm").build_rms_norm_fast),
            "layer_norm": planned(load("layer_norm").build_layer_norm)}


DT_BYTES = {"f32": 4, "bf16": 2}


@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("N", (1000, 8192, 4104))
def test_ring_builders_assemble(N, dt, assemble):
    if N * DT_BYTES[dt] % 16:
        pytest.skip("the ring copies rows in 16-byte granules")
    for name, build in ring_builders().items():
        for S in (2, 4):
            for bulk_store in (False, True):
                spec = build(7, N, dt, ctas=3, stages=S, bulk_store=bulk_store).specialize()
                assert spec.smem == S * N * DT_BYTES[dt] and spec.grid == (3, 1, 1)
                text = spec.ptx()
                assert ".extern .shared .align 16 .b8 ring[];" in text
                assert ("cp.async.bulk.global.shared::cta.bulk_group" in text) == bulk_store
                log = assemble(text)
                assert "0 bytes spill stores" in log and "0 bytes stack frame" in log, (
                    f"{name} N={N} {dt} stages={S} bulk_store={bulk_store}:\n{log}")


def test_ring_benchmark_size_fits_two_ctas_per_sm():
    """bf16 2048x8192 with 264 CTAs (two per H100 SM): no spills, at most 128 registers, and
    two CTAs' registers and shared memory (ring + static + 1 KiB reserved) fit in one SM."""
    from pyptx.ptxas import check

    for name, build in ring_builders().items():
        for S in (3, 4):
            for bulk_store in (False, True):
                spec = build(2048, 8192, "bf16", ctas=264, stages=S,
                             bulk_store=bulk_store).specialize()
                try:
                    e = check(spec).entries[0]
                except Exception as exc:  # ToolchainError without ptxas
                    pytest.skip(f"no ptxas: {exc}")
                threads = spec.block[0] * spec.block[1] * spec.block[2]
                what = (name, S, bulk_store, threads, e)
                assert e.spill_stores == e.spill_loads == e.stack == 0, what
                assert e.registers <= 128 and e.registers * threads * 2 <= 65536, what
                assert 2 * (spec.smem + spec.static_smem + 1024) <= 228 * 1024, what


def test_ring_plan_errors_name_the_limit():
    for build in ring_builders().values():
        with pytest.raises(ConfigError, match="stages >= 2"):
            build(4, 1024, "f32", ctas=2, stages=1)
        with pytest.raises(SpecError, match="16-byte granules.*N=7"):
            build(4, 7, "bf16", ctas=2, stages=2)  # 14 bytes a row
        with pytest.raises(ConfigError, match="524288 bytes.*196608 bytes fit"):
            build(4, 32768, "f32", ctas=2, stages=4)
        with pytest.raises(ConfigError, match="at most 8 stages"):
            build(64, 64, "f32", ctas=2, stages=9)
        with pytest.raises(SpecError, match="stages"):
            build(4, 64, "f32", ctas=2, stages=0)


RING_SIM = [  # (B, N, ctas, stages): two loop turns per CTA and a ragged last turn, a partial
    # ragged row of threads, more stages than rows, more CTAs than rows (the grid clamps to B)
    (7, 1000, 2, 2), (9, 96, 4, 3), (13, 4104, 3, 2), (2, 24, 1, 4), (3, 1000, 264, 2),
    (5, 8192, 2, 3)]


@pytest.mark.parametrize("bulk_store", (False, True))
@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("B,N,ctas,stages", RING_SIM)
def test_ring_numerics_in_simulator(sim, B, N, ctas, stages, dt, bulk_store):
    rng = np.random.default_rng(B * 7919 + N * 13 + ctas)
    x = to_dev(sim, rng.standard_normal((B, N)) * 2 + 0.3, dt)
    w = to_dev(sim, rng.standard_normal(N) * 0.1 + 1, dt)
    b = to_dev(sim, rng.standard_normal(N) * 0.1, dt)
    x64, w64, b64 = (f64(a, dt) for a in (x, w, b))
    kw = dict(ctas=ctas, stages=stages, bulk_store=bulk_store)

    spec = ring_builders()["rms_norm"](B, N, dt, **kw).specialize()
    assert spec.grid == (min(ctas, B), 1, 1)
    (y,) = sim.run(spec, [x, w])
    ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w64
    assert rel(f64(y, dt), ref) < SIM_TOL[dt], "rms_norm"

    (y,) = sim.run(ring_builders()["layer_norm"](B, N, dt, **kw).specialize(), [x, w, b])
    mu = x64.mean(-1, keepdims=True)
    ref = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w64 + b64
    assert rel(f64(y, dt), ref) < SIM_TOL[dt], "layer_norm"


class Mutant:
    """A specialization whose PTX text is edited (the simulator reads only ``ptx()``)."""

    def __init__(self, spec, edit):
        self._spec = spec
        self._text = edit(spec.ptx())
        assert self._text != spec.ptx(), "the edit no longer matches the kernel's PTX"

    def ptx(self):
        return self._text

    def __getattr__(self, name):
        return getattr(self._spec, name)


def _drop(pattern):
    return lambda text: re.sub(pattern, "", text)


RING_MUTANTS = {  # (bulk_store, edit, the error): each protocol step the ring relies on
    "no wait before refilling a stored slot": (
        True, _drop(r"\tcp\.async\.bulk\.wait_group\.read 0;\n"), "bulk store may still read"),
    "no proxy fence before the bulk store": (
        True, _drop(r"\tfence\.proxy\.async\.shared::cta;\n"), "no fence.proxy.async"),
    "no bar.sync before the bulk store": (
        True, lambda t: t.replace("fence.proxy.async.shared::cta;\n\tbar.sync 0;",
                                  "fence.proxy.async.shared::cta;"), "other threads wrote"),
    "no final wait for the bulk stores": (
        True, _drop(r"\tcp\.async\.bulk\.wait_group 0;\n"), "exits with bulk stores in flight"),
    "the phase parity never flips": (
        False, _drop(r"\txor\.b32 (%r\d+), \1, 1;\n"), "deadlock"),
    "no arrive.expect_tx": (
        False, _drop(r"\tmbarrier\.arrive\.expect_tx[^\n]*\n"), "deadlock"),
    "reads the slot without waiting": (
        False, _drop(r"\tmbarrier\.try_wait[^\n]*\n\t@!%p\d+ bra \$L_mbar_wait(_\d+)?;\n"),
        "before thread 0 waited"),
    "refills a slot before the barrier that ends its reads": (
        False, lambda t: re.sub(r"(\$ring:\n(?:.*\n)*?)\tbar\.sync 0;\n((?:.*\n)*?\$L_endif_\d+:\n)",
                                r"\1\2\tbar.sync 0;\n", t, count=1),
        "threads accessed since the last bar.sync"),
}


@pytest.mark.parametrize("mutant", list(RING_MUTANTS))
def test_simulator_catches_broken_ring_protocols(sim, mutant):
    """The unedited ring kernel passes; dropping any one step of its protocol fails."""
    bulk_store, edit, error = RING_MUTANTS[mutant]
    B, N = 7, 1000
    x = np.random.default_rng(1).standard_normal((B, N)).astype(np.float32)
    w = np.ones(N, np.float32)
    spec = ring_builders()["rms_norm"](B, N, "f32", ctas=2, stages=2,
                                       bulk_store=bulk_store).specialize()
    sim.run(spec, [x, w])
    with pytest.raises(sim.SimError, match=re.escape(error)):
        sim.run(Mutant(spec, edit), [x, w])


def test_simulator_checks_bulk_copies_and_mbarriers(sim):
    """A hand-written bulk copy global -> shared -> global: the correct kernel passes, and
    waiting on a phase no copy completes, a size that is not a multiple of 16 and copies out
    of the buffer or past the shared window each raise SimError."""
    from pyptx import Tile, kernel, ptx, reg, smem
    from pyptx.types import b64, u32, u64

    n = 128  # f32 elements: 512 bytes, one per thread

    def bulk_copy(nbytes=4 * n, src_off=0, parity=0, issue=True, window=4 * n):
        @kernel(in_specs=(Tile(n, f32),), out_specs=(Tile(n, f32),), block=(n, 1, 1),
                smem=window)
        def k(X, Y):
            px, py = ptx.global_ptrs(X, Y)
            buf = smem.dynamic(name="buf").addr()
            bar = smem.alloc(b64, 1, align=8, name="bar").addr()
            tid = ptx.special.tid.x()
            with ptx.if_(tid == 0):
                ptx.mbarrier.init(bar, 1)
                ptx.fence_proxy_async()
            ptx.bar_sync(0)
            with ptx.if_(tid == 0):
                size = reg.scalar(u32)  # a register: pyptx itself rejects bad immediates
                ptx.inst.mov.u32(size, nbytes)
                ptx.mbarrier.arrive_expect_tx(bar, size)
                if issue:
                    ptx.tma.copy_bulk(buf, px + src_off, size, bar)
            ptx.mbarrier.wait(bar, parity)
            off = reg.scalar(u32)
            ptx.inst.mul.lo.u32(off, tid, 4)
            v = reg.scalar(f32)
            ptx.inst.ld.shared.f32(v, ptx.addr(buf + off))
            goff = reg.scalar(u64)
            ptx.inst.cvt.u64.u32(goff, off)
            ptx.inst.st.global_.f32(ptx.addr(py + goff), v)
            ptx.ret()

        return k.specialize()

    x = np.arange(n, dtype=np.float32)
    (y,) = sim.run(bulk_copy(), [x])
    assert y.view(np.float32).tolist() == x.tolist()
    with pytest.raises(sim.SimError, match="deadlock.*bar\\+0 \\(phase 1 open"):
        sim.run(bulk_copy(parity=1), [x])  # phase 0 completed; phase 1 never will
    with pytest.raises(sim.SimError, match="deadlock.*tx count 512"):
        sim.run(bulk_copy(issue=False), [x])  # the bytes it expects never come
    with pytest.raises(sim.SimError, match="positive multiple of 16 bytes"):
        sim.run(bulk_copy(nbytes=4 * n - 8), [x])
    with pytest.raises(sim.SimError, match="bulk copy global address: out of bounds"):
        sim.run(bulk_copy(src_off=16), [x])
    with pytest.raises(sim.SimError, match="outside its shared variable"):
        sim.run(bulk_copy(window=4 * n - 16), [x])


# ----------------------------------------------------------------------------- swiglu variants
# bulk: the CTA's slices of G and U arrive by cp.async.bulk into shared memory (ragged last
# CTA: a shorter copy and predicated threads); bulk_store: Y leaves the same way.
SWIGLU_BULK_SIM = [(5, 8, {}), (3, 1000, {}), (7, 96, {"chunks": 2}), (2, 4104, {"threads": 128}),
                   (9, 200, {"threads": 64, "chunks": 4})]


@pytest.mark.parametrize("bulk_store", (False, True))
@pytest.mark.parametrize("pdl", (False, True))
@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("B,N,kw", SWIGLU_BULK_SIM)
def test_swiglu_bulk_numerics_in_simulator(sim, B, N, kw, dt, pdl, bulk_store):
    rng = np.random.default_rng(B * 131 + N)
    g = to_dev(sim, rng.standard_normal((B, N)) * 3, dt)
    u = to_dev(sim, rng.standard_normal((B, N)), dt)
    g64, u64 = f64(g, dt), f64(u, dt)
    k = forward_builders()["swiglu"](B, N, dt, bulk=True, bulk_store=bulk_store, pdl=pdl, **kw)
    assert k.geometry["bulk"] and k.geometry["bulk_store"] == bulk_store
    spec = k.specialize()
    text = spec.ptx()
    assert text.count("cp.async.bulk.shared::cluster.global") == 2
    assert ("cp.async.bulk.global.shared::cta" in text) == bulk_store
    (y,) = sim.run(spec, [g, u])
    assert rel(f64(y, dt), g64 / (1 + np.exp(-g64)) * u64) < SIM_TOL[dt]


@pytest.mark.parametrize("dt", DTS)
def test_swiglu_bulk_assembles_at_benchmark_sizes(dt, assemble):
    for B, N in BENCH:
        for kw in ({}, {"bulk_store": True, "threads": 512, "chunks": 4}):
            k = forward_builders()["swiglu"](B, N, dt, bulk=True, **kw)
            log = assemble(k.specialize().ptx())
            assert "0 bytes spill stores" in log, (B, N, kw, log)


def test_swiglu_bulk_errors_name_the_limit():
    build = forward_builders()["swiglu"]
    with pytest.raises(SpecError, match=r"N \* 4 bytes to be a multiple of 16, got N=5"):
        build(3, 5, "f32", bulk=True)
    with pytest.raises(ConfigError, match=r"bulk_store=True writes back .*\(bulk=True\)"):
        build(4, 64, "f32", bulk_store=True)


@pytest.mark.parametrize("ld_pr,st_pr", [("evict_first", ""), ("", "evict_first"),
                                        ("evict_last", "evict_first")])
@pytest.mark.parametrize("dt", DTS)
def test_l2_eviction_policies(sim, ld_pr, st_pr, dt, assemble):
    """``l2_load`` / ``l2_store`` put ``.L2::cache_hint`` on streamed loads / stores
    (never on the weights' ``.nc`` loads); results are unchanged."""
    B, N = 3, 1000
    rng = np.random.default_rng(7)
    x = to_dev(sim, rng.standard_normal((B, N)), dt)
    w = to_dev(sim, rng.standard_normal(N) * 0.1 + 1, dt)
    for name, args in (("rms_norm", [x, w]), ("swiglu", [x, x])):
        spec = forward_builders()[name](B, N, dt, l2_load=ld_pr, l2_store=st_pr).specialize()
        text = spec.ptx()
        lds = [ln for ln in text.splitlines() if "ld.global" in ln]
        sts = [ln for ln in text.splitlines() if "st.global" in ln]
        assert all((".L2::cache_hint" in ln) == (bool(ld_pr) and ".nc" not in ln) for ln in lds)
        assert all((".L2::cache_hint" in ln) == bool(st_pr) for ln in sts)
        for pr in filter(None, (ld_pr, st_pr)):
            assert f"createpolicy.fractional.L2::{pr}.b64" in text
        assert "0 bytes spill stores" in assemble(text)
        (y,) = sim.run(spec, args)
        x64, w64 = f64(x, dt), f64(w, dt)
        ref = (x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w64
               if name == "rms_norm" else x64 / (1 + np.exp(-x64)) * x64)
        assert rel(f64(y, dt), ref) < SIM_TOL[dt], name


SWIGLU_BULK_MUTANTS = {  # (edit, the error): each protocol step the bulk swiglu relies on
    "reads the slices without waiting": (
        _drop(r"\tmbarrier\.try_wait[^\n]*\n\t@!%p\d+ bra \$L_mbar_wait(_\d+)?;\n"),
        "before thread 0 waited"),
    "no arrive.expect_tx": (_drop(r"\tmbarrier\.arrive\.expect_tx[^\n]*\n"), "deadlock"),
    "no proxy fence before the bulk store": (
        _drop(r"\tfence\.proxy\.async\.shared::cta;\n(?=\tbar\.sync)"), "no fence.proxy.async"),
    "no bar.sync before the bulk store": (
        lambda t: t.replace("fence.proxy.async.shared::cta;\n\tbar.sync 0;\n\t@!",
                            "fence.proxy.async.shared::cta;\n\t@!"), "other threads wrote"),
}


@pytest.mark.parametrize("mutant", list(SWIGLU_BULK_MUTANTS))
def test_simulator_catches_broken_swiglu_bulk(sim, mutant):
    """The unedited bulk swiglu passes; dropping any one step of its protocol fails."""
    edit, error = SWIGLU_BULK_MUTANTS[mutant]
    B, N = 3, 1000
    g = np.random.default_rng(2).standard_normal((B, N)).astype(np.float32)
    spec = forward_builders()["swiglu"](B, N, "f32", bulk=True, bulk_store=True).specialize()
    sim.run(spec, [g, g])
    with pytest.raises(sim.SimError, match=re.escape(error)):
        sim.run(Mutant(spec, edit), [g, g])
