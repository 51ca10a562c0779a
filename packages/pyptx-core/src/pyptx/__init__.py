"""pyptx: write PTX from Python, one call per instruction.

``@kernel`` turns a Python function into a PTX kernel; inside it, ``reg``,
``smem`` and ``ptx`` append instructions to the trace. ``Kernel.ptx()`` prints
the PTX without a GPU; calling the kernel on torch tensors or jax arrays
launches it through a runtime plugin.

The tracing layer (``ptx``, ``reg``, ``smem``) is imported at its first use: a process that
launches kernels whose code is already traced (a warm disk cache) never loads it.
"""

from . import types
from .arch import detect_arch
from .errors import (
    CompileError,
    ConfigError,
    LaunchError,
    OperandError,
    PyptxError,
    RegisterScopeError,
    RuntimeUnavailableError,
    ShapeError,
    SpecError,
    ToolchainError,
    TraceError,
    TypeMismatchError,
    UnboundDimError,
)
from .kernel import Kernel, Specialization, kernel
from .specs import Dim, Layout, Tile

__version__ = "0.1.0"

__all__ = [
    "kernel", "Kernel", "Specialization", "Tile", "Layout", "Dim", "ptx", "reg", "smem",
    "detect_arch",
    "types", "differentiable_kernel", "PyptxError", "SpecError", "ShapeError",
    "UnboundDimError", "ConfigError", "TraceError", "OperandError", "TypeMismatchError",
    "RegisterScopeError", "CompileError", "ToolchainError", "RuntimeUnavailableError",
    "LaunchError", "__version__", "autotune", "Config",
]


_TRACING = ("ptx", "reg", "smem")


def __getattr__(name: str):
    if name in _TRACING:  # submodules: importing one binds it here
        import importlib

        return importlib.import_module(f".{name}", __name__)
    if name == "differentiable_kernel":  # one object for every runtime (pyptx.autodiff)
        from .autodiff import differentiable_kernel

        return differentiable_kernel
    if name in ("autotune", "Config"):  # imported on first use: import pyptx stays cheap
        import importlib

        module = importlib.import_module(".autotune", __name__)
        return module if name == "autotune" else module.Config
    raise AttributeError(f"module 'pyptx' has no attribute {name!r}")
