"""CPU checks of the flash-attention backward example (examples/hopper/flash_attention_bwd.py).

* ptxas accepts both kernels for D 64/128, bf16/f16, causal/full, GQA (``assemble``);
* bad sizes are ``ConfigError``; the pair is a kernel-like backward for
  ``differentiable_kernel(..., save_outputs=[0, 1])``;
* a torch float64 model of the exact tiling, fragment coordinates, masks, loop bounds and
  16-bit rounding of P and dS (what every thread of every CTA computes, vectorised over
  threads) matches autograd of plain attention on ragged, causal, GQA sizes; its error
  (rel. Frobenius ~3e-3 for bf16) sizes the GPU tolerance;
* the 16-bit A-operand fragment of wgmma (PTX ISA, m64k16 register layout) is the
  accumulator's register pairs, the claim the P/dS-from-registers products rest on.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pyptx.errors import ConfigError
from pyptx.fragment import Accumulator, accumulator_coord

torch = pytest.importorskip("torch")

from pyptx_kernels.flash_attention import backward as fab  # noqa: E402
from pyptx_kernels.flash_attention import bwd_checks  # noqa: E402


@pytest.mark.parametrize("D,dtype,causal,Hq,Hkv,S,Sk", [
    (64, "bf16", False, 4, 2, 200, 200),
    (64, "f16", True, 2, 1, 333, 333),
    (128, "bf16", True, 8, 1, 1000, 1000),
    (128, "f16", False, 2, 2, 129, 77),
])
def test_ptxas_accepts_both_kernels(D, dtype, causal, Hq, Hkv, S, Sk, assemble):
    """The fast schedule assembles without spills; the safe one (a bisecting aid) assembles."""
    for safe in (False, True) if D == 128 and causal else (False,):
        bwd = fab.build_attention_backward(2, S, Hq, Hkv, D, Sk=Sk, dtype=dtype, causal=causal,
                                           safe=safe)
        for k in (bwd.dq_kernel, bwd.dkdv_kernel):
            log = assemble(k.ptx())
            assert safe or "0 bytes spill stores" in log, log


@pytest.mark.parametrize("BQ", [64, 32])
@pytest.mark.parametrize("S,Sk", [(128, 128), (200, 200), (333, 190), (190, 333), (64, 1000)])
@pytest.mark.parametrize("causal", [False, True])
def test_blocks_the_fast_schedule_leaves_unmasked_need_no_mask(S, Sk, causal, BQ):
    """The fast schedule masks a block only where ``need`` (the kernels' condition) holds;
    every element of every other block must be allowed (kv < Sk, q < S, kv <= q if causal);
    for the dK/dV kernel's q blocks of 64 rows and of 32 (the default)."""
    def allowed(q, kv):
        return q < S and kv < Sk and (not causal or kv <= q)

    BKV, BM = 64, fab.BM
    for qb in range(-(-S // BM)):          # dQ kernel: CTA rows q0..q0+127, kv block j
        q0 = qb * BM
        n_kv = min((q0 + BM - 1) // BKV + 1, -(-Sk // BKV)) if causal else -(-Sk // BKV)
        for j in range(n_kv):
            need = j * BKV + BKV > Sk or (causal and j * BKV + BKV - 1 > q0)
            if not need:
                assert all(allowed(q, kv) or q >= S for q in range(q0, q0 + BM)
                           for kv in range(j * BKV, j * BKV + BKV))
        for j in range(n_kv, -(-Sk // BKV)):  # skipped blocks are wholly masked
            assert not any(allowed(q, kv) for q in range(q0, q0 + BM)
                           for kv in range(j * BKV, j * BKV + BKV))
    for kb in range(-(-Sk // BM)):         # dK/dV kernel: CTA kv rows k0..k0+127, q block
        k0 = kb * BM
        qb0 = k0 // BQ if causal else 0
        for qb in range(qb0, -(-S // BQ)):
            q0 = qb * BQ
            need = q0 + BQ > S or (causal and q0 < k0 + BM - 1)
            if not need:
                assert all(allowed(q, kv) or kv >= Sk for q in range(q0, q0 + BQ)
                           for kv in range(k0, k0 + BM))
        for qb in range(0, qb0):
            assert not any(allowed(q, kv) for q in range(qb * BQ, qb * BQ + BQ)
                           for kv in range(k0, k0 + BM))


def test_bad_sizes_are_config_errors():
    with pytest.raises(ConfigError, match="head dim D must be 64 or 128, got 96"):
        fab.build_attention_backward(1, 128, 2, 2, 96)
    with pytest.raises(ConfigError, match=r"Hq \(6\) must be a multiple of Hkv \(4\)"):
        fab.build_attention_backward(1, 128, 6, 4, 64)
    with pytest.raises(ConfigError, match="dtype must be 'bf16' or 'f16'"):
        fab.build_attention_backward(1, 128, 2, 2, 64, dtype="f32")


def test_pair_is_a_kernel_like_backward_with_saved_outputs():
    import pyptx

    bwd = fab.build_attention_backward(2, 300, 4, 2, 64, causal=True)
    assert len(bwd.in_specs) == 7 and len(bwd.out_specs) == 3
    assert bwd.arg_names[:7] == ("q", "k", "v", "o", "lse", "do", "dlse")

    class Fwd:  # the forward's interface: (q, k, v) -> (o, lse)
        in_specs = bwd.in_specs[:3]
        out_specs = (bwd.in_specs[3], bwd.in_specs[4])
        arg_names = ("q", "k", "v", "o", "lse")
        name = "attn_fwd"

        def __call__(self, *a):
            raise AssertionError("not launched here")

    op = pyptx.differentiable_kernel(Fwd(), bwd, save_for_backward=[0, 1, 2],
                                     save_outputs=[0, 1], num_grad_inputs=3)
    assert op.saved_outputs == (0, 1)


def test_a_fragment_is_the_accumulator_pairs():
    """PTX ISA wgmma m64k16 A in registers (16-bit): warp w holds rows 16w..16w+15; lane l
    (g = l // 4, c = l % 4) holds a0,a1 = (g, 2c..2c+1), a2,a3 = (g+8, 2c..), a4,a5 =
    (g, 2c+8..), a6,a7 = (g+8, 2c+8..). Register m of the packed accumulator (elements
    2m, 2m+1) must be A register m % 4 of k-chunk m // 4."""
    for w in range(4):
        for lane in range(32):
            g, c = lane // 4, lane % 4
            for m in range(32):
                kk, j = divmod(m, 4)
                want = (16 * w + g + 8 * (j % 2), 16 * kk + 2 * c + 8 * (j // 2))
                r0, c0 = accumulator_coord(2 * m, w, lane)
                r1, c1 = accumulator_coord(2 * m + 1, w, lane)
                assert (r0, c0) == want and (r1, c1) == (want[0], want[1] + 1)


# ------------------------------------------------------------------ the model
def _frag(n):
    """Per (thread t in 0..127, register i) of an m64 x n fragment: row0, col0, dr, dc."""
    t = torch.arange(128)[:, None]
    i = torch.arange(n // 2)[None, :]
    w, lane = t // 32, t % 32
    row0 = (16 * w + lane // 4).expand(128, n // 2)
    col0 = (2 * (lane % 4)).expand(128, n // 2)
    dr = (8 * ((i // 2) % 2)).expand(128, n // 2)
    dc = (8 * (i // 4) + i % 2).expand(128, n // 2)
    return row0, col0, dr, dc


def _r16(x, dt):
    return x.to(dt).double()


def _tile(x, r0, rows):
    """rows r0..r0+rows-1 of (S, D), zeros past the end (the tensor copy's fill)."""
    out = torch.zeros(rows, x.shape[1], dtype=x.dtype)
    n = max(0, min(rows, x.shape[0] - r0))
    out[:n] = x[r0:r0 + n]
    return out


def model_dq(q, k, v, o, lse, do, causal, scale, dt, BKV=64):
    B, S, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    c1 = scale * fab.LOG2E
    dq = torch.full(q.shape, float("nan"), dtype=torch.float64)
    delta = torch.full((B, Hq, S), float("nan"), dtype=torch.float64)
    row0, col0, dr, dc = _frag(BKV)
    rowD, colD, drD, dcD = _frag(D)
    num_kv = -(-Sk // BKV)
    for b in range(B):
        for hq in range(Hq):
            hk = hq // G
            for qb in range(-(-S // fab.BM)):
                q0 = qb * fab.BM
                n_kv = min((q0 + fab.BM - 1) // BKV + 1, num_kv) if causal else num_kv
                for w in range(2):
                    qrow = q0 + w * 64 + row0           # (128, n/2), + dr
                    rows = qrow + dr
                    valid = rows < S
                    rc = rows.clamp(max=S - 1)
                    dlt = torch.where(valid, (do[b, rc, hq].double() * o[b, rc, hq].double()).sum(-1), 0.0)
                    lse2 = torch.where(valid, lse[b, hq, rc].double(), 0.0) * fab.LOG2E
                    lim = torch.minimum(rows, torch.tensor(Sk - 1)) if causal else torch.full_like(rows, Sk - 1)
                    qt = _tile(q[b, :, hq].double(), q0 + 64 * w, 64)
                    dot = _tile(do[b, :, hq].double(), q0 + 64 * w, 64)
                    acc = torch.zeros(64, D, dtype=torch.float64)
                    for j in range(n_kv):
                        kt = _tile(k[b, :, hk].double(), j * BKV, BKV)
                        vt = _tile(v[b, :, hk].double(), j * BKV, BKV)
                        s = (qt @ kt.T)[row0 + dr, col0 + dc]
                        dp = (dot @ vt.T)[row0 + dr, col0 + dc]
                        room = lim - (j * BKV + col0)
                        p = torch.where(room >= dc, torch.exp2(s * c1 - lse2), 0.0)
                        ds = p * (dp - dlt)
                        ds_t = torch.zeros(64, BKV, dtype=torch.float64)
                        ds_t[row0 + dr, col0 + dc] = _r16(ds, dt)
                        acc += ds_t @ kt
                    out = acc[rowD + drD, colD + dcD] * scale
                    r = q0 + 64 * w + rowD + drD
                    keep = r < S
                    dq[b, r[keep], hq, (colD + dcD)[keep]] = _r16(out[keep], dt)
                    delta[b, hq, rows[valid]] = dlt[valid]
    return dq, delta


def model_dkdv(q, k, v, lse, do, delta, causal, scale, dt, BQ=64):
    B, S, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    c1 = scale * fab.LOG2E
    dk = torch.full(k.shape, float("nan"), dtype=torch.float64)
    dv = dk.clone()
    row0, col0, dr, dc = _frag(BQ)
    rowD, colD, drD, dcD = _frag(D)
    num_q = -(-S // BQ)
    for b in range(B):
        for hk in range(Hkv):
            for kb in range(-(-Sk // fab.BM)):
                k0 = kb * fab.BM
                qb0 = k0 // BQ if causal else 0
                for w in range(2):
                    kvrow = k0 + w * 64 + row0
                    kt = _tile(k[b, :, hk].double(), k0 + 64 * w, 64)
                    vt = _tile(v[b, :, hk].double(), k0 + 64 * w, 64)
                    acc_k = torch.zeros(64, D, dtype=torch.float64)
                    acc_v = torch.zeros(64, D, dtype=torch.float64)
                    for g in range(G):
                        hq = hk * G + g
                        for qb in range(qb0, num_q):
                            q0 = qb * BQ
                            qt = _tile(q[b, :, hq].double(), q0, BQ)
                            dot = _tile(do[b, :, hq].double(), q0, BQ)
                            st = (kt @ qt.T)[row0 + dr, col0 + dc]
                            dpt = (vt @ dot.T)[row0 + dr, col0 + dc]
                            qc = q0 + col0
                            hi = S - qc
                            cols = (qc + dc).clamp(max=S - 1)
                            lse2 = torch.where(hi > dc, lse[b, hq, cols].double(), 0.0) * fab.LOG2E
                            dl = torch.where(hi > dc, delta[b, hq, cols].double(), 0.0)
                            p = torch.where(hi > dc, torch.exp2(st * c1 - lse2), 0.0)
                            if causal:
                                lo = kvrow + dr - qc
                                p = torch.where(lo <= dc, p, 0.0)
                            ds = p * (dpt - dl)
                            pt = torch.zeros(64, BQ, dtype=torch.float64)
                            dst = torch.zeros(64, BQ, dtype=torch.float64)
                            pt[row0 + dr, col0 + dc] = _r16(p, dt)
                            dst[row0 + dr, col0 + dc] = _r16(ds, dt)
                            acc_v += pt @ dot
                            acc_k += dst @ qt
                    r = k0 + 64 * w + rowD + drD
                    keep = r < Sk
                    cc = (colD + dcD)[keep]
                    dk[b, r[keep], hk, cc] = _r16(acc_k[rowD + drD, colD + dcD][keep] * scale, dt)
                    dv[b, r[keep], hk, cc] = _r16(acc_v[rowD + drD, colD + dcD][keep], dt)
    return dk, dv


@pytest.mark.parametrize("B,S,Hq,Hkv,D,causal,dtn,BQ", [
    (1, 200, 2, 1, 64, True, "bf16", 64),
    (1, 150, 2, 2, 64, False, "f16", 64),
    (1, 130, 2, 1, 128, True, "bf16", 64),
    (1, 170, 2, 1, 128, True, "bf16", 32),    # the default 32-row q blocks
    (1, 99, 2, 2, 128, False, "f16", 32),
])
def test_model_of_the_tiling_matches_float64_autograd(B, S, Hq, Hkv, D, causal, dtn, BQ):
    """Every element written (no NaN left), and within the 16-bit rounding of P, dS and the
    outputs: rel. error < 1e-2 (measured ~3e-3 bf16, ~5e-4 f16)."""
    torch.manual_seed(0)
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtn]
    q, do = (torch.randn(B, S, Hq, D).to(dt) for _ in range(2))
    k, v = (torch.randn(B, S, Hkv, D).to(dt) for _ in range(2))
    o, lse, rq, rk, rv = fab.reference(q, k, v, do, causal)
    scale = 1 / math.sqrt(D)
    dq, delta = model_dq(q, k, v, o.to(dt), lse.float(), do, causal, scale, dt)
    dk, dv = model_dkdv(q, k, v, lse.float(), do, delta, causal, scale, dt, BQ=BQ)
    for name, got, ref in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        assert not torch.isnan(got).any(), f"{name}: unwritten elements"
        err = ((got - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (name, err)
    want = (do.double() * o.to(dt).double()).sum(-1).permute(0, 2, 1)
    torch.testing.assert_close(delta, want)


def test_register_a_probe_assembles(assemble):
    """The bisecting probe (A from registers x MN-major B) that ``__main__`` runs first."""
    for n in (64, 128):
        assemble(bwd_checks.build_register_a_probe(n, 64).ptx())


@pytest.mark.parametrize("D,causal", [(64, True), (128, False)])
@pytest.mark.parametrize("dq_bulk", [False, True])
def test_atomic_dq_kernels_assemble(D, causal, dq_bulk, assemble):
    """Both dQ reductions assemble; the bulk one adds each warpgroup's tile with TMA tile
    reductions (two 32-column f32 slabs) and waits for their reads before exit."""
    bwd = fab.build_attention_backward(2, 200, 4, 2, D, causal=causal, atomic_dq=True,
                                       dq_bulk=dq_bulk)
    assert bwd.dq_kernel is None and len(bwd.kernels) == 3
    for k in bwd.kernels:
        assemble(k.ptx())
    text = bwd.dkdv_kernel.ptx()
    assert (text.count("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile") == 2) == dq_bulk
    assert ("red.global.add.v2.f32" in text) != dq_bulk


@pytest.mark.parametrize("num_sms", [0, True, 2.0])
def test_num_sms_must_be_a_positive_int(num_sms):
    with pytest.raises(ConfigError, match="BackwardPlan: num_sms must be"):
        fab.build_attention_backward(1, 64, 1, 1, 64, atomic_dq=True, dq_bulk=True,
                                     dq_ordered=True, dq_convert=True, num_sms=num_sms)


@pytest.mark.parametrize("S,lag", [(4096, 9), (8192, 5), (300, 1)])
def test_convert_lag_assembles_without_spills(assemble, S, lag):
    """The early converters (warps 2 and 3 of the producer, 24 registers) keep the dK/dV
    kernel free of spills; the converter CTAs are left the last ``lag`` kv heads' q blocks."""
    B, H = (32768 // S, 16) if S > 300 else (2, 2)
    assert fab.default_convert_lag(S) == lag or S == 300
    k = fab.build_dkdv(B, S, H, H, 128, atomic_dq=True, dq_bulk=True, dq_ordered=True,
                       dq_convert=True, convert_lag=lag)
    log = assemble(k.ptx())
    assert "0 bytes spill stores" in log, log
    per_head = -(-S // 64)
    n_main = B * H * -(-S // 128)
    assert k.specialize().grid == (n_main + min(lag * per_head, 132), 1, 1)


@pytest.mark.parametrize("kw,match", [
    (dict(convert_lag=2), "convert_lag needs dq_convert"),
    (dict(convert_lag=2, dq_convert=True, causal=True), "full attention"),
    (dict(convert_lag=-1, dq_convert=True), "a positive int"),
    (dict(convert_lag=2.0, dq_convert=True), "a positive int"),
    (dict(convert_lag=1, dq_convert=True, Hkv=1), "4 q blocks per CTA"),
])
def test_convert_lag_refusals(kw, match):
    kw = {"Hkv": 2, **kw}
    with pytest.raises(ConfigError, match=match):
        fab.build_attention_backward(1, 256, 2, kw.pop("Hkv"), 128, atomic_dq=True,
                                     dq_bulk=True, dq_ordered=True, **kw)


def test_dq_bulk_needs_atomic_dq():
    with pytest.raises(ConfigError, match="dq_bulk=True needs atomic_dq=True"):
        fab.build_attention_backward(1, 64, 1, 1, 64, dq_bulk=True)


def test_atomic_dq_mode_is_torch_only():
    import numpy as np

    bwd = fab.build_attention_backward(1, 64, 1, 1, 64, atomic_dq=True)
    x = np.zeros((1, 64, 1, 64), np.float16)
    with pytest.raises(ConfigError, match="atomic_dq=True adds into a buffer in place: torch"):
        bwd(x, x, x, x, np.zeros((1, 1, 64), np.float32), x)


def test_ds_tile_stores_fill_the_mn_major_swizzled_layout():
    """The atomic mode's dS stores: thread (warpgroup w, lane) writes packed pair m of its
    dS^T fragment (kv row 64w + row, q columns c, c+1) at ``(64w + row0 + dr) * 128 +
    ((lane/4) ^ blk) * 16 + (lane%4) * 4``. That must be where a 64 (q) x 128 (kv) MN-major
    tile with the 128-byte swizzle keeps element (q, kv): row kv, 16-byte chunk (q*2/16) XOR
    (kv % 8), and every 4-byte word written exactly once."""
    seen = {}
    for w in range(2):
        for warp in range(4):
            for lane in range(32):
                row0, col0 = 16 * warp + lane // 4, 2 * (lane % 4)
                for m in range(16):             # the 64 columns' 16 packed pairs
                    dr, dc = Accumulator.coord(2 * m)
                    addr = (64 * w + row0 + dr) * 128 + (((lane >> 2) ^ (dc // 8)) << 4) \
                        + (lane & 3) * 4
                    kv, q = 64 * w + row0 + dr, col0 + dc
                    want = kv * 128 + (((q * 2) // 16) ^ (kv % 8)) * 16 + (q * 2) % 16
                    assert addr == want
                    assert addr not in seen
                    seen[addr] = (kv, q)
    assert len(seen) == 128 * 64 // 2


def _sass_counts(ptx, tmp_path):
    """(HGMMA, WARPGROUP.DEPBAR) counts in the SASS of ``ptx`` and ptxas's log."""
    import shutil
    import subprocess

    ptxas, cuobjdump = shutil.which("ptxas"), shutil.which("cuobjdump")
    if not ptxas or not cuobjdump:
        pytest.skip("ptxas and cuobjdump needed")
    src, out = tmp_path / "k.ptx", tmp_path / "k.cubin"
    src.write_text(ptx)
    log = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", str(src), "-o", str(out)],
                         capture_output=True, text=True, check=True).stderr
    sass = subprocess.run([cuobjdump, "-sass", str(out)], capture_output=True, text=True,
                          check=True).stdout
    return sass.count("HGMMA"), sass.count("WARPGROUP.DEPBAR"), log


@pytest.mark.parametrize("opts,serial", [
    ({"dkdv_bq": 64, "dkdv_overlap": True}, True),  # 64 rows, overlapped: serialised (C7512)
    ({}, False),                                    # the default: 64 rows, no overlap at D=128
    ({"dkdv_bq": 32}, False),                       # 32 rows keep the overlap asynchronous
])
@pytest.mark.parametrize("causal", [False, True])
def test_dkdv_d128_wgmma_serialisation(opts, serial, causal, tmp_path):
    """At D=128 an overlapped dK/dV kernel with 64-row q blocks has too little register room
    for asynchronous wgmma: ptxas reports C7512 and waits after every HGMMA. The default (no
    overlap at D=128) and 32-row blocks remove that: 0 spills, no C7512, 3 waits per block
    loop."""
    bwd = fab.build_attention_backward(2, 1024, 4, 4, 128, causal=causal, **opts)
    hg, dep, log = _sass_counts(bwd.dkdv_kernel.ptx(), tmp_path)
    assert "0 bytes spill stores" in log, log
    assert ("C7512" in log) == serial, log
    if serial:
        assert dep >= hg
    else:
        assert dep <= 6 < hg, (hg, dep)


def test_d64_kernels_and_dq_d128_are_not_serialised(tmp_path):
    """The schedules measured at 0.8x cuDNN (D=64) and the dQ kernel keep their wgmma async."""
    for D in (64, 128):
        bwd = fab.build_attention_backward(2, 1024, 4, 4, D, causal=True)
        for k in (bwd.dq_kernel, bwd.dkdv_kernel) if D == 64 else (bwd.dq_kernel,):
            hg, dep, log = _sass_counts(k.ptx(), tmp_path)
            assert "C7512" not in log and dep <= 6 < hg, (k.name, hg, dep)


@pytest.mark.parametrize("opts", [{"dkdv_bq": 64}, {"dkdv_bq": 32}, {"dkdv_overlap": False},
                                  {"dkdv_bq": 32, "dkdv_overlap": False}])
@pytest.mark.parametrize("D,causal", [(64, True), (128, False)])
def test_options_assemble_for_every_schedule(opts, D, causal, assemble):
    """The options assemble with the fast, safe and atomic-dQ schedules; the fast one without
    spills (safe and atomic spill a few bytes at D=128 without the options too) (atomic dQ with 32-row q blocks is a ConfigError: its dS tile needs 64)."""
    for kw in ({}, {"safe": True}, {"atomic_dq": True}):
        if "atomic_dq" in kw and opts.get("dkdv_bq") == 32:
            with pytest.raises(ConfigError, match="BQ=64"):
                fab.build_attention_backward(1, 300, 2, 1, D, causal=causal, **kw, **opts)
            continue
        bwd = fab.build_attention_backward(1, 300, 2, 1, D, causal=causal, **kw, **opts)
        log = assemble(bwd.dkdv_kernel.ptx())
        assert kw or "0 bytes spill stores" in log, log


def test_overlap_needs_the_fast_schedule_and_options_parse():
    """overlap=True with safe/atomic is a ConfigError; bad option text and sizes too."""
    with pytest.raises(ConfigError, match="overlap"):
        fab.build_dkdv(1, 128, 1, 1, 64, safe=True, overlap=True)
    with pytest.raises(ConfigError, match="dkdv_bq"):
        fab.build_attention_backward(1, 128, 1, 1, 64, dkdv_bq=48)
    with pytest.raises(ConfigError, match="name=int"):
        fab.parse_options("bq=32")
    assert fab.parse_options("default") == {}
    assert fab.parse_options("dkdv_bq=32,dkdv_overlap=0") == {"dkdv_bq": 32, "dkdv_overlap": False}


def test_release_fences_the_stats_reads_before_the_next_fill():
    """Every dK/dV release is an unpredicated arrive (every consumer thread releases its own
    stats reads) preceded by ``fence.proxy.async.shared::cta``, and the empty barriers count
    one arrival per consumer thread (the racecheck fix)."""
    for kw in ({}, {"atomic_dq": True}, {"dkdv_overlap": False}):
        ptx = fab.build_attention_backward(1, 300, 2, 1, 64, causal=True, **kw).dkdv_kernel.ptx()
        lines = [ln.strip() for ln in ptx.splitlines()]
        arrives = [i for i, ln in enumerate(lines) if "mbarrier.arrive.shared::cta" in ln]
        assert arrives, kw
        for i in arrives:
            window = lines[max(0, i - 6):i]
            assert any(ln.startswith("fence.proxy.async.shared::cta") for ln in window), window
            assert not lines[i].startswith("@"), lines[i]
        assert fab.RELEASE_ARRIVALS == 256
        assert f"[empty_bar], {fab.RELEASE_ARRIVALS};" in ptx


def test_ordered_dq_ranks_are_a_fixed_order_one_step_apart():
    """The ordered dQ mode's schedule (``dq_rank`` and the q-block rotation, modelled here
    for the kernel's 64-row q blocks and 128-row kv blocks): the kv blocks adding into a q
    block hold ranks 0..n-1, and rank r + 1 reaches the q block after rank r (causal: two
    steps later; full attention with ``S == Sk``: two steps later, by the rotation), so a
    kv block's turn never waits on one behind it."""
    for S, causal in ((4096, True), (4096, False), (1000, True), (1000, False), (200, False)):
        nq, nkv = -(-S // 64), -(-S // 128)
        rotate = not causal and nq == 2 * nkv
        visits = {}                     # q block -> [(step, kv block)]
        for j in range(nkv):
            for step in range(2 * j if causal else 0, nq):
                i = (step + 2 * j) % nq if rotate else step
                visits.setdefault(i, []).append((step - (2 * j if causal else 0), j))
        for i, vs in visits.items():
            if causal:
                jmax = min((i * 64 + 63) // 128, nkv - 1)
                ranks = {j: jmax - j for _, j in vs}
            elif rotate:
                ranks = {j: ((i + nq - 2 * j) % nq) // 2 for _, j in vs}
            else:
                ranks = {j: j for _, j in vs}
            assert sorted(ranks.values()) == list(range(len(vs))), (S, causal, i)
            if causal or rotate:
                by_rank = sorted(vs, key=lambda v: ranks[v[1]])
                when = [t for t, _ in by_rank]  # steps from the kernel's start
                assert all(b - a == 2 for a, b in zip(when, when[1:])), (S, causal, i, when)


def test_deterministic_false_builds_the_bulk_dq_backward():
    """``attention(..., deterministic=False)``'s backward: prep, dK/dV with bulk dQ adds, convert."""
    from pyptx_kernels.flash_attention import fwd_config, fwd_host
    plan = fwd_config.ForwardConfig(BN=fwd_config.default_bn(128))
    fwd = fwd_host._differentiable(1, 256, 2, 2, 128, 256, "bf16", True, 0.125, plan, False)
    names = [k.name for k in fwd.backward_kernel.kernels]
    assert len(names) == 3 and "_atomic_bulk" in names[1], names


def test_attention_default_backward_per_head_dim():
    """``attention()``'s torch-eager backward: D=128 the ordered bulk-dQ kernels (five
    products, deterministic) and D=64 the fused one-kernel backward (ordered), each with the
    seven-product pair as the fallback for JAX and graph traces."""
    from pyptx_kernels.flash_attention import fwd_config, fwd_host

    def bwd_of(D):
        plan = fwd_config.ForwardConfig(BN=fwd_config.default_bn(D))
        return fwd_host._differentiable(1, 256, 2, 2, D, 256, "bf16", False, 0.1, plan,
                                        True).backward_kernel

    b128 = bwd_of(128)
    assert "_ordered" in b128.kernels[1].name and b128.fallback is not None
    assert b128.fallback.dq_kernel is not None and b128.fallback.in_specs == b128.in_specs
    b64 = bwd_of(64)
    assert any("fused" in k.name and "ordered_pp1" in k.name for k in b64.kernels), \
        [k.name for k in b64.kernels]
    assert b64.fallback is not None and b64.fallback.dq_kernel is not None
    with pytest.raises(ConfigError, match="other sizes"):
        b128.with_fallback(fab.build_attention_backward(1, 128, 2, 2, 128))


def test_two_register_swizzle_addresses_equal_the_slab_layout():
    """The bulk-dQ store's addresses (``dq_row + (dq_x ^ 16 q)``) and the dS store's
    (``ds_row + (xr16 ^ 16 blk)``) equal the 128-byte swizzle ``swizzled_rows`` spells out
    (chunk ``(chunk_hi + q) ^ (row % 8)``) for every lane and every chunk they use."""
    for lane in range(32):
        colb = (lane & 3) * 8                      # an f32 pair's byte offset in 32 bytes
        chunk_hi, xr = colb >> 4, lane >> 2
        for q in range(0, 8, 2):
            want = ((chunk_hi + q) ^ xr) * 16 + (colb & 15)
            dq_x = (((lane >> 1) & 1) ^ (lane >> 2)) << 4
            assert (lane & 1) * 8 + (dq_x ^ (q << 4)) == want
        for blk in range(8):
            assert ((xr << 4) ^ (blk << 4)) == (xr ^ blk) << 4


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_dkdv_modes_keep_wgmma_asynchronous(D, causal, assemble):
    """No dK/dV mode makes ptxas serialise its wgmma (C7510-C7519 "wgmma.mma_async
    instructions are serialized", "warpgroup.wait is injected"): that happens silently when an
    accumulator is read, or a wait is placed, where ptxas cannot prove the product done, and it
    costs far more than any schedule change gains. The bulk-dQ modes also assemble without
    spills at the benchmark's sizes."""
    for kw in ({}, {"atomic_dq": True}, {"atomic_dq": True, "dq_bulk": True},
               {"atomic_dq": True, "dq_bulk": True, "dq_ordered": True}):
        bwd = fab.build_attention_backward(8, 4096, 2048 // D, 2048 // D, D, causal=causal,
                                           **kw)
        log = assemble(bwd.dkdv_kernel.ptx())
        assert "(C751" not in log, (kw, log)
        if kw.get("dq_bulk"):       # ", 0": not "20 bytes spill stores"
            assert ", 0 bytes spill stores" in log, (kw, log)


@pytest.mark.parametrize("kw", [{}, dict(atomic_dq=True)])
def test_trace_is_for_the_bulk_modes(kw):
    """``build_dkdv(trace=True)`` (``tools/attn_bwd_trace.py``) needs ``dq_bulk``."""
    with pytest.raises(ConfigError, match="trace is for the bulk-dQ modes") as e:
        fab.build_dkdv(1, 64, 1, 1, 64, trace=True, **kw)
    assert Path(__file__).name in str(e.value)


@pytest.mark.parametrize("S,causal,lead", [(4096, False, 6), (8192, False, 4), (8192, True, 4),
                                           (4096, True, 6)])
def test_stats_lead_assembles_without_spills(assemble, S, causal, lead):
    """The stats writers (warps 2 and 3 of the producer, 24 registers; beside the early
    converters at full attention) keep the dK/dV kernel free of spills and serialised
    wgmma; ``"auto"`` is a wave of kv heads plus one (causal: named, ``"auto"`` is none)."""
    B, H = 32768 // S, 16
    assert fab.default_stats_lead(S) == lead
    k = fab.build_dkdv(B, S, H, H, 128, causal=causal, atomic_dq=True, dq_bulk=True,
                       dq_ordered=True, dq_convert=True, stats_lead=lead if causal else "auto",
                       convert_lag="auto")
    assert k.name.endswith(f"_lead{lead}") and ("_lag" in k.name) != causal
    assert k.arg_names[7:9] == ("OUT", "LSE")
    log = assemble(k.ptx())
    assert ", 0 bytes spill stores" in log and "C75" not in log, log


@pytest.mark.parametrize("kw,match", [
    (dict(stats_lead=2), "needs the ordered bulk-dQ"),
    (dict(stats_lead=2, dq_ordered=True, safe=True), "safe=True"),
    (dict(stats_lead=2, dq_ordered=True, dkdv_bq=128), "BQ=128"),
    (dict(stats_lead=0.5, dq_ordered=True), "a positive int"),
    (dict(stats_lead=True, dq_ordered=True), "a positive int"),
    (dict(stats_lead=-3, dq_ordered=True), "a positive int"),
])
def test_stats_lead_refusals(kw, match):
    kw = {"atomic_dq": True, "dq_bulk": True, **kw}
    with pytest.raises(ConfigError, match="BackwardPlan: stats_lead.*" + match):
        fab.build_attention_backward(1, 256, 2, 2, 128, **kw)


def test_stats_lead_auto_applies_where_it_can():
    """``"auto"`` resolves to ``default_stats_lead`` for the ordered bulk-dQ kernel and to
    nothing elsewhere (the any-order kernel, safe, causal attention), without an error; the
    prep then writes the first heads' stats only."""
    ordered = fab.build_attention_backward(2, 4096, 16, 16, 128, atomic_dq=True, dq_bulk=True,
                                           dq_ordered=True, stats_lead="auto")
    assert ordered.kernels[0].name.endswith("_lead6")
    assert ordered.kernels[1].name.endswith("_lead6")
    for kw in (dict(), dict(dq_ordered=True, safe=True), dict(dq_ordered=True, causal=True)):
        plain = fab.build_attention_backward(2, 4096, 16, 16, 128, atomic_dq=True,
                                             dq_bulk=True, stats_lead="auto", **kw)
        assert "lead" not in plain.kernels[1].name
    assert fab.parse_options("stats_lead=auto,convert_lag=auto") == {
        "stats_lead": "auto", "convert_lag": "auto"}
    with pytest.raises(ConfigError, match="build_prep: lead needs counters=True and Hkv"):
        fab.build_prep(1, 256, 2, 128, lead=1)



def test_backward_plan_names_the_valid_plans(monkeypatch):
    """``BackwardPlan``'s constructors are the option sets they name, build the same cached
    kernels as the keywords, ``for_eager`` is attention()'s choice, and a combination outside
    the valid plans is a ``ConfigError`` at the line that makes it."""
    P = fab.BackwardPlan
    plans = (P(), P.safe_pair(), P.atomic(), P.bulk(), P.ordered(), P.converted(), P.fused())
    assert [p.name for p in plans] == ["pair", "safe", "atomic", "bulk", "ordered", "converted",
                                       "fused"]
    assert P.lagged() == P.from_options(atomic_dq=1, dq_bulk=1, dq_ordered=1, dq_convert=1,
                                        convert_lag="auto", stats_lead="auto",
                                        kv_split="auto", dq_chains="auto",
                                        heavy_first="auto")
    assert P.fused(pingpong=1).options() == {"dq_ordered": True, "fused_bq": 128,
                                             "fused_pingpong": 1}
    monkeypatch.delenv("PYPTX_ATTN_BWD_SAFE", raising=False)
    assert (P.for_eager(64), P.for_eager(128)) == (P.fused(pingpong=1, kv_split="auto"),
                                                   P.lagged())
    assert P.for_eager(64, False) == P.fused(ordered=False, pingpong=1, kv_split="auto")
    assert P.for_eager(128, False) == P.bulk()
    monkeypatch.setenv("PYPTX_ATTN_BWD_SAFE", "1")
    assert P.for_eager(64) == P.for_eager(128) == P()
    monkeypatch.delenv("PYPTX_ATTN_BWD_SAFE")
    kw = dict(atomic_dq=True, dq_bulk=True, dq_ordered=True, dq_convert=True)
    built = fab.build_attention_backward(1, 256, 2, 2, 128, plan=P.converted())
    assert built is fab.build_attention_backward(1, 256, 2, 2, 128, **kw)
    assert len(built.kernels) == 2 and "_lead" not in built.kernels[1].name
    with pytest.raises(ConfigError, match="BackwardPlan: dq_ordered=True needs dq_bulk") as e:
        P(atomic_dq=True, dq_ordered=True)
    assert str(e.value).startswith(f"{__file__}:")
    with pytest.raises(ConfigError, match="not stats_lead"):
        P(fused_bq=128, stats_lead=2)
    with pytest.raises(ConfigError, match="plan= or option keywords, not both"):
        fab.build_attention_backward(1, 256, 2, 2, 128, plan=P(), atomic_dq=True)
    with pytest.raises(ConfigError, match="unknown options bogus"):
        P.from_options(bogus=1)
