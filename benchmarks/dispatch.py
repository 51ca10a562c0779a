"""Host-side dispatch cost per call: pyptx's RMSNorm beside torch, Triton and JAX (needs a GPU).

Every row is a 32x1024 float32 call (RMSNorm from ``pyptx_kernels.rows.rms_norm``:
``build_rms_norm_fast(32, 1024)`` with its first plan; elementwise adds of the same size
for the baselines).
Each path is checked once against a float64 reference on fresh random inputs
(outputs poisoned with NaN first), warmed up, then timed: ``--calls`` back-to-back
calls between two ``time.perf_counter`` reads, with one synchronize (torch) or
``jax.block_until_ready`` (JAX) inside the timed region at the end, so it is
amortized over the calls. Rows of a section are timed round-robin (one repeat of
each, then the next repeat), with the garbage collector off inside the loop; the
table gives the median and the best of ``--repeats`` repeats, in host microseconds
per call, and each row's ratio to eager ``torch.add`` (JAX rows: to
``jax.jit(jnp.add)``).

When a path's kernel runs longer than its dispatch, back-to-back calls fill the
launch queue and the loop runs at the GPU's pace, so µs/call measures the kernel,
not the host. Two extra columns show this: "enqueue-only" (median µs/call of a
200-call burst from an idle GPU, without the final sync: pure dispatch cost) and
a "GPU-bound" note where the final sync took over 10% of the timed loop.

Targets: eager ``k(x, w)`` <= 1.0x torch.add; ``torch.compile`` paths <= 1.3x
torch.add (issue 5); CUDA graph replay of a captured ``k(x, w)`` <= torch's one-op graph
(a captured torch.add) replayed; each extra ``k`` call in a compiled fn <= each extra
call of a Triton kernel registered with ``torch.library.triton_op`` in the same kind of
compiled fn; ``jax.jit`` of a function calling ``k`` <= 1.0x ``jax.jit(jnp.add)`` of the
same size. Rows marked ``-`` are context only. After the table, "issue 18 targets" lists
the four targets of issue 18 (eager, graph replay, compiled marginal, jax.jit), one line
each, ending in PASS, FAIL or n/a. ``--targets`` sets up only the rows those need (a
shorter run: no reduce-overhead or one-op compiled rows).

A one-op ``torch.compile`` call is dominated by torch.compile's own per-call wrappers
(guards, the AOT and inductor runtime wrappers), which ``torch.compile(torch.add)`` pays
too: the "N.NNx torch.compile(torch.add)" note compares like with like. The derived
row "each extra k call in a compiled fn" isolates what our op adds on that path: compiled
fns with 1 and with CHAIN chained ``k`` calls, timed in the same rounds, their paired
difference divided by CHAIN - 1.

    python benchmarks/dispatch.py [--calls 2000] [--repeats 11] [--out FILE.md]
                                  [--no-compile] [--no-jax] [--no-triton] [--targets]
    python benchmarks/dispatch.py --profile      # cProfile of 2000 eager k(x, w), top 15 by tottime

Exit status: 0 when the table (or profile) was printed, even with target misses;
1 when a path failed its correctness check or raised (its row says ERROR);
2 when nothing could be measured: no CUDA GPU, or torch / pyptx not installed.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyptx_kernels._modules import kernel_module
from pyptx_kernels.rows import RowConfig

try:  # a Triton row for context; the rest of the script does not need Triton
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - a broken install is reported in the row, not fatal
    triton = tl = None

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_timing.py
from _timing import enqueue_us_per_call, host_us_per_call, markdown_table  # noqa: E402

B, N, EPS = 32, 1024, 1e-6
DEVICE = "cuda"
ENQUEUE_BURST = 200  # calls per no-sync burst (well under CUDA's ~1000-launch queue)
SLOW_REPEAT_S = 0.25  # a row slower than this per repeat gets fewer calls (noted in the table)
GPU_BOUND_WAIT = 0.10  # a final sync longer than this share of the loop: the GPU set the pace
EXIT_NO_GPU = 2
CHAIN = 11  # k calls in the compiled fn whose per-call cost gives the marginal row

if triton is not None:

    @triton.jit
    def _triton_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        a = tl.load(x_ptr + offs, mask=mask)
        b = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, a + b, mask=mask)

    @triton.jit
    def _triton_rms_kernel(x_ptr, w_ptr, out_ptr, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + row * n + offs, mask=mask, other=0.0)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        r = tl.rsqrt(tl.sum(x * x, 0) / n + eps)
        tl.store(out_ptr + row * n + offs, x * r * w, mask=mask)


_TRITON_OP: list[Any] = []


def _triton_rms_op() -> Any:
    """RMSNorm as a Triton kernel registered with ``torch.library.triton_op`` (once): the
    framework's own way to put a hand-written kernel into compiled graphs."""
    if _TRITON_OP:
        return _TRITON_OP[0]
    if triton is None:
        raise RuntimeError("triton is not importable")
    import torch
    from torch.library import triton_op, wrap_triton

    def rms(x, w):
        out = torch.empty_like(x)
        n = x.shape[1]
        wrap_triton(_triton_rms_kernel)[(x.shape[0],)](x, w, out, n, 1e-6,
                                                       BLOCK=triton.next_power_of_2(n))
        return out

    # real types, not the strings this module's __future__ import makes: infer_schema reads them
    rms.__annotations__ = {"x": torch.Tensor, "w": torch.Tensor, "return": torch.Tensor}
    rms = triton_op("pyptx_bench::rms_norm", mutates_args=())(rms)
    _TRITON_OP.append(rms)
    return rms


