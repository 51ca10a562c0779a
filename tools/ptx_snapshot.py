"""Fingerprint the PTX of the tensor-core example kernels: name -> sha256 of the text.

A refactor of the kernels' code that must not change what they emit is checked by
writing a snapshot before it and comparing after::

    python tools/ptx_snapshot.py --out /tmp/before.json
    ...refactor...
    python tools/ptx_snapshot.py --check /tmp/before.json

The fixed list covers every tuned configuration of the GEMM, FP8 GEMM (x scale kinds)
and grouped GEMM (forward, dgrad layout, weight gradient, split weight gradient), the
attention forward schedules x head dims 64/128 x causal (plain, persistent, varlen)
and the backward kernels (default, safe, atomic dQ, and the ones `attention()` runs in torch
eager: bulk dQ, ordered dQ converted in the grid, the fused D=64 kernel) at a square and a
ragged shape, and every tuned configuration of the row kernels (RMSNorm, LayerNorm, softmax,
SwiGLU; f32 and bf16) and the norms' backward kernels at 2048x8192 and 5x1000 for sm_90a and
at 2048x8192 for sm_80 and sm_100a (a config a shape or target refuses is fingerprinted as its
error class); the gated and residual GEMM epilogues, the decode kernel (contiguous/paged,
D 64/128, direct loads, splits and their combine, append), the fused Llama row ops
(add_rms_norm forward/backward, RoPE, the cross-entropy rows) and the Ampere GEMM and
attention at their default plans.
Runs on the CPU (tracing only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from pyptx_kernels._modules import kernel_module

ROOT = Path(__file__).resolve().parents[1]


def _mod(name):
    return kernel_module(name)


def _gemm_cases():
    cases = []
    for (M, N, K) in [(4096, 4096, 4096), (1000, 520, 136)]:
        for i, c in enumerate(_mod("gemm").GEMM_CONFIGS):
            cases.append((f"gemm/{M}x{N}x{K}/cfg{i}", "gemm", "build_gemm", (M, N, K),
                          dict(config=c)))
    plan = _mod("gemm").GemmConfig
    extra = [dict(bias=True, activation="gelu_tanh", alpha=0.5), dict(a_major="MN", b_major="K"),
             dict(config=plan(epilogue="st"), out_dtype="f16", dtype="f16"),
             dict(out_dtype="f32"), dict(config=plan(split="slabs")),
             dict(activation="silu", config=plan(cluster=1, BN=128)),
             dict(activation="relu", bias=True, KB=152, NB=528)]
    for i, kw in enumerate(extra):
        cases.append((f"gemm/1000x520x136/extra{i}", "gemm", "build_gemm", (1000, 520, 136), kw))
    return cases


def _fp8_cases():
    cases = []
    fp8 = _mod("fp8_gemm")
    for scale in ("tensor", "row", "block"):
        for i, c in enumerate(fp8.FP8_CONFIGS):
            cases.append((f"fp8/{scale}/4096/cfg{i}", "fp8_gemm", "build_fp8_gemm",
                          (4096, 4096, 4096), dict(scale=scale, config=c)))
            cases.append((f"fp8/{scale}/ragged/cfg{i}", "fp8_gemm", "build_fp8_gemm",
                          (1000, 520, 400), dict(scale=scale, ND=520, config=c)))
        cases.append((f"fp8/{scale}/mixed", "fp8_gemm", "build_fp8_gemm", (1000, 520, 400),
                      dict(scale=scale, dtype="e5m2", dtype_b="e4m3", out_dtype="f32",
                           config=fp8.Fp8GemmConfig(BN=64), ND=520)))
        if scale != "block":
            cases.append((f"fp8/{scale}/fast", "fp8_gemm", "build_fp8_gemm", (300, 200, 160),
                          dict(scale=scale, fast_accum=True, ND=200,
                               config=fp8.Fp8GemmConfig(BN=192, cluster=1))))
    return cases


def _grouped_cases():
    cases = []
    gg = _mod("grouped_gemm")
    for (M, N, K, G) in [(8192, 2048, 1024, 8), (1000, 520, 136, 3)]:
        for i, c in enumerate(gg.GROUPED_CONFIGS):
            tag = f"{M}x{N}x{K}x{G}/cfg{i}"
            cases.append((f"grouped/fwd/{tag}", "grouped_gemm", "build_grouped", (M, N, K, G),
                          dict(config=c)))
            cases.append((f"grouped/dgrad/{tag}", "grouped_gemm", "build_grouped", (M, K, N, G),
                          dict(b_major="K", config=c)))
        for i, w in enumerate(gg.WGRAD_CONFIGS):  # the dB kernel's own list: cfg0.. as above
            cases.append((f"grouped/wgrad/{M}x{N}x{K}x{G}/cfg{i}", "grouped_gemm",
                          "build_grouped_wgrad", (M, K, N, G), dict(config=w)))
    cases.append(("grouped/fwd/masked", "grouped_gemm", "build_grouped", (1000, 520, 136, 3),
                  dict(config=gg.GroupedConfig(store="masked"), out_dtype="f32")))
    return cases


def _attention_cases():
    cases = []
    fa = _mod("flash_attention")
    for schedule in fa.SCHEDULES:
        for D in (64, 128):
            for causal in (False, True):
                for (B, S, Hq, Hkv) in [(2, 1024, 4, 4), (1, 1000, 4, 2)]:
                    tag = f"{schedule}/d{D}/{'causal' if causal else 'full'}/{B}x{S}x{Hq}x{Hkv}"
                    kw = dict(causal=causal, config=fa.ForwardConfig(schedule=schedule))
                    cases.append((f"attn/{tag}", "flash_attention", "build_attention",
                                  (B, S, Hq, Hkv, D), kw))
                cases.append((f"attn/{schedule}/d{D}/{causal}/persistent", "flash_attention",
                              "build_attention", (2, 1000, 4, 2, D),
                              dict(causal=causal,
                                   config=fa.ForwardConfig(schedule=schedule, persistent=True))))
                cases.append((f"attn/{schedule}/d{D}/{causal}/varlen", "flash_attention",
                              "build_attention_varlen", (3000, 2800, 3, 4, 2, D, 1200),
                              dict(causal=causal, config=fa.ForwardConfig(schedule=schedule))))
                # two consumer warpgroups (the default is three at these head dims)
                cases.append((f"attn/{schedule}/d{D}/{causal}/c2", "flash_attention",
                              "build_attention", (1, 1000, 4, 2, D),
                              dict(causal=causal,
                                   config=fa.ForwardConfig(schedule=schedule, consumers=2))))
    for D in (64, 128):
        for causal in (False, True):
            for (B, S, Hq, Hkv, Sk) in [(2, 1024, 4, 4, 1024), (1, 1000, 4, 2, 1000)]:
                plan = _mod("flash_attention_bwd").BackwardPlan
                for mode, p in [("default", plan.default()), ("safe", plan.safe_pair()),
                                ("atomic", plan.atomic()), ("bq32", plan.default(dkdv_bq=32)),
                                ("nooverlap", plan.default(dkdv_overlap=False)),
                                # attention()'s torch eager backwards (``for_eager``)
                                ("bulk", plan.bulk()), ("convert", plan.converted()),
                                ("lag_lead", plan.lagged())] + (
                        [("fused", plan.fused(pingpong=1)),
                         ("fused_auto", plan.fused(pingpong=1, kv_split="auto"))]
                        if D == 64 else []):
                    tag = f"{mode}/d{D}/{'causal' if causal else 'full'}/{B}x{S}x{Hq}x{Hkv}"
                    cases.append((f"attn_bwd/{tag}", "flash_attention_bwd",
                                  "build_attention_backward", (B, S, Hq, Hkv, D),
                                  dict(Sk=Sk, causal=causal, plan=p)))
    return cases


_ROW_OPS = [("rms_norm", "build_rms_norm_fast", "RMS_NORM_CONFIGS", (1e-6,)),
            ("layer_norm", "build_layer_norm", "LAYER_NORM_CONFIGS", (1e-5,)),
            ("softmax", "build_softmax_fast", "SOFTMAX_CONFIGS", ()),
            ("swiglu", "build_swiglu", "SWIGLU_CONFIGS", ())]


def _row_cases():
    cases = []
    for (B, N) in [(2048, 8192), (5, 1000)]:
        for dt in ("f32", "bf16"):
            tag = f"{B}x{N}/{dt}"
            for module, builder, table, extra in _ROW_OPS:
                for i, c in enumerate(getattr(_mod(module), table)):
                    cases.append((f"rows/{module}/{tag}/cfg{i}", module, builder,
                                  (B, N, dt, *extra), dict(config=c)))
            for module, builder in [("rms_norm", "build_rms_norm_bwd"),
                                    ("layer_norm", "build_layer_norm_bwd")]:
                cases.append((f"rows/{module}/{tag}/bwd", module, builder, (B, N, dt), {}))
    cases.append(("rows/softmax/warp", "softmax", "build_softmax", (64, 1024), {}))
    for arch in ("sm_80", "sm_100a"):  # the other targets at one shape (sm_80 refuses ring/bulk)
        for dt in ("f32", "bf16"):
            tag = f"{arch}/2048x8192/{dt}"
            for module, builder, table, extra in _ROW_OPS:
                for i, c in enumerate(getattr(_mod(module), table)):
                    cases.append((f"rows/{module}/{tag}/cfg{i}", module, builder,
                                  (2048, 8192, dt, *extra), dict(config=c, arch=arch)))
            for module, builder in [("rms_norm", "build_rms_norm_bwd"),
                                    ("layer_norm", "build_layer_norm_bwd")]:
                cases.append((f"rows/{module}/{tag}/bwd", module, builder, (2048, 8192, dt),
                              dict(arch=arch)))
    return cases


def _fused_gemm_cases():
    """The gated (SwiGLU) and residual GEMM epilogues at 4096^3 with the default plan."""
    return [("gemm/4096x4096x4096/swiglu", "gemm", "build_gemm", (4096, 4096, 4096),
             dict(activation="swiglu")),
            ("gemm/4096x4096x4096/residual", "gemm", "build_gemm", (4096, 4096, 4096),
             dict(residual=True))]


def _decode_cases():
    """The decode kernel (default plan: TMA ring) on a contiguous and a paged cache at head dims
    64 and 128 (four query heads per KV head, one new query), its direct-load plan, an
    appending call, KV splits and their combine kernel."""
    from pyptx_kernels.flash_attention.decode_config import DecodeConfig

    dec = _mod("decode")
    cases = []
    for D in (64, 128):
        for paged in (False, True):
            cache = (64, 256, 2, D) if paged else (4, 4096, 2, D)   # paged: 256-key pages
            shape = dec.DecodeShape(4, 1, 8, 2, D, cache, max_pages=16 if paged else 0)
            tag = f"d{D}/{'paged' if paged else 'contiguous'}"
            cases.append((f"decode/{tag}", "decode", "build_decode", (shape,), {}))
        shape = dec.DecodeShape(4, 1, 8, 2, D, (4, 4096, 2, D))
        cases.append((f"decode/d{D}/direct", "decode", "build_decode", (shape,),
                      dict(config=DecodeConfig(ring_stages=0))))
        cases.append((f"decode/d{D}/splits4", "decode", "build_decode", (shape,),
                      dict(splits=4)))
        cases.append((f"decode/d{D}/combine4", "decode_combine", "build_combine",
                      (4, 1, 8, D, 4), {}))
    append = dec.DecodeShape(2, 2, 8, 2, 128, (2, 4096, 2, 128), append=True, n_new=2)
    cases.append(("decode/d128/append", "decode", "build_decode", (append,), {}))
    return cases


def _llama_row_cases():
    """The fused ops of a Llama step at their default plans: residual add + RMSNorm (forward,
    backward), RoPE on q and k (both layouts) and the cross-entropy row kernel."""
    cases = []
    for dt in ("f32", "bf16"):
        for (B, N) in [(2048, 8192), (5, 1000)]:
            cases.append((f"add_rms_norm/{B}x{N}/{dt}", "add_rms_norm", "build_add_rms_norm",
                          (B, N, dt, 1e-6), {}))
            cases.append((f"add_rms_norm/{B}x{N}/{dt}/bwd", "add_rms_norm",
                          "build_add_rms_norm_bwd", (B, N, dt, 1e-6), {}))
        for layout in ("bhsd", "bshd"):
            cases.append((f"rope/2x32x8x1024x128/{dt}/{layout}", "rope", "build_rope",
                          (2, 32, 8, 1024, 128, dt), dict(layout=layout)))
        cases.append((f"cross_entropy/4096x128256/{dt}", "cross_entropy",
                      "build_cross_entropy_rows", (4096, 128256, dt), {}))
        cases.append((f"cross_entropy/5x1000/{dt}/nograd", "cross_entropy",
                      "build_cross_entropy_rows", (5, 1000, dt), dict(grad=False)))
    return cases


def _ampere_cases():
    """The Ampere GEMM (both B layouts) and attention forward (head dims 64/128, causal and
    full) at their default plans."""
    cases = [(f"sm80/gemm/4096x4096x4096/{b}", "sm80_gemm", "build_sm80_gemm",
              (4096, 4096, 4096), dict(b_major=b)) for b in ("MN", "K")]
    for D in (64, 128):
        for causal in (False, True):
            cases.append((f"sm80/attn/d{D}/{'causal' if causal else 'full'}", "sm80_attention",
                          "build_sm80_attention", (2, 1000, 8, 2, D), dict(causal=causal)))
    return cases


def cases():
    """Every snapshot case: ``(name, module, builder, args, kwargs)``."""
    return (_gemm_cases() + _fp8_cases() + _grouped_cases() + _attention_cases()
            + _row_cases()
            + _fused_gemm_cases() + _decode_cases() + _llama_row_cases() + _ampere_cases())


def _texts(k):
    if hasattr(k, "kernels"):
        return [t for sub in k.kernels for t in _texts(sub)]
    return [k.ptx()]


def _one(case):
    name, module, builder, args, kw = case
    try:
        k = getattr(_mod(module), builder)(*args, **kw)
    except Exception as e:
        from pyptx.errors import PyptxError

        if name.startswith("rows/") and isinstance(e, PyptxError):
            # a row config this shape refuses: the refusal is the fingerprint
            return name, f"refused: {type(e).__name__}"
        raise RuntimeError(f"{name}: {type(e).__name__}: {e}") from None
    h = hashlib.sha256()
    for text in _texts(k):
        h.update(text.encode())
        h.update(b"\0")
    return name, h.hexdigest()


def snapshot(jobs=None, only=()):
    """name -> sha256 of the case's PTX (all kernels of a multi-kernel case, in order);
    ``only``: the cases whose names start with one of these prefixes (all when empty)."""
    for var in ("PYPTX_ATTN_SCHEDULE", "PYPTX_ATTN_BWD_SAFE", "PYPTX_ATTN_BWD_SYNC",
                "PYPTX_AUTOTUNE"):
        os.environ.pop(var, None)
    all_cases = [c for c in cases() if not only or c[0].startswith(tuple(only))]
    with ProcessPoolExecutor(jobs or os.cpu_count()) as pool:
        return dict(sorted(pool.map(_one, all_cases, chunksize=4)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the snapshot JSON here")
    p.add_argument("--check", help="compare with this snapshot JSON; exit 1 when a case's PTX "
                   "differs or a case is new (cases only in the old snapshot: REMOVED)")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--only", action="append", default=[], metavar="PREFIX",
                   help="fingerprint only the cases whose names start with PREFIX (repeatable; "
                   "--check then compares those)")
    a = p.parse_args(argv)
    snap = snapshot(a.jobs, a.only)
    print(f"{len(snap)} kernels fingerprinted")
    if a.out:
        Path(a.out).write_text(json.dumps(snap, indent=1) + "\n")
    if a.check:
        want = json.loads(Path(a.check).read_text())
        if a.only:
            want = {k: v for k, v in want.items() if k.startswith(tuple(a.only))}
        removed = sorted(set(want) - set(snap))   # cases dropped from the list: not a change
        diff = sorted(k for k in snap if want.get(k) != snap[k])
        for k in removed:
            print(f"REMOVED {k}")
        for k in diff:
            print(f"DIFF {k}" if k in want else f"DIFF {k} (new case)")
        print("IDENTICAL" if not diff else f"{len(diff)} DIFFERENT",
              f"({len(removed)} removed)" if removed else "")
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
