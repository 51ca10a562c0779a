"""Host time of ``pk.attention_with_kvcache`` on the CPU, kernels stubbed: µs per call back to
back (the best of 11 runs) for the decode cases of ``benchmarks/attention_decode.py``
(GQA 32/8 heads, D 128, B 1/16/64): contiguous and paged caches, with and without appended
``k, v``, causal or not.

CPU tensors pass for CUDA ones (``is_cuda``, the device check, the stream queries), and each
decode kernel's torch launcher (what ``Kernel.__call__`` hands the tensors to: the C++ fast
path's checks, output allocation and launch) is replaced by a stub that returns
preallocated outputs, so what is timed is the library's Python around the launch: checks,
plan lookup, counters, workspaces. ``--check`` asserts each launch got dense inputs of the
shapes its kernel's specs name; ``--profile CASE`` prints cProfile's top entries for one
case. Run: ``python tools/decode_host_cpu.py``."""

from __future__ import annotations

import argparse
import functools
import time

HQ, HKV, D = 32, 8, 128
PAGE = 64


class Launches:
    """The stubbed launches: ``record`` keeps ``(kernel, inputs, outputs)`` of each launch
    while ``on``."""

    def __init__(self):
        self.on = False
        self.log = []


LAUNCHES = Launches()


def _stub_launcher(check):
    import torch

    outs_of: dict = {}

    def launch(kernel, args, kwargs):
        specs = kernel._in_specs
        if check:
            assert len(args) == len(specs), (kernel.name, len(args), len(specs))
            for a, s in zip(args, specs):
                assert type(a) is torch.Tensor and a.is_contiguous(), kernel.name
                assert tuple(a.shape) == tuple(s.dims), (kernel.name, a.shape, s.dims)
        outs = outs_of.get(kernel)
        if outs is None:
            outs = outs_of[kernel] = tuple(
                torch.empty(tuple(s.dims), dtype=_torch_dtype(s.dtype)) for s in kernel._out_specs)
        if LAUNCHES.on:
            LAUNCHES.log.append((kernel, tuple(args), outs))
        return outs[0] if len(outs) == 1 else outs
    return launch


def _torch_dtype(dt):
    import torch

    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
            "s32": torch.int32, "u32": torch.int32}[dt.name]


def install(check=False):
    """Stub the decode kernels' torch launches and let CPU tensors pass for CUDA ones."""
    import torch
    from pyptx_kernels import _common
    from pyptx_kernels.flash_attention import decode_host

    from pyptx.errors import ConfigError

    stub = _stub_launcher(check)
    real_kernel = decode_host.decode_kernel

    def stubbed(kernel):
        kernel._launchers[torch.Tensor] = stub
        return kernel

    if not getattr(real_kernel, "_stubbed", False):
        def decode_kernel(*a, **kw):
            k, splits = real_kernel(*a, **kw)
            return stubbed(k), splits
        decode_kernel._stubbed = True
        decode_kernel.cache_clear = real_kernel.cache_clear
        decode_host.decode_kernel = decode_kernel
    _common.EAGER_DEVICES = ("cuda", "cpu")
    torch.Tensor.is_cuda = property(lambda self: True)   # the CUDA fast paths run on the CPU
    torch.cuda.is_current_stream_capturing = lambda: False

    class Stream:
        cuda_stream = 0

    torch.cuda.current_stream = lambda device=None: Stream
    torch._C._cuda_getCurrentRawStream = lambda index: 0
    torch._C._cuda_isCurrentStreamCapturing = lambda: False
    real = _common.check_devices

    def check_devices(who, *xs):   # the real check; its slow path refuses CPU tensors
        try:
            return real(who, *xs)
        except ConfigError:
            if all(x.device.type == "cpu" for x in xs if isinstance(x, torch.Tensor)):
                return None
            raise

    _common.check_devices = check_devices


