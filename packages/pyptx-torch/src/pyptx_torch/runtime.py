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
        if _eager is None:
            _bind()
        if _is_compiling():
            return _compiled(kernel, args, kwargs)
        return _eager(kernel, args, kwargs)


_eager: Any = None
_compiled: Any = None
_is_compiling: Any = None


def _bind() -> None:
    """Import torch and the launch paths on first use (the entry point itself stays light)."""
    global _eager, _compiled, _is_compiling
    import torch

    from pyptx.kernel import set_compiling_probe

    from .compiled import compiled_call
    from .eager import launch_kernel

    _is_compiling = torch.compiler.is_compiling
    set_compiling_probe(_is_compiling)
    _compiled = compiled_call
    _eager = launch_kernel
