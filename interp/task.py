"""The task-graph simulator: runs a scheduled task.graph on the CPU in random valid interleavings.

Memory is real: activation and workspace buffers are views into one arena byte array at their
offsets, so arena reuse really clobbers; the other buffers get their own bytes after it. Every
byte carries the stamp of its last writer, `iteration * tasks + task id`, which is also the
task's position in the *sequential order* (iterations in turn, grids in declaration order, tasks
by id): the program order, independent of events and queues.

A reference run executes the tasks in that order and records, for every read of every task, the
stamps it must see. A simulation walks each SM's queue once per iteration; a task starts (and
reads) at a random moment after its waits are met and finishes (writes, then signals) a random
time later. A read that sees an older stamp than expected read before its producer finished
(RAW), a newer one read data that was already overwritten (WAR); a write landing on a newer
stamp reorders two writes (WAW). No startable task while some remain is a deadlock.

One task runs its grid body (the convention of `mk.dialects.task`): the body's block arguments
are whole buffers, NaN (integers: their minimum) outside the task's read footprints; a
`mugraph.graph_def` runs only the block at the task's coordinates, a `mugraph.kernel` runs whole;
only the write footprints of the yielded values reach memory.

The randomised run itself, and the `SimResult` and `Violation` it reports, live in `task_run`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from xdsl.ir import Operation, SSAValue

from mk.dialects.mugraph import GraphDefOp, KernelOp
from mk.dialects.task import ARENA_KINDS, GraphOp, GridOp, YieldOp
from mk.dialects.task_index import GraphIndex
from mk.dialects.task_maps import (
    eval_point,
    format_coords,
    grid_points,
    int_value,
)
from mk.inputs import numpy_dtype
from mk.interp.mugraph import run_graph_def, run_kernel
from mk.interp.nn_ops import current_step
from mk.interp.task_order import Conflict, conflicts, footprint_bytes

# Relative, so that type checkers that see this folder as `interp` keep one module identity.
from .task_run import RandomRun, SimResult, Violation

__all__ = ["Simulator", "SimResult", "Violation", "sequential", "simulate"]

_ALIGN = 128
DEFAULT_MAX_DELAY = 8


def _fill(dtype: np.dtype) -> float | int | bool:
    if dtype.kind == "b":
        return False
    return int(np.iinfo(dtype).min) if dtype.kind in "iu" else float("nan")


@dataclass(frozen=True)
class _Task:
    grid: GridOp
    coords: tuple[int, ...]
    reads: tuple[tuple[str, tuple[slice, ...]], ...]
    writes: tuple[tuple[str, tuple[slice, ...]], ...]
    waits: tuple[tuple[int, int, int], ...]  # (counter, count, distance)
    signals: tuple[int, ...]


class _Memory:
    """All buffers as typed views of one byte array, with a writer stamp per byte."""

    def __init__(self, index: GraphIndex, alias: bool) -> None:
        """`alias`: arena buffers at their offsets (real reuse); else every buffer apart."""
        self.offsets: dict[str, int] = {}
        end = int_value(index.graph.arena) if alias else 0
        for name, buf in index.buffers.items():
            if alias and buf.kind.data in ARENA_KINDS:
                self.offsets[name] = int_value(buf.offset)  # type: ignore[arg-type]
            else:
                self.offsets[name] = end
                end += -(-buf.nbytes // _ALIGN) * _ALIGN
        self.buffers = index.buffers
        self.bytes = np.zeros(end, dtype=np.uint8)
        self.stamps = np.full(end, -1, dtype=np.int64)

    def dtype(self, name: str) -> np.dtype:
        return numpy_dtype(self.buffers[name].buffer_type.get_element_type())

    def view(self, name: str) -> np.ndarray:
        buf, start = self.buffers[name], self.offsets[name]
        raw = self.bytes[start : start + buf.nbytes]
        return raw.view(self.dtype(name)).reshape(buf.shape)

    def stamp_view(self, name: str) -> np.ndarray:
        """Stamps as (*shape, itemsize): one row of byte stamps per element."""
        buf, start = self.buffers[name], self.offsets[name]
        itemsize = self.dtype(name).itemsize
        return self.stamps[start : start + buf.nbytes].reshape(*buf.shape, itemsize)

    def byte_range(self, name: str) -> tuple[int, int]:
        return self.offsets[name], self.offsets[name] + self.buffers[name].nbytes


class Simulator:
    """A scheduled task.graph prepared for reference and simulated runs."""

    def __init__(self, graph: GraphOp) -> None:
        self.graph = graph
        self.index = graph.index()
        self.iterations = int_value(graph.iterations)
        self.num_tasks = self.index.total_tasks
        self.tasks = [task for grid in self.index.grids for task in self._grid_tasks(grid)]
        self.queues: list[tuple[int, tuple[int, ...]]] = []
        if self.index.schedule is not None:
            self.queues = [(int_value(q.sm), q.task_ids) for q in self.index.schedule.queues]
        self.inputs = sorted(
            (b for b in self.index.buffers.values() if b.kind.data in ("input", "weight")),
            key=lambda b: int_value(b.index),  # type: ignore[arg-type]
        )
        self.outputs = sorted(
            (b for b in self.index.buffers.values() if b.kind.data == "output"),
            key=lambda b: int_value(b.index),  # type: ignore[arg-type]
        )

    @functools.cached_property
    def conflicts(self) -> list[list[Conflict]]:
        """Per stamp, the earlier stamps whose accesses to the same physical bytes conflict."""
        memory = _Memory(self.index, alias=True)

        def addresses(
            fps: tuple[tuple[str, tuple[slice, ...]], ...],
        ) -> list[tuple[str, np.ndarray]]:
            return [
                (n, footprint_bytes(memory.offsets[n], memory.stamp_view(n).shape, w))
                for n, w in fps
            ]

        accesses = [(addresses(t.reads), addresses(t.writes)) for t in self.tasks]
        return conflicts(accesses, self.iterations)

    def _grid_tasks(self, grid: GridOp) -> list[_Task]:
        events = self.index.events
        tasks = []
        for point in grid_points(grid.shape_tuple):
            coords = tuple(int(c) for c in point)
            waits = tuple(
                (
                    self.index.counter(e.event_name, eval_point(e.element_map, coords)),
                    events[e.event_name].count_value,
                    e.distance_value,
                )
                for e in grid.waits
            )
            signals = tuple(
                self.index.counter(e.event_name, eval_point(e.element_map, coords))
                for e in grid.signals
            )
            reads = tuple((f.buffer_name, f.slices(coords)) for f in grid.reads)
            writes = tuple((f.buffer_name, f.slices(coords)) for f in grid.writes)
            tasks.append(_Task(grid, coords, reads, writes, waits, signals))
        return tasks

    # ------------------------------------------------------------------------------ naming

    def describe(self, stamp: int) -> str:
        """`task 5 (@k[1]) of iteration 0`, or `the initial contents` for stamp -1."""
        if stamp < 0:
            return "the initial contents"
        iteration, task = divmod(stamp, self.num_tasks)
        return f"{self.index.describe(task)} of iteration {iteration}"

    def describe_counter(self, counter: int) -> str:
        name, element = self.index.locate_counter(counter)
        return f"@{name}{format_coords(element)}"

    # ------------------------------------------------------------------------------ runs

    def new_memory(self, inputs: Sequence[np.ndarray], alias: bool = True) -> _Memory:
        if len(inputs) != len(self.inputs):
            raise ValueError(f"expected {len(self.inputs)} inputs, got {len(inputs)}")
        memory = _Memory(self.index, alias)
        for buf, value in zip(self.inputs, inputs, strict=True):
            name = buf.sym_name.data
            if value.shape != buf.shape or value.dtype != memory.dtype(name):
                raise ValueError(
                    f"input @{name}: expected {buf.buffer_type}, got {value.dtype}{value.shape}"
                )
            memory.view(name)[...] = value
        return memory

    def results(self, memory: _Memory) -> tuple[np.ndarray, ...]:
        return tuple(memory.view(b.sym_name.data).copy() for b in self.outputs)

    def run_task(
        self, memory: _Memory, task: int, iteration: int, unmasked: int | None = None
    ) -> list[np.ndarray]:
        """The values one task writes in `iteration`, one per write footprint (of the yielded buffers).

        `unmasked`: -1 gives every read buffer whole, k >= 0 only read k (footprint checks).
        """
        info = self.tasks[task]
        args: list[np.ndarray] = []
        for pos, (name, where) in enumerate(info.reads):
            whole = memory.view(name)
            arg = np.full_like(whole, _fill(whole.dtype))
            if unmasked in (-1, pos):
                arg[...] = whole
            else:
                arg[where] = whole[where]
            args.append(arg)
        for name, _ in info.writes:
            whole = memory.view(name)
            args.append(np.full_like(whole, _fill(whole.dtype)))
        token = current_step.set(iteration)
        try:
            yielded = _run_body(info.grid, info.coords, args)
        finally:
            current_step.reset(token)
        return [
            np.asarray(value, dtype=memory.dtype(name))[where].copy()
            for value, (name, where) in zip(yielded, info.writes, strict=True)
        ]

    def reference(self, inputs: Sequence[np.ndarray]) -> Reference:
        """The sequential run: expected read stamps, final stamps, outputs, footprint checks.

        Buffers do not alias here: what a read must see is the last write to the same buffer
        element in program order, whatever the arena plan; the simulation's physical stamps are
        compared with these logical ones, so reuse of live bytes shows up as a WAR.
        """
        memory = self.new_memory(inputs, alias=False)
        expected: dict[tuple[int, int], list[np.ndarray]] = {}
        violation = None
        for iteration in range(self.iterations):
            for task in range(self.num_tasks):
                info = self.tasks[task]
                expected[iteration, task] = [
                    memory.stamp_view(name)[where].copy() for name, where in info.reads
                ]
                values = self.run_task(memory, task, iteration)
                if violation is None:
                    violation = self._footprint_problem(memory, task, iteration, values)
                stamp = iteration * self.num_tasks + task
                for (name, where), value in zip(info.writes, values, strict=True):
                    memory.view(name)[where] = value
                    memory.stamp_view(name)[where] = stamp
        finals = [memory.stamp_view(b.sym_name.data).copy() for b in self.outputs]
        return Reference(self.results(memory), expected, finals, violation)

    def _footprint_problem(
        self, memory: _Memory, task: int, iteration: int, values: list[np.ndarray]
    ) -> Violation | None:
        """A task whose writes change when it sees whole buffers reads outside its footprints;
        one that writes fill values writes more than its kernel produces."""
        info = self.tasks[task]
        whole = self.run_task(memory, task, iteration, unmasked=-1)
        if not all(_same(a, b) for a, b in zip(values, whole, strict=True)):
            culprit = (
                next(
                    pos
                    for pos in range(len(info.reads))
                    if not all(
                        _same(a, b)
                        for a, b in zip(
                            values, self.run_task(memory, task, iteration, pos), strict=True
                        )
                    )
                )
                if info.reads
                else None
            )
            name = info.reads[culprit][0] if culprit is not None else None
            where = f" of @{name}" if name else ""
            return Violation(
                "footprint",
                f"{self.index.describe(task)} reads outside its read footprint{where}: its "
                "writes change when it sees the whole buffer",
                info.grid,
                buffer=name,
                task=task,
            )
        for (name, where), value in zip(info.writes, values, strict=True):
            unset = _is_fill(value)
            if unset.any():
                pos = tuple(int(p) for p in np.argwhere(unset)[0])
                element = [s.start + p for s, p in zip(where, pos, strict=True)]
                return Violation(
                    "footprint",
                    f"{self.index.describe(task)} writes @{name}{format_coords(element)}, which "
                    "its kernel does not produce: the write footprint is larger than the task's "
                    "tile",
                    info.grid,
                    buffer=name,
                    task=task,
                )
        return None

    def simulate(
        self, inputs: Sequence[np.ndarray], seed: int, reference: Reference, max_delay: int
    ) -> SimResult:
        return RandomRun(self, reference, np.random.default_rng(seed), max_delay).run(inputs)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _is_fill(value: np.ndarray) -> np.ndarray:
    if value.dtype.kind == "f" or value.dtype.name == "bfloat16":
        return np.isnan(value.astype(np.float32))
    if value.dtype.kind in "iu":
        return value == np.iinfo(value.dtype).min
    return np.zeros(value.shape, dtype=bool)


def _run_body(grid: GridOp, coords: tuple[int, ...], args: list[np.ndarray]) -> list[np.ndarray]:
    """Interpret one grid body for the task at `coords` on whole-buffer arguments."""
    block = grid.body.block
    env: dict[SSAValue, np.ndarray] = dict(zip(block.args, args, strict=True))
    for op in block.ops:
        if isinstance(op, YieldOp):
            return [env[v] for v in op.values]
        # IEEE semantics as on the GPU (NaN inputs outside footprints are expected): no warnings.
        with np.errstate(all="ignore"):
            results = _run_op(op, coords, [env[v] for v in op.operands])
        env.update(zip(op.results, results, strict=True))
    raise ValueError(f"@{grid.sym_name.data}: body has no task.yield")


def _run_op(op: Operation, coords: tuple[int, ...], args: list[np.ndarray]) -> Sequence[np.ndarray]:
    if isinstance(op, KernelOp):
        return (run_kernel(op, args),)
    if isinstance(op, GraphDefOp):
        grid = op.grid_shape()
        if len(coords) > 3 or any(c >= g for c, g in zip(coords, grid, strict=False)):
            raise ValueError(f"task {list(coords)} is not a block of the kernel's grid {grid}")
        block = (*coords, *(0,) * (3 - len(coords)))
        return run_graph_def(op, args, [(block[0], block[1], block[2])])
    raise ValueError(f"'{op.name}' cannot run in a task body")


@dataclass
class Reference:
    """What the sequential run saw: outputs, each read's stamps, the outputs' final stamps."""

    outputs: tuple[np.ndarray, ...]
    expected: dict[tuple[int, int], list[np.ndarray]]
    finals: list[np.ndarray]
    violation: Violation | None


def _check_schedule(sim: Simulator) -> Violation | None:
    if sim.index.schedule is None:
        return Violation("unscheduled", f"@{sim.graph.sym_name.data} has no task.schedule")
    return None


def sequential(graph: GraphOp, inputs: Sequence[np.ndarray]) -> Reference:
    """Run every task once per iteration in program order (no schedule needed)."""
    return Simulator(graph).reference(inputs)


def simulate(
    graph: GraphOp,
    inputs: Sequence[np.ndarray],
    seed: int,
    max_delay: int = DEFAULT_MAX_DELAY,
    reference: Reference | None = None,
) -> SimResult:
    """One randomised run of a scheduled graph on `inputs` (input/weight buffers by index)."""
    sim = Simulator(graph)
    if (problem := _check_schedule(sim)) is not None:
        return SimResult((), problem)
    ref = reference if reference is not None else sim.reference(inputs)
    if ref.violation is not None:
        return SimResult(ref.outputs, ref.violation)
    return sim.simulate(inputs, seed, ref, max_delay)
