"""The forward's opt-in ``ex2_poly=n`` (``examples/hopper/flash_attention.py``): ``n`` of every
8 softmax exponentials by a degree-3 polynomial on the FMA pipe (``_ex2_poly``) instead of
``ex2.approx``. ``ptxsim`` runs the whole forward against float64 (head dims 64 and 128,
causal and full, ragged lengths, ``Sk != S``, outputs poisoned), a float model and the
helper's own PTX are checked against ``math.exp2`` (``-inf`` and underflow included), ptxas
keeps the kernels free of spills and wgmma serialisation, bad values fail at the caller's
line, and ``ex2_poly=0`` is the plain kernel.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

import pyptx
from pyptx import Tile, ptx, reg
from pyptx.errors import ConfigError
from pyptx.testing import load_module
from pyptx.types import f32, u64

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import ptxsim  # noqa: E402
from test_tensorcore_sim import _dev, _f64  # noqa: E402

fa = load_module(HERE.parents[3] / "examples" / "hopper" / "flash_attention.py", "sim_poly_fa")

#: the polynomial's relative error bound for -126 <= x <= 127 (fa._ex2_poly's docstring)
POLY_REL = 7.5e-5


# ---------------------------------------------------------------------- the polynomial alone
def _model(x):
    """``fa._ex2_poly`` step by step in f32 (fma as an f64 product-sum rounded once to f32, as
    the simulator does): the float model of the PTX."""
    x = np.asarray(x, np.float32)
    m = np.float32(fa.ROUND_MAGIC)
    with np.errstate(all="ignore"):
        under = x < np.float32(fa.EX2_POLY_MIN)
        t = x + m
        j = t - m
        f = (x - j).astype(np.float64)
        c0, c1, c2, c3 = (np.float64(np.float32(c)) for c in fa.EX2_POLY)
        p = (f * c3 + c2).astype(np.float32).astype(np.float64)
        p = (p * f + c1).astype(np.float32).astype(np.float64)
        p = (p * f + c0).astype(np.float32)
        e = t.view(np.uint32) << np.uint32(23)
        r = (p.view(np.uint32) + e).view(np.float32)
    return np.where(under, np.float32(0.0), r)


def _grid():
    """[-130, 16] densely (the kernel feeds at most ``rescale_threshold`` <= 16), every
    rounding midpoint of [-130, 0], the underflow edge, and -inf."""
    xs = np.concatenate([np.linspace(-130.0, 16.0, 200_001), np.arange(-130, 1) + 0.5,
                         np.arange(-130, 17, dtype=np.float64),
                         [-126.0, -125.75, -125.5, float(np.nextafter(np.float32(-125.5), np.float32(-126))), -127.0, -1e30,
                          -np.inf]])
    return xs.astype(np.float32)


def _check_exp2(x, got):
    """Relative error < POLY_REL for x >= -125.5 (every such result a normal f32); exactly +0
    below (2**x < 2**-125.5: absolute error < 1.7e-38), -inf included; never NaN or negative."""
    x = x.astype(np.float64)
    got = got.astype(np.float64)
    kept = x >= fa.EX2_POLY_MIN
    want = np.array([math.exp2(v) if v > -1e4 else 0.0 for v in x])
    rel = np.abs(got[kept] / want[kept] - 1.0).max()
    assert rel < POLY_REL, (rel, x[kept][np.argmax(np.abs(got[kept] / want[kept] - 1.0))])
    assert (got[kept] >= np.finfo(np.float32).tiny).all()           # no subnormals
    assert (got[~kept] == 0.0).all() and not np.signbit(got[~kept]).any()
    assert np.abs(got - want).max(initial=0.0, where=~kept) < 2.0 ** -125.5
    assert np.isfinite(got).all() and (got >= 0).all()
    return rel


def test_polynomial_model_against_exp2():
    """The f32 model of the emitted steps over [-130, 16]: max relative error 7.5e-5 for
    x >= -125.5 (measured 7.48e-5), exactly +0 below and for -inf (``ex2.approx.ftz.f32``
    also gives 0 for -inf)."""
    x = _grid()
    got = _model(x)
    rel = _check_exp2(x, got)
    assert rel > 5e-5   # the grid reaches the polynomial's extremes: the bound is tight
    assert got[x == -np.inf][0] == 0.0 and _model(np.float32(0.0)) == np.float32(fa.EX2_POLY[0])


def _poly_kernel(n):
    @pyptx.kernel([Tile(n, f32)], [Tile(n, f32)], block=(256, 1, 1), grid=(n // 256, 1, 1),
                  name="ex2_poly_probe")
    def k(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        i = reg.from_(ptx.special.ctaid.x(), u64) * 256 + reg.from_(ptx.special.tid.x(), u64)
        x = reg.scalar(f32)
        ptx.inst.ld.global_.f32(x, ptx.addr(px + i * 4))
        fa._ex2_poly(x)
        ptx.inst.st.global_.f32(ptx.addr(py + i * 4), x)
        ptx.ret()
    return k


def test_polynomial_ptx_against_exp2_and_the_model(assemble):
    """The helper's own PTX in the simulator: the same bound, bit-identical to the model."""
    x = _grid()
    x = np.concatenate([x[:-300:16], x[-300:]])     # every special point, a share of the rest
    x = np.concatenate([x, np.full(-len(x) % 256, -np.inf, np.float32)])
    k = _poly_kernel(len(x))
    assemble(k.ptx())
    (y,) = ptxsim.run(k.specialize(), [x])
    got = y.view(np.float32)
    _check_exp2(x, got)
    assert (got.view(np.uint32) == _model(x).view(np.uint32)).all()


