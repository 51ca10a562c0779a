"""The JAX runtime without a GPU: lowering to the pyptx_launch custom call, bad input at
trace time, the mock FFI hook, and the public facade."""

from __future__ import annotations

import re

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import pyptx.jax_support as js  # noqa: E402
import pyptx_jax  # noqa: E402
from pyptx import Tile, kernel, ptx  # noqa: E402
from pyptx.errors import ShapeError, SpecError  # noqa: E402
from pyptx.registry import get_cubin_registry  # noqa: E402
from pyptx.types import bf16, f32  # noqa: E402


def make_kernel():
    @kernel(in_specs=(Tile("B", "N", f32), Tile("N", f32)),
            out_specs=(Tile("B", "N", f32), Tile("B", bf16)), grid=lambda B: (B, 1, 1),
            block=(32, 1, 1))
    def two_out(X, W, Y, S):
        ptx.ret()

    return two_out


def lowered_text(k, *shapes):
    args = [jax.ShapeDtypeStruct(s, d) for s, d in shapes]
    traced = jax.jit(lambda *a: k(*a)).trace(*args)
    return traced.lower(lowering_platforms=("cuda",)).as_text()


def test_lowers_to_pyptx_launch_with_handle_and_result_types():
    k = make_kernel()
    text = lowered_text(k, ((16, 512), jnp.float32), ((512,), jnp.float32))
    calls = re.findall(r"custom_call @pyptx_launch\((.*?)\).*", text)
    assert len(calls) == 1, text
    line = next(ln for ln in text.splitlines() if "@pyptx_launch" in ln)
    handle = int(re.search(r"cubin_handle = (\d+) : ui64", line).group(1))
    rec = get_cubin_registry().get(handle)
    assert rec is not None and rec.kernel_name == "two_out"
    assert ".entry two_out" in rec.ptx_source and rec.grid == (16, 1, 1)
    assert "mhlo.backend_config = {cubin_handle" in line  # typed FFI: attrs as a dictionary
    assert "tensor<16x512xf32>, tensor<16xbf16>" in line
    assert line.count("tensor<512xf32>") == 1


def test_same_specialization_reuses_handle_new_shape_gets_new_one():
    k = make_kernel()
    a = lowered_text(k, ((4, 64), jnp.float32), ((64,), jnp.float32))
    b = lowered_text(k, ((4, 64), jnp.float32), ((64,), jnp.float32))
    c = lowered_text(k, ((8, 64), jnp.float32), ((64,), jnp.float32))
    h = [re.search(r"cubin_handle = (\d+)", t).group(1) for t in (a, b, c)]
    assert h[0] == h[1] != h[2]


def test_composes_with_jnp_ops_in_one_jit():
    k = make_kernel()
    args = [jax.ShapeDtypeStruct((4, 64), jnp.float32), jax.ShapeDtypeStruct((64,), jnp.float32)]

    def f(x, w):
        y, s = k(jnp.tanh(x), w * 2)
        y2, _ = k(y, w)
        return y2.sum() + s.astype(jnp.float32).sum()

    text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("@pyptx_launch") == 2 and "tanh" in text


@pytest.mark.parametrize("bad,err,match", [
    (lambda: ((4, 64), jnp.float16), SpecError, r"argument 'X': expected dtype f32"),
    (lambda: ((4, 65), jnp.float32), ShapeError, r"argument 'W' dim 0 \('N'\): expected 65"),
    (lambda: ((4, 64, 1), jnp.float32), ShapeError, r"argument 'X': expected rank 2"),
])
def test_bad_input_raises_at_trace_time_naming_argument(bad, err, match):
    k = make_kernel()
    with pytest.raises(err, match=match):
        lowered_text(k, bad(), ((64,), jnp.float32))


def test_wrong_arity_inside_jit():
    k = make_kernel()
    with pytest.raises(SpecError, match=r"takes 2 input tensors \(X, W\), got 1"):
        jax.jit(lambda x: k(x)).trace(jax.ShapeDtypeStruct((4, 64), jnp.float32))


def test_cpu_arrays_are_refused_outside_jit():
    k = make_kernel()
    with pytest.raises(SpecError, match=r"argument .X. is on cpu; pyptx kernels take CUDA tensors and GPU arrays"):
        k(jnp.ones((4, 64)), jnp.ones(64))


