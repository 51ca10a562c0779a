"""CPU tests of the public functional API (``pyptx_kernels.matmul`` ... ``swiglu``).

* ``import pyptx_kernels`` imports neither torch, JAX nor a kernel module;
* every function's bad input raises a ``PyptxError`` naming this file's calling line;
* ``pyptx_kernels.ptx`` traces each function's kernels for CPU and meta tensors (no launch),
  and one kernel per op assembles with ptxas;
* the torch custom ops' autograd wiring: the launches (``gemm.api._mm``, ``rows.api._rms_norm``,
  ...) are swapped for float64 models of what the kernels compute, so the flattening of
  leading dims, the ops' dispatch and each backward op's layouts are checked against torch's
  own ops in float64, forward and backward. Softmax's and SwiGLU's backward ops are torch
  code (no backward kernel) and run as they are.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from pyptx.errors import PyptxError

torch = pytest.importorskip("torch")

import pyptx_kernels as pk  # noqa: E402
from pyptx_kernels import _common  # noqa: E402
from pyptx_kernels.gemm import api as gemm_api  # noqa: E402
from pyptx_kernels.grouped_gemm import api as grouped_api  # noqa: E402
from pyptx_kernels.rows import api as rows_api  # noqa: E402

BF, F32, F16 = torch.bfloat16, torch.float32, torch.float16
I32, I64 = torch.int32, torch.int64
E4M3 = torch.float8_e4m3fn
FUNCTIONS = ["matmul", "linear", "grouped_mm", "scaled_mm", "scaled_mm_blockwise", "attention",
             "attention_varlen", "rms_norm", "layer_norm", "softmax", "swiglu", "ptx",
             "swiglu_linear", "linear_residual", "pack_gated", "attention_with_kvcache",
             "add_rms_norm", "apply_rotary", "linear_cross_entropy", "tune", "precompile"]


def test_import_is_cheap():
    code = ("import sys, pyptx_kernels as pk\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'jax', 'cuda')\n"
            "       or m.startswith('pyptx_kernels.')]\n"
            "assert not bad, bad\n"
            f"assert set({FUNCTIONS!r}) | {{'nn', 'transformers'}} <= set(pk.__all__)\n"
            "assert set(pk.__all__) <= set(dir(pk))\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ops_are_defined_at_first_use():
    code = ("import torch, pyptx_kernels as pk\n"
            "assert not hasattr(torch.ops.pyptx, 'rms_norm')\n"
            "x = torch.empty(4, 64, dtype=torch.bfloat16, device='meta')\n"
            "assert pk.rms_norm(x, x[0]).shape == (4, 64)\n"
            "assert hasattr(torch.ops.pyptx, 'rms_norm_backward')\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_name():
    with pytest.raises(AttributeError):
        pk.no_such_function  # noqa: B018


def meta(*shape, dtype=BF):
    return torch.empty(*shape, dtype=dtype, device="meta")


def cpu(*shape, dtype=BF):
    return torch.randn(*shape).to(dtype)


def expect_error(fn, *args, match="", **kwargs):
    """``fn(*args, **kwargs)`` raises a PyptxError that names this file's calling line."""
    with pytest.raises(PyptxError, match=match) as info:
        line = sys._getframe().f_lineno + 1
        fn(*args, **kwargs)
    assert str(info.value).startswith(f"{__file__}:{line}: "), str(info.value)


