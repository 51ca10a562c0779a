"""Where a Llama training step's GPU time goes: one mode of ``benchmarks/llama_step.py``
under ``torch.profiler``; prints the wall time per step, the summed kernel time per step and
the top kernels by total GPU time.

    python tools/llama_profile.py --mode "pyptx eager" --config v32k-s2048 --top 30
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", default="pyptx eager")
    p.add_argument("--config", default="v32k-s2048")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--apply", default="")
    p.add_argument("--host", action="store_true",
                   help="also: cProfile of the steps (top functions by own time) and the "
                        "CUDA runtime calls that block (synchronize, memcpy)")
    a = p.parse_args(argv)
    import llama_step as ls
    import torch
    from torch.profiler import ProfilerActivity, profile

    spec = ls.CONFIGS[a.config]
    cfg = ls._model_config(spec)
    model, fn = ls._build(a.mode, cfg, ls._apply_kwargs(a.apply))
    opt = torch.optim.SGD(model.parameters(), lr=ls.LR)
    ids = torch.randint(0, cfg.vocab_size, (spec["batch"], spec["seq"]), device="cuda")

    def step():
        loss = fn(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    if a.mode.startswith("pyptx"):
        from pyptx_kernels import _family

        t = time.perf_counter()
        idle = _family.wait_idle(120)
        print(f"background compiles: idle={idle} after {time.perf_counter() - t:.2f} s")
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / a.steps * 1e3
    acts = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if a.host else [])
    with profile(activities=acts) as prof:
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            r = rows.setdefault(e.name, [0.0, 0])
            r[0] += e.device_time if hasattr(e, "device_time") else e.cuda_time
            r[1] += 1
    total = sum(v[0] for v in rows.values()) / a.steps / 1e3
    print(f"## {a.mode} {a.config}: wall {wall:.2f} ms/step, kernels {total:.2f} ms/step "
          f"(GPU busy {100 * total / wall:.0f}%)")
    for name, (us, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:a.top]:
        print(f"{us / a.steps / 1e3:8.3f} ms  {n // a.steps:4d}x  {name[:110]}")
    if a.host:
        runtime = {}
        for e in prof.events():
            if e.device_type != torch.autograd.DeviceType.CUDA and e.name.startswith("cuda"):
                r = runtime.setdefault(e.name, [0.0, 0])
                r[0] += e.cpu_time_total
                r[1] += 1
        print("CUDA runtime calls per step (host ms, count):")
        for name, (us, n) in sorted(runtime.items(), key=lambda kv: -kv[1][0])[:12]:
            print(f"{us / a.steps / 1e3:8.3f} ms  {n // a.steps:5d}x  {name}")
        import cProfile
        import pstats

        pr = cProfile.Profile()
        torch.cuda.synchronize()
        pr.enable()
        for _ in range(a.steps):
            step()
        pr.disable()
        torch.cuda.synchronize()
        st = pstats.Stats(pr)
        st.sort_stats("tottime").print_stats(35)
        st.sort_stats("cumulative").print_stats(45)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
