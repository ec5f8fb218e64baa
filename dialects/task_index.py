"""Queries over a whole task.graph: declarations by name, global task ids, event producers and
consumers, the flat counter numbering, and the static check that per-SM queues cannot deadlock."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .task_maps import (
    EdgeAttr,
    delinearize,
    edge_elements,
    eval_point,
    format_coords,
    grid_points,
    grid_size,
    linearize,
)

if TYPE_CHECKING:
    from .task import BufferOp, EventOp, GraphOp, GridOp, ScheduleOp


@dataclass
class GraphIndex:
    """A task.graph's declarations by name, each grid's first global task id, and task queries.

    Built by `GraphOp.index()`; it is a snapshot, so rebuild it after changing the graph.
    """

    graph: GraphOp
    buffers: dict[str, BufferOp] = field(default_factory=dict)
    events: dict[str, EventOp] = field(default_factory=dict)
    grids: list[GridOp] = field(default_factory=list)
    grids_by_name: dict[str, GridOp] = field(default_factory=dict)
    bases: list[int] = field(default_factory=list)
    base_by_grid: dict[GridOp, int] = field(default_factory=dict)
    producers: dict[str, list[tuple[GridOp, EdgeAttr]]] = field(default_factory=dict)
    consumers: dict[str, list[tuple[GridOp, EdgeAttr]]] = field(default_factory=dict)
    counter_bases: dict[str, int] = field(default_factory=dict)
    schedule: ScheduleOp | None = None
    total_tasks: int = 0
    total_counters: int = 0

    def add_event(self, event: EventOp) -> None:
        """Registers an event; its elements take the next counters of the flat counter array."""
        name = event.sym_name.data
        if name not in self.events:
            self.events[name] = event
            self.counter_bases[name] = self.total_counters
            self.total_counters += grid_size(event.shape_tuple)

    def counter(self, event: str, element: Sequence[int]) -> int:
        """The flat index of one event element among all counters (events in block order)."""
        shape = self.events[event].shape_tuple
        return self.counter_bases[event] + int(linearize(np.array([element]), shape)[0])

    def locate_counter(self, counter: int) -> tuple[str, tuple[int, ...]]:
        """The event and element of a flat counter index."""
        name = max(
            (n for n, b in self.counter_bases.items() if b <= counter),
            key=self.counter_bases.__getitem__,
        )
        return name, delinearize(counter - self.counter_bases[name], self.events[name].shape_tuple)

    def add_grid(self, grid: GridOp) -> None:
        self.grids.append(grid)
        self.grids_by_name.setdefault(grid.sym_name.data, grid)
        self.bases.append(self.total_tasks)
        self.base_by_grid[grid] = self.total_tasks
        self.total_tasks += grid.num_tasks
        for edge in grid.signals:
            self.producers.setdefault(edge.event_name, []).append((grid, edge))
        for edge in grid.waits:
            self.consumers.setdefault(edge.event_name, []).append((grid, edge))

    def base_of(self, grid: GridOp) -> int:
        """The global id of a grid's first task (the sum of the sizes of earlier grids)."""
        if grid not in self.base_by_grid:
            raise ValueError(f"grid @{grid.sym_name.data} is not in this graph")
        return self.base_by_grid[grid]

    def tasks(self, grid: GridOp) -> Iterator[tuple[tuple[int, ...], int]]:
        """(coordinates, global task id) of every task of a grid, in id order."""
        base = self.base_of(grid)
        for offset, coords in enumerate(grid_points(grid.shape_tuple)):
            yield tuple(int(c) for c in coords), base + offset

    def task_id(self, grid: GridOp, coords: Sequence[int]) -> int:
        return self.base_of(grid) + int(linearize(np.array([coords]), grid.shape_tuple)[0])

    def locate(self, task_id: int) -> tuple[GridOp, tuple[int, ...]]:
        """The grid and coordinates of a global task id."""
        if not 0 <= task_id < self.total_tasks:
            raise ValueError(f"task {task_id} out of range [0, {self.total_tasks})")
        pos = int(np.searchsorted(np.asarray(self.bases), task_id, side="right")) - 1
        grid = self.grids[pos]
        return grid, delinearize(task_id - self.bases[pos], grid.shape_tuple)

    def describe(self, task_id: int) -> str:
        """`task 53 (@qkv[5])`, for messages."""
        grid, coords = self.locate(task_id)
        return f"task {task_id} (@{grid.sym_name.data}{format_coords(coords)})"

    def waits_of(self, task_id: int) -> list[tuple[str, tuple[int, ...], int]]:
        """(event, element, distance) of every wait of a task, in declaration order."""
        grid, coords = self.locate(task_id)
        return [
            (e.event_name, eval_point(e.element_map, coords), e.distance_value) for e in grid.waits
        ]

    def signals_of(self, task_id: int) -> list[tuple[str, tuple[int, ...]]]:
        """(event, element) of every signal of a task, in declaration order."""
        grid, coords = self.locate(task_id)
        return [(e.event_name, eval_point(e.element_map, coords)) for e in grid.signals]

    def _tasks_hitting(
        self, edges: list[tuple[GridOp, EdgeAttr]], element: Sequence[int]
    ) -> list[int]:
        found: list[int] = []
        for grid, edge in edges:
            elements = edge_elements(grid, edge)
            if elements is not None:
                hits = np.flatnonzero(np.all(elements == np.asarray(element), axis=1))
                found.extend(self.base_of(grid) + int(h) for h in hits)
        return sorted(set(found))

    def producers_of(self, event: str, element: Sequence[int]) -> list[int]:
        """Global ids of the tasks that signal one event element."""
        return self._tasks_hitting(self.producers.get(event, []), element)

    def consumers_of(self, event: str, element: Sequence[int]) -> list[int]:
        """Global ids of the tasks that wait on one event element (at any distance)."""
        return self._tasks_hitting(self.consumers.get(event, []), element)

    def tail_counters(self) -> dict[int, tuple[int, int]]:
        """Counter -> (tail task, signals per element per iteration) over every tail grid: the
        SM whose signal completes that element in an iteration runs the task next."""
        out: dict[int, tuple[int, int]] = {}
        for grid in self.grids:
            edge = tail_edge(grid)
            if edge is None:
                continue
            counters = edge_counters(self, grid, edge)
            count = self.events[edge.event_name].count_value
            base = self.base_of(grid)
            out.update((int(c), (base + i, count)) for i, c in enumerate(counters))
        return out

    def tail_tasks(self) -> set[int]:
        """Global ids of the tasks of tail grids (run by their event's last signal, unqueued)."""
        return {task for task, _ in self.tail_counters().values()}


