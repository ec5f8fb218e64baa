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


def _mugraph_append_writes() -> type[ModulePass]:
    from mk.passes.mugraph_append_writes import MugraphAppendWritesPass

    return MugraphAppendWritesPass


def _mugraph_fuse_accumulate() -> type[ModulePass]:
    from mk.passes.mugraph_fuse_accumulate import MugraphFuseAccumulatePass

    return MugraphFuseAccumulatePass


def _mugraph_fuse_epilogue() -> type[ModulePass]:
    from mk.passes.mugraph_fuse_epilogue import MugraphFuseEpiloguePass

    return MugraphFuseEpiloguePass


def _mugraph_fuse_loop() -> type[ModulePass]:
    from mk.passes.mugraph_fuse_loop import MugraphFuseLoopPass

    return MugraphFuseLoopPass


def _mugraph_split_loop() -> type[ModulePass]:
    from mk.passes.mugraph_split_loop import MugraphSplitLoopPass

    return MugraphSplitLoopPass


def _mugraph_stats() -> type[ModulePass]:
    from mk.passes.mugraph_stats import MugraphStatsPass

    return MugraphStatsPass


def _mugraph_to_task() -> type[ModulePass]:
    from mk.passes.mugraph_to_task import MugraphToTaskPass

    return MugraphToTaskPass


def _nn_to_mugraph() -> type[ModulePass]:
    from mk.passes.nn_to_mugraph import NnToMugraphPass

    return NnToMugraphPass


def _superoptimize() -> type[ModulePass]:
    from mk.passes.search.superoptimize import SuperoptimizePass

    return SuperoptimizePass


def _task_schedule() -> type[ModulePass]:
    from mk.passes.task_schedule import TaskSchedulePass

    return TaskSchedulePass


def _task_tails() -> type[ModulePass]:
    from mk.passes.task_tails import TaskTailsPass

    return TaskTailsPass


def _task_stats() -> type[ModulePass]:
    from mk.passes.task_stats import TaskStatsPass

    return TaskStatsPass


def _task_simulate() -> type[ModulePass]:
    from mk.passes.task_simulate import TaskSimulatePass

    return TaskSimulatePass


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """Every pass mk-opt's `-p` accepts, by its command-line name."""
    return {
        "canonicalize": _canonicalize,
        "cse": _cse,
        "dce": _dce,
        "nn-to-mugraph": _nn_to_mugraph,
        "mugraph-append-writes": _mugraph_append_writes,
        "mugraph-fuse-accumulate": _mugraph_fuse_accumulate,
        "mugraph-fuse-epilogue": _mugraph_fuse_epilogue,
        "mugraph-fuse-loop": _mugraph_fuse_loop,
        "mugraph-split-loop": _mugraph_split_loop,
        "mugraph-stats": _mugraph_stats,
        "mugraph-to-task": _mugraph_to_task,
        "superoptimize": _superoptimize,
        "task-simulate": _task_simulate,
        "task-schedule": _task_schedule,
        "task-stats": _task_stats,
        "task-tails": _task_tails,
    }
