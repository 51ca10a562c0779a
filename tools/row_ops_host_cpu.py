"""Host time of ``pk.add_rms_norm``, ``pk.swiglu`` and ``pk.apply_rotary`` on the CPU, kernels
stubbed: µs per call back to back (the best of 11 runs), forward under ``no_grad``, forward on
inputs that require grad, and forward + ``torch.autograd.grad`` (``benchmarks/fused_kernels.py``'s
passes).

The launches return preallocated outputs (no allocation, no launch) and CPU tensors pass for
CUDA ones (``is_cuda``, the device check, the eager path), so what is timed is the library's
Python around the kernels: checks, views, the autograd node. ``--check`` asserts each launch got dense
inputs of the shapes its kernel's specs name. Run: ``python tools/row_ops_host_cpu.py``."""

from __future__ import annotations

import argparse
import time


def install(check=False):
    """Stub the row kernels' launches (``rows.api._kernel``/``_rope_kernel``) and let CPU
    tensors pass for CUDA ones."""
    import torch
    from pyptx_kernels import _common
    from pyptx_kernels.rows import api

    from pyptx.errors import ConfigError

    cache: dict = {}

    def outs(key, *likes):
        o = cache.get(key)
        if o is None:
            o = cache[key] = tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                                   for t in likes)
        return o

    def dense(args, shapes):
        if check:
            for a, s in zip(args, shapes):
                assert a.is_contiguous() and tuple(a.shape) == tuple(s), (a.shape, s, a.stride())

    def kernel(module, builder, x, *extra):
        def run(*args):
            dense(args, [a.shape for a in args])
            if builder == "build_add_rms_norm":
                return outs(builder, args[0], args[0])
            if builder == "build_add_rms_norm_bwd":
                return outs(builder, args[0], args[1])
            if builder == "build_swiglu_backward":
                return outs(builder, args[1], args[2])
            return outs(builder, args[0])[0]
        if check:
            assert len(x.shape) == 2, x.shape
        return run

    def rope_kernel(B, Hq, Hk, S, D, dtype, cb, layout, transpose):
        from pyptx_kernels.rows.rope import build_rope

        specs = None
        if check:
            k = build_rope(B, Hq, Hk, S, D, dtype, cos_batch=cb, layout=layout,
                           transpose=transpose)
            specs = [tuple(s.dims) for s in k.in_specs]

        def run(q, kk, c, s):
            if specs is not None:
                dense((q, kk, c, s), specs)
            return outs(("rope", transpose, q.shape), q, kk)
        return run

    api._kernel = kernel
    api._rope_kernel = rope_kernel
    _common.EAGER_DEVICES = ("cuda", "cpu")
    torch.Tensor.is_cuda = property(lambda self: True)   # the CUDA fast paths run on the CPU
    real = _common.check_devices

    def check_devices(who, *xs):   # the real check; its slow path refuses CPU tensors
        try:
            return real(who, *xs)
        except ConfigError:
            if all(x.device.type == "cpu" for x in xs if isinstance(x, torch.Tensor)):
                return None
            raise

    _common.check_devices = check_devices


def cases():
    import pyptx_kernels as pk
    import torch

    bf = torch.bfloat16

    def leaf(*shape):
        return torch.randn(*shape).to(bf).requires_grad_()

    T = 4   # tiny: the host time does not depend on the shapes, the CPU's fills do
    x, r, w = leaf(T, 256), leaf(T, 256), leaf(256)
    g, u = leaf(T, 512), leaf(T, 512)
    B, S = 1, 4
    q, k = leaf(B, S, 4, 64).transpose(1, 2), leaf(B, S, 2, 64).transpose(1, 2)
    ang = torch.randn(1, S, 32)
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().to(bf), ang.sin().to(bf)
    return [("add_rms_norm", lambda x, r, w: pk.add_rms_norm(x, r, w, 1e-6), (x, r, w)),
            ("swiglu", pk.swiglu, (g, u)),
            ("apply_rotary", pk.apply_rotary, (q, k, cos, sin))]



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


def _tuple(y):
    return y if isinstance(y, tuple) else (y,)


def measure(fn, args, n):
    """µs per call of ``fn(*args)``: the three passes, and the harness's ``ones_like``."""
    import torch

    ins = [t for t in args if t.requires_grad]

    def fwd():
        with torch.no_grad():
            return fn(*args)

    def both():
        ys = _tuple(fn(*args))
        return torch.autograd.grad(ys, ins, [torch.ones_like(y) for y in ys])

    ones = _tuple(fwd())
    return {"fwd no_grad": timed(fwd, n), "fwd grad": timed(lambda: fn(*args), n),
            "fwd+grad": timed(both, n),
            "(ones_like)": timed(lambda: [torch.ones_like(y) for y in ones], n)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=2000)
    p.add_argument("--check", action="store_true", help="assert dense, spec-shaped launches")
    a = p.parse_args(argv)

    install(check=a.check)
    for name, fn, args in cases():
        res = measure(fn, args, a.n)
        print(f"{name:13s} " + " | ".join(f"{k} {v:6.1f}" for k, v in res.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
