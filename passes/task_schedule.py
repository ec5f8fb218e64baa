"""task-schedule: static per-SM queues by critical-path-first list scheduling over the event DAG.

`task-schedule{num-sms=132 bandwidth-gbs=4100.0 peak-tflops=740.0}` replaces the `task.schedule`
of every `task.graph` with one queue per SM that gets work:

1. The dependence DAG has one node per task and one per event element (counter). A task points
   to every element it signals; an element points to every task that waits on it with distance
   0 (a loop-carried wait is met by an earlier iteration, so it orders nothing inside one).
2. A task's time on one SM comes from its grid's `cost(bytes, flops)`: one SM gets a
   `1/num_sms` share of the bandwidth and of the peak, and the task takes the larger of
   `bytes / bandwidth_share` and `flops / peak_share`; a grid without a cost takes 1 µs.
3. A task's priority is its bottom level: its time plus the longest path of times after it.
4. List scheduling on a simulated clock: the SM that becomes free first takes, among the tasks
   whose producers have all finished by then, the one with the highest priority (ties: lowest
   task id) and appends it to its queue. No SM idles while a task is ready.

Why no interleaving can deadlock: a task is picked only after every producer of every element it
waits on was picked, so the picking order is one topological order of the DAG, and each queue,
being filled in that order, is a subsequence of it. Hence every dependence and every queue edge
points forward in that order, so in any interleaving the first unfinished task of that order has
all its producers and all its queue predecessors finished and can run; across iterations the
order (iteration, pick position) does the same, since loop-carried waits point to earlier
iterations. The pass still checks the result with `check_queues_deadlock_free`.

Tail grids (marked by task-tails) are in no queue: the SM whose signal completes a tail task's
element runs it next. The model runs a tail as soon as its producers finish, on no SM; the pick
order then says whether a tail could block its SM (late_tails), and such grids are queued.

`fixed-us=T` adds T µs to every task's time (its wait, dispatch and signal, which bytes and
flops leave out). A decode loop (loop-carried waits, no tails) then gets a second list schedule
that starts each SM where the first leaves it at the end of an iteration, less its makespan, and
each task no earlier than its loop-carried producers (task_schedule_loop); its queues replace the
first's when they run an iteration faster over several iterations in the same model. The
default, 2 µs, is about what a task's wait, staging and signal measured on the H100 and H200;
with it the step boundary of qwen3-0.6b at batch 1 fell from 61.7 to 15.4 µs on an H100
(bench/RESULTS.md). 0 schedules on bytes and flops alone, as before.

Grid-level `prefetch(...)` hints are left as they are: a task may load those weights as soon as
its SM reaches it in the queue, before its waits fire.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from mk.diagnostics import MkError, op_location
from mk.dialects.task import GraphOp, GridOp
from mk.dialects.task_index import TAIL_ATTR, GraphIndex, check_queues_deadlock_free
from mk.dialects.task_maps import edge_elements, format_coords, linearize
from mk.dialects.task_schedule import QueueOp, ScheduleOp
from mk.passes.cost_model import Target
from mk.passes.task_dag import ListSchedule, TaskDag
from mk.passes.task_schedule_loop import loop_waits, steady_start, unrolled

FALLBACK_TASK_US = 1.0


def target_for(num_sms: int, bandwidth_gbs: float, peak_tflops: float, pass_name: str) -> Target:
    """The cost-model target of a pass's options, rejecting impossible ones with a clear error."""
    if num_sms < 1:
        raise MkError(f"{pass_name}: num-sms must be >= 1, got {num_sms}")
    if bandwidth_gbs <= 0 or peak_tflops <= 0:
        raise MkError(f"{pass_name}: bandwidth-gbs and peak-tflops must be > 0")
    return Target(num_sms=num_sms, bandwidth=bandwidth_gbs * 1e9, peak_flops=peak_tflops * 1e12)


