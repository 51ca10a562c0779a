"""Runtime plugins through entry points only: a third runtime registered here, with no edit to
core, launches kernels through core's checks and plans; per-kernel plugin state and compiled
records are freed with the kernel."""

from __future__ import annotations

import dataclasses
import gc
import importlib.metadata
import subprocess
import sys
import textwrap
import types
import weakref

import pytest

import pyptx
from pyptx import Tile, kernel, plan, ptx, registry, runtimes
from pyptx.errors import ShapeError, SpecError
from pyptx.types import bf16, f32


class ToyArray:
    """An array of a framework pyptx has never heard of: a shape and a dtype name."""

    def __init__(self, shape, dtype="float32", device="cuda:0"):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device


class ToyRuntime:
    """A complete third runtime: it only describes its arrays and allocates outputs."""

    name = "toyfw"
    modules = ("toyfw",)
    made = []

    def owns(self, value):
        return isinstance(value, ToyArray)

    def launcher(self):
        state = {"plans": {}}
        ToyRuntime.made.append(state)

        def describe(a):
            if not isinstance(a, ToyArray):
                return None
            return plan.ArgInfo(a.shape, a.dtype, a.device)

        def launch(k, args, kwargs):
            spec, device = plan.bind(k, args, kwargs, describe)
            lp = state["plans"].get(id(spec))
            if lp is None:
                lp = state["plans"][id(spec)] = plan.launch_plan(k, spec, [])  # no GPU: no loading
            outs = [ToyArray(s, d, device) for s, d in zip(lp.out_shapes, lp.out_dtypes)]
            return outs[0] if len(outs) == 1 else tuple(outs)

        launch.state = state
        return launch

    def launch(self, k, args, kwargs):
        return k.launcher(self.name)(k, args, kwargs)


ToyArray.__module__ = "toyfw"


@pytest.fixture
def toy_plugin(monkeypatch, tmp_path):
    """Install ToyRuntime under the ``pyptx.runtimes`` entry-point group, as a distribution
    would, and start runtime discovery afresh (restored afterwards)."""
    plugin_module = types.ModuleType("toyfw_pyptx_plugin")
    plugin_module.ToyRuntime = ToyRuntime
    monkeypatch.setitem(sys.modules, "toyfw_pyptx_plugin", plugin_module)
    toy_ep = importlib.metadata.EntryPoint(name="toyfw", value="toyfw_pyptx_plugin:ToyRuntime",
                                           group=runtimes.GROUP)
    real = importlib.metadata.entry_points

    def entry_points(**params):
        found = list(real(**params))
        if params.get("group") == runtimes.GROUP:
            found.append(toy_ep)
        return found

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))   # a fresh scan, not a kept one
    monkeypatch.setattr(runtimes, "_entry_points", None)
    monkeypatch.setattr(runtimes, "_loaded", {})
    monkeypatch.setattr(runtimes, "_by_module", {})
    monkeypatch.setattr(runtimes, "_all_loaded", False)
    ToyRuntime.made.clear()
    yield


def build_two_out(name=None):
    @kernel(in_specs=(Tile("B", "N", f32), Tile("N", f32)),
            out_specs=(Tile("B", "N", f32), Tile("B", bf16)), grid=lambda B: (B, 1, 1),
            block=(32, 1, 1), name=name)
    def two_out(X, W, Y, S):
        ptx.ret()

    return two_out


def test_third_runtime_needs_no_core_edit(toy_plugin):
    assert "toyfw" in runtimes.available()
    k = build_two_out()
    y, s = k(ToyArray((4, 64)), ToyArray((64,)))
    assert (y.shape, y.dtype, s.shape, s.dtype) == ((4, 64), "float32", (4,), "bfloat16")
    assert type(runtimes.runtime_for((ToyArray((1,)),))) is ToyRuntime
    (state,) = ToyRuntime.made  # one launcher per kernel, reused by every call
    k(ToyArray((4, 64)), ToyArray((64,)))
    k(ToyArray((8, 64)), ToyArray((64,)))
    assert len(ToyRuntime.made) == 1 and len(state["plans"]) == 2


def test_third_runtime_gets_cores_checks(toy_plugin):
    k = build_two_out()
    with pytest.raises(SpecError, match=r"argument 'X': expected dtype f32 .*got float16$"):
        k(ToyArray((4, 64), "float16"), ToyArray((64,)))
    with pytest.raises(ShapeError, match=r"argument 'W' dim 0 \('N'\): expected 64"):
        k(ToyArray((4, 64)), ToyArray((65,)))
    with pytest.raises(SpecError, match=r"argument 'X' is on cpu; pyptx kernels take CUDA"):
        k(ToyArray((4, 64), device="cpu"), ToyArray((64,), device="cpu"))
    with pytest.raises(SpecError, match=r"'W' is on cuda:1 but 'X' is on cuda:0"):
        k(ToyArray((4, 64)), ToyArray((64,), device="cuda:1"))
    with pytest.raises(SpecError, match=r"argument 'W': expected an array of the same runtime "
                                        r"as the other arguments, got builtins.list"):
        k(ToyArray((4, 64)), [1.0])
    with pytest.raises(SpecError, match=r"takes 2 input tensors \(X, W\), got 1"):
        k(ToyArray((4, 64)))


