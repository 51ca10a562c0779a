"""CPU checks of the attention forward's runtime sizes, layouts, sliding window and soft cap.

* The block plan with a window (``masks.block_plan``) is checked exhaustively on small
  sizes: every key a stored row may see lies in a visited block, every block before the
  first visited one holds no such key, and unmasked blocks hold only allowed keys.
* Sizes are kernel parameters: kernels of two sequence lengths (and batches, totals of
  packed rows) have one PTX, so one cubin.
* The simulator (``ptxsim``) runs the kernels on ragged sizes against float64
  (``fwd_reference.reference``): ``(B, H, S, D)`` layouts, windows, soft caps, packed
  sequences (an empty one included).
* Window and soft-cap kernels assemble with ptxas without spills; bad values raise
  ``ConfigError`` at the caller's line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from pyptx_kernels.flash_attention import fwd_config, fwd_kernel, fwd_reference, masks
from pyptx_kernels.flash_attention.fwd_config import ForwardConfig

from pyptx.errors import ConfigError

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptxsim  # noqa: E402

_dev, _f64 = ptxsim.device_bits, ptxsim.host_f64


# ------------------------------------------------------------------ block plan
WINDOWS = [(-1, -1), (0, -1), (5, -1), (64, -1), (100, 30), (200, 0), (-1, 7), (130, 130)]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("BN,bm", [(64, 128), (128, 192), (80, 192)])
def test_block_plan_with_a_window_visits_exactly_the_allowed_blocks(window, causal, BN, bm):
    for seqlen_q, seqlen_k in ((1, 1), (77, 77), (200, 333), (333, 200), (512, 512)):
        allowed = fwd_reference.allowed_keys(seqlen_q, seqlen_k, causal, window).numpy()
        for m0 in range(0, seqlen_q, bm):
            first, lo, hi, end = masks.block_plan(m0, seqlen_q, seqlen_k, BN, causal, bm,
                                                  window)
            assert first <= lo <= hi and hi <= max(end, hi) and lo <= max(end, first)
            rows = allowed[m0:m0 + bm]
            keys = np.nonzero(rows.any(0))[0]
            if keys.size:       # every key a stored row sees is in a visited block
                assert first * BN <= keys.min() and keys.max() < end * BN
            # blocks [lo, hi) need no mask for any of the bm rows (past seqlen_q too)
            for r in range(m0, m0 + bm):
                low, lim = masks.row_limit(r, seqlen_k, causal, window)
                low = 0 if low is None else low
                for j in range(lo, hi):
                    assert low <= j * BN and (j + 1) * BN <= lim, (r, j)


def test_window_skips_blocks_outside_it():
    """A causal 512-key window over 4096 keys visits at most 5 of 32 blocks per query block,
    under a third of the causal plan's blocks."""
    S = 4096
    visited = [masks.block_plan(m0, S, S, 128, True, 128, (512, -1)) for m0 in range(0, S, 128)]
    assert max(end - first for first, _, _, end in visited) == 5
    full = [masks.block_plan(m0, S, S, 128, True, 128) for m0 in range(0, S, 128)]
    assert sum(e - f for f, _, _, e in visited) * 3 < sum(e - f for f, _, _, e in full)


# ------------------------------------------------------------------ runtime sizes
def test_sequence_lengths_and_batch_are_kernel_parameters():
    one = fwd_kernel.build_attention(2, 1000, 4, 2, 128, causal=True).ptx()
    assert fwd_kernel.build_attention(2, 1001, 4, 2, 128, causal=True).ptx() == one
    assert fwd_kernel.build_attention(3, 1500, 4, 2, 128, causal=True, Sk=1700).ptx() == one
    pers = ForwardConfig(persistent=True)
    a = fwd_kernel.build_attention(1, 300, 4, 4, 64, config=pers).ptx()
    assert fwd_kernel.build_attention(5, 777, 4, 4, 64, config=pers).ptx() == a
    v = fwd_kernel.build_attention_varlen(300, 300, 2, 4, 2, 64, 200, causal=True).ptx()
    assert fwd_kernel.build_attention_varlen(901, 850, 7, 4, 2, 64, 600, causal=True).ptx() == v


