"""The ``jax`` entry of the ``pyptx.runtimes`` plugin group."""

from __future__ import annotations

from typing import Any


class JaxRuntime:
    """Launches pyptx kernels whose arguments are JAX arrays or tracers."""

    name = "jax"
    #: Types from these top-level modules may be JAX arrays or tracers (``owns`` decides).
    modules = ("jax", "jaxlib")

    def owns(self, value: Any) -> bool:
        """Return True if ``value`` is a JAX array or tracer (checked without importing jax first)."""
        if type(value).__module__.partition(".")[0] not in self.modules:
            return False
        import jax

        return isinstance(value, jax.Array)

    def launcher(self) -> Any:
        """A new per-kernel launcher ``launch(kernel, args, kwargs)`` holding the kernel's plans."""
        from .launch import make_launcher

        return make_launcher()

    def differentiable(self, op: Any) -> Any:
        """The JAX glue of a ``pyptx.differentiable_kernel`` (a ``jax.custom_vjp`` function)."""
        from .autodiff import custom_vjp_function

        return custom_vjp_function(op)

    def launch(self, kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Launch ``kernel`` on ``args`` through the ``pyptx_launch`` custom call."""
        return kernel.launcher(self.name)(kernel, args, kwargs)
