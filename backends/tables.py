"""Lowering a scheduled task.graph to the runtime's flat tables (mk.runtime_tables.Tables)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
)
from xdsl.ir import Attribute

from mk.dialects.task import BufferOp, GraphOp, GridOp
from mk.dialects.task_index import GraphIndex, edge_counters
from mk.dialects.task_maps import grid_points, int_value
from mk.runtime_tables import (
    KIND_FIRST_LOWERED,
    MAX_COORDS,
    MAX_RANK,
    Buffer,
    Tables,
    Task,
    Wait,
    build_tables,
)

_FLOAT_CODES: dict[type[Attribute], str] = {
    Float32Type: "f32",
    Float16Type: "f16",
    BFloat16Type: "bf16",
    Float64Type: "f64",
}
# i1 is stored one byte per element (NumPy bool), like task.buffer's byte count.
_INT_CODES = {1: "u8", 8: "i8", 32: "i32", 64: "i64"}


@dataclass(frozen=True)
class BufferSlot:
    """How one buffer-table row is bound at run time: program argument, result, or arena."""

    name: str
    kind: str
    index: int | None  # argument index (input, weight) or result index (output)


def dtype_code(element_type: Attribute) -> str:
    """The runtime_tables dtype name of an element type (ValueError if it has none)."""
    if type(element_type) in _FLOAT_CODES:
        return _FLOAT_CODES[type(element_type)]
    if isinstance(element_type, IntegerType) and element_type.width.data in _INT_CODES:
        return _INT_CODES[element_type.width.data]
    raise ValueError(f"element type {element_type} has no runtime dtype")


def kind_of(grid_index: int) -> int:
    """The task kind of the grid at `grid_index` (declaration order), fixed by the kernel ABI."""
    return KIND_FIRST_LOWERED + grid_index


def buffer_ops(graph: GraphOp) -> list[BufferOp]:
    """The graph's task.buffer ops in declaration order: the buffer table's rows."""
    return [op for op in graph.body.block.ops if isinstance(op, BufferOp)]


def buffer_slots(graph: GraphOp) -> list[BufferSlot]:
    """One slot per buffer-table row, saying where its memory comes from at run time."""
    return [
        BufferSlot(
            op.sym_name.data,
            op.kind.data,
            None if op.index is None else int_value(op.index),
        )
        for op in buffer_ops(graph)
    ]


def _grid_tasks(index: GraphIndex, grid_index: int, grid: GridOp, flags: bool) -> list[Task]:
    shape = grid.shape_tuple
    if len(shape) > MAX_COORDS:
        raise ValueError(f"@{grid.sym_name.data}: grid rank {len(shape)} exceeds {MAX_COORDS}")
    # Counters per edge for all tasks at once (a grid can have thousands of tasks).
    # As lists: indexing a NumPy array element by element costs more than the rest of a task.
    waits = [
        (
            edge_counters(index, grid, e).tolist(),
            index.events[e.event_name].count_value,
            e.distance_value,
        )
        for e in grid.waits
        if not (flags and index.events[e.event_name].is_flagged)
    ]
    signals = [
        edge_counters(index, grid, e).tolist()
        for e in grid.signals
        if not (flags and index.events[e.event_name].is_flagged)
    ]
    kind = kind_of(grid_index)
    return [
        Task(
            kind,
            waits=[Wait(c[i], count, distance) for c, count, distance in waits],
            signals=[c[i] for c in signals],
            grid=grid_index,
            coord=point,
        )
        for i, point in enumerate(grid_points(shape).tolist())
    ]


def _queues(graph: GraphOp, index: GraphIndex) -> list[list[int]]:
    schedule = index.schedule
    if schedule is None:
        raise ValueError(f"@{graph.sym_name.data} has no task.schedule: run task-schedule first")
    queues: list[list[int]] = [[] for _ in range(int_value(schedule.num_sms))]
    for queue in schedule.queues:
        queues[int_value(queue.sm)] = list(queue.task_ids)
    return queues


def table_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a buffer row records: leading dims folded so that rank <= MAX_RANK.

    Rows carry shapes for checks and messages only (kernels know their shapes statically), so
    folding keeps the byte size and row-major layout, which is all the runtime relies on.
    """
    if len(shape) <= MAX_RANK:
        return shape
    return (math.prod(shape[: len(shape) - MAX_RANK + 1]), *shape[len(shape) - MAX_RANK + 1 :])


def _buffer_row(op: BufferOp) -> Buffer:
    kind = op.kind.data
    offset = 0 if op.offset is None else int_value(op.offset)
    dtype = dtype_code(op.buffer_type.get_element_type())
    return Buffer(dtype, table_shape(op.shape), kind, offset)


def tables_from_graph(graph: GraphOp, flags: bool = False) -> Tables:
    """The flat tables of a scheduled, verified task.graph.

    With `flags` (a backend whose reads of flagged buffers wait on the flags), flagged events
    get no waits and no signals: their counters stay unused.

    Tasks in global id order with kind 16 + grid index and coords padded with 0; waits and
    signals as flat counter ids (GraphIndex numbering); one queue per SM of the schedule;
    buffers in declaration order (arena kinds at their offsets, the others bound at run time).
    """
    index = graph.index()
    tasks = [
        task
        for pos, grid in enumerate(index.grids)
        for task in _grid_tasks(index, pos, grid, flags)
    ]
    return build_tables(
        tasks,
        _queues(graph, index),
        num_counters=index.total_counters,
        buffers=[_buffer_row(op) for op in buffer_ops(graph)],
        iterations=int_value(graph.iterations),
        arena_bytes=int_value(graph.arena),
        tails=index.tail_counters(),
    )
