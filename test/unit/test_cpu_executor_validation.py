"""The CPU executor of mk._runtime: bad tables, run arguments and table lists raise ValueError."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import mk._runtime as rt
from mk import runtime_tables as tb
from mk.runtime_tables import Buffer, Tables, Task, Wait, build_tables

# --------------------------------------------------------------------------- bad tables


def small_tables() -> Tables:
    tasks = [
        Task(tb.KIND_TRACE, signals=[0]),
        Task(tb.KIND_ADD, waits=[Wait(0)], signals=[1], args=[0, 0, 0, 0, 4]),
        Task(tb.KIND_NOP, waits=[Wait(1)]),
    ]
    return build_tables(
        tasks,
        [[0, 2], [1]],
        num_counters=2,
        buffers=[Buffer("f32", [4]), Buffer("i32", [4], offset=16)],
    )


def _set(table: str, index: int, field: str, value: int) -> Callable[[dict], None]:
    def mutate(arrays: dict) -> None:
        arrays[table] = arrays[table].copy()
        arrays[table][index][field] = value

    return mutate


def _replace(name: str, value: object) -> Callable[[dict], None]:
    return lambda arrays: arrays.__setitem__(name, value)


BAD_TABLES = [
    (_set("waits", 0, "counter", 5), r"waits\[0\]: counter 5 outside 0..2"),
    (_set("waits", 1, "count", 0), r"waits\[1\]: count 0 is not positive"),
    (_set("waits", 1, "distance", -1), r"waits\[1\]: distance -1 is negative"),
    (_set("signals", 1, "counter", -1), r"signals\[1\]: counter -1 outside"),
    (_set("tasks", 1, "wait_end", 7), r"tasks\[1\]: wait rows \[0, 7\) outside 0..2"),
    (_set("tasks", 2, "kind", 99), r"tasks\[2\]: kind 99 is not registered"),
    (_set("tasks", 1, "args", 1), r"tasks\[1\]: add buffer 1 is not float32"),
    (_set("buffers", 1, "rank", 5), r"buffers\[1\]: rank 5 outside 0..4"),
    (_set("buffers", 0, "bytes", 8), r"buffers\[0\]: 8 bytes cannot hold the shape"),
    (
        _replace("queue_tasks", np.array([0, 1, 1], np.int32)),
        r"queue_tasks\[2\]: task 1 is queued twice",
    ),
    (
        _replace("queue_offsets", np.array([0, 2, 2], np.int32)),
        r"queue_offsets\[2\]: is 2, not the 3",
    ),
    (
        _replace("queue_offsets", np.array([0, 2, 3], np.int64)),
        r"queue_offsets: expected an int32 array",
    ),
    (_replace("tasks", np.zeros(3, np.int32)), r"tasks: rows are 4 bytes, the C layout has 64"),
    (_replace("waits", [(0, 1, 0)]), r"waits: expected a NumPy array"),
    (_replace("iterations", 0), r"iterations\[0\]: 0 is not positive"),
]


@pytest.mark.parametrize(("mutate", "message"), BAD_TABLES, ids=[m for _, m in BAD_TABLES])
def test_bad_tables_raise_value_error(mutate: Callable[[dict], None], message: str) -> None:
    t = small_tables()
    arrays = {
        name: getattr(t, name)
        for name in ("tasks", "waits", "signals", "queue_offsets", "queue_tasks", "buffers")
    }
    arrays |= {"iterations": 1}
    mutate(arrays)
    with pytest.raises(ValueError, match=message):
        rt.CpuExecutor(**arrays, num_counters=t.num_counters, arena_bytes=t.arena_bytes)


def test_last_task_missing_from_queues_raises() -> None:
    t = small_tables()
    with pytest.raises(ValueError, match=r"tasks\[2\]: is in no queue"):
        rt.CpuExecutor(
            t.tasks,
            t.waits,
            t.signals,
            np.array([0, 1, 2], np.int32),
            np.array([0, 1], np.int32),
            t.buffers,
            num_counters=2,
            arena_bytes=t.arena_bytes,
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"buffers": bytearray(32), "num_threads": 0}, r"num_threads 0 outside 1..64"),
        ({"buffers": bytearray(32), "num_threads": 65}, r"num_threads 65 outside 1..64"),
        ({"buffers": None}, r"buffers\[0\]: is not bound and there is no arena"),
        (
            {"buffers": bytearray(16)},
            r"buffers\[1\]: arena range 16 \+ 16 exceeds the given arena of 16",
        ),
        ({"buffers": bytes(32)}, r"arena: is read-only"),
        ({"buffers": [None]}, r"buffers: got 1 for 2 buffer rows"),
        (
            {"buffers": [np.zeros(2, np.float32), np.zeros(4, np.int32)]},
            r"buffers\[0\]: bound 8 bytes, needs 16",
        ),
        ({"buffers": np.zeros((4, 4), np.float32)[:, 0]}, r"arena: not C-contiguous"),
    ],
)
def test_bad_run_arguments_raise_value_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        small_tables().executor().run(**kwargs)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: build_tables([Task(0, waits=[Wait(3)])], [[0]], num_counters=2),
            r"tasks\[0\]: wait counter 3 outside 0..1",
        ),
        (
            lambda: build_tables([Task(0, signals=[-1])], [[0]], num_counters=2),
            r"tasks\[0\]: signal counter -1",
        ),
        (
            lambda: build_tables([Task(0, args=range(8))], [[0]], num_counters=0),
            r"tasks\[0\]: more than 3 coords or 7 args",
        ),
        (
            lambda: build_tables([Task(0), Task(0)], [[0, 1], [1]], num_counters=0),
            r"queues\[1\]: task 1 is also queued on SM 0",
        ),
        (
            lambda: build_tables([Task(0), Task(0)], [[1]], num_counters=0),
            r"tasks\[0\]: is in no queue",
        ),
        (
            lambda: build_tables([Task(0)], [[0]], num_counters=0, buffers=[Buffer("f8", [1])]),
            r"unknown dtype 'f8'",
        ),
        (
            lambda: build_tables(
                [Task(0)],
                [[0]],
                num_counters=0,
                buffers=[Buffer("f32", [4], offset=8)],
                arena_bytes=16,
            ),
            r"buffers\[0\]: arena range 8 \+ 16 exceeds the arena of 16 bytes",
        ),
    ],
)
def test_build_tables_rejects_bad_lists(build: Callable[[], Tables], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()
