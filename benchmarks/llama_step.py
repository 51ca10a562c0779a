"""A Hugging Face Llama training step (bf16, SGD) on one GPU: tokens/s and peak memory of torch
eager (SDPA), ``torch.compile`` of the same model, the pyptx-patched model
(``pyptx_kernels.transformers.apply``) eager and under ``torch.compile``, and Liger-Kernel's
patched model where ``liger_kernel`` imports.

Every configuration builds the model from the same seed and trains it ``--steps`` steps (default
50) on the same batches (a fixed pool of random token batches, cycled, so the loss falls),
``labels = input_ids``, ``use_cache=False``. tokens/s is over the steps after ``--warmup``
(compilation and tuning happen there); peak memory is ``torch.cuda.max_memory_allocated``
over the whole run, model and optimizer included. The loss curves are compared with torch
eager's: the largest relative difference over the steps, beside the same number between
torch eager and ``torch.compile`` (two bf16 runs of the same math that round differently:
the noise floor of this run). A curve agrees when its difference is within
``max(3 x that floor, 1e-2)``.

Models (``--config``; ``all`` runs each in turn): 8 layers, hidden 2048, 16 query / 4 KV heads
of 128, MLP 5632, and

* ``v32k-s2048``: vocabulary 32000, 4 sequences of 2048 tokens;
* ``v128k-s2048``: vocabulary 128256, 4 x 2048;
* ``v32k-s8192``: vocabulary 32000, 1 x 8192;
* ``v128k-s8192``: vocabulary 128256, 1 x 8192.

``--quick`` is a smoke run (2 layers, hidden 512, 2 x 512 tokens, 6 steps). ``--apply`` passes
keywords to ``apply`` for both pyptx modes, e.g. the GEMM epilogues on or off:
``--apply swiglu_linear=1,linear_residual=1`` (``0``/``1``, ``false``/``true``); the tables'
heading names them. ``--model`` overrides the model's fields (and ``batch``/``seq``), e.g.
``--model hidden_size=4096,num_attention_heads=32,num_key_value_heads=8,intermediate_size=14336``.

    python benchmarks/llama_step.py --config v32k-s2048 --steps 20 --out llama_step.md
    python benchmarks/llama_step.py --modes "torch.compile,pyptx eager,pyptx + compile" \
        --apply swiglu_linear=0,linear_residual=0

Targets (issue 48): pyptx-patched (the better of eager and compiled) >= 1.15x ``torch.compile``
at 2048 and 8192 tokens per sequence; peak memory <= 0.7x ``torch.compile``'s at vocabulary
128k; the loss curves agree.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import gpu_missing, markdown_table  # noqa: E402

BASE = dict(num_hidden_layers=8, hidden_size=2048, num_attention_heads=16, num_key_value_heads=4,
            head_dim=128, intermediate_size=5632, max_position_embeddings=8192,
            attention_dropout=0.0, tie_word_embeddings=False)
CONFIGS = {
    "v32k-s2048": dict(vocab_size=32000, batch=4, seq=2048),
    "v128k-s2048": dict(vocab_size=128256, batch=4, seq=2048),
    "v32k-s8192": dict(vocab_size=32000, batch=1, seq=8192),
    "v128k-s8192": dict(vocab_size=128256, batch=1, seq=8192),
}
QUICK = dict(num_hidden_layers=2, hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
             head_dim=64, intermediate_size=1408, vocab_size=32000, batch=2, seq=512)
#: the order runs go in: Liger patches transformers' modules for good, so it goes last
MODES = ("torch eager", "torch.compile", "pyptx eager", "pyptx + compile", "liger")
POOL = 4   # distinct batches, cycled
LR = 1e-2


def _model_config(spec):
    import transformers

    kw = {k: v for k, v in {**BASE, **spec}.items() if k not in ("batch", "seq")}
    return transformers.LlamaConfig(**kw)


def _apply_kwargs(text):
    """``apply``'s keywords from ``"name=0,name=1"``."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, value = item.partition("=")
        if value.lower() not in ("0", "1", "false", "true"):
            raise argparse.ArgumentTypeError(f"{item!r} is not name=0|1")
        out[name.strip()] = value.lower() in ("1", "true")
    return out


