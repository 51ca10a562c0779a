"""Device probe for issue 18's jax.jit target: host µs per call of ``jax.jit`` functions
calling RMSNorm 32x1024 variants against ``jax.jit(jnp.add)`` of the same size, rounds
interleaved (2000 back-to-back calls, final block_until_ready included; median of rounds).
Every variant is checked against a float64 reference first.

    python tools/probe_jax_dispatch.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from pyptx.testing import load_module

ROOT = Path(__file__).resolve().parents[1]
B, N, EPS = 32, 1024, 1e-6
VARIANTS = {"default": {}, "pdl=False": {"pdl": False}, "chunks=2": {"chunks": 2},
            "chunks=2,pdl=False": {"chunks": 2, "pdl": False}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    import numpy as np

    mod = load_module(ROOT / "examples/hopper/rms_norm.py", "probe_jax_rms")
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((B, N), np.float32))
    y = jnp.asarray(rng.standard_normal((B, N), np.float32))
    w = jnp.asarray(rng.standard_normal(N).astype(np.float32) * 0.1 + 1)
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    ref = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + EPS) * w64
    add = jax.jit(jnp.add)
    calls = {"jax.jit(jnp.add)": lambda: add(x, y)}
    for name, kw in VARIANTS.items():
        k = mod.build_rms_norm_fast(B, N, eps=EPS, **kw)
        f = jax.jit(lambda a, b, k=k: k(a, b))
        err = float(np.abs(np.asarray(f(x, w), np.float64) - ref).max() / np.abs(ref).max())
        if err > 1e-5:
            print(f"{name}: WRONG rel err {err:.2e}")
            continue
        calls[name] = (lambda f=f: f(x, w))
    times = {n: [] for n in calls}
    for _ in range(a.rounds):
        for n, f in calls.items():
            f().block_until_ready()
            t0 = time.perf_counter()
            for _ in range(2000):
                r = f()
            r.block_until_ready()
            times[n].append((time.perf_counter() - t0) / 2000 * 1e6)
    base = statistics.median(times["jax.jit(jnp.add)"])
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, {B}x{N} f32, "
          f"median of {a.rounds} rounds (host µs per call)")
    for n, t in times.items():
        m = statistics.median(t)
        print(f"{n:<22} {m:8.2f}  {m / base:5.2f}x  min {min(t):7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