def test_values_no_runtime_owns_are_refused(toy_plugin):
    k = build_two_out()
    with pytest.raises(SpecError, match=r"installed runtime \(installed: .*toyfw.*got builtins.int"):
        k(1, 2)


def test_launch_state_and_records_die_with_the_kernel(toy_plugin):
    k = build_two_out("only_here")  # a name (so PTX) no other test's kernel shares a record with
    k(ToyArray((4, 64)), ToyArray((64,)))
    (state,) = ToyRuntime.made
    (lp,) = state["plans"].values()
    rec = lp.record
    assert registry.get_cubin_registry().get(rec.handle) is rec
    assert registry.get_cubin_registry().by_key(rec.key) is rec
    key, handle = rec.key, rec.handle
    kernel_ref, record_ref = weakref.ref(k), weakref.ref(rec)
    ToyRuntime.made.clear()
    del k, state, lp, rec
    gc.collect()
    assert kernel_ref() is None and record_ref() is None
    assert registry.get_cubin_registry().by_key(key) is None
    assert registry.get_cubin_registry().get(handle) is None


def test_records_are_shared_by_content_and_keyed_like_the_disk_cache():
    a, b = build_two_out(), build_two_out()
    ra = registry.record_for(a.specialize(B=4, N=64))
    rb = registry.record_for(b.specialize(B=4, N=64))
    rc = registry.record_for(a.specialize(B=8, N=64))
    assert ra is rb and ra is not rc  # two kernels, same content: one record
    assert ra.handle == registry.handle_of_key(ra.key) and ra.handle != rc.handle
    assert ra.grid == (4, 1, 1) and ra.num_pointers == 4 and ra.arch == "sm_90a"
    assert ".entry two_out" in ra.ptx_source and ra.cubin_bytes is None  # not loaded: no GPU
    with pytest.raises(dataclasses.FrozenInstanceError):  # immutable
        ra.grid = (1, 1, 1)


