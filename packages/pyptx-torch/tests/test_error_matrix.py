"""The same mistakes through torch and JAX give the same error class and message.

Core (``pyptx.plan``) does every check; the plugins only describe their arrays.
Torch runs with fake CUDA tensors (or real CPU ones), JAX inside ``jax.jit`` tracing
(or with real CPU arrays), so all of this runs on a CPU machine.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from pyptx import Tile, kernel, plan, ptx  # noqa: E402
from pyptx.errors import PyptxError, ShapeError, SpecError  # noqa: E402
from pyptx.types import bf16, f32, u8  # noqa: E402


@kernel(in_specs=(Tile("B", "N", f32), Tile("N", f32)),
        out_specs=(Tile("B", "N", f32), Tile("B", bf16)), grid=lambda B: (B, 1, 1),
        block=(32, 1, 1))
def two_in(X, W, Y, S):
    ptx.ret()


@kernel(in_specs=(Tile("M", "K", f32), Tile("K", "N", f32)), out_specs=(Tile("M", "N", f32),),
        block=(32, 1, 1))
def mm(A, B, C):
    ptx.ret()


@kernel(in_specs=(Tile("N", u8),), out_specs=(Tile("N", u8),), block=(32, 1, 1))
def bytes_in(X, Y):
    ptx.ret()


def arr(*shape, dtype="float32"):
    """An array argument: built as a torch tensor or a JAX array by each runner."""
    return ("array", tuple(shape), dtype)


def call(k, args):
    return k(*args)  # one line for both frameworks: every message names it


def torch_error(k, spec, device="cuda"):
    """(class, message) of ``k`` on torch tensors (fake CUDA ones unless ``device``)."""
    mode = FakeTensorMode() if device == "cuda" else nullcontext()
    with mode:
        args = [torch.empty(a[1], dtype=getattr(torch, a[2]), device=device)
                if isinstance(a, tuple) and a[:1] == ("array",) else a for a in spec]
        with pytest.raises(PyptxError) as ei:
            call(k, args)
    return type(ei.value), str(ei.value)


def jax_error(k, spec, device="cuda"):
    """(class, message) of ``k`` on JAX arrays: traced under jit, or real CPU arrays."""
    is_array = [isinstance(a, tuple) and a[:1] == ("array",) for a in spec]
    with pytest.raises(PyptxError) as ei:
        if device == "cpu":
            call(k, [jnp.zeros(a[1], jnp.dtype(a[2])) if isa else a
                     for a, isa in zip(spec, is_array)])
        else:
            def f(*arrays):
                it = iter(arrays)
                return call(k, [next(it) if isa else a for a, isa in zip(spec, is_array)])

            structs = [jax.ShapeDtypeStruct(a[1], jnp.dtype(a[2]))
                       for a, isa in zip(spec, is_array) if isa]
            jax.jit(f).trace(*structs)
    return type(ei.value), str(ei.value)


MISTAKES = [
    # (name, kernel, arguments, device, expected class, expected message tail)
    ("too few inputs", two_in, [arr(4, 64)], "cuda", SpecError,
     "two_in takes 2 input tensors (X, W), got 1"),
    ("too many inputs", two_in, [arr(4, 64), arr(64), arr(64)], "cuda", SpecError,
     "two_in takes 2 input tensors (X, W), got 3"),
    ("not an array", two_in, [arr(4, 64), [1.0] * 64], "cuda", SpecError,
     "argument 'W': expected an array of the same runtime as the other arguments, "
     "got builtins.list"),
    ("wrong dtype", two_in, [arr(4, 64, dtype="float16"), arr(64)], "cuda", SpecError,
     "argument 'X': expected dtype f32 for Tile('B', 'N', f32), got float16"),
    ("int for float", two_in, [arr(4, 64), arr(64, dtype="int32")], "cuda", SpecError,
     "argument 'W': expected dtype f32 for Tile('N', f32), got int32"),
    ("wrong rank", two_in, [arr(4, 64, 1), arr(64)], "cuda", ShapeError,
     "argument 'X': expected rank 2 for Tile('B', 'N', f32), got shape (4, 64, 1)"),
    ("dim disagrees", two_in, [arr(4, 64), arr(65)], "cuda", ShapeError,
     "argument 'W' dim 0 ('N'): expected 64"),
    ("inner dims disagree", mm, [arr(8, 16), arr(17, 4)], "cuda", ShapeError,
     "argument 'B' dim 0 ('K'): expected 16"),
    ("on the CPU", two_in, [arr(4, 64), arr(64)], "cpu", SpecError,
     "argument 'X' is on cpu; pyptx kernels take CUDA tensors and GPU arrays "
     "(move it to a CUDA device)"),
]


@pytest.mark.parametrize("name,k,spec,device,cls,tail", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_same_mistake_same_error(name, k, spec, device, cls, tail):
    t_cls, t_msg = torch_error(k, spec, device)
    j_cls, j_msg = jax_error(k, spec, device)
    assert (t_cls, t_msg) == (j_cls, j_msg)
    assert t_cls is cls
    assert t_msg.startswith(f"{__file__}:") and tail in t_msg, t_msg


def test_bool_fits_a_byte_tile_from_both():
    with FakeTensorMode():
        t = torch.empty(8, dtype=torch.bool, device="cuda")
        (info,) = plan.check_args(bytes_in, [t], _torch_describe())
    assert info.dtype == "bool"
    out = jax.jit(lambda x: bytes_in(x)).trace(jax.ShapeDtypeStruct((8,), jnp.bool_))
    assert out.out_info.dtype == jnp.uint8
    with FakeTensorMode(), pytest.raises(SpecError,
                                         match=r"expected dtype u8 for Tile\('N', u8\), got float32"):
        plan.check_args(bytes_in, [torch.empty(8, device="cuda")], _torch_describe())


def _torch_describe():
    from pyptx_torch.eager import describe

    return describe
