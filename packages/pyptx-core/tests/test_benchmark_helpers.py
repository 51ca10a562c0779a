"""CPU tests of benchmarks/memory_bound.py's timer: pool sizing, launches per graph, tables,
and the graph timer's control flow (capture, replay, fallback) against a fake ``torch.cuda``."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks" / "memory_bound.py"
MiB = 1 << 20


@pytest.fixture(scope="module")
def mb():
    spec = importlib.util.spec_from_file_location("bench_memory_bound", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


# ----------------------------------------------------------------------------- pure helpers
@pytest.mark.parametrize("l2", [50 * MiB, 60 * MiB, 40 * MiB])
@pytest.mark.parametrize("set_bytes", [1, 2 * MiB + 8, 4 * MiB, 32 * MiB + 16, 67 * MiB,
                                       128 * MiB, 256 * MiB, 512 * MiB])
def test_pool_exceeds_four_l2_with_the_fewest_sets(mb, l2, set_bytes):
    n, capped = mb.pool_sets(set_bytes, l2)
    assert not capped
    assert n >= 2 and n * set_bytes > 4 * l2
    assert n == 2 or (n - 1) * set_bytes <= 4 * l2  # one set fewer would not do
    assert n * set_bytes <= mb.POOL_CAP_BYTES


def test_pool_cap(mb):
    n, capped = mb.pool_sets(1536 * MiB, 50 * MiB)  # two sets would pass 2 GiB
    assert (n, capped) == (1, True)
    n, capped = mb.pool_sets(64 * MiB, 1024 * MiB)  # a (hypothetical) 1 GiB L2
    assert capped and n * 64 * MiB <= mb.POOL_CAP_BYTES and n == mb.POOL_CAP_BYTES // (64 * MiB)
    n, capped = mb.pool_sets(2 * MiB, 50 * MiB, cap=64 * MiB)
    assert capped and n == 32


def test_interleaved_rounds_rotate_the_order(mb):
    """Every implementation is timed once per round; each leads once per cycle of rounds;
    results come back per name in round order."""
    calls = []
    fns = {"ours": "A", "eager": "B", "triton": "C"}
    out = mb.interleaved(lambda f: calls.append(f) or float(len(calls)), fns, 4)
    assert calls == list("ABC" "BCA" "CAB" "ABC")
    assert out == {"ours": [1.0, 6.0, 8.0, 10.0], "eager": [2.0, 4.0, 9.0, 11.0],
                   "triton": [3.0, 5.0, 7.0, 12.0]}
    assert mb.interleaved(lambda f: 1.0, fns, 0) == {"ours": [], "eager": [], "triton": []}
    assert mb.rotated([], 3) == []


@pytest.mark.parametrize("est_us", [0.5, 2.0, 4.9, 45.0, 180.0, 400.0, 999.0, 5000.0])
@pytest.mark.parametrize("pool", [1, 2, 3, 7, 101, 1000, 3000])
def test_graph_launches_bounds(mb, est_us, pool):
    m = mb.graph_launches(est_us, pool)
    cap = mb.GRAPH_MAX_LAUNCHES
    assert m % pool == 0 and m >= pool  # whole walks of the pool
    assert m <= max(cap, pool)
    if m + pool <= cap:  # not cut by the cap: long enough, and no whole walk too many
        assert m * est_us >= mb.GRAPH_TARGET_US or m == pool
        assert m == pool or (m - pool) * est_us < max(mb.GRAPH_TARGET_US, pool * est_us)


def test_graph_launches_examples(mb):
    assert mb.graph_launches(5.0, 3) == 201  # 200 wanted, rounded up to whole walks
    assert mb.graph_launches(45.0, 2) == 24
    assert mb.graph_launches(400.0, 2) == 4
    assert mb.graph_launches(0.1, 3) == 1998  # capped at 2000
    assert mb.graph_launches(0.0, 5) == 2000 and mb.graph_launches(math.inf, 5) == 2000
    assert mb.graph_launches(1.0, 2500) == 2500  # one walk even past the cap


def _row(**kw):
    r = {"op": "rms_norm", "dtype": "f32", "B": 256, "N": 4096, "ours": 1500.0,
         "ours_best_variant": 1400.0, "eager": 900.0, "inductor": 1300.0, "triton": 1450.0,
         "vs_peer": 1.03, "vs_copy": 0.5, "ours_plan": "R=1 G=256 K=4",
         "methods": {"ours": "graph", "ours_best_variant": "graph", "eager": "graph",
                     "inductor": "graph", "triton": "graph"}}
    r.update(kw)
    return r


def test_table_marks_fallbacks(mb):
    clean = mb.op_table([_row()], "rms_norm", "graph")
    assert "*" not in "\n".join(clean)
    assert ("| f32 | 256x4096 | 1500 | - | - | 1400 | 900 | 1300 | 1450 | 1.030x | 50.0% |"
            in clean[4])  # ours tuned and default / tuned: not in this row
    r = _row()
    r["methods"]["inductor"] = "do_bench"
    md = mb.op_table([r, _row(dtype="bf16")], "rms_norm", "graph")
    line = next(s for s in md if s.startswith("| f32"))
    assert "| 1300* |" in line and "| 900 |" in line and "| 1.030x* |" in line
    assert "| 1.030x |" in next(s for s in md if s.startswith("| bf16"))
    assert any(s.startswith("\\* CUDA-graph capture failed") and "do_bench" in s for s in md)
    r = _row()
    del r["inductor"], r["methods"]["inductor"]  # --no-compile
    r["methods"]["eager"] = "failed"
    line = mb.op_table([r], "rms_norm", "graph")[4]
    assert "| - |" in line and "*" not in line


def test_table_paired_column(mb):
    md = mb.op_table([_row(paired=0.987), _row(dtype="bf16")], "rms_norm", "graph")
    assert "| ours / best peer | paired | ours / copy |" in md[2]
    assert md[3].count("|") == md[2].count("|")
    assert "| 1.030x | 0.987x | 50.0% |" in next(s for s in md if s.startswith("| f32"))
    assert "| 1.030x | - | 50.0% |" in next(s for s in md if s.startswith("| bf16"))
    assert "paired" not in mb.op_table([_row()], "rms_norm", "graph")[2]


def test_alt_table(mb):
    r = _row(alt={"method": "do_bench", "peer": "triton", "ours": 1000.0, "peer_gbs": 1100.0})
    md = mb.op_table([r], "rms_norm", "graph") + mb.alt_table(
        [r, _row()], "graph", "do_bench", {"graph": 3000.0, "do_bench": 2900.0})
    text = "\n".join(md)
    assert "ours graph | ours do_bench" in text and "2900 GB/s (do_bench)" in text
    rows = [s for s in md if s.startswith("| rms_norm")]
    assert rows == ["| rms_norm | f32 | 256x4096 | 1500 | 1000 | triton | 1450 | 1100 | 1.03x "
                    "| 0.91x | 50.0% | 34.5% |"]


def test_timer_desc_names_the_method(mb):
    assert "CUDA-graph" in mb.timer_desc("graph") and "4x L2" in mb.timer_desc("graph")
    assert "flush" in mb.timer_desc("do_bench") and "flush" in mb.timer_desc("events")


def test_help_without_gpu():
    out = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--timer {graph,do_bench,events,both}" in out.stdout


# ----------------------------------------------------------------------------- fake torch.cuda
class FakeTensor:
    def __init__(self, nbytes):
        self.nbytes = nbytes

    def numel(self):
        return self.nbytes // 4

    def element_size(self):
        return 4

    def clone(self):
        return FakeTensor(self.nbytes)

    def zero_(self):
        return self


class FakeGPU:
    """A clock in ms: eager launches and graph replays advance it; events read it."""

    def __init__(self, launch_us, l2=50 * MiB, fail=False):
        self.launch_ms, self.l2, self.fail = launch_us / 1e3, l2, fail
        self.clock, self.capturing, self.graphs = 0.0, None, []

    def kernel(self, *xs):
        if self.capturing is not None:
            if self.fail:
                raise RuntimeError("operation not permitted when stream is capturing")
            self.capturing.sets.append(xs)
        else:
            self.clock += self.launch_ms
        return FakeTensor(16)

    def torch(self):
        gpu = self

        class Graph:
            def __init__(self):
                self.sets = []
                gpu.graphs.append(self)

            def replay(self):
                gpu.clock += 0.004 + len(self.sets) * gpu.launch_ms  # + a graph launch

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = gpu.clock

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return other.t - self.t

        @contextlib.contextmanager
        def graph(g, stream=None):
            gpu.capturing = g
            try:
                yield
            finally:
                gpu.capturing = None

        stream = SimpleNamespace(wait_stream=lambda s: None)
        cuda = SimpleNamespace(
            Stream=lambda: stream, current_stream=lambda: stream,
            stream=lambda s: contextlib.nullcontext(), synchronize=lambda: None,
            empty_cache=lambda: None, CUDAGraph=Graph, graph=graph, Event=Event,
            OutOfMemoryError=MemoryError,
            get_device_properties=lambda i: SimpleNamespace(L2_cache_size=gpu.l2))
        return SimpleNamespace(cuda=cuda, int32="int32",
                               empty=lambda n, dtype=None, device=None: FakeTensor(4 * n))


def _timer(mb, gpu, method="graph"):
    t = mb.Timer(gpu.torch(), method)
    t.do_bench, t.flush_method = None, "events"  # whether or not Triton is installed here
    return t


@pytest.mark.parametrize("launch_us,set_bytes", [(5.0, 4 * MiB), (45.0, 128 * MiB),
                                                 (0.2, 1 * MiB)])
def test_graph_timer_walks_the_pool(mb, launch_us, set_bytes):
    gpu = FakeGPU(launch_us)
    timer = _timer(mb, gpu)
    pool, capped = timer.pool((FakeTensor(set_bytes - 4096), FakeTensor(4096)))
    assert not capped and len(pool) >= 2
    assert sum(t.nbytes for xs in pool for t in xs) > 4 * gpu.l2
    assert len({id(xs[0]) for xs in pool}) == len(pool)  # distinct clones
    t = timer.ms(gpu.kernel, pool)
    assert (t.method, t.error) == ("graph", "")
    timed = gpu.graphs[-1]
    assert len(timed.sets) == t.launches and t.launches % len(pool) == 0
    assert all(timed.sets[i][0] is pool[i % len(pool)][0] for i in range(t.launches))
    replay_us = 1e3 * t.ms * t.launches  # ~1 ms (the estimate carries the graph's overhead)
    assert replay_us >= 0.95 * mb.GRAPH_TARGET_US or t.launches + len(pool) > mb.GRAPH_MAX_LAUNCHES
    assert t.ms == pytest.approx(launch_us / 1e3 + 0.004 / t.launches, rel=1e-9)


def test_graph_timer_falls_back_when_capture_fails(mb):
    gpu = FakeGPU(5.0, fail=True)
    timer = _timer(mb, gpu)
    pool, _ = timer.pool((FakeTensor(4 * MiB),))
    t = timer.ms(gpu.kernel, pool)
    assert t.method == "events" and t.launches == 1
    assert "RuntimeError" in t.error and "capturing" in t.error
    assert t.ms == pytest.approx(5e-3)


def test_flush_timers_use_one_set(mb):
    gpu = FakeGPU(5.0)
    timer = _timer(mb, gpu, "events")
    pool, capped = timer.pool((FakeTensor(4 * MiB),))
    assert len(pool) == 1 and not capped
    t = timer.ms(gpu.kernel, pool)
    assert (t.method, t.launches) == ("events", 1) and not gpu.graphs
    both = _timer(mb, FakeGPU(5.0), "both")
    assert both.method == "graph"


# ----------------------------------------------------------------------------- tuned shapes
def test_tuning_includes_ring_kernels_where_two_rings_fit_an_sm(mb):
    bf16, f32 = "bf16", "f32"  # as main() passes them
    mods = {m: mb.load(m) for m in ("rms_norm", "layer_norm", "softmax", "swiglu")}

    def labels(op, N, dt):
        return [label for label, _ in mb.our_variants(mods, op, 2048, N, dt, True, sms=132)]

    ring = [f"ring ctas=264 stages={s}" + (" bulk_store" if b else "") for s, b in mb.RING_SHAPES]
    for op in ("rms_norm", "layer_norm"):
        assert [v for v in labels(op, 8192, bf16) if v.startswith("ring")] == ring
        # f32 rows of 32 KiB: two rings of 4 stages (256 KiB) do not fit an SM, 3 stages do
        assert [v for v in labels(op, 8192, f32) if v.startswith("ring")] == [ring[0]]
        assert not [v for v in labels(op, 4097, f32) if v.startswith("ring")]  # not 16-byte rows
    assert not [v for v in labels("softmax", 8192, bf16) if v.startswith("ring")]
    assert not [v for v in mb.our_variants(mods, "rms_norm", 2048, 8192, bf16, False, sms=132)
                if v[0].startswith("ring")]  # --no-tune: the planner's shape only
