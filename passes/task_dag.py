"""The dependence DAG of one iteration of a task graph and a list schedule of it: what
task-schedule builds and task-stats and the steady-state layout (task_schedule_loop) read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskDag:
    """Tasks 0..T-1 and counters 0..C-1 (the flat event-element numbering of `GraphIndex`)."""

    cost_us: list[float]  # per task: time on one SM
    signals: list[list[int]]  # per task: the counters it signals
    waits: list[list[int]]  # per task: the distinct counters it waits on with distance 0
    waiters: list[list[int]]  # per counter: the tasks waiting on it with distance 0
    producer_counts: list[int]  # per counter: how many tasks signal it per iteration
    producers: list[list[int]]  # per counter: the tasks that signal it
    tails: frozenset[int] = frozenset()  # tail tasks: run by their event's last signal, unqueued

    @property
    def num_tasks(self) -> int:
        return len(self.cost_us)


@dataclass(frozen=True)
class ListSchedule:
    queues: list[list[int]]  # per SM, in run order (possibly empty)
    makespan_us: float
    order: list[int]  # every task, queued or tail, in one order the queues and waits respect
    ends: list[float]  # per task: when it ends in the model
