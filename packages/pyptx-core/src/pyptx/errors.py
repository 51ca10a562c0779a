"""One exception hierarchy: every failure a user can cause is a ``PyptxError``."""

from __future__ import annotations


class PyptxError(Exception):
    """Base class of every error pyptx raises for something the user did."""


class SpecError(PyptxError, TypeError):
    """Arguments do not match a kernel's ``in_specs``: arity, rank, dtype or dims."""


class ShapeError(SpecError, ValueError):
    """A concrete shape contradicts a ``Tile`` spec or another argument's dims."""


class UnboundDimError(SpecError):
    """A symbolic dim has no value: no argument or keyword provides it."""


class ConfigError(PyptxError, ValueError):
    """A ``@kernel`` launch parameter (grid, block, cluster, smem, arch) is invalid."""


class TmaError(ConfigError):
    """A TMA descriptor's parameters break a ``cuTensorMapEncodeTiled`` constraint."""


class TraceError(PyptxError):
    """The kernel body misused the DSL while being traced."""


class OperandError(TraceError, TypeError):
    """An instruction or helper got the wrong number or kind of operands."""


class TypeMismatchError(TraceError, TypeError):
    """Operator sugar or a helper was given registers of incompatible types."""


class RegisterScopeError(TraceError):
    """A register was used outside the kernel trace that created it."""


class CompileError(PyptxError):
    """ptxas or the driver JIT rejected the emitted PTX."""


class ToolchainError(PyptxError):
    """A needed tool (ptxas) is not installed or could not be run."""


class RuntimeUnavailableError(PyptxError, RuntimeError):
    """No installed runtime plugin can launch the kernel on these arguments."""


class LaunchError(PyptxError, RuntimeError):
    """A launch was refused or failed on the device."""


class ParseError(PyptxError, ValueError):
    """PTX text that ``pyptx.parser`` cannot read; ``.line``/``.column`` are 1-based."""

    def __init__(self, message: str, line: int = 0, column: int = 0, text: str = "",
                 source: str = "<ptx>") -> None:
        self.message = message
        self.line = line
        self.column = column
        self.text = text
        self.source = source
        super().__init__(f"{source}:{line}:{column}: {message}: {text!r}")