def _model_overrides(text):
    """Model keywords over the chosen config from ``"hidden_size=4096,batch=2"`` (integers:
    ``LlamaConfig`` fields and ``batch``/``seq``)."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, value = item.partition("=")
        if not value.strip().isdigit():
            raise argparse.ArgumentTypeError(f"{item!r} is not name=<integer>")
        out[name.strip()] = int(value)
    return out


def _build(mode, cfg, apply_kwargs):
    import torch
    import transformers

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, attn_implementation="sdpa", dtype=torch.bfloat16)
    model.train()
    step_fn = model
    if mode.startswith("pyptx"):
        from pyptx_kernels.transformers import apply

        apply(model, **apply_kwargs)
    if mode == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=True, model=model)
    if mode in ("torch.compile", "pyptx + compile"):
        step_fn = torch.compile(model)
    return model, step_fn


def _report(mode, i, phases):
    """``--diagnose``: one step's phase times (synchronized), dynamo's counters and the
    background compile queue, printed as the step ends."""
    import torch
    from pyptx_kernels import _family
    from torch._dynamo.utils import counters

    times = " ".join(f"{k} {v:.2f}s" for k, v in phases)
    stats = dict(counters["stats"])
    print(f"  [{mode}] step {i}: {times}; graphs {stats.get('unique_graphs', 0)}, "
          f"breaks {sum(counters['graph_break'].values())}, "
          f"recompiles {sum(counters['recompiles'].values())}, "
          f"background jobs {len(_family._jobs)}, families {_family.stats()}, "
          f"GPU mem {torch.cuda.memory_allocated() / 2**30:.2f} GiB", flush=True)


def _run(mode, cfg, spec, steps, warmup, apply_kwargs, diagnose=0):
    """``(tokens/s, peak GiB, [loss per step])`` of one configuration. ``diagnose``: the
    seconds after which a step still running dumps every thread's stack (0: off), with each
    step's phases reported (``_report``)."""
    import faulthandler

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model, fn = _build(mode, cfg, apply_kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    g = torch.Generator(device="cuda").manual_seed(1)
    B, S = spec["batch"], spec["seq"]
    batches = [torch.randint(0, cfg.vocab_size, (B, S), device="cuda", generator=g)
               for _ in range(POOL)]
    losses = []
    t0 = None
    if diagnose:
        from torch._dynamo.utils import counters

        counters.clear()
    for i in range(steps):
        if i == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        if diagnose:
            faulthandler.dump_traceback_later(diagnose, repeat=True)
            ts = [time.perf_counter()]
        ids = batches[i % POOL]
        loss = fn(input_ids=ids, labels=ids, use_cache=False).loss
        if diagnose:
            torch.cuda.synchronize()
            ts.append(time.perf_counter())
        loss.backward()
        if diagnose:
            torch.cuda.synchronize()
            ts.append(time.perf_counter())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().float())
        if diagnose:
            faulthandler.cancel_dump_traceback_later()
            torch.cuda.synchronize()
            ts.append(time.perf_counter())
            _report(mode, i, list(zip(("forward", "backward", "optimizer"),
                                      (b - a for a, b in zip(ts, ts[1:])))))
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    tokens_s = B * S * (steps - warmup) / elapsed
    peak = torch.cuda.max_memory_allocated() / 2**30
    curve = [v.item() for v in losses]
    del model, fn, opt, batches, losses
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    return tokens_s, peak, curve


def _liger_available() -> bool:
    try:
        import liger_kernel.transformers  # noqa: F401
    except Exception:
        return False
    return True