def task_costs_us(index: GraphIndex, target: Target) -> list[float]:
    """Each task's time on one SM, in microseconds (tasks of a grid cost the same)."""
    costs: list[float] = []
    for grid in index.grids:
        cost = grid.cost
        if cost:
            seconds = max(
                cost.get("bytes", 0) * target.num_sms / target.bandwidth,
                cost.get("flops", 0) * target.num_sms / target.peak_flops,
            )
            costs.extend([seconds * 1e6] * grid.num_tasks)
        else:
            costs.extend([FALLBACK_TASK_US] * grid.num_tasks)
    return costs


def _edge_pairs(index: GraphIndex, waits: bool) -> tuple[np.ndarray, np.ndarray]:
    """(task, counter) pairs of every signal, or of every distance-0 wait, without repeats."""
    tasks: list[np.ndarray] = []
    counters: list[np.ndarray] = []
    table = index.consumers if waits else index.producers
    for name, edges in table.items():
        shape = index.events[name].shape_tuple
        for grid, edge in edges:
            if waits and edge.distance_value != 0:
                continue
            elements = edge_elements(grid, edge)
            if elements is None:
                raise ValueError(f"@{grid.sym_name.data} has a malformed edge to @{name}")
            tasks.append(index.base_of(grid) + np.arange(grid.num_tasks, dtype=np.int64))
            counters.append(index.counter_bases[name] + linearize(elements, shape))
    if not tasks:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pairs = np.unique(np.stack([np.concatenate(tasks), np.concatenate(counters)], axis=1), axis=0)
    return pairs[:, 0], pairs[:, 1]


def _group(keys: np.ndarray, values: np.ndarray, size: int) -> list[list[int]]:
    """values grouped by key (0..size-1), each group in ascending value order."""
    order = np.lexsort((values, keys))
    bounds = np.searchsorted(keys[order], np.arange(size + 1))
    flat, at = values[order].tolist(), bounds.tolist()
    return [flat[at[i] : at[i + 1]] for i in range(size)]


def build_dag(
    index: GraphIndex, target: Target, pass_name: str = "task-schedule", fixed_us: float = 0.0
) -> TaskDag:
    """The dependence DAG of one iteration, each task `fixed_us` dearer than its bytes and
    flops make it; raises MkError for a wait that nothing signals."""
    sig_tasks, sig_counters = _edge_pairs(index, waits=False)
    wait_tasks, wait_counters = _edge_pairs(index, waits=True)
    tasks, counters = index.total_tasks, index.total_counters
    producer_counts = np.bincount(sig_counters, minlength=counters)
    orphan = np.flatnonzero(producer_counts[wait_counters] == 0)
    if orphan.size:
        task, counter = int(wait_tasks[orphan[0]]), int(wait_counters[orphan[0]])
        name, element = index.locate_counter(counter)
        raise MkError(
            f"{pass_name}: {index.describe(task)} waits on @{name}{format_coords(element)}, "
            f"which no task signals",
            op_location(index.graph),
        )
    return TaskDag(
        cost_us=[cost + fixed_us for cost in task_costs_us(index, target)],
        signals=_group(sig_tasks, sig_counters, tasks),
        waits=_group(wait_tasks, wait_counters, tasks),
        waiters=_group(wait_counters, wait_tasks, counters),
        producer_counts=producer_counts.tolist(),
        producers=_group(sig_counters, sig_tasks, counters),
        tails=frozenset(index.tail_tasks()),
    )


def topological_order(dag: TaskDag) -> list[int] | None:
    """The tasks in an order that respects every dependence, or None if they form a cycle."""
    missing = [len(w) for w in dag.waits]
    pending = list(dag.producer_counts)
    order = [t for t in range(dag.num_tasks) if missing[t] == 0]
    for task in order:  # grows while it is walked
        for counter in dag.signals[task]:
            pending[counter] -= 1
            if pending[counter] == 0:
                for waiter in dag.waiters[counter]:
                    missing[waiter] -= 1
                    if missing[waiter] == 0:
                        order.append(waiter)
    return order if len(order) == dag.num_tasks else None


def top_levels(dag: TaskDag, order: Sequence[int]) -> list[float]:
    """Per task: the longest chain of task times that must precede it (its earliest start)."""
    level = [0.0] * dag.num_tasks
    counter_ready = [0.0] * len(dag.producer_counts)
    for task in order:
        level[task] = max((counter_ready[c] for c in dag.waits[task]), default=0.0)
        end = level[task] + dag.cost_us[task]
        for counter in dag.signals[task]:
            counter_ready[counter] = max(counter_ready[counter], end)
    return level