# ---------------------------------------------------------------------------- helpers
@dataclass
class Row:
    """One timed path: ``fn()`` does one call; ``finish(last_result)`` waits for the device."""

    name: str
    target: str = "-"
    fn: Callable[[], Any] | None = None
    finish: Callable[[Any], Any] | None = None
    error: str | None = None
    skipped: bool = False
    calls: int = 0  # calls per timed repeat (fewer than --calls for a slow context row)
    samples: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)  # final-sync share of each timed loop
    enqueue: list[float] = field(default_factory=list)  # µs/call of short bursts, no sync
    peer: Any = None  # a same-mode framework row: the note gives the ratio to it

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def best(self) -> float | None:
        return min(self.samples) if self.samples else None


def _builder():
    """``(B, N, eps) -> Kernel``: the first tuning config, named: the bare kernel (a default
    call adds the tuner's wrapper)."""
    mod = kernel_module("rms_norm")
    return lambda B, N, eps: mod.build_rms_norm_fast(B, N, eps=eps, config=RowConfig())


def _err(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".strip().replace("\n", " ")
    return msg if len(msg) <= 300 else msg[:297] + "..."


def _setup(rows: list[Row], name: str, target: str, make: Callable[[], tuple]) -> Row:
    """Append a row built by ``make() -> (fn, finish)``; a failure becomes the row's error."""
    row = Row(name, target)
    rows.append(row)
    t0 = time.perf_counter()
    try:
        row.fn, row.finish = make()
    except Exception as e:  # noqa: BLE001 - one broken path must not stop the others
        row.error = _err(e)
        print(f"  [setup] {name}: ERROR {row.error}", flush=True)
        if os.environ.get("PYPTX_BENCH_TRACEBACK"):
            traceback.print_exc()
        return row
    print(f"  [setup] {name}: checked ({time.perf_counter() - t0:.1f} s)", flush=True)
    return row


def _run_section(rows: list[Row], calls: int, repeats: int) -> None:
    """Warm up every live row, then time them round-robin, ``repeats`` times."""
    live = [r for r in rows if r.error is None]
    for r in live:
        try:
            per_call, _ = host_us_per_call(r.fn, r.finish, max(200, calls // 10))
            # keep a slow row (say an un-jitted path at ~1 ms/call) inside the time budget
            r.calls = max(100, min(calls, int(SLOW_REPEAT_S * 1e6 / max(per_call, 1e-3))))
        except Exception as e:  # noqa: BLE001
            r.error = _err(e)
    for _ in range(repeats):
        for r in live:
            if r.error is not None:
                continue
            try:
                per_call, wait = host_us_per_call(r.fn, r.finish, r.calls)
                r.samples.append(per_call)
                r.waits.append(wait)
                r.enqueue.append(enqueue_us_per_call(r.fn, r.finish, min(r.calls, ENQUEUE_BURST)))
            except Exception as e:  # noqa: BLE001
                r.error = _err(e)
                r.samples.clear()


def _marginal(one: Row, many: Row, extra: int, name: str, target: str) -> Row:
    """A derived row: the cost of one more op inside a compiled fn, from two rows timed in
    the same rounds (sample i of each comes from round i): ``(many - one) / extra``."""
    row = Row(name, target)
    if one.error or many.error:
        row.error = one.error or many.error
        return row
    row.samples = [(b - a) / extra for a, b in zip(one.samples, many.samples)]
    row.calls = many.calls
    return row


def _verdict(row: Row, bound: float | None) -> str:
    if row.error is not None:
        return "SKIP" if row.skipped else "ERROR"
    if row.target in ("-", "baseline"):
        return "-"
    if bound is None or row.median is None:
        return "n/a"
    return "PASS" if row.median <= bound else "FAIL"


@dataclass
class Target:
    """One of issue 18's targets: ``ours`` must not take more than ``factor`` x ``peer``."""

    name: str
    ours: Row | None
    peer: Row | None
    factor: float
    missing: str | None = None  # why it was not measured, if it was not

    def line(self) -> str:
        """``<name>: <ours> vs <peer> µs (<ratio>) PASS|FAIL|n/a``."""
        if self.missing is not None:
            return f"{self.name}: n/a ({self.missing})"
        ours, peer = self.ours.median, self.peer.median
        if ours is None or peer is None:
            why = self.ours.error or self.peer.error or "no samples"
            return f"{self.name}: n/a ({why})"
        verdict = "PASS" if ours <= self.factor * peer else "FAIL"
        return (f"{self.name}: {ours:.2f} vs {peer:.2f} µs ({ours / peer:.2f}x; "
                f"{self.ours.name} vs {self.peer.name}) {verdict}")


def _table(sections: list[tuple[str, list[Row], Row | None, dict[str, float | None]]],
           calls: int) -> list[str]:
    """Markdown table lines. ``bounds`` maps a row name to the µs its median must not exceed."""
    head = ["path", "µs/call (median)", "min", "ratio", "target", "pass/fail",
            "enqueue-only µs", "note"]
    body = []
    for _title, rows, base, bounds in sections:
        bmed = base.median if base is not None else None
        for r in rows:
            med, best = r.median, r.best
            ratio = f"{med / bmed:.2f}x" if med is not None and bmed else "n/a"
            v = _verdict(r, bounds.get(r.name))
            enq = f"{statistics.median(r.enqueue):.2f}" if r.enqueue else "-"
            notes = []
            if r.waits and statistics.median(r.waits) > GPU_BOUND_WAIT:
                notes.append(f"GPU-bound: final sync took {statistics.median(r.waits):.0%} of "
                             "the loop, so µs/call is the kernel's pace, not dispatch")
            if r.peer is not None and med is not None and r.peer.median:
                notes.append(f"{med / r.peer.median:.2f}x {r.peer.name}")
            if r.samples and r.calls and r.calls < calls:
                notes.append(f"slow: {r.calls} calls per repeat")
            note = "; ".join(notes)
            body.append([r.name, f"{med:.2f}" if med is not None else "-",
                         f"{best:.2f}" if best is not None else "-",
                         ratio if r.error is None else "-", r.target, v, enq, note])
    return markdown_table(head, body)


# ---------------------------------------------------------------------------- torch section
def _torch_rows(torch: Any, k: Any, eager: Any, args: argparse.Namespace) -> tuple[list[Row], dict]:
    import torch.nn.functional as F

    dev = DEVICE
    sync = torch.cuda.synchronize

    def finish(_r: Any) -> None:
        sync()

    def fresh():
        return torch.randn(B, N, device=dev) * 0.3, torch.randn(N, device=dev) * 0.1 + 1.0

    def rel_err(out: Any, ref: Any) -> float:
        out = out.double()
        if torch.isnan(out).any():
            raise AssertionError("NaN in the output: an element was not written")
        return ((out - ref).norm() / ref.norm()).item()

    def rms_ref(x: Any, w: Any) -> Any:
        x64, w64 = x.double(), w.double()
        return x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + EPS) * w64

    def check(label: str, err: float, tol: float) -> None:
        if not err < tol:
            raise AssertionError(f"{label}: relative error {err:.3g} >= {tol:g}")

    def check_rms(fn: Callable[[Any, Any], Any], label: str) -> None:
        eager.set_poison(True)
        try:
            for _ in range(2):
                cx, cw = fresh()
                check(label, rel_err(fn(cx, cw), rms_ref(cx, cw)), 1e-5)
        finally:
            eager.set_poison(False)

    def check_add(fn: Callable[[Any, Any], Any], label: str) -> None:
        for _ in range(2):
            a, b = torch.randn(B, N, device=dev), torch.randn(B, N, device=dev)
            check(label, rel_err(fn(a, b), a.double() + b.double()), 1e-6)

    x, w = fresh()
    y = torch.randn(B, N, device=dev)
    rows: list[Row] = []

    def mk_add():
        check_add(torch.add, "torch.add")
        return (lambda: torch.add(x, y)), finish

    def mk_frms():
        f = F.rms_norm
        check_rms(lambda a, b: f(a, (N,), b, EPS), "F.rms_norm")
        return (lambda: f(x, (N,), w, EPS)), finish

    def mk_triton():
        if triton is None:
            raise RuntimeError("triton is not importable")
        kern = _triton_add_kernel
        n = B * N
        grid = (triton.cdiv(n, 1024),)

        def tadd(a: Any, b: Any) -> Any:
            out = torch.empty_like(a)
            kern[grid](a, b, out, n, BLOCK=1024)
            return out

        check_add(tadd, "triton add")
        return (lambda: tadd(x, y)), finish

    def mk_eager():
        check_rms(k, "k(x, w)")
        return (lambda: k(x, w)), finish

    def mk_compiled_add():
        @torch.compile
        def f(a: Any, b: Any) -> Any:
            return torch.add(a, b)

        check_add(f, "torch.compile(torch.add)")
        return (lambda: f(x, y)), finish

    def mk_compiled_k():
        kc = torch.compile(k)
        check_rms(kc, "torch.compile(k)")
        return (lambda: kc(x, w)), finish

    def mk_compiled_fn():
        @torch.compile
        def calls_k(a: Any, b: Any) -> Any:
            return k(a, b)

        check_rms(calls_k, "torch.compile(fn calling k)")
        return (lambda: calls_k(x, w)), finish

    def chain(n: int) -> Callable[[Any, Any], Any]:
        @torch.compile
        def f(a: Any, b: Any) -> Any:
            for _ in range(n):  # each call reads the last one's output: nothing to merge
                a = k(a, b)
            return a

        eager.set_poison(True)
        try:
            cx, cw = fresh()
            want = cx.double()
            for _ in range(n):
                want = rms_ref(want, cw)
            check(f"torch.compile({n} chained k)", rel_err(f(cx, cw), want), 1e-4)
        finally:
            eager.set_poison(False)
        return f

    def mk_chain(n: int):
        def make():
            f = chain(n)
            return (lambda: f(x, w)), finish
        return make

    def triton_chain(n: int) -> Callable[[Any, Any], Any]:
        op = _triton_rms_op()

        @torch.compile
        def f(a: Any, b: Any) -> Any:
            for _ in range(n):
                a = op(a, b)
            return a

        cx, cw = fresh()
        want = cx.double()
        for _ in range(n):
            want = rms_ref(want, cw)
        check(f"torch.compile({n} chained triton_op)", rel_err(f(cx, cw), want), 1e-4)
        return f

    def mk_triton_chain(n: int):
        def make():
            f = triton_chain(n)
            return (lambda: f(x, w)), finish
        return make

    def mk_ro_add():
        f = torch.compile(lambda a, b: torch.add(a, b), mode="reduce-overhead")
        check_add(f, "torch.compile(torch.add, reduce-overhead)")
        return (lambda: f(x, y)), finish

    def mk_ro_k():
        kc = torch.compile(k, mode="reduce-overhead")
        check_rms(kc, "torch.compile(k, reduce-overhead)")
        return (lambda: kc(x, w)), finish

    def capture(fn: Callable[[], Any]) -> tuple[Any, Any]:
        fn()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g, stream=s):
            out = fn()
        sync()
        return g, out

    def mk_graph_add():
        gx, gy = torch.randn(B, N, device=dev), torch.randn(B, N, device=dev)
        g, out = capture(lambda: torch.add(gx, gy))
        for _ in range(2):
            gx.copy_(torch.randn_like(gx))
            gy.copy_(torch.randn_like(gy))
            out.fill_(float("nan"))
            g.replay()
            sync()
            check("graph torch.add", rel_err(out, gx.double() + gy.double()), 1e-6)
        return g.replay, finish

    def mk_graph_k():
        gx, gw = fresh()
        g, out = capture(lambda: k(gx, gw))
        for _ in range(2):
            nx, nw = fresh()
            gx.copy_(nx)
            gw.copy_(nw)
            out.fill_(float("nan"))
            g.replay()
            sync()
            check("graph k(x, w)", rel_err(out, rms_ref(gx, gw)), 1e-5)
        return g.replay, finish

    context = not args.targets  # rows no issue-18 target needs
    add = _setup(rows, "torch.add (eager, allocating)", "baseline", mk_add)
    if context:
        _setup(rows, "F.rms_norm (eager)", "-", mk_frms)
        if not args.no_triton:
            _setup(rows, "triton add (@triton.jit, allocating)", "-", mk_triton)
    eager_row = _setup(rows, "pyptx k(x, w) eager", "<= 1.0x torch.add", mk_eager)
    compiled = []
    if not args.no_compile and context:
        cadd = _setup(rows, "torch.compile(torch.add)", "-", mk_compiled_add)
        compiled.append(_setup(rows, "pyptx torch.compile(k)", "<= 1.3x torch.add",
                               mk_compiled_k))
        compiled.append(_setup(rows, "pyptx torch.compile(fn calling k)", "<= 1.3x torch.add",
                               mk_compiled_fn))
        for r in compiled:
            r.peer = cadd
    if not args.no_compile:
        one = _setup(rows, "  torch.compile(fn: 1 k call) [for the marginal]", "-", mk_chain(1))
        many = _setup(rows, f"  torch.compile(fn: {CHAIN} chained k calls) [per fn call]", "-",
                      mk_chain(CHAIN))
        tri_one = tri_many = None
        if not args.no_triton:
            tri_one = _setup(rows, "  torch.compile(fn: 1 triton_op call) [for its marginal]", "-",
                             mk_triton_chain(1))
            tri_many = _setup(rows, f"  torch.compile(fn: {CHAIN} chained triton_op calls) "
                              "[per fn call]", "-", mk_triton_chain(CHAIN))
    if not args.no_compile and context:
        ro_add = _setup(rows, "torch.compile(torch.add, reduce-overhead)", "-", mk_ro_add)
        compiled.append(_setup(rows, "pyptx torch.compile(k, reduce-overhead)",
                               "<= 1.3x torch.add", mk_ro_k))
        compiled[-1].peer = ro_add
    gadd = _setup(rows, "CUDA graph replay: torch.add", "-", mk_graph_add)
    gk = _setup(rows, "pyptx CUDA graph replay: k(x, w)", "<= torch.add graph", mk_graph_k)
    sync()
    print(f"timing {len(rows)} torch rows ...", flush=True)
    _run_section(rows, args.calls, args.repeats)
    marginal = tri_marginal = None
    if not args.no_compile:
        marginal = _marginal(one, many, CHAIN - 1,
                             f"pyptx torch.compile: each extra k call in a compiled fn "
                             f"(({CHAIN} calls - 1 call) / {CHAIN - 1})", "<= 1.3x torch.add")
        rows.append(marginal)
        compiled.append(marginal)
        if tri_one is not None:
            tri_marginal = _marginal(tri_one, tri_many, CHAIN - 1,
                                     "triton_op (torch.library): each extra call in a compiled fn",
                                     "-")
            rows.append(tri_marginal)
            marginal.target = "<= triton_op marginal"
    a = add.median
    bounds = {eager_row.name: a * 1.0 if a else None, gk.name: gadd.median}
    for r in compiled:
        bounds[r.name] = a * 1.3 if a else None
    if marginal is not None and tri_marginal is not None and tri_marginal.median is not None:
        bounds[marginal.name] = tri_marginal.median
    targets = [
        Target("eager k(x, w) <= 1.0x torch.add", eager_row, add, 1.0),
        Target("CUDA graph replay of k <= a replayed torch.add graph", gk, gadd, 1.0),
        Target("each extra k call in a compiled fn <= each extra triton_op call", marginal,
               tri_marginal, 1.0, None if marginal is not None and tri_marginal is not None
               else "not measured (--no-compile, --no-triton or no Triton)"),
    ]
    return rows, {"base": add, "bounds": bounds, "targets": targets}


# ---------------------------------------------------------------------------- JAX section
def _jax_rows(build: Callable[..., Any], args: argparse.Namespace) -> tuple[list[Row], dict]:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    import numpy as np

    k = build(B, N, EPS)  # built after `import jax`, so it preloads the JAX plugin

    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError as e:
        raise RuntimeError(f"JAX sees no GPU ({e})") from None

    def rms_ref(x: Any, w: Any) -> Any:
        x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
        return x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + EPS) * w64

    def rel_err(out: Any, ref: Any) -> float:
        out = np.asarray(out, np.float64)
        if not np.isfinite(out).all():
            raise AssertionError("non-finite output: an element was not written")
        return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))

    def check(label: str, err: float, tol: float) -> None:
        if not err < tol:
            raise AssertionError(f"{label}: relative error {err:.3g} >= {tol:g}")

    seed = [int(time.time_ns() % (1 << 31))]

    def fresh():
        seed[0] += 1
        kx, kw = jax.random.split(jax.random.key(seed[0]))
        x = jax.random.normal(kx, (B, N), jnp.float32) * 0.3
        w = jax.random.normal(kw, (N,), jnp.float32) * 0.1 + 1.0
        return jax.device_put(x, gpu), jax.device_put(w, gpu)

    def poison() -> None:
        p = jnp.full((B, N), jnp.nan, jnp.float32)
        p.block_until_ready()
        del p

    def check_rms(fn: Callable[[Any, Any], Any], label: str) -> None:
        for _ in range(2):
            cx, cw = fresh()
            poison()
            check(label, rel_err(fn(cx, cw), rms_ref(cx, cw)), 1e-5)

    finish = jax.block_until_ready
    x, w = fresh()
    y, _ = fresh()
    rows: list[Row] = []

    def mk_add():
        f = jax.jit(jnp.add)
        for _ in range(2):
            a, b = fresh()[0], fresh()[0]
            poison()
            check("jax.jit(jnp.add)", rel_err(f(a, b), np.asarray(a, np.float64)
                                             + np.asarray(b, np.float64)), 1e-6)
        return (lambda: f(x, y)), finish

    def mk_jnp_rms():
        f = jax.jit(lambda a, b: a * jax.lax.rsqrt(jnp.mean(a * a, -1, keepdims=True) + EPS) * b)
        check_rms(f, "jax.jit(jnp rmsnorm)")
        return (lambda: f(x, w)), finish

    def mk_jit_k():
        f = jax.jit(lambda a, b: k(a, b))
        check_rms(f, "jax.jit(fn calling k)")
        return (lambda: f(x, w)), finish

    def mk_eager_k():
        check_rms(k, "k(x, w) on jax arrays")
        return (lambda: k(x, w)), finish

    base = _setup(rows, "jax.jit(jnp.add)", "baseline", mk_add)
    jk = _setup(rows, "pyptx jax.jit(fn calling k)", "<= 1.0x jax.jit(jnp.add)", mk_jit_k)
    if not args.targets:
        _setup(rows, "jax.jit(jnp rmsnorm)", "-", mk_jnp_rms)
        _setup(rows, "pyptx k(x, w) on jax arrays, no jit", "-", mk_eager_k)
    print(f"timing {len(rows)} JAX rows ...", flush=True)
    _run_section(rows, args.calls, args.repeats)
    target = Target(f"jax.jit dispatch <= 1.0x a jitted jnp op of the same size ({B}x{N})", jk,
                    base, 1.0)
    return rows, {"base": base, "bounds": {jk.name: base.median if base.median else None},
                  "targets": [target]}