def test_mock_ffi_callback_replaces_the_launch():
    k = make_kernel()
    seen = {}

    def mock(x, w, *, cubin_handle, result_types):
        seen["handle"] = cubin_handle
        y_t, s_t = result_types
        return (x * w).astype(y_t.dtype), jnp.zeros(s_t.shape, s_t.dtype)

    pyptx_jax.set_mock_ffi_callback(mock)
    try:
        x, w = jnp.arange(8.0).reshape(2, 4), jnp.full((4,), 3.0)
        y, s = jax.jit(lambda x, w: k(x, w))(x, w)
    finally:
        pyptx_jax.set_mock_ffi_callback(None)
    assert jnp.array_equal(y, x * 3.0) and s.shape == (2,) and s.dtype == jnp.bfloat16
    assert get_cubin_registry().get(seen["handle"]).kernel_name == "two_out"


def test_ensure_ffi_registered_never_raises():
    assert js.ensure_ffi_registered() in (True, False)


def test_facade_reexports_core_and_plugin():
    import pyptx.jit
    import pyptx.launch
    import pyptx.registry

    assert js.call_kernel_via_ffi is pyptx_jax.call_kernel_via_ffi
    assert js.compile_ptx_to_cubin is pyptx.jit.compile_ptx_to_cubin
    assert js.get_cubin_registry is pyptx.registry.get_cubin_registry
    assert js.register_launch_config is pyptx.launch.register_launch_config
    import pyptx.tma

    assert js.synthesize_tma_descriptor is pyptx.tma.synthesize_tma_descriptor
    assert js.synthesize_tma_descriptor_3d is pyptx.tma.synthesize_tma_descriptor_3d
    for name in js.__all__:
        assert hasattr(js, name), name


def test_compile_without_a_driver_returns_none_and_with_one_refuses_ptx_without_entry():
    from pyptx import driver
    from pyptx.errors import CompileError

    if driver.cuda() is None:
        assert js.compile_ptx_to_cubin("// no entry", "sm_90a") is None
    else:
        with pytest.raises(CompileError, match="no .entry"):
            js.compile_ptx_to_cubin("// no entry", "sm_90a")


# ---------------------------------------------------------------- differentiable_kernel, vmap
def build_mul_pair():
    """y = a * b and its backward (a, b, dy) -> (dy * b, dy * a); bodies are placeholders:
    these tests check the wiring (with the mock launcher), not the PTX."""

    @kernel(in_specs=(Tile("N", f32), Tile("N", f32)), out_specs=(Tile("N", f32),),
            block=(32, 1, 1))
    def mul(A, B, Y):
        ptx.ret()

    @kernel(in_specs=(Tile("N", f32),) * 3, out_specs=(Tile("N", f32),) * 2, block=(32, 1, 1))
    def mul_bwd(A, B, DY, DA, DB):
        ptx.ret()

    return mul, mul_bwd


def mul_mock(*inputs, cubin_handle, result_types):
    """What the two kernels compute, in jnp: the launch replaced by the test hook."""
    name = get_cubin_registry().get(cubin_handle).kernel_name
    if name == "mul":
        a, b = inputs
        return a * b
    a, b, dy = inputs
    return dy * b, dy * a


def test_differentiable_kernel_is_one_object_for_torch_and_jax():
    import pyptx

    assert pyptx.differentiable_kernel is js.differentiable_kernel
    assert pyptx.differentiable_kernel is pyptx_jax.differentiable_kernel
    fwd, bwd = build_mul_pair()
    op = pyptx.differentiable_kernel(fwd, bwd, save_for_backward=[0, 1])
    assert op.saved == (0, 1) and op.num_grad_inputs == 2 and op.__name__ == "mul"