# ------------------------------------------------------------------ simulator
def _inputs(B, S, Sk, Hq, Hkv, D, layouts, seed):
    """Device bits of q, k, v in their memory ``layouts`` and their (B, S, H, D) torch
    float64 views."""
    rng = np.random.default_rng(seed)
    out, ref = [], []
    for (L, H), lay in zip(((S, Hq), (Sk, Hkv), (Sk, Hkv)), layouts):
        x = _dev(rng.standard_normal((B, L, H, D)), "bf16")
        x64 = torch.from_numpy(_f64(x, "bf16"))
        out.append(np.ascontiguousarray(x.transpose(0, 2, 1, 3)) if lay == "bhsd" else x)
        ref.append(x64)
    return out, ref


def _check(o, lse, ref):
    ok, eo, el = fwd_reference.check(torch.from_numpy(_f64(o, "bf16")),
                                     torch.from_numpy(lse.view(np.float32).copy()), *ref,
                                     "bf16")
    assert ok, f"max |o err| {eo:.3e}, lse rel err {el:.3e}"


@pytest.mark.parametrize("B,S,Sk,D,causal,window,softcap,layouts,config", [
    # runtime sizes at ragged lengths, S != Sk
    (2, 130, 201, 64, False, (-1, -1), 0.0, ("bshd",) * 3, {}),
    # (B, H, S, D) inputs, mixed
    (1, 200, 200, 64, True, (-1, -1), 0.0, ("bhsd", "bhsd", "bhsd"), {}),
    (1, 150, 260, 128, False, (-1, -1), 0.0, ("bhsd", "bshd", "bhsd"),
     dict(schedule="simple")),
    # sliding windows: left only (causal), both sides, right only
    (1, 333, 333, 64, True, (70, -1), 0.0, ("bshd",) * 3, {}),
    (1, 300, 280, 64, False, (90, 40), 0.0, ("bshd",) * 3, dict(consumers=2)),
    (1, 260, 260, 128, False, (-1, 20), 0.0, ("bshd",) * 3, {}),
    (1, 333, 333, 64, True, (70, -1), 0.0, ("bshd",) * 3, dict(schedule="simple", BN=64)),
    # soft cap, alone and with a window and the (B, H, S, D) layout
    (1, 200, 200, 64, False, (-1, -1), 5.0, ("bshd",) * 3, {}),
    (2, 180, 180, 128, True, (100, -1), 3.0, ("bhsd",) * 3, {}),
    # the persistent walk with runtime sizes and a window
    (2, 200, 200, 64, True, (60, -1), 0.0, ("bshd",) * 3, dict(persistent=True, num_sms=3)),
])
def test_dense_features_match_float64(B, S, Sk, D, causal, window, softcap, layouts, config):
    Hq, Hkv = 2, 1
    (q, k, v), ref_in = _inputs(B, S, Sk, Hq, Hkv, D, layouts, seed=S + Sk + D)
    kern = fwd_kernel.build_attention(B, S, Hq, Hkv, D, Sk=Sk, causal=causal, window=window,
                                      softcap=softcap, layouts=layouts,
                                      config=ForwardConfig(**config))
    o, lse = ptxsim.run(kern.specialize(), [q, k, v])
    _check(o, lse, fwd_reference.reference(*ref_in, causal, None, window, softcap))


@pytest.mark.parametrize("causal,window,softcap", [
    (True, (50, -1), 0.0), (False, (40, 30), 4.0), (False, (-1, -1), 2.0)])
def test_varlen_features_match_float64(causal, window, softcap):
    """Packed sequences of 0, 130 and 75 rows (keys 40, 150, 75), one KV head for two."""
    lens_q, lens_k = [0, 130, 75], [40, 150, 75]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    Tq, Tk, Hq, Hkv, D = int(cu_q[-1]), int(cu_k[-1]), 2, 1, 64
    rng = np.random.default_rng(3)
    q = _dev(rng.standard_normal((Tq, Hq, D)), "bf16")
    k = _dev(rng.standard_normal((Tk, Hkv, D)), "bf16")
    v = _dev(rng.standard_normal((Tk, Hkv, D)), "bf16")
    kern = fwd_kernel.build_attention_varlen(Tq, Tk, 3, Hq, Hkv, D, max(lens_q), causal=causal,
                                             window=window, softcap=softcap)
    o, lse = ptxsim.run(kern.specialize(), [q, k, v, cu_q, cu_k])
    t = [torch.from_numpy(_f64(x, "bf16")) for x in (q, k, v)]
    ref = fwd_reference.reference_varlen(*t, torch.from_numpy(cu_q), torch.from_numpy(cu_k),
                                         causal, None, window, softcap)
    _check(o, lse, ref)


