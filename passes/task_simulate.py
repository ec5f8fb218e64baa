"""task-simulate: run every scheduled task.graph on the CPU in random interleavings and check it.

For each `task.graph` the pass draws random inputs for its input and weight buffers, runs the
tasks once in program order (the reference: it also checks each task's footprints), then
`seeds` simulations with random start and finish times (`mk.interp.task`). Any read before
its producer finished (RAW), read of overwritten data (WAR), reordered writes (WAW), deadlock,
or simulated output that differs bitwise from the reference raises a located MkError at the
task.grid that lacks the dependency, or at the task.event a deadlocked task waits on. The IR
is not changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from mk.diagnostics import MkError, op_location
from mk.dialects.mugraph import GraphDefOp, KernelOp
from mk.dialects.task import BufferOp, GraphOp
from mk.inputs import numpy_dtype
from mk.interp.task import DEFAULT_MAX_DELAY, Simulator, Violation

# Integers whose use the pass cannot see (e.g. ids or lengths inside a graph-defined kernel)
# stay below this, and below every extent of the kernel's other operands.
_INT_HIGH = 16


def _int_bounds(buffer: BufferOp, graph: GraphOp) -> tuple[int, int]:
    """[low, high) for an integer input: embedding ids below the table's rows, kv_len in
    [1, S]; otherwise small values below every extent of the consuming kernel's operands."""
    low, high = 0, _INT_HIGH
    name = buffer.sym_name.data
    for grid in graph.index().grids:
        args = grid.body.block.args
        for arg, (_, fp) in zip(args, grid.footprints, strict=False):
            if fp.buffer_name != name:
                continue
            for use in arg.uses:
                low, high = _refine(use.operation, use.index, low, high)
    return low, max(high, low + 1)


def _refine(op: Operation, operand: int, low: int, high: int) -> tuple[int, int]:
    shapes = [tuple(t.get_shape()) for t in op.operand_types if isinstance(t, TensorType)]
    if isinstance(op, KernelOp) and op.kind.data == "embedding" and operand >= 1:
        return low, min(high, shapes[operand - 1][0])  # ids of the table before them
    if isinstance(op, KernelOp) and op.kind.data == "attention" and operand == 3:
        return max(low, 1), min(high, shapes[1][2] + 1)
    if isinstance(op, GraphDefOp):
        others = [d for i, s in enumerate(shapes) if i != operand for d in s]
        return max(low, 1), min([high, *others])
    return low, high


def random_graph_inputs(graph: GraphOp, seed: int = 0) -> list[np.ndarray]:
    """Random values for a graph's input and weight buffers, by argument index."""
    rng = np.random.default_rng(seed)
    values = []
    for buffer in Simulator(graph).inputs:
        dtype = numpy_dtype(buffer.buffer_type.get_element_type())
        if dtype.kind in "iu":
            low, high = _int_bounds(buffer, graph)
            values.append(rng.integers(low, high, size=buffer.shape).astype(dtype))
        elif dtype.kind == "b":
            values.append(rng.integers(0, 2, size=buffer.shape).astype(dtype))
        else:
            # Weights (read as the second operand of a contraction) scaled to keep sums O(1).
            fan_in = buffer.shape[-1] if buffer.kind.data == "weight" and buffer.shape else 1
            scale = 1.0 / np.sqrt(max(fan_in, 1))
            values.append((rng.standard_normal(size=buffer.shape) * scale).astype(dtype))
    return values


def _error(graph: GraphOp, violation: Violation, seed: int | None) -> MkError:
    index = graph.index()
    anchor: Operation = graph
    if violation.kind == "deadlock" and violation.event in index.events:
        anchor = index.events[violation.event]
    elif violation.grid is not None:
        anchor = violation.grid
    run = "the sequential run" if seed is None else f"seed {seed}"
    return MkError(
        f"'{anchor.name}' task-simulate ({run}): {violation.message}", op_location(anchor)
    )


def check_graph(
    graph: GraphOp, seeds: int, max_delay: int, inputs: Sequence[np.ndarray] | None = None
) -> None:
    """Raise a located MkError for the first violation or mismatch of any seed."""
    sim = Simulator(graph)
    if sim.index.schedule is None:
        raise MkError(
            f"'task.graph' @{graph.sym_name.data} has no task.schedule: run task-schedule first",
            op_location(graph),
        )
    values = list(inputs) if inputs is not None else random_graph_inputs(graph)
    reference = sim.reference(values)
    if reference.violation is not None:
        raise _error(graph, reference.violation, None)
    for seed in range(seeds):
        result = sim.simulate(values, seed, reference, max_delay)
        if result.violation is not None:
            raise _error(graph, result.violation, seed)
        for buffer, got, want in zip(sim.outputs, result.outputs, reference.outputs, strict=True):
            if got.tobytes() != want.tobytes():
                raise MkError(
                    f"'task.graph' task-simulate (seed {seed}): output "
                    f"@{buffer.sym_name.data} differs from the sequential run",
                    op_location(graph),
                )


@dataclass(frozen=True)
class TaskSimulatePass(ModulePass):
    """`task-simulate{seeds=4 max-delay=8}`: check every scheduled task.graph by simulation."""

    name = "task-simulate"

    seeds: int = 4
    max_delay: int = DEFAULT_MAX_DELAY

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for graph in op.walk():
            if isinstance(graph, GraphOp):
                check_graph(graph, self.seeds, self.max_delay)