OFFS = torch.tensor([3, 8], dtype=torch.int32, device="meta")
BAD = {
    "matmul 1-d b": (pk.matmul, (meta(4, 8), meta(8)), {}, "b \\(K, N\\)"),
    "matmul inner": (pk.matmul, (meta(2, 3, 8), meta(16, 32)), {}, "inner dimensions"),
    "matmul f32": (pk.matmul, (meta(4, 8, dtype=F32), meta(8, 16, dtype=F32)), {}, "bfloat16"),
    "matmul mixed": (pk.matmul, (meta(4, 8), meta(8, 16, dtype=torch.float16)), {}, "bfloat16"),
    "matmul bias": (pk.matmul, (meta(4, 8), meta(8, 16)), {"bias": meta(8)}, "bias"),
    "matmul out": (pk.matmul, (meta(4, 8), meta(8, 16)), {"out_dtype": "f64"}, "out_dtype"),
    "matmul cpu": (pk.matmul, (cpu(4, 8), cpu(8, 16)), {}, "CUDA"),
    "matmul devices": (pk.matmul, (cpu(4, 8), meta(8, 16)), {}, "different devices"),
    "linear weight": (pk.linear, (meta(2, 5, 8), meta(16, 4)), {}, "inner dimensions"),
    "linear bias": (pk.linear, (meta(5, 8), meta(16, 8), meta(8)), {}, "bias"),
    "grouped rank": (pk.grouped_mm, (meta(2, 4, 8), meta(2, 8, 16), OFFS), {}, "a \\(M, K\\)"),
    "grouped offs": (pk.grouped_mm, (meta(8, 8), meta(2, 8, 16), OFFS.long()), {}, "int32"),
    "grouped groups": (pk.grouped_mm, (meta(8, 8), meta(3, 8, 16), OFFS), {}, "groups"),
    "grouped dtype": (pk.grouped_mm, (meta(8, 8), meta(2, 8, 16, dtype=F32), OFFS), {}, "b must"),
    "grouped cpu": (pk.grouped_mm, (cpu(8, 8), cpu(2, 8, 16), torch.tensor([3, 8], dtype=torch.int32)), {}, "CUDA"),
    "scaled dtype": (pk.scaled_mm, (meta(4, 32), meta(32, 16, dtype=E4M3), meta(1, dtype=F32),
                                    meta(1, dtype=F32)), {}, "float8"),
    "scaled scales": (pk.scaled_mm, (meta(4, 32, dtype=E4M3), meta(32, 16, dtype=E4M3),
                                     meta(4, 1, dtype=F32), meta(16, 1, dtype=F32)), {}, "row"),
    "scaled scale dtype": (pk.scaled_mm, (meta(4, 32, dtype=E4M3), meta(32, 16, dtype=E4M3),
                                          meta(1), meta(1)), {}, "float32"),
    "scaled out": (pk.scaled_mm, (meta(4, 32, dtype=E4M3), meta(32, 16, dtype=E4M3),
                                  meta(1, dtype=F32), meta(1, dtype=F32)),
                   {"out_dtype": torch.float16}, "out_dtype"),
    "scaled grad": (pk.scaled_mm, (meta(4, 32, dtype=E4M3), meta(32, 16, dtype=E4M3),
                                   meta(1, dtype=F32).requires_grad_(), meta(1, dtype=F32)), {},
                    "not differentiable"),
    "blockwise scales": (pk.scaled_mm_blockwise, (meta(4, 256, dtype=E4M3),
                                                  meta(256, 16, dtype=E4M3), meta(4, 1, dtype=F32),
                                                  meta(1, 2, dtype=F32)), {}, "blocks"),
    "rms_norm weight": (pk.rms_norm, (meta(2, 3, 64), meta(32)), {}, "\\(64,\\)"),
    "rms_norm f16": (pk.rms_norm, (meta(2, 64, dtype=torch.float16), meta(64)), {}, "float32"),
    "rms_norm mixed": (pk.rms_norm, (meta(2, 64), meta(64, dtype=F32)), {}, "dtype"),
    "rms_norm long": (pk.rms_norm, (meta(2, 40000), meta(40000)), {}, "at most"),
    "rms_norm grad long": (pk.rms_norm, (meta(2, 10000).requires_grad_(), meta(10000)), {},
                           "backward"),
    "rms_norm cpu": (pk.rms_norm, (cpu(2, 64), cpu(64)), {}, "CUDA"),
    "layer_norm bias": (pk.layer_norm, (meta(2, 64), meta(64), meta(63)), {}, "bias"),
    "softmax dim": (pk.softmax, (meta(2, 64),), {"dim": 0}, "last dimension"),
    "swiglu shapes": (pk.swiglu, (meta(2, 64), meta(2, 32)), {}, "same shape"),
    "swiglu cpu": (pk.swiglu, (cpu(2, 64), cpu(2, 64)), {}, "CUDA"),
    "ptx not a kernel function": (pk.ptx, (len, meta(2)), {}, "not a pyptx_kernels"),
    "add_rms_norm shapes": (pk.add_rms_norm, (meta(2, 64), meta(2, 32), meta(64)), {}, "same shape"),
    "add_rms_norm weight": (pk.add_rms_norm, (meta(2, 64), meta(2, 64), meta(32)), {}, "\\(64,\\)"),
    "add_rms_norm f16": (pk.add_rms_norm, (meta(2, 64, dtype=F16), meta(2, 64, dtype=F16), meta(64, dtype=F16)), {}, "float32 or bfloat16"),
    "add_rms_norm cpu": (pk.add_rms_norm, (cpu(2, 64), cpu(2, 64), cpu(64)), {}, "CUDA"),
    "rotary layout": (pk.apply_rotary, (meta(1, 2, 8, 64), meta(1, 2, 8, 64), meta(8, 64), meta(8, 64)), {"layout": "sbhd"}, "layout"),
    "rotary cos": (pk.apply_rotary, (meta(1, 2, 8, 64), meta(1, 2, 8, 64), meta(8, 32), meta(8, 32)), {}, "cos must have shape"),
    "rotary dtype": (pk.apply_rotary, (meta(1, 2, 8, 64), meta(1, 2, 8, 64), meta(8, 64, dtype=F32), meta(8, 64, dtype=F32)), {}, "dtype"),
    "rotary batch": (pk.apply_rotary, (meta(1, 2, 8, 64), meta(2, 2, 8, 64), meta(8, 64), meta(8, 64)), {}, "k must share"),
    "lce target": (pk.linear_cross_entropy, (meta(4, 64), meta(100, 64), meta(5, dtype=I64)), {}, "target"),
    "lce reduction": (pk.linear_cross_entropy, (meta(4, 64), meta(100, 64), meta(4, dtype=I64)), {"reduction": "none"}, "reduction"),
    "lce f32": (pk.linear_cross_entropy, (meta(4, 64, dtype=F32), meta(100, 64, dtype=F32), meta(4, dtype=I64)), {}, "bfloat16"),
    "lce weight": (pk.linear_cross_entropy, (meta(4, 64), meta(100, 32), meta(4, dtype=I64)), {}, "weight \\(V, H\\)"),
    "swiglu_linear rows": (pk.swiglu_linear, (meta(4, 64), meta(192, 64)), {}, "multiple of 128"),
    "swiglu_linear f32": (pk.swiglu_linear, (meta(4, 64, dtype=F32), meta(256, 64, dtype=F32)), {}, "bfloat16 or float16"),
    "swiglu_linear inner": (pk.swiglu_linear, (meta(4, 64), meta(256, 128)), {}, "weight \\(out, in\\)"),
    "linear_residual residual": (pk.linear_residual, (meta(4, 64), meta(128, 64), meta(4, 64)), {}, "residual must have shape"),
    "linear_residual cpu": (pk.linear_residual, (cpu(4, 64), cpu(128, 64), cpu(4, 128)), {}, "CUDA"),
    "pack_gated shapes": (pk.pack_gated, (meta(128, 64), meta(64, 64)), {}, "of one shape"),
    "pack_gated rows": (pk.pack_gated, (meta(96, 64), meta(96, 64)), {}, "multiple of 64"),
    "kvcache head dim": (pk.attention_with_kvcache, (meta(2, 1, 8, 96), meta(2, 64, 2, 96), meta(2, 64, 2, 96), meta(2, dtype=I32)), {}, "head dim"),
    "kvcache seqlens": (pk.attention_with_kvcache, (meta(2, 1, 8, 64), meta(2, 64, 2, 64), meta(2, 64, 2, 64), meta(2, dtype=I64)), {}, "int32"),
    "kvcache heads": (pk.attention_with_kvcache, (meta(2, 1, 8, 64), meta(2, 64, 3, 64), meta(2, 64, 3, 64), meta(2, dtype=I32)), {}, "multiple of the cache's KV heads"),
    "kvcache queries": (pk.attention_with_kvcache, (meta(2, 17, 8, 64), meta(2, 64, 2, 64), meta(2, 64, 2, 64), meta(2, dtype=I32)), {}, "1..16 queries"),
    "kvcache f32": (pk.attention_with_kvcache, (meta(2, 1, 8, 64, dtype=F32), meta(2, 64, 2, 64, dtype=F32), meta(2, 64, 2, 64, dtype=F32), meta(2, dtype=I32)), {}, "one dtype"),
    "kvcache page": (pk.attention_with_kvcache, (meta(2, 1, 8, 64), meta(8, 40, 2, 64), meta(8, 40, 2, 64), meta(2, dtype=I32)), {"block_table": meta(2, 4, dtype=I32)}, "page size"),
    "kvcache cpu": (pk.attention_with_kvcache, (cpu(2, 1, 8, 64), cpu(2, 64, 2, 64), cpu(2, 64, 2, 64), torch.zeros(2, dtype=I32)), {}, "CUDA"),
    "precompile inputs": (pk.precompile, ([(pk.rms_norm, meta(2, 64), meta(64))], meta(2)), {}, "example inputs go with a module"),
    "precompile work": (pk.precompile, (5,), {}, "nn.Module or a list"),
    "precompile call": (pk.precompile, ([5],), {}, "tuple \\(fn, \\*args\\)"),
    "tune not callable": (pk.tune, (5,), {}, "must be a callable"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(case):
    fn, args, kwargs, match = BAD[case]
    expect_error(fn, *args, match=match, **kwargs)


def test_ptx_bad_input_names_the_caller():
    expect_error(pk.ptx, pk.rms_norm, meta(2, 64), meta(32), match="weight")


# ------------------------------------------------------------------------------ ptx()
def _e4m3(*shape, device="meta"):
    return torch.empty(*shape, dtype=E4M3, device=device)


def traced_calls(device):
    """(function, args, kwargs, the kernel-name prefix) of one call per function."""
    t = lambda *s, dtype=BF: torch.empty(*s, dtype=dtype, device=device)  # noqa: E731
    offs = torch.tensor([50, 100, 200, 300], dtype=torch.int32, device=device)
    w = _e4m3(256, 512, device=device)
    return [
        (pk.matmul, (t(2, 37, 64), t(64, 128)), {}, "gemm_bf16_bf16_KMN"),
        (pk.matmul, (t(2, 37, 64), t(128, 64).T), {"bias": t(128, dtype=F32),
                                                   "out_dtype": "f32"}, "gemm_bf16_f32_KK"),
        (pk.linear, (t(2, 37, 64), t(128, 64), t(128)), {}, "gemm_bf16_bf16_KK"),
        (pk.grouped_mm, (t(300, 512), t(4, 512, 256), offs), {}, "grouped_bf16_MN"),
        (pk.grouped_mm, (t(300, 512), t(4, 256, 512).transpose(1, 2), offs),
         {"out_dtype": torch.float32}, "grouped_f32_K"),
        (pk.scaled_mm, (_e4m3(300, 512, device=device), w.t(), t(1, dtype=F32),
                        t(1, dtype=F32)), {}, "fp8_gemm_tensor"),
        (pk.scaled_mm, (_e4m3(300, 512, device=device), w.t(), t(300, 1, dtype=F32),
                        t(1, 256, dtype=F32)), {"use_fast_accum": True}, "fp8_gemm_row"),
        (pk.scaled_mm_blockwise, (_e4m3(300, 512, device=device), w.t(), t(300, 4, dtype=F32),
                                  t(2, 4, dtype=F32)), {}, "fp8_gemm_block"),
        (pk.rms_norm, (t(2, 37, 1024), t(1024)), {}, "rms_norm_bf16"),
        (pk.layer_norm, (t(2, 37, 1024, dtype=F32), t(1024, dtype=F32)), {}, "layer_norm_f32"),
        (pk.softmax, (t(2, 37, 1000),), {"dim": 2}, "softmax_bf16"),
        (pk.swiglu, (t(2, 37, 768), t(2, 37, 768)), {}, "swiglu_bf16"),
    ]


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_ptx_traces_every_function(device):
    for fn, args, kwargs, prefix in traced_calls(device):
        texts = pk.ptx(fn, *args, **kwargs)
        assert len(texts) == 1 and next(iter(texts)).startswith(prefix), (fn.__name__, texts)
        text = next(iter(texts.values()))
        assert ".target sm_90a" in text and ".entry " + next(iter(texts)) in text


def test_ptx_includes_the_backward_where_an_input_requires_grad():
    x, w = meta(2, 37, 64).requires_grad_(), meta(128, 64)
    # the plans a default call takes (no GPU here: the heuristic's, 64x128 tiles for 74 rows)
    assert list(pk.ptx(pk.linear, x, w)) == ["gemm_bf16_bf16_KK_64x128x64_s9_c1",   # x @ w.T
                                             "gemm_bf16_bf16_KMN_64x128x64_s9_c1",  # g @ w
                                             "gemm_bf16_bf16_MNMN_64x128x64_s9_c1"]  # g.T @ x
    assert list(pk.ptx(pk.rms_norm, x[..., :1].expand(2, 37, 64), meta(64))) == [
        "rms_norm_bf16", "rms_norm_bwd_bf16", "rms_norm_dw_bf16"]
    offs = torch.empty(4, dtype=torch.int32, device="meta")
    assert len(pk.ptx(pk.grouped_mm, meta(300, 64), meta(4, 64, 32).requires_grad_(), offs)) == 3
    with torch.no_grad():
        assert len(pk.ptx(pk.linear, x, w)) == 1
    assert len(pk.ptx(pk.softmax, x)) == 1     # its backward is torch code


def test_ptx_shapes_follow_the_call():
    a = pk.ptx(pk.rms_norm, meta(2, 37, 512), meta(512))
    b = pk.ptx(pk.rms_norm, meta(74, 512), meta(512))
    c = pk.ptx(pk.rms_norm, meta(74, 1024), meta(1024))
    assert a == b and a != c


@pytest.mark.parametrize("name", ["matmul", "grouped_mm", "scaled_mm", "scaled_mm_blockwise",
                                  "rms_norm", "layer_norm", "softmax", "swiglu"])
def test_ptx_assembles(name, assemble):
    fn, args, kwargs, _ = next(c for c in traced_calls("meta") if c[0].__name__ == name)
    for text in pk.ptx(fn, *args, **kwargs).values():
        assemble(text)


def test_fake_tensors_pass_the_device_check():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.empty(2, 37, 64, dtype=BF), torch.empty(64, dtype=BF)
        y = pk.rms_norm(x, w)
        assert y.shape == (2, 37, 64) and y.device.type == "cpu"
        assert pk.linear(x, torch.empty(32, 64, dtype=BF)).shape == (2, 37, 32)


def test_meta_tensors_give_shapes():
    x, w = meta(2, 37, 64), meta(128, 64)
    assert pk.linear(x, w).shape == (2, 37, 128)
    assert pk.matmul(x, w.T, out_dtype=F32).dtype == F32
    assert pk.rms_norm(meta(2, 37, 64), meta(64)).shape == (2, 37, 64)
    assert pk.grouped_mm(meta(300, 64), meta(4, 64, 32), OFFS[:1].expand(4).contiguous()
                         ).shape == (300, 32)


# ----------------------------------------------------------------- autograd, swapped launches
def _round(x, dtype):
    return x.to(dtype)


def _mm_model(a, b, bias, out):
    d = a.double() @ b.double()
    if bias is not None:
        d = d + bias.double()
    return d.to(_common.torch_dtype(out))


def _rms_norm_grads(dy, x, w, eps):
    """float64 ``(dx, dw)`` of RMSNorm, the backward kernel's formulas (``build_rms_norm_bwd``);
    a backward op's implementation runs below autograd, so the model cannot use it."""
    dy, xd, wd = dy.double(), x.double(), w.double()
    r = torch.rsqrt((xd * xd).mean(-1, keepdim=True) + eps)
    g = wd * dy
    dx = r * g - xd * r ** 3 * (g * xd).mean(-1, keepdim=True)
    return dx.to(x.dtype), (dy * xd * r).sum(0).to(w.dtype)


def _layer_norm_grads(dy, x, w, eps):
    """float64 ``(dx, dw, db)`` of LayerNorm (``build_layer_norm_bwd``'s formulas)."""
    dy, xd, wd = dy.double(), x.double(), w.double()
    d = xd - xd.mean(-1, keepdim=True)
    rstd = torch.rsqrt((d * d).mean(-1, keepdim=True) + eps)
    xhat, g = d * rstd, wd * dy
    dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    return dx.to(x.dtype), (dy * xhat).sum(0).to(w.dtype), dy.sum(0).to(w.dtype)


def _grouped_grads(dd, a, b, offs):
    """float64 ``(da, db)`` of the grouped GEMM, group by group."""
    da, db, start = torch.zeros_like(a, dtype=torch.float64), [], 0
    for g, end in enumerate(offs.tolist()):
        da[start:end] = dd[start:end].double() @ b[g].double().T
        db.append(a[start:end].double().T @ dd[start:end].double())
        start = end
    return da.to(a.dtype), torch.stack(db).to(b.dtype)


def _rms64(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _ln64(x, w, b, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


@pytest.fixture
def models(monkeypatch):
    """Swap the kernel launches for float64 models; count the launches by name."""
    calls = []

    def counted(name, fn):
        def run(*args):
            calls.append(name)
            return fn(*args)
        return run

    monkeypatch.setattr(_common, "check_devices", lambda *a: None)
    monkeypatch.setattr(gemm_api, "_mm", counted("mm", _mm_model))
    monkeypatch.setattr(rows_api, "_rms_norm", counted(
        "rms_norm", lambda x, w, eps: _rms64(x.double(), w.double(), eps).to(x.dtype)))
    monkeypatch.setattr(rows_api, "_rms_norm_backward", counted(
        "rms_norm_backward",
        _rms_norm_grads))
    monkeypatch.setattr(rows_api, "_layer_norm", counted(
        "layer_norm", lambda x, w, b, eps: _ln64(
            x.double(), w.double(), None if b is None else b.double(), eps).to(x.dtype)))
    monkeypatch.setattr(rows_api, "_layer_norm_backward", counted(
        "layer_norm_backward", _layer_norm_grads))
    monkeypatch.setattr(rows_api, "_softmax", counted(
        "softmax", lambda x: torch.softmax(x.double(), -1).to(x.dtype)))
    monkeypatch.setattr(rows_api, "_swiglu", counted(
        "swiglu", lambda g, u: (torch.nn.functional.silu(g.double()) * u.double()).to(g.dtype)))
    monkeypatch.setattr(grouped_api, "_grouped", counted("grouped", _grouped_model))
    monkeypatch.setattr(grouped_api, "_grouped_backward", counted(
        "grouped_backward", _grouped_grads))
    return calls


def _grouped_ref(a, b, offs):
    out, start = [], 0
    for g, end in enumerate(offs.tolist()):
        out.append(a[start:end] @ b[g])
        start = end
    return torch.cat(out)


def _grouped_model(a, b, offs, out):
    return _grouped_ref(a.double(), b.double(), offs).to(_common.torch_dtype(out))


def rel(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def check(got, ref, tol):
    assert got.shape == ref.shape and got.dtype != torch.float64
    assert rel(got, ref) < tol, rel(got, ref)


def _leaf(*shape, dtype=BF, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_()


def _reference(fn, inputs, grad):
    """float64 torch forward of ``fn`` and the gradients of every input."""
    xs = [x.detach().double().requires_grad_() for x in inputs]
    y = fn(*xs)
    return y, torch.autograd.grad(y, xs, grad.double())


def _compare(ours, ref, inputs, tol, seed=7):
    y = ours(*inputs)
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(y.dtype)
    y_ref, g_ref = _reference(ref, inputs, grad)
    check(y, y_ref, tol)
    gs = torch.autograd.grad(y, inputs, grad)
    for g, r, x in zip(gs, g_ref, inputs):
        assert g.dtype == x.dtype and g.shape == x.shape
        check(g, r, tol)


@pytest.mark.parametrize("transposed", [False, True])
def test_matmul_autograd(models, transposed):
    """``b`` given as ``(K, N)`` or as the view ``w.T`` of a ``(N, K)`` weight."""
    a, bias = _leaf(2, 37, 40), _leaf(24, dtype=F32)
    w = _leaf(24, 40) if transposed else _leaf(40, 24)

    def ours(a, w, bias):
        return pk.matmul(a, w.T if transposed else w, bias=bias)

    def ref(a, w, bias):
        return a @ (w.T if transposed else w) + bias

    _compare(ours, ref, [a, w, bias], 1e-2)
    assert models.count("mm") == 3      # forward, dA, dB


def test_matmul_out_dtype_and_no_grad(models):
    a, b = _leaf(3, 40), _leaf(40, 24)
    y = pk.matmul(a, b, out_dtype="f32")
    assert y.dtype == F32 and rel(y, a.double() @ b.double()) < 1e-6
    with torch.no_grad():
        assert not pk.matmul(a, b).requires_grad
    y.sum().backward()
    check(a.grad, torch.ones(3, 24, dtype=torch.float64) @ b.double().T, 1e-2)


def test_linear_autograd(models):
    _compare(pk.linear, lambda x, w, b: torch.nn.functional.linear(x, w, b),
             [_leaf(2, 37, 40), _leaf(24, 40), _leaf(24)], 1e-2)
    _compare(lambda x, w: pk.linear(x, w), lambda x, w: x @ w.T,
             [_leaf(5, 40), _leaf(24, 40)], 1e-2)


def test_linear_grad_of_one_input(models):
    x, w = _leaf(5, 40), _leaf(24, 40).detach()
    pk.linear(x, w).sum().backward()
    check(x.grad, torch.ones(5, 24, dtype=torch.float64) @ w.double(), 1e-2)
    assert models.count("mm") == 2      # no weight gradient GEMM


def test_grouped_mm_autograd(models):
    offs = torch.tensor([5, 5, 20, 31], dtype=torch.int32)
    _compare(lambda a, b: pk.grouped_mm(a, b, offs), lambda a, b: _grouped_ref(a, b, offs),
             [_leaf(31, 16), _leaf(4, 16, 24)], 1e-2)


@pytest.mark.parametrize("lead", [(), (2, 37), (3, 1, 5)])
def test_rms_norm_autograd(models, lead):
    _compare(lambda x, w: pk.rms_norm(x, w, eps=1e-5), lambda x, w: _rms64(x, w, 1e-5),
             [_leaf(*lead, 96, dtype=F32), _leaf(96, dtype=F32)], 1e-6)
    assert models[-2:] == ["rms_norm", "rms_norm_backward"]


def test_layer_norm_autograd(models):
    _compare(lambda x, w, b: pk.layer_norm(x, w, b), lambda x, w, b: _ln64(x, w, b, 1e-5),
             [_leaf(2, 37, 96, dtype=F32), _leaf(96, dtype=F32), _leaf(96, dtype=F32)], 1e-6)
    _compare(lambda x, w: pk.layer_norm(x, w, eps=1e-3), lambda x, w: _ln64(x, w, None, 1e-3),
             [_leaf(2, 37, 96, dtype=F32), _leaf(96, dtype=F32)], 1e-6)


def test_softmax_autograd(models):
    _compare(pk.softmax, lambda x: torch.softmax(x, -1), [_leaf(2, 37, 80, dtype=F32)], 1e-6)
    _compare(pk.softmax, lambda x: torch.softmax(x, -1), [_leaf(2, 37, 80)], 1e-2)


def test_swiglu_autograd(models):
    _compare(pk.swiglu, lambda g, u: torch.nn.functional.silu(g) * u,
             [_leaf(2, 37, 80, dtype=F32), _leaf(2, 37, 80, dtype=F32, seed=1)], 1e-6)


# ---------------------------------------------------------------------------------- JAX
def test_jax_shapes_trace_and_bad_input():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    S = jax.ShapeDtypeStruct
    x, w = S((2, 37, 64), jnp.bfloat16), S((128, 64), jnp.bfloat16)
    assert list(pk.ptx(pk.linear, x, w)) == list(pk.ptx(pk.linear, meta(2, 37, 64), meta(128, 64)))
    assert list(pk.ptx(pk.rms_norm, x, S((64,), jnp.bfloat16))) == ["rms_norm_bf16"]
    assert list(pk.ptx(pk.grouped_mm, S((300, 64), jnp.bfloat16), S((4, 64, 32), jnp.bfloat16),
                       S((4,), jnp.int32))) == ["grouped_bf16_MN_64x256x64_s5_pf_spec5"]  # the heuristic's
    expect_error(pk.rms_norm, jnp.ones((2, 64), jnp.float16), jnp.ones(64, jnp.float16),
                 match="float32 or bfloat16")
    expect_error(pk.matmul, jnp.ones((2, 64), jnp.bfloat16), jnp.ones((32, 64), jnp.bfloat16),
                 match="inner dimensions")
    expect_error(pk.matmul, jnp.ones((2, 64), jnp.bfloat16), meta(64, 32), match="all be torch")


# ---------------------------------------------------------- grouped backward: padding, layout
class _GroupedBackwardModel:
    """``grouped_op(...).backward_kernel`` as float64 math on the stored (padded) operands;
    checks that it gets them contiguous and padded to multiples of 8."""

    def __init__(self, M, N, K, G, b_major, out):
        self.N, self.K, self.b_major = N, K, b_major
        self.backward_kernel = self

    def __call__(self, a, b, offs, dd):
        assert a.is_contiguous() and b.is_contiguous() and dd.is_contiguous()
        assert a.shape[1] == self.K and dd.shape[1] == self.N and self.K % 8 == self.N % 8 == 0
        bl = b.transpose(1, 2) if self.b_major == "K" else b
        da, db = _grouped_grads(dd, a, bl, offs)
        return da, (db.transpose(1, 2).contiguous() if self.b_major == "K" else db)


@pytest.mark.parametrize("K,N", [(16, 24), (13, 21)])
@pytest.mark.parametrize("k_major", [False, True])
def test_grouped_backward_pads_and_keeps_layout(monkeypatch, K, N, k_major):
    from pyptx_kernels.grouped_gemm import host

    monkeypatch.setattr(host, "grouped_op", _GroupedBackwardModel)
    offs = torch.tensor([5, 5, 20, 31], dtype=torch.int32)
    a = cpu(31, K)
    b = cpu(4, N, K).transpose(1, 2) if k_major else cpu(4, K, N)
    dd = cpu(31, N)
    da, db = grouped_api._grouped_backward(dd, a, b, offs)
    ref_a, ref_b = _grouped_grads(dd, a, b, offs)
    assert da.shape == a.shape and db.shape == b.shape and db.stride() == b.stride()
    check(da, ref_a.double(), 1e-2)
    check(db, ref_b.double(), 1e-2)


# ------------------------------------------------------------- rows launches: the real specs
class _SpecChecked:
    """A row kernel stand-in: the real builder's kernel (traced on the CPU) checks each
    argument's shape and dtype against its ``in_specs``; ``model`` gives the result."""

    def __init__(self, built, model):
        self.built, self.model = built, model

    def __call__(self, *args):
        specs = self.built.in_specs
        assert len(args) == len(specs), (self.built.name, len(args))
        for x, spec in zip(args, specs):
            assert tuple(x.shape) == tuple(spec.dims), (self.built.name, x.shape, spec)
            assert _common.dtype_name(x.dtype) == spec.dtype.name, (self.built.name, x.dtype)
            assert x.is_contiguous(), (self.built.name, x.stride())   # the kernels read rows
        return self.model(*args)


ROW_MODELS = {
    "build_rms_norm_fast": lambda eps: lambda x, w: _rms64(x.double(), w.double(), eps).to(x.dtype),
    "build_rms_norm_bwd": lambda eps: lambda x, w, dy: _rms_norm_grads(dy, x, w, eps),
    "build_layer_norm": lambda eps: lambda x, w, b: _ln64(x.double(), w.double(), b.double(),
                                                          eps).to(x.dtype),
    "build_layer_norm_bwd": lambda eps: lambda x, w, dy: _layer_norm_grads(dy, x, w, eps),
    "build_softmax_fast": lambda: lambda x: torch.softmax(x.double(), -1).to(x.dtype),
    "build_swiglu": lambda: lambda g, u: (torch.nn.functional.silu(g.double())
                                          * u.double()).to(g.dtype),
}


@pytest.fixture
def spec_checked(monkeypatch):
    """``rows.api``'s builders give spec-checking float64 models; only device checks are off."""
    import importlib

    built = []

    def build(module, builder, B, N, dtype, *extra):
        real = getattr(importlib.import_module(f"pyptx_kernels.rows.{module}"), builder)
        kernel = real(B, N, dtype, *extra)
        kernel = getattr(kernel, "stage1", None) or getattr(kernel, "kernel", kernel)
        built.append((builder, B, N, dtype, *extra))
        return _SpecChecked(kernel, ROW_MODELS[builder](*extra))

    monkeypatch.setattr(_common, "check_devices", lambda *a: None)
    monkeypatch.setattr(rows_api, "_build", build)
    return built


def test_rows_launch_the_builders_with_their_specs(spec_checked):
    x, w, b = _leaf(2, 37, 96, dtype=F32), _leaf(96, dtype=F32), _leaf(96, dtype=F32, seed=1)
    _compare(lambda x, w: pk.rms_norm(x, w, eps=1e-5), lambda x, w: _rms64(x, w, 1e-5),
             [x, w], 1e-6)
    _compare(lambda x, w, b: pk.layer_norm(x, w, b, eps=1e-4),
             lambda x, w, b: _ln64(x, w, b, 1e-4), [x, w, b], 1e-6)
    _compare(lambda x, w: pk.layer_norm(x, w), lambda x, w: _ln64(x, w, None, 1e-5), [x, w], 1e-6)
    _compare(pk.softmax, lambda x: torch.softmax(x, -1), [x], 1e-6)
    _compare(pk.swiglu, lambda g, u: torch.nn.functional.silu(g) * u, [x, _leaf(2, 37, 96,
             dtype=F32, seed=2)], 1e-6)
    h = _leaf(2, 37, 192, dtype=F32, seed=3)    # halves: views with a row stride of 192
    _compare(lambda h: pk.swiglu(*h.chunk(2, -1)),
             lambda h: torch.nn.functional.silu(h[..., :96]) * h[..., 96:], [h], 1e-6)
    _compare(lambda h: pk.rms_norm(h[..., 96:], w), lambda h: _rms64(h[..., 96:], w.double(),
             1e-6), [h], 1e-6)
    assert {c[0] for c in spec_checked} == set(ROW_MODELS)
    assert ("build_rms_norm_bwd", 74, 96, "f32", 1e-5) in spec_checked
