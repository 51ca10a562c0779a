"""Decode attention GB/s: pyptx ``attention_with_kvcache`` (contiguous and paged caches)
beside ``F.scaled_dot_product_attention`` with each backend (cuDNN, flash,
memory-efficient) and a plain copy, bf16, one query per sequence.

Cases: B 1..128, Sk 1k..32k (every sequence full), Hq/Hkv 32/8, D 128. GB/s counts the
cache bytes read, ``2 * B * Sk * Hkv * D * 2`` (K and V, bf16). SDPA gets its best case:
contiguous ``(B, Hkv, Sk, D)`` caches, ``enable_gqa=True`` (a backend that refuses prints
n/a). "copy" is ``dst.copy_(src)`` of the same bytes (read + write counted), the bandwidth
the target is a share of. "ours/best" is the contiguous pyptx column over the best SDPA
backend, "paged/best" the paged one's; "% copy" is the contiguous column over the copy's.
The window rows time ``window=(W, -1)`` over the full cache against the full call (time
ratio: it should follow ``W / Sk``). Timing:
``triton.testing.do_bench`` (L2 flushed), median of ``--rounds`` rounds, the contenders of
a row interleaved in rotated order. A pyptx output off SDPA's by more than ``ERR_LIMIT``
prints FAIL and is not timed. ``--configs`` adds two GB/s columns per ``DecodeConfig``
(contiguous and paged caches, through ``decode_host.decode``) for comparing plans; ``--two-launch``
adds one for the two-launch reference (``build_decode(combine=False)`` + ``build_combine``,
the default plan's splits) beside the one-launch default.

    python benchmarks/attention_decode.py [--quick] [--out decode.md] [--heads 32/8]
        [--dim 128] [--queries 1]
        [--configs '[{"mma": true}, {"ring_stages": 0}, {"keys_per_step": 4}]']
        [--two-launch]

``--heads HQ/HKV``, ``--dim`` and ``--queries`` (new queries per sequence, as in a
speculative step; with more than one both sides attend to the whole cache, ``causal=False``)
change the case.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_timing.py

from _timing import gpu_missing, markdown_table, rotated  # noqa: E402

BACKENDS = ("cuDNN", "flash", "efficient")
ERR_LIMIT = 0.05
HQ, HKV, D, SQ = 32, 8, 128, 1
PAGE = 64
FULL = [(1, 32768), (1, 8192), (8, 4096), (16, 4096), (16, 16384), (32, 2048), (64, 1024),
        (64, 4096), (128, 1024), (128, 4096), (128, 8192)]
QUICK = [(1, 32768), (16, 4096), (64, 1024), (128, 4096)]
WINDOWS = [(16, 32768, 4096), (4, 32768, 1024)]


def _time(fns, rep, rounds):
    from triton.testing import do_bench

    t = {n: [] for n in fns}
    for r in range(rounds):
        for name in rotated(list(fns), r):
            t[name].append(do_bench(fns[name], rep=rep, return_mode="median"))
    return {n: statistics.median(v) for n, v in t.items()}


def _sdpa(backend, q, k, v):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cuDNN": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
          "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def f():
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    out = f()
    torch.cuda.synchronize()
    return f, out


def _inputs(B, Sk):
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    kw = dict(device="cuda", dtype=torch.bfloat16, generator=g)
    q = torch.randn(B, SQ, HQ, D, **kw)
    kc = torch.randn(B, Sk, HKV, D, **kw)
    vc = torch.randn(B, Sk, HKV, D, **kw)
    lens = torch.full((B,), Sk, device="cuda", dtype=torch.int32)
    mp = Sk // PAGE
    perm = torch.randperm(B * mp, device="cuda", generator=g)
    table = perm.reshape(B, mp).to(torch.int32)
    kp = torch.empty(B * mp, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
    vp = torch.empty_like(kp)
    kp[perm] = kc.reshape(B * mp, PAGE, HKV, D)
    vp[perm] = vc.reshape(B * mp, PAGE, HKV, D)
    return q, kc, vc, lens, kp, vp, table


def _fmt(x):
    return "n/a" if x is None else f"{x:.0f}"


def _plan_fn(config, q, kc, vc, lens, table=None):
    """A zero-argument call of the decode with the plan ``config`` (a dict of
    ``DecodeConfig`` fields), on the contiguous cache or, with ``table``, the paged one."""
    from pyptx_kernels.flash_attention import decode_host
    from pyptx_kernels.flash_attention.decode_api import check_call
    from pyptx_kernels.flash_attention.decode_config import DecodeConfig

    shape, dtype = check_call(q, kc, vc, lens, None, None, table)
    plan = DecodeConfig(**config)
    sms = decode_host.device_sms(q)
    arrays = [q, kc, vc, lens] + ([] if table is None else [table])
    return lambda: decode_host.decode(shape, arrays, dtype=dtype, causal=SQ == 1,
                                      window=(-1, -1), softcap=0.0, scale=D ** -0.5,
                                      config=plan, num_sms=sms)[0]


def _two_launch_fn(q, kc, vc, lens):
    """A zero-argument call of the two-launch reference: the partials-only decode kernel and
    ``build_combine``, with the default plan's split count."""
    from pyptx_kernels.flash_attention import decode_host
    from pyptx_kernels.flash_attention.decode_api import check_call
    from pyptx_kernels.flash_attention.decode_combine import build_combine
    from pyptx_kernels.flash_attention.decode_config import DEFAULT_CONFIG
    from pyptx_kernels.flash_attention.decode_kernel import build_decode

    shape, dtype = check_call(q, kc, vc, lens, None, None, None)
    splits = decode_host.choose_splits(shape, DEFAULT_CONFIG, decode_host.device_sms(q))
    dec = build_decode(shape, dtype=dtype, causal=SQ == 1, splits=splits, combine=False)
    comb = build_combine(shape.B, shape.Sq, shape.Hq, shape.D, splits, dtype=dtype)
    return lambda: comb(*dec(q, kc, vc, lens))[0]


