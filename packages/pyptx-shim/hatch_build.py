"""Hatch build hook: compile the C++ launcher into the ``pyptx_shim._shim`` extension.

Needs only a C++17 compiler and the Python headers; no CUDA toolkit (the
driver is opened at run time). The module lands next to the sources, so both
wheels and editable installs carry it. Set ``CXX`` to pick the compiler.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sysconfig
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class ShimBuildHook(BuildHookInterface):
    """Builds ``src/pyptx_shim/_shim<EXT_SUFFIX>`` and marks the wheel platform-specific."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        pkg = Path(self.root) / "src" / "pyptx_shim"
        out = pkg / ("_shim" + sysconfig.get_config_var("EXT_SUFFIX"))
        src = pkg / "shim.cpp"
        if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
            cxx = shlex.split(os.environ.get("CXX", "g++"))
            cmd = [*cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
                   f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(out), "-ldl"]
            self.app.display_info(" ".join(cmd))
            subprocess.run(cmd, check=True)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["artifacts"].append(str(out.relative_to(self.root)))
