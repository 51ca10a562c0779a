"""Cold start: time from ``import pyptx`` to the first correct result of a new kernel (needs a GPU).

Each measurement runs in a fresh process (this script with ``--child``), which
imports torch (timed on its own), makes its CUDA inputs, then times ``import
pyptx``, importing ``pyptx_kernels.rows.rms_norm`` and building the RMSNorm at a
size (B, N) no other run of this invocation uses, the first ``k(x, w)`` and the
synchronize after it. The result is then compared with a float64 torch
reference (the output's memory was left full of NaN first); a wrong result fails
the run. Measured:

  (a) empty disk cache: ``PYPTX_CACHE_DIR`` (and the driver's ``CUDA_CACHE_PATH``)
      set to a fresh temp dir, so the PTX is compiled (ptxas, or the driver where there is none);
  (b) warm disk cache: a new process, same dirs and size as an (a) run, so the
      cubin comes from the disk cache (the child reports whether the JIT ran);
  (c) the second call in the same process (call 2 alone, same shapes, new inputs,
      synchronize included), from the (b) runs.

Each is the median of ``--runs`` (3) runs; one throwaway run first warms the
OS file cache. "From import pyptx" excludes the torch import, CUDA context
creation and input allocation (a torch user has paid those); the "incl. import
torch" rows add them. The children print a per-phase breakdown (self time of
each phase, so the phases add up): import torch, CUDA init + inputs, import
pyptx, plugin load, example load + ``@kernel``, trace, emit, CUDA driver init
(libcuda through ctypes), JIT, disk cache, cubin load, shim register, launch, the rest of
the first call, sync. The interpreter's own start-up is outside all of them.

Targets, on "first result from import pyptx": warm cache <= 1 s, empty cache <= 3 s.

    python benchmarks/cold_start.py [--runs 3] [--out FILE.md] [--keep]

Exit status: 0 when the table was printed (target misses included); 1 when a
child failed or produced a wrong result; 2 when nothing could be measured (no
CUDA GPU, torch or pyptx missing).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyptx_kernels._modules import kernel_module

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_timing.py
from _timing import markdown_table, median_min_max  # noqa: E402

EPS = 1e-6
TAG = "COLD_START_JSON "
EXIT_NO_GPU = 2
WARM_TARGET_S, EMPTY_TARGET_S = 1.0, 3.0

# Phases of the child, in order: (key, label). Self times, so they add up.
PHASES = [
    ("import_torch", "import torch"),
    ("cuda_init", "torch CUDA init + inputs"),
    ("import_pyptx", "import pyptx"),
    ("submodules", "import pyptx submodules (jit, driver, launch, ...)"),
    ("plugin", "torch plugin load (entry point + pyptx_torch.eager)"),
    ("build", "load example + @kernel"),
    ("trace", "trace (Kernel._trace)"),
    ("emit", "emit (Specialization.emit)"),
    ("driver_init", "CUDA driver init (libcuda open + cuInit)"),
    ("jit", "PTX -> cubin (ptxas)"),
    ("disk", "disk cache read/write"),
    ("cubin_load", "module load + entry lookup (driver compile without ptxas)"),
    ("shim", "shim load + register"),
    ("launch", "launch (run_plan: allocate output + shim launch)"),
    ("call_rest", "rest of first call (checks, specialize, plan, device queries)"),
    ("sync", "synchronize after the first call"),
]
GROUPS = [
    ("trace+emit", ("trace", "emit")),
    ("JIT/cubin-load", ("driver_init", "jit", "disk", "cubin_load")),
    ("launch (shim + call + sync)", ("shim", "launch", "call_rest", "sync")),
]


# ---------------------------------------------------------------------------- child
class SelfTimer:
    """Accumulates the self time (own time minus timed callees) of labelled phases."""

    def __init__(self) -> None:
        self.t: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[float] = []
        self._undo: list[tuple[Any, str, Any]] = []

    def _enter(self) -> float:
        self._stack.append(0.0)
        return time.perf_counter()

    def _exit(self, label: str, t0: float) -> None:
        el = time.perf_counter() - t0
        child = self._stack.pop()
        self.t[label] = self.t.get(label, 0.0) + el - child
        self.calls[label] = self.calls.get(label, 0) + 1
        if self._stack:
            self._stack[-1] += el

    def region(self, label: str):
        timer = self

        class _Region:
            def __enter__(self):
                self.t0 = timer._enter()

            def __exit__(self, *exc):
                timer._exit(label, self.t0)

        return _Region()

    def patch(self, owner: Any, attr: str, label: str) -> bool:
        """Wrap ``owner.attr`` (a module function or a class's method); False if absent."""
        orig = getattr(owner, attr, None)
        if orig is None or not callable(orig):
            return False

        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = self._enter()
            try:
                return orig(*a, **kw)
            finally:
                self._exit(label, t0)

        setattr(owner, attr, wrapper)
        self._undo.append((owner, attr, orig))
        return True

    def unpatch(self) -> None:
        for owner, attr, orig in reversed(self._undo):
            setattr(owner, attr, orig)
        self._undo.clear()


def child(B: int, N: int) -> int:
    """One cold start; prints a ``COLD_START_JSON`` line."""
    prof = SelfTimer()
    missing: list[str] = []
    t_start = time.perf_counter()
    with prof.region("import_torch"):
        import torch
    if not torch.cuda.is_available():
        print("cold_start.py --child: no CUDA GPU is available")
        return EXIT_NO_GPU
    with prof.region("cuda_init"):
        torch.manual_seed(time.time_ns() % (1 << 31))
        x = torch.randn(B, N, device="cuda") * 0.3
        w = torch.randn(N, device="cuda") * 0.1 + 1.0
        x2 = torch.randn(B, N, device="cuda") * 0.3
        w2 = torch.randn(N, device="cuda") * 0.1 + 1.0
        poison = torch.full((B, N), float("nan"), device="cuda")
        del poison  # the first output most likely reuses this NaN-filled block
        torch.cuda.synchronize()

    t_pyptx = time.perf_counter()
    with prof.region("import_pyptx"):
        import pyptx
    with prof.region("submodules"):  # what the first call would import anyway
        m: dict[str, Any] = {}
        for name in ("cache", "driver", "jit", "ptxas", "launch", "runtimes", "kernel"):
            try:
                m[name] = importlib.import_module(f"pyptx.{name}")
            except Exception as e:  # noqa: BLE001 - instrumentation only; the run goes on
                missing.append(f"pyptx.{name} ({type(e).__name__})")
    with prof.region("plugin"):
        if "runtimes" in m:
            m["runtimes"].load("torch")
        import pyptx_torch.eager as eager
    eager.set_poison(False)
    # Instrument the first call's phases (removed again before call 2). Each entry is
    # (module, owner attribute or None, function, label).
    wanted = [("kernel", "Kernel", "_trace", "trace"), ("kernel", "Specialization", "emit", "emit"),
              ("driver", None, "cuda", "driver_init"), ("ptxas", None, "assemble", "jit"),
              ("cache", None, "load", "disk"), ("cache", None, "store", "disk"),
              ("jit", None, "load_image", "cubin_load"),
              ("launch", None, "shim", "shim"), ("launch", None, "register_launch_config", "shim"),
              ("launch", None, "add_scalar_param_to_shim", "shim")]
    for mname, cls, attr, label in wanted:
        owner = m.get(mname)
        if owner is not None and cls is not None:
            owner = getattr(owner, cls, None)
        if owner is None or not prof.patch(owner, attr, label):
            missing.append(f"pyptx.{mname}.{cls + '.' if cls else ''}{attr}")
    for attr, label in (("shim", "shim"), ("run_plan", "launch")):
        if not prof.patch(eager, attr, label):
            missing.append(f"pyptx_torch.eager.{attr}")

    with prof.region("build"):
        mod = kernel_module("rms_norm")
        k = mod.build_rms_norm_fast(B, N, eps=EPS, config=mod.RowConfig())
    with prof.region("call_rest"):
        y = k(x, w)
    with prof.region("sync"):
        torch.cuda.synchronize()
    t_first = time.perf_counter()
    prof.unpatch()
    jit_calls = prof.calls.get("jit", 0)

    def rel_err(out: Any, xx: Any, ww: Any) -> float:
        x64, w64 = xx.double(), ww.double()
        ref = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + EPS) * w64
        out = out.double()
        if torch.isnan(out).any():
            return float("nan")
        return ((out - ref).norm() / ref.norm()).item()

    err1 = rel_err(y, x, w)
    poison = torch.full((B, N), float("nan"), device="cuda")
    del poison, y
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    y2 = k(x2, w2)
    torch.cuda.synchronize()
    second = time.perf_counter() - t0
    err2 = rel_err(y2, x2, w2)
    try:
        cache_dir = m["cache"].cache_dir()
        cubins = len(list(cache_dir.glob("*.cubin"))) if cache_dir and cache_dir.is_dir() else 0
    except Exception:  # noqa: BLE001
        cache_dir, cubins = None, -1
    out = {
        "B": B, "N": N, "pyptx": getattr(pyptx, "__version__", "?"),
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "phases": {key: prof.t.get(key, 0.0) for key, _ in PHASES},
        "from_pyptx": t_first - t_pyptx, "from_torch": t_first - t_start,
        "second_call": second, "err1": err1, "err2": err2, "jit_calls": jit_calls,
        "cache_dir": str(cache_dir), "cubins_in_cache": cubins, "not_instrumented": missing,
    }
    print(TAG + json.dumps(out), flush=True)
    ok = err1 < 1e-5 and err2 < 1e-5  # NaN compares False
    if not ok:
        print(f"WRONG RESULT: relative errors {err1} (call 1), {err2} (call 2)", flush=True)
    return 0 if ok else 1