def decode_row(B, Sk, rep, rounds, configs=(), two_launch=False):
    """One row of the GB/s table: ``[B, Sk, pyptx, paged, cuDNN, flash, efficient, copy,
    ours/best, paged/best, % copy, per config a contiguous and a paged column]``."""
    import torch
    from pyptx_kernels import attention_with_kvcache

    q, kc, vc, lens, kp, vp, table = _inputs(B, Sk)
    nbytes = 2 * B * Sk * HKV * D * 2
    causal = SQ == 1
    fns = {"pyptx": lambda: attention_with_kvcache(q, kc, vc, lens, causal=causal),
           "pyptx paged": lambda: attention_with_kvcache(q, kp, vp, lens, block_table=table,
                                                         causal=causal)}
    for i, c in enumerate(configs):
        fns[f"cfg{i}"] = _plan_fn(c, q, kc, vc, lens)
        fns[f"cfg{i} paged"] = _plan_fn(c, q, kp, vp, lens, table)
    if two_launch:
        fns["two launches"] = _two_launch_fn(q, kc, vc, lens)
    outs = {name: fn() for name, fn in fns.items()}
    qs, ks, vs = q.transpose(1, 2), kc.transpose(1, 2).contiguous(), \
        vc.transpose(1, 2).contiguous()
    for be in BACKENDS:
        try:
            fns[be], o = _sdpa(be, qs, ks, vs)
            outs[be] = o.transpose(1, 2)
        except Exception:  # noqa: BLE001 - a backend that refuses the case is n/a
            pass
    src = torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    fns["copy"] = lambda: dst.copy_(src)
    ref = next((outs[b] for b in BACKENDS if b in outs), outs["pyptx"])
    ours_names = ["pyptx", "pyptx paged",
                  *(f"cfg{i}{p}" for i in range(len(configs)) for p in ("", " paged")),
                  *(["two launches"] if two_launch else [])]
    failed = [n for n in ours_names
              if (outs[n].float() - ref.float()).abs().max().item() > ERR_LIMIT]
    for n in failed:
        del fns[n]
    ms = _time(fns, rep, rounds)
    gbs = {n: (2 if n == "copy" else 1) * nbytes / (t * 1e-3) / 1e9 for n, t in ms.items()}
    best = max((gbs[b] for b in BACKENDS if b in gbs), default=None)
    ours = gbs.get("pyptx")
    row = [str(B), str(Sk)]
    row += ["FAIL" if n in failed else _fmt(gbs.get(n))
            for n in ("pyptx", "pyptx paged", *BACKENDS, "copy")]
    for x in (ours, gbs.get("pyptx paged")):
        row.append("n/a" if x is None or best is None else f"{x / best:.3f}x")
    row.append("n/a" if ours is None else f"{100 * ours / gbs['copy']:.0f}%")
    row += ["FAIL" if n in failed else _fmt(gbs.get(n)) for n in ours_names[2:]]
    return row


