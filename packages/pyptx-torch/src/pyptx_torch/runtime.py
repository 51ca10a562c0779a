"""The ``torch`` entry of the ``pyptx.runtimes`` plugin group."""

from __future__ import annotations

from typing import Any


class TorchRuntime:
    """Launches pyptx kernels whose arguments are ``torch.Tensor`` objects."""

    name = "torch"

    def owns(self, value: Any) -> bool:
        """Return True if ``value`` is a torch tensor (checked without importing torch first)."""
        if type(value).__module__.partition(".")[0] != "torch":
            return False
        import torch

        return isinstance(value, torch.Tensor)

    def launch(self, kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Launch ``kernel`` on ``args``: eagerly, or as a custom op while torch.compile traces."""
        import torch

        if torch.compiler.is_compiling():
            from .compiled import compiled_call

            return compiled_call(kernel, args, kwargs)
        from .eager import launch_kernel

        return launch_kernel(kernel, args, kwargs)
