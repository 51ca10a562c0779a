"""The ``jax`` entry of the ``pyptx.runtimes`` plugin group."""

from __future__ import annotations

from typing import Any


class JaxRuntime:
    """Launches pyptx kernels whose arguments are JAX arrays or tracers."""

    name = "jax"

    def owns(self, value: Any) -> bool:
        """Return True if ``value`` is a JAX array or tracer (checked without importing jax first)."""
        if type(value).__module__.partition(".")[0] not in ("jax", "jaxlib"):
            return False
        import jax

        return isinstance(value, jax.Array)

    def launch(self, kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Launch ``kernel`` on ``args`` through the ``pyptx_launch`` custom call."""
        from .launch import launch_kernel

        return launch_kernel(kernel, args, kwargs)