TAIL_ATTR = "mk.tail"


def tail_edge(grid: GridOp) -> EdgeAttr | None:
    """The same-iteration wait of a tail grid (`mk.tail = "event"`) whose element's last signal
    runs each task, or None for a queued grid."""
    attr = grid.attributes.get(TAIL_ATTR)
    if attr is None:
        return None
    name = getattr(attr, "data", None)
    return next((e for e in grid.waits if e.event_name == name and e.distance_value == 0), None)


def edge_counters(index: GraphIndex, grid: GridOp, edge: EdgeAttr) -> np.ndarray:
    """The flat counter of each task's element of one wait or signal edge (tasks in id order)."""
    elements = edge_elements(grid, edge)
    if elements is None:
        raise ValueError(f"@{grid.sym_name.data} has a malformed edge to @{edge.event_name}")
    shape = index.events[edge.event_name].shape_tuple
    return index.counter_bases[edge.event_name] + linearize(elements, shape)


def tail_problem(index: GraphIndex, grid: GridOp) -> str | None:
    """Why a grid marked `mk.tail` cannot be run by its event's last signals, or None: it needs
    a same-iteration wait on the event, one task per element, every element covered, and the
    event signalled by other grids only."""
    attr = grid.attributes.get(TAIL_ATTR)
    if attr is None:
        return None
    name = getattr(attr, "data", None)
    edge = tail_edge(grid)
    if edge is None or name not in index.events:
        return f"{TAIL_ATTR} names @{name}, which the grid does not wait on in the same iteration"
    counters = edge_counters(index, grid, edge)
    elements = grid_size(index.events[name].shape_tuple)
    if len(set(counters.tolist())) != grid.num_tasks or grid.num_tasks != elements:
        return f"{TAIL_ATTR}: its {grid.num_tasks} tasks are not one per element of @{name} ({elements})"
    if any(g is grid for g, _ in index.producers.get(name, [])):
        return f"{TAIL_ATTR}: the grid signals @{name} itself"
    return None


