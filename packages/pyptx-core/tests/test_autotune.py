"""``pyptx.autotune`` on the CPU: a fake device and timer, real kernels and real ptxas.

Covers the default call (no timing: a saved winner, else the builder's default plan, else
the first config), timing on request (``PYPTX_AUTOTUNE=1``, ``tuning()``), the choice of
the fastest config, the winner kept on disk and reused by a
fresh tuner without timing, ``PYPTX_AUTOTUNE=0``, configs skipped because the
builder refuses them, ptxas rejects them or they spill, the log line, key handling,
the bypass with explicit config keywords, and the errors for bad configs and keys.
"""

from __future__ import annotations

import json
import re

import pytest

import pyptx
from pyptx import ConfigError, PyptxError, Tile, kernel, ptx, reg
from pyptx.autotune import AutotuneError, Config, TunedKernel, autotune, mode, tuning
from pyptx.trace import current
from pyptx.types import f32


def build_hold(N, *, hold=8, maxnreg=None, raw=None, dtype="f32"):
    """A kernel keeping ``hold`` values live (spills under a tiny ``maxnreg``); ``raw`` adds a
    raw PTX line (a bad one makes ptxas reject the kernel)."""
    if hold > N:
        raise ConfigError(f"build_hold: hold={hold} is more than N={N}")

    @kernel(in_specs=(Tile(N, f32),), out_specs=(Tile(N, f32),), grid=(1, 1, 1),
            block=(32, 1, 1), maxnreg=maxnreg, name=f"hold{hold}_r{maxnreg or 0}")
    def k(X, Y):
        px, py = ptx.global_ptrs(X, Y)
        vals = reg.array(f32, hold)
        for i in range(hold):
            ptx.inst.ld.global_.f32(vals[i], ptx.addr(px, 4 * i))
        if raw:
            current().raw(raw)
        for i in range(hold):
            ptx.inst.st.global_.f32(ptx.addr(py, 4 * (hold - 1 - i)), vals[i] * vals[(i * 7) % hold])
        ptx.ret()

    return k


class FakeArray:
    """Stands in for a device array: the fake timer never launches anything."""

    shape = (64,)


class FakeTimer:
    """Times by kernel name from a table; counts what it was asked."""

    def __init__(self, times: dict[str, float], device: str | None = "Fake GPU 9000") -> None:
        self.times = times
        self.device = device
        self.measured: list[str] = []

    def device_name(self, args):
        return self.device

    def measure(self, k, args, kwargs):
        self.measured.append(k.name)
        return self.times[k.name]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A fresh winners' store, and timing asked for (``PYPTX_AUTOTUNE=1``): most tests here
    are about the timing; the default call's tests unset it."""
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PYPTX_AUTOTUNE", "1")
    return tmp_path / "autotune"


def tuned(timer, configs=None, key=("N",), default=None):
    configs = configs or [Config(hold=8), Config(hold=16), Config(hold=32)]
    return autotune(configs=configs, key=list(key), timer=timer, default=default)(build_hold)


class Plan:
    """A default plan that records its calls: ``hold=32`` for N >= 64, else none."""

    def __init__(self):
        self.calls = []

    def __call__(self, keyvals, device):
        self.calls.append((dict(keyvals), device))
        return Config(hold=32) if keyvals["N"] >= 64 else None


def test_a_default_call_times_nothing_and_takes_the_default_plan(monkeypatch, capsys, cache):
    monkeypatch.delenv("PYPTX_AUTOTUNE")
    assert mode() == "plan"
    timer = FakeTimer({"hold8_r0": 1.0, "hold16_r0": 1.0, "hold32_r0": 9.0})
    plan = Plan()
    k = tuned(timer, default=plan)(64)
    assert k.choose(FakeArray()).name == "hold32_r0"
    assert k.choice.source == "default" and k.choice.us is None
    # the builder call plans for the current device (None here), the launch for its device
    assert plan.calls == [({"N": 64}, None), ({"N": 64}, "Fake GPU 9000")]
    assert list(k._built) == [2]  # only the launched plan was built: no kernel left untraced
    assert k.default_config("Fake GPU 9000") == Config(hold=32)
    small = tuned(timer, default=plan)(48)  # the plan has nothing: the first config
    assert small.choose(FakeArray()).name == "hold8_r0" and small.choice.source == "first"
    plain = tuned(timer)(64)                # no plan at all: the first config, untimed
    assert plain.choose(FakeArray()).name == "hold8_r0" and plain.choice.source == "first"
    assert timer.measured == [] and capsys.readouterr().err == "" and not cache.exists()


