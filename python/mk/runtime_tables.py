"""NumPy layouts of the runtime's flat task tables (runtime/include/mk/tables.h) and a builder."""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Mirrors of the C enums; test_cpu_executor checks them against mk._runtime.
KIND_NOP, KIND_TRACE, KIND_ADD = 0, 1, 2
KIND_FIRST_LOWERED = 16
ADD_DST, ADD_A, ADD_B, ADD_BEGIN, ADD_END = range(5)
MAX_COORDS, MAX_TASK_ARGS, MAX_RANK = 3, 7, 4

# DType codes, in the order of mk/tables.h; the NumPy dtype is None for raw bytes and bf16
# (ml_dtypes), which the executor never interprets.
DTYPES: dict[str, int] = {
    "bytes": 0,
    "f32": 1,
    "f16": 2,
    "bf16": 3,
    "f64": 4,
    "i8": 5,
    "i32": 6,
    "i64": 7,
    "u8": 8,
}
DTYPE_SIZES: dict[str, int] = {
    "bytes": 1,
    "f32": 4,
    "f16": 2,
    "bf16": 2,
    "f64": 8,
    "i8": 1,
    "i32": 4,
    "i64": 8,
    "u8": 1,
}
# Same order as task.BUFFER_KINDS; the index is the C BufferKind.
BUFFER_KINDS = ("input", "weight", "output", "activation", "workspace")
ARENA_KINDS = ("activation", "workspace")

_I32 = "<i4"
TASK_DESC = np.dtype(
    [
        ("kind", _I32),
        ("grid", _I32),
        ("coord", _I32, (MAX_COORDS,)),
        ("wait_begin", _I32),
        ("wait_end", _I32),
        ("signal_begin", _I32),
        ("signal_end", _I32),
        ("args", _I32, (MAX_TASK_ARGS,)),
    ]
)
WAIT_DESC = np.dtype([("counter", _I32), ("count", _I32), ("distance", _I32)])
SIGNAL_DESC = np.dtype([("counter", _I32), ("tail", _I32), ("count", _I32)])
BUFFER_DESC = np.dtype(
    [
        ("offset_or_ptr", "<u8"),
        ("bytes", "<u8"),
        ("dtype", _I32),
        ("rank", _I32),
        ("kind", _I32),
        ("reserved", _I32),
        ("shape", "<i8", (MAX_RANK,)),
    ]
)
GRAPH_HEADER = np.dtype(
    [
        ("abi", _I32),
        ("num_tasks", _I32),
        ("num_waits", _I32),
        ("num_signals", _I32),
        ("num_sms", _I32),
        ("num_counters", _I32),
        ("num_buffers", _I32),
        ("iterations", _I32),
        ("arena_bytes", "<u8"),
    ]
)
RUN_STATUS = np.dtype(
    [
        ("error", _I32),
        ("sm", _I32),
        ("task", _I32),
        ("counter", _I32),
        ("iteration", _I32),
        ("value", "<u4"),
        ("threshold", "<u4"),
        ("wait_ms", _I32),
    ]
)
# C struct name -> NumPy row dtype.
LAYOUTS: dict[str, np.dtype] = {
    "TaskDesc": TASK_DESC,
    "WaitDesc": WAIT_DESC,
    "SignalDesc": SIGNAL_DESC,
    "BufferDesc": BUFFER_DESC,
    "GraphHeader": GRAPH_HEADER,
    "RunStatus": RUN_STATUS,
}
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Wait:
    """Wait until `counter` reaches count * (t + 1 - distance) in iteration t."""

    counter: int
    count: int = 1
    distance: int = 0


@dataclass(frozen=True)
class Task:
    """One task: its kind, tile, small args, waits (checked in order) and signalled counters."""

    kind: int
    waits: Sequence[Wait] = ()
    signals: Sequence[int] = ()
    grid: int = 0
    coord: Sequence[int] = ()
    args: Sequence[int] = ()


@dataclass(frozen=True)
class Buffer:
    """One buffer row; arena kinds sit at `offset` in the arena, the others are bound at run."""

    dtype: str
    shape: Sequence[int]
    kind: str = "activation"
    offset: int = 0
    bytes: int | None = None  # defaults to the shape's size

    @property
    def nbytes(self) -> int:
        dense = math.prod(self.shape) * DTYPE_SIZES.get(self.dtype, 1)
        return dense if self.bytes is None else self.bytes


