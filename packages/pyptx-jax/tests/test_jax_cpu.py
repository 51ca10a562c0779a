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