def inputs(B, Sk, *, paged=False, append=False, ragged=False, Sq=1, seed=0, device="cpu"):
    """``(args, kwargs)`` of one ``attention_with_kvcache`` call (bf16, 32/8 heads, D 128;
    the caches zeroed, every sequence full unless ``ragged``)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    bf = torch.bfloat16
    q = torch.randn(B, Sq, HQ, D, generator=g).to(bf)
    kw = {}
    if paged:
        mp = Sk // PAGE
        kc = torch.zeros(B * mp, PAGE, HKV, D, dtype=bf, device=device)
        kw["block_table"] = torch.randperm(B * mp, generator=g).reshape(B, mp).to(torch.int32)
    else:
        kc = torch.zeros(B, Sk, HKV, D, dtype=bf, device=device)
    vc = torch.zeros_like(kc)
    cap = Sk - (Sq if append else 0)
    if ragged:
        lens = torch.randint(0, cap + 1, (B,), generator=g).to(torch.int32)
    else:
        lens = torch.full((B,), cap, dtype=torch.int32)
    if append:
        kw["k"] = torch.randn(B, Sq, HKV, D, generator=g).to(bf)
        kw["v"] = torch.randn(B, Sq, HKV, D, generator=g).to(bf)
    kw = {n: t.to(device) for n, t in kw.items()}
    return (q.to(device), kc, vc, lens.to(device)), kw


#: (name, B, Sk, options)
CASES = [
    ("B1 32k", 1, 32768, {}),
    ("B16 4k", 16, 4096, {}),
    ("B16 4k paged", 16, 4096, {"paged": True}),
    ("B64 1k", 64, 1024, {}),
    ("B64 1k paged", 64, 1024, {"paged": True}),
    ("B16 4k append", 16, 4096, {"append": True}),
    ("B16 4k paged append", 16, 4096, {"paged": True, "append": True}),
    ("B64 1k noncausal", 64, 1024, {"causal": False}),
]


def timed(fn, n, reps=11):
    for _ in range(n // 4):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return min(out)


def call_of(B, Sk, opts, device="cpu"):
    import pyptx_kernels as pk

    opts = dict(opts)
    causal = opts.pop("causal", True)
    args, kw = inputs(B, Sk, device=device, **opts)
    return lambda: pk.attention_with_kvcache(*args, causal=causal, **kw)


def _launch_of(fn):
    """``(kernel, args)`` of the decode launch one call of ``fn`` makes."""
    from pyptx.kernel import Kernel

    captured, orig = [], Kernel.__call__

    def spy(self, *args, **kwargs):
        captured.append((self, args))
        return orig(self, *args, **kwargs)
    Kernel.__call__ = spy
    try:
        fn()
    finally:
        Kernel.__call__ = orig
    return captured[-1]


def gpu_main(n, reps=7, device="cuda"):
    """On a CUDA device, nothing stubbed: host µs per call of each case (the GPU kept busy by
    ``torch.cuda._sleep`` while ``n`` calls are queued, so only the host is timed; the best
    of ``reps``) and of the kernel launch alone (``Kernel.__call__`` on the same inputs and
    counters the call hands it), so call - launch is the library's Python."""
    import torch

    def host_us(fn):
        best = float("inf")
        for _ in range(reps):
            torch.cuda.synchronize()
            torch.cuda._sleep(400_000_000)   # ~0.2 s of GPU time: the calls only queue
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
        return best

    print(f"{'case':22s} {'call us':>8s} {'launch us':>10s} {'python us':>10s}")
    for name, B, Sk, opts in CASES:
        fn = call_of(B, Sk, opts, device=device)
        fn()
        kern, args = _launch_of(fn)
        call = host_us(fn)
        launch = host_us(functools.partial(kern, *args))
        print(f"{name:22s} {call:8.1f} {launch:10.1f} {call - launch:10.1f}", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=2000)
    p.add_argument("--check", action="store_true", help="assert dense, spec-shaped launches")
    p.add_argument("--profile", default=None, help="cProfile one case (a name of CASES)")
    p.add_argument("--only", default=None, help="cases whose name contains this")
    p.add_argument("--gpu", action="store_true",
                   help="on a CUDA device, nothing stubbed: host us of the call and the launch")
    a = p.parse_args(argv)
    if a.gpu:
        return gpu_main(min(a.n, 200))

    install(check=a.check)
    if a.profile:
        import cProfile
        import pstats

        (B, Sk, opts), = [c[1:] for c in CASES if c[0] == a.profile]
        fn = call_of(B, Sk, opts)
        fn()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.n):
            fn()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
        return 0
    for name, B, Sk, opts in CASES:
        if a.only and a.only not in name:
            continue
        fn = call_of(B, Sk, opts)
        fn()
        print(f"{name:22s} {timed(fn, a.n):6.1f} us/call", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
