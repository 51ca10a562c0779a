"""Choosing a plan without timing (``pyptx_kernels._tuning``), on the CPU: device keys, size
buckets, the shipped tables (every entry names a plan that exists), the heuristics, and that a
default call of the GEMMs times nothing while ``PYPTX_AUTOTUNE=1`` and ``tune()`` do (a fake
timer stands in for the GPU); ``precompile``'s argument checks."""

from __future__ import annotations

import json

import pytest
from pyptx_kernels import _tuning
from pyptx_kernels.fp8_gemm import host as fp8_host
from pyptx_kernels.gemm import host as gemm_host
from pyptx_kernels.gemm.config import PLANS, default_plan
from pyptx_kernels.grouped_gemm import host as grouped_host

from pyptx.autotune import Config, mode

GEMM_BENCH = [(2048, 2048, 2048), (4096, 4096, 4096), (6144, 6144, 6144), (8192, 8192, 8192),
              (8192, 28672, 8192), (8192, 8192, 28672), (128, 8192, 8192), (4095, 4097, 4100)]


class FakeArray:
    shape = (64,)


class FakeTimer:
    """A GPU named ``device`` whose timings come from ``times`` (plan -> us); counts them."""

    def __init__(self, device="NVIDIA H200", times=None):
        self.device, self.times, self.measured = device, times or {}, []

    def device_name(self, args):
        return self.device

    def measure(self, k, args, kwargs):
        self.measured.append(k.name)
        return self.times.get(k.name, 10.0)


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """Every tuned kernel sees a fake H200 (ptxas not asked), a fresh cache, and
    ``PYPTX_AUTOTUNE`` unset."""
    import pyptx.autotune as at

    timer = FakeTimer()
    monkeypatch.setattr(at, "timer_for", lambda args: timer)
    monkeypatch.setattr(at, "_ptxas_verdict", lambda specs: None)
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PYPTX_AUTOTUNE", raising=False)
    return timer


def gemm_kernel(M, N, K):
    """The planned TunedKernel ``matmul`` launches for a bf16 ``(M, K) @ (K, N)``."""
    key = tuple(sorted(dict(dtype="bf16", out_dtype="bf16", a_major="K", b_major="MN",
                            bias=False, alpha=1.0, activation=None, KB=K, NB=N).items()))
    return gemm_host._cached(M, N, K, key, None)


def test_device_keys():
    assert _tuning.device_key("NVIDIA H100 80GB HBM3") == "h100"
    assert _tuning.device_key("NVIDIA H100 PCIe") == "h100"
    assert _tuning.device_key("NVIDIA H200") == "h200"
    assert _tuning.device_key("NVIDIA GH200 480GB") == "h200"
    assert _tuning.device_key("NVIDIA B200") == "nvidia_b200"
    assert _tuning.device_key("NVIDIA H1000") == "nvidia_h1000"
    assert _tuning.device_key() == "other"   # no CUDA device on this machine


def test_buckets_are_powers_of_two_and_their_halfway_points():
    assert [_tuning.bucket(n) for n in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 1000, 4095, 4097)] == \
        [1, 1, 2, 3, 4, 6, 6, 8, 8, 12, 16, 1024, 4096, 6144]
    assert _tuning.bucket(6144) == 6144 and _tuning.bucket(6145) == 8192
    assert _tuning.bucket(10 ** 9) == _tuning.MAX_BUCKET
    assert _tuning.bucket_key({"N": 4097, "M": 1, "dtype": "bf16", "flag": True}) == \
        "M=1,N=6144,dtype=bf16,flag=True"


PLANNERS = {"matmul": gemm_host.PLANNER, "scaled_mm": fp8_host.PLANNER,
            "grouped_mm": _tuning.PLANNERS[grouped_host.grouped_tuned.ident],
            "grouped_mm_wgrad": _tuning.PLANNERS[grouped_host.wgrad_tuned.ident]}


@pytest.mark.parametrize("device", ["h100", "h200"])
def test_every_shipped_entry_names_a_plan_of_its_op(device):
    data = json.loads((_tuning.TABLES / f"{device}.json").read_text())
    assert data["device"] == device
    for op, entry in data["ops"].items():
        assert entry["source"]
        if op not in PLANNERS:   # another op's entries: its own tests check them
            continue
        for key, plan in entry["buckets"].items():
            assert plan in PLANNERS[op].plans, (op, key, plan)
            sizes = dict(kv.split("=") for kv in key.split(","))
            assert _tuning.bucket_key(sizes) == key  # a key is already bucketed


def test_the_tables_hold_the_gemm_benchmark_shapes():
    for device in ("h100", "h200"):
        for M, N, K in GEMM_BENCH:
            assert _tuning.lookup("matmul", {"M": M, "N": N, "K": K}, device) in PLANS
        assert _tuning.lookup("matmul", {"M": 3, "N": 5, "K": 7}, device) is None
    assert _tuning.lookup("matmul", {"M": 4096, "N": 4096, "K": 4096}, "nvidia_b200") is None
    assert _tuning.lookup("no_such_op", {"M": 1}, "h200") is None