def bottom_levels(dag: TaskDag, order: Sequence[int]) -> list[float]:
    """Per task: its time plus the longest chain of task times that must follow it."""
    level = [0.0] * dag.num_tasks
    counter_level = [0.0] * len(dag.producer_counts)
    for task in reversed(order):
        after = max((counter_level[c] for c in dag.signals[task]), default=0.0)
        level[task] = dag.cost_us[task] + after
        for counter in dag.waits[task]:
            counter_level[counter] = max(counter_level[counter], level[task])
    return level


def _cycle_error(index: GraphIndex, dag: TaskDag) -> MkError:
    order = set(topological_order(dag) or [])
    stuck = next(t for t in range(dag.num_tasks) if t not in order)
    return MkError(
        f"task-schedule: the dependences of @{index.graph.sym_name.data} form a cycle "
        f"through {index.describe(stuck)}",
        op_location(index.graph),
    )


@dataclass
class _Clock:
    """The list scheduler's state: SMs by the time they become free, and tasks by readiness."""

    dag: TaskDag
    missing: list[int]
    pending: list[int]
    counter_done: list[float]
    ready_at: list[float]
    available: list[tuple[float, int]]  # (time its last producer finishes, task)
    order: list[int]  # tasks in the order they were picked or, for tails, run

    @classmethod
    def start(cls, dag: TaskDag, ready: Sequence[float] | None = None) -> _Clock:
        """The clock at the iteration's start; `ready`: each task's earliest start (0)."""
        missing = [len(w) for w in dag.waits]
        ready_at = list(ready) if ready is not None else [0.0] * dag.num_tasks
        available = [
            (ready_at[t], t) for t in range(dag.num_tasks) if missing[t] == 0 and t not in dag.tails
        ]
        counters = len(dag.producer_counts)
        pending = list(dag.producer_counts)
        # -inf: an iteration laid out from its steady start may run before time 0
        done = [-math.inf] * counters
        return cls(dag, missing, pending, done, ready_at, available, [])

    def finish(self, task: int, end: float) -> list[int]:
        """Records that `task` ends at `end`; waiters whose last producer this was get a time,
        and tail tasks among them run at once (on the SM that ran the last producer, which the
        model does not hold up). Returns `task` and the tails it ran, in order."""
        finished = [task]
        ends = {task: end}
        for done_task in finished:  # grows while it is walked
            for counter in self.dag.signals[done_task]:
                self.counter_done[counter] = max(self.counter_done[counter], ends[done_task])
                self.pending[counter] -= 1
                if self.pending[counter]:
                    continue
                done = self.counter_done[counter]
                for waiter in self.dag.waiters[counter]:
                    self.ready_at[waiter] = max(self.ready_at[waiter], done)
                    self.missing[waiter] -= 1
                    if self.missing[waiter] != 0:
                        continue
                    if waiter in self.dag.tails:
                        self.order.append(waiter)
                        finished.append(waiter)
                        ends[waiter] = self.ready_at[waiter] + self.dag.cost_us[waiter]
                    else:
                        heapq.heappush(self.available, (self.ready_at[waiter], waiter))
        return finished


