"""``torch.compile`` of the pyptx-patched Hugging Face Llama on the CPU: compile wall time,
graphs, graph breaks and recompiles, against the unpatched model (issue 48).

The patched model's ops are the real ``torch.ops.pyptx.*`` custom ops (their Python
wrappers, fakes and autograd) with a CPU kernel registered for each that returns its fake's
outputs as zeros: no GPU, nothing launches, the numbers are meaningless, the traced graphs
are the device's. One training step (forward with labels, so the fused linear +
cross-entropy runs, and backward) is timed twice: the first includes compilation.

    python tools/llama_compile_cpu.py --layers 2,4,8 --backend inductor
    python tools/llama_compile_cpu.py --layers 8 --backend eager --profile /tmp/p.prof
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

SMALL = dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
             intermediate_size=1408, vocab_size=32000)
BENCH = dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=4, head_dim=128,
             intermediate_size=5632, vocab_size=32000)


def _cpu_kernels():
    """A CPU kernel for every ``torch.ops.pyptx`` op, defined now or later: its fake's
    outputs, zeroed."""
    import torch
    from pyptx_kernels import _common

    def zeros(fake):
        def kernel(*args):
            out = fake(*args)
            if isinstance(out, (tuple, list)):
                return type(out)(o.zero_() if isinstance(o, torch.Tensor) else o for o in out)
            return out.zero_()
        return kernel

    if getattr(_common._define_now, "_cpu_kernels", False):
        return
    _common.check_devices = lambda *a: None   # eager backward ops on CPU tensors
    _register_cpu_kernels(lambda name, op: zeros(op._abstract_fn))._cpu_kernels = True


def _register_cpu_kernels(kernel_of):
    """Register ``kernel_of(name, op)`` as the CPU kernel of every ``torch.ops.pyptx`` op,
    those defined now and each one defined later; returns the wrapped ``_define_now``."""
    from pyptx_kernels import _common

    done = set()

    def register():
        for name, op in _common._TORCH_OPS.items():
            if name not in done:
                done.add(name)
                op.register_kernel("cpu", kernel_of(name, op))

    define_now = _common._define_now

    def _define_now(name):
        op = define_now(name)
        register()
        return op

    _common._define_now = _define_now
    _common.define_ops()
    register()
    return _define_now


def _emulate_gpu_host():
    """The host work of a GPU run on the CPU: each op's CPU kernel is its real implementation
    (plans, family traces, ptxas into the disk cache, the background sibling compiles),
    with every kernel launch replaced by zeroed outputs of the launch's shapes."""
    import torch
    from pyptx_kernels import _common, _family

    from pyptx import driver, jit
    from pyptx.plan import dtype_name_of
    from pyptx_torch import eager

    driver.driver_version = lambda: 13000       # ptxas 13.0 counts as usable
    _common.check_devices = lambda *a: None
    _common.zeroed_words = lambda like, n, jax_dtype="int32": torch.zeros(n, dtype=torch.int32)
    real_cuda = driver.cuda
    in_background = _family.in_background

    def background(job):                        # queue as where a driver is loaded
        driver.cuda = lambda: True
        try:
            in_background(job)
        finally:
            driver.cuda = real_cuda

    _family.in_background = background

    def make_launcher():
        specs = {}

        def launch(kernel, args, kwargs):
            if torch.compiler.is_compiling():
                from pyptx_torch.compiled import compiled_call

                return compiled_call(kernel, args, kwargs)
            key = (tuple(tuple(a.shape) for a in args), tuple(sorted(kwargs.items())))
            spec = specs.get(key)
            if spec is None:
                spec = specs[key] = kernel.specialize([tuple(a.shape) for a in args], **kwargs)
                text, locs = spec.emit()
                jit.cubin_for(text, spec.arch, spec.name, locs=locs)
            outs = [torch.empty(sh, dtype=getattr(torch, dtype_name_of(o.dtype)))
                    for sh, o in zip(spec.out_shapes, kernel.out_specs)]
            return outs[0] if len(outs) == 1 else tuple(outs)

        return launch

    eager.make_launcher = make_launcher
    _register_cpu_kernels(lambda name, op: _common._EAGER[name][0])


def _model(layers, dims, patched, apply_kwargs, emulate=False):
    import torch
    import transformers

    cfg = transformers.LlamaConfig(num_hidden_layers=layers, max_position_embeddings=8192,
                                   attention_dropout=0.0, tie_word_embeddings=False, **dims)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                          dtype=torch.bfloat16)
    model.train()
    if patched:
        from pyptx_kernels.transformers import apply

        apply(model, **apply_kwargs)
        _emulate_gpu_host() if emulate else _cpu_kernels()
    return model