def test_poly_slots_spread_evenly():
    """``n`` of every 8 of a thread's registers of a row, evenly spaced."""
    for n in range(9):
        slots = [k for k in range(32) if fa.poly_slot(k, n)]
        assert len(slots) == 4 * n
        if n:
            gaps = {b - a for a, b in zip(slots, slots[1:])}
            assert gaps <= {8 // n, -(-8 // n)} if 8 % n else gaps == {8 // n}, (n, slots)


# ---------------------------------------------------------------------- the forward kernel
def _reference(q, k, v, causal):
    """float64 ``o`` and natural-log ``lse`` (top-left causal, ``Sk`` may differ from ``S``;
    KV head ``h // (Hq // Hkv)``)."""
    Q, K, V = (_f64(x, "bf16") for x in (q, k, v))
    S, Sk, D, g = Q.shape[1], K.shape[1], Q.shape[3], Q.shape[2] // K.shape[2]
    Kr, Vr = np.repeat(K, g, 2), np.repeat(V, g, 2)
    s = np.einsum("bqhd,bkhd->bhqk", Q, Kr) / np.sqrt(D)
    if causal:
        s = s + np.triu(np.full((S, Sk), -np.inf), 1)
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - mx)
    lse = (np.log(e.sum(-1, keepdims=True)) + mx)[..., 0]
    o = np.einsum("bhqk,bkhd->bqhd", e / e.sum(-1, keepdims=True), Vr)
    return o, lse


# D, causal, ex2_poly, S, Sk, config: each n at both head dims; ragged S (a masked last key
# block), Sk != S (more keys than queries, and fewer); the tuned list's other block sizes
# (BN=64: 16 registers a row, BN=176: 44, not a multiple of 8), the simple schedule and the
# persistent kernel
CASES = [(64, False, 2, 200, 200, {}), (64, True, 4, 200, 333, {}), (64, True, 8, 130, 130, {}),
         (128, True, 2, 200, 200, {}), (128, False, 4, 200, 150, {}), (128, False, 8, 77, 77, {}),
         (64, False, 4, 200, 200, dict(BN=64)), (128, True, 2, 300, 300, dict(BN=176)),
         (64, True, 2, 200, 200, dict(schedule="simple")),
         (128, True, 4, 200, 200, dict(persistent=True, num_sms=3))]


@pytest.mark.parametrize("D,causal,n,S,Sk,config", CASES)
def test_forward_with_ex2_poly_against_float64(D, causal, n, S, Sk, config):
    """Outputs poisoned (unwritten elements fail). Tolerances: O max |o - ref| / max(1, |ref|)
    <= 2e-2 and relative Frobenius error < 8e-3 (bf16: P and O rounded to 2**-9; the
    polynomial's 7.5e-5 is far below), lse max absolute error <= 2e-4 (natural log: the row
    sum's relative error, <= 7.5e-5 from the polynomial plus f32 rounding)."""
    B, Hq, Hkv = 1, 2, 1
    rng = np.random.default_rng(100 * D + 10 * n + causal)
    q = _dev(rng.standard_normal((B, S, Hq, D)) * 1.5, "bf16")  # peaked rows: exps far below 1
    k = _dev(rng.standard_normal((B, Sk, Hkv, D)), "bf16")
    v = _dev(rng.standard_normal((B, Sk, Hkv, D)), "bf16")
    kern = fa.build_attention(B, S, Hq, Hkv, D, Sk=Sk, causal=causal, ex2_poly=n, **config)
    assert kern.name.endswith(f"_poly{n}")
    o, lse = ptxsim.run(kern.specialize(), [q, k, v], poison=True)
    ro, rlse = _reference(q, k, v, causal)
    got = _f64(o, "bf16")
    assert np.isfinite(got).all()
    assert (np.abs(got - ro) / np.maximum(1.0, np.abs(ro))).max() <= 2e-2
    assert np.linalg.norm(got - ro) / np.linalg.norm(ro) < 8e-3
    lse = lse.view(np.float32).astype(np.float64)
    assert np.abs(lse - rlse).max() <= 2e-4