def list_schedule(
    dag: TaskDag,
    priority: Sequence[float],
    num_sms: int,
    sm_free: Sequence[float] | None = None,
    ready_from: Sequence[float] | None = None,
) -> ListSchedule | None:
    """Critical-path-first list schedule on `num_sms` SMs, or None if the tasks form a cycle.
    `sm_free`: when each SM is free (0); `ready_from`: each task's earliest start (0)."""
    clock = _Clock.start(dag, ready_from)
    heapq.heapify(clock.available)
    ready: list[tuple[float, int]] = []  # (-priority, task): highest priority, then lowest id
    free_at = list(sm_free) if sm_free is not None else [0.0] * num_sms
    sms = sorted((free_at[sm], sm) for sm in range(num_sms))  # (time it is free, SM): a heap
    queues: list[list[int]] = [[] for _ in range(num_sms)]
    ends = [0.0] * dag.num_tasks
    makespan = 0.0
    for _ in range(dag.num_tasks - len(dag.tails)):
        while True:
            free = sms[0][0]
            while clock.available and clock.available[0][0] <= free:
                task = heapq.heappop(clock.available)[1]
                heapq.heappush(ready, (-priority[task], task))
            if ready:
                break
            if not clock.available:
                return None
            # Nothing can start before the next task's producers finish: SMs idle until then.
            wake = clock.available[0][0]
            while sms[0][0] < wake:
                heapq.heapreplace(sms, (wake, sms[0][1]))
        free, sm = sms[0]
        task = heapq.heappop(ready)[1]
        end = free + dag.cost_us[task]
        heapq.heapreplace(sms, (end, sm))
        queues[sm].append(task)
        clock.order.append(task)
        for done in clock.finish(task, end):
            ends[done] = end if done == task else clock.ready_at[done] + dag.cost_us[done]
            makespan = max(makespan, ends[done])
    if len(clock.order) < dag.num_tasks:
        return None  # a tail whose event never completes
    return ListSchedule(queues, makespan, clock.order, ends)


def queue_makespan(dag: TaskDag, queues: Sequence[Sequence[int]]) -> float | None:
    """When the last task ends if each SM runs its queue in order and every task starts as
    soon as its SM and its producers are done, or None if the queues deadlock."""
    ends = queue_ends(dag, queues)
    return None if ends is None else max(ends, default=0.0)


def queue_ends(dag: TaskDag, queues: Sequence[Sequence[int]]) -> list[float] | None:
    """Each task's end if each SM runs its queue in order and every task starts as soon as its
    SM and its producers are done (tails as soon as their element completes), or None if the
    queues deadlock."""
    clock = _Clock.start(dag)
    position = [0] * len(queues)
    sm_time = [0.0] * len(queues)
    ends = [0.0] * dag.num_tasks
    blocked: dict[int, list[int]] = {}  # counter -> SMs whose next task waits on it
    work = list(range(len(queues)))
    done = 0
    while work:
        sm = work.pop()
        queue = queues[sm]
        while position[sm] < len(queue):
            task = queue[position[sm]]
            unmet = next((c for c in dag.waits[task] if clock.pending[c]), None)
            if unmet is not None:
                blocked.setdefault(unmet, []).append(sm)
                break
            start = max(sm_time[sm], clock.ready_at[task])
            sm_time[sm] = start + dag.cost_us[task]
            position[sm] += 1
            for finished in clock.finish(task, sm_time[sm]):
                done += 1
                if finished == task:
                    ends[task] = sm_time[sm]
                else:
                    ends[finished] = clock.ready_at[finished] + dag.cost_us[finished]
                for counter in dag.signals[finished]:
                    if not clock.pending[counter]:
                        work.extend(blocked.pop(counter, []))
    return ends if done == dag.num_tasks else None


def steady_period(
    dag: TaskDag,
    loop: Sequence[Sequence[tuple[int, int]]],
    queues: Sequence[Sequence[int]],
    iterations: int = 3,
) -> float | None:
    """How long one iteration takes once the loop runs: the queues' makespan over `iterations`
    iterations less that over one fewer, each SM running its queue once per iteration and each
    task waiting for this iteration's producers and the earlier ones' (its loop-carried waits).
    None if the queues deadlock (or hold a tail task).

    One run of `iterations` gives both: an SM runs an iteration's tasks before any of the next
    one's, and no task waits on a later iteration, so the earlier iterations end as they would
    without the last."""
    if dag.tails or iterations < 2:
        return None
    n = dag.num_tasks
    repeated = [[i * n + t for i in range(iterations) for t in q] for q in queues]
    ends = queue_ends(unrolled(dag, loop, iterations), repeated)
    if ends is None:
        return None
    before_last = (iterations - 1) * n
    return max(ends, default=0.0) - max(ends[:before_last], default=0.0)


