"""Attention TFLOP/s: pyptx (``pyptx_kernels.attention``) beside
``F.scaled_dot_product_attention`` with each backend (cuDNN, flash, memory-efficient),
forward and backward, bf16.

Three sections, each its own table; flags pick them (none: all three, in this order):

* ``--dense``: head dim 64 and 128, S = 4096 and 8192, causal and full, B*S = 32768 tokens,
  H*D = 2048 (``--dims``, ``--seqs``, ``--causal``, ``--tokens``, ``--width``).
* ``--gqa``: grouped-query rows (``GQA_CASES``: issue 47's shapes, then Hq/Hkv = 32/8 and
  32/4 at S 2k-16k causal, D 128, and one D 64 row; SDPA with ``enable_gqa``), B and
  Hq/Hkv columns first; ``--only-d``, ``--rows`` filter them.
* ``--window [W]``: sliding-window rows (``WINDOW_SEQS``, B=1, H*D = ``--width``, D 128
  unless ``--dims``), causal with ``window=(W, 0)`` (W 4096): milliseconds of the forward and
  of the backward (``autograd.grad``) beside our causal and full attention and SDPA's best
  causal backend (SDPA has no window), and SDPA's memory-efficient backend with the window as a
  boolean mask where it fits (``S <= WINDOW_MASK_MAX``). "/causal", "/full": the window's
  time over our causal and our full (non-causal) attention's (target: "/full" <=
  ``WINDOW_TARGET`` at S = 32768, forward and backward); "work/...": the same ratios of the
  score entries computed, the bound a block-skipping kernel approaches.

``--quick``: a subset of each chosen section (``QUICK_*``; one D 128 dense row per mask, three
GQA rows, the window row at S = 32768) with 2 rounds and 10 pairs.

FLOPs: 4*B*H*S^2*D forward (halved when causal), 2.5x that backward. Timing:
``triton.testing.do_bench`` (L2 flushed between calls), median of the per-round medians; the
contenders of a row are timed interleaved, in rotated order, in one process; a pyptx variant
whose output is off SDPA's by more than ``ERR_LIMIT`` prints FAIL and is not timed (n/a).
Every pyptx column is the default call (``attention(q, k, v, causal=...)``) unless
``--schedules`` / ``--configs`` name forward plans. "fwd ours/best" is the first pyptx column
over the best SDPA backend. A backend that errors prints n/a. The backward rows time
``torch.autograd.grad`` of our ``attention()``: the default (deterministic) backward, and
``deterministic=False`` (dQ added by the dK/dV kernel with TMA tile reductions) beside it.
"paired" columns: the same ratio (ours over the best backend by do_bench) from
``pyptx.testing.paired_times`` (``--pairs`` rounds of one call each, interleaved, L2 flushed;
median of the per-round ratios), which the GPU's clock drifts between do_bench bursts do
not move. ``--kv-splits 1 2 4``: one more backward column per split, attention()'s eager
plan (``BackwardPlan.for_eager(D)``) with ``kv_split=s``, called through
``attention_backward`` (the default column is ``kv_split="auto"``); ``--bwd-plans`` (a JSON
list of ``BackwardPlan`` field changes) adds such a column per entry.

    python benchmarks/attention.py [--quick] [--out t.md]          # every section
    python benchmarks/attention.py --dense [--dims 64 128] [--seqs 4096 8192]
                                   [--schedules pingpong simple]
                                   [--configs '[{}, {"persistent": true}]'] [--no-bwd]
    python benchmarks/attention.py --gqa [--kv-splits 1 2 4 8] [--only-d 128]
    python benchmarks/attention.py --window [4096] [--dims 128]

``--out NAME.md`` writes the chosen sections' tables (and ``NAME.json``, the dense and GQA
rows); without a CUDA GPU and Triton it prints why and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_timing.py

from _timing import gpu_missing, markdown_table, rotated  # noqa: E402

from pyptx.testing import paired_ratio, paired_times  # noqa: E402

BACKENDS = ("cuDNN", "flash", "efficient")
WINDOW_SEQS = (8192, 16384, 32768)     # --window rows
WINDOW_MASK_MAX = 16384                # --window: SDPA with a boolean mask up to this S
WINDOW_TARGET = 0.2                    # --window: window/causal time at S = 32768, W = 4096
ERR_LIMIT = 0.05  # max |o - SDPA| (bf16, randn inputs: |o| < ~1.5); a variant over it prints FAIL
#: ``--gqa``: (B, S, Hq, Hkv, D, mask): issue 47's shapes, then groups of 4 and 8 over S 2k-16k
#: (16384 tokens, causal, D 128) and one D 64 row
GQA_CASES = ([(4, 2048, 32, 32, 128, "causal"), (2, 4096, 32, 8, 128, "causal"),
              (8, 1024, 16, 16, 64, "full"), (1, 16384, 16, 4, 128, "causal"),
              (3, 3000, 12, 4, 64, "causal")]
             + [(16384 // S, S, 32, 32 // g, 128, "causal") for g in (4, 8)
                for S in (2048, 4096, 8192, 16384)]
             + [(2, 8192, 32, 8, 64, "causal")])
#: ``--quick`` subsets: dense (D, S, mask), GQA_CASES indices, window sequence lengths
QUICK_DENSE = [(128, 4096, "full"), (128, 4096, "causal")]
QUICK_GQA = [1, 3, GQA_CASES.index((2, 8192, 32, 8, 64, "causal"))]
QUICK_WINDOW = (32768,)


def load_attention():
    """The flash-attention forward's host functions."""

    return importlib.import_module("pyptx_kernels.flash_attention.fwd_host")


