"""task-schedule's steady state of a decode loop: the loop-carried waits, where the iteration
before leaves each SM, and the period of static queues run iteration after iteration.

One launch runs every iteration of the same per-SM queues, so an SM reaches iteration t + 1's
first task once it is done with iteration t's last. A list schedule of one iteration starts
every SM at 0: the SM that runs the end of the iteration's chain (a decode step's argmax and
token write) gets the tasks that need nothing yet (the next step's position) as readily as an SM
idle since the lm_head, and those then wait behind that chain. `steady_start` says when each SM
and each task can start in iteration t + 1 given iteration t's schedule, and `unrolled` gives
the DAG of several iterations in which task_schedule's `steady_period` runs a candidate's queues,
loop-carried waits included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mk.dialects.task_index import GraphIndex
from mk.dialects.task_maps import edge_elements, linearize
from mk.passes.task_dag import ListSchedule, TaskDag


def loop_waits(index: GraphIndex) -> list[list[tuple[int, int]]]:
    """Per task: (counter, distance) of each wait on an earlier iteration (distance >= 1)."""
    waits: list[set[tuple[int, int]]] = [set() for _ in range(index.total_tasks)]
    for name, edges in index.consumers.items():
        shape = index.events[name].shape_tuple
        for grid, edge in edges:
            distance = edge.distance_value
            elements = edge_elements(grid, edge)
            if distance == 0 or elements is None:
                continue
            counters = index.counter_bases[name] + linearize(elements, shape)
            base = index.base_of(grid)
            for i, counter in enumerate(counters.tolist()):
                waits[base + i].add((int(counter), distance))
    return [sorted(w) for w in waits]


@dataclass(frozen=True)
class SteadyStart:
    """Iteration t + 1 as iteration t's schedule leaves it, in µs from its own start (the
    earlier iteration's ends less its makespan): when each SM is free and when each task's
    loop-carried producers are done (a task with no waits at all: as soon as any SM is)."""

    sm_free: list[float]
    ready: list[float]


def steady_start(
    dag: TaskDag, loop: Sequence[Sequence[tuple[int, int]]], before: ListSchedule
) -> SteadyStart:
    """Where `before`, one iteration's schedule, leaves the next iteration (SteadyStart)."""
    period = before.makespan_us
    sm_free = [(before.ends[q[-1]] if q else 0.0) - period for q in before.queues]
    done = counter_ends(dag, before.ends)
    earliest = min(sm_free, default=0.0)
    ready = []
    for task in range(dag.num_tasks):
        carried = [done[c] - d * period for c, d in loop[task]]
        if carried:
            ready.append(max(carried))
        else:  # no waits: any free SM; else this iteration's producers alone say when
            ready.append(earliest if not dag.waits[task] else -math.inf)
    return SteadyStart(sm_free, ready)


def counter_ends(dag: TaskDag, ends: Sequence[float]) -> list[float]:
    """Per counter: when its last producer ends."""
    done = [0.0] * len(dag.producer_counts)
    for counter, producers in enumerate(dag.producers):
        if producers:
            done[counter] = max(ends[p] for p in producers)
    return done


def unrolled(dag: TaskDag, loop: Sequence[Sequence[tuple[int, int]]], iterations: int) -> TaskDag:
    """`iterations` copies of one iteration's DAG in one (task i·T + t, counter i·C + c), each
    loop-carried wait a plain wait on the earlier copy's counter (none before the first)."""
    n, counters = dag.num_tasks, len(dag.producer_counts)
    waits = [
        [i * counters + c for c in dag.waits[t]]
        + [(i - d) * counters + c for c, d in loop[t] if i - d >= 0]
        for i in range(iterations)
        for t in range(n)
    ]
    waiters: list[list[int]] = [[] for _ in range(iterations * counters)]
    for task, cs in enumerate(waits):
        for c in cs:
            waiters[c].append(task)
    return TaskDag(
        cost_us=list(dag.cost_us) * iterations,
        signals=[
            [i * counters + c for c in dag.signals[t]] for i in range(iterations) for t in range(n)
        ],
        waits=waits,
        waiters=waiters,
        producer_counts=list(dag.producer_counts) * iterations,
        producers=[[i * n + p for p in ps] for i in range(iterations) for ps in dag.producers],
    )