# --------------------------------------------------------------------------- deadlock check


@dataclass
class _DepGraph:
    """Tasks (nodes 0..T-1) and event elements (nodes T..) with signal, wait and queue edges."""

    index: GraphIndex
    src: np.ndarray
    dst: np.ndarray

    @property
    def size(self) -> int:
        return self.index.total_tasks + self.index.total_counters

    def label(self, node: int) -> str:
        if node < self.index.total_tasks:
            return self.index.describe(node)
        name, element = self.index.locate_counter(node - self.index.total_tasks)
        return f"@{name}{format_coords(element)}"


def _queue_problem(index: GraphIndex, queues: list[tuple[int, tuple[int, ...]]]) -> str | None:
    owner: dict[int, int] = {}
    for sm, ids in queues:
        for task in ids:
            if not 0 <= task < index.total_tasks:
                return f"task {task} on SM {sm} is out of range [0, {index.total_tasks})"
            if task in owner:
                return f"{index.describe(task)} is queued on SM {owner[task]} and SM {sm}"
            owner[task] = sm
    tails = index.tail_tasks()
    for task in range(index.total_tasks):
        if task not in owner and task not in tails:
            return f"{index.describe(task)} is in no queue"
        if task in owner and task in tails:
            return f"{index.describe(task)} is a tail task and also queued on SM {owner[task]}"
    return None


def _dependence_graph(index: GraphIndex, queues: list[tuple[int, tuple[int, ...]]]) -> _DepGraph:
    src: list[np.ndarray] = []
    dst: list[np.ndarray] = []
    for name, edges in index.producers.items():
        for grid, edge in edges:
            nodes = _element_nodes(index, name, grid, edge)
            src.append(index.base_of(grid) + np.arange(grid.num_tasks))
            dst.append(nodes)
    for name, edges in index.consumers.items():
        for grid, edge in edges:
            if edge.distance_value == 0:  # loop-carried waits are met by earlier iterations
                src.append(_element_nodes(index, name, grid, edge))
                dst.append(index.base_of(grid) + np.arange(grid.num_tasks))
    for _, ids in queues:
        src.append(np.asarray(ids[:-1], dtype=np.int64))
        dst.append(np.asarray(ids[1:], dtype=np.int64))
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64)  # noqa: E731
    src_all, dst_all = cat(src), cat(dst)
    order_src, order_dst = _tail_order_edges(index, src_all, dst_all)
    return _DepGraph(index, cat([src_all, order_src]), cat([dst_all, order_dst]))