def run(layers, *, dims=SMALL, patched=True, backend="inductor", batch=2, seq=128,
        apply_kwargs=None, profile=None, fullgraph=False, steps=4, emulate=False):
    """``dict`` of one configuration's numbers."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    from torch._inductor import metrics

    metrics.reset()
    model = _model(layers, dims, patched, apply_kwargs or {}, emulate)
    graphs = []
    if backend == "record":
        def compiler(gm, example_inputs):
            graphs.append(gm)
            return gm.forward
    else:
        compiler = backend
    fn = model if backend == "none" else torch.compile(model, backend=compiler,
                                                        fullgraph=fullgraph)
    ids = torch.randint(0, dims["vocab_size"], (batch, seq),
                        generator=torch.Generator().manual_seed(1))
    times = []
    prof = cProfile.Profile() if profile else None
    for i in range(steps):
        t0 = time.perf_counter()
        if prof is not None and i == 0:
            prof.enable()
        loss = fn(input_ids=ids, labels=ids, use_cache=False).loss
        t1 = time.perf_counter()
        loss.backward()
        if prof is not None and i == 0:
            prof.disable()
        times.append((t1 - t0, time.perf_counter() - t1))
        model.zero_grad(set_to_none=True)
    if prof is not None:
        prof.dump_stats(profile)
    stats = dict(counters["stats"])
    from torch._inductor import metrics
    out = dict(layers=layers, patched=patched, backend=backend,
               fwd_s=times[0][0], bwd_s=times[0][1], later_s=[round(sum(t), 2) for t in times[1:]],
               unique_graphs=stats.get("unique_graphs", 0),
               frames=stats.get("calls_captured", 0),
               graph_breaks=sum(counters["graph_break"].values()),
               recompiles=sum(counters["recompiles"].values()),
               break_reasons=dict(counters["graph_break"]),
               kernels=metrics.generated_kernel_count)
    if emulate:
        from pyptx_kernels import _family

        out["bg_jobs_left"] = len(_family._jobs)
        t0 = time.perf_counter()
        _family.wait_idle()
        out["bg_drain_s"] = time.perf_counter() - t0
        out["families"] = _family.stats()
    if graphs:
        out["recorded_graphs"] = len(graphs)
        out["graph_nodes"] = [len(g.graph.nodes) for g in graphs]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", default="2,4,8")
    p.add_argument("--backend", default="inductor",
                   help="inductor, aot_eager, eager or record (dynamo only)")
    p.add_argument("--bench-dims", action="store_true", help="the benchmark's 2048-wide layers")
    p.add_argument("--unpatched", action="store_true", help="also the unpatched model")
    p.add_argument("--only-unpatched", action="store_true")
    p.add_argument("--emulate-gpu-host", action="store_true",
                   help="the ops run their host code (plans, traces, ptxas, background "
                        "sibling compiles) with the launches stubbed; backend none: eager")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--fullgraph", action="store_true")
    p.add_argument("--logs", action="store_true", help="dynamo's recompile/graph-break logs")
    p.add_argument("--profile", help="cProfile of the first step to this file (and a summary)")
    p.add_argument("--torch211", action="store_true",
                   help="torch 2.11's is_compiling(): True only in code dynamo traces (2.13 "
                        "holds it True process-wide for the whole compile session)")
    p.add_argument("--warm-cache", action="store_true",
                   help="keep inductor's caches (default: a fresh cache folder per run)")
    a = p.parse_args(argv)
    if not a.warm_cache:
        import tempfile

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
        os.environ["PYPTX_CACHE_DIR"] = tempfile.mkdtemp(prefix="pyptx-")
    import torch

    torch.set_num_threads(2)
    if a.torch211:
        import contextlib

        torch.compiler._compile_session_context = contextlib.nullcontext
    if a.logs:
        torch._logging.set_logs(recompiles=True, graph_breaks=True)
    dims = BENCH if a.bench_dims else SMALL
    kinds = [False] if a.only_unpatched else ([True, False] if a.unpatched else [True])
    for n in (int(v) for v in a.layers.split(",")):
        for patched in kinds:
            prof = a.profile if patched else None
            r = run(n, dims=dims, patched=patched, backend=a.backend, batch=a.batch, seq=a.seq,
                    fullgraph=a.fullgraph, profile=prof, emulate=a.emulate_gpu_host,
                    steps=a.steps)
            print(("pyptx  " if patched else "torch  ") + " ".join(
                f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
                if k not in ("patched",)), flush=True)
            if prof:
                pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
    return 0


if __name__ == "__main__":
    sys.exit(main())