# ---------------------------------------------------------------------------- profile
def _profile(torch: Any, k: Any, eager: Any, calls: int) -> None:
    import cProfile
    import io
    import pstats

    x = torch.randn(B, N, device="cuda") * 0.3
    w = torch.randn(N, device="cuda") * 0.1 + 1.0
    eager.set_poison(True)
    out = k(x, w)
    torch.cuda.synchronize()
    x64, w64 = x.double(), w.double()
    ref = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + EPS) * w64
    err = ((out.double() - ref).norm() / ref.norm()).item()
    if not err < 1e-5:
        raise AssertionError(f"k(x, w): relative error {err} >= 1e-5")
    eager.set_poison(False)
    for _ in range(500):
        k(x, w)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    gc.collect()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(calls):
        k(x, w)
    torch.cuda.synchronize()
    prof.disable()
    dt = (time.perf_counter() - t0) / calls * 1e6
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(15)
    print(f"cProfile of {calls} eager k(x, w) calls at {B}x{N} f32 "
          f"({dt:.2f} µs/call under the profiler; unprofiled numbers come from the table)")
    print(buf.getvalue().rstrip())


def _profile_compiled(torch: Any, k: Any, calls: int) -> None:
    """cProfile of a compiled fn making CHAIN chained ``k`` calls: where an op's µs go on the
    torch.compile path (inductor's wrapper, the op call, our kernel)."""
    import cProfile
    import io
    import pstats

    x = torch.randn(B, N, device="cuda") * 0.3
    w = torch.randn(N, device="cuda") * 0.1 + 1.0

    @torch.compile
    def f(a: Any, b: Any) -> Any:
        for _ in range(CHAIN):
            a = k(a, b)
        return a

    for _ in range(200):
        f(x, w)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    gc.collect()
    prof.enable()
    for _ in range(calls):
        f(x, w)
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    print(f"cProfile of {calls} calls of a compiled fn making {CHAIN} chained k calls")
    print(buf.getvalue().rstrip())


