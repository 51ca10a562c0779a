"""Compile ``pyptx_torch._fastpath`` (``csrc/fastpath.cpp``) against the installed torch.

The extension is ABI-specific to one torch build, so it is compiled where that
torch is installed: by the package's hatch build hook when torch (a CUDA
build) is importable during the build (``pip install --no-build-isolation``),
or once per environment with::

    python -m pyptx_torch.fastpath_build

Never at import or first launch. Without it every launch takes the Python
path (correct, a few microseconds slower per call).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

__all__ = ["unbuildable_reason", "build", "extension_path"]

SOURCE = Path(__file__).resolve().parent / "csrc" / "fastpath.cpp"


def extension_path(dest: Path | None = None) -> Path:
    """Where the compiled module goes (next to this file unless ``dest``)."""
    dest = Path(dest) if dest is not None else SOURCE.parent.parent
    return dest / ("_fastpath" + sysconfig.get_config_var("EXT_SUFFIX"))


def _cuda_include(torch_dir: Path) -> Path | None:
    """A directory holding ``cuda_runtime_api.h`` (c10's CUDA headers include it)."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parent.parent))
    roots.append("/usr/local/cuda")
    cands = [Path(r) / "include" for r in roots if r]
    site = torch_dir.parent / "nvidia"
    cands += [site / "cuda_runtime" / "include", *sorted(site.glob("cu*/include"))]
    return next((c for c in cands if (c / "cuda_runtime_api.h").is_file()), None)


def _plan() -> tuple[list[str] | None, str | None]:
    """(compiler command, None) or (None, why it cannot be built here)."""
    try:
        import torch
    except ImportError:
        return None, "torch is not importable"
    if torch.version.cuda is None:
        return None, f"torch {torch.__version__} is a CPU build"
    torch_dir = Path(torch.__file__).resolve().parent
    inc, lib = torch_dir / "include", torch_dir / "lib"
    if not (inc / "c10" / "cuda" / "CUDAStream.h").is_file():
        return None, f"torch's C++ headers are missing under {inc}"
    cuda_inc = _cuda_include(torch_dir)
    if cuda_inc is None:
        return None, "no CUDA headers (cuda_runtime_api.h) found: set CUDA_HOME"
    cxx = shlex.split(os.environ.get("CXX", "g++"))
    if shutil.which(cxx[0]) is None:
        return None, f"no C++ compiler {cxx[0]!r} (set CXX)"
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    cmd = [*cxx, "-O2", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden",
           f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f'-DPYPTX_TORCH_VERSION="{torch.__version__}"',
           f"-I{inc}", f"-I{inc / 'torch' / 'csrc' / 'api' / 'include'}", f"-I{cuda_inc}",
           f"-I{sysconfig.get_paths()['include']}", str(SOURCE),
           f"-L{lib}", "-lc10", "-lc10_cuda", "-ltorch", "-ltorch_cpu", "-ltorch_python",
           f"-Wl,-rpath,{lib}"]
    return cmd, None


def unbuildable_reason() -> str | None:
    """Why the extension cannot be compiled in this environment, or None if it can."""
    return _plan()[1]


def build(dest: Path | None = None, *, quiet: bool = False) -> Path:
    """Compile the extension into ``dest`` (default: the installed package); return its path.

    Raises ``RuntimeError`` naming the reason when this environment cannot build it.
    """
    cmd, why = _plan()
    if cmd is None:
        raise RuntimeError(f"cannot build pyptx_torch._fastpath: {why}")
    out = extension_path(dest)
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    if not quiet:
        print(" ".join(cmd + ["-o", str(out)]), flush=True)
    subprocess.run([*cmd, "-o", str(tmp)], check=True)
    os.replace(tmp, out)
    return out


if __name__ == "__main__":
    try:
        print(f"built {build()}")
    except (RuntimeError, subprocess.CalledProcessError) as e:
        sys.exit(str(e))
