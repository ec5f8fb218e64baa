"""mk: compile tensor programs into one persistent GPU megakernel (public Python API)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from mk.compiler import Program
    from mk.diagnostics import MkError
    from mk.source import Source

__all__ = ["MkError", "Program", "__version__", "compile", "reference"]


def compile(source: Source, target: str = "cpu", **options: Any) -> Program:
    """Compile an nn program into a runnable `Program` (see mk.compiler.compile for options)."""
    from mk.compiler import compile as compile_program

    return compile_program(source, target, **options)


def reference(source: Source, *inputs: Any, entry: str | None = None) -> tuple[Any, ...]:
    """Run an nn program with the NumPy reference interpreter; returns a tuple of outputs."""
    from mk.interp.nn import run_reference

    return run_reference(source, *inputs, entry=entry)


def __getattr__(name: str) -> Any:
    # Keeps `import mk` cheap: xDSL is imported only when something needs it.
    if name == "MkError":
        from mk.diagnostics import MkError

        return MkError
    if name == "Program":
        from mk.compiler import Program

        return Program
    raise AttributeError(f"module 'mk' has no attribute {name!r}")