def test_varlen_with_ex2_poly_against_float64():
    """The packed forward shares the body: two sequences, causal, ex2_poly=4."""
    Hq, Hkv, D = 2, 1, 64
    lens_q, lens_k = [70, 130], [90, 130]
    cu_q, cu_k = np.cumsum([0] + lens_q).astype(np.int32), np.cumsum([0] + lens_k).astype(np.int32)
    rng = np.random.default_rng(5)
    q = _dev(rng.standard_normal((sum(lens_q), Hq, D)), "bf16")
    k = _dev(rng.standard_normal((sum(lens_k), Hkv, D)), "bf16")
    v = _dev(rng.standard_normal((sum(lens_k), Hkv, D)), "bf16")
    kern = fa.build_attention_varlen(sum(lens_q), sum(lens_k), 2, Hq, Hkv, D, max(lens_q),
                                     causal=True, ex2_poly=4)
    assert kern.name.endswith("_poly4")
    o, lse = ptxsim.run(kern.specialize(), [q, k, v, cu_q, cu_k], poison=True)
    got, lse = _f64(o, "bf16"), lse.view(np.float32).astype(np.float64)
    for b in range(2):
        a, e, ka, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        ro, rlse = _reference(q[None, a:e], k[None, ka:ke], v[None, ka:ke], True)
        assert (np.abs(got[a:e] - ro[0]) / np.maximum(1.0, np.abs(ro[0]))).max() <= 2e-2
        assert np.abs(lse[:, a:e] - rlse[0]).max() <= 2e-4


# ---------------------------------------------------------------------- no simulation
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_ex2_poly_assembles_without_spills_or_serialisation(D, n, causal, assemble):
    """At the benchmark's sizes (B*S = 32768, H*D = 2048), default and the overlap schedule:
    ptxas spills nothing and keeps the wgmma asynchronous (no C751x notes)."""
    for schedule in ("pingpong", "overlap"):
        k = fa.build_attention(8, 4096, 2048 // D, 2048 // D, D, causal=causal, ex2_poly=n,
                               schedule=schedule)
        log = assemble(k.ptx())
        assert "(C751" not in log, log
        assert "0 bytes spill stores" in log and "0 bytes spill loads" in log, log


def test_ex2_poly_zero_is_the_plain_kernel():
    """``ex2_poly=0`` emits the same PTX (and name) as the call without it; n > 0 trades
    ``ex2.approx`` for the polynomial in n of 8 exponentials of each row (the alpha
    exponentials stay)."""
    for D in (64, 128):
        plain = fa.build_attention(2, 1000, 4, 2, D, causal=True)
        zero = fa.build_attention(2, 1000, 4, 2, D, causal=True, ex2_poly=0)
        assert plain.ptx() == zero.ptx() and plain.name == zero.name
        n_ex2 = plain.ptx().count("ex2.approx")
        per_copy = 128 // 2 + 2          # BN/2 exponentials of S and 2 of alpha per softmax
        assert n_ex2 % per_copy == 0
        for n in (2, 4, 8):
            text = fa.build_attention(2, 1000, 4, 2, D, causal=True, ex2_poly=n).ptx()
            moved = n_ex2 - text.count("ex2.approx")
            assert moved == n_ex2 // per_copy * (128 // 2) * n // 8, (D, n, moved)
            assert text.count("setp.lt.f32") - plain.ptx().count("setp.lt.f32") == moved
    v = fa.build_attention_varlen(3000, 2800, 3, 4, 2, 64, 1200)
    assert v.ptx() == fa.build_attention_varlen(3000, 2800, 3, 4, 2, 64, 1200, ex2_poly=0).ptx()


@pytest.mark.parametrize("bad", [9, -1, True, 2.0, "2", None])
def test_bad_ex2_poly_names_the_callers_line(bad):
    for build in (lambda: fa.build_attention(1, 256, 2, 2, 64, ex2_poly=bad),
                  lambda: fa.build_attention_varlen(300, 300, 2, 2, 2, 64, 200, ex2_poly=bad)):
        with pytest.raises(ConfigError, match=r"ex2_poly must be an int in 0\.\.8 .*got") as e:
            build()
        assert str(e.value).startswith(f"{__file__}:"), str(e.value)
        assert repr(bad) in str(e.value)


def test_bad_ex2_poly_through_attention_forward():
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 128, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ConfigError, match="ex2_poly must be an int in 0..8") as e:
        fa.attention_forward(q, q, q, ex2_poly=12)
    assert str(e.value).startswith(f"{__file__}:"), str(e.value)


def test_ex2_poly_is_a_tuning_key_and_a_benchmark_column():
    """The tuned path keys its choice on ``ex2_poly`` (like ``pin_overlap``), and the A/B's
    ``--configs '[{"ex2_poly": 2}]'`` labels its column ``ex2_poly=2``."""
    import inspect

    assert "ex2_poly" in inspect.signature(fa.attention_forward).parameters
    assert "ex2_poly" in inspect.signature(fa.attention).parameters
    assert "ex2_poly" in inspect.signature(fa._forward).parameters
    assert "ex2_poly" in inspect.signature(fa._differentiable).parameters
    assert "ex2_poly" in inspect.signature(fa.attention_varlen_forward).parameters
    assert "ex2_poly" in fa.attention_tuned.key
    assert fa._opts_tag(False, fa.RESCALE_THRESHOLD, 2) == "_poly2"
    assert fa._opts_tag(False, fa.RESCALE_THRESHOLD, 0) == ""
