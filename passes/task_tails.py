"""task-tails: marks the grids whose tasks the last signal of their input element runs inline.

`task-tails{max-tail-tasks=N}` looks for consumer grids with one task per element of an event
they wait on in the same iteration (an attention merge per KV head waiting for its splits, a
QK-norm + RoPE per head waiting for the linear tasks of that head, a cache write waiting for
the whole K). Such a task need not be queued: the SM whose signal completes its element (the
counter reaching count * (t + 1)) runs it right after, which saves the round trip of a wait,
a dispatch and a hop to whichever SM would have been free. The pass sets `mk.tail = "event"` on
the grid; task-schedule keeps tails out of the queues (and queues any it cannot keep safe), the
flat tables give each signal row of the element the tail task, and both executors run it.

Of several qualifying waits the one with the most producer signals is taken (the likeliest to
complete last); grids of more than `max-tail-tasks` tasks stay queued. The default, 0, marks
none: on the H200 tails made a qwen3-0.6b step slower (355 against 307 µs for 4 layers), since
the SM that runs one delays its next queued task, and a decode phase needs every SM.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.passes import ModulePass

from mk.dialects.task import GraphOp, GridOp
from mk.dialects.task_index import TAIL_ATTR, GraphIndex, tail_problem
from mk.dialects.task_maps import EdgeAttr


def tail_candidates(index: GraphIndex, grid: GridOp) -> list[EdgeAttr]:
    """The grid's same-iteration waits it could be a tail of, most producer signals first."""
    found = []
    for edge in grid.waits:
        if edge.distance_value != 0 or edge.event_name not in index.events:
            continue
        if index.events[edge.event_name].is_flagged:  # may have no signals to run a tail at
            continue
        grid.attributes[TAIL_ATTR] = StringAttr(edge.event_name)
        if tail_problem(index, grid) is None:
            found.append(edge)
        del grid.attributes[TAIL_ATTR]
    return sorted(found, key=lambda e: -index.events[e.event_name].count_value)


def mark_tails(graph: GraphOp, max_tasks: int) -> list[str]:
    """Marks the graph's tail grids; returns their names. One tail grid per event."""
    index = graph.index()
    taken: set[str] = set()
    marked = []
    for grid in index.grids:
        grid.attributes.pop(TAIL_ATTR, None)
        if grid.num_tasks > max_tasks:
            continue
        free = [e for e in tail_candidates(index, grid) if e.event_name not in taken]
        if free:
            grid.attributes[TAIL_ATTR] = StringAttr(free[0].event_name)
            taken.add(free[0].event_name)
            marked.append(grid.sym_name.data)
    return marked


@dataclass(frozen=True)
class TaskTailsPass(ModulePass):
    """`task-tails{max-tail-tasks=0}`."""

    name = "task-tails"

    max_tail_tasks: int = 0

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for graph in op.walk():
            if isinstance(graph, GraphOp):
                mark_tails(graph, self.max_tail_tasks)