# ------------------------------------------------------------------ ptxas, bad values
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("schedule", fwd_config.SCHEDULES)
def test_window_and_softcap_kernels_assemble_without_spills(assemble, D, schedule):
    for kw in (dict(causal=True, window=(1024, -1)), dict(window=(256, 256), softcap=30.0),
               dict(softcap=50.0, layouts=("bhsd",) * 3)):
        k = fwd_kernel.build_attention(2, 2000, 8, 2, D, config=ForwardConfig(schedule=schedule),
                                       **kw)
        assert "0 bytes spill stores" in assemble(k.ptx()), (D, schedule, kw)
    kv = fwd_kernel.build_attention_varlen(500, 500, 3, 4, 2, D, 300, causal=True,
                                           window=(100, -1), softcap=20.0)
    assert "0 bytes spill stores" in assemble(kv.ptx())


@pytest.mark.parametrize("kw,match", [
    (dict(window=(-2, 0)), "window"), (dict(window=5), "window"), (dict(window=(1.5, 0)), "window"),
    (dict(softcap=-1.0), "softcap"), (dict(softcap=float("inf")), "softcap"),
    (dict(layouts=("bsdh",) * 3), "layouts"), (dict(layouts="bhsd"), "layouts"),
])
def test_bad_window_softcap_layouts_name_the_callers_line(kw, match):
    with pytest.raises(ConfigError, match=rf"test_attention_features_cpu\.py:\d+: .*{match}"):
        fwd_kernel.build_attention(1, 100, 2, 2, 64, **kw)


def test_bn96_three_stage_candidate_matches_float64():
    """The tuner's 96-key, three-stage plan (head dim 64): ragged keys, refills of the ring."""
    (q, k, v), ref_in = _inputs(1, 200, 333, 2, 1, 64, ("bshd",) * 3, seed=96)
    kern = fwd_kernel.build_attention(1, 200, 2, 1, 64, Sk=333,
                                      config=ForwardConfig(BN=96, stages=3))
    o, lse = ptxsim.run(kern.specialize(), [q, k, v])
    _check(o, lse, fwd_reference.reference(*ref_in))


# ------------------------------------------------------------------ the plan without timing
def test_default_plan_follows_the_wave_rule():
    """Full attention at head dim 64, B 8 x H 16, S 1024: 768 192-row blocks are 5.8 waves
    of 132 SMs, 1024 128-row blocks 7.8: two consumers (8 x 128 < 6 x 192 / 1.06). The
    benchmark's shapes (S 4096/8192, B*S = 32768, H*D = 2048) and causal calls keep the
    default plan."""
    assert fwd_config.default_plan(64, False, 8 * 16, 1024) == ForwardConfig(consumers=2)
    for D in (64, 128):
        for S in (4096, 8192):
            BH = 32768 // S * 2048 // D
            for causal in (False, True):
                assert fwd_config.default_plan(D, causal, BH, S) == ForwardConfig()
    assert fwd_config.default_plan(256, False, 128, 1024) == ForwardConfig()
    with pytest.raises(ConfigError, match="head dim"):
        fwd_config.default_plan(96, False, 1, 1)


def test_planner_names_every_tuned_plan_and_chooses_without_timing():
    from pyptx_kernels.flash_attention import fwd_host

    assert set(fwd_config.PLANS) == {c.name for c in fwd_config.ATTENTION_CONFIGS}
    assert len(fwd_config.PLANS) == len(fwd_config.ATTENTION_CONFIGS)
    kv = dict(B=8, S=1024, Hq=16, Hkv=16, D=64, Sk=1024, dtype="bf16", causal=False)
    name, how = fwd_host.PLANNER.choose(kv, device="some future GPU")
    assert (name, how) == ("consumers2", "heuristic")
    assert fwd_host.PLANNER(kv, "some future GPU") == fwd_host.PLANNER.plans["consumers2"]
    assert fwd_host.attention_planned.default is not None
