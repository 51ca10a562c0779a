"""The fused kernels of a Llama training step, each on its own, beside torch eager,
``torch.compile`` of the same torch code and Liger-Kernel (where ``liger_kernel`` imports):
``triton.testing.do_bench`` medians in µs, forward and forward + backward.

* ``add_rms_norm``: ``h = x + r; y = rms_norm(h) * w`` at 8192 (and 32768) tokens x 2048,
  bf16 (Liger: ``liger_fused_add_rms_norm``, not in place);
* ``swiglu``: ``silu(gate) * up`` at 8192 tokens x 5632 (the MLP width), bf16 (Liger:
  ``LigerSiLUMulFunction``);
* ``rope``: q ``(4, 16, 2048, 128)`` and k ``(4, 4, 2048, 128)`` as the projections' views
  come (``(B, S, H, D)`` memory), transformers' ``apply_rotary_pos_emb``, bf16;
* ``linear_cross_entropy``: 8192 tokens x 2048 against vocabularies 32000 and 128256, bf16,
  forward + backward (the head's GEMMs included; torch upcasts the logits to f32 as
  transformers' loss does).

Every contender is checked against torch eager before it is timed. ``--quick`` times
smaller shapes.

    python benchmarks/fused_kernels.py [--quick] [--only linear_cross_entropy] --out fused_kernels.md

Target (issue 48): each fused kernel >= 1.0x the best of eager, compile and Liger.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import gpu_missing, markdown_table  # noqa: E402


def _cases(quick):
    import pyptx_kernels as pk
    import torch
    import torch.nn.functional as F

    bf = torch.bfloat16
    dev = "cuda"
    cases = []

    def leaf(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev) * scale).to(bf).requires_grad_()

    for T in ((1024,) if quick else (8192, 32768)):
        N = 2048
        x, r, w = leaf(T, N), leaf(T, N), leaf(N)

        def torch_add_norm(x, r, w):
            h = x + r
            return F.rms_norm(h, (h.shape[-1],), w, 1e-6), h

        peers = {"eager": torch_add_norm, "compile": torch.compile(torch_add_norm),
                 "pyptx": lambda x, r, w: pk.add_rms_norm(x, r, w, 1e-6)}
        liger = _liger_add_rms_norm()
        if liger is not None:
            peers["liger"] = liger
        cases.append((f"add_rms_norm {T}x{N}", peers, (x, r, w)))

    T, W = (1024, 1408) if quick else (8192, 5632)
    g, u = leaf(T, W), leaf(T, W)

    def torch_swiglu(g, u):
        return F.silu(g) * u

    peers = {"eager": torch_swiglu, "compile": torch.compile(torch_swiglu), "pyptx": pk.swiglu}
    liger = _liger_swiglu()
    if liger is not None:
        peers["liger"] = liger
    cases.append((f"swiglu {T}x{W}", peers, (g, u)))

    B, S = (1, 256) if quick else (4, 2048)
    q0, k0 = leaf(B, S, 16, 128), leaf(B, S, 4, 128)
    q, k = q0.transpose(1, 2), k0.transpose(1, 2)
    ang = torch.randn(1, S, 64, device=dev)
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().to(bf), ang.sin().to(bf)

    def hf_rope(q, k, cos, sin):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        return apply_rotary_pos_emb(q, k, cos, sin)

    peers = {"eager": hf_rope, "compile": torch.compile(hf_rope), "pyptx": pk.apply_rotary}
    liger = _liger_rope()
    if liger is not None:
        peers["liger"] = liger
    cases.append((f"rope {B}x{S} 16/4 heads x 128", peers, (q, k, cos, sin)))

    T, H = (1024, 512) if quick else (8192, 2048)
    for V in (32000, 128256):
        x, w = leaf(T, H), leaf(V, H, scale=H ** -0.5)
        t = torch.randint(0, V, (T,), device=dev)

        def torch_lce(x, w, t):
            return F.cross_entropy(F.linear(x, w).float(), t)

        peers = {"eager": torch_lce, "compile": torch.compile(torch_lce),
                 "pyptx": pk.linear_cross_entropy}
        liger = _liger_lce()
        if liger is not None:
            peers["liger"] = lambda x, w, t, f=liger: f(w, x, t)
        cases.append((f"linear_cross_entropy {T}x{H}, V={V}", peers, (x, w, t)))
    return cases


def _liger_add_rms_norm():
    try:
        from liger_kernel.transformers.functional import liger_fused_add_rms_norm
    except Exception:
        return None
    return lambda x, r, w: liger_fused_add_rms_norm(x, r, w, 1e-6, in_place=False)


def _liger_swiglu():
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except Exception:
        return None
    return LigerSiLUMulFunction.apply


def _liger_rope():
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except Exception:
        return None
    return liger_rotary_pos_emb


def _liger_lce():
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except Exception:
        return None
    return LigerFusedLinearCrossEntropyLoss()


def _outputs(y):
    return list(y) if isinstance(y, (tuple, list)) else [y]


def _check(name, peers, args):
    """Each contender's forward and gradients against eager's (relative L2 error < 3e-2)."""
    import torch

    def run(fn):
        ys = _outputs(fn(*args))
        ins = [a for a in args if a.requires_grad]
        gs = torch.autograd.grad(ys, ins, [torch.ones_like(y) for y in ys])
        return [y.detach().float() for y in ys] + [g.float() for g in gs]

    ref = run(peers["eager"])
    ok = {}
    for label, fn in peers.items():
        try:
            got = run(fn)
            err = max(((a - b).norm() / b.norm().clamp(min=1e-30)).item()
                      for a, b in zip(got, ref))
            ok[label] = err < 3e-2
            if not ok[label]:
                print(f"{name} {label}: rel err {err:.2e} vs eager: not timed", file=sys.stderr)
        except Exception as e:
            print(f"{name} {label}: {type(e).__name__}: {e}", file=sys.stderr)
            ok[label] = False
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", help="run the cases whose name contains this text")
    p.add_argument("--out")
    a = p.parse_args(argv)
    why = gpu_missing("fused_kernels.py")
    if why:
        print(why, file=sys.stderr)
        return 2
    import torch
    from triton.testing import do_bench

    head = ["kernel", "pass", "eager µs", "compile µs", "liger µs", "pyptx µs", "vs best peer"]
    body, verdicts = [], []
    from pyptx_kernels import _family

    for name, peers, args in _cases(a.quick):
        if a.only and a.only not in name:
            continue
        ok = _check(name, peers, args)
        _family.wait_idle(120)   # the first calls' background compiles: steady state only
        ins = [x for x in args if x.requires_grad]
        for kind in ("fwd", "fwd+bwd"):
            times = {}
            for label, fn in peers.items():
                if not ok.get(label):
                    continue
                if kind == "fwd":
                    def call(fn=fn, args=args):
                        with torch.no_grad():
                            return fn(*args)
                else:
                    def call(fn=fn, args=args, ins=ins):
                        ys = _outputs(fn(*args))
                        return torch.autograd.grad(
                            ys, ins, [torch.ones_like(y) for y in ys])
                times[label] = do_bench(call, warmup=25, rep=200) * 1e3
            peer = min((v for k, v in times.items() if k != "pyptx"), default=None)
            ours = times.get("pyptx")
            ratio = f"{peer / ours:.3f}x" if ours and peer else "n/a"
            body.append([name, kind, *(f"{times[k]:.1f}" if k in times else "n/a"
                                       for k in ("eager", "compile", "liger", "pyptx")), ratio])
            if ours and peer:
                verdicts.append(f"{name} {kind}: {peer / ours:.3f}x "
                                f"({'PASS' if ours <= peer else 'FAIL'} >= 1.0x)")
            print(" | ".join(body[-1]), flush=True)
    lines = [f"# Fused kernels ({torch.cuda.get_device_name()}, do_bench medians)", "",
             *markdown_table(head, body), "", "## Targets", "",
             *[f"- {v}" for v in verdicts], ""]
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
