"""A small ragged flash-attention forward for compute-sanitizer (memcheck, racecheck,
synccheck): B=2, S=77, Hq=4, Hkv=2, head dims 64 and 128, causal and not, every schedule,
the persistent kernel over 4 CTAs, plus a packed (varlen) batch, each candidate of the
tuned list (``ATTENTION_CONFIGS``) and three consumer warpgroups (``consumers=3``); every
output is checked against float64. ``python tools/attention_sanitize.py consumers=3``: the
three-consumer part only; ``decode``: only the one-launch decode kernel
(``attention_with_kvcache``: ring, direct loads and the tensor-core plan, contiguous and paged, with and without
append, one split and three, whose last CTA per (sequence, KV head) combines them), each
call made twice (the second finds the counters the first left zero)."""
import sys
from pathlib import Path

import torch
from pyptx_kernels.flash_attention import fwd_config, fwd_host, fwd_kernel, fwd_reference
from pyptx_kernels.flash_attention.fwd_config import ForwardConfig

from pyptx.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

bad = 0


def default_cases():
    """Every schedule, persistent, varlen and tuned candidate, each with its default
    consumer count."""
    bad = 0
    for schedule in fwd_config.SCHEDULES:
        for D in (64, 128):
            for causal in (False, True):
                q = torch.randn(2, 77, 4, D, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(2, 77, 2, D, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(2, 77, 2, D, device="cuda", dtype=torch.bfloat16)
                o, lse = fwd_host.attention_forward(q, k, v, causal=causal, config=ForwardConfig(schedule=schedule))
                ok, eo, el = fwd_reference.check(o, lse, *fwd_reference.reference(q, k, v, causal), "bf16")
                bad += not ok
                print(schedule, D, "causal" if causal else "full", f"o err {eo:.1e} lse {el:.1e}",
                      "PASS" if ok else "FAIL")
        for causal in (False, True):
            q = torch.randn(2, 77, 4, 128, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(2, 77, 2, 128, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(2, 77, 2, 128, device="cuda", dtype=torch.bfloat16)
            kern = fwd_kernel.build_attention(2, 77, 4, 2, 128, causal=causal, config=ForwardConfig(schedule=schedule, persistent=True, num_sms=4))
            o, lse = kern(q, k, v)
            ok, eo, el = fwd_reference.check(o, lse, *fwd_reference.reference(q, k, v, causal), "bf16")
            bad += not ok
            print(schedule, "persistent", "causal" if causal else "full",
                  f"o err {eo:.1e} lse {el:.1e}", "PASS" if ok else "FAIL")
        lens = [77, 1, 130]
        cu = torch.tensor([0, 77, 78, 208], device="cuda", dtype=torch.int32)
        q = torch.randn(208, 4, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(208, 2, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(208, 2, 128, device="cuda", dtype=torch.bfloat16)
        o, lse = fwd_host.attention_varlen_forward(q, k, v, cu, cu, max(lens), max(lens), causal=True, config=ForwardConfig(schedule=schedule))
        ok, eo, el = fwd_reference.check(o, lse, *fwd_reference.reference_varlen(q, k, v, cu, cu, True), "bf16")
        bad += not ok
        print(schedule, "varlen", f"o err {eo:.1e} lse {el:.1e}", "PASS" if ok else "FAIL")
    # the tuned list's candidates (ATTENTION_CONFIGS) that fit each head dim, at a length that
    # leaves a partial key block for every BN
    for cfg in fwd_config.ATTENTION_CONFIGS[1:]:
        for D in (64, 128):
            q = torch.randn(1, 300, 2, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(1, 300, 1, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(1, 300, 1, D, device="cuda", dtype=torch.bfloat16)
            try:
                kern = fwd_kernel.build_attention(1, 300, 2, 1, D, causal=True, config=cfg)
            except ConfigError:
                continue  # a config that does not fit this head dim
            o, lse = kern(q, k, v)
            ok, eo, el = fwd_reference.check(o, lse, *fwd_reference.reference(q, k, v, True), "bf16")
            bad += not ok
            print("tuned candidate", cfg.changes(), D, f"o err {eo:.1e} lse {el:.1e}",
                  "PASS" if ok else "FAIL")
    return bad


def decode_cases():
    """The one-launch decode kernel against float64, every plan variant (the CUDA-core
    ring and direct loads, the tensor-core ring), two calls each."""
    import numpy as np
    from pyptx_kernels.flash_attention import decode_host
    from pyptx_kernels.flash_attention.decode_api import check_call
    from pyptx_kernels.flash_attention.decode_config import DecodeConfig
    from pyptx_kernels.flash_attention.decode_reference import reference_decode

    def f64(x):
        return None if x is None else x.double().cpu().numpy() if x.dtype.is_floating_point \
            else x.cpu().numpy()

    bad = 0
    B, Sq, Hq, Hkv, D, Sk = 3, 2, 8, 2, 128, 112
    for ring in (4, 0, "mma"):
        for page in (None, 16):
            for append in (False, True):
                for splits in (1, 3):
                    g = torch.Generator(device="cuda").manual_seed(splits + 2 * len(str(ring)))
                    cache = (B * Sk // page + 2, page, Hkv, D) if page else (B, Sk, Hkv, D)
                    table = torch.randperm(cache[0], device="cuda", generator=g)[
                        :B * Sk // page].reshape(B, -1).to(torch.int32) if page else None
                    kc, vc = (torch.randn(*cache, device="cuda", dtype=torch.bfloat16,
                                          generator=g) for _ in range(2))
                    q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=torch.bfloat16,
                                    generator=g)
                    kn = torch.randn(B, Sq, Hkv, D, device="cuda", dtype=torch.bfloat16,
                                     generator=g) if append else None
                    lens = torch.tensor([0, 37, Sk - Sq], device="cuda", dtype=torch.int32)
                    ref = reference_decode(*(f64(x) for x in (q, kc, vc, lens)), k=f64(kn),
                                           v=f64(kn), block_table=f64(table))
                    shape, name = check_call(q, kc, vc, lens, kn, kn, table)
                    arrays = [x for x in (q, kc, vc, lens, table, kn, kn) if x is not None]
                    errs = []
                    for _ in range(2):
                        o, _ = decode_host.decode(
                            shape, arrays, dtype=name, causal=True, window=(-1, -1),
                            softcap=0.0, scale=D ** -0.5,
                            config=DecodeConfig(mma=True, num_splits=splits) if ring == "mma"
                            else DecodeConfig(ring_stages=ring, num_splits=splits))
                        errs.append(float(np.abs(f64(o) - ref[0]).max()))
                    ok = max(errs) <= 2e-2
                    bad += not ok
                    print("decode", f"ring{ring}", "paged" if page else "contiguous",
                          "append" if append else "", f"splits {splits}",
                          f"o err {max(errs):.1e}", "PASS" if ok else "FAIL")
    return bad


if "decode" in sys.argv[1:]:
    bad += decode_cases()
    torch.cuda.synchronize()
    print("FAIL" if bad else "all PASS")
    sys.exit(1 if bad else 0)
if "consumers=3" not in sys.argv[1:]:
    bad += default_cases()
# three consumer warpgroups (192-row blocks): every schedule, dense and persistent over 4 CTAs
for schedule in fwd_config.SCHEDULES:
    for causal in (False, True):
        q = torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, 300, 2, 64, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(2, 300, 2, 64, device="cuda", dtype=torch.bfloat16)
        for persistent in (False, True):
            kern = fwd_kernel.build_attention(2, 300, 4, 2, 64, causal=causal, config=ForwardConfig(schedule=schedule, consumers=3, persistent=persistent, num_sms=4))
            o, lse = kern(q, k, v)
            ok, eo, el = fwd_reference.check(o, lse, *fwd_reference.reference(q, k, v, causal), "bf16")
            bad += not ok
            print(schedule, "consumers=3", "persistent" if persistent else "",
                  "causal" if causal else "full", f"o err {eo:.1e} lse {el:.1e}",
                  "PASS" if ok else "FAIL")
torch.cuda.synchronize()
print("FAIL" if bad else "all PASS")
sys.exit(1 if bad else 0)