def test_a_builder_call_builds_the_plan_a_launch_takes_and_no_other(monkeypatch):
    monkeypatch.delenv("PYPTX_AUTOTUNE")
    k = tuned(FakeTimer({}), default=lambda kv, dev: Config(hold=16))(64)
    assert k.name == "hold16_r0" and list(k._built) == [1]  # the first config is not built
    monkeypatch.setenv("PYPTX_AUTOTUNE", "0")                # switched off: the first config
    off = tuned(FakeTimer({}), default=lambda kv, dev: Config(hold=16))(48)
    assert off.name == "hold8_r0" and list(off._built) == [0]


def test_a_default_plan_that_is_no_config_or_does_not_build_falls_back(monkeypatch):
    monkeypatch.delenv("PYPTX_AUTOTUNE")
    timer = FakeTimer({})
    odd = tuned(timer, default=lambda kv, dev: Config(hold=4))(64)      # not a candidate
    assert odd.choose(FakeArray()).name == "hold8_r0" and odd.choice.source == "first"
    big = tuned(timer, [Config(hold=8), Config(hold=128)],
                default=lambda kv, dev: Config(hold=128))(64)            # refused: 128 > 64
    assert big.choose(FakeArray()).name == "hold8_r0" and timer.measured == []


def test_a_saved_winner_comes_before_the_default_plan(monkeypatch, capsys):
    timer = FakeTimer({"hold8_r0": 9.0, "hold16_r0": 1.0, "hold32_r0": 5.0})
    assert tuned(timer, default=Plan())(64).choose(FakeArray()).name == "hold16_r0"  # timed
    capsys.readouterr()
    monkeypatch.delenv("PYPTX_AUTOTUNE")
    again = FakeTimer({})
    k = tuned(again, default=Plan())(64)       # a new process: the winner from disk
    assert k.choose(FakeArray()).name == "hold16_r0" and k.choice.source == "disk"
    with tuning("table") as log:               # the plan itself, saved winners ignored
        assert k.choose(FakeArray()).name == "hold32_r0"
    assert [c.source for _, c in log] == ["default"]
    assert k.choose(FakeArray()).name == "hold16_r0" and again.measured == []


def test_tuning_times_once_and_later_default_calls_take_the_winner(monkeypatch, capsys, cache):
    monkeypatch.delenv("PYPTX_AUTOTUNE")
    timer = FakeTimer({"hold8_r0": 9.0, "hold16_r0": 1.0, "hold32_r0": 5.0})
    k = tuned(timer, default=Plan())(64)
    assert k.choose(FakeArray()).name == "hold32_r0" and timer.measured == []
    with tuning() as log:
        assert mode() == "tune"
        assert k.choose(FakeArray()).name == "hold16_r0"
    assert mode() == "plan"
    assert [(t is k, c.source, c.config) for t, c in log] == [(True, "timed", Config(hold=16))]
    assert k.choose(FakeArray()).name == "hold16_r0"   # this process: the winner from now on
    assert timer.measured == ["hold8_r0", "hold16_r0", "hold32_r0"]
    assert json.loads(next(cache.glob("*.json")).read_text())["config"] == {"hold": 16}
    with pytest.raises(AutotuneError, match=r"test_autotune\.py:\d+: tuning\(\) mode"):
        with tuning("fast"):
            pass


def test_with_default_shares_configs_key_and_winners():
    timer = FakeTimer({"hold8_r0": 9.0, "hold16_r0": 1.0, "hold32_r0": 5.0})
    base = tuned(timer)
    planned = base.with_default(Plan())
    assert planned.configs is base.configs and planned.key == base.key
    assert planned.ident == base.ident and planned.default is not None and base.default is None