def test_jax_grad_runs_the_backward_kernel():
    import pyptx

    fwd, bwd = build_mul_pair()
    op = pyptx.differentiable_kernel(fwd, bwd, save_for_backward=[0, 1])
    a = jnp.arange(1.0, 9.0)
    b = jnp.linspace(-2.0, 2.0, 8)
    g = jnp.linspace(0.5, 1.5, 8)
    pyptx_jax.set_mock_ffi_callback(mul_mock)
    try:
        da, db = jax.jit(jax.grad(lambda a, b: (op(a, b) * g).sum(), argnums=(0, 1)))(a, b)

        @jax.jit
        def y_and_vjp(a, b, g):
            y, vjp = jax.vjp(op, a, b)
            return y, *vjp(g)

        y, va, vb = y_and_vjp(a, b, g)
    finally:
        pyptx_jax.set_mock_ffi_callback(None)
    assert jnp.allclose(da, g * b) and jnp.allclose(db, g * a)
    assert jnp.allclose(y, a * b) and jnp.allclose(va, g * b) and jnp.allclose(vb, g * a)


def test_jax_grad_lowers_to_the_forward_and_backward_custom_calls():
    import pyptx

    fwd, bwd = build_mul_pair()
    op = pyptx.differentiable_kernel(fwd, bwd, save_for_backward=[0, 1])
    spec = jax.ShapeDtypeStruct((64,), jnp.float32)
    text = (jax.jit(jax.value_and_grad(lambda a, b: op(a, b).sum())).trace(spec, spec)
            .lower(lowering_platforms=("cuda",)).as_text())
    handles = [int(h) for h in re.findall(r"cubin_handle = (\d+) : ui64", text)]
    assert [get_cubin_registry().get(h).kernel_name for h in handles] == ["mul", "mul_bwd"]
    with pytest.raises(Exception, match="cannot be differentiated"):  # a plain kernel is not
        jax.jit(jax.grad(lambda a, b: fwd(a, b).sum())).trace(spec, spec).lower(
            lowering_platforms=("cuda",))


def test_non_differentiable_inputs_get_zero_cotangents():
    import pyptx

    @kernel(in_specs=(Tile("N", f32), Tile("N", f32)), out_specs=(Tile("N", f32),),
            block=(32, 1, 1))
    def mul(A, B, Y):
        ptx.ret()

    @kernel(in_specs=(Tile("N", f32), Tile("N", f32)), out_specs=(Tile("N", f32),),
            block=(32, 1, 1))
    def mul_bwd(B, DY, DA):
        ptx.ret()

    def mock(*inputs, cubin_handle, result_types):
        return inputs[0] * inputs[1]  # mul: a * b; mul_bwd: b * dy

    op = pyptx.differentiable_kernel(mul, mul_bwd, save_for_backward=[1], num_grad_inputs=1)
    a, b = jnp.arange(4.0), jnp.full(4, 3.0)
    pyptx_jax.set_mock_ffi_callback(mock)
    try:
        da, db = jax.jit(jax.grad(lambda a, b: op(a, b).sum(), argnums=(0, 1)))(a, b)
    finally:
        pyptx_jax.set_mock_ffi_callback(None)
    assert jnp.array_equal(da, b) and jnp.array_equal(db, jnp.zeros(4))


def test_vmap_batches_sequentially_one_launch_per_element():
    """The documented jax.vmap rule: a kernel call under vmap becomes a loop over the batch
    whose body launches the kernel on one element (its specialization is per element)."""
    k = make_kernel()
    xs = jax.ShapeDtypeStruct((3, 4, 64), jnp.float32)
    w = jax.ShapeDtypeStruct((64,), jnp.float32)
    text = (jax.jit(jax.vmap(k, in_axes=(0, None))).trace(xs, w)
            .lower(lowering_platforms=("cuda",)).as_text())
    assert "stablehlo.while" in text and text.count("@pyptx_launch") == 1
    line = next(ln for ln in text.splitlines() if "@pyptx_launch" in ln)
    assert "tensor<4x64xf32>, tensor<64xf32>" in line  # one batch element per launch
    out = jax.eval_shape(jax.vmap(k, in_axes=(0, None)), xs, w)
    assert out[0].shape == (3, 4, 64) and out[1].shape == (3, 4)