def sdpa_call(backend, causal):
    """``f(q, k, v)``: SDPA restricted to ``backend`` on (B, S, H, D) tensors (viewed as
    (B, H, S, D), the flash-attention packages' layout)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cuDNN": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
          "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def f(q, k, v):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                  v.transpose(1, 2), is_causal=causal,
                                                  enable_gqa=q.shape[2] != k.shape[2])
    return f


def sdpa_fn(backend, q, k, v, causal):
    """A checked zero-argument SDPA call (raises where the backend refuses the case)."""
    import torch

    f = sdpa_call(backend, causal)
    f(q, k, v)
    torch.cuda.synchronize()
    return lambda: f(q, k, v)


def plan_backward_fn(q, k, v, causal, changes):
    """Time ``attention_backward`` with attention()'s eager plan (``BackwardPlan.for_eager``)
    with ``changes`` (field -> value; ``"deterministic": false`` starts from the any-order
    plan; o and lse from our forward, computed once)."""
    from dataclasses import replace

    import torch

    fab = importlib.import_module("pyptx_kernels.flash_attention.backward")
    fa = load_attention()
    o, lse = fa.attention_forward(q, k, v, causal=causal)
    do = torch.randn_like(o)
    changes = dict(changes)
    det = changes.pop("deterministic", True)
    plan = replace(fab.BackwardPlan.for_eager(q.shape[-1], det), **changes)

    def run():
        return fab.attention_backward(q, k, v, o, lse, do, causal=causal, plan=plan)
    run()
    torch.cuda.synchronize()
    return run


def backward_fn(forward, q, k, v):
    """Time the backward alone: one forward with grad, then ``autograd.grad`` of its output."""
    import torch

    qs, ks, vs = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o = forward(qs, ks, vs)
    do = torch.randn_like(o)

    def run():
        return torch.autograd.grad(o, (qs, ks, vs), do, retain_graph=True)
    run()
    torch.cuda.synchronize()
    return run


def _time(fns, rep, rounds):
    from triton.testing import do_bench

    t = {name: [] for name in fns}
    for r in range(rounds):
        for name in rotated(list(fns), r):
            t[name].append(do_bench(fns[name], rep=rep, return_mode="median"))
    return {name: statistics.median(v) for name, v in t.items()}


def _paired_cell(fns, ours, tflops, pairs):
    """The paired ratio of ``ours`` over the backend with the best do_bench TFLOP/s."""
    peers = [b for b in BACKENDS if b in tflops]
    if not pairs or ours not in fns or not peers:
        return "n/a"
    best = max(peers, key=tflops.get)
    return f"{paired_ratio(paired_times({ours: fns[ours], best: fns[best]}, pairs), best, ours)[0]:.3f}"


def _fmt(x):
    return "n/a" if x is None else f"{x:.0f}"


def _window_mask_sdpa(S, window):
    """``f(q, k, v)``: SDPA's memory-efficient backend with the causal window as a mask."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    i = torch.arange(S, device="cuda")
    mask = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - window)

    def f(q, k, v):
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                  v.transpose(1, 2), attn_mask=mask)
    return f