def test_planner_takes_the_table_then_the_heuristic():
    kv = {"M": 6144, "N": 6144, "K": 6144, "dtype": "bf16"}
    assert gemm_host.PLANNER.choose(kv, "NVIDIA H200") == ("192x192x64_s3_c1", "table")
    assert gemm_host.PLANNER.choose(kv, "NVIDIA B200") == (default_plan(6144, 6144, 6144),
                                                           "heuristic")
    assert gemm_host.PLANNER(kv, "NVIDIA H200") == Config(config="192x192x64_s3_c1")
    assert gemm_host.PLANNER.name_of(Config(config="192x192x64_s3_c1")) == "192x192x64_s3_c1"
    assert gemm_host.PLANNER.name_of(Config(config="nope")) is None


def test_gemm_heuristic_follows_the_recorded_picks():
    assert default_plan(1, 4096, 4096) == "64x128x64_s9_c1_e1"        # skinny: B streams
    assert default_plan(128, 8192, 8192) == "64x128x64_s9_c1_e1"
    assert default_plan(1024, 1024, 16384) == "128x128x64_s6_c1_st"   # few tiles, long K
    assert default_plan(2048, 2048, 2048) == "256x128x64_s4_c1_w128"
    assert default_plan(8192, 28672, 8192) == "192x192x64_s3_c2"
    assert default_plan(512, 2048, 2048) == "128x128x64_s6_c1"        # under half the SMs
    assert default_plan(8192, 8192, 8192) == "128x256x64_s4_c2"
    # weight gradients (K = 8192 tokens), rated by their waves: H100 sweep in performance.md
    assert default_plan(11264, 2048, 8192) == "192x192x64_s3_c1"      # 726 vs 665 TFLOP/s
    assert default_plan(32000, 2048, 8192) == "192x192x64_s3_c1"
    assert default_plan(2048, 5632, 8192) == "128x128x64_s6_c1_st"    # 721 vs 688
    assert default_plan(3072, 2048, 8192) == "128x128x64_s6_c1_st"
    assert default_plan(2048, 2048, 8192) == "256x128x64_s4_c1_w128"  # one wave: 765 vs 727
    assert default_plan(128256, 4096, 8192) == "128x256x64_s4_c2"
    assert default_plan(6144, 4096, 8192) == "256x128x64_s4_c1_w128"  # 744-750 vs 714


@pytest.mark.parametrize("planner", list(PLANNERS.values()), ids=list(PLANNERS))
def test_every_heuristic_pick_is_a_plan_of_its_op(planner):
    for M in (1, 7, 64, 200, 1000, 4096, 20000):
        for N in (8, 256, 1000, 4096, 28672):
            for K in (16, 512, 4096, 16384):
                sizes = {"M": M, "N": N, "K": K, "G": 8, "b_major": "MN", "scale": "row",
                         "KX": N, "NY": K}
                args = {k: sizes[k] for k in planner.sizes(sizes)}
                assert planner.heuristic(**args) in planner.plans, (M, N, K)


def test_a_default_gemm_call_times_nothing(fake_gpu, tmp_path):
    k = gemm_kernel(6144, 6144, 6144)
    k.choose(FakeArray())
    assert k.choice.source == "default" and k.choice.config == Config(config="192x192x64_s3_c1")
    assert fake_gpu.measured == [] and not (tmp_path / "autotune").exists()
    fake_gpu.device = "NVIDIA B200"        # no table: the heuristic
    k.choose(FakeArray())
    assert k.choice.config == Config(config=default_plan(6144, 6144, 6144))
    assert fake_gpu.measured == []


def test_autotune_1_and_tune_time_the_plans_and_keep_the_winner(fake_gpu, monkeypatch, capsys):
    fake_gpu.times = {"gemm_bf16_bf16_KMN_128x128x64_s6_c1": 1.0}
    k = gemm_kernel(2048, 1024, 512)
    k.choose(FakeArray())
    assert k.choice.source == "default" and fake_gpu.measured == []
    seen = []
    _tuning.tune(lambda: seen.append((mode(), _tuning.tuning_requested(),
                                      k.choose(FakeArray()))))
    assert seen[0][:2] == ("tune", True) and len(fake_gpu.measured) >= 5
    assert k.choice.source == "timed" and k.choice.config == Config(config="128x128x64_s6_c1")
    assert "pyptx.autotune: build_gemm(M=2048, N=1024, K=512" in capsys.readouterr().err
    k.choose(FakeArray())                        # a later default call: the winner
    assert k.choice.config == Config(config="128x128x64_s6_c1") and mode() == "plan"
    monkeypatch.setenv("PYPTX_AUTOTUNE", "1")    # another shape, timing asked by the variable
    other = gemm_kernel(2048, 1024, 1024)
    n = len(fake_gpu.measured)
    other.choose(FakeArray())
    assert other.choice.source == "timed" and len(fake_gpu.measured) > n
    fresh = gemm_host.gemm_planned.with_default(gemm_host.PLANNER)(*k.args, **k.kwargs)
    monkeypatch.delenv("PYPTX_AUTOTUNE")        # a new process: the winner from disk
    fresh.choose(FakeArray())
    assert fresh.choice.source == "disk" and fresh.choice.config == k.choice.config


