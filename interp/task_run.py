"""One randomised run of a scheduled task graph, and what a run reports (results, violations)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mk.dialects.task import GridOp
from mk.dialects.task_maps import format_coords, wait_threshold

if TYPE_CHECKING:
    from .task import Reference, Simulator, _Memory  # relative: one module identity for checkers


@dataclass(frozen=True)
class Violation:
    """The first thing that went wrong, with what a message and a location need."""

    kind: str  # raw | war | waw | deadlock | footprint | unscheduled
    message: str
    grid: GridOp | None = None
    event: str | None = None
    buffer: str | None = None
    task: int | None = None


@dataclass
class SimResult:
    """Output buffers by result index, the first violation (None if clean), and the run order."""

    outputs: tuple[np.ndarray, ...]
    violation: Violation | None
    order: list[tuple[int, int]] = field(default_factory=list)  # (iteration, task) by start


class _Deadlock(Exception):
    pass


class RandomRun:
    """One randomised execution: SMs walk their queues; starts and finishes are clock events."""

    def __init__(
        self, sim: Simulator, ref: Reference, rng: np.random.Generator, max_delay: int
    ) -> None:
        self.sim, self.ref, self.rng = sim, ref, rng
        self.max_delay = max(1, max_delay)
        self.counters = np.zeros(sim.index.total_counters, dtype=np.int64)
        self.order: list[tuple[int, int]] = []
        # per SM: (position in queue, iteration); `busy` while a task is started or running
        self.cursor = {sm: (0, 0) for sm, _ in sim.queues}
        self.queue = dict(sim.queues)
        self.busy: set[int] = set()
        self.clock: list[tuple[int, float, str, int]] = []  # (time, tie-break, kind, sm)
        # Vector clocks (one component per SM): what each SM and each counter has seen finish.
        self.row = {sm: i for i, (sm, _) in enumerate(sim.queues)}
        self.vc = np.zeros((len(self.row), len(self.row)), dtype=np.int64)
        self.cc = np.zeros((sim.index.total_counters, len(self.row)), dtype=np.int64)
        self.epoch: dict[int, tuple[int, int]] = {}  # stamp -> (SM row, its clock at finish)

    def next_task(self, sm: int) -> tuple[int, int] | None:
        pos, iteration = self.cursor[sm]
        ids = self.queue[sm]
        if not ids or iteration >= self.sim.iterations:
            return None
        return ids[pos], iteration

    def unmet_wait(self, task: int, iteration: int) -> tuple[int, int] | None:
        """(counter, threshold) of the first wait not yet met, or None."""
        for counter, count, distance in self.sim.tasks[task].waits:
            need = wait_threshold(count, iteration, distance)
            if self.counters[counter] < need:
                return counter, need
        return None

    def push(self, delay: int, kind: str, sm: int, now: int) -> None:
        heapq.heappush(self.clock, (now + delay, float(self.rng.random()), kind, sm))

    def wake(self, now: int) -> None:
        for sm in self.rng.permutation(list(self.cursor)):
            sm = int(sm)
            nxt = self.next_task(sm)
            if sm in self.busy or nxt is None or self.unmet_wait(*nxt) is not None:
                continue
            self.busy.add(sm)
            self.push(int(self.rng.integers(0, self.max_delay)), "start", sm, now)

    def run(self, inputs: Sequence[np.ndarray]) -> SimResult:
        sim = self.sim
        memory = sim.new_memory(inputs)
        running: dict[int, tuple[int, int, list[np.ndarray]]] = {}
        violation: Violation | None = None
        self.wake(0)
        while self.clock and violation is None:
            now, _, kind, sm = heapq.heappop(self.clock)
            if kind == "start":
                task, iteration = self.next_task(sm)  # type: ignore[misc]
                self.order.append((iteration, task))
                row = self.row[sm]
                for counter, _, _ in sim.tasks[task].waits:
                    np.maximum(self.vc[row], self.cc[counter], out=self.vc[row])
                violation = self.check_order(task, iteration, row)
                violation = violation or self.check_reads(memory, task, iteration)
                running[sm] = (task, iteration, sim.run_task(memory, task, iteration))
                self.push(int(self.rng.integers(1, self.max_delay + 1)), "finish", sm, now)
                continue
            task, iteration, values = running.pop(sm)
            violation = self.write(memory, task, iteration, values)
            row = self.row[sm]
            self.vc[row, row] += 1
            self.epoch[iteration * sim.num_tasks + task] = (row, int(self.vc[row, row]))
            for counter in sim.tasks[task].signals:
                self.counters[counter] += 1
                np.maximum(self.cc[counter], self.vc[row], out=self.cc[counter])
            pos, it = self.cursor[sm]
            self.cursor[sm] = (0, it + 1) if pos + 1 == len(self.queue[sm]) else (pos + 1, it)
            self.busy.discard(sm)
            self.wake(now)
        if violation is None:
            violation = self.deadlock() or self.final_stamps(memory)
        return SimResult(sim.results(memory), violation, self.order)

    def check_order(self, task: int, iteration: int, row: int) -> Violation | None:
        """Every conflicting earlier task must have finished and be ordered before this one."""
        sim = self.sim
        stamp = iteration * sim.num_tasks + task
        for other, kind, name in sim.conflicts[stamp]:
            done = self.epoch.get(other)
            if done is not None and self.vc[row, done[0]] >= done[1]:
                continue
            _, how = self.linking_event(other, stamp)
            when = (
                "before it finished"
                if done is None
                else "while nothing orders them (it finished first by chance)"
            )
            verb = {"raw": "reads", "waw": "writes", "war": "overwrites"}[kind]
            did = {"raw": "writes", "waw": "also writes", "war": "reads"}[kind]
            label = {
                "raw": "read-after-write",
                "waw": "write-after-write",
                "war": "write-after-read",
            }
            return Violation(
                kind,
                f"{label[kind]}: {sim.describe(stamp)} {verb} @{name}, which "
                f"{sim.describe(other)} {did}, {when} ({how})",
                sim.tasks[task].grid,
                self.linking_event(other, stamp)[0],
                name,
                task,
            )
        return None

    def check_reads(self, memory: _Memory, task: int, iteration: int) -> Violation | None:
        info = self.sim.tasks[task]
        expected = self.ref.expected[iteration, task]
        for (name, where), want in zip(info.reads, expected, strict=True):
            seen = memory.stamp_view(name)[where]
            bad = np.argwhere(seen != want)
            if bad.size:
                pos = tuple(int(p) for p in bad[0])
                element = [s.start + p for s, p in zip(where, pos, strict=False)]
                return self.read_violation(
                    task, iteration, name, element, int(seen[pos]), int(want[pos])
                )
        return None

    def read_violation(
        self, task: int, iteration: int, name: str, element: list[int], seen: int, want: int
    ) -> Violation:
        sim = self.sim
        reader = f"{sim.describe(iteration * sim.num_tasks + task)}"
        what = f"@{name}{format_coords(element)}"
        if seen < want:
            event, how = self.linking_event(want, iteration * sim.num_tasks + task)
            return Violation(
                "raw",
                f"read-after-write: {reader} reads {what} before its producer "
                f"{sim.describe(want)} finished ({how})",
                sim.tasks[task].grid,
                event,
                name,
                task,
            )
        writer_task = seen % sim.num_tasks
        event, how = self.linking_event(iteration * sim.num_tasks + task, seen)
        return Violation(
            "war",
            f"write-after-read: {sim.describe(seen)} overwrote {what} before {reader} read it "
            f"(it expected the value of {sim.describe(want)}; {how})",
            sim.tasks[writer_task].grid,
            event,
            name,
            task,
        )

    def linking_event(self, first: int, second: int) -> tuple[str | None, str]:
        """The event through which the task at stamp `second` waits for the one at `first`."""
        sim = self.sim
        (it1, t1), (it2, t2) = divmod(first, sim.num_tasks), divmod(second, sim.num_tasks)
        signalled = set(sim.tasks[t1].signals)
        for counter, count, distance in sim.tasks[t2].waits:
            if counter in signalled and distance == it2 - it1:
                name = sim.index.locate_counter(counter)[0]
                return name, (
                    f"it waits on {sim.describe_counter(counter)} count {count}, which reached "
                    "its threshold without that signal"
                )
        return None, (
            f"no event element {sim.index.describe(t2)} waits on at distance {it2 - it1} is "
            f"signalled by {sim.index.describe(t1)}"
        )

    def write(
        self, memory: _Memory, task: int, iteration: int, values: list[np.ndarray]
    ) -> Violation | None:
        sim = self.sim
        stamp = iteration * sim.num_tasks + task
        violation = None
        for (name, where), value in zip(sim.tasks[task].writes, values, strict=True):
            stamps = memory.stamp_view(name)[where]
            newer = np.argwhere(stamps > stamp)
            if violation is None and newer.size:
                pos = tuple(int(p) for p in newer[0])
                later = int(stamps[pos])
                element = [s.start + p for s, p in zip(where, pos, strict=False)]
                event, how = self.linking_event(stamp, later)
                violation = Violation(
                    "waw",
                    f"write-after-write: {sim.describe(stamp)} writes "
                    f"@{name}{format_coords(element)} after {sim.describe(later)}, which comes "
                    f"later in program order, already wrote it ({how})",
                    sim.tasks[later % sim.num_tasks].grid,
                    event,
                    name,
                    task,
                )
            memory.view(name)[where] = value
            memory.stamp_view(name)[where] = stamp
        return violation

    def deadlock(self) -> Violation | None:
        sim = self.sim
        blocked = []
        first: tuple[int, int] | None = None
        for sm in sorted(self.cursor):
            nxt = self.next_task(sm)
            if nxt is None:
                continue
            task, iteration = nxt
            unmet = self.unmet_wait(task, iteration)
            assert unmet is not None, "an SM with a startable task was left idle"
            counter, need = unmet
            first = first or (task, counter)
            blocked.append(
                f"SM {sm} at {sim.describe(iteration * sim.num_tasks + task)} waits on "
                f"{sim.describe_counter(counter)} (counter {int(self.counters[counter])}, "
                f"needs {need})"
            )
        if first is None:
            return None
        return Violation(
            "deadlock",
            "deadlock: no SM can progress: " + "; ".join(blocked),
            sim.tasks[first[0]].grid,
            sim.index.locate_counter(first[1])[0],
            task=first[0],
        )

    def final_stamps(self, memory: _Memory) -> Violation | None:
        sim = self.sim
        for buf, want in zip(sim.outputs, self.ref.finals, strict=True):
            name = buf.sym_name.data
            seen = memory.stamp_view(name)
            bad = np.argwhere(seen != want)
            if bad.size:
                pos = tuple(int(p) for p in bad[0])
                return Violation(
                    "waw",
                    f"write-after-write: output @{name}{format_coords(pos[:-1])} ends with the "
                    f"value of {sim.describe(int(seen[pos]))}, expected "
                    f"{sim.describe(int(want[pos]))}",
                    buffer=name,
                )
        return None