def window_work(S, W, causal=True):
    """Score entries of a causal ``window=(W, 0)`` (S queries, S keys) over those of our
    causal (``causal``) or full attention: the time ratio a kernel that skips every masked
    block approaches."""
    inside = S * (S + 1) / 2 if S <= W + 1 else (W + 1) * (W + 2) / 2 + (S - W - 1) * (W + 1)
    return inside / (S * (S + 1) / 2 if causal else S * S)


def window_section(args, dims, seqs, dev):
    """The ``--window`` table (see the module docstring): ``(title, head, body)``,
    milliseconds, do_bench medians."""
    import torch

    fa = load_attention()
    W = args.window
    head = ["D", "S", "window", "work/causal", "work/full"]
    for p_ in ("fwd", "bwd"):
        head += [f"{p_} {n}" for n in ("window", "causal", "full", "/causal", "/full",
                                        "SDPA best", "SDPA masked")]
    head.append(f"/full <= {WINDOW_TARGET}")
    title = (f"attention with a sliding window (window=({W}, 0), causal), ms on {dev}, bf16, "
             f"do_bench median; /causal, /full: the window's time over our causal and full "
             f"(non-causal) attention's; target /full <= {WINDOW_TARGET} at S = 32768")
    print(f"# {title}")
    print("| " + " | ".join(head) + " |", flush=True)
    body = []
    for D in dims:
        for S in seqs:
            torch.manual_seed(0)
            H = args.width // D
            q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            calls = {"window": lambda a, b_, c: fa.attention(a, b_, c, causal=True,
                                                             window=(W, 0)),
                     "causal": lambda a, b_, c: fa.attention(a, b_, c, causal=True),
                     "full": lambda a, b_, c: fa.attention(a, b_, c)}
            for be in BACKENDS:
                calls[be] = sdpa_call(be, True)
            if S <= WINDOW_MASK_MAX:
                calls["masked"] = _window_mask_sdpa(S, W)
            fwd, bwd = {}, {}
            for name, f in calls.items():
                try:
                    f(q, k, v)
                    fwd[name] = lambda f=f, a=q, b_=k, c=v: f(a, b_, c)
                    bwd[name] = backward_fn(f, q, k, v)
                except Exception as ex:  # noqa: BLE001 - print n/a and go on
                    print(f"  {name}: {type(ex).__name__}: {str(ex)[:200]}", flush=True)
            cells = [str(D), str(S), str(W), f"{window_work(S, W):.3f}",
                     f"{window_work(S, W, causal=False):.3f}"]
            met = []
            for times in (_time(fwd, args.rep, args.rounds), _time(bwd, args.rep, args.rounds)):
                best = min((times[b] for b in BACKENDS if b in times), default=None)
                over = {n: times["window"] / times[n] if "window" in times and n in times
                        else None for n in ("causal", "full")}
                met.append(over["full"] is not None and over["full"] <= WINDOW_TARGET)
                cells += [f"{times[n]:.3f}" if n in times else "n/a"
                          for n in ("window", "causal", "full")]
                cells += ["n/a" if over[n] is None else f"{over[n]:.3f}" for n in over]
                cells += ["n/a" if best is None else f"{best:.3f}",
                          f"{times['masked']:.3f}" if "masked" in times else "n/a"]
            cells.append(f"fwd {'PASS' if met[0] else 'FAIL'}, bwd {'PASS' if met[1] else 'FAIL'}"
                         if S == 32768 else "-")
            print("| " + " | ".join(cells) + " |", flush=True)
            body.append(cells)
            del q, k, v, fwd, bwd
            torch.cuda.empty_cache()
    return title, head, body


