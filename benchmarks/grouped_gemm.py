"""Grouped GEMM TFLOP/s: pyptx (``pyptx_kernels.grouped_gemm``, default tuned call)
beside ``torch._grouped_mm`` and ``torch.bmm`` (equal groups only), bf16 in and out; then
the backward (dA + dB) beside torch autograd through ``torch._grouped_mm``.

FLOPs: ``2 * sum(M_g) * N * K`` forward, twice that backward. Timing:
``triton.testing.do_bench`` (L2 flushed between calls), median; the contenders of a row
are timed interleaved in one process (three rounds, the middle value kept).
``--shapes GxMxNxK ...`` narrows the set (``uneven`` is the ragged case); ``--out FILE.md``
writes the table.

Two pyptx columns: "pyptx" is the table-driven default call (each kernel's shipped-table or
heuristic plan, nothing timed, saved winners ignored), "tuned" the per-shape-tuned one (as
``PYPTX_AUTOTUNE=1`` or ``pyptx_kernels.tune``); "table / tuned" is their paired ratio
(``pyptx.testing.paired_times``, ``--pairs`` rounds) and "plans" names both.

    python benchmarks/grouped_gemm.py [--shapes 8x2048x4096x4096 uneven] [--out t.md]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _plans import table_and_tuned  # noqa: E402
from _timing import gpu_missing, markdown_table  # noqa: E402

from pyptx.testing import paired_ratio, paired_times  # noqa: E402

SHAPES = ["8x2048x4096x4096", "4x2048x256x2048", "64x128x4096x2048", "uneven"]
UNEVEN_TOTAL, UNEVEN_G, UNEVEN_NK = 16384, 16, 4096


def load_grouped():
    """The grouped GEMM's host module (``grouped_mm`` taking a plan, ``reference``)."""

    return importlib.import_module("pyptx_kernels.grouped_gemm.host")


def uneven_sizes(seed=0):
    """16 random group sizes summing to 16384, three of them 0."""
    import random

    rng = random.Random(seed)
    cuts = sorted(rng.randrange(1, UNEVEN_TOTAL) for _ in range(UNEVEN_G - 1 - 3))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [UNEVEN_TOTAL])]
    for i in (2, 7, 11):
        sizes.insert(i, 0)
    return sizes


def parse(shape):
    """(label, sizes, N, K) of ``GxMxNxK`` or ``uneven``."""
    if shape == "uneven":
        return f"uneven {UNEVEN_G} groups", uneven_sizes(), UNEVEN_NK, UNEVEN_NK
    G, M, N, K = (int(v) for v in shape.split("x"))
    return shape, [M] * G, N, K