@dataclass(frozen=True)
class Tables:
    """The flat tables of one scheduled graph, as NumPy arrays in the C layouts."""

    tasks: np.ndarray
    waits: np.ndarray
    signals: np.ndarray
    queue_offsets: np.ndarray
    queue_tasks: np.ndarray
    buffers: np.ndarray
    num_counters: int
    iterations: int = 1
    arena_bytes: int = 0

    @property
    def num_sms(self) -> int:
        return len(self.queue_offsets) - 1

    def header(self, abi: int = 1) -> np.ndarray:
        """The GraphHeader row of these tables."""
        row = np.zeros((), GRAPH_HEADER)
        sizes = (len(self.tasks), len(self.waits), len(self.signals), self.num_sms)
        row["abi"] = abi
        row["num_tasks"], row["num_waits"], row["num_signals"], row["num_sms"] = sizes
        row["num_counters"], row["num_buffers"] = self.num_counters, len(self.buffers)
        row["iterations"], row["arena_bytes"] = self.iterations, self.arena_bytes
        return row

    def executor(self, library: Any = None) -> Any:
        """A `mk._runtime.CpuExecutor` over these tables (kinds >= 16 from `library`, if given)."""
        runtime = importlib.import_module("mk._runtime")
        return runtime.CpuExecutor(
            self.tasks,
            self.waits,
            self.signals,
            self.queue_offsets,
            self.queue_tasks,
            self.buffers,
            num_counters=self.num_counters,
            iterations=self.iterations,
            arena_bytes=self.arena_bytes,
            library=library,
        )