def test_record_key_is_the_same_in_a_fresh_process():
    code = textwrap.dedent("""
        from pyptx import Tile, kernel, ptx, registry
        from pyptx.types import f32, bf16

        @kernel(in_specs=(Tile("B", "N", f32), Tile("N", f32)),
                out_specs=(Tile("B", "N", f32), Tile("B", bf16)), grid=lambda B: (B, 1, 1),
                block=(32, 1, 1))
        def two_out(X, W, Y, S):
            ptx.ret()

        print(registry.record_for(two_out.specialize(B=4, N=64)).key)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == registry.record_for(build_two_out().specialize(B=4, N=64)).key


def test_import_pyptx_reads_no_entry_points():
    code = ("import sys, pyptx; import pyptx.kernel, pyptx.runtimes, pyptx.plan; "
            "print('importlib.metadata' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


def test_a_failed_entry_point_read_is_remembered(monkeypatch, tmp_path):
    calls = []

    def broken(**params):
        calls.append(params)
        raise RuntimeError("metadata exploded")

    monkeypatch.setattr(importlib.metadata, "entry_points", broken)
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtimes, "_entry_points", None)
    monkeypatch.setattr(runtimes, "_discovery_error", None)
    monkeypatch.setattr(runtimes, "_loaded", {})
    monkeypatch.setattr(runtimes, "_by_module", {})
    monkeypatch.setattr(runtimes, "_all_loaded", False)
    assert runtimes.available() == {} and runtimes.available() == {}
    assert len(calls) == 1
    assert "metadata exploded" in runtimes.discovery_error()
    with pytest.raises(pyptx.RuntimeUnavailableError, match="metadata exploded"):
        runtimes.load("torch")


def test_an_entry_point_scan_is_kept_on_disk(monkeypatch, tmp_path):
    calls = []
    real = importlib.metadata.entry_points

    def counting(**params):
        calls.append(params)
        return real(**params)

    monkeypatch.setattr(importlib.metadata, "entry_points", counting)
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    first = runtimes._read_entry_points()
    assert len(calls) == 1 and list(tmp_path.glob("runtimes-*.entry_points.json"))
    again = runtimes._read_entry_points()   # a new process: the kept scan, no metadata read
    assert len(calls) == 1
    assert {n: ep.value for n, ep in again.items()} == {n: ep.value for n, ep in first.items()}
    assert all(ep.group == runtimes.GROUP for ep in again.values())
    folder = tmp_path / "site"          # a sys.path folder changing (a distribution installed)
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    runtimes._read_entry_points()
    assert len(calls) == 2
    (folder / "x.dist-info").mkdir()
    runtimes._read_entry_points()
    assert len(calls) == 3
    monkeypatch.setenv("PYPTX_CACHE_DIR", "off")
    runtimes._read_entry_points()
    assert len(calls) == 4


def test_core_names_no_framework():
    import inspect

    import pyptx.autodiff

    for mod in (runtimes, plan, registry, pyptx.kernel, pyptx.autodiff):
        src = inspect.getsource(mod)
        for word in ('"torch', '"jax', "set_compiling_probe", "fast_launch"):
            assert word not in src, (mod.__name__, word)


def test_dtype_table_maps_bool_like_uint8():
    assert plan.ptx_type_of("bool") is plan.ptx_type_of("uint8")
    assert plan.compatible(plan.ptx_type_of("int32"), plan.ptx_type_of("uint32"))
    assert plan.ptx_type_of("complex64") is None


def test_arch_and_shared_memory_checks():
    from pyptx.errors import LaunchError

    k = build_two_out()
    spec = k.specialize(B=4, N=64)
    plan.check_arch(k, (9, 0), "cuda:0")
    with pytest.raises(LaunchError, match=r"targets sm_90a, but cuda:1 is sm_80"):
        plan.check_arch(k, (8, 0), "cuda:1")
    with pytest.raises(LaunchError, match=r"targets sm_90a, but cuda:0 is sm_100"):
        plan.check_arch(k, (10, 0), "cuda:0")
    plan.check_smem(k, spec, 1024, "cuda:0")
    with pytest.raises(LaunchError, match=r"needs 100 bytes .*cuda:0 allows 99"):
        plan.check_smem(k, types.SimpleNamespace(smem=60, static_smem=40), 99, "cuda:0")


# ---------------------------------------------------------------- records on disk
def build_tma_with_scalar():
    from pyptx.types import u32

    @kernel(in_specs=(Tile("M", "N", f32),), out_specs=(Tile("M", "N", f32),),
            block=(32, 1, 1), tma={"X": dict(box=(32, 8), swizzle=None)}, name="tma_disk")
    def k(X, Y):
        ptx.scalar_param(u32, 7, "n")
        ptx.tma.tensormap_ptr(X.tmap)
        ptx.ret()

    return k


FIND_IN_CHILD = textwrap.dedent("""
    import sys
    from pyptx.registry import find_record
    arg = sys.argv[1]
    rec = find_record(int(arg) if arg.isdigit() else arg)
    if rec is None:
        print("None")
    else:
        print(rec.key, rec.handle, rec.kernel_name, rec.scalar_params[0].hex(),
              rec.tma_specs[0][0], rec.tma_specs[0][1].box_dims, rec.out_shapes)
""")


def test_a_persisted_record_is_found_by_hash_and_handle_in_a_fresh_process(tmp_path, monkeypatch):
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    rec = registry.record_for(build_tma_with_scalar().specialize(M=64, N=128))
    assert registry.persist(rec)
    box = rec.tma_specs[0][1].box_dims  # driver order: innermost dim first
    assert box == (8, 32)
    want = f"{rec.key} {rec.handle} tma_disk 07000000 0 {box} ((64, 128),)"
    for arg in (rec.key, str(rec.handle)):
        out = subprocess.run([sys.executable, "-c", FIND_IN_CHILD, arg], capture_output=True,
                             text=True, check=True).stdout.strip()
        assert out == want


def test_a_record_is_written_once(tmp_path, monkeypatch):
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    rec = registry.record_for(build_tma_with_scalar().specialize(M=64, N=512))
    assert registry.persist(rec)
    (path,) = tmp_path.glob("*.record.json")
    before = path.stat().st_mtime_ns, path.read_bytes()
    path.touch()
    stamped = path.stat().st_mtime_ns
    assert registry.persist(rec)   # a later first load (another process): the file is kept
    assert path.stat().st_mtime_ns == stamped and path.read_bytes() == before[1]


def test_a_record_file_that_does_not_hash_to_its_name_is_ignored(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    rec = registry.record_for(build_tma_with_scalar().specialize(M=64, N=256))
    registry.persist(rec)
    (path,) = tmp_path.glob("*.record.json")
    doc = json.loads(path.read_text())
    doc["grid"] = [2, 1, 1]  # launch config no longer what the hash covers
    path.write_text(json.dumps(doc))
    out = subprocess.run([sys.executable, "-c", FIND_IN_CHILD, rec.key], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "None"
    path.write_text("{ torn")
    out = subprocess.run([sys.executable, "-c", FIND_IN_CHILD, rec.key], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "None"


def test_shim_resolver_is_asked_once_per_unknown_handle():
    native = pytest.importorskip("pyptx_shim").native
    if native is None:
        pytest.skip("the shim extension is not built")
    asked = []
    native.set_resolver(lambda h: asked.append(h) or False)
    try:
        assert native.resolve(4242) is False and asked == [4242]
        native.set_resolver(lambda h: 1 / 0)  # an exception is a miss, not a crash
        assert native.resolve(4243) is False
    finally:
        native.set_resolver(None)
    assert native.resolve(4244) is False and asked == [4242]
