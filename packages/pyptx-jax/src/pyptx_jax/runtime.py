"""The ``jax`` entry of the ``pyptx.runtimes`` plugin group."""

from __future__ import annotations

from typing import Any

LAUNCH_UNAVAILABLE = (
    "launching from JAX arrives with the pyptx-shim launcher; this build only traces"
)


def launch_unavailable() -> Exception:
    """Return the error raised by every launch path of this build."""
    from pyptx.errors import RuntimeUnavailableError

    return RuntimeUnavailableError(LAUNCH_UNAVAILABLE)


class JaxRuntime:
    """Launches pyptx kernels whose arguments are JAX arrays or tracers."""

    name = "jax"

    def owns(self, value: Any) -> bool:
        """Return True if ``value`` is a JAX array or tracer (checked without importing jax first)."""
        if type(value).__module__.partition(".")[0] not in ("jax", "jaxlib"):
            return False
        import jax

        return isinstance(value, jax.Array)

    def launch(self, kernel: Any, args: tuple[Any, ...], template_kwargs: dict[str, Any]) -> Any:
        """Launch ``kernel`` on ``args``; unavailable until the shim launcher ships."""
        raise launch_unavailable()