def _check_int(table: str, index: int, what: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise ValueError(f"{table}[{index}]: {what} {value} outside {low}..{high}")
    return value


def _task_rows(
    tasks: Sequence[Task], num_counters: int, tails: Mapping[int, tuple[int, int]]
) -> tuple[np.ndarray, ...]:
    rows = np.zeros(len(tasks), TASK_DESC)
    waits: list[tuple[int, int, int]] = []
    signals: list[tuple[int, int, int]] = []
    top = num_counters - 1
    for i, task in enumerate(tasks):
        if len(task.coord) > MAX_COORDS or len(task.args) > MAX_TASK_ARGS:
            raise ValueError(f"tasks[{i}]: more than {MAX_COORDS} coords or {MAX_TASK_ARGS} args")
        row = rows[i]
        row["kind"] = _check_int("tasks", i, "kind", task.kind, 0, _INT32_MAX)
        row["grid"] = task.grid
        row["coord"][: len(task.coord)] = task.coord
        row["args"][: len(task.args)] = [
            _check_int("tasks", i, "arg", a, -(2**31), _INT32_MAX) for a in task.args
        ]
        row["wait_begin"] = len(waits)
        for w in task.waits:
            _check_int("tasks", i, "wait counter", w.counter, 0, top)
            _check_int("tasks", i, "wait count", w.count, 1, _INT32_MAX)
            _check_int("tasks", i, "wait distance", w.distance, 0, _INT32_MAX)
            waits.append((w.counter, w.count, w.distance))
        row["wait_end"] = len(waits)
        row["signal_begin"] = len(signals)
        for c in task.signals:
            _check_int("tasks", i, "signal counter", c, 0, top)
            signals.append((c, *tails.get(c, (-1, 0))))
        row["signal_end"] = len(signals)
    wait_rows = np.array(waits, dtype=np.int32).reshape(-1, 3).view(WAIT_DESC).reshape(-1)
    signal_rows = np.array(signals, dtype=np.int32).reshape(-1, 3).view(SIGNAL_DESC).reshape(-1)
    return rows, wait_rows, signal_rows


def _queue_rows(
    queues: Sequence[Sequence[int]], num_tasks: int, tail_tasks: set[int]
) -> tuple[np.ndarray, np.ndarray]:
    if not queues:
        raise ValueError("queues: at least one SM queue is needed")
    where: dict[int, int] = {}
    for sm, queue in enumerate(queues):
        for task in queue:
            _check_int("queues", sm, "task", task, 0, num_tasks - 1)
            if task in where:
                raise ValueError(f"queues[{sm}]: task {task} is also queued on SM {where[task]}")
            if task in tail_tasks:
                raise ValueError(f"queues[{sm}]: task {task} is a tail and also queued")
            where[task] = sm
    missing = sorted(set(range(num_tasks)) - where.keys() - tail_tasks)
    if missing:
        raise ValueError(f"tasks[{missing[0]}]: is in no queue and no tail")
    offsets = np.cumsum([0, *(len(q) for q in queues)], dtype=np.int64).astype(np.int32)
    flat = np.array([t for q in queues for t in q], dtype=np.int32)
    return offsets, flat


def _buffer_rows(buffers: Sequence[Buffer], arena_bytes: int) -> np.ndarray:
    rows = np.zeros(len(buffers), BUFFER_DESC)
    for i, buf in enumerate(buffers):
        if buf.dtype not in DTYPES or buf.kind not in BUFFER_KINDS:
            raise ValueError(f"buffers[{i}]: unknown dtype {buf.dtype!r} or kind {buf.kind!r}")
        if len(buf.shape) > MAX_RANK or any(d < 0 for d in buf.shape):
            raise ValueError(f"buffers[{i}]: shape {list(buf.shape)} is not a rank <= 4 shape")
        if buf.nbytes < math.prod(buf.shape) * DTYPE_SIZES[buf.dtype]:
            raise ValueError(f"buffers[{i}]: {buf.nbytes} bytes cannot hold the shape")
        if buf.kind in ARENA_KINDS and not 0 <= buf.offset <= arena_bytes - buf.nbytes:
            raise ValueError(
                f"buffers[{i}]: arena range {buf.offset} + {buf.nbytes} exceeds the arena of {arena_bytes} bytes"
            )
        row = rows[i]
        row["offset_or_ptr"], row["bytes"] = buf.offset, buf.nbytes
        row["dtype"], row["kind"] = DTYPES[buf.dtype], BUFFER_KINDS.index(buf.kind)
        row["rank"] = len(buf.shape)
        row["shape"][: len(buf.shape)] = buf.shape
    return rows


def build_tables(
    tasks: Sequence[Task],
    queues: Sequence[Sequence[int]],
    *,
    num_counters: int,
    buffers: Sequence[Buffer] = (),
    iterations: int = 1,
    arena_bytes: int | None = None,
    tails: Mapping[int, tuple[int, int]] | None = None,
) -> Tables:
    """Tables from plain lists; raises ValueError naming the table and row of any bad index.

    `tails` maps a counter to (tail task, signals per element per iteration): the SM whose
    signal completes that counter's element in an iteration runs the tail task next; a tail
    task is in no queue.
    """
    tails = dict(tails or {})
    for counter, (task, count) in tails.items():
        _check_int("tails", counter, "task", task, 0, len(tasks) - 1)
        _check_int("tails", counter, "count", count, 1, _INT32_MAX)
    if iterations < 1 or num_counters < 0:
        raise ValueError(
            f"iterations {iterations} and num_counters {num_counters} must be >= 1, >= 0"
        )
    if arena_bytes is None:
        arena_bytes = max(
            (b.offset + b.nbytes for b in buffers if b.kind in ARENA_KINDS), default=0
        )
    task_rows, wait_rows, signal_rows = _task_rows(tasks, num_counters, tails)
    offsets, flat = _queue_rows(queues, len(tasks), {task for task, _ in tails.values()})
    return Tables(
        task_rows,
        wait_rows,
        signal_rows,
        offsets,
        flat,
        _buffer_rows(buffers, arena_bytes),
        num_counters=num_counters,
        iterations=iterations,
        arena_bytes=arena_bytes,
    )


def dtype_layout(dtype: np.dtype) -> dict[str, Any]:
    """Size and field byte offsets of a row dtype, in the shape `table_layouts()` reports."""
    assert dtype.fields is not None
    return {
        "size": dtype.itemsize,
        "fields": {name: spec[1] for name, spec in dtype.fields.items()},
    }


def layout_mismatches(runtime_layouts: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Differences between the C layouts (`mk._runtime.table_layouts()`) and these dtypes."""
    problems = []
    for name, dtype in LAYOUTS.items():
        ours, theirs = dtype_layout(dtype), runtime_layouts.get(name)
        if theirs is None:
            problems.append(f"{name}: missing from the runtime")
        elif (ours["size"], ours["fields"]) != (theirs["size"], dict(theirs["fields"])):
            problems.append(f"{name}: NumPy {ours} != C {dict(theirs)}")
    problems.extend(
        f"{name}: not mirrored in NumPy" for name in runtime_layouts if name not in LAYOUTS
    )
    return problems
