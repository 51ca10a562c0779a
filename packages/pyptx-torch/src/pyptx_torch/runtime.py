"""The ``torch`` entry of the ``pyptx.runtimes`` plugin group."""

from __future__ import annotations

from typing import Any

LAUNCH_UNAVAILABLE = (
    "launching from PyTorch arrives with the pyptx-shim launcher; this build only traces"
)


def launch_unavailable() -> Exception:
    """Return the error raised by every launch path of this build."""
    from pyptx.errors import RuntimeUnavailableError

    return RuntimeUnavailableError(LAUNCH_UNAVAILABLE)


class TorchRuntime:
    """Launches pyptx kernels whose arguments are ``torch.Tensor`` objects."""

    name = "torch"

    def owns(self, value: Any) -> bool:
        """Return True if ``value`` is a torch tensor (checked without importing torch first)."""
        if type(value).__module__.partition(".")[0] != "torch":
            return False
        import torch

        return isinstance(value, torch.Tensor)

    def launch(self, kernel: Any, args: tuple[Any, ...], template_kwargs: dict[str, Any]) -> Any:
        """Launch ``kernel`` on ``args``; unavailable until the shim launcher ships."""
        raise launch_unavailable()