def table_section(args, cases, gqa, dev):
    """The dense or ``--gqa`` TFLOP/s table of ``cases`` ((B, S, Hq, Hkv, D, mask)):
    ``(title, head, body, rows)``, ``rows`` the JSON records."""
    import torch

    fa = load_attention()
    # no --schedules: schedule=None, the default call (its tile options tuned per shape, as
    # a user's attention_forward(q, k, v) is); a named schedule fixes the tiles
    schedules = args.schedules or [None]
    configs = json.loads(args.configs) if args.configs else [{}]
    variants = [(s, c) for s in schedules for c in configs]
    plans = [None if s is None and not c else fa.ForwardConfig(schedule=s, **c)
             for s, c in variants]                  # None: the default call (tuned)

    def label(s, c):
        parts = ([s] if len(schedules) > 1 else []) + [
            "persistent" if k == "persistent" and v else f"{k}={v}" for k, v in c.items()
            if not (k == "persistent" and not v)]
        return "pyptx" + ("" if not parts else " " + " ".join(parts))
    ours = [label(s, c) for s, c in variants]
    bwd_plans = [{"kv_split": s} for s in args.kv_splits] + json.loads(args.bwd_plans)
    bwd_names = [",".join(f"{k}={v}" for k, v in c.items()) for c in bwd_plans]
    splits = [f"bwd {n}" for n in bwd_names]
    head = ((["B", "Hq/Hkv"] if gqa else []) + ["D", "S", "mask"]
            + [f"fwd {n}" for n in ours + list(BACKENDS)] + ["fwd ours/best", "fwd paired"]
            + ([f"bwd {n}" for n in ["pyptx"] + list(BACKENDS)] + ["bwd ours/best", "bwd paired",
                                                                   "bwd deterministic=False",
                                                                   "its ratio"] + splits
               if not args.no_bwd else []) + ["max |o err|"])
    title = (f"attention{' grouped-query' if gqa else ''} TFLOP/s on {dev}, bf16, do_bench "
             f"median (L2 flushed)")
    print(f"# {title}")
    print("| " + " | ".join(head) + " |", flush=True)
    body, rows = [], []
    for B, S, H, Hkv, D, mask in cases:
        causal = mask == "causal"
        torch.manual_seed(0)
        q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
        fwd = {}
        err = None
        for name, plan in zip(ours, plans):
            try:
                o, _ = fa.attention_forward(q, k, v, causal=causal, config=plan)
                ref = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                    is_causal=causal, enable_gqa=Hkv != H).transpose(1, 2)
                e = (o.float() - ref.float()).abs().max().item()
                err = e if err is None else max(err, e)
                if not e <= ERR_LIMIT:          # a wrong variant is not timed
                    print(f"  {name}: max |o - sdpa| {e:.2e} over {ERR_LIMIT}: FAIL",
                          flush=True)
                    continue
                fwd[name] = (lambda p=plan, c=causal, a=q, b_=k, v_=v:
                             fa.attention_forward(a, b_, v_, causal=c, config=p))
            except Exception as ex:  # noqa: BLE001 - print n/a and go on
                print(f"  {name}: {type(ex).__name__}: {ex}"[:300], flush=True)
        for be in BACKENDS:
            try:
                fwd[be] = sdpa_fn(be, q, k, v, causal)
            except Exception as ex:  # noqa: BLE001
                print(f"  {be}: {type(ex).__name__}: {str(ex)[:200]}", flush=True)
        tf = {n: flops / (ms * 1e-3) / 1e12 for n, ms in _time(fwd, args.rep, args.rounds).items()}
        best_peer = max((tf[b] for b in BACKENDS if b in tf), default=None)
        best_ours = tf.get(ours[0])            # the first variant: the default call
        cells = (([str(B), f"{H}/{Hkv}"] if gqa else []) + [str(D), str(S), mask]
                 + [_fmt(tf.get(n)) for n in ours + list(BACKENDS)])
        cells.append(f"{best_ours / best_peer:.3f}" if best_ours and best_peer else "n/a")
        cells.append(_paired_cell(fwd, ours[0], tf, args.pairs))
        btf = {}
        if not args.no_bwd:
            bwd = {}
            try:
                bwd["pyptx"] = backward_fn(
                    lambda a, b_, c, cz=causal: fa.attention(a, b_, c, causal=cz), q, k, v)
            except Exception as ex:  # noqa: BLE001
                print(f"  pyptx bwd: {type(ex).__name__}: {str(ex)[:200]}", flush=True)
            try:  # the opt-in non-deterministic backward (five products, bulk dQ adds)
                bwd["nondet"] = backward_fn(
                    lambda a, b_, c, cz=causal: fa.attention(a, b_, c, causal=cz,
                                                             deterministic=False), q, k, v)
            except Exception as ex:  # noqa: BLE001
                print(f"  pyptx nondet bwd: {type(ex).__name__}: {str(ex)[:200]}", flush=True)
            for be in BACKENDS:
                try:
                    bwd[be] = backward_fn(sdpa_call(be, causal), q, k, v)
                except Exception as ex:  # noqa: BLE001
                    print(f"  {be} bwd: {type(ex).__name__}: {str(ex)[:200]}", flush=True)
            for n, c in zip(bwd_names, bwd_plans):
                try:
                    bwd[n] = plan_backward_fn(q, k, v, causal, c)
                except Exception as ex:  # noqa: BLE001 - e.g. a split not dividing G
                    print(f"  {n}: {type(ex).__name__}: {str(ex)[:200]}", flush=True)
            btf = {n: 2.5 * flops / (ms * 1e-3) / 1e12
                   for n, ms in _time(bwd, args.rep, args.rounds).items()}
            bbest = max((btf[b] for b in BACKENDS if b in btf), default=None)
            cells += [_fmt(btf.get(n)) for n in ["pyptx"] + list(BACKENDS)]
            cells.append(f"{btf['pyptx'] / bbest:.3f}" if "pyptx" in btf and bbest else "n/a")
            cells.append(_paired_cell(bwd, "pyptx", btf, args.pairs))
            cells += [_fmt(btf.get("nondet")),
                      f"{btf['nondet'] / bbest:.3f}" if "nondet" in btf and bbest else "n/a"]
            cells += [_fmt(btf.get(n)) for n in bwd_names]
        cells.append("n/a" if err is None else f"{err:.1e}")
        print("| " + " | ".join(cells) + " |", flush=True)
        body.append(cells)
        rows.append(dict(section="gqa" if gqa else "dense", D=D, S=S, B=B, H=H, Hkv=Hkv,
                         causal=causal, fwd=tf, bwd=btf, err=err))
        del q, k, v
        torch.cuda.empty_cache()
    return title, head, body, rows


