"""task-stats: annotate every task.graph with its size, its waits and its estimated time.

`task-stats{num-sms=132 bandwidth-gbs=4100.0 peak-tflops=740.0 task-us=0.0}` sets the
discardable attribute

    task.stats = {tasks, grids, events, event_elements, waits, max_waits_per_task,
                  mean_waits_per_task, critical_path_us, est_us, coarse_events,
                  stacked_queues, flagged_waits}

on each `task.graph` and changes nothing else. `waits` counts every (task, wait) pair, the
loop-carried ones included, since each is a wait the megakernel executes; `flagged_waits`
counts those on `flagged` events, which a backend that waits on the flags drops (the CPU
executor keeps them). Times are for one
iteration, from the cost model of `task-schedule` (a task's share of one SM's bandwidth and
peak): `critical_path_us` is the longest chain of task times along distance-0 dependences, and
`est_us` is the makespan of the graph's own `task.schedule` when it has one (each SM runs its
queue in order, each task as soon as its SM and its producers are done; that schedule's
`num_sms` sets the SM share), else that of the list schedule `task-schedule` would build on
`num-sms` SMs. `task-us` adds a fixed cost to every task, which the byte and FLOP counts miss:
its start, its waits and hops, staging, epilogue and signal (see the README for values fitted
to measured decode steps). `coarse_events` counts events carrying the `mk.coarse` attribute.
`stacked_queues` counts the (queue, grid) pairs where one queue of that schedule holds two or
more tasks of a grid that has no more tasks than the SMs, one of them critical (on a longest
chain of the dependences and the queues' orders): a phase that fits one wave runs two deep
there and delays the end (a misjudged task cost once did that to every phase of a decode
step). Stacked tasks with slack delay nothing and are not counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from xdsl.context import Context
from xdsl.dialects.builtin import DictionaryAttr, FloatAttr, IntegerAttr, ModuleOp, f64, i64
from xdsl.ir import Attribute
from xdsl.passes import ModulePass

from mk.diagnostics import MkError, op_location
from mk.dialects.task import GraphOp, GridOp
from mk.dialects.task_index import GraphIndex, check_queues_deadlock_free
from mk.dialects.task_maps import int_value
from mk.passes.task_schedule import (
    TaskDag,
    bottom_levels,
    build_dag,
    list_schedule,
    queue_makespan,
    target_for,
    task_graphs,
    top_levels,
    topological_order,
)

STATS_ATTR = "task.stats"
COARSE_ATTR = "mk.coarse"


def _short(value: float) -> float:
    """Rounded to a nanosecond (or a thousandth) and 6 significant digits: xDSL prints such a
    float as `1.234560e+03`, and any other one with 17 digits."""
    return float(f"{round(value, 3):.6g}")


@dataclass(frozen=True)
class GraphStats:
    tasks: int
    grids: int
    events: int
    event_elements: int
    waits: int
    max_waits_per_task: int
    critical_path_us: float
    est_us: float
    coarse_events: int
    stacked_queues: int
    flagged_waits: int = 0

    @property
    def mean_waits_per_task(self) -> float:
        return self.waits / self.tasks if self.tasks else 0.0

    def attr(self) -> DictionaryAttr:
        ints = ("tasks", "grids", "events", "event_elements", "waits", "max_waits_per_task")
        values: dict[str, Attribute] = {k: IntegerAttr(getattr(self, k), i64) for k in ints}
        values["mean_waits_per_task"] = FloatAttr(_short(self.mean_waits_per_task), f64)
        values["critical_path_us"] = FloatAttr(_short(self.critical_path_us), f64)
        values["est_us"] = FloatAttr(_short(self.est_us), f64)
        values["coarse_events"] = IntegerAttr(self.coarse_events, i64)
        values["stacked_queues"] = IntegerAttr(self.stacked_queues, i64)
        values["flagged_waits"] = IntegerAttr(self.flagged_waits, i64)
        return DictionaryAttr(values)


def _estimate(
    graph: GraphOp, index: GraphIndex, dag: TaskDag, order: list[int], num_sms: int
) -> tuple[float, list[Sequence[int]]]:
    """The makespan and the queues of the graph's schedule, or of the list schedule when it has
    none."""
    if index.schedule is None:
        result = list_schedule(dag, bottom_levels(dag, order), num_sms)
        assert result is not None  # the DAG is acyclic
        return result.makespan_us, list(result.queues)
    if (problem := check_queues_deadlock_free(graph)) is not None:
        raise MkError(f"task-stats: {problem}", op_location(index.schedule))
    queues = [q.task_ids for q in index.schedule.queues]
    makespan = queue_makespan(dag, queues)
    assert makespan is not None  # checked deadlock-free above
    return makespan, list(queues)


def critical_tasks(dag: TaskDag, queues: Sequence[Sequence[int]]) -> set[int]:
    """The tasks that end the schedule late: on a longest chain of the dependences together with
    each queue's order, so that any delay to one delays the end."""
    pairs = [(a, b) for queue in queues for a, b in zip(queue, queue[1:], strict=False)]
    base = len(dag.producer_counts)
    signals = [list(s) for s in dag.signals]
    waits = [list(w) for w in dag.waits]
    for counter, (a, b) in enumerate(pairs, start=base):
        signals[a].append(counter)
        waits[b].append(counter)
    timed = replace(
        dag,
        signals=signals,
        waits=waits,
        waiters=[*dag.waiters, *([b] for _, b in pairs)],
        producer_counts=[*dag.producer_counts, *([1] * len(pairs))],
        producers=[*dag.producers, *([a] for a, _ in pairs)],
    )
    order = topological_order(timed)
    assert order is not None  # the queues were checked deadlock-free, or built by the scheduler
    top, bottom = top_levels(timed, order), bottom_levels(timed, order)
    length = max(bottom, default=0.0)
    slack = 1e-9 * max(length, 1.0)  # rounding of the summed times
    return {t for t in range(dag.num_tasks) if top[t] + bottom[t] >= length - slack}