def peer_grouped_mm(torch):
    """``torch._grouped_mm(a, b, offs=..., out_dtype=bf16)``, or None and the reason."""
    fn = getattr(torch, "_grouped_mm", None)
    if fn is None:
        return None, "torch._grouped_mm missing"
    try:
        a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(2, 64, 64, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor([32, 64], device="cuda", dtype=torch.int32)
        fn(a, b, offs=offs, out_dtype=torch.bfloat16)
    except Exception as e:  # noqa: BLE001 - report the peer's refusal in the table
        return None, f"torch._grouped_mm failed: {type(e).__name__}: {e}"
    return (lambda a, b, offs: fn(a, b, offs=offs, out_dtype=torch.bfloat16)), None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=SHAPES)
    p.add_argument("--rep", type=int, default=200, help="do_bench rep (ms)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pairs", type=int, default=20, help="paired rounds of table vs tuned")
    p.add_argument("--config", default=None,
                   help="JSON GroupedConfig keywords for ours, e.g. '{\"BM\": 64}'")
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    why = gpu_missing("grouped_gemm.py")
    if why:
        print(why, file=sys.stderr)
        return 2
    import torch
    from triton.testing import do_bench
    gg = load_grouped()
    ref_mod = importlib.import_module("pyptx_kernels.grouped_gemm.reference")
    cfg = gg.GroupedConfig(**json.loads(args.config)) if args.config else None
    peer, why = peer_grouped_mm(torch)
    if why:
        print(f"# {why}")
    dev = torch.cuda.get_device_name()
    print(f"# Grouped GEMM TFLOP/s on {dev}, do_bench median (L2 flushed), torch {torch.__version__}")

    def timed(fns, flops):
        t = {k: [] for k in fns}
        for r in range(args.rounds):
            names = list(fns)
            for k in names[r % len(names):] + names[:r % len(names)]:
                t[k].append(do_bench(fns[k], rep=args.rep, return_mode="median"))
        return {k: flops / (sorted(v)[len(v) // 2] * 1e-3) / 1e12 for k, v in t.items()}

    def fmt(v):
        return "n/a" if v is None else f"{v:.0f}"

    def two_defaults(call):
        """(table call, tuned call, plans) of a default ``grouped_mm`` call (``--config``:
        that plan twice)."""
        return (call, call, "--config") if cfg is not None else table_and_tuned(call)

    def vs_tuned(fns):
        if not args.pairs:
            return "-"
        per = paired_times({k: fns[k] for k in ("pyptx", "tuned")}, args.pairs)
        return f"{paired_ratio(per, 'tuned', 'pyptx')[0]:.3f}"

    fwd_rows, bwd_rows, records = [], [], []
    for shape in args.shapes:
        label, sizes, N, K = parse(shape)
        torch.manual_seed(0)
        M, G = sum(sizes), len(sizes)
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(G, K, N, device="cuda", dtype=torch.bfloat16)
        offs = ref_mod.random_offsets(sizes)
        flops = 2.0 * M * N * K
        ours = gg.grouped_mm(a, b, offs, config=cfg)
        ref = ref_mod.reference(a, b, offs)
        err = ((ours.double() - ref).norm() / ref.norm()).item()
        table, tuned, plans = two_defaults(
            lambda a=a, b=b, o=offs: gg.grouped_mm(a, b, o, config=cfg))
        fns = {"pyptx": table, "tuned": tuned}
        if peer is not None:
            fns["_grouped_mm"] = lambda a=a, b=b, o=offs: peer(a, b, o)
        if len(set(sizes)) == 1:
            a3 = a.view(G, sizes[0], K)
            fns["bmm"] = lambda a3=a3, b=b: torch.bmm(a3, b)
        tf = timed(fns, flops)
        best = max((tf[k] for k in ("_grouped_mm", "bmm") if k in tf), default=None)
        ratio = f"{tf['pyptx'] / best:.3f}" if best else "n/a"
        ratio_t = vs_tuned(fns)
        fwd_rows.append([label, fmt(tf["pyptx"]), fmt(tf["tuned"]), fmt(tf.get("_grouped_mm")),
                         fmt(tf.get("bmm")), ratio, ratio_t, plans, f"{err:.1e}"])
        print("| " + " | ".join(fwd_rows[-1]) + " |", flush=True)
        rec = dict(shape=label, sizes=sizes, N=N, K=K, forward=tf, err=err, plans=plans,
                   table_vs_tuned=ratio_t)
        if not args.no_backward:
            dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
            aa = a.clone().requires_grad_(True)
            bb = b.clone().requires_grad_(True)

            def ours_bwd(aa=aa, bb=bb, o=offs, dy=dy):
                aa.grad = bb.grad = None
                gg.grouped_mm(aa, bb, o, config=cfg).backward(dy)

            b_table, b_tuned, b_plans = two_defaults(ours_bwd)
            bfns = {"pyptx": b_table, "tuned": b_tuned}
            if peer is not None:
                def peer_bwd(aa=aa, bb=bb, o=offs, dy=dy):
                    aa.grad = bb.grad = None
                    peer(aa, bb, o).backward(dy)
                try:
                    peer_bwd()
                    bfns["torch autograd"] = peer_bwd
                except Exception as e:  # noqa: BLE001
                    print(f"# torch._grouped_mm backward failed: {type(e).__name__}: {e}")
            # forward + backward, FLOPs 3x the forward's (the forward runs inside each call)
            bt = timed(bfns, 3 * flops)
            peer_t = bt.get("torch autograd")
            b_ratio_t = vs_tuned(bfns)
            bwd_rows.append([label, fmt(bt["pyptx"]), fmt(bt["tuned"]), fmt(peer_t),
                             f"{bt['pyptx'] / peer_t:.3f}" if peer_t else "n/a", b_ratio_t,
                             b_plans])
            print("| fwd+bwd | " + " | ".join(bwd_rows[-1]) + " |", flush=True)
            rec["forward_backward"] = bt
            rec["forward_backward_table_vs_tuned"] = b_ratio_t
        records.append(rec)
    lines = [f"Grouped GEMM TFLOP/s on {dev} (bf16, do_bench median, torch {torch.__version__})", ""]
    lines += markdown_table(["G x M x N x K", "pyptx", "tuned", "_grouped_mm", "bmm",
                             "pyptx / best peer", "table / tuned", "plans (table / tuned)",
                             "rel err"], fwd_rows)
    if bwd_rows:
        lines += ["", "Forward + backward (dA and dB), TFLOP/s counting 3 x 2·ΣM·N·K", ""]
        lines += markdown_table(["G x M x N x K", "pyptx", "tuned", "torch autograd (_grouped_mm)",
                                 "pyptx / torch", "table / tuned", "plans (table / tuned)"],
                                bwd_rows)
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