def parse_args(argv=None):
    """The command line (see the module docstring); ``sections`` is the chosen sections in
    run order, all three when none is named."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dense", action="store_true", help="the dense rows (--dims x --seqs x "
                   "--causal)")
    p.add_argument("--gqa", action="store_true", help="the grouped-query rows (GQA_CASES)")
    p.add_argument("--window", type=int, nargs="?", const=4096, default=None,
                   help="the sliding-window rows (window=(W, 0), causal; default W 4096)")
    p.add_argument("--quick", action="store_true",
                   help="a subset of each chosen section, 2 rounds, 10 pairs")
    p.add_argument("--dims", nargs="+", type=int, default=None,
                   help="head dims (dense: 64 128; window: 128)")
    p.add_argument("--seqs", nargs="+", type=int, default=[4096, 8192])
    p.add_argument("--schedules", nargs="+", default=None,
                   help="our schedules to time (default: the default call)")
    p.add_argument("--causal", nargs="+", default=["full", "causal"])
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--width", type=int, default=2048, help="H * D")
    p.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    p.add_argument("--rounds", type=int, default=None, help="rounds (3; --quick 2)")
    p.add_argument("--pairs", type=int, default=None,
                   help="paired rounds (20; --quick 10; 0: no paired column)")
    p.add_argument("--configs", default=None,
                   help='JSON list of ForwardConfig keyword dicts for our forward, one column each, e.g. '
                        '[{}, {"persistent": true}, {"BN": 176}, {"pin_overlap": true}, '
                        '{"rescale_threshold": 8}]')
    p.add_argument("--no-bwd", action="store_true")
    p.add_argument("--only-d", type=int, default=None, help="--gqa: only this head dim")
    p.add_argument("--rows", nargs="+", type=int, default=None,
                   help="--gqa: only these indices of GQA_CASES")
    p.add_argument("--kv-splits", nargs="+", type=int, default=[],
                   help="backward columns of BackwardPlan.for_eager(D) with kv_split=s")
    p.add_argument("--bwd-plans", default="[]",
                   help='JSON list of BackwardPlan field changes, a backward column each, e.g. '
                        '[{"kv_split": 1}, {"dq_chains": 2}]')
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    named = [n for n, on in (("dense", args.dense), ("gqa", args.gqa),
                             ("window", args.window is not None)) if on]
    args.sections = named or ["dense", "gqa", "window"]
    if args.window is None:
        args.window = 4096
    if args.rounds is None:
        args.rounds = 2 if args.quick else 3
    if args.pairs is None:
        args.pairs = 10 if args.quick else 20
    return args


def dense_cases(args):
    """The dense section's (B, S, Hq, Hkv, D, mask) rows."""
    if args.quick and args.dims is None:
        chosen = QUICK_DENSE
    else:
        chosen = [(D, S, m) for D in args.dims or [64, 128] for S in args.seqs
                  for m in args.causal]
    return [(max(1, args.tokens // S), S, args.width // D, args.width // D, D, mask)
            for D, S, mask in chosen]


def gqa_cases(args):
    """The ``--gqa`` section's rows (``GQA_CASES`` filtered)."""
    keep = args.rows if args.rows is not None else QUICK_GQA if args.quick else None
    return [c for i, c in enumerate(GQA_CASES) if args.only_d in (None, c[4])
            and (keep is None or i in keep)]


def main(argv=None) -> int:
    args = parse_args(argv)
    why = gpu_missing("attention.py")
    if why:
        print(why, file=sys.stderr)
        return 2
    import torch

    dev = torch.cuda.get_device_name()
    tables, rows = [], []
    for section in args.sections:
        if section == "window":
            title, head, body = window_section(args, args.dims or [128],
                                               QUICK_WINDOW if args.quick else WINDOW_SEQS, dev)
        else:
            cases = gqa_cases(args) if section == "gqa" else dense_cases(args)
            title, head, body, recs = table_section(args, cases, section == "gqa", dev)
            rows += recs
        tables.append((title, head, body))
    if args.out:
        text = "\n\n".join(f"{title}\n\n" + "\n".join(markdown_table(head, body))
                           for title, head, body in tables)
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
