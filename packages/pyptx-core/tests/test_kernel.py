"""@kernel: decorator validation, specialization cache, template params, launch geometry,
metadata, determinism, line info, and that importing pyptx imports no framework."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import pytest

import pyptx
from pyptx import Layout, Tile, ptx, reg, smem
from pyptx.errors import ConfigError, SpecError, TraceError, UnboundDimError
from pyptx.kernel import Specialization, default_version
from pyptx.types import bf16, f32, u32


def here() -> int:
    """The line number of the caller."""
    return inspect.currentframe().f_back.f_lineno


def entry(src: str) -> str:
    return src[src.index(".visible .entry"):]


# ---------------------------------------------------------------- decorator validation

def _nop():
    pass


@pytest.mark.parametrize("kw,needle", [
    ({"grid": (1, 0, 1)}, "grid must be three positive ints (x, y, z), got (1, 0, 1)"),
    ({"grid": (1, 1)}, "grid must be three positive ints (x, y, z), got (1, 1)"),
    ({"grid": (1.0, 1, 1)}, "grid must be three positive ints"),
    ({"grid": 8}, "grid must be three positive ints (x, y, z), got 8"),
    ({"grid": (1, 1, 1, 1)}, "grid must be three positive ints"),
    ({"block": (0, 1, 1)}, "block must be three positive ints"),
    ({"block": (2048, 1, 1)}, "block (2048, 1, 1) exceeds the CUDA limits"),
    ({"block": (1, 1, 65)}, "exceeds the CUDA limits (at most 1024 threads, z <= 64)"),
    ({"cluster": (0, 1, 1)}, "cluster must be three positive ints"),
    ({"cluster": (4, 4, 2)}, "cluster (4, 4, 2) has more than 16 CTAs"),
    ({"cluster": (2, 1, 1), "arch": "sm_80"}, "thread-block clusters need sm_90 or newer"),
    ({"smem": -1}, "smem must be a non-negative int of bytes, got -1"),
    ({"smem": 1.5}, "smem must be a non-negative int of bytes, got 1.5"),
    ({"smem": 300 * 1024}, "exceeds the 232448-byte dynamic shared memory limit"),
    ({"arch": "sm90"}, "arch must look like 'sm_90a' or 'sm_80', got 'sm90'"),
    ({"arch": "compute_90"}, "arch must look like"),
    ({"version": "8"}, "version must look like '8.0', got '8'"),
    ({"name": "my kernel"}, "kernel name must be an identifier, got 'my kernel'"),
])
def test_decorator_config_errors(kw, needle):
    with pytest.raises(ConfigError) as ei:
        line = here() + 1
        pyptx.kernel(**kw)(_nop)
    msg = str(ei.value)
    assert needle in msg
    assert msg.startswith(f"{__file__}:{line}: ")


def test_decorator_spec_errors():
    def two(A, B):
        pass

    def star(*args):
        pass

    def kwargs(A, **kw):
        pass

    def clash(A, *, N):
        pass

    cases = [
        (lambda: pyptx.kernel([Tile(4, f32)])(two), "takes 2 tensor parameters (A, B), but in_specs + out_specs describe 1"),
        (lambda: pyptx.kernel()(star), "may not take *args or **kwargs"),
        (lambda: pyptx.kernel([Tile(4, f32)])(kwargs), "may not take *args or **kwargs"),
        (lambda: pyptx.kernel([Tile("N", f32)])(clash), "['N'] are both template parameters and dims"),
        (lambda: pyptx.kernel([4])(_nop), "in_specs[0] must be a Tile, got 4"),
        (lambda: pyptx.kernel((), [f32])(_nop), "out_specs[0] must be a Tile, got f32"),
        (lambda: pyptx.kernel(5)(_nop), "in_specs must be a sequence of Tile, e.g. "
         "in_specs=(Tile('M', f32),), got int 5"),
        (lambda: pyptx.kernel({Tile(4, f32)})(_nop), "in_specs must be a sequence of Tile"),
        (lambda: pyptx.kernel(Tile(4, f32), Tile(4, f32))(two),
         "in_specs must be a tuple of Tile specs, got the bare spec Tile(4, f32); write "
         "in_specs=(Tile(4, f32),) (note the trailing comma)"),
        (lambda: pyptx.kernel((Tile(4, f32),), out_specs=(Tile(4, f32)))(two),
         "out_specs must be a tuple of Tile specs, got the bare spec"),
    ]
    for make, needle in cases:
        with pytest.raises(SpecError) as ei:
            make()
        assert needle in str(ei.value)
        assert str(ei.value).startswith(__file__ + ":")


def test_decorating_a_non_function():
    with pytest.raises(ConfigError, match="@kernel decorates a function, got 3"):
        pyptx.kernel()(3)


def test_specs_may_be_a_tuple_or_a_list():
    def k(X, Y):
        pass

    k = pyptx.kernel([Tile(4, f32)], (Tile(4, f32),))(k)
    assert k.in_specs == (Tile(4, f32),) and k.out_specs == (Tile(4, f32),)


# ---------------------------------------------------------------- metadata

def test_metadata_properties():
    def grid_fn(M, N):
        return (M // 64, N // 64, 1)

    @pyptx.kernel([Tile("M", "K", bf16), Tile("K", "N", bf16)], [Tile("M", "N", f32)],
                  grid=grid_fn, block=(128, 1, 1), cluster=(2, 1, 1), smem=1024, name="gemm")
    def matmul(A, B, C, *, BM=64, STAGES):
        """Docstring survives."""

    assert isinstance(matmul, pyptx.Kernel)
    assert matmul.in_specs == (Tile("M", "K", bf16), Tile("K", "N", bf16))
    assert matmul.out_specs == (Tile("M", "N", f32),)
    assert matmul.grid is grid_fn
    assert matmul.block == (128, 1, 1)
    assert matmul.cluster == (2, 1, 1)
    assert matmul.smem == 1024
    assert matmul.arch == "sm_90a" and matmul.version == "8.0"
    assert matmul.name == "gemm"
    assert matmul.arg_names == ("A", "B", "C")
    assert matmul.dims == ("M", "K", "N")
    assert matmul.template_params == {"BM": 64, "STAGES": inspect.Parameter.empty}
    assert matmul.__doc__ == "Docstring survives."
    assert matmul.__name__ == "matmul"
    assert matmul.__wrapped__.__name__ == "matmul"
    assert repr(matmul).startswith("<pyptx.Kernel gemm in=[Tile('M', 'K', bf16)")
    # the property is a copy: mutating it does not change the kernel
    matmul.template_params["BM"] = 1
    assert matmul.template_params["BM"] == 64


def test_metadata_defaults():
    k = pyptx.kernel()(_nop)
    assert (k.grid, k.block, k.cluster, k.smem) == ((1, 1, 1), (1, 1, 1), (1, 1, 1), 0)
    assert k.in_specs == () and k.out_specs == () and k.template_params == {}
    assert k.name == "_nop" and k.dims == ()


def test_grid_and_block_accept_any_int_sequence():
    k = pyptx.kernel(grid=[2, 3, 4], block=range(1, 4))(_nop)
    assert k.grid == (2, 3, 4) and k.block == (1, 2, 3)


@pytest.mark.parametrize("arch,version,target", [
    ("sm_90a", "8.0", "sm_90a"), ("sm_90", "8.0", "sm_90"), ("sm_80", "7.8", "sm_80"),
    ("sm_100a", "8.6", "sm_100a"), ("sm_120", "8.7", "sm_120"),
])
def test_arch_and_version(arch, version, target):
    assert default_version(arch) == version
    src = pyptx.kernel(arch=arch)(_nop).ptx()
    assert f"\n.version {version}\n.target {target}\n.address_size 64\n" in src


def test_explicit_version():
    assert ".version 8.4\n" in pyptx.kernel(version="8.4")(_nop).ptx()


def test_entry_signature_and_directives():
    @pyptx.kernel([Tile(4, f32), Tile(4, f32)], [Tile(4, f32)], block=(32, 4, 2),
                  cluster=(2, 2, 1), name="axpy")
    def k(X, W, Y):
        ptx.ret()

    src = k.ptx()
    assert entry(src).startswith(
        ".visible .entry axpy(\n\t.param .u64 X,\n\t.param .u64 W,\n\t.param .u64 Y\n)\n"
        ".reqntid 32, 4, 2\n.reqnctapercluster 2, 2, 1\n{\n"
    )
    assert src.rstrip().endswith("ret;\n}")


# ---------------------------------------------------------------- specialization

def make_counted():
    calls = []

    @pyptx.kernel([Tile("N", f32)], [Tile("N", f32)],
                  grid=lambda N, BLOCK: ((N + BLOCK - 1) // BLOCK, 1, 1),
                  block=lambda BLOCK: (BLOCK, 1, 1), smem=lambda BLOCK, N: BLOCK * 4)
    def scale(X, Y, *, BLOCK=128, ALPHA=2.0):
        calls.append((X.shape, Y.shape, BLOCK, ALPHA))
        x, y = ptx.global_ptrs(X, Y)
        v = reg.scalar(f32, ALPHA)
        ptx.inst.st.global_.f32(ptx.addr(y), v)
        ptx.ret()

    return scale, calls


def test_specialization_cache_identity():
    k, calls = make_counted()
    a = k.specialize(N=1000)
    assert isinstance(a, Specialization)
    assert k.specialize(N=1000) is a
    assert k.specialize(N=1000, BLOCK=128) is a  # the default spelled out is the same key
    assert k.specialize([(1000,)]) is a  # shapes from a runtime bind to the same dims
    assert len(calls) == 1
    b = k.specialize(N=1001)
    c = k.specialize(N=1000, BLOCK=256)
    d = k.specialize(N=1000, ALPHA=3.0)
    assert len({id(a), id(b), id(c), id(d)}) == 4
    assert len(calls) == 4
    k.ptx(N=1000)
    k.ptx(N=1000, lineinfo=True)
    assert len(calls) == 4  # ptx() reuses the specialization, lineinfo or not


def test_specialization_values():
    k, calls = make_counted()
    s = k.specialize(N=1000, BLOCK=256)
    assert calls == [((1000,), (1000,), 256, 2.0)]
    assert s.grid == (4, 1, 1) and s.block == (256, 1, 1) and s.smem == 1024
    assert s.cluster == (1, 1, 1)
    assert s.in_shapes == ((1000,),) and s.out_shapes == ((1000,),)
    assert s.env == {"N": 1000}
    assert s.template_kwargs == {"BLOCK": 256, "ALPHA": 2.0}
    assert s.name == "scale"
    assert s.static_smem == 0 and s.scalar_params == []
    src = s.ptx()
    assert ".reqntid 256, 1, 1" in src
    assert "mov.f32 %f0, 0f40000000;" in src  # the template value is baked into the PTX


def test_specialization_text_is_cached():
    k, _ = make_counted()
    s = k.specialize(N=64)
    assert s.ptx() is s.ptx()
    assert s.emit(True) is s.emit(True)
    assert s.ptx(True) != s.ptx(False)


def test_template_params_are_keyword_only_and_required():
    @pyptx.kernel([Tile("N", f32)])
    def k(X, *, TILE, UNROLL=False):
        pass

    with pytest.raises(SpecError) as ei:
        line = here() + 1
        k.ptx(N=4)
    assert str(ei.value) == f"{__file__}:{line}: k needs template parameter TILE=..."
    assert k.specialize(N=4, TILE=8).template_kwargs == {"TILE": 8, "UNROLL": False}


def test_unknown_keyword_lists_dims_and_templates():
    k, _ = make_counted()
    with pytest.raises(SpecError) as ei:
        k.ptx(N=4, M=5)
    assert "scale got unknown keyword 'M'; dims: N; template parameters: BLOCK, ALPHA" in str(ei.value)


@pytest.mark.parametrize("value", [0, -3, 2.0, True, "4"])
def test_dim_values_must_be_positive_ints(value):
    k, _ = make_counted()
    with pytest.raises(SpecError, match=f"dim 'N' must be a positive int, got {value!r}"):
        k.ptx(N=value)


def test_unhashable_template_value():
    k, _ = make_counted()
    with pytest.raises(SpecError, match="template parameter values must be hashable"):
        k.ptx(N=4, ALPHA=[1.0])


def test_unbound_dim_names_the_dim_and_caller():
    k, _ = make_counted()
    with pytest.raises(UnboundDimError) as ei:
        line = here() + 1
        k.ptx()
    msg = str(ei.value)
    assert msg.startswith(f"{__file__}:{line}: input 'X': dim 'N' has no value")
    # out_specs alone may use a dim no input provides: it must be passed
    @pyptx.kernel([Tile(4, f32)], [Tile("M", f32)])
    def k2(X, Y):
        pass

    with pytest.raises(UnboundDimError, match="output 'Y': dim 'M' has no value"):
        k2.ptx()
    assert k2.specialize(M=7).out_shapes == ((7,),)


def test_shapes_from_a_runtime_are_checked_with_location():
    k, _ = make_counted()
    with pytest.raises(pyptx.ShapeError) as ei:
        line = here() + 1
        k.specialize([(4, 4)])
    assert str(ei.value).startswith(f"{__file__}:{line}: argument 'X': expected rank 1")
    with pytest.raises(pyptx.ShapeError) as ei:
        k.specialize([(4,)], N=5)
    assert "argument 'X' dim 0 ('N'): expected 5 (from keyword argument), got 4" in str(ei.value)
    with pytest.raises(SpecError, match=r"scale takes 1 inputs \(X\), got 2"):
        k.specialize([(4,), (4,)])


def test_callable_geometry_errors():
    def body(X):
        pass

    bad = [
        (dict(grid=lambda N: (N, 1)), "grid must be three positive ints (x, y, z), got"),
        (dict(grid=lambda Q: (1, 1, 1)), "grid callable needs 'Q', which is neither a dim nor a template parameter (have: N)"),
        (dict(block=lambda N: (N * 1024, 1, 1)), "exceeds the CUDA limits"),
        (dict(smem=lambda N: -N), "smem must be a non-negative int of bytes, got -4"),
        (dict(smem=lambda N: "big"), "smem must be a non-negative int of bytes"),
    ]
    for kw, needle in bad:
        line = here() + 1
        k = pyptx.kernel([Tile("N", f32)], **kw)(body)
        with pytest.raises(ConfigError) as ei:
            k.ptx(N=4)
        msg = str(ei.value)
        assert needle in msg
        assert msg.startswith(f"kernel 'body' defined at {__file__}:{line}: ")


def test_callable_grid_with_kwargs_and_defaults():
    seen = {}

    def grid(N, extra=5, **rest):
        seen.update(rest, N=N, extra=extra)
        return (N, 1, 1)

    @pyptx.kernel([Tile("N", f32)], grid=grid)
    def k(X, *, T=3):
        pass

    assert k.specialize(N=7).grid == (7, 1, 1)
    assert seen == {"N": 7, "T": 3, "extra": 5}  # **rest gets everything


# ---------------------------------------------------------------- errors inside the body

def test_python_error_in_body_is_a_trace_error_at_the_user_line():
    @pyptx.kernel()
    def k():
        x = {}
        line.append(here() + 1)
        x["missing"]

    line = []
    with pytest.raises(TraceError) as ei:
        k.ptx()
    msg = str(ei.value)
    assert msg.startswith(f"{__file__}:{line[0]}: tracing kernel 'k' raised KeyError: 'missing'")
    assert isinstance(ei.value.__cause__, KeyError)


def test_failed_trace_is_not_cached():
    state = {"fail": True}

    @pyptx.kernel()
    def k():
        if state["fail"]:
            raise ValueError("first time")
        ptx.ret()

    with pytest.raises(TraceError):
        k.ptx()
    state["fail"] = False
    assert "ret;" in k.ptx()


def test_calling_without_framework_arrays():
    k, _ = make_counted()
    with pytest.raises(SpecError) as ei:
        k([1.0, 2.0])
    msg = str(ei.value)
    assert "launches it on the arrays of an installed runtime" in msg
    assert "got builtins.list" in msg
    assert "kernel.ptx(**dims)" in msg and __file__ in msg


def test_check_dtypes():
    k, _ = make_counted()
    k.check_dtypes([f32])
    with pytest.raises(SpecError, match="argument 'X': expected dtype f32 for Tile\\('N', f32\\), got bf16"):
        k.check_dtypes([bf16])
    with pytest.raises(SpecError, match="got an unsupported dtype"):
        k.check_dtypes([None])
    with pytest.raises(SpecError, match=r"takes 1 inputs \(X\), got 2"):
        k.check_dtypes([f32, f32])


# ---------------------------------------------------------------- determinism

DETERMINISM_SCRIPT = textwrap.dedent("""
    import pyptx
    from pyptx import Tile, ptx, reg, smem
    from pyptx.types import f32, f16, u32, u64, pred, bf16

    @pyptx.kernel([Tile("N", f32)], [Tile("N", f32)], grid=lambda N: (N // 128, 1, 1),
                  block=(128, 1, 1))
    def k(X, Y, *, A=0.5):
        x, y = ptx.global_ptrs(X, Y)
        buf = smem.alloc(f32, 128)
        h = reg.scalar(f16, 1.0)
        b = reg.scalar(bf16, 2.0)
        t = ptx.special.tid.x()
        p = t < 64
        with ptx.if_(p):
            for i in ptx.loop(4):
                h = h + 1.0
        v = reg.scalar(f32, A)
        ptx.inst.st.global_.f32(ptx.addr(y + (t << 2)), v)
        ptx.ret()

    print(k.ptx(N=1024, lineinfo=True), end="")
""")


def test_ptx_is_deterministic(tmp_path):
    k1, _ = make_counted()
    k2, _ = make_counted()
    a = k1.ptx(N=4096, BLOCK=256)
    assert a == k1.ptx(N=4096, BLOCK=256)
    assert a == k2.ptx(N=4096, BLOCK=256)  # a fresh kernel traces to the same bytes
    # and so does a fresh interpreter with a different hash seed
    script = tmp_path / "det.py"
    script.write_text(DETERMINISM_SCRIPT)
    outs = []
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                           check=True)
        outs.append(p.stdout)
    assert outs[0] == outs[1]
    assert ".loc 1 " in outs[0] and "add.f16" in outs[0]


# ---------------------------------------------------------------- line info

def test_statements_remember_their_python_line():
    lines = {}

    @pyptx.kernel(name="li")
    def li():
        lines["a"] = here() + 1
        a = reg.scalar(u32, 1)
        lines["b"] = here() + 1
        a + 2
        lines["c"] = here() + 1
        ptx.ret()

    body = li.specialize().module.functions[0].body
    assert [st.loc for st in body] == [(__file__, lines["a"]), (__file__, lines["b"]),
                                       (__file__, lines["c"])]


def test_lineinfo_file_and_loc(assemble):
    lines = {}

    @pyptx.kernel([Tile(32, f32)], [Tile(32, f32)], block=(32, 1, 1), name="li2")
    def li2(X, Y):
        lines["ptrs"] = here() + 1
        x, y = ptx.global_ptrs(X, Y)
        lines["tid"] = here() + 1
        t = ptx.special.tid.x()
        lines["loop"] = here() + 1
        for _ in ptx.loop(2, unroll=False):
            lines["inner"] = here() + 1
            t += 1
        lines["st"] = here() + 1
        ptx.inst.st.global_.u32(ptx.addr(y), t)
        lines["ret"] = here() + 1
        ptx.ret()

    s = li2.specialize()
    plain = s.ptx()
    assert ".file" not in plain and ".loc" not in plain
    text, locs = s.emit(lineinfo=True)
    out = text.splitlines()
    assert len(locs) == len(out)
    assert f'.file 1 "{__file__}"' in out
    assert out.count(f'.file 1 "{__file__}"') == 1 and not any(ln.startswith(".file 2") for ln in out)
    locs_lines = [ln.strip() for ln in out if ln.strip().startswith(".loc")]
    # one .loc per change of Python line, in program order (the loop increment is on the for line)
    assert locs_lines == [f".loc 1 {lines[k]} 0" for k in ("ptrs", "tid", "loop", "inner", "loop", "st",
                                                                  "ret")]
    # every instruction line maps back to the Python line that emitted it
    start = out.index("{")
    for i, ln in enumerate(out[start:], start):
        if ln.startswith("\t") and not ln.startswith("\t.reg"):
            assert locs[i] is not None and locs[i][0] == __file__, ln
    idx = out.index("\tld.param.u64 %rd0, [X];")
    assert locs[idx] == (__file__, lines["ptrs"])
    assert out[idx - 1] == f"\t.loc 1 {lines['ptrs']} 0"
    st = next(i for i, ln in enumerate(out) if ln.startswith("\tst.global.u32"))
    assert locs[st] == (__file__, lines["st"])
    # header lines map to nothing
    assert locs[out.index(".target sm_90a")] is None
    assemble(text)


def test_emit_without_lineinfo_still_maps_lines():
    line = []

    @pyptx.kernel(name="m")
    def m():
        line.append(here() + 1)
        ptx.ret()

    text, locs = m.specialize().emit()
    out = text.splitlines()
    assert locs[out.index("\tret;")] == (__file__, line[0])


# ---------------------------------------------------------------- import hygiene

def test_import_pyptx_imports_no_framework():
    code = textwrap.dedent("""
        import sys
        import pyptx
        from pyptx import Tile, ptx, reg
        from pyptx.types import f32

        @pyptx.kernel([Tile("N", f32)])
        def k(X):
            ptx.global_ptrs(X)
            ptx.ret()

        k.ptx(N=8)
        bad = sorted(m for m in sys.modules
                     if m.split(".")[0] in ("torch", "jax", "jaxlib", "cuda", "cupy", "numba",
                                            "pyptx_torch", "pyptx_jax"))
        print("LOADED:" + ",".join(bad))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "LOADED:"


def test_layout_is_exported():
    assert pyptx.Layout is Layout and Layout.ROW.value == "row" and Layout.COL.value == "col"
    assert pyptx.smem is smem


# ---------------------------------------------------------------- arch="auto"

class _FakeDriver:
    """An opened driver as ``pyptx.arch.detect_arch`` sees it (``driver.cuda()``)."""


@pytest.fixture
def gpus(monkeypatch):
    """Two fake GPUs: an H100 (9.0) as device 0 and an A100 (8.0) as device 1."""
    from pyptx import driver

    caps = {0: (9, 0), 1: (8, 0)}
    monkeypatch.setattr(driver, "cuda", lambda: _FakeDriver)
    monkeypatch.setattr(driver, "current_device", lambda: None)  # no current context
    monkeypatch.setattr(driver, "device_count", lambda: len(caps))
    monkeypatch.setattr(driver, "device_capability", lambda o: caps[o])
    return caps


@pytest.fixture
def no_gpu(monkeypatch):
    from pyptx import driver

    monkeypatch.setattr(driver, "cuda", lambda: None)
    monkeypatch.setattr(driver, "unavailable_reason", lambda: "cuInit failed (no usable GPU)")


@pytest.mark.parametrize("cap,arch", [((9, 0), "sm_90a"), ((10, 0), "sm_100a"), ((8, 0), "sm_80"),
                                      ((8, 6), "sm_86"), ((8, 9), "sm_89"), ((12, 0), "sm_120")])
def test_arch_of_capability(cap, arch):
    from pyptx.arch import arch_of_capability

    assert arch_of_capability(*cap) == arch


def test_detect_arch_reads_the_device(gpus):
    assert pyptx.detect_arch() == "sm_90a" and pyptx.detect_arch(1) == "sm_80"
    with pytest.raises(pyptx.PyptxError, match=r"expected a device ordinal in 0\.\.1") as ei:
        line = sys._getframe().f_lineno + 1
        pyptx.detect_arch(5)
    assert str(ei.value).startswith(f"{__file__}:{line}:")


def test_detect_arch_without_a_gpu_is_a_pyptx_error(no_gpu):
    from pyptx.errors import RuntimeUnavailableError

    with pytest.raises(RuntimeUnavailableError, match="cannot detect the GPU's arch: cuInit "
                                                      "failed .* arch='sm_90a'") as ei:
        line = sys._getframe().f_lineno + 1
        pyptx.detect_arch()
    assert str(ei.value).startswith(f"{__file__}:{line}:")


def _auto(**kw):
    @pyptx.kernel((Tile("N", f32),), (Tile("N", f32),), block=(32, 1, 1), arch="auto", **kw)
    def k(X, Y):
        ptx.ret()

    return k


def _info(device, n=4):
    from pyptx.plan import ArgInfo

    return ArgInfo((n,), "float32", device)


def _targets(text):
    return [ln for ln in text.splitlines() if ln.startswith((".version", ".target"))]


def test_auto_arch_traces_for_sm_90a_before_a_launch(no_gpu):
    k = _auto()
    assert k.arch == "sm_90a" and k.arch_auto
    assert _targets(k.ptx(N=4)) == [".version 8.0", ".target sm_90a"]
    assert _targets(k.ptx(N=4, arch="sm_80")) == [".version 7.8", ".target sm_80"]
    assert _targets(k.ptx(N=4, arch="sm_100a")) == [".version 8.6", ".target sm_100a"]
    assert k.specialize(N=4, arch="sm_80").arch == "sm_80" and k.specialize(N=4).arch == "sm_90a"


def test_auto_arch_resolves_from_the_launching_device(gpus):
    from pyptx.plan import bind

    k = _auto()
    spec, device = bind(k, [_info("cuda:1")], {}, lambda a: a)
    assert device == "cuda:1" and spec.arch == "sm_80" and k.arch == "sm_80"
    assert not k.arch_auto and ".target sm_80" in spec.ptx()
    spec, _ = bind(k, [_info("cuda:0", 8)], {}, lambda a: a)  # fixed at the first launch
    assert spec.arch == "sm_80"


def test_auto_arch_without_a_gpu_keeps_sm_90a(no_gpu):
    from pyptx.plan import bind

    k = _auto()
    with pytest.raises(pyptx.SpecError, match="is on cpu"):
        bind(k, [_info("cpu")], {}, lambda a: a)
    assert k.resolve_arch(0) == "sm_90a" and k.arch_auto


def test_auto_arch_checks_launch_options_against_the_resolved_arch(gpus):
    from pyptx.plan import bind

    k = _auto(pdl=True)  # fine for the sm_90a default
    assert "griddepcontrol.wait" in k.ptx(N=4)
    with pytest.raises(ConfigError, match=r"arch='auto' resolved to sm_80\): pdl "
                                          r"\(griddepcontrol\) needs sm_90") as ei:
        line = sys._getframe().f_lineno + 1
        bind(k, [_info("cuda:1")], {}, lambda a: a)
    assert str(ei.value).startswith(f"{__file__}:{line}:")
    with pytest.raises(ConfigError, match="clusters need sm_90 or newer, arch is sm_80"):
        _auto(cluster=(2, 1, 1), grid=(2, 1, 1)).ptx(N=4, arch="sm_80")
    with pytest.raises(ConfigError, match="arch must look like 'sm_90a'"):
        _auto().ptx(N=4, arch="hopper")
