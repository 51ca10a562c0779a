"""GPU tests of ``attention_with_kvcache`` (``flash_attention/decode_*.py``).

Inputs are fresh random tensors with ragged lengths (empty sequences included) and, for
paged caches, pages scattered by a random permutation; outputs are poisoned (NaN) before
each launch. Reference: the float64 ``decode_reference`` on the same rounded inputs.
Tolerance: ``max |o - ref|`` 2e-2 (bf16) / 1e-2 (f16), lse 1e-3 absolute (``ex2``/``lg2``
approximations), ``-inf`` exactly for queries without keys; appended caches compared
exactly. Also: q, the caches and k, v in strided memory (the transpose of ``(B, H, S, D)``
tensors, and that with NaN gaps, which stay as they are) read and written in place,
CUDA-graph replay with lengths changed between replays, determinism, the one-launch combine
bit-identical to the two-launch reference, two streams at once,
``torch.compile(fullgraph=True)`` (dense and strided caches) and ``jax.jit``.

    pytest -m gpu packages/pyptx-kernels/tests/test_decode_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("poison_outputs"),
]

from pyptx_kernels import attention_with_kvcache  # noqa: E402
from pyptx_kernels.flash_attention import decode_api  # noqa: E402
from pyptx_kernels.flash_attention.decode_config import DecodeConfig  # noqa: E402
from pyptx_kernels.flash_attention.decode_reference import reference_decode  # noqa: E402


@pytest.fixture(params=["mma", "cuda_core"], autouse=True)
def plan(request, monkeypatch):
    """Every test on both decode plans: the public call's default (the tensor-core plan) and,
    under ``cuda_core``, ``decode_api._plan`` swapped for the CUDA-core one; the call caches
    are emptied around it."""
    if request.param == "cuda_core":
        monkeypatch.setattr(decode_api, "_plan",
                            lambda n: DecodeConfig(num_splits=n, mma=False))
    decode_api._runner.cache_clear()
    decode_api._EAGER.clear()
    yield request.param
    decode_api._runner.cache_clear()
    decode_api._EAGER.clear()

DT = {"bf16": torch.bfloat16, "f16": torch.float16}
TOL = {"bf16": 2e-2, "f16": 1e-2}


def make(B, Sq, Hq, Hkv, D, Sk, *, page=None, append=False, dtype="bf16", seed=0):
    """Random call arguments: ``(q, k_cache, v_cache, lens, k, v, block_table)``; lengths
    ragged in ``0..Sk - Sq`` (room for an append), the first sequence empty."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = DT[dtype]

    def rnd(*s):
        return torch.randn(*s, device="cuda", dtype=t, generator=g)

    if page:
        mp = -(-Sk // page)
        pages = B * mp + 5
        table = torch.randperm(pages, device="cuda", generator=g)[:B * mp].reshape(B, mp)
        table = table.to(torch.int32)
        cache = (pages, page, Hkv, D)
    else:
        table, cache = None, (B, Sk, Hkv, D)
    lens = torch.randint(0, Sk - Sq + 1, (B,), device="cuda", generator=g, dtype=torch.int32)
    lens[0] = 0
    k = rnd(B, Sq, Hkv, D) if append else None
    v = rnd(B, Sq, Hkv, D) if append else None
    return rnd(B, Sq, Hq, D), rnd(*cache), rnd(*cache), lens, k, v, table


def _np(x):
    return None if x is None else x.detach().cpu().double().numpy() \
        if x.dtype.is_floating_point else x.cpu().numpy()


def check(args, dtype, **opts):
    q, kc, vc, lens, k, v, table = args
    ref_opts = {n: x for n, x in opts.items() if n != "num_splits"}
    ref = reference_decode(*(_np(x) for x in (q, kc, vc, lens)), k=_np(k), v=_np(v),
                           block_table=_np(table), **ref_opts)
    out, lse = attention_with_kvcache(q, kc, vc, lens, k=k, v=v, block_table=table,
                                      return_softmax_lse=True, **opts)
    torch.cuda.synchronize()
    o64, l64 = out.double().cpu().numpy(), lse.double().cpu().numpy()
    assert not np.isnan(o64).any()
    err = np.abs(o64 - ref[0]).max()
    assert err <= TOL[dtype], f"max |o - ref| {err:.3e}"
    fin = np.isfinite(ref[1])
    assert np.array_equal(np.isfinite(l64), fin)
    if fin.any():
        assert np.abs(l64[fin] - ref[1][fin]).max() <= 1e-3
    if k is not None:
        assert np.array_equal(_np(kc), ref[2], equal_nan=True) \
            and np.array_equal(_np(vc), ref[3], equal_nan=True)
    return out


def strided(x, layout):
    """``(view, whole)``: ``x (d0, d1, d2, D)`` copied into ``layout``'s memory, ``whole``:
    ``"bhsd"``, a contiguous ``(d0, d2, d1, D)`` tensor (Hugging Face's caches) whose
    transpose is the view; ``"padded"``, that with 3 more rows and 8 more columns per row,
    the gaps NaN."""
    d0, d1, d2, D = x.shape
    pad = (3, 8) if layout == "padded" else (0, 0)
    whole = torch.full((d0, d2, d1 + pad[0], D + pad[1]), float("nan"), dtype=x.dtype,
                       device=x.device)
    view = whole[:, :, :d1, :D].transpose(1, 2)
    view.copy_(x)
    return view, whole


def gaps_untouched(view, whole):
    """Every element of ``whole`` outside ``view`` is still NaN."""
    inside = torch.zeros(whole.shape, dtype=torch.bool, device=whole.device)
    inside[:, :, :view.shape[1], :view.shape[3]] = True
    return bool(torch.isnan(whole[~inside]).all())


def poison_past_lengths(args):
    """``args`` (``make``'s) with every cache row at or past ``lens[b]`` (and every page no
    table row names) set to NaN, in place."""
    q, kc, vc, lens, k, v, table = args
    for c in (kc, vc):
        keep = c.clone()
        c.fill_(float("nan"))
        for b, n in enumerate(lens.tolist()):
            pos = torch.arange(n, device=c.device)
            if table is None:
                c[b, :n] = keep[b, :n]
            else:
                pages, slots = table[b, pos // c.shape[1]].long(), pos % c.shape[1]
                c[pages, slots] = keep[pages, slots]
    return args


CASES = [
    # B, Sq, Hq, Hkv, D, Sk, options
    (4, 1, 32, 8, 128, 1000, dict()),
    (3, 1, 8, 8, 64, 777, dict(dtype="f16")),
    (5, 4, 16, 2, 128, 600, dict(page=16)),
    (2, 1, 32, 4, 64, 3000, dict(page=256, append=True)),
    (3, 16, 8, 8, 128, 500, dict(append=True)),
    (3, 3, 32, 32, 128, 2100, dict(page=48, dtype="f16")),
    (64, 1, 32, 8, 128, 1024, dict()),
    (1, 1, 32, 8, 128, 32768, dict(page=64)),
]


@pytest.mark.parametrize("ring", [4, 0])
@pytest.mark.parametrize("B,Sq,Hq,Hkv,D,Sk,opts", CASES)
def test_decode_matches_float64(B, Sq, Hq, Hkv, D, Sk, opts, ring, plan):
    if plan == "cuda_core" and not ring:
        pytest.skip("the direct-load plan runs once")
    dtype = opts.get("dtype", "bf16")
    args = make(B, Sq, Hq, Hkv, D, Sk, dtype=dtype, page=opts.get("page"),
                append=opts.get("append", False))
    if ring:
        check(args, dtype)
        return
    # the direct-load plan, through the host function the public call uses
    from pyptx_kernels.flash_attention import decode_host
    from pyptx_kernels.flash_attention.decode_api import check_call

    q, kc, vc, lens, k, v, table = args
    ref = reference_decode(*(_np(x) for x in (q, kc, vc, lens)), k=_np(k), v=_np(v),
                           block_table=_np(table))
    shape, name = check_call(q, kc, vc, lens, k, v, table)
    arrays = [x for x in (q, kc, vc, lens, table, k, v) if x is not None]
    out, _ = decode_host.decode(shape, arrays, dtype=name, causal=True, window=(-1, -1),
                                softcap=0.0, scale=D ** -0.5,
                                config=DecodeConfig(ring_stages=0))
    torch.cuda.synchronize()
    assert np.abs(out.double().cpu().numpy() - ref[0]).max() <= TOL[dtype]


@pytest.mark.parametrize("layout", ["bhsd", "padded"])
@pytest.mark.parametrize("B,Sq,Hq,Hkv,D,Sk,opts", [
    (4, 1, 32, 8, 128, 1000, dict()),
    (3, 1, 8, 8, 64, 777, dict(dtype="f16")),
    (3, 4, 16, 2, 128, 600, dict(append=True)),
    (5, 4, 16, 2, 64, 600, dict(page=16, append=True)),
    (1, 1, 32, 8, 128, 32768, dict()),
    (2, 1, 32, 8, 128, 3000, dict(page=256)),
])
def test_strided_memory_matches_float64(B, Sq, Hq, Hkv, D, Sk, opts, layout):
    """q, the caches and k, v in strided memory (``strided``): read in place, the appended
    rows written into the strided caches and nothing else (the gaps stay NaN)."""
    dtype = opts.get("dtype", "bf16")
    q, kc, vc, lens, k, v, table = make(B, Sq, Hq, Hkv, D, Sk, dtype=dtype,
                                        page=opts.get("page"),
                                        append=opts.get("append", False), seed=12)
    mem = [None if x is None else strided(x, layout) for x in (q, kc, vc, k, v)]
    q, kc, vc, k, v = (None if m is None else m[0] for m in mem)
    assert not kc.is_contiguous()
    check((q, kc, vc, lens, k, v, table), dtype)
    assert all(gaps_untouched(*m) for m in mem if m is not None)


def test_torch_compile_fullgraph_appends_into_strided_caches():
    """Under ``torch.compile`` the append op writes the rows into transposed (B, H, S, D)
    caches in place, as eager does."""
    q, kc, vc, lens, k, v, _ = make(2, 2, 16, 4, 128, 512, append=True, seed=13)
    kc, vc = (strided(x, "bhsd")[0] for x in (kc, vc))
    kc2, vc2 = kc.clone(), vc.clone()
    want = attention_with_kvcache(q, kc2, vc2, lens, k=k, v=v)

    @torch.compile(fullgraph=True)
    def step(q, kc, vc, lens, k, v):
        return attention_with_kvcache(q, kc, vc, lens, k=k, v=v) * 1.0

    got = step(q, kc, vc, lens, k, v)
    assert torch.equal(got, want)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2), "the cache was written in place"


@pytest.mark.parametrize("opts", [
    dict(window=(256, -1)), dict(window=(100, 3), causal=False), dict(softcap=30.0),
    dict(softcap=5.0, window=(64, -1)), dict(causal=False), dict(scale=0.3, num_splits=7),
])
@pytest.mark.parametrize("page", [None, 32])
def test_window_softcap_and_options(opts, page):
    check(make(3, 4, 16, 4, 128, 1500, page=page, append=True, seed=1), "bf16", **opts)


@pytest.mark.parametrize("page,append", [(None, False), (16, False), (64, True),
                                         (None, True)])
def test_nan_cache_rows_past_the_lengths_are_never_used(page, append):
    """Cache rows past each length hold NaN (as after ``torch.empty``): the output stays the
    reference's, NaN-free."""
    check(poison_past_lengths(make(6, 2, 32, 8, 128, 700, page=page, append=append,
                                   seed=11)), "bf16")


def test_deterministic():
    args = make(8, 1, 32, 8, 128, 4096, page=64, seed=2)
    a = check(args, "bf16")
    b = attention_with_kvcache(*args[:4], block_table=args[6])
    assert torch.equal(a, b), "the split combine has a fixed order"


def test_cuda_graph_replays_with_new_lengths():
    q, kc, vc, lens, _, _, table = make(4, 1, 32, 8, 128, 2048, page=32, seed=3)
    out = attention_with_kvcache(q, kc, vc, lens, block_table=table)   # warm up: build
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention_with_kvcache(q, kc, vc, lens, block_table=table)
    for n in ([0, 5, 2047, 1000], [1, 1, 1, 1], [2048, 0, 17, 600]):
        lens.copy_(torch.tensor(n, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want = attention_with_kvcache(q, kc, vc, lens, block_table=table)
        assert torch.equal(out, want), f"replay with lengths {n}"
        ref = reference_decode(*(_np(x) for x in (q, kc, vc, lens)), block_table=_np(table))
        assert np.abs(out.double().cpu().numpy() - ref[0]).max() <= TOL["bf16"]


def test_torch_compile_fullgraph_appends_in_place():
    q, kc, vc, lens, k, v, _ = make(2, 1, 16, 4, 128, 512, append=True, seed=4)
    kc2, vc2 = kc.clone(), vc.clone()
    want = attention_with_kvcache(q, kc2, vc2, lens, k=k, v=v)

    @torch.compile(fullgraph=True)
    def step(q, kc, vc, lens, k, v):
        return attention_with_kvcache(q, kc, vc, lens, k=k, v=v) * 1.0

    got = step(q, kc, vc, lens, k, v)
    assert torch.equal(got, want)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2), "the cache was written in place"


def test_jax_jit_returns_the_updated_caches(jax_gpu):
    import jax
    import jax.numpy as jnp

    args = make(3, 2, 16, 4, 128, 700, page=16, append=True, seed=5)
    q, kc, vc, lens, k, v, table = (None if x is None else jnp.asarray(x.cpu().float().numpy()
                                    if x.dtype.is_floating_point else x.cpu().numpy())
                                    for x in args)
    q, kc, vc, k, v = (x.astype(jnp.bfloat16) for x in (q, kc, vc, k, v))
    fn = jax.jit(lambda *a: attention_with_kvcache(*a[:4], k=a[4], v=a[5], block_table=a[6]))
    out, kc_new, vc_new = fn(q, kc, vc, lens, k, v, table)
    ref = reference_decode(*(np.asarray(x, np.float64) if x.dtype != jnp.int32 else
                             np.asarray(x) for x in (q, kc, vc, lens)),
                           k=np.asarray(k, np.float64), v=np.asarray(v, np.float64),
                           block_table=np.asarray(table))
    assert np.abs(np.asarray(out, np.float64) - ref[0]).max() <= TOL["bf16"]
    assert np.array_equal(np.asarray(kc_new, np.float64), ref[2])
    assert np.array_equal(np.asarray(vc_new, np.float64), ref[3])


def test_checked_call_cache_still_checks_and_follows_lengths():
    """A repeated eager call skips the checks (its key was checked once), but a call that
    differs in any argument's type is checked again: ``causal=1`` is not ``True``."""
    from pyptx.errors import ConfigError

    q, kc, vc, lens, _, _, table = make(3, 2, 16, 4, 128, 900, page=16, seed=6)
    for _ in range(2):
        check((q, kc, vc, lens, None, None, table), "bf16")
    lens.copy_(torch.tensor([900, 0, 31], dtype=torch.int32))
    check((q, kc, vc, lens, None, None, table), "bf16")
    with pytest.raises(ConfigError, match=r"test_decode_gpu\.py:\d+: .*causal must be a bool"):
        attention_with_kvcache(q, kc, vc, lens, block_table=table, causal=1)


@pytest.mark.parametrize("B,Sk,splits", [(1, 32768, 0), (1, 5000, 33), (2, 3000, 7)])
def test_balanced_splits_match_float64(B, Sk, splits):
    """Split counts that leave the blocks unevenly dealt (33 splits over ~990-key shares,
    7 over ragged lengths) against float64, contiguous and paged."""
    for page in (None, 64):
        check(make(B, 1, 32, 8, 128, Sk, page=page, seed=7), "bf16", num_splits=splits)


@pytest.mark.parametrize("page", [None, 32])
@pytest.mark.parametrize("B,Sk,splits", [(2, 3000, 7), (4, 2048, 0), (1, 9000, 33), (16, 512, 1)])
def test_one_launch_is_bit_identical_to_two_launches(B, Sk, splits, page):
    """The one-launch kernel (its last CTA per (batch, KV head) combines the splits) against
    the two-launch reference (``build_decode(combine=False)`` + ``build_combine``): the same
    bits with splits, three calls in a row (each finds the counters the last one left zero),
    and the cached counters zero afterwards; with one split (no combine) within rounding."""
    from pyptx_kernels import _common
    from pyptx_kernels.flash_attention import decode_host
    from pyptx_kernels.flash_attention.decode_api import check_call
    from pyptx_kernels.flash_attention.decode_combine import build_combine
    from pyptx_kernels.flash_attention.decode_kernel import build_decode

    q, kc, vc, lens, _, _, table = make(B, 1, 32, 8, 128, Sk, page=page, seed=8)
    shape, name = check_call(q, kc, vc, lens, None, None, table)
    config, sms = decode_api._plan(splits), decode_host.device_sms(q)
    n = decode_host.choose_splits(shape, config, sms)
    arrays = [x for x in (q, kc, vc, lens, table) if x is not None]
    dec = build_decode(shape, dtype=name, splits=n, config=config, combine=False)
    want = build_combine(B, 1, 32, 128, n, dtype=name)(*dec(*arrays))
    for _ in range(3):
        got = decode_host.decode(shape, arrays, dtype=name, causal=True, window=(-1, -1),
                                 softcap=0.0, scale=128 ** -0.5, config=config, num_sms=sms)
        torch.cuda.synchronize()
        if n > 1:
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        else:
            assert (got[0].float() - want[0].float()).abs().max().item() <= 2e-2
    assert all(not c.any().item() for c in _common._ZEROED.values())
    check((q, kc, vc, lens, None, None, table), "bf16", num_splits=splits)


def test_two_streams_keep_their_own_counters():
    """Calls issued on two streams at once (each stream its own counters) give the bits of
    calls on one stream."""
    q, kc, vc, lens, _, _, table = make(8, 1, 32, 8, 128, 4096, page=64, seed=9)
    want = attention_with_kvcache(q, kc, vc, lens, block_table=table, num_splits=9)
    streams = [torch.cuda.Stream() for _ in range(2)]
    torch.cuda.synchronize()
    outs = []
    for i in range(8):
        with torch.cuda.stream(streams[i % 2]):
            outs.append(attention_with_kvcache(q, kc, vc, lens, block_table=table,
                                               num_splits=9))
    torch.cuda.synchronize()
    for o in outs:
        assert torch.equal(o, want)