# ---------------------------------------------------------------- identity across processes
def test_exported_program_names_the_kernel_by_content_hash(tmp_path, monkeypatch):
    """jax.export carries the handle derived from the record's content hash; a fresh process
    finds that record in the disk cache (the GPU test runs the program there)."""
    import subprocess
    import sys

    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path / "cache"))
    k = make_kernel()
    f = jax.jit(lambda x, w: k(jnp.tanh(x), w))
    exp = jax.export.export(
        f, platforms=["cuda"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("pyptx_launch")],
    )(jax.ShapeDtypeStruct((4, 64), jnp.float32), jax.ShapeDtypeStruct((64,), jnp.float32))
    # The serialized program where jax can write it (it needs flatbuffers), else its module text.
    try:
        import flatbuffers  # noqa: F401

        blob, load = exp.serialize(), ("jax.export.deserialize(bytearray(data))"
                                       ".mlir_module()")
    except ImportError:
        blob, load = exp.mlir_module().encode(), "data.decode()"
    path = tmp_path / "f.jax"
    path.write_bytes(blob)
    rec = k.specialize(B=4, N=64).record
    code = (
        "import re, sys, jax\n"
        "from pyptx.registry import find_record\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        f"text = {load}\n"
        "h = int(re.search(r'cubin_handle = (\\d+) : ui64', text).group(1))\n"
        "rec = find_record(h)\n"
        "print(h, rec.key if rec else None, rec.kernel_name if rec else None)\n"
    )
    run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(rec.handle), rec.key, "two_out"]
    env = {**__import__("os").environ, "PYPTX_CACHE_DIR": str(tmp_path / "empty")}
    run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(rec.handle), "None", "None"]


def test_geometry_given_beside_a_handle_is_checked_not_ignored():
    from pyptx.errors import LaunchError

    k = make_kernel()
    lowered_text(k, ((4, 64), jnp.float32), ((64,), jnp.float32))
    rec = k.specialize(B=4, N=64).record
    x, w = jnp.ones((4, 64)), jnp.ones(64)
    common = dict(cubin_handle=rec.handle, out_specs=k.out_specs, out_shape_env={"B": 4, "N": 64})
    with pytest.raises(LaunchError, match=r"registered with grid=\(4, 1, 1\), got grid=\(8, 1, 1\)"):
        js.call_kernel_via_ffi(x, w, grid=(8, 1, 1), block=(32, 1, 1), **common)
    with pytest.raises(LaunchError, match=r"registered with cluster=\(1, 1, 1\), got cluster="):
        js.call_kernel_via_ffi(x, w, grid=(4, 1, 1), block=(32, 1, 1), cluster=(2, 1, 1),
                               **common)
    with pytest.raises(LaunchError, match="no registered kernel has handle 12345"):
        js.call_kernel_via_ffi(x, w, **{**common, "cubin_handle": 12345}, grid=(4, 1, 1),
                               block=(32, 1, 1))


def test_tensor_maps_travel_by_value_so_a_device_copy_is_refused():
    from pyptx.errors import LaunchError

    with pytest.raises(LaunchError, match="device_blob_ptr must be 0, got 0x1000"):
        js.add_tma_spec_to_shim(1, 0, bytes(128), 0x1000)


def test_save_outputs_reach_the_backward_kernel_as_residuals():
    """``save_outputs``: y = exp(a) with backward (y, dy) -> dy * y, the saved output being
    the only residual; jax.grad must pass the forward's y to the backward kernel."""
    import pyptx

    @kernel(in_specs=(Tile("N", f32),), out_specs=(Tile("N", f32), Tile("N", f32)),
            block=(32, 1, 1))
    def expo(A, Y, Z):
        ptx.ret()

    @kernel(in_specs=(Tile("N", f32),) * 3, out_specs=(Tile("N", f32),), block=(32, 1, 1))
    def expo_bwd(Y, DY, DZ, DA):
        ptx.ret()

    def mock(*inputs, cubin_handle, result_types):
        if get_cubin_registry().get(cubin_handle).kernel_name == "expo":
            return jnp.exp(inputs[0]), jnp.zeros_like(inputs[0])
        y, dy, dz = inputs
        return dy * y + dz

    op = pyptx.differentiable_kernel(expo, expo_bwd, save_for_backward=[], save_outputs=[0])
    assert op.saved == () and op.saved_outputs == (0,)
    a = jnp.linspace(-1.0, 1.0, 8)
    pyptx_jax.set_mock_ffi_callback(mock)
    try:
        da = jax.jit(jax.grad(lambda a: (op(a)[0] * 3.0).sum()))(a)
    finally:
        pyptx_jax.set_mock_ffi_callback(None)
    assert jnp.allclose(da, 3.0 * jnp.exp(a))