def _diff(curve, ref):
    return max(abs(a - b) / abs(b) for a, b in zip(curve, ref))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="v32k-s2048", choices=[*CONFIGS, "all"])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma-separated subset of: " + ", ".join(MODES))
    p.add_argument("--quick", action="store_true", help="a small smoke run")
    p.add_argument("--apply", type=_apply_kwargs, default={},
                   help="keywords for pyptx_kernels.transformers.apply, e.g. "
                        "swiglu_linear=1,linear_residual=0")
    p.add_argument("--diagnose", type=float, default=0, metavar="S",
                   help="print each step's forward/backward/optimizer time, dynamo's graphs, "
                        "graph breaks and recompiles (with their logs) and the background "
                        "compile queue; dump every thread's stack each S s a step runs")
    p.add_argument("--model", type=_model_overrides, default={},
                   help="override the config's model, e.g. hidden_size=4096,"
                        "num_attention_heads=32,num_key_value_heads=8,intermediate_size=14336,"
                        "batch=2,seq=4096 (a model no table lists)")
    p.add_argument("--out", help="write the markdown tables here")
    a = p.parse_args(argv)
    why = gpu_missing("llama_step.py", triton=False)
    if why:
        print(why, file=sys.stderr)
        return 2
    import torch

    if a.diagnose:
        torch._logging.set_logs(recompiles=True, graph_breaks=True)
    modes = [m for m in MODES if m in a.modes.split(",")]
    if "liger" in modes and not _liger_available():
        print("liger_kernel does not import: its column is left out")
        modes.remove("liger")
    steps, warmup = (6, 2) if a.quick else (a.steps, a.warmup)
    if steps <= warmup:
        p.error(f"--steps ({steps}) must exceed --warmup ({warmup})")
    names = ["quick"] if a.quick else (list(CONFIGS) if a.config == "all" else [a.config])
    applied = ", ".join(f"{k}={v}" for k, v in a.apply.items()) or "defaults"
    lines = [f"# Llama training step ({torch.cuda.get_device_name()}, bf16, SGD lr {LR}, "
             f"{steps} steps, {warmup} warm-up; apply: {applied})", ""]
    verdicts = []
    for name in names:
        spec = {**(QUICK if a.quick else CONFIGS[name]), **a.model}
        cfg = _model_config(spec)
        res = {}
        for mode in modes:
            try:
                res[mode] = _run(mode, cfg, spec, steps, warmup, a.apply, a.diagnose)
            except Exception as e:  # a contender that fails is reported, not fatal
                print(f"{name} {mode}: {type(e).__name__}: {e}", file=sys.stderr)
                res[mode] = None
            r = res[mode]
            print(f"{name} {mode}: " + ("failed" if r is None else
                  f"{r[0]:,.0f} tok/s, peak {r[1]:.2f} GiB, loss {r[2][0]:.4f} -> {r[2][-1]:.4f}"),
                  flush=True)
        ref = res.get("torch eager")
        comp = res.get("torch.compile")
        floor = _diff(comp[2], ref[2]) if ref and comp else None
        tol = max(3 * floor, 1e-2) if floor is not None else 1e-2
        body = []
        for mode in modes:
            r = res[mode]
            if r is None:
                body.append([mode, "failed", "", "", "", "", ""])
                continue
            body.append([
                mode, f"{r[0]:,.0f}", f"{r[0] / comp[0]:.3f}x" if comp else "n/a",
                f"{r[1]:.2f}", f"{r[1] / comp[1]:.3f}x" if comp else "n/a",
                f"{r[2][0]:.4f} -> {r[2][-1]:.4f}",
                f"{_diff(r[2], ref[2]):.2e}" if ref else "n/a"])
        B, S = spec["batch"], spec["seq"]
        lines += [f"## {name}{' (--model ' + ','.join(f'{k}={v}' for k, v in a.model.items()) + ')' if a.model else ''}: "
                  f"vocab {cfg.vocab_size}, {B} x {S} tokens, {cfg.num_hidden_layers} "
                  f"layers, hidden {cfg.hidden_size}", "",
                  *markdown_table(["model", "tokens/s", "vs compile", "peak GiB",
                                   "peak vs compile", "loss first -> last",
                                   "max rel diff vs eager"], body), "",
                  f"Loss tolerance: max(3 x eager-vs-compile {floor if floor is None else f'{floor:.2e}'}"
                  f", 1e-2) = {tol:.2e}.", ""]
        ours = [res[m] for m in ("pyptx eager", "pyptx + compile") if res.get(m)]
        if comp and ours:
            best = max(ours, key=lambda r: r[0])
            verdicts.append(f"{name}: speed {best[0] / comp[0]:.3f}x compile "
                            f"({'PASS' if best[0] >= 1.15 * comp[0] else 'FAIL'} >= 1.15x)")
            if cfg.vocab_size > 100000:
                low = min(r[1] for r in ours)
                verdicts.append(f"{name}: memory {low / comp[1]:.3f}x compile "
                                f"({'PASS' if low <= 0.7 * comp[1] else 'FAIL'} <= 0.7x)")
            if ref:
                worst = max(_diff(r[2], ref[2]) for r in ours)
                verdicts.append(f"{name}: loss max rel diff {worst:.2e} "
                                f"({'PASS' if worst <= tol else 'FAIL'} <= {tol:.2e})")
    lines += ["## Targets", "", *[f"- {v}" for v in verdicts], ""]
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