# ---------------------------------------------------------------------------- main
def _versions(torch: Any) -> str:
    parts = [f"GPU {torch.cuda.get_device_name()}", f"Python {platform.python_version()}",
             f"torch {torch.__version__}"]
    if triton is not None:
        parts.append(f"triton {triton.__version__}")
    try:
        import pyptx

        parts.append(f"pyptx {pyptx.__version__}")
        from pyptx_torch.fastpath import fastpath_status

        parts.append(f"C++ fast path {fastpath_status()}")
        from pyptx_torch import direct

        parts.append("inductor calls the launcher directly" if direct.ENABLED
                     else "PYPTX_TORCH_DIRECT=0 (inductor calls the op)")
    except Exception:  # noqa: BLE001
        pass
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False,
                                 epilog="Exit status: 0 printed, 1 a path was wrong or raised, "
                                        "2 no CUDA GPU / missing torch or pyptx.")
    ap.add_argument("--calls", type=int, default=2000, help="calls per timed repeat (2000)")
    ap.add_argument("--repeats", type=int, default=11, help="timed repeats per row (11, >= 7)")
    ap.add_argument("--out", type=Path, help="also write the table as markdown to this file")
    ap.add_argument("--profile", action="store_true",
                    help="instead of the table: cProfile of --calls eager k(x, w), top 15 by tottime")
    ap.add_argument("--profile-compile", action="store_true",
                    help=f"instead of the table: cProfile of a compiled fn making {CHAIN} chained "
                         "k calls, top 25 by tottime")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    ap.add_argument("--no-jax", action="store_true", help="skip the JAX rows")
    ap.add_argument("--no-triton", action="store_true", help="skip the Triton row")
    ap.add_argument("--targets", action="store_true",
                    help="only the rows issue 18's targets need (a shorter run)")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.repeats < 1:
        ap.error("--calls and --repeats must be positive")
    if args.repeats < 7:
        print(f"note: --repeats {args.repeats} is under the 7 the method asks for", flush=True)
    try:
        sys.stdout.reconfigure(errors="backslashreplace")
    except (AttributeError, ValueError):
        pass

    try:
        import torch
    except ImportError as e:
        print(f"dispatch.py: torch is not installed ({e}); it needs torch with CUDA and a GPU.")
        return EXIT_NO_GPU
    if not torch.cuda.is_available():
        print("dispatch.py: no CUDA GPU is available (torch.cuda.is_available() is False); "
              "this benchmark times GPU launches and needs one. Nothing was measured.")
        return EXIT_NO_GPU
    try:
        import pyptx  # noqa: F401
        import pyptx_torch.eager as eager
    except ImportError as e:
        print(f"dispatch.py: pyptx with its torch plugin is not installed ({e}); "
              "pip install -e packages/pyptx-core -e packages/pyptx-shim -e packages/pyptx-torch")
        return EXIT_NO_GPU

    print(_versions(torch), flush=True)
    t_start = time.perf_counter()
    try:
        build = _builder()
        k = build(B, N, EPS)
    except Exception as e:  # noqa: BLE001
        print(f"dispatch.py: could not build the RMSNorm example: {_err(e)}")
        return 1
    eager.set_poison(False)

    if args.profile or args.profile_compile:
        try:
            if args.profile_compile:
                _profile_compiled(torch, k, args.calls)
            else:
                _profile(torch, k, eager, args.calls)
        except Exception as e:  # noqa: BLE001
            print(f"profile failed: {_err(e)}")
            return 1
        return 0

    print(f"setting up and checking paths at {B}x{N} f32 ...", flush=True)
    sections = []
    targets: list[Target] = []
    failed = False
    try:
        rows, info = _torch_rows(torch, k, eager, args)
        sections.append(("torch", rows, info["base"], info["bounds"]))
        targets += info["targets"]
    except Exception as e:  # noqa: BLE001
        print(f"torch section failed: {_err(e)}")
        failed = True
    if not args.no_jax:
        try:
            rows, info = _jax_rows(build, args)
            sections.append(("jax", rows, info["base"], info["bounds"]))
            targets += info["targets"]
        except Exception as e:  # noqa: BLE001
            msg = _err(e)
            skip = isinstance(e, (ImportError, RuntimeError))
            print(f"JAX rows {'skipped' if skip else 'failed'}: {msg}")
            sections.append(("jax", [Row("JAX rows", error=msg, skipped=skip)], None, {}))
            failed = failed or not skip

    lines = _table(sections, args.calls)
    summary = ["issue 18 targets:", *(f"  {t.line()}" for t in targets)]
    footer = (f"{args.calls} back-to-back calls per repeat, median and min of {args.repeats} "
              f"repeats, host µs per call (final sync included, amortized); ratio to eager "
              f"torch.add, JAX rows to jax.jit(jnp.add). enqueue-only: median µs/call of "
              f"{ENQUEUE_BURST}-call bursts from an idle GPU, final sync excluded. A note "
              f"'N.NNx <row>' is the ratio to the framework's own op on the same path.")
    print()
    print(_versions(torch))
    print("\n".join(lines))
    print(footer)
    print("\n".join(summary))
    print(f"(whole run {time.perf_counter() - t_start:.0f} s)")
    failed = failed or any(r.error is not None and not r.skipped
                           for _, rows, _, _ in sections for r in rows)
    if args.out is not None:
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(
                f"# pyptx dispatch overhead, RMSNorm {B}x{N} f32\n\n{_versions(torch)}\n\n"
                + "\n".join(lines) + f"\n\n{footer}\n\n" + "\n".join(summary) + "\n",
                encoding="utf-8")
            print(f"wrote {args.out}")
        except OSError as e:
            print(f"could not write {args.out}: {e}")
    for _, rows, _, _ in sections:
        for r in rows:
            if r.error is not None:
                print(f"{'SKIP' if r.skipped else 'ERROR'} {r.name}: {r.error}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
