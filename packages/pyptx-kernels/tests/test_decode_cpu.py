"""CPU tests of ``attention_with_kvcache`` (``flash_attention/decode_*.py``).

* The PTX simulator (``ptxsim``) runs the one-launch decode kernel (its last CTA per
  (batch, KV head, row chunk) combines the splits: the simulator runs CTAs one at a time in
  grid order, split index fastest, so the last split's CTA combines) twice on the same
  inputs, and the two-launch reference (``build_decode(combine=False)`` + ``build_combine``)
  once, on small random inputs: both against the float64 reference (``decode_reference``),
  the one-launch result bit-identical to the two-launch one with KV splits and across the
  two calls, the arrival counters zero after each call. Contiguous and paged caches (pages
  scattered by a random permutation), ragged and empty sequences, new k/v appended inside
  the kernel (the caches compared exactly after the run), sliding windows, softcap, 1 and 4
  queries, group sizes 1, 2 and 4, one and several splits, row chunks, cache rows past the
  lengths NaN, q, the caches and k/v in strided memory (a ``(B, H, S, D)`` tensor's
  transpose, or that with NaN gaps: read in place, the appended rows written there and
  nothing else, the whole storage compared). Every case runs on both plans (the default
  tensor-core plan and ``DecodeConfig(mma=False)``, the CUDA-core one), and ``MMA_CASES``
  add tensor-core cases long enough to reach its unmasked blocks (16
  queries x 8 heads, pages 16/48/256, 2 and 6 stages, a negative scale). Outputs start
  poisoned (every byte must be written). Tolerance: ``max |o - ref|`` 2e-2 (bf16; the
  output rounding, 2**-9 relative, plus f32 sums), 1e-2 (f16); lse 1e-5 absolute (f32
  state, exact ``ex2``/``lg2`` in the simulator), ``-inf`` exactly where the reference
  has no key.
* ptxas assembles the decode kernels of both plans (one-launch and partials-only) and the
  combine kernel with no spills.
* The split heuristic, ``DecodeConfig``'s checks, the torch ops on meta tensors (shapes,
  the append op's declared mutation), bad calls (and strides) raising ``ConfigError`` at
  the caller's line, the strides ``check_call`` reads, and JAX's functional append against
  the reference's.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from pyptx.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptxsim  # noqa: E402
from pyptx_kernels import _family  # noqa: E402
from pyptx_kernels.flash_attention.decode_combine import build_combine  # noqa: E402
from pyptx_kernels.flash_attention.decode_config import DecodeConfig  # noqa: E402
from pyptx_kernels.flash_attention.decode_host import choose_splits  # noqa: E402
from pyptx_kernels.flash_attention.decode_kernel import (  # noqa: E402
    DecodeShape,
    build_decode,
    counters,
)
from pyptx_kernels.flash_attention.decode_reference import (  # noqa: E402
    append_to_cache,
    reference_decode,
)

_dev, _f64 = ptxsim.device_bits, ptxsim.host_f64
TOL = {"bf16": 2e-2, "f16": 1e-2}


def _poisoned(rng, cache, lens, table):
    """A random cache whose rows past each sequence's length (and pages no table names) are
    NaN."""
    x = np.full(cache, np.nan)
    for b, n in enumerate(lens):
        pos = np.arange(n)
        if table is None:
            x[b, :n] = rng.standard_normal((n, *cache[2:]))
        else:
            x[table[b, pos // cache[1]], pos % cache[1]] = rng.standard_normal((n, *cache[2:]))
    return x


#: the bits of the gaps of a ``"padded"`` layout: a NaN no kernel may read or write
GAP = 0x7FC1


def stored(x, layout):
    """``x`` (a 4-D array of device bits) in memory laid out as ``layout``: ``(view, flat,
    whole)``, the strided view holding ``x``, the flat memory from its first element to its
    last (the kernel's argument: ``DecodeShape.span``) and the whole storage. ``None``: a
    contiguous copy (all three); ``"bhsd"``: dims 1 and 2 swapped, as a ``(B, H, S, D)``
    tensor's transpose; ``"padded"``: that with 3 more rows and 8 more columns per row,
    the gaps ``GAP``."""
    if layout is None:
        c = x.copy()
        return c, c, c
    d0, d1, d2, D = x.shape
    pad = (3, 8) if layout == "padded" else (0, 0)
    whole = np.full((d0, d2, d1 + pad[0], D + pad[1]), GAP, x.dtype)
    view = whole[:, :, :d1, :D].transpose(0, 2, 1, 3)
    view[...] = x
    st = element_strides(view)
    span = 1 + sum((n - 1) * e for n, e in zip(view.shape, st))
    return view, whole.reshape(-1)[:span], whole


def element_strides(a):
    return tuple(s // a.itemsize for s in a.strides)


def simulate(*, B=2, Sq=1, Hq=4, Hkv=2, D=64, Sk=40, lens=(17, 0), page=None, append=False,
             causal=True, window=(-1, -1), softcap=0.0, splits=2, dtype="bf16", seed=0,
             config=None, poison=False, scale=None, n_new=0, layout=None,
             strided=("Q", "KC", "VC", "KN", "VN")):
    """Run the one-launch decode kernel twice and the two-launch pair once in the simulator;
    ``(o error, lse error)`` of the one-launch result against float64 (the caches'
    storage after the calls compared exactly with the reference's append, or with itself;
    the one-launch bits checked against the two-launch ones and across its two calls, its
    counters zero after each). ``poison``: cache rows at or past each ``cache_seqlens[b]``
    (``+ n_new``) hold NaN; ``n_new``: keys the caller already wrote past the lengths (JAX's
    functional append), counted by the kernel, not the lengths. ``layout``: the memory of
    the tensors named in ``strided`` (``stored``), read and written in place through the
    strides of ``DecodeShape.strides``."""
    rng = np.random.default_rng(seed)
    q = _dev(rng.standard_normal((B, Sq, Hq, D)), dtype)
    if page:
        mp = -(-Sk // page)
        pages = B * mp + 3
        table = rng.permutation(pages)[:B * mp].reshape(B, mp).astype(np.int32)
        cache = (pages, page, Hkv, D)
    else:
        table, mp, cache = None, 0, (B, Sk, Hkv, D)
    if poison:
        kc, vc = (_dev(_poisoned(rng, cache, [n + n_new for n in lens], table), dtype)
                  for _ in range(2))
    else:
        kc, vc = (_dev(rng.standard_normal(cache), dtype) for _ in range(2))
    seq = np.array(lens, np.int32)
    kn = vn = None
    if append:
        kn, vn = (_dev(rng.standard_normal((B, Sq, Hkv, D)), dtype) for _ in range(2))
    tensors = {"Q": q, "KC": kc, "VC": vc, **({"KN": kn, "VN": vn} if append else {})}
    lay = {n: layout if n in strided else None for n in tensors}
    strides = tuple((n, element_strides(stored(x, lay[n])[0])) for n, x in tensors.items()
                    if lay[n])
    shape = DecodeShape(B, Sq, Hq, Hkv, D, cache, mp, append, n_new, strides)
    config = config or DecodeConfig()
    opts = dict(dtype=dtype, causal=causal, window=window, softcap=softcap, splits=splits,
                config=config, scale=scale)

    def inputs():
        """``(kernel inputs, {name: stored(...)})``: fresh storage of every tensor."""
        mem = {n: stored(x, lay[n]) for n, x in tensors.items()}
        args = [mem["Q"][1], mem["KC"][1], mem["VC"][1], seq] + ([table] if page else []) \
            + ([mem["KN"][1], mem["VN"][1]] if append else [])
        return args, mem
    two, two_mem = inputs()
    o_part, lse_part = ptxsim.run(build_decode(shape, combine=False, **opts).specialize(), two,
                                  inplace=True)
    o2, lse2 = ptxsim.run(build_combine(B, Sq, Hq, D, splits, dtype=dtype).specialize(),
                          [o_part, lse_part])
    fused = build_decode(shape, **opts).specialize()
    ins, ins_mem = inputs()
    cnt = [np.zeros(counters(shape, config), np.int32)] if splits > 1 else []
    runs = []
    for _ in range(2):   # the second call finds the counters the first one left
        runs.append(ptxsim.run(fused, ins + cnt, inplace=True)[:2])
        assert not any(c.any() for c in cnt), "the last CTA resets its counter"
    (o, lse), (o_again, lse_again) = runs
    assert np.array_equal(o, o_again) and np.array_equal(lse, lse_again)
    if splits > 1:
        assert np.array_equal(o, o2) and np.array_equal(lse, lse2), \
            "the one-launch combine is bit-identical to build_combine"
    else:  # nothing to combine: the merge's own rounding
        assert np.abs(_f64(o, dtype) - _f64(o2, dtype)).max() <= TOL[dtype]

    def f(x):
        return None if x is None else _f64(x, dtype)
    ro, rl, _, _ = reference_decode(f(q), f(kc), f(vc), seq + n_new, k=f(kn), v=f(vn),
                                        block_table=table, causal=causal, window=window,
                                        softcap=softcap, scale=scale)
    want = append_to_cache(kc, vc, seq, kn, vn, table) if append else (kc, vc)
    for mem in (ins_mem, two_mem):     # the rows written, nothing else (gaps included)
        for name, w in zip(("KC", "VC"), want):
            assert np.array_equal(mem[name][2], stored(w, lay[name])[2]), name
    for name in ("Q", "KN", "VN")[:3 if append else 1]:
        assert np.array_equal(ins_mem[name][2], stored(tensors[name], lay[name])[2]), name
    lse = lse.view(np.float32).astype(np.float64)
    fin = np.isfinite(rl)
    assert np.array_equal(np.isfinite(lse), fin), "lse is -inf exactly for queries w/o keys"
    err_l = float(np.abs(lse[fin] - rl[fin]).max()) if fin.any() else 0.0
    return float(np.abs(f(o) - ro).max()), err_l


CASES = {
    "contiguous_empty_seq": dict(),
    "paged_scattered_f16": dict(page=16, lens=(33, 5), Sk=48, Hq=4, Hkv=1, dtype="f16"),
    "paged_append": dict(page=16, lens=(30, 0), Sk=48, append=True, Sq=2),
    "append_two_row_chunks": dict(lens=(30, 7), append=True, Sq=4, Hq=4, Hkv=1),
    "window_left_three_splits": dict(lens=(30, 3), Sq=4, Hq=1, Hkv=1, splits=3,
                                     window=(6, -1)),
    "window_both_softcap": dict(lens=(30, 7), window=(5, 2), causal=False, Sq=4, Hq=2,
                                Hkv=2, softcap=3.0),
    "d128_group4_f16": dict(D=128, lens=(50, 20), Sk=64, Hq=8, Hkv=2, splits=3, dtype="f16"),
    "d128_paged_full_one_split": dict(D=128, lens=(50, 0), Sk=64, Hq=4, Hkv=1, Sq=4,
                                      splits=1, causal=False, page=32),
    "all_empty": dict(lens=(0, 0)),
    "padded_rows_one_key_per_step": dict(lens=(30, 3), Sq=3, Hq=4, Hkv=1, splits=1,
                                         config=DecodeConfig(rows=5, keys_per_step=1)),
    "ring_two_stages_16_key_blocks": dict(D=128, lens=(50, 20), Sk=64, Hq=4, Hkv=2, splits=2,
                                          config=DecodeConfig(ring_stages=2, block_keys=16)),
    "page_48_append": dict(lens=(90, 50), Sk=96, page=48, append=True, Sq=2),
    "ring_wraps_many_times": dict(B=1, lens=(300,), Sk=320, Hq=2, Hkv=1, splits=1, page=32,
                                  config=DecodeConfig(ring_stages=2, block_keys=16)),
    # 19 ring blocks dealt to 5 splits: shares of 3 and 4 blocks, a ragged last block
    "ring_uneven_split_shares": dict(B=1, lens=(300,), Sk=320, Hq=2, Hkv=1, splits=5,
                                     config=DecodeConfig(ring_stages=2, block_keys=16)),
    # more splits than blocks: empty splits (lse -inf) merge away
    "more_splits_than_blocks": dict(lens=(40, 9), Sk=64, splits=7,
                                    config=DecodeConfig(ring_stages=2, block_keys=16)),
    "direct_uneven_split_shares": dict(lens=(61, 33), Sk=64, splits=3,
                                       config=DecodeConfig(ring_stages=0, keys_per_step=1)),
    "eight_rows_one_cta": dict(lens=(21, 40), Sq=2, Hq=4, Hkv=1, config=DecodeConfig(rows=8)),
    # direct loads (no ring, no producer warp)
    "direct_paged_append": dict(page=16, lens=(30, 0), Sk=48, append=True, Sq=2,
                                config=DecodeConfig(ring_stages=0)),
    "direct_window_softcap": dict(lens=(30, 7), window=(5, 2), causal=False, Sq=4, Hq=2,
                                  Hkv=2, softcap=3.0, config=DecodeConfig(ring_stages=0)),
    "direct_d128_f16": dict(D=128, lens=(50, 20), Sk=64, Hq=8, Hkv=2, splits=3, dtype="f16",
                            config=DecodeConfig(ring_stages=0)),
    # one counter per (batch, KV head, row chunk): 3 x 2 x 2 counters, each combined by its
    # own last CTA; an empty sequence in the middle
    "counters_per_row_chunk": dict(B=3, lens=(30, 0, 45), Sk=48, Sq=2, Hq=8, Hkv=2, splits=3),
    "paged_append_chunks_splits": dict(B=3, page=16, lens=(40, 0, 17), Sk=48, Sq=3, Hq=4,
                                       Hkv=2, splits=3, append=True),
    "direct_chunks_one_split": dict(B=3, lens=(30, 0, 45), Sk=48, Sq=2, Hq=8, Hkv=2, splits=1,
                                    config=DecodeConfig(ring_stages=0)),


    # cache rows past the lengths (and unused pages) NaN: never read, or read as zeros
    "nan_past_lengths_paged_append": dict(page=16, lens=(40, 3), Sk=64, Sq=2, append=True,
                                          poison=True),
    "rows_written_by_the_caller": dict(lens=(60, 0), Sk=128, Sq=3, n_new=3, poison=True),
}

MMA = DecodeConfig(mma=True)
#: the tensor-core plan (``decode_mma``): keys in blocks of 64, 16 per warp; lengths past
#: 64 reach the unmasked-block path
MMA_CASES = {
    "d128_g4_full_blocks": dict(D=128, Hq=8, Hkv=2, lens=(150, 20), Sk=192, splits=1),
    "d128_nan_past_lengths": dict(D=128, Hq=8, Hkv=2, lens=(150, 37), Sk=192, poison=True),
    "d128_page16_nan_scattered": dict(D=128, page=16, lens=(100, 0), Sk=128, Hq=4, Hkv=1,
                                      poison=True),
    "page_256": dict(page=256, lens=(300, 60), Sk=512, Hq=4, Hkv=1, splits=3, poison=True),
    "page_48_append_nan": dict(page=48, lens=(90, 50), Sk=144, append=True, Sq=2,
                               poison=True),
    # appended rows inside an unmasked block: [128, 192) with L = 192, no causal mask
    "append_inside_full_block": dict(lens=(188, 60), Sk=192, append=True, Sq=4, causal=False,
                                     splits=1, poison=True),
    "sq16_g8_eight_row_chunks": dict(B=1, Sq=16, Hq=8, Hkv=1, lens=(40,), Sk=64, splits=1),
    "sq16_g8_append_splits": dict(B=1, Sq=16, Hq=8, Hkv=1, lens=(100,), Sk=128, splits=2,
                                  append=True, poison=True),
    "g1_one_row": dict(Hq=4, Hkv=4, lens=(100, 7), Sk=128),
    "g8_sq2_sixteen_rows": dict(Hq=8, Hkv=1, Sq=2, lens=(130, 66), Sk=160, D=128,
                                dtype="f16"),
    "g2_sq3_six_rows": dict(Sq=3, lens=(129, 64), Sk=160),
    "window_left_full_blocks": dict(B=1, window=(70, -1), lens=(300,), Sk=320, Sq=4, Hq=2,
                                    Hkv=1, splits=3),
    "window_both_softcap_long": dict(causal=False, window=(100, 20), softcap=5.0,
                                     lens=(250, 30), Sk=256, Sq=4),
    "six_stages_d64_wraps": dict(B=1, lens=(900,), Sk=960, Hq=4, Hkv=1, splits=1,
                                 config=DecodeConfig(mma=True, ring_stages=8)),
    "two_stages_d128_wraps": dict(B=1, D=128, lens=(300,), Sk=320, Hq=4, Hkv=1, splits=1,
                                  config=DecodeConfig(mma=True, ring_stages=2)),
    "negative_scale": dict(lens=(100, 9), Sk=128, scale=-0.3, Sq=2),
    "f16_chunks_splits_append": dict(B=3, lens=(130, 0, 45), Sk=192, Sq=3, Hq=8, Hkv=2,
                                     splits=3, append=True, dtype="f16", poison=True),
}


#: q, the caches and k, v in strided memory (``stored``), read and written in place: the
#: transpose of ``(B, H, S, D)`` tensors (Hugging Face's caches) or that with gaps between
#: rows and heads (which must stay as they are), ragged and empty sequences, appends
#: filling the cache to its end (the gap rows past it untouched), one tensor
#: strided and the rest dense
LAYOUT_CASES = {
    "bhsd_ragged": dict(layout="bhsd", B=3, lens=(30, 0, 45), Sk=48, Hq=4, Hkv=2),
    "bhsd_d128_splits": dict(layout="bhsd", D=128, lens=(50, 20), Sk=64, Hq=8, Hkv=2,
                             splits=3),
    "padded_append_nan": dict(layout="padded", lens=(30, 7), Sk=40, append=True, Sq=4, Hq=4,
                              Hkv=1, poison=True),
    "padded_d128_append_to_the_end": dict(layout="padded", D=128, B=3, lens=(0, 62, 17),
                                          Sk=64, append=True, Sq=2, Hq=8, Hkv=2),
    "bhsd_paged_append": dict(layout="bhsd", page=16, lens=(30, 0), Sk=48, append=True, Sq=2),
    "padded_caches_only_f16": dict(layout="padded", strided=("KC", "VC"), lens=(33, 5),
                                   Sk=48, dtype="f16"),
    "padded_q_and_k_only": dict(layout="padded", strided=("Q", "KN"), Sq=3, lens=(20, 0),
                                Sk=32, append=True),
}
#: the CUDA-core plan's direct loads (no ring) and the tensor-core plan's unmasked blocks
LAYOUT_CORE_CASES = {
    "direct_padded_paged_append": dict(layout="padded", page=16, lens=(40, 0), Sk=48, Sq=2,
                                       append=True, config=DecodeConfig(ring_stages=0)),
    "direct_bhsd_d128": dict(layout="bhsd", D=128, lens=(50, 0), Sk=64, Hq=8, Hkv=2,
                             config=DecodeConfig(ring_stages=0)),
}
LAYOUT_MMA_CASES = {
    "padded_d128_full_blocks_append": dict(layout="padded", D=128, Hq=8, Hkv=2,
                                           lens=(150, 0), Sk=192, append=True, Sq=2,
                                           poison=True),
    "bhsd_page48_long": dict(layout="bhsd", page=48, lens=(130, 7), Sk=144, splits=1),
}


def _core_case(kw):
    """A case on the CUDA-core plan (its own config's fields kept)."""
    cfg = kw.get("config")
    return {**kw, "config": DecodeConfig(mma=False) if cfg is None
            else dataclasses.replace(cfg, mma=False)}


def _mma_case(kw):
    """A case on the tensor-core plan (its ring depth kept where it set one)."""
    cfg = kw.get("config")
    stages = cfg.ring_stages if cfg is not None and cfg.ring_stages else 4
    return {**kw, "config": DecodeConfig(mma=True, ring_stages=stages)}


PLAN_CASES = {**{("cuda_core", n): _core_case(kw) for n, kw in CASES.items()},
              **{("mma", n): _mma_case(kw) for n, kw in CASES.items()},
              **{("mma", n): {"config": MMA, **kw} for n, kw in MMA_CASES.items()},
              **{("cuda_core", n): _core_case(kw) for n, kw in LAYOUT_CASES.items()},
              **{("mma", n): _mma_case(kw) for n, kw in LAYOUT_CASES.items()},
              **{("cuda_core", n): _core_case(kw) for n, kw in LAYOUT_CORE_CASES.items()},
              **{("mma", n): {"config": MMA, **kw} for n, kw in LAYOUT_MMA_CASES.items()}}


@pytest.mark.parametrize("plan,name", list(PLAN_CASES), ids=[f"{p}-{n}" for p, n in PLAN_CASES])
def test_decode_matches_float64(plan, name):
    kw = PLAN_CASES[plan, name]
    err_o, err_l = simulate(**kw)
    assert err_o <= TOL[kw.get("dtype", "bf16")], err_o
    assert err_l <= 1e-5, err_l


@pytest.mark.parametrize("plan", ["cuda_core", "mma"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("layout", [None, "bhsd", "padded"])
def test_reused_kernel_at_a_second_size_matches_float64(plan, paged, layout):
    """A kernel of a second batch, cache length, table width, split count and memory layout
    (strides) runs its family's first trace (``_family``: reused, not traced) with its own
    sizes."""
    config = DecodeConfig(mma=plan == "mma")
    page = 16 if paged else None
    _family.clear()
    simulate(B=1, lens=(20,), Sk=32, page=page, append=True, Sq=2, splits=2, config=config)
    before = _family.stats()
    err_o, err_l = simulate(B=3, lens=(90, 0, 41), Sk=96, page=page, append=True, Sq=2,
                            splits=3, config=config, poison=True, seed=1, layout=layout)
    after = _family.stats()
    assert after["traced"] == before["traced"] and after["reused"] == before["reused"] + 2
    assert err_o <= TOL["bf16"], err_o
    assert err_l <= 1e-5, err_l


@pytest.mark.parametrize("D,G,Sq,paged,append,window,softcap,stages", [
    (128, 4, 1, False, False, (-1, -1), 0.0, 4),
    (128, 8, 1, True, False, (-1, -1), 0.0, 4),
    (64, 4, 1, False, False, (-1, -1), 0.0, 4),
    (128, 4, 4, True, True, (128, -1), 30.0, 4),
    (64, 8, 16, True, True, (-1, -1), 0.0, 4),
    (128, 4, 1, True, True, (-1, -1), 0.0, 0),
    (64, 8, 2, False, False, (256, -1), 0.0, 0),
])
@pytest.mark.parametrize("plan", ["cuda_core", "mma"])
def test_ptxas_no_spills(D, G, Sq, paged, append, window, softcap, stages, plan, assemble):
    cache = (16 * 64, 64, 8, D) if paged else (16, 4096, 8, D)
    shape = DecodeShape(16, Sq, 8 * G, 8, D, cache, 64 if paged else 0, append, 0)
    config = DecodeConfig(mma=True) if plan == "mma" else DecodeConfig(ring_stages=stages,
                                                                       mma=False)
    opts = dict(window=window, softcap=softcap, config=config)
    for kern in (build_decode(shape, splits=4, **opts), build_decode(shape, splits=1, **opts),
                 build_decode(shape, splits=4, combine=False, **opts),
                 build_combine(16, Sq, 8 * G, D, 4)):
        log = assemble(kern.ptx())
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
        assert spills and not any(spills), log


@pytest.mark.parametrize("B,Sk,Hq,Sq,page,splits", [
    (1, 32768, 32, 1, None, 33),     # 8 CTAs -> 264 = 2 per SM, ~993 keys each
    (4, 16384, 32, 1, None, 8),      # 32 CTAs -> 256
    (16, 4096, 32, 1, 64, 2),        # 128 CTAs -> 256 (paged: capacity from the table)
    (32, 2048, 32, 1, None, 1),      # 256 CTAs: already ~2 per SM
    (64, 1024, 32, 1, None, 1),
    (128, 4096, 32, 1, None, 1),
    (1, 32768, 8, 1, None, 33),      # G 1: one row per CTA, same grid
    (1, 32768, 32, 16, None, 8),     # 64 rows: 4 chunks of 16 x 8 KV heads = 32 CTAs
    (1, 8192, 32, 1, None, 32),      # capped: no split under 256 keys
    (1, 300, 32, 1, None, 1),
])
def test_split_heuristic_makes_one_wave_of_two_ctas_per_sm(B, Sk, Hq, Sq, page, splits):
    cache = (B * Sk // page, page, 8, 128) if page else (B, Sk, 8, 128)
    shape = DecodeShape(B, Sq, Hq, 8, 128, cache, Sk // page if page else 0)
    assert choose_splits(shape, num_sms=132) == splits


def test_split_heuristic_honours_a_fixed_count():
    one = DecodeShape(1, 1, 32, 8, 128, (1, 32768, 8, 128))
    assert choose_splits(one, DecodeConfig(num_splits=3)) == 3


@pytest.mark.parametrize("kw", [dict(rows=0), dict(rows=9), dict(keys_per_step=0),
                                dict(keys_per_step=True), dict(num_splits=-1),
                                dict(num_splits=129), dict(ring_stages=1), dict(ring_stages=9),
                                dict(block_keys=48), dict(block_keys=512), dict(mma=1),
                                dict(mma=True, rows=4), dict(mma=True, keys_per_step=2),
                                dict(mma=True, ring_stages=0), dict(mma=True, block_keys=32)])
def test_config_rejects_bad_fields_at_this_line(kw):
    with pytest.raises(ConfigError, match=r"test_decode_cpu\.py:\d+: DecodeConfig"):
        DecodeConfig(**kw)


def _meta(torch, *shape, dtype=None):
    return torch.empty(*shape, dtype=dtype or torch.bfloat16, device="meta")


def test_torch_ops_on_meta_tensors():
    torch = pytest.importorskip("torch")
    from pyptx_kernels import attention_with_kvcache

    q, kc, vc = _meta(torch, 2, 3, 8, 128), _meta(torch, 2, 64, 2, 128), \
        _meta(torch, 2, 64, 2, 128)
    lens = _meta(torch, 2, dtype=torch.int32)
    out = attention_with_kvcache(q, kc, vc, lens)
    assert out.shape == q.shape and out.dtype == q.dtype
    new = _meta(torch, 2, 3, 2, 128)
    out, lse = attention_with_kvcache(q, kc, vc, lens, k=new, v=new, return_softmax_lse=True)
    assert lse.shape == (2, 8, 3) and lse.dtype == torch.float32
    schema = torch.ops.pyptx.attention_with_kvcache_append.default._schema
    written = {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write}
    assert written == {"k_cache", "v_cache"}
    schema = torch.ops.pyptx.attention_with_kvcache.default._schema
    assert not any(a.alias_info and a.alias_info.is_write for a in schema.arguments)


def test_bad_calls_name_this_line():
    torch = pytest.importorskip("torch")
    from pyptx_kernels import attention_with_kvcache as f

    q, kc = _meta(torch, 2, 1, 8, 128), _meta(torch, 2, 64, 2, 128)
    lens = _meta(torch, 2, dtype=torch.int32)
    table = _meta(torch, 2, 4, dtype=torch.int32)
    paged = _meta(torch, 9, 24, 2, 128)
    bad = [
        (lambda: f(q, kc, kc, lens, window=(1,)), "window must be a pair"),
        (lambda: f(q, kc, kc, lens, window=(-2, 0)), r"window\[0\] must be an int"),
        (lambda: f(q, kc, kc, lens, softcap=-1.0), "softcap must be"),
        (lambda: f(q, kc, kc, lens, causal=1), "causal must be a bool"),
        (lambda: f(q, kc, kc, lens, num_splits=500), "num_splits must be"),
        (lambda: f(q, kc, _meta(torch, 2, 64, 2, 64), lens), "one 4-D shape"),
        (lambda: f(_meta(torch, 2, 17, 8, 128), kc, kc, lens), "1..16 queries"),
        (lambda: f(_meta(torch, 2, 1, 8, 96), _meta(torch, 2, 64, 2, 96),
                   _meta(torch, 2, 64, 2, 96), lens), "head dim"),
        (lambda: f(_meta(torch, 2, 1, 3, 128), kc, kc, lens), "multiple"),
        (lambda: f(q, kc, kc, _meta(torch, 2)), "cache_seqlens must be int32"),
        (lambda: f(q, kc, kc, lens, k=_meta(torch, 2, 1, 2, 128)), "both k and v"),
        (lambda: f(q, kc, kc, lens, k=q, v=q), r"k and v must be \(B, Sq, Hkv, D\)"),
        (lambda: f(q, paged, paged, lens, block_table=table), "page sizes of 16..256"),
        (lambda: f(q, _meta(torch, 3, 64, 2, 128), _meta(torch, 3, 64, 2, 128), lens),
         "contiguous cache"),
        (lambda: f(q.float(), kc, kc, lens), "share one dtype"),
        (lambda: f(q, kc, kc, [2, 2]), "torch tensor or a JAX array"),
    ]
    for call, msg in bad:
        with pytest.raises(ConfigError, match=rf"test_decode_cpu\.py:\d+: "
                                              rf"attention_with_kvcache: .*{msg}"):
            call()


def test_strides_read_in_place_and_bad_ones_name_this_line(monkeypatch):
    """``check_call`` on CPU tensors (standing in for CUDA ones): a (B, H, S, D) cache's
    transpose, padded rows and a strided q are ``DecodeShape.strides`` (a size-1 dim's
    stride does not count); a non-unit last stride, a stride off the 16-byte grid, an
    overlap (a broadcast, or heads inside a row) and a misaligned start raise at this
    line."""
    torch = pytest.importorskip("torch")
    from pyptx_kernels import _common
    from pyptx_kernels import attention_with_kvcache as f
    from pyptx_kernels.flash_attention.decode_api import check_call

    monkeypatch.setattr(_common, "check_devices", lambda *a: None)
    bf = torch.bfloat16

    def z(*shape):
        return torch.zeros(*shape, dtype=bf)
    q, kc, lens = z(2, 1, 8, 128), z(2, 64, 2, 128), torch.zeros(2, dtype=torch.int32)
    hf = z(2, 2, 64, 128).transpose(1, 2)
    padded = z(2, 2, 70, 136)[:, :, :64, :128].transpose(1, 2)
    q_hf = z(2, 8, 3, 128).transpose(1, 2)
    shape, _ = check_call(z(2, 8, 1, 128).transpose(1, 2), hf, padded, lens, None, None, None)
    assert shape.strides == (("KC", (2 * 64 * 128, 128, 64 * 128, 1)),
                             ("VC", (2 * 70 * 136, 136, 70 * 136, 1)))
    shape, _ = check_call(q_hf, kc, kc, lens, z(2, 3, 2, 128), z(2, 3, 2, 128), None)
    assert shape.strides == (("Q", (8 * 3 * 128, 128, 3 * 128, 1)),)
    here = r"test_decode_cpu\.py:\d+: attention_with_kvcache: "
    rule = "must have a unit-stride last dim, its other strides multiples of 8 elements"
    bad = [
        (lambda: f(q, z(2, 64, 128, 2).transpose(2, 3), kc, lens), "k_cache", rule),
        (lambda: f(q, kc, z(2, 64, 2, 132)[..., :128], lens), "v_cache", rule),
        (lambda: f(q, kc, z(2, 1, 2, 128).expand(2, 64, 2, 128), lens), "v_cache", rule),
        (lambda: f(q, z(40000).as_strided((2, 64, 2, 128), (16384, 128, 64, 1)), kc, lens),
         "k_cache", rule),
        (lambda: f(z(3, 8, 1, 130)[..., :128].transpose(1, 2)[:2], kc, kc, lens), "q",
         rule),
        (lambda: f(q, kc, kc, lens, k=z(2, 1, 2, 128), v=z(2, 1, 2, 136)[..., 4:132]), "v",
         "must start at a 16-byte aligned address, got one 8 bytes past"),
        (lambda: f(z(2 * 8 * 128 + 4)[4:].view(2, 1, 8, 128), kc, kc, lens), "q",
         "must start at a 16-byte aligned address"),
    ]
    for call, name, msg in bad:
        with pytest.raises(ConfigError, match=here + name + ".*" + msg):
            call()


@pytest.mark.parametrize("paged", [False, True])
def test_jax_functional_append_matches_the_reference(paged):
    jnp = pytest.importorskip("jax.numpy")
    from pyptx_kernels.flash_attention.decode_api import _jax_append

    rng = np.random.default_rng(1)
    B, Sq, Hkv, D = 3, 4, 2, 8
    if paged:
        cache, table = (7, 16, Hkv, D), rng.permutation(7)[:6].reshape(3, 2).astype(np.int32)
    else:
        cache, table = (B, 32, Hkv, D), None
    kc, vc = (rng.standard_normal(cache).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((B, Sq, Hkv, D)).astype(np.float32) for _ in range(2))
    lens = np.array([0, 29, 30], np.int32)    # the last one runs past the end: 2 rows dropped
    want = append_to_cache(kc, vc, lens, k, v, table)
    got = _jax_append(*(jnp.asarray(x) for x in (kc, vc, lens, k, v)),
                      None if table is None else jnp.asarray(table))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)
