"""pyptx.ptxas: finding ptxas, the -v resource report, and errors mapped to Python lines."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from pyptx import CompileError, Tile, ToolchainError, kernel, ptx, reg, smem
from pyptx import ptxas as toolchain
from pyptx.types import f32, u32, u64

LOG_CUDA12 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for helper
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'first' for 'sm_90a'
ptxas info    : Function properties for first
    16 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 368 bytes cmem[0], 4 bytes cmem[2]
ptxas info    : Compiling entry function 'second' for 'sm_80'
ptxas info    : Function properties for second
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, 356 bytes cmem[0]
"""


def scale_kernel(block: int = 128):
    @kernel([Tile("N", f32)], [Tile("N", f32)], block=(block, 1, 1))
    def scale(x, y, *, alpha=2.0):
        px, py = ptx.global_ptrs(x, y)
        i = reg.from_(ptx.special.tid.x(), u64)
        v = reg.scalar(f32)
        ptx.inst.ld.global_.f32(v, ptx.addr(px + i * 4))
        v *= alpha
        buf = smem.alloc(f32, (block,))
        ptx.inst.st.shared.f32(ptx.addr(buf), v)
        ptx.bar_sync(0)
        ptx.inst.st.global_.f32(ptx.addr(py + i * 4), v)

    return scale


BAD_LINES: list[int] = []


@kernel([Tile(4, f32)], [Tile(4, f32)])
def rejected(x, y):
    BAD_LINES.append(sys._getframe().f_lineno + 1)
    ptx.inst.mov.u32(reg.scalar(u32), "%nosuchreg")   # text operands pass the table


def test_parse_resources_reads_every_field_of_each_entry():
    first, second = toolchain.parse_resources(LOG_CUDA12)
    assert first == toolchain.EntryResources(
        name="first", arch="sm_90a", registers=40, barriers=1, smem=1024, stack=16,
        spill_stores=4, spill_loads=8, cmem={0: 368, 2: 4})
    assert (second.name, second.arch, second.registers, second.barriers, second.smem) == (
        "second", "sm_80", 8, 0, 0)
    assert second.cmem == {0: 356} and second.stack == 0


def test_assemble_reports_a_real_kernel(ptxas_path):
    spec = scale_kernel(256).specialize(N=1024)
    report = toolchain.check(spec)
    (entry,) = report.entries
    assert entry.name == "scale" and entry.arch == "sm_90a" == report.arch
    assert entry.smem == 256 * 4
    assert entry.barriers == 1
    assert 4 <= entry.registers <= 64
    assert (entry.stack, entry.spill_stores, entry.spill_loads) == (0, 0, 0)
    assert report.cubin.startswith(b"\x7fELF")
    assert "Compiling entry function 'scale'" in report.log
    assert report.entry("scale") is entry
    with pytest.raises(KeyError, match="scale"):
        report.entry("missing")


def test_assemble_reports_spills_and_passes_extra_args(ptxas_path):
    @kernel([Tile(64, f32)], [Tile(1, f32)], block=(1024, 1, 1))
    def spill(x, y):
        px, py = ptx.global_ptrs(x, y)
        v = reg.array(f32, 64)
        for i in range(64):
            ptx.inst.ld.volatile.global_.f32(v[i], ptx.addr(px, 4 * i))
        acc = reg.scalar(f32, 0.0)
        for i in range(64):
            ptx.inst.fma.rn.f32(acc, v[i], v[63 - i], acc)
        ptx.inst.st.global_.f32(ptx.addr(py), acc)

    report = toolchain.check(spill.specialize(), extra_args=("--warn-on-spills",))
    (entry,) = report.entries
    assert entry.registers <= 64
    assert entry.spill_stores > 0 and entry.spill_loads > 0 and entry.stack > 0
    assert any("spilled" in w for w in report.warnings)


def test_check_uses_the_kernels_arch(ptxas_path):
    @kernel([Tile(1, f32)], [], arch="sm_80")
    def old(x):
        ptx.ret()

    report = toolchain.check(old.specialize())
    assert report.arch == "sm_80" and report.entries[0].arch == "sm_80"


def test_assemble_lists_several_entries(ptxas_path):
    text = (".version 8.0\n.target sm_90a\n.address_size 64\n"
            ".visible .entry one() { ret; }\n.visible .entry two() { ret; }\n")
    report = toolchain.assemble(text, "sm_90a")
    assert sorted(e.name for e in report.entries) == ["one", "two"]


def test_rejection_names_the_python_line_and_the_ptx_line(ptxas_path):
    spec = rejected.specialize()
    text, _ = spec.emit()
    with pytest.raises(CompileError) as exc:
        toolchain.check(spec)
    msg = str(exc.value)
    assert f"{__file__}:{BAD_LINES[-1]}: ptxas error:" in msg
    ptx_line = next(i for i, ln in enumerate(text.splitlines(), 1) if "%nosuchreg" in ln)
    assert f"PTX line {ptx_line}: mov.u32 %r0, %nosuchreg;" in msg
    assert "rejected" in msg and "sm_90a" in msg
    assert "aborted due to errors" not in msg