# ---------------------------------------------------------------------------- parent
def _run_child(B: int, N: int, cache_dir: Path, timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYPTX_CACHE_DIR"] = str(cache_dir)
    env["CUDA_CACHE_PATH"] = str(cache_dir / "nv-compute-cache")
    env.pop("PYPTX_POISON_OUTPUTS", None)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--B", str(B), "--N", str(N)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                           cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return {"error": f"child timed out after {timeout:.0f} s (B={B}, N={N})"}
    wall = time.perf_counter() - t0
    data = None
    for line in p.stdout.splitlines():
        if line.startswith(TAG):
            try:
                data = json.loads(line[len(TAG):])
            except ValueError:
                pass
    if data is None or p.returncode != 0:
        tail = (p.stdout + p.stderr).strip().splitlines()[-15:]
        why = f"child exited {p.returncode} (B={B}, N={N})"
        if data is not None:
            data["error"] = why
            data["log"] = tail
            return data
        return {"error": why, "log": tail}
    data["wall"] = wall
    return data


def _sizes(count: int) -> list[tuple[int, int]]:
    """Distinct (B, N): N (which the PTX contains) differs for every run."""
    rng = random.Random(time.time_ns())
    ks = rng.sample([k for k in range(9, 72) if k != 32], count)  # N = 1024 is dispatch.py's
    return [(rng.randrange(17, 200), 32 * k) for k in ks]




def _fmt_s(v: float) -> str:
    return f"{v:.3f} s"




def parent(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError as e:
        print(f"cold_start.py: torch is not installed ({e}); it needs torch with CUDA and a GPU.")
        return EXIT_NO_GPU
    if not torch.cuda.is_available():
        print("cold_start.py: no CUDA GPU is available (torch.cuda.is_available() is False); "
              "this benchmark launches kernels and needs one. Nothing was measured.")
        return EXIT_NO_GPU
    if importlib.util.find_spec("pyptx") is None or importlib.util.find_spec("pyptx_torch") is None:
        print("cold_start.py: pyptx with its torch plugin is not installed; pip install -e "
              "packages/pyptx-core -e packages/pyptx-shim -e packages/pyptx-torch")
        return EXIT_NO_GPU
    del torch

    base = Path(tempfile.mkdtemp(prefix="pyptx-cold-start-"))
    sizes = _sizes(args.runs + 1)
    empty: list[dict] = []
    warm: list[dict] = []
    failures: list[str] = []
    t_all = time.perf_counter()

    def show(kind: str, d: dict) -> None:
        if "error" in d:
            failures.append(f"{kind}: {d['error']}")
            print(f"  {kind}: ERROR {d['error']}", flush=True)
            for line in d.get("log", []):
                print(f"      {line}")
            return
        p = d["phases"]
        tr = p["trace"] + p["emit"]
        jc = p["driver_init"] + p["jit"] + p["disk"] + p["cubin_load"]
        print(f"  {kind}: B={d['B']} N={d['N']}  from import pyptx {d['from_pyptx']:.3f} s, "
              f"incl. import torch {d['from_torch']:.3f} s (torch import "
              f"{p['import_torch']:.3f}, CUDA init {p['cuda_init']:.3f}); trace+emit "
              f"{tr * 1e3:.1f} ms, JIT/cubin {jc * 1e3:.1f} ms (JIT calls {d['jit_calls']}), "
              f"call 2 {d['second_call'] * 1e6:.0f} µs; process {d.get('wall', 0):.2f} s; "
              f"rel err {d['err1']:.1e}", flush=True)

    try:
        for i, (B, N) in enumerate(sizes):
            d = base / f"run{i}"
            d.mkdir()
            res = _run_child(B, N, d, args.timeout)
            if i == 0:
                show("throwaway (warms the OS file cache)", res)
                continue
            show(f"(a) empty cache, run {i}", res)
            if "error" not in res and not res["jit_calls"] and not res["not_instrumented"]:
                print(f"  WARNING: (a) run {i} never compiled the PTX: its cubin came "
                      "from somewhere other than an empty cache")
            empty.append(res)
            res = _run_child(B, N, d, args.timeout)
            show(f"(b) warm cache,  run {i}", res)
            if "error" not in res and res["jit_calls"]:
                failures.append(f"(b) run {i}: the warm-cache child ran the JIT "
                                f"({res['jit_calls']} calls): the disk cache missed")
                print(f"  WARNING: {failures[-1]}")
            warm.append(res)
    finally:
        if args.keep:
            print(f"kept the cache dirs under {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)

    ok_e = [d for d in empty if "error" not in d]
    ok_w = [d for d in warm if "error" not in d]
    first = (ok_e + ok_w)[:1]
    env_line = (f"GPU {first[0]['gpu']}, torch {first[0]['torch']}, pyptx {first[0]['pyptx']}, "
                f"Python {sys.version.split()[0]}" if first else "")

    def row(label: str, runs: list[dict], key: str, target: float | None, unit: str) -> list[str]:
        st = median_min_max([d[key] for d in runs])
        if st is None:
            return [label, "-", "-", "-", f"<= {target:g} s" if target else "-", "ERROR"]
        f = (lambda v: f"{v * 1e6:.0f} µs") if unit == "us" else _fmt_s
        verdict = "-" if target is None else ("PASS" if st[0] <= target else "FAIL")
        if len(runs) < args.runs:
            verdict += f" ({len(runs)}/{args.runs} runs)"
        return [label, f(st[0]), f(st[1]), f(st[2]), f"<= {target:g} s" if target else "-",
                verdict]

    summary = markdown_table(["measure", "median", "min", "max", "target", "pass/fail"], [
        row("(a) empty cache: first result from import pyptx", ok_e, "from_pyptx",
            EMPTY_TARGET_S, "s"),
        row("(a) empty cache: same, incl. import torch + CUDA init", ok_e, "from_torch",
            None, "s"),
        row("(b) warm cache: first result from import pyptx", ok_w, "from_pyptx",
            WARM_TARGET_S, "s"),
        row("(b) warm cache: same, incl. import torch + CUDA init", ok_w, "from_torch",
            None, "s"),
        row("(c) second call, same process (call + sync)", ok_w, "second_call", None, "us"),
    ])

    def med_ms(runs: list[dict], keys: tuple[str, ...]) -> str:
        vals = [sum(d["phases"][k] for k in keys) for d in runs]
        return f"{statistics.median(vals) * 1e3:.1f}" if vals else "-"

    body = [[label, med_ms(ok_e, (key,)), med_ms(ok_w, (key,))] for key, label in PHASES]
    body += [[f"**{g}**", med_ms(ok_e, keys), med_ms(ok_w, keys)] for g, keys in GROUPS]
    body.append(["**first result from import pyptx**",
                 med_ms(ok_e, tuple(k for k, _ in PHASES[2:])),
                 med_ms(ok_w, tuple(k for k, _ in PHASES[2:]))])
    body.append(["**first result incl. import torch + CUDA init**",
                 med_ms(ok_e, tuple(k for k, _ in PHASES)),
                 med_ms(ok_w, tuple(k for k, _ in PHASES))])
    breakdown = markdown_table(["phase (self time, median ms)", "(a) empty cache", "(b) warm cache"], body)
    missing = sorted({m for d in ok_e + ok_w for m in d.get("not_instrumented", [])})
    notes = [f"median of {len(ok_e)} (a) and {len(ok_w)} (b) runs, each a fresh process; "
             f"(c) from the (b) runs. Phase medians are taken per phase, so they need not sum "
             f"to the total's median."]
    if missing:
        notes.append("not instrumented (pyptx internals moved; their time is in 'rest of "
                     "first call'): " + ", ".join(missing))

    print()
    if env_line:
        print(env_line)
    print("\n".join(summary))
    print()
    print("\n".join(breakdown))
    for n in notes:
        print(n)
    print(f"(whole run {time.perf_counter() - t_all:.0f} s)")
    if args.out is not None:
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text("# pyptx cold start, RMSNorm (new size per run)\n\n"
                                + (env_line + "\n\n" if env_line else "")
                                + "\n".join(summary) + "\n\n" + "\n".join(breakdown) + "\n\n"
                                + "\n".join(notes) + "\n", encoding="utf-8")
            print(f"wrote {args.out}")
        except OSError as e:
            print(f"could not write {args.out}: {e}")
    for f in failures:
        print(f"FAILED {f}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False,
                                 epilog="Exit status: 0 printed, 1 a run failed or was wrong, "
                                        "2 no CUDA GPU / missing torch or pyptx.")
    ap.add_argument("--runs", type=int, default=3, help="runs of (a) and of (b) (3)")
    ap.add_argument("--out", type=Path, help="also write the tables as markdown to this file")
    ap.add_argument("--keep", action="store_true", help="keep the temp cache dirs")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per child (120)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--B", type=int, default=48, help=argparse.SUPPRESS)
    ap.add_argument("--N", type=int, default=1248, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        sys.stdout.reconfigure(errors="backslashreplace")
    except (AttributeError, ValueError):
        pass
    if args.child:
        if args.B < 1 or args.N < 32 or args.N % 32:
            ap.error("--N must be a positive multiple of 32 and --B positive")
        return child(args.B, args.N)
    if not 1 <= args.runs <= 20:
        ap.error("--runs must be in 1..20")
    return parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
