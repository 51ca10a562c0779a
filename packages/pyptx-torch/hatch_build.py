"""Hatch build hook: compile ``pyptx_torch._fastpath`` when a CUDA torch is importable.

``PYPTX_TORCH_FASTPATH``: ``auto`` (default) builds when it can and otherwise
leaves a pure-Python wheel; ``1`` fails the build if it cannot; ``0`` skips it.
Torch is importable during the build with ``pip install --no-build-isolation``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class FastpathBuildHook(BuildHookInterface):
    """Builds ``src/pyptx_torch/_fastpath<EXT_SUFFIX>`` next to the sources."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        mode = os.environ.get("PYPTX_TORCH_FASTPATH", "auto")
        if self.target_name != "wheel" or mode == "0":
            return
        path = Path(self.root) / "src" / "pyptx_torch" / "fastpath_build.py"
        spec = importlib.util.spec_from_file_location("_pyptx_fastpath_build", path)
        fb = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fb)
        why = fb.unbuildable_reason()
        if why is not None:
            if mode == "1":
                raise RuntimeError(f"PYPTX_TORCH_FASTPATH=1 but the fast path cannot be built: {why}")
            self.app.display_info(f"pyptx-torch: C++ fast path not built ({why})")
            return
        try:
            out = fb.build()  # always: a module left from another torch would not load
        except Exception as e:  # noqa: BLE001 - a compiler error must not fail an auto build
            if mode == "1":
                raise
            self.app.display_warning(f"pyptx-torch: C++ fast path failed to compile ({e}); "
                                     "the wheel stays pure Python")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["artifacts"].append(str(out.relative_to(self.root)))
