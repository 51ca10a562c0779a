"""Hatch build hook: compile the C++ launcher (``src/pyptx_shim/csrc/*.cpp``) into the
``pyptx_shim._shim`` extension.

Needs only a C++17 compiler and the Python headers; no CUDA toolkit (the
driver is opened at run time). When jaxlib is importable at build time
(``pip install --no-build-isolation`` beside JAX), the XLA FFI handler is
compiled against the FFI C API header jaxlib ships; otherwise against the
shim's own copy of the few declarations it needs. The module lands next to
the sources, so both wheels and editable installs carry it. Set ``CXX`` to
pick the compiler.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sysconfig
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def jaxlib_ffi_include() -> Path | None:
    """jaxlib's include directory holding ``xla/ffi/api/c_api.h`` (without importing jax)."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        inc = Path(root) / "include"
        if (inc / "xla" / "ffi" / "api" / "c_api.h").is_file():
            return inc
    return None


def compile_command(sources: list[Path], out: Path, ffi_include: Path | None) -> list[str]:
    """The compiler command that builds ``out`` from ``sources``."""
    cxx = shlex.split(os.environ.get("CXX", "g++"))
    cmd = [*cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
           f"-I{sysconfig.get_paths()['include']}"]
    if ffi_include is not None:
        cmd.append(f"-I{ffi_include}")
    return [*cmd, *map(str, sources), "-o", str(out), "-ldl"]


class ShimBuildHook(BuildHookInterface):
    """Builds ``src/pyptx_shim/_shim<EXT_SUFFIX>`` and marks the wheel platform-specific."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        pkg = Path(self.root) / "src" / "pyptx_shim"
        out = pkg / ("_shim" + sysconfig.get_config_var("EXT_SUFFIX"))
        csrc = pkg / "csrc"
        sources = sorted(csrc.glob("*.cpp"))
        newest = max(p.stat().st_mtime for p in csrc.iterdir())
        if not out.exists() or out.stat().st_mtime < newest:
            ffi_include = jaxlib_ffi_include()
            cmd = compile_command(sources, out, ffi_include)
            self.app.display_info(" ".join(cmd))
            try:
                subprocess.run(cmd, check=True)
            except subprocess.CalledProcessError:
                if ffi_include is None:
                    raise
                # A jaxlib whose FFI header the handler does not build against: use the copy.
                self.app.display_warning(f"pyptx-shim: building against {ffi_include} failed; "
                                         "building with the shim's own FFI declarations")
                cmd = compile_command(sources, out, None)
                self.app.display_info(" ".join(cmd))
                subprocess.run(cmd, check=True)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["artifacts"].append(str(out.relative_to(self.root)))
