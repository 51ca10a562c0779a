"""The ptxas toolchain: find it, run it on emitted PTX, read its resource report.

``assemble`` runs ``ptxas -v`` and returns each entry's registers, shared
memory, spills and stack frame plus the cubin. When ptxas rejects the PTX, the
``CompileError`` points every error at the Python ``file:line`` that emitted
the offending PTX line.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._lazyre import LazyRe
from .errors import CompileError, ToolchainError
from .source import Loc, fmt_loc

if TYPE_CHECKING:
    from ._ptxas_report import EntryResources, PtxasReport
    from .kernel import Specialization

__all__ = ["EntryResources", "PtxasReport", "find_ptxas", "ptxas_version", "assemble", "check",
           "parse_resources", "INSTALL_HINT"]

ENV_VAR = "PYPTX_PTXAS"
INSTALL_HINT = 'pip install "pyptx-core[ptxas]"'
TIMEOUT_S = 600
_CUDA_ROOTS = ("CUDA_HOME", "CUDA_PATH")
_DEFAULT_CUDA = "/usr/local/cuda"
_WHEEL_BIN = os.path.join("cu13", "bin", "ptxas")

_COMPILING = LazyRe(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPERTIES = LazyRe(r"Function properties for (\S+)")
_FRAME = LazyRe(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = LazyRe(r"Used (\d+) registers")
_BARRIERS = LazyRe(r"used (\d+) barriers")
_SMEM = LazyRe(r"(\d+) bytes smem")
_CMEM = LazyRe(r"(\d+) bytes cmem\[(\d+)\]")
_LINE_MSG = LazyRe(r"^ptxas (.+?), line (\d+); (error|warning)\s*: (.*)$")
_PLAIN_MSG = LazyRe(r"^ptxas (fatal|error|warning)\s*: (.*)$")
_WARNING = LazyRe(r"^ptxas\b.*\bwarning\s*:")
_ENTRY = LazyRe(r"\.entry\s+([\w$]+)")
_ABORTED = "Ptx assembly aborted due to errors"


def _report():
    from . import _ptxas_report

    return _ptxas_report


def _executable(path: str | None) -> str | None:
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return os.path.abspath(path)
    return None


def _wheel_candidates() -> list[str]:
    dirs: list[str] = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        dirs.extend(spec.submodule_search_locations)
    paths = sysconfig.get_paths()
    dirs.extend(os.path.join(paths[k], "nvidia") for k in ("purelib", "platlib") if k in paths)
    return [os.path.join(d, _WHEEL_BIN) for d in dict.fromkeys(dirs)]


def find_ptxas() -> str | None:
    """Path of an executable ptxas, or None.

    ``$PYPTX_PTXAS`` decides alone when set (a path or a command name);
    otherwise PATH, ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin``, ``/usr/local/cuda/bin``,
    then the ``nvidia-cuda-nvcc`` wheel (``nvidia/cu13/bin/ptxas``).
    """
    forced = os.environ.get(ENV_VAR)
    if forced:
        return _executable(shutil.which(forced) or forced)
    hit = shutil.which("ptxas")
    if hit:
        return os.path.abspath(hit)
    roots = [os.environ.get(v) for v in _CUDA_ROOTS] + [_DEFAULT_CUDA]
    for root in roots:
        hit = _executable(os.path.join(root, "bin", "ptxas")) if root else None
        if hit:
            return hit
    for cand in _wheel_candidates():
        hit = _executable(cand)
        if hit:
            return hit
    return None


def _require_ptxas() -> str:
    path = find_ptxas()
    if path is not None:
        return path
    forced = os.environ.get(ENV_VAR)
    if forced:
        raise ToolchainError(f"${ENV_VAR}={forced!r} is not an executable ptxas")
    raise ToolchainError(
        "ptxas not found (looked in $PYPTX_PTXAS, PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, "
        f"/usr/local/cuda/bin and the nvidia-cuda-nvcc wheel); install it with {INSTALL_HINT}"
    )


def _run(cmd: list[str], cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=TIMEOUT_S)
    except OSError as e:
        raise ToolchainError(f"could not run {cmd[0]}: {e}") from e
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"{cmd[0]} did not finish within {TIMEOUT_S} s") from None


def ptxas_version(path: str) -> str:
    """The release of the ptxas at ``path``, e.g. ``"13.0.88"``."""
    p = _run([path, "--version"])
    m = re.search(r"release [\d.]+, V([\d.]+)", p.stdout)
    if p.returncode != 0 or m is None:
        raise ToolchainError(f"{path} --version failed: {(p.stdout + p.stderr).strip()!r}")
    return m.group(1)


def parse_resources(log: str) -> tuple[EntryResources, ...]:
    """Per-entry resources from ``ptxas -v`` output (entries in the order compiled)."""
    entries: dict[str, dict] = {}
    frames: dict[str, tuple[int, int, int]] = {}
    current: dict | None = None
    props: str | None = None
    for line in log.splitlines():
        if m := _COMPILING.search(line):
            current = entries[m.group(1)] = {"name": m.group(1), "arch": m.group(2)}
        elif m := _PROPERTIES.search(line):
            props = m.group(1)
        elif (m := _FRAME.search(line)) and props is not None:
            frames[props] = tuple(int(g) for g in m.groups())  # type: ignore[assignment]
            props = None
        elif (m := _USED.search(line)) and current is not None:
            barriers, smem = _BARRIERS.search(line), _SMEM.search(line)
            current.update(
                registers=int(m.group(1)),
                barriers=int(barriers.group(1)) if barriers else 0,
                smem=int(smem.group(1)) if smem else 0,
                cmem={int(b): int(n) for n, b in _CMEM.findall(line)},
            )
            current = None
    out = []
    for name, e in entries.items():
        stack, stores, loads = frames.get(name, (0, 0, 0))
        out.append(_report().EntryResources(
            name=name, arch=e["arch"], registers=e.get("registers", 0),
            barriers=e.get("barriers", 0), smem=e.get("smem", 0), stack=stack,
            spill_stores=stores, spill_loads=loads, cmem=e.get("cmem", {}),
        ))
    return tuple(out)


def _rejection(log: str, ptx_lines: list[str], locs: Sequence[Loc | None] | None,
               arch: str) -> CompileError:
    items = []
    for raw in log.splitlines():
        if m := _LINE_MSG.match(raw):
            if m.group(3) != "error":
                continue
            n = int(m.group(2))
            loc = locs[n - 1] if locs is not None and 0 < n <= len(locs) else None
            text = ptx_lines[n - 1].strip() if 0 < n <= len(ptx_lines) else "?"
            head = f"{fmt_loc(loc)}: " if loc is not None else ""
            items.append(f"{head}ptxas error: {m.group(4).strip()}\n    PTX line {n}: {text}")
        elif (m := _PLAIN_MSG.match(raw)) and m.group(1) != "warning":
            if m.group(2).strip() != _ABORTED:
                items.append(f"ptxas {m.group(1)}: {m.group(2).strip()}")
    if not items:
        items.append(log.strip() or "ptxas exited with an error and printed nothing")
    names = ", ".join(_ENTRY.findall("\n".join(ptx_lines))) or "?"
    return CompileError(f"ptxas rejected the PTX of {names} for {arch}:\n" + "\n".join(items))


_OPTION_PROBLEM = LazyRe(r"ptxas fatal\s*:\s*(Unknown option[^\n]*|Value [^\n]* is not "
                         r"defined for option[^\n]*)")


def _require_working(exe: str, returncode: int, log: str) -> None:
    """``ToolchainError`` if ``exe``, which failed without a ptxas diagnostic, is not a working
    ptxas (``--version`` fails): a broken ``$PYPTX_PTXAS`` is not a rejection of the PTX."""
    try:
        ptxas_version(exe)
    except ToolchainError as e:
        raise ToolchainError(
            f"{exe} exited {returncode} without a ptxas diagnostic ({log.strip()[:200]!r}) and "
            f"is not a working ptxas: {e}; expected ${ENV_VAR} or PATH to name CUDA's ptxas"
        ) from None


def assemble(ptx: str, arch: str, *, locs: Sequence[Loc | None] | None = None,
             extra_args: Sequence[str] = ()) -> PtxasReport:
    """Assemble ``ptx`` with ``ptxas -v --gpu-name arch``; return the resources and cubin.

    ``locs`` (from ``Specialization.emit()``) maps PTX line i+1 to the Python
    ``(file, line)`` that emitted it; rejections then name those lines.
    Raises ``CompileError`` if ptxas rejects the PTX, ``ToolchainError`` if
    there is no ptxas to run.
    """
    exe = _require_ptxas()
    with tempfile.TemporaryDirectory(prefix="pyptx-") as d:
        with open(os.path.join(d, "kernel.ptx"), "w") as f:
            f.write(ptx)
        p = _run([exe, "-v", "--gpu-name", arch, *extra_args, "kernel.ptx", "-o", "kernel.cubin"],
                 cwd=d)
        log = p.stderr + p.stdout
        if p.returncode != 0:
            if not any(_LINE_MSG.match(ln) or _PLAIN_MSG.match(ln) for ln in log.splitlines()):
                _require_working(exe, p.returncode, log)
            if m := _OPTION_PROBLEM.search(log):
                raise ToolchainError(
                    f"{exe} refused its command line, not the PTX ({m.group(0).strip()}): "
                    f"expected a ptxas that knows --gpu-name {arch} (CUDA 12.8+ for sm_100a); "
                    f"set ${ENV_VAR} or PATH to a newer CUDA's ptxas")
            raise _rejection(log, ptx.splitlines(), locs, arch)
        try:
            with open(os.path.join(d, "kernel.cubin"), "rb") as f:
                cubin = f.read()
        except OSError:
            cubin = b""
        if not cubin:
            raise ToolchainError(
                f"{exe} exited 0 but wrote no cubin (expected kernel.cubin from "
                f"'-o kernel.cubin'); is ${ENV_VAR} or PATH pointing at a real ptxas? "
                f"output: {log.strip()[:200]!r}"
            )
    warnings = tuple(ln for ln in log.splitlines() if _WARNING.match(ln))
    return _report().PtxasReport(arch=arch, entries=parse_resources(log), warnings=warnings, log=log,
                       cubin=cubin, ptxas=exe)


def check(spec: Specialization, *, lineinfo: bool = False,
          extra_args: Sequence[str] = ()) -> PtxasReport:
    """Assemble one specialization for its kernel's arch, mapping errors to Python lines."""
    text, locs = spec.emit(lineinfo)
    return assemble(text, spec.arch, locs=locs, extra_args=extra_args)


def __getattr__(name: str):
    # The report classes are made at their first use: a process that only finds ptxas and
    # reads its release (a launch from the disk cache) creates no dataclass for them.
    if name in ("EntryResources", "PtxasReport"):
        from . import _ptxas_report

        return getattr(_ptxas_report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
