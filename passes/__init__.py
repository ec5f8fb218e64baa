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


def _mugraph_stats() -> type[ModulePass]:
    from mk.passes.mugraph_stats import MugraphStatsPass

    return MugraphStatsPass


def _nn_to_mugraph() -> type[ModulePass]:
    from mk.passes.nn_to_mugraph import NnToMugraphPass

    return NnToMugraphPass


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """Every pass mk-opt's `-p` accepts, by its command-line name."""
    return {
        "canonicalize": _canonicalize,
        "cse": _cse,
        "dce": _dce,
        "nn-to-mugraph": _nn_to_mugraph,
        "mugraph-stats": _mugraph_stats,
    }