def _tail_order_edges(
    index: GraphIndex, src: np.ndarray, dst: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A tail task runs inline on the SM of its element's last producer, so any other wait it has
    must be met by producers that come before all of that element's producers: an edge from each
    such waited element to each producer of the tail's element."""
    tails = index.tail_counters()
    if not tails:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    tasks = index.total_tasks
    signal = (src < tasks) & (dst >= tasks)
    producers: dict[int, list[int]] = {}
    for task, node in zip(src[signal].tolist(), dst[signal].tolist(), strict=True):
        producers.setdefault(node, []).append(task)
    waited = (src >= tasks) & (dst < tasks)
    waits: dict[int, list[int]] = {}
    for node, task in zip(src[waited].tolist(), dst[waited].tolist(), strict=True):
        waits.setdefault(task, []).append(node)
    out_src: list[int] = []
    out_dst: list[int] = []
    for counter, (task, _) in tails.items():
        own = tasks + counter
        for node in waits.get(task, []):
            if node != own:
                out_src.extend([node] * len(producers.get(own, [])))
                out_dst.extend(producers.get(own, []))
    return np.asarray(out_src, np.int64), np.asarray(out_dst, np.int64)


def _element_nodes(index: GraphIndex, name: str, grid: GridOp, edge: EdgeAttr) -> np.ndarray:
    """The dependence-graph node of each task's element (tasks come first, then counters)."""
    event = index.events.get(name)
    elements = edge_elements(grid, edge)
    if event is None or elements is None:
        raise ValueError(f"@{grid.sym_name.data} has a malformed edge to @{name}; verify first")
    base = index.total_tasks + index.counter_bases[name]
    return base + linearize(elements, event.shape_tuple)


def _unsignalled_wait(deps: _DepGraph) -> str | None:
    signalled = np.zeros(deps.size, dtype=bool)
    tasks = deps.index.total_tasks
    signalled[deps.dst[deps.dst >= tasks]] = True
    waited = deps.src[(deps.src >= tasks) & ~signalled[deps.src]]
    if waited.size == 0:
        return None
    node = int(waited[0])
    waiter = int(deps.dst[np.flatnonzero(deps.src == node)[0]])
    return f"{deps.index.describe(waiter)} waits on {deps.label(node)}, which no task signals"


def _find_cycle(deps: _DepGraph, done: np.ndarray) -> list[int]:
    """A cycle among the nodes Kahn's algorithm could not finish, in edge order."""
    pending = np.flatnonzero(~done)
    node = int(pending[0])
    seen: dict[int, int] = {}
    walk: list[int] = []
    while node not in seen:
        seen[node] = len(walk)
        walk.append(node)
        preds = deps.src[(deps.dst == node) & ~done[deps.src]]
        node = int(preds.min())
    cycle = walk[seen[node] :][::-1]
    # Start at the lowest-numbered task that signals, so the story reads producer first.
    tasks = deps.index.total_tasks
    signallers = [
        i for i, n in enumerate(cycle) if n < tasks and cycle[(i + 1) % len(cycle)] >= tasks
    ]
    first = min(signallers, key=lambda i: cycle[i]) if signallers else 0
    return cycle[first:] + cycle[:first]


def _describe_cycle(deps: _DepGraph, cycle: list[int], sm_of: dict[int, int]) -> str:
    """One clause per edge; a run of queue edges (all on one SM) is told as a single clause."""
    tasks = deps.index.total_tasks
    steps: list[str] = []
    run_start: int | None = None
    for pos, node in enumerate(cycle):
        nxt = cycle[(pos + 1) % len(cycle)]
        if node >= tasks:
            steps.append(f"{deps.label(nxt)} waits on {deps.label(node)}")
        elif nxt >= tasks:
            steps.append(f"{deps.label(node)} signals {deps.label(nxt)}")
        else:
            run_start = node if run_start is None else run_start
            if cycle[(pos + 2) % len(cycle)] >= tasks:
                first = deps.label(run_start)
                steps.append(f"SM {sm_of[run_start]} runs {first} before {deps.label(nxt)}")
                run_start = None
    return "queues deadlock: " + "; ".join(steps)


def check_queues_deadlock_free(graph: GraphOp) -> str | None:
    """The first reason the graph's static queues could deadlock (or are malformed), or None.

    Sufficient condition checked: the union of the dependences (producer -> event element ->
    consumer, for same-iteration waits) and each queue's program order is acyclic, i.e. one
    global topological order runs every queue in its order.
    """
    index = graph.index()
    if index.schedule is None:
        return f"@{graph.sym_name.data} has no task.schedule"
    queues = [(int(q.sm.value.data), q.task_ids) for q in index.schedule.queues]
    if (problem := _queue_problem(index, queues)) is not None:
        return problem
    deps = _dependence_graph(index, queues)
    if (problem := _unsignalled_wait(deps)) is not None:
        return problem
    order = np.argsort(deps.src, kind="stable")
    succ_src, succ_dst = deps.src[order], deps.dst[order]
    starts = np.searchsorted(succ_src, np.arange(deps.size + 1))
    indegree = np.bincount(deps.dst, minlength=deps.size)
    ready = [int(n) for n in np.flatnonzero(indegree == 0)]
    done = np.zeros(deps.size, dtype=bool)
    while ready:
        node = ready.pop()
        done[node] = True
        for nxt in succ_dst[starts[node] : starts[node + 1]]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(int(nxt))
    if done.all():
        return None
    sm_of = {task: sm for sm, ids in queues for task in ids}
    return _describe_cycle(deps, _find_cycle(deps, done), sm_of)
