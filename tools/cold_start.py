"""Cold-start cost of the library's first call, on this machine (no GPU needed): the CPU
proxy of ``benchmarks/first_call.py``'s (b) and (c) (issue 46: a fresh process with a warm disk
cache reaches its first kernel in <= 50 ms on the H200 host).

For each op (``matmul``, ``attention``, ``rms_norm``, ``grouped_mm``, at first_call.py's first
sizes), a fresh child process (this script with ``--child OP``) imports torch (not timed), makes
CPU inputs (not timed), then times

  import: ``import pyptx_kernels`` and reading the op's function;
  call:   the op's first call up to its launch: the public function on the CPU tensors with
          the library's CUDA check lifted, which runs the real eager path (tuning choice,
          family trace or disk load, specialization, launcher and plan; a plain eager call
          defines no custom op) until pyptx's placement check refuses the CPU tensors; then
          the compiled record of each kernel specialized (PTX text, content hash) and the imports a launch
          adds (``pyptx.jit``, ``pyptx.launch``, ``pyptx.driver``). What is left on a GPU:
          reading the cubin from the disk cache, loading it, the launch (and the background
          warm-up of the problem's other plans, which waits for the call to return).

Each op runs on a fresh ``PYPTX_CACHE_DIR``: once with it empty, then ``--repeat`` times warm
(median). The children write bytecode under a fresh ``PYTHONPYCACHEPREFIX`` (so the warm runs
read ``.pyc`` files, as an installed package does) unless ``--no-pyc``. ``imports`` is the sum
of the self times ``-X importtime`` reports for pyptx's, pyptx_torch's and pyptx_kernels'
modules in one more warm child, and how many of them it imports.

    python tools/cold_start.py [--ops matmul attention rms_norm grouped_mm] [--repeat 3]
                               [--no-pyc]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

OPS = ["matmul", "attention", "rms_norm", "grouped_mm"]
TAG = "COLD_START_JSON "
OWN = ("pyptx", "pyptx_torch", "pyptx_kernels")


def _inputs(op: str):
    """The op's public function's arguments (CPU tensors) at first_call.py's first size."""
    import torch

    bf = torch.bfloat16
    if op == "matmul":
        return (torch.empty(1000, 4096, dtype=bf), torch.empty(4096, 4096, dtype=bf).T), {}
    if op == "attention":
        q = torch.empty(1, 1000, 16, 128, dtype=bf)
        return (q, q.clone(), q.clone()), {"causal": True}
    if op == "rms_norm":
        return (torch.empty(1000, 4096, dtype=bf), torch.empty(4096, dtype=bf)), {}
    if op == "grouped_mm":
        offs = torch.tensor([512 * (g + 1) for g in range(8)], dtype=torch.int32)
        return (torch.empty(4096, 2048, dtype=bf), torch.empty(8, 2048, 2048, dtype=bf),
                offs), {}
    raise ValueError(op)


def child(op: str) -> dict:
    import time

    import torch  # noqa: F401  (not timed: the user's)

    args, kwargs = _inputs(op)
    t0 = time.perf_counter()
    import pyptx_kernels as pk

    fn = getattr(pk, op)
    t1 = time.perf_counter()
    from pyptx_kernels import _common

    from pyptx.kernel import Kernel

    made: list = []
    init = Kernel.__init__

    def record(self, *a, **k):  # every kernel made during the call (their specializations)
        init(self, *a, **k)
        made.append(self)

    Kernel.__init__ = record
    _common.check_devices = lambda *a, **k: None
    _common.EAGER_DEVICES = ("cuda", "cpu")
    t2 = time.perf_counter()
    try:
        fn(*args, **kwargs)
        refused = "no error"
    except Exception as e:  # expected: pyptx's placement check, at the launch
        refused = f"{type(e).__name__}: {e}"
    from pyptx import driver, jit, launch  # noqa: F401  (what a launch imports)
    from pyptx.registry import record_for

    specs = [s for k in made for s in k._cache.values()]
    for s in specs:
        record_for(s)
    t3 = time.perf_counter()
    Kernel.__init__ = init
    from pyptx_kernels import _family

    return dict(import_ms=(t1 - t0) * 1e3, call_ms=(t3 - t2) * 1e3, specs=len(specs),
                refused=refused, family=_family.stats())


def _run(op: str, env: dict, importtime: bool = False) -> tuple[dict, str]:
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), __file__,
           "--child", op]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith(TAG)), None)
    if line is None:
        raise SystemExit(f"{op}: the child failed:\n{p.stdout}\n{p.stderr[-3000:]}")
    return json.loads(line[len(TAG):]), p.stderr


def own_imports(stderr: str) -> tuple[float, int]:
    """(ms, modules): the summed self import time of the library's modules in ``-X
    importtime`` output."""
    total, n = 0, 0
    for m in re.finditer(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", stderr):
        if m[2].partition(".")[0] in OWN:
            total += int(m[1])
            n += 1
    return total / 1e3, n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-pyc", action="store_true")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        print(TAG + json.dumps(child(a.child)), flush=True)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if a.no_pyc:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        else:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pyc")
        for op in a.ops:
            env["PYPTX_CACHE_DIR"] = os.path.join(tmp, op)
            empty, _ = _run(op, env)
            warm = [_run(op, env)[0] for _ in range(a.repeat)]
            _, err = _run(op, env, importtime=True)
            imp_ms, n = own_imports(err)
            med = {k: statistics.median(w[k] for w in warm) for k in ("import_ms", "call_ms")}
            rows.append((op, empty["import_ms"] + empty["call_ms"], med["import_ms"],
                         med["call_ms"], med["import_ms"] + med["call_ms"], imp_ms, n,
                         warm[-1]["family"], warm[-1]["refused"]))
    print(f"bytecode: {'off' if a.no_pyc else 'on'}; warm: median of {a.repeat}")
    print(f"{'op':<11} {'empty ms':>9} {'import':>7} {'call':>7} {'warm ms':>8} "
          f"{'imports ms (n)':>15}  families (warm)")
    for op, empty_ms, i, c, w, imp, n, fam, _ in rows:
        print(f"{op:<11} {empty_ms:9.0f} {i:7.0f} {c:7.0f} {w:8.0f} {imp:9.0f} ({n:3d})  "
              f"{fam}")
    for op, *_, refused in rows:
        if "on cpu" not in refused:
            print(f"note: {op}'s call ended before the launch ({refused[:200]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