def stacked_queues(
    index: GraphIndex, queues: Sequence[Sequence[int]], num_sms: int, critical: set[int]
) -> int:
    """(queue, grid) pairs with two or more tasks of a grid of at most `num_sms` tasks, one of
    them critical (stacked tasks with slack, such as cache writes on SMs a phase leaves idle,
    delay nothing)."""
    stacked = 0
    for queue in queues:
        tasks: dict[GridOp, list[int]] = {}
        for task in queue:
            tasks.setdefault(index.locate(task)[0], []).append(task)
        stacked += sum(
            len(ts) > 1 and grid.num_tasks <= num_sms and not critical.isdisjoint(ts)
            for grid, ts in tasks.items()
        )
    return stacked


def graph_stats(
    graph: GraphOp, num_sms: int, bandwidth_gbs: float, peak_tflops: float, task_us: float = 0.0
) -> GraphStats:
    index = graph.index()
    if index.schedule is not None:
        num_sms = int_value(index.schedule.num_sms)
    target = target_for(num_sms, bandwidth_gbs, peak_tflops, "task-stats")
    dag = build_dag(index, target, "task-stats", task_us)
    order = topological_order(dag)
    if order is None:
        raise MkError(
            f"task-stats: the dependences of @{graph.sym_name.data} form a cycle",
            op_location(graph),
        )
    est_us, queues = _estimate(graph, index, dag, order, num_sms)
    per_grid = [len(grid.waits) for grid in index.grids]
    return GraphStats(
        tasks=index.total_tasks,
        grids=len(index.grids),
        events=len(index.events),
        event_elements=index.total_counters,
        waits=sum(n * grid.num_tasks for n, grid in zip(per_grid, index.grids, strict=True)),
        max_waits_per_task=max(per_grid, default=0),
        critical_path_us=max(bottom_levels(dag, order), default=0.0),
        est_us=est_us,
        coarse_events=sum(COARSE_ATTR in e.attributes for e in index.events.values()),
        stacked_queues=stacked_queues(index, queues, num_sms, critical_tasks(dag, queues)),
        flagged_waits=sum(
            grid.num_tasks * sum(index.events[e.event_name].is_flagged for e in grid.waits)
            for grid in index.grids
        ),
    )


@dataclass(frozen=True)
class TaskStatsPass(ModulePass):
    """`task-stats{num-sms=132 bandwidth-gbs=4100.0 peak-tflops=740.0 task-us=0.0}`."""

    name = "task-stats"

    num_sms: int = 132
    bandwidth_gbs: float = 4100.0
    peak_tflops: float = 740.0
    task_us: float = 0.0  # fixed cost of every task, beyond its bytes and FLOPs

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        target_for(self.num_sms, self.bandwidth_gbs, self.peak_tflops, self.name)  # validates
        if not self.task_us >= 0:
            raise MkError(f"{self.name}: task-us must be >= 0, got {self.task_us}")
        for graph in task_graphs(op):
            stats = graph_stats(
                graph, self.num_sms, self.bandwidth_gbs, self.peak_tflops, self.task_us
            )
            graph.attributes[STATS_ATTR] = stats.attr()
