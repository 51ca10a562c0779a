"""The ``torch`` entry of the ``pyptx.runtimes`` plugin group."""

from __future__ import annotations

from typing import Any


class TorchRuntime:
    """Launches pyptx kernels whose arguments are ``torch.Tensor`` objects."""

    name = "torch"
    #: Types from these top-level modules may be torch tensors (``owns`` decides).
    modules = ("torch",)

    def owns(self, value: Any) -> bool:
        """Return True if ``value`` is a torch tensor (checked without importing torch first)."""
        if type(value).__module__.partition(".")[0] != "torch":
            return False
        import torch

        return isinstance(value, torch.Tensor)

    def prepare(self) -> None:
        """Import the eager launch path now (torch is imported already). The
        ``torch.compile`` path (``pyptx_torch.compiled``, which defines the ``pyptx::launch``
        ops) is imported by the first traced call: an import inside a Dynamo trace runs as
        plain Python."""
        from . import eager  # noqa: F401

    def tracing(self) -> bool:
        """True while torch.compile or torch.export traces (calls become custom ops)."""
        import torch

        return torch.compiler.is_compiling()

    def launcher(self) -> Any:
        """A new per-kernel launcher: ``launch(kernel, args, kwargs)`` with the kernel's plans
        and its fast launchers (see ``pyptx_torch.eager.make_launcher``)."""
        from .eager import make_launcher

        return make_launcher()

    def differentiable(self, op: Any) -> Any:
        """The torch glue of a ``pyptx.differentiable_kernel`` (a ``torch.autograd.Function``)."""
        from .autograd import autograd_function

        return autograd_function(op)

    def launch(self, kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Launch ``kernel`` on ``args``: eagerly, or as a custom op while torch.compile traces."""
        if self.tracing():
            from .compiled import compiled_call

            return compiled_call(kernel, args, kwargs)
        return kernel.launcher(self.name)(kernel, args, kwargs)
