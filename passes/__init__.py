"""The registry of mk passes: CLI name -> lazy factory of the ModulePass class."""

from collections.abc import Callable

from xdsl.passes import ModulePass


def _canonicalize() -> type[ModulePass]:
    from xdsl.transforms.canonicalize import CanonicalizePass

    return CanonicalizePass


def _cse() -> type[ModulePass]:
    from xdsl.transforms.common_subexpression_elimination import (
        CommonSubexpressionElimination,
    )

    return CommonSubexpressionElimination


def _dce() -> type[ModulePass]:
    from xdsl.transforms.dead_code_elimination import DeadCodeElimination

    return DeadCodeElimination


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """Every pass mk-opt's `-p` accepts, by its command-line name."""
    return {
        "canonicalize": _canonicalize,
        "cse": _cse,
        "dce": _dce,
    }