def test_picks_the_fastest_and_logs_one_line(capsys, cache):
    timer = FakeTimer({"hold8_r0": 9.0, "hold16_r0": 3.5, "hold32_r0": 5.0})
    k = tuned(timer)(64)
    assert isinstance(k, TunedKernel)
    assert k.ptx() == build_hold(64, hold=8).ptx()  # before any tuning: the first config
    best = k.choose(FakeArray())
    assert best.name == "hold16_r0" and k.name == "hold16_r0"
    assert k.choice.config == Config(hold=16) and k.choice.us == 3.5 and k.choice.source == "timed"
    assert timer.measured == ["hold8_r0", "hold16_r0", "hold32_r0"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pyptx.autotune: build_hold(N=64) on Fake GPU 9000: hold=16 3.5 us (3 configs)"]
    assert k.choose(FakeArray()) is best  # remembered: no second tuning
    assert timer.measured == ["hold8_r0", "hold16_r0", "hold32_r0"]
    rec = json.loads(next(cache.glob("*.json")).read_text())
    assert rec["config"] == {"hold": 16} and rec["device"] == "Fake GPU 9000"
    assert rec["key"] == {"N": 64} and rec["us"] == 3.5


def test_winner_on_disk_is_reused_by_a_new_process(capsys, cache):
    first = FakeTimer({"hold8_r0": 9.0, "hold16_r0": 9.0, "hold32_r0": 1.0})
    assert tuned(first)(64).choose(FakeArray()).name == "hold32_r0"
    capsys.readouterr()
    again = FakeTimer({"hold8_r0": 1.0, "hold16_r0": 1.0, "hold32_r0": 9.0})
    k = tuned(again)(64)  # a fresh decorator: nothing in memory
    assert k.choose(FakeArray()).name == "hold32_r0"
    assert again.measured == [] and k.choice.source == "disk"
    assert capsys.readouterr().err == ""
    # another device, another key value, or other configs: tuned afresh
    other_dev = FakeTimer({"hold8_r0": 1.0, "hold16_r0": 5.0, "hold32_r0": 9.0}, device="Fake GPU 1")
    assert tuned(other_dev)(64).choose(FakeArray()).name == "hold8_r0"
    other_key = FakeTimer({"hold8_r0": 5.0, "hold16_r0": 1.0, "hold32_r0": 9.0})
    assert tuned(other_key)(48).choose(FakeArray()).name == "hold16_r0"
    fewer = FakeTimer({"hold8_r0": 2.0, "hold16_r0": 1.0})
    assert tuned(fewer, [Config(hold=8), Config(hold=16)])(64).choose(FakeArray()).name == "hold16_r0"
    assert len(list(cache.glob("*.json"))) == 4


def test_switched_off_takes_the_first_config(monkeypatch, capsys, cache):
    monkeypatch.setenv("PYPTX_AUTOTUNE", "0")
    timer = FakeTimer({"hold8_r0": 9.0, "hold16_r0": 1.0, "hold32_r0": 1.0})
    k = tuned(timer)(64)
    assert k.choose(FakeArray()).name == "hold8_r0"
    assert timer.measured == [] and k.choice.source == "first" and k.choice.us is None
    assert capsys.readouterr().err == "" and not cache.exists()


def test_switching_off_after_a_tuning_takes_effect_at_the_next_call(monkeypatch, cache):
    timer = FakeTimer({"hold8_r0": 9.0, "hold16_r0": 1.0, "hold32_r0": 5.0})
    k = tuned(timer)(64)
    assert k.choose(FakeArray()).name == "hold16_r0"
    monkeypatch.setenv("PYPTX_AUTOTUNE", "0")
    assert k.choose(FakeArray()).name == "hold8_r0" and k.choice.source == "first"
    monkeypatch.setenv("PYPTX_AUTOTUNE", "1")
    assert k.choose(FakeArray()).name == "hold16_r0" and k.choice.source == "timed"
    assert timer.measured == ["hold8_r0", "hold16_r0", "hold32_r0"]  # tuned once


def test_without_a_device_takes_the_first_config_that_builds():
    timer = FakeTimer({}, device=None)  # a tracer / a CPU array
    k = tuned(timer, [Config(hold=128), Config(hold=16)])(64)  # hold=128 > N: refused
    assert k.choose(FakeArray()).name == "hold16_r0" and timer.measured == []


def test_spilling_and_rejected_configs_are_skipped(capsys, cache):
    timer = FakeTimer({"hold64_r24": 0.5, "hold64_r0": 4.0, "hold32_r0": 0.1, "hold8_r0": 7.0})
    configs = [Config(hold=64, maxnreg=24),              # ptxas: spills
               Config(hold=64),                          # fine
               Config(hold=32, raw="bogus.f32 %f1;"),    # ptxas rejects it
               Config(hold=128),                         # the builder refuses it
               Config(hold=8)]
    k = tuned(timer, configs)(64)
    assert k.choose(FakeArray()).name == "hold64_r0"
    assert timer.measured == ["hold64_r0", "hold8_r0"]
    line = capsys.readouterr().err.strip()
    assert line.startswith("pyptx.autotune: build_hold(N=64) on Fake GPU 9000: hold=64 4.0 us "
                           "(5 configs, 3 skipped: hold=64 maxnreg=24: spills (hold64_r24: ")
    assert "hold=32 raw=bogus.f32 %f1;: ptxas rejects it" in line
    assert "hold=128: not built: " in line and "more than N=64" in line
    rec = json.loads(next(cache.glob("*.json")).read_text())
    assert [s["config"]["hold"] for s in rec["skipped"]] == [64, 32, 128]


def test_every_config_skipped_is_an_error():
    k = tuned(FakeTimer({}), [Config(hold=128), Config(hold=64, maxnreg=24)])(64)
    with pytest.raises(AutotuneError, match=r"every config of .*build_hold was skipped for N=64 "
                                            r"on Fake GPU 9000:\n  hold=128: not built") as e:
        k.choose(FakeArray())
    assert "test_autotune.py:" in str(e.value).split(":", 1)[0] + ":"
    assert isinstance(e.value, ConfigError) and isinstance(e.value, PyptxError)


def test_key_decides_what_shares_a_tuning(capsys):
    timer = FakeTimer({"hold8_r0": 2.0, "hold16_r0": 1.0})
    build = tuned(timer, [Config(hold=8), Config(hold=16)], key=["N", "dtype"])
    a = build(64)
    assert build(64) is a                     # same arguments: the same TunedKernel
    b = build(64, dtype="bf16")
    assert b is not a and b.keyvals == {"N": 64, "dtype": "bf16"}
    assert a.keyvals == {"N": 64, "dtype": "f32"}  # defaults are part of the key
    a.choose(FakeArray())
    b.choose(FakeArray())
    assert len(timer.measured) == 4
    assert "build_hold(N=64, dtype=bf16)" in capsys.readouterr().err
    assert build(N=64) is not a and build(N=64).keyvals == a.keyvals


def test_key_values_name_dtypes():
    from pyptx.autotune import _key_value
    from pyptx.types import bf16

    class TorchLike:
        def __str__(self):
            return "torch.bfloat16"

    assert _key_value(bf16) == "bf16" and _key_value(TorchLike()) == "bfloat16"
    assert _key_value((2, "x")) == [2, "x"] and _key_value(None) is None


def test_explicit_config_keywords_bypass_tuning():
    timer = FakeTimer({})
    k = tuned(timer)(64, hold=32)
    assert not isinstance(k, TunedKernel) and k.name == "hold32_r0"
    assert tuned(timer)(64, maxnreg=None).__class__ is TunedKernel  # not a tuned keyword


def test_bad_configs_and_keys_are_refused_at_the_decorator():
    with pytest.raises(AutotuneError, match=r"test_autotune\.py:\d+: autotune key 'M' is not a "
                                            r"parameter of build_hold"):
        autotune(configs=[Config()], key=["M"])(build_hold)
    with pytest.raises(AutotuneError, match=r"Config\(hold=8, threads=2\) sets 'threads', which is "
                                            r"not a parameter"):
        autotune(configs=[Config(hold=8, threads=2)], key=["N"])(build_hold)
    with pytest.raises(AutotuneError, match=r"test_autotune\.py:\d+: autotune\(configs=...\) must "
                                            r"be a non-empty list"):
        autotune(configs=[], key=["N"])
    with pytest.raises(AutotuneError, match="must be a list of parameter names"):
        autotune(configs=[Config()], key="N")
    with pytest.raises(AutotuneError, match=r"test_autotune\.py:\d+: Config\(dtype=\.\.\.\) must be "
                                            r"an int, float, str, bool or None"):
        Config(dtype=f32)
    with pytest.raises(AutotuneError, match="unexpected keyword argument 'nope'"):
        tuned(FakeTimer({}))(64, nope=1)


def test_exported_from_pyptx_without_importing_frameworks():
    import subprocess
    import sys

    code = ("import sys, pyptx; assert 'pyptx.autotune' not in sys.modules; "
            "c = pyptx.Config(threads=2); d = pyptx.autotune(configs=[c], key=[]); "
            "assert callable(d); "
            "bad = [m for m in ('torch', 'jax', 'cuda') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert pyptx.autotune.Config is Config
    assert re.match(r"Config\(threads=2\)", repr(Config(threads=2)))


def test_arguments_no_config_takes_raise_the_builders_own_error():
    timer = FakeTimer({})
    with pytest.raises(ConfigError, match="hold=16 is more than N=8") as e:
        tuned(timer, [Config(hold=16), Config(hold=32)])(8)
    assert not isinstance(e.value, AutotuneError)  # the first config's error, as an untuned call
    k = tuned(timer, [Config(hold=16), Config(hold=4)])(8)  # the first that builds stands in
    assert k.name == "hold4_r0" and timer.measured == []


def test_torch_cpu_tensors_are_not_timed():
    torch = pytest.importorskip("torch")
    from pyptx.autotune import TorchTimer, timer_for

    x = torch.zeros(64)
    assert isinstance(timer_for((x,)), TorchTimer)
    assert timer_for((FakeArray(),)) is None
    assert TorchTimer().device_name((x,)) is None  # nothing to time a CPU tensor on
    k = autotune(configs=[Config(hold=8), Config(hold=16)], key=["N"])(build_hold)(64)
    assert k.choose(x).name == "hold8_r0" and k.choice is None


def test_a_config_building_the_same_kernel_is_timed_once(capsys):
    timer = FakeTimer({"hold8_r0": 2.0, "hold16_r0": 1.0})
    k = tuned(timer, [Config(hold=8), Config(hold=16), Config(hold=8, raw="")])(64)
    assert k.choose(FakeArray()).name == "hold16_r0"
    assert timer.measured == ["hold8_r0", "hold16_r0"]
    assert "1 skipped: hold=8 raw=: same kernel as hold=8)" in capsys.readouterr().err


def test_builder_calls_are_memoised_in_a_bounded_table(monkeypatch):
    import pyptx.autotune as at

    monkeypatch.setattr(at, "MEMO_SIZE", 3)
    build = tuned(FakeTimer({}), [Config(hold=1)])
    first = build(16)
    assert build(16) is first
    for n in (17, 18, 19):
        build(n)
    assert len(build._kernels) == 3 and build(16) is not first


def test_rounds_interleave_configs_and_take_the_median(capsys):
    class DriftingTimer(FakeTimer):
        """Times grow by 1 us per measurement (a GPU heating up over the tuning)."""

        rounds = 3

        def measure(self, k, args, kwargs):
            self.measured.append(k.name)
            return self.times[k.name] + len(self.measured)

    timer = DriftingTimer({"hold8_r0": 5.0, "hold16_r0": 2.0, "hold32_r0": 4.0})
    k = tuned(timer)(64)
    assert k.choose(FakeArray()).name == "hold16_r0"
    assert timer.measured == ["hold8_r0", "hold16_r0", "hold32_r0"] * 3
    assert k.choice.us == 2.0 + 5  # its second-round time: the median of 2+2, 2+5, 2+8
    capsys.readouterr()


def test_switch_reads_the_environment_at_every_call(monkeypatch):
    """The cheap read of ``PYPTX_AUTOTUNE`` follows every change of the variable."""
    monkeypatch.delenv("PYPTX_AUTOTUNE", raising=False)
    assert mode() == "plan"
    for value, want in ((" OFF ", "off"), ("1", "tune"), ("no", "off"), ("", "plan"),
                        ("0", "off"), ("Yes", "tune"), ("auto", "plan")):
        monkeypatch.setenv("PYPTX_AUTOTUNE", value)
        assert mode() == want, value
        with tuning("table"):
            assert mode() == "table"
    monkeypatch.delenv("PYPTX_AUTOTUNE")
    assert mode() == "plan"


def test_set_timer_replaces_a_runtimes_timer():
    import pyptx.autotune as at

    class Rt:
        name = "fake-rt"

    timer = FakeTimer({})
    at.set_timer("fake-rt", timer)
    try:
        assert at._timer_cache["fake-rt"] is timer
    finally:
        at.set_timer("fake-rt", None)
    assert "fake-rt" not in at._timer_cache


def test_tuning_reaches_other_threads_and_nests(monkeypatch):
    """A CUDA backward runs on autograd's own thread: ``tuning()`` holds process-wide."""
    import threading

    monkeypatch.delenv("PYPTX_AUTOTUNE")
    seen = []
    with tuning():
        t = threading.Thread(target=lambda: seen.append(mode()))
        t.start()
        t.join()
        with tuning("table"):
            seen.append(mode())
        seen.append(mode())
    seen.append(mode())
    assert seen == ["tune", "table", "tune", "plan"]