def test_rejection_without_locs_still_shows_the_ptx_line(ptxas_path):
    with pytest.raises(CompileError) as exc:
        toolchain.assemble(rejected.ptx(), "sm_90a")
    msg = str(exc.value)
    assert "PTX line" in msg and "%nosuchreg" in msg
    assert os.path.basename(__file__) not in msg


def test_rejection_lists_fatal_errors_without_a_line(ptxas_path):
    with pytest.raises(CompileError, match="ptxas fatal: .*SM version"):
        toolchain.assemble(scale_kernel().ptx(N=4), "sm_80")


def test_no_ptxas_raises_toolchain_error_naming_the_extra(monkeypatch):
    monkeypatch.setattr(toolchain, "find_ptxas", lambda: None)
    monkeypatch.delenv("PYPTX_PTXAS", raising=False)
    with pytest.raises(ToolchainError, match=r'pip install "pyptx-core\[ptxas\]"'):
        toolchain.check(scale_kernel().specialize(N=4))


def _fake_ptxas(path, executable=True):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    if executable:
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def bare_env(monkeypatch, tmp_path):
    """No ptxas on PATH, in CUDA_HOME/CUDA_PATH, /usr/local/cuda or site-packages."""
    for var in ("PYPTX_PTXAS", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(toolchain, "_DEFAULT_CUDA", str(tmp_path / "no-cuda"))
    monkeypatch.setattr(toolchain.sysconfig, "get_paths", lambda: {})
    monkeypatch.setattr(toolchain.importlib.util, "find_spec", lambda name: None)
    return monkeypatch


def test_find_ptxas_returns_none_when_absent(bare_env):
    assert toolchain.find_ptxas() is None


def test_find_ptxas_env_var_wins_and_is_checked(bare_env, tmp_path):
    exe = _fake_ptxas(tmp_path / "mine" / "ptxas")
    bare_env.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    _fake_ptxas(tmp_path / "cuda" / "bin" / "ptxas")
    bare_env.setenv("PYPTX_PTXAS", exe)
    assert toolchain.find_ptxas() == exe
    assert toolchain.ptxas_version(exe) == "13.0.88"
    bare_env.setenv("PYPTX_PTXAS", _fake_ptxas(tmp_path / "noexec" / "ptxas", executable=False))
    assert toolchain.find_ptxas() is None
    with pytest.raises(ToolchainError, match="PYPTX_PTXAS"):
        toolchain.assemble("", "sm_90a")


def test_find_ptxas_search_order(bare_env, tmp_path):
    _fake_ptxas(tmp_path / "cuda_path" / "bin" / "ptxas", executable=False)
    bare_env.setenv("CUDA_PATH", str(tmp_path / "cuda_path"))
    assert toolchain.find_ptxas() is None
    exe = _fake_ptxas(tmp_path / "cuda_home" / "bin" / "ptxas")
    bare_env.setenv("CUDA_HOME", str(tmp_path / "cuda_home"))
    assert toolchain.find_ptxas() == exe
    on_path = _fake_ptxas(tmp_path / "path" / "ptxas")
    bare_env.setenv("PATH", str(tmp_path / "path"))
    assert toolchain.find_ptxas() == on_path


def test_find_ptxas_in_the_nvcc_wheel(bare_env, tmp_path):
    site = tmp_path / "site-packages"
    exe = _fake_ptxas(site / "nvidia" / "cu13" / "bin" / "ptxas")
    bare_env.setattr(toolchain.sysconfig, "get_paths", lambda: {"purelib": str(site)})
    assert toolchain.find_ptxas() == exe


def test_find_ptxas_through_the_nvidia_namespace_package(bare_env, tmp_path):
    class Spec:
        submodule_search_locations = [str(tmp_path / "elsewhere" / "nvidia")]

    exe = _fake_ptxas(tmp_path / "elsewhere" / "nvidia" / "cu13" / "bin" / "ptxas")
    bare_env.setattr(toolchain.importlib.util, "find_spec",
                     lambda name: Spec() if name == "nvidia" else None)
    assert toolchain.find_ptxas() == exe


def test_ptxas_version_of_the_real_ptxas(ptxas_path):
    assert toolchain.ptxas_version(ptxas_path).split(".")[0].isdigit()


def test_ptxas_version_failure_is_a_toolchain_error(tmp_path):
    with pytest.raises(ToolchainError, match="could not run"):
        toolchain.ptxas_version(str(tmp_path / "missing"))


@pytest.mark.parametrize("complaint", [
    "ptxas fatal   : Value 'sm_100a' is not defined for option 'gpu-name'",
    "ptxas fatal   : Unknown option '-v'"])
def test_a_ptxas_refusing_its_command_line_is_a_toolchain_error(monkeypatch, tmp_path, complaint):
    exe = tmp_path / "ptxas"
    exe.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Cuda compilation tools, "
                   f"release 12.0, V12.0.1'; exit 0; fi\necho \"{complaint}\" >&2\nexit 1\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PYPTX_PTXAS", str(exe))
    with pytest.raises(ToolchainError, match=r"refused its command line, not the PTX"):
        toolchain.assemble(scale_kernel().ptx(N=4), "sm_100a")
