"""``pyptx.jit.compiler``: which compiler turns PTX into a cubin (CPU, drivers faked)."""

from __future__ import annotations

import pytest

from pyptx import driver, jit, ptxas


@pytest.fixture
def fake(monkeypatch):
    """Set the driver's CUDA version and the found ptxas's release."""
    state = {}
    monkeypatch.setattr(driver, "driver_version", lambda: state["driver"])
    monkeypatch.setattr(ptxas, "find_ptxas", lambda: state.get("path"))
    monkeypatch.setattr(ptxas, "ptxas_version", lambda path: state["ptxas"])
    monkeypatch.setattr(jit, "_compilers", {})

    def set_(drv, path=None, version=None):
        jit._compilers.clear()
        state.update(driver=drv, path=path, ptxas=version)
    return set_


@pytest.mark.parametrize("drv,version,expected", [
    (13000, "13.0.88", True),     # same release as the driver
    (13010, "12.8.93", True),     # older ptxas: its cubins load on a newer driver
    (12080, "13.0.88", False),    # newer ptxas: its cubin might not load; the driver compiles
    (13000, "13.1.20", False),
])
def test_ptxas_is_used_when_no_newer_than_the_driver(fake, drv, version, expected):
    fake(drv, "/opt/cuda/bin/ptxas", version)
    assert (jit.compiler() == ("/opt/cuda/bin/ptxas", version)) is expected
    if not expected:
        assert jit.compiler() is None


def test_no_ptxas_means_the_driver_compiles(fake):
    fake(13000)
    assert jit.compiler() is None


def test_the_choice_follows_pyptx_ptxas(fake, monkeypatch):
    fake(13000, "/opt/cuda/bin/ptxas", "13.0.88")
    assert jit.compiler() is not None
    monkeypatch.setenv("PYPTX_PTXAS", "/nowhere/ptxas")
    monkeypatch.setattr(ptxas, "find_ptxas", lambda: None)
    assert jit.compiler() is None


def test_a_ptxas_too_old_for_the_ptx_leaves_it_to_the_driver(fake, monkeypatch, tmp_path):
    from pyptx import CompileError

    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    fake(13000, "/opt/cuda/bin/ptxas", "12.4.99")

    def too_old(ptx, arch, locs=None):
        raise CompileError("kernel.ptx, line 5; fatal   : Unsupported .version 8.7; "
                           "current version is '8.4'")
    monkeypatch.setattr(ptxas, "assemble", too_old)
    assert jit.cubin_for(".version 8.7\n", "sm_90a", "k") is None

    def wrong(ptx, arch, locs=None):
        raise CompileError("kernel.ptx, line 9; error   : Unknown symbol 'x'")
    monkeypatch.setattr(ptxas, "assemble", wrong)
    with pytest.raises(CompileError, match="Unknown symbol"):
        jit.cubin_for(".version 8.0\n", "sm_90a", "k")


def test_plain_targets_are_assembled_for_the_running_device(monkeypatch):
    """SASS is not forward compatible: sm_80 PTX on an sm_90 device is assembled for sm_90;
    arch-specific targets (``sm_90a``) and targets the device matches stay as written."""
    from pyptx import driver, jit

    monkeypatch.setattr(driver, "cuda", lambda: object())
    monkeypatch.setattr(driver, "device_capability", lambda ordinal: (9, 0))
    monkeypatch.setattr("pyptx.arch._current_ordinal", lambda drv: 0)
    assert jit.machine_arch("sm_80") == "sm_90"
    assert jit.machine_arch("sm_90a") == "sm_90a"
    assert jit.machine_arch("sm_90") == "sm_90"
    assert jit.machine_arch("sm_100a") == "sm_100a"


def test_two_threads_assembling_one_ptx_run_ptxas_once(monkeypatch, tmp_path):
    import threading
    import time
    from types import SimpleNamespace

    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(jit, "compiler", lambda: ("ptxas", "13.0"))
    monkeypatch.setattr(jit, "machine_arch", lambda arch: arch)
    calls = []

    def slow_assemble(text, arch, locs=None):
        calls.append(arch)
        time.sleep(0.2)
        return SimpleNamespace(cubin=b"cubin of " + text.encode())

    monkeypatch.setattr(ptxas, "assemble", slow_assemble)
    got = []
    threads = [threading.Thread(target=lambda: got.append(jit.cubin_for("ptx", "sm_90a", "k")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["sm_90a"] and got == [b"cubin of ptx"] * 3


def test_the_ptxas_release_is_kept_on_disk(monkeypatch, tmp_path):
    exe = tmp_path / "ptxas"
    exe.write_text("#!/bin/sh\n")
    calls = []
    monkeypatch.setattr(ptxas, "ptxas_version", lambda path: calls.append(path) or "13.0.88")
    monkeypatch.setenv("PYPTX_CACHE_DIR", str(tmp_path / "cache"))
    assert jit._version_of(ptxas, str(exe)) == "13.0.88"
    assert jit._version_of(ptxas, str(exe)) == "13.0.88"   # a new process: no ptxas run
    assert len(calls) == 1
    exe.write_text("#!/bin/sh\n# another release\n")       # replaced: asked again
    assert jit._version_of(ptxas, str(exe)) == "13.0.88"
    assert len(calls) == 2
    assert jit._version_of(ptxas, str(tmp_path / "missing")) == "13.0.88"
    assert len(calls) == 3