def test_grouped_and_fp8_default_calls_take_their_plans_untimed(fake_gpu):
    fwd = grouped_host.grouped_planned(2048, 256, 2048, 4, b_major="MN", out_dtype="bf16")
    fwd.choose(FakeArray())
    assert fwd.choice.source == "default"
    assert fwd.choice.config == Config(BM=64, BN=256, prefetch=True, speculate=5)
    wg = grouped_host.wgrad_planned(2048, 2048, 256, 4, out_dtype="bf16")
    wg.choose(FakeArray())
    assert wg.choice.source == "default" and wg.choice.config == Config(BM=128, BN=128)
    k, _, _ = fp8_host.kernel_for(4096, 4096, 4096, scale="row", dtype="e4m3", dtype_b="e4m3",
                                  out_dtype="bf16", fast_accum=False)
    k.choose(FakeArray())
    assert k.choice.source == "default" and k.choice.config == Config(
        plan="128x256_sauto_c2_g8_n132")
    assert fake_gpu.measured == []


def test_precompile_refuses_what_is_not_work():
    torch = pytest.importorskip("torch")
    import pyptx_kernels

    from pyptx.errors import ConfigError

    with pytest.raises(ConfigError, match=r"test_tuning_cpu\.py:\d+: precompile: work must be"):
        pyptx_kernels.precompile(42)
    with pytest.raises(ConfigError, match=r"test_tuning_cpu\.py:\d+: precompile: each call"):
        pyptx_kernels.precompile([("matmul", (4, 4))])
    with pytest.raises(ConfigError, match=r"test_tuning_cpu\.py:\d+: precompile: example"):
        pyptx_kernels.precompile([(pyptx_kernels.matmul,)], torch.zeros(1))


def test_precompile_runs_each_call_once_on_zero_filled_inputs_untimed():
    torch = pytest.importorskip("torch")
    import pyptx_kernels

    seen = []

    def fn(a, b, *, scale):
        seen.append((mode(), a.shape, a.dtype, b.stride(), float(a.abs().sum()), scale))
        return a.float() * scale

    meta = torch.empty(3, 5, device="meta").T
    pyptx_kernels.precompile([(fn, ((2, 3), torch.bfloat16), meta, {"scale": 2.0})],
                             device="cpu")
    assert seen == [("plan", (2, 3), torch.bfloat16, (1, 5), 0.0, 2.0)]
    lin = torch.nn.Linear(3, 2)
    pyptx_kernels.precompile(lin, ((4, 3), torch.float32), backward=True, device="cpu")
    assert lin.weight.grad is None


def test_tune_table_records_timed_winners_by_op_and_bucket():
    import importlib.util
    from pathlib import Path

    from pyptx.autotune import Choice

    path = Path(__file__).resolve().parents[3] / "tools" / "tune_table.py"
    spec = importlib.util.spec_from_file_location("tune_table", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    k = gemm_kernel(4095, 4104, 4104)
    other = gemm_host.gemm_tuned.with_default(None)   # not registered under another ident
    log = [(k, Choice(Config(config="192x192x64_s3_c2"), 3.0, "NVIDIA H200", "timed")),
           (k, Choice(Config(config="128x256x64_s4_c2"), None, "NVIDIA H200", "default"))]
    entries, unplanned = {}, set()
    lines = tool.record(log, entries, unplanned)
    assert entries == {"matmul": {"K=6144,M=4096,N=6144": "192x192x64_s3_c2"}}
    assert len(lines) == 1 and "3.0 us" in lines[0] and not unplanned
    assert other.ident == gemm_host.gemm_tuned.ident
    assert set(tool.OPS) == {"matmul", "grouped_mm", "scaled_mm", "attention", "rms_norm"}


@pytest.mark.parametrize("env,want", [(None, "plan"), ("1", "plan"), ("0", "off")])
def test_precompile_never_times_and_keeps_a_switched_off_mode(monkeypatch, env, want):
    torch = pytest.importorskip("torch")
    import pyptx_kernels

    if env is None:
        monkeypatch.delenv("PYPTX_AUTOTUNE", raising=False)
    else:
        monkeypatch.setenv("PYPTX_AUTOTUNE", env)
    seen = []
    pyptx_kernels.precompile([(lambda x: seen.append(mode()), ((1,), torch.float32))],
                             device="cpu")
    assert seen == [want]
