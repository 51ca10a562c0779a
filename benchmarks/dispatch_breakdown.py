"""Where an eager pyptx launch spends its host time (issue 5's profiling notes).

Times, in µs per call over back-to-back calls on an idle GPU with a tiny kernel
(so the GPU never throttles the host): each piece of the fast path alone, the
whole ``k(x)``, and torch.add for scale. Medians of 9 repeats.

    python benchmarks/dispatch_breakdown.py
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from pyptx import Tile, kernel, ptx, reg
from pyptx.types import f32, u32

N_CALLS = 2000


def build_copy(n: int):
    @kernel(in_specs=(Tile(n, f32),), out_specs=(Tile(n, f32),), grid=(n // 256, 1, 1),
            block=(256, 1, 1))
    def copy(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        i = (reg.from_(ptx.special.ctaid.x(), u32) * 256 + reg.from_(ptx.special.tid.x(), u32)) * 4
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(px + i))
        ptx.inst.st.global_.f32(ptx.addr(py + i), v)
        ptx.ret()

    return copy


def per_call(fn, sync=True) -> float:
    out = []
    for _ in range(9):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(N_CALLS):
            fn()
        if sync:
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / N_CALLS * 1e6)
    return statistics.median(out)


def main() -> None:
    import pyptx_torch.eager as eager
    from pyptx_shim import native

    x = torch.randn(32 * 1024, device="cuda")
    k = build_copy(x.numel())
    y = k(x)
    assert torch.equal(y, x)
    state = k.launcher("torch").state  # the kernel's torch plans and fast launchers
    ((plan, _),) = state.plans.values()
    stream = eager._raw_stream(0)
    xp, yp = x.data_ptr(), y.data_ptr()
    fast = state.fast[0]
    from pyptx_torch.fastpath import fastpath_status

    print(f"C++ fast path: {fastpath_status()}; fast launcher is {type(fast).__name__}")
    saved, eager.FASTPATH = eager.FASTPATH, None
    closure = eager._fast_launcher(plan, ((x.shape, x.dtype, x.device),))
    eager.FASTPATH = saved
    rows = [
        ("torch.add(x, x)  [scale]", lambda: torch.add(x, x)),
        ("torch.empty(out shape)", lambda: torch.empty((32 * 1024,), dtype=torch.float32,
                                                       device=plan.device)),
        ("native.launch(handle, stream, px, py)", lambda: native.launch(plan.handle, stream, xp, yp)),
        ("raw stream + current device", lambda: (eager._raw_stream(0), eager._current_device())),
        ("torch.compiler.is_compiling()", torch.compiler.is_compiling),
        ("x.zero_()  [one torch launch, no allocation]", lambda: x.zero_()),
        ("torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("fast launcher((x,))", lambda: fast((x,))),
        ("Python closure fast launcher((x,))", lambda: closure((x,))),
        ("k(x)  [whole eager call]", lambda: k(x)),
    ]
    import pyptx_torch.compiled  # noqa: F401 - defines pyptx::launch

    op = torch.ops.pyptx.launch.default
    op_raw = torch._C._get_operation_overload("pyptx::launch", "")  # no OpOverload.__call__
    uid = k.uid
    assert torch.equal(op([x], uid, "")[0], x)
    call_op = lambda: op([x], uid, "")  # noqa: E731
    op1 = torch.ops.pyptx.launch1.default  # what a single-output kernel is recorded as
    assert torch.equal(op1(x, uid), x)
    rows += [
        ("torch.ops.pyptx.launch1.default(x, uid)  [fixed arity]", lambda: op1(x, uid)),
        ("torch.ops.pyptx.launch.default([x], uid, '')", call_op),
        ("  the same under torch.inference_mode()", call_op, torch.inference_mode),
        ("  the same under torch.no_grad()", call_op, torch.no_grad),
        ("torch.ops.aten.add.Tensor(x, x)  [torch's op, same path]",
         lambda: torch.ops.aten.add.Tensor(x, x)),
    ]
    if isinstance(op_raw, tuple):  # (callable, tags) on recent torch
        op_raw = op_raw[0]
    if callable(op_raw):
        rows.append(("  the raw overload (no OpOverload.__call__)", lambda: op_raw([x], uid, "")))
    kc = torch.compile(k)
    ka = torch.compile(lambda a: torch.add(a, a))
    assert torch.equal(kc(x), x) and torch.equal(ka(x), x + x)
    rows += [("torch.compile(k)(x)", lambda: kc(x)), ("torch.compile(torch.add)(x)", lambda: ka(x))]
    from pyptx_torch.fastpath import FASTPATH

    fallbacks = FASTPATH.fallback_calls() if FASTPATH is not None else None
    print(f"{'piece':45s} {'µs/call':>8s}")
    for name, fn, *mode in rows:  # mode: a context the whole timing runs under
        try:
            with (mode[0] if mode else contextlib.nullcontext)():
                t = per_call(fn)
        except Exception as e:  # noqa: BLE001 - a probe row that this torch refuses
            print(f"{name:45s} {type(e).__name__}: {e}", flush=True)
            continue
        print(f"{name:45s} {t:8.2f}", flush=True)
    if fallbacks is not None:
        print(f"pyptx::launch calls that fell back to Python while timing: "
              f"{FASTPATH.fallback_calls() - fallbacks}")
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(N_CALLS):
        kc(x)
    prof.disable()
    torch.cuda.synchronize()
    print("\ncProfile of torch.compile(k)(x), top 25 by cumulative time:")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