def late_tails(index: GraphIndex, dag: TaskDag, order: Sequence[int]) -> list[GridOp]:
    """Tail grids a tail of which could block its SM in `order`: another same-iteration wait
    has a producer later than the first producer of the tail's own element.

    A tail runs inline on whichever SM signals its element last; if it must wait there for a
    producer that comes after any of its element's producers in the order the queues follow,
    that producer might need the SM's next queued task, which waits behind the tail. When every
    other wait's producers come first, the first unfinished task of the order can always run.
    """
    position = {task: i for i, task in enumerate(order)}
    producers = dag.producers
    late: dict[str, GridOp] = {}
    for counter, (task, _) in index.tail_counters().items():
        first = min(position[p] for p in producers[counter])
        for other in dag.waits[task]:
            if other != counter and max(position[p] for p in producers[other]) > first:
                grid, _ = index.locate(task)
                late[grid.sym_name.data] = grid
    return list(late.values())


def schedule_graph(
    graph: GraphOp, num_sms: int, target: Target, fixed_us: float = 0.0
) -> ListSchedule:
    """Replaces the graph's task.schedule with a list schedule on `num_sms` SMs; grids marked
    as tails (task-tails) stay out of the queues, unless the schedule could make one block its
    SM (late_tails): those lose the mark and are queued like the rest. With `fixed_us`, every
    task costs that much more in the model, and a loop's queues are those of its steady state
    where that runs an iteration faster (steady_schedule)."""
    for op in list(graph.body.block.ops):
        if isinstance(op, ScheduleOp):
            graph.body.block.erase_op(op)
    while True:
        index = graph.index()
        dag = build_dag(index, target, fixed_us=fixed_us)
        order = topological_order(dag)
        if order is None:
            raise _cycle_error(index, dag)
        priority = bottom_levels(dag, order)
        result = list_schedule(dag, priority, num_sms)
        assert result is not None  # the DAG is acyclic
        late = late_tails(index, dag, result.order)
        if not late:
            break
        for grid in late:
            del grid.attributes[TAIL_ATTR]
    if fixed_us:
        result = steady_schedule(index, dag, priority, num_sms, result)
    schedule = ScheduleOp(num_sms)
    for sm, tasks in enumerate(result.queues):
        if tasks:
            schedule.body.block.add_op(QueueOp(sm, tasks))
    graph.body.block.add_op(schedule)
    if (problem := check_queues_deadlock_free(graph)) is not None:
        raise MkError(f"task-schedule: internal error: {problem}", op_location(graph))
    return result


def steady_schedule(
    index: GraphIndex, dag: TaskDag, priority: Sequence[float], num_sms: int, first: ListSchedule
) -> ListSchedule:
    """For a loop (loop-carried waits, no tails): the list schedule of an iteration that starts
    where `first` leaves each SM and each loop-carried producer, when its queues run an
    iteration faster than `first`'s (task_schedule_loop); else `first`."""
    loop = loop_waits(index)
    if dag.tails or not any(loop):
        return first
    start = steady_start(dag, loop, first)
    second = list_schedule(dag, priority, num_sms, start.sm_free, start.ready)
    if second is None:
        return first
    before = steady_period(dag, loop, first.queues)
    after = steady_period(dag, loop, second.queues)
    return second if before is not None and after is not None and after < before else first


def task_graphs(module: ModuleOp) -> list[GraphOp]:
    return [op for op in module.walk() if isinstance(op, GraphOp)]


@dataclass(frozen=True)
class TaskSchedulePass(ModulePass):
    """`task-schedule{num-sms=132 bandwidth-gbs=4100.0 peak-tflops=740.0 fixed-us=2.0}`.

    `fixed-us`: a task's fixed cost in the model (its wait, dispatch and signal), µs; 0 models
    bytes and flops alone. With it a decode loop's queues are laid out for the steady state.
    """

    name = "task-schedule"

    num_sms: int = 132
    bandwidth_gbs: float = 4100.0
    peak_tflops: float = 740.0
    fixed_us: float = 2.0

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        target = target_for(self.num_sms, self.bandwidth_gbs, self.peak_tflops, self.name)
        if self.fixed_us < 0:
            raise MkError(f"{self.name}: fixed-us must be >= 0, got {self.fixed_us}")
        for graph in task_graphs(op):
            schedule_graph(graph, self.num_sms, target, self.fixed_us)