def window_row(B, Sk, W, rep, rounds):
    """One row of the window table: ``[B, Sk, W, full ms, window ms, ratio, W/Sk]``."""
    from pyptx_kernels import attention_with_kvcache

    q, kc, vc, lens, *_ = _inputs(B, Sk)
    fns = {"full": lambda: attention_with_kvcache(q, kc, vc, lens),
           "window": lambda: attention_with_kvcache(q, kc, vc, lens, window=(W, -1))}
    ms = _time(fns, rep, rounds)
    return [str(B), str(Sk), str(W), f"{ms['full']:.3f}", f"{ms['window']:.3f}",
            f"{ms['window'] / ms['full']:.3f}", f"{W / Sk:.3f}"]


def main(argv=None) -> int:
    global HQ, HKV, D, SQ
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 shapes, one round (< 1 min)")
    p.add_argument("--rep", type=int, default=50, help="do_bench rep (ms)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument("--heads", default=f"{HQ}/{HKV}", help="query/KV heads, e.g. 32/8")
    p.add_argument("--dim", type=int, default=D, choices=(64, 128))
    p.add_argument("--queries", type=int, default=SQ, help="new queries per sequence")
    p.add_argument("--configs", default="[]",
                   help="JSON list of DecodeConfig fields: one extra GB/s column each")
    p.add_argument("--two-launch", action="store_true",
                   help="a GB/s column of the two-launch reference (split kernel + combine)")
    args = p.parse_args(argv)
    HQ, HKV = (int(h) for h in args.heads.split("/"))
    D, SQ = args.dim, args.queries
    configs = json.loads(args.configs)
    missing = gpu_missing("attention_decode.py")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    import torch

    rounds = 1 if args.quick else args.rounds
    dev = torch.cuda.get_device_name()
    print(f"# decode GB/s of cache read on {dev}, bf16, Hq/Hkv {HQ}/{HKV}, D {D}, Sq {SQ}, "
          f"page {PAGE}, do_bench median (L2 flushed)")
    body, wbody = [], []
    for B, Sk in QUICK if args.quick else FULL:
        body.append(decode_row(B, Sk, args.rep, rounds, configs, args.two_launch))
        print(" | ".join(body[-1]), flush=True)
        torch.cuda.empty_cache()
    for B, Sk, W in WINDOWS[:1] if args.quick else WINDOWS:
        wbody.append(window_row(B, Sk, W, args.rep, rounds))
        print(" | ".join(wbody[-1]), flush=True)
        torch.cuda.empty_cache()
    head = ["B", "Sk", "pyptx", "pyptx paged", *BACKENDS, "copy", "ours/best", "paged/best",
            "% copy",
            *(f"{json.dumps(c)}{p}" for c in configs for p in ("", " paged")),
            *(["two launches"] if args.two_launch else [])]
    whead = ["B", "Sk", "window", "full ms", "window ms", "ratio", "W/Sk"]
    lines = markdown_table(head, body) + [""] + markdown_table(whead, wbody)
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(f"decode GB/s of cache read on {dev} (bf16, Hq/Hkv "
                                  f"{HQ}/{HKV}, D {D}, Sq {SQ}, page {PAGE}; do_bench median)\n\n"
                                  + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
