"""The CPU executor of mk._runtime: table layouts, the event protocol under stress, the watchdog."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mk._runtime as rt
from mk import runtime_tables as tb
from mk.runtime_tables import Buffer, Tables, Task, Wait, build_tables

ROOT = Path(__file__).resolve().parents[2]
LONG_MS = 30_000  # watchdog for runs that must finish (two shared cores, up to 16 threads)
THREADS = (1, 2, 4, 8, 16)


# --------------------------------------------------------------------------- graph builders


def list_schedule(
    preds: Sequence[Sequence[int]], num_sms: int, rng: random.Random
) -> list[list[int]]:
    """Tasks in id order (topological) to the SM free first, with random costs: per-SM queues."""
    free_at = [0.0] * num_sms
    finish = [0.0] * len(preds)
    queues: list[list[int]] = [[] for _ in range(num_sms)]
    for task, before in enumerate(preds):
        sm = min(range(num_sms), key=lambda s: (free_at[s], rng.random()))
        start = max([free_at[sm], *(finish[p] for p in before)])
        finish[task] = free_at[sm] = start + rng.uniform(0.5, 2.0)
        queues[sm].append(task)
    return queues


def dag_tasks(
    preds: Sequence[Sequence[int]], iterations: int, carried: Sequence[tuple[int, int]] = ()
) -> list[Task]:
    """TRACE tasks, task i signalling counter i; waits on predecessors, and with iterations > 1
    on its consumers' previous iteration (so a producer never runs an iteration ahead) and on
    the loop-carried edges (consumer, producer) of the previous iteration."""
    succs: list[list[int]] = [[] for _ in preds]
    for task, before in enumerate(preds):
        for p in before:
            succs[p].append(task)
    tasks = []
    for i, before in enumerate(preds):
        waits = [Wait(p) for p in before]
        if iterations > 1:
            waits += [Wait(s, 1, 1) for s in succs[i]]
            waits += [Wait(p, 1, 1) for c, p in carried if c == i]
        tasks.append(Task(tb.KIND_TRACE, waits=waits, signals=[i], coord=[i]))
    return tasks


def random_preds(num_tasks: int, rng: random.Random, fan_in: int = 3) -> list[list[int]]:
    return [
        sorted(set(rng.sample(range(i), min(i, rng.randint(0, fan_in))))) for i in range(num_tasks)
    ]


def fan_graph(shape: str, n: int, iterations: int) -> tuple[list[Task], list[list[int]], int]:
    """chain, fan-in (n producers of one count-n element) or fan-out (one producer, n consumers)."""
    T, W = tb.KIND_TRACE, Wait
    if shape == "chain":
        tasks = [Task(T, waits=[W(i - 1)] if i else [], signals=[i]) for i in range(n)]
        if iterations > 1:  # the chain's head of iteration t waits for its tail of t - 1
            tasks[0] = Task(T, waits=[W(n - 1, 1, 1)], signals=[0])
        return tasks, [list(range(s, n, 4)) for s in range(4)], n
    free = [W(1, n if shape == "fanout" else 1, 1)] if iterations > 1 else []
    if shape == "fanin":  # counter 0: all producers; counter 1: the consumer is done
        producers = [Task(T, waits=free, signals=[0], coord=[i]) for i in range(n)]
        tasks = [*producers, Task(T, waits=[W(0, n)], signals=[1])]
    else:  # counter 0: the producer is done; counter 1: every consumer is done
        consumers = [Task(T, waits=[W(0)], signals=[1], coord=[i]) for i in range(n)]
        tasks = [Task(T, waits=free, signals=[0]), *consumers]
    return tasks, [list(range(s, n + 1, 5)) for s in range(5)], 2


def check_trace(trace: np.ndarray, tasks: Sequence[Task], queues: Sequence[Sequence[int]]) -> None:
    """Every task ran once per iteration, after all producers of each waited element ended in the
    iteration that wait refers to, and each SM ran its queue in order."""
    iterations = trace.shape[0]
    assert trace.shape == (iterations, len(tasks), 2)
    assert (trace >= 0).all(), "some task never ran"
    assert np.unique(trace).size == trace.size, "clock stamps repeat"
    assert (trace[..., 0] < trace[..., 1]).all()
    producers: dict[int, list[int]] = {}
    for i, task in enumerate(tasks):
        for c in task.signals:
            producers.setdefault(c, []).append(i)
    for t in range(iterations):
        for i, task in enumerate(tasks):
            for w in task.waits:
                if t - w.distance < 0:
                    continue
                for p in producers.get(w.counter, []):
                    assert trace[t - w.distance, p, 1] < trace[t, i, 0], (
                        f"task {i} iteration {t} started before producer {p} of counter "
                        f"{w.counter} ended iteration {t - w.distance}"
                    )
    for sm, queue in enumerate(queues):
        order = [trace[t, task] for t in range(iterations) for task in queue]
        for a, b in zip(order, order[1:], strict=False):
            assert a[1] < b[0], f"SM {sm} ran its queue out of order"


def run_traced(
    tasks: Sequence[Task],
    queues: Sequence[Sequence[int]],
    num_counters: int,
    iterations: int,
    threads: int,
    delay_us: int,
    seed: int = 0,
) -> None:
    tables = build_tables(tasks, queues, num_counters=num_counters, iterations=iterations)
    trace = tables.executor().run(
        num_threads=threads, timeout_ms=LONG_MS, max_delay_us=delay_us, seed=seed
    )
    check_trace(trace, tasks, queues)


# --------------------------------------------------------------------------- layouts


def test_layouts_match_the_c_structs() -> None:
    layouts = rt.table_layouts()
    assert tb.layout_mismatches(layouts) == []
    assert set(layouts) == set(tb.LAYOUTS)
    assert layouts["TaskDesc"]["size"] == 64 and layouts["BufferDesc"]["fields"]["shape"] == 32


def test_layout_check_catches_drift() -> None:
    layouts = rt.table_layouts()
    layouts["WaitDesc"] = {"size": 16, "fields": {**layouts["WaitDesc"]["fields"], "pad": 12}}
    assert tb.layout_mismatches(layouts) == [
        f"WaitDesc: NumPy {tb.dtype_layout(tb.WAIT_DESC)} != C {layouts['WaitDesc']}"
    ]


def test_constants_mirror_the_runtime() -> None:
    assert (rt.KIND_NOP, rt.KIND_TRACE, rt.KIND_ADD) == (tb.KIND_NOP, tb.KIND_TRACE, tb.KIND_ADD)
    assert rt.KIND_FIRST_LOWERED == tb.KIND_FIRST_LOWERED
    assert (rt.MAX_COORDS, rt.MAX_TASK_ARGS, rt.MAX_RANK) == (
        tb.MAX_COORDS,
        tb.MAX_TASK_ARGS,
        tb.MAX_RANK,
    )
    assert rt.task_kinds() == {"nop": 0, "trace": 1, "add": 2}
    assert issubclass(rt.DeadlockError, RuntimeError)


def test_header_matches_tables() -> None:
    tasks, queues, counters = fan_graph("fanin", 6, 3)
    buffers = [Buffer("f32", [2, 8]), Buffer("bf16", [4], offset=64)]
    tables = build_tables(tasks, queues, num_counters=counters, iterations=3, buffers=buffers)
    header = tables.header(abi=rt.abi)
    assert tables.executor().header() == {name: int(header[name]) for name in tb.GRAPH_HEADER.names}
    assert (int(header["num_tasks"]), int(header["num_sms"]), int(header["arena_bytes"])) == (
        7,
        5,
        72,
    )
    assert list(tables.buffers["shape"][0]) == [2, 8, 0, 0] and list(tables.buffers["dtype"]) == [
        1,
        3,
    ]


# --------------------------------------------------------------------------- ordering


@pytest.mark.parametrize("delay_us", [0, 40])
@pytest.mark.parametrize("iterations", [1, 3])
@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("shape", ["chain", "fanin", "fanout"])
def test_small_graphs_keep_event_order(
    shape: str, threads: int, iterations: int, delay_us: int
) -> None:
    tasks, queues, counters = fan_graph(shape, 12, iterations)
    run_traced(tasks, queues, counters, iterations, threads, delay_us, seed=threads)


@pytest.mark.parametrize("delay_us", [0, 30])
@pytest.mark.parametrize("iterations", [1, 3])
@pytest.mark.parametrize("threads", THREADS)
def test_random_dag_keeps_event_order(threads: int, iterations: int, delay_us: int) -> None:
    rng = random.Random(1000 * threads + 10 * iterations + delay_us)
    num_tasks, num_sms = rng.randint(50, 200), rng.choice([1, 3, 7, 16])
    preds = random_preds(num_tasks, rng)
    carried = [
        (rng.randrange(num_tasks // 2), rng.randrange(num_tasks // 2, num_tasks)) for _ in range(5)
    ]
    queues = list_schedule(preds, num_sms, rng)
    run_traced(
        dag_tasks(preds, iterations, carried),
        queues,
        num_tasks,
        iterations,
        threads,
        delay_us,
        rng.randrange(99),
    )


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    num_tasks=st.integers(1, 60),
    num_sms=st.integers(1, 16),
    threads=st.sampled_from(THREADS),
    iterations=st.integers(1, 3),
)
def test_any_list_schedule_runs_in_order(
    seed: int, num_tasks: int, num_sms: int, threads: int, iterations: int
) -> None:
    rng = random.Random(seed)
    preds = random_preds(num_tasks, rng, fan_in=4)
    queues = list_schedule(preds, num_sms, rng)
    run_traced(
        dag_tasks(preds, iterations),
        queues,
        num_tasks,
        iterations,
        threads,
        delay_us=rng.choice([0, 20]),
    )


def test_trace_check_catches_an_early_start() -> None:
    tasks, queues, counters = fan_graph("chain", 6, 1)
    trace = build_tables(tasks, queues, num_counters=counters).executor().run(num_threads=2)
    trace[0, [2, 3]] = trace[0, [3, 2]]  # task 3 "runs" before task 2
    with pytest.raises(AssertionError, match="task 3 iteration 0 started before producer 2"):
        check_trace(trace, tasks, queues)


# --------------------------------------------------------------------------- KIND_ADD numbers


def add_dag(num_inputs: int, num_computed: int, tiles: int, tile: int, rng: random.Random):
    """Buffers b_k = b_a + b_b (a, b < k) tile by tile, the last one accumulating b_last into
    itself; task (k, tile) signals its own counter; WAR waits keep iterations apart."""
    n = num_inputs + num_computed + 1
    srcs = {k: (rng.randrange(k), rng.randrange(k)) for k in range(num_inputs, n - 1)}
    srcs[n - 1] = (n - 1, n - 2)
    length = tiles * tile

    def task_id(k: int, t: int) -> int:
        return (k - num_inputs) * tiles + t

    tasks = []
    for k in range(num_inputs, n):
        readers = [r for r in range(k + 1, n) if k in srcs[r]]
        for t in range(tiles):
            raw = [Wait(task_id(s, t)) for s in set(srcs[k]) if num_inputs <= s != k]
            war = [Wait(task_id(r, t), 1, 1) for r in readers]
            args = [k, *srcs[k], t * tile, (t + 1) * tile]
            tasks.append(
                Task(
                    tb.KIND_ADD,
                    waits=raw + war,
                    signals=[task_id(k, t)],
                    grid=k,
                    coord=[t],
                    args=args,
                )
            )
    buffers = [Buffer("f32", [length], offset=4 * length * b) for b in range(n)]
    return tasks, buffers, srcs, length


@pytest.mark.parametrize(
    ("threads", "iterations", "delay_us"), [(1, 1, 0), (4, 3, 0), (16, 3, 30), (8, 1, 30)]
)
def test_add_dag_matches_numpy(threads: int, iterations: int, delay_us: int) -> None:
    rng = random.Random(threads * 7 + iterations)
    tasks, buffers, srcs, length = add_dag(3, 20, 4, 32, rng)
    preds = [[] for _ in tasks]  # only the queue order matters here: ids are topological
    queues = list_schedule(preds, 8, rng)
    tables = build_tables(
        tasks, queues, num_counters=len(tasks), buffers=buffers, iterations=iterations
    )
    arena = np.zeros((len(buffers), length), np.float32)
    arena[:3] = np.random.default_rng(threads).standard_normal((3, length))
    arena[-1] = np.random.default_rng(99).standard_normal(length)
    expected = arena.copy()
    for _ in range(iterations):
        for k, (a, b) in sorted(srcs.items()):
            expected[k] = expected[a] + expected[b]
    assert (
        tables.executor().run(arena, num_threads=threads, timeout_ms=LONG_MS, max_delay_us=delay_us)
        is None
    )
    np.testing.assert_array_equal(arena, expected)


def test_bound_buffers_and_arena_together() -> None:
    """Inputs bound as read-only arrays, an output bound, the activation in the arena."""
    x, y = np.arange(8, dtype=np.float32), np.full(8, 2.0, np.float32)
    x.flags.writeable = False
    out, arena = np.zeros(8, np.float32), bytearray(32)
    buffers = [
        Buffer("f32", [8], "input"),
        Buffer("f32", [8], "weight"),
        Buffer("f32", [8], "activation"),
        Buffer("f32", [8], "output"),
    ]
    tasks = [
        Task(tb.KIND_ADD, signals=[0], args=[2, 0, 1, 0, 8]),
        Task(tb.KIND_ADD, waits=[Wait(0)], args=[3, 2, 0, 0, 8]),
    ]
    tables = build_tables(tasks, [[0], [1]], num_counters=1, buffers=buffers)
    tables.executor().run([x, y, None, out], arena=arena, num_threads=2)
    np.testing.assert_array_equal(np.frombuffer(arena, np.float32), x + y)
    np.testing.assert_array_equal(out, x + x + y)


def test_the_timeline_stamps_each_body_after_its_producers() -> None:
    """run(timeline=...) fills [iterations, tasks, 2] with each body's (start, end) in ns since
    the launch: the consumer starts after the producer it waits on ends; a wrong array is
    refused."""
    x = np.arange(8, dtype=np.float32)
    buffers = [Buffer("f32", [8], "input"), Buffer("f32", [8], "activation")]
    tasks = [
        Task(tb.KIND_ADD, signals=[0], args=[1, 0, 0, 0, 8]),
        Task(tb.KIND_ADD, waits=[Wait(0)], args=[1, 1, 1, 0, 8]),
    ]
    tables = build_tables(tasks, [[0], [1]], num_counters=1, buffers=buffers, iterations=2)
    for threads in (1, 2):
        stamps = np.full((2, 2, 2), -1, np.int64)
        tables.executor().run([x, None], arena=bytearray(32), num_threads=threads, timeline=stamps)
        assert (stamps >= 0).all() and (stamps[..., 1] >= stamps[..., 0]).all()
        assert (stamps[:, 1, 0] >= stamps[:, 0, 1]).all()  # task 1 waits for task 0
    for bad in (np.zeros((2, 2, 2), np.int32), np.zeros((1, 2, 2), np.int64)):
        with pytest.raises(ValueError, match=r"timeline: expected int64 \[2, 2, 2\]"):
            tables.executor().run([x, None], arena=bytearray(32), timeline=bad)


# --------------------------------------------------------------------------- watchdog


def expect_deadlock(tables: Tables, threads: int, **fields: int) -> rt.DeadlockError:
    start = time.monotonic()
    with pytest.raises(rt.DeadlockError) as info:
        tables.executor().run(num_threads=threads, timeout_ms=200)
    assert time.monotonic() - start < 5.0, "the watchdog took far longer than its limit"
    err = info.value
    for name, value in fields.items():
        assert getattr(err, name) == value, (name, str(err))
    assert err.wait_ms >= 200
    return err


@pytest.mark.parametrize("threads", [1, 4])
def test_missing_signal_raises_naming_task_counter_and_sm(threads: int) -> None:
    tasks = [
        Task(tb.KIND_NOP, waits=[Wait(i - 1)] if i else [], signals=[i] if i != 2 else [])
        for i in range(4)
    ]
    tables = build_tables(tasks, [[0, 2], [1, 3]], num_counters=4)
    err = expect_deadlock(
        tables, threads, task=3, sm=1, counter=2, value=0, threshold=1, iteration=0
    )
    for part in ("task 3", "SM 1", "event counter 2", "value 0", "threshold 1", "iteration 0"):
        assert part in str(err)


def test_count_too_high_stalls_in_a_later_iteration() -> None:
    # The producer runs ahead (no free wait), so iteration 0 passes on its second signal.
    tasks = [Task(tb.KIND_NOP, signals=[0]), Task(tb.KIND_NOP, waits=[Wait(0, count=2)])]
    tables = build_tables(tasks, [[0], [1]], num_counters=1, iterations=3)
    expect_deadlock(tables, 2, task=1, sm=1, counter=0, value=3, threshold=4, iteration=1)


def test_queue_order_against_the_waits_raises() -> None:
    tasks = [Task(tb.KIND_NOP, signals=[0]), Task(tb.KIND_NOP, waits=[Wait(0)])]
    tables = build_tables(tasks, [[1, 0], []], num_counters=1)
    expect_deadlock(tables, 2, task=1, sm=0, counter=0, threshold=1)


def test_wait_cycle_reports_the_oldest_wait() -> None:
    # One thread polls SM 0 then SM 1: SM 0 blocks on task 0, SM 1 runs task 2 and blocks on
    # task 3, SM 0 then runs task 0 and blocks on task 1: the stuck waits are a cycle (1 <-> 3)
    # and SM 1's is the older one although SM 0 is polled first.
    tasks = [
        Task(tb.KIND_NOP, waits=[Wait(0)], signals=[1]),
        Task(tb.KIND_NOP, waits=[Wait(3)], signals=[2]),
        Task(tb.KIND_NOP, signals=[0]),
        Task(tb.KIND_NOP, waits=[Wait(2)], signals=[3]),
    ]
    tables = build_tables(tasks, [[0, 1], [2, 3]], num_counters=4)
    expect_deadlock(tables, 1, task=3, sm=1, counter=2)


def test_run_releases_the_gil() -> None:
    tasks = [Task(tb.KIND_NOP, waits=[Wait(0)])]
    executor = build_tables(tasks, [[0]], num_counters=1).executor()
    errors: list[BaseException] = []

    def stuck() -> None:
        try:
            executor.run(timeout_ms=300)
        except rt.DeadlockError as e:
            errors.append(e)

    worker = threading.Thread(target=stuck)
    worker.start()
    spins = 0
    while worker.is_alive():
        spins += 1
    worker.join()
    assert len(errors) == 1 and spins > 1000


# --------------------------------------------------------------------------- ThreadSanitizer


def _compile(out: Path, *flags: str) -> subprocess.Popen[bytes]:
    sources = [ROOT / "runtime/tests/tsan_stress.cpp"] + [
        ROOT / "runtime/src" / name for name in ("cpu_executor.cpp", "cpu_tables.cpp")
    ]
    cmd = ["g++", "-std=c++17", "-fsanitize=thread", "-O1", "-g", "-pthread", *flags]
    cmd += [
        f"-I{ROOT / 'runtime/include'}",
        f"-I{ROOT / 'runtime/src'}",
        *map(str, sources),
        "-ldl",
        "-o",
        str(out),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _tsan_env() -> dict[str, str]:
    return {**os.environ, "TSAN_OPTIONS": "halt_on_error=1"}


@pytest.fixture(scope="module")
def tsan_binaries(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    tmp = tmp_path_factory.mktemp("tsan")
    probe = tmp / "probe.cpp"
    probe.write_text("#include <thread>\nint main() { std::thread([] {}).join(); }\n")
    built = subprocess.run(
        ["g++", "-fsanitize=thread", "-pthread", str(probe), "-o", str(tmp / "probe")],
        capture_output=True,
    )
    if (
        built.returncode != 0
        or subprocess.run([tmp / "probe"], capture_output=True, env=_tsan_env()).returncode != 0
    ):
        pytest.skip(
            f"g++ cannot build or run ThreadSanitizer programs here: {built.stderr.decode()[-300:]}"
        )
    clean, broken = tmp / "stress", tmp / "stress_relaxed"
    jobs = [_compile(clean), _compile(broken, "-DMK_EVENTS_BROKEN_RELAXED")]
    for job in jobs:
        output = job.communicate(timeout=300)[0].decode()
        assert job.returncode == 0, output
    return clean, broken


def test_tsan_stress_has_no_data_race(tsan_binaries: tuple[Path, Path]) -> None:
    run = subprocess.run(
        [tsan_binaries[0], "6"], capture_output=True, text=True, env=_tsan_env(), timeout=120
    )
    assert "WARNING: ThreadSanitizer" not in run.stderr, run.stderr[-4000:]
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr[-2000:]


def test_tsan_sees_races_once_the_events_are_relaxed(tsan_binaries: tuple[Path, Path]) -> None:
    # Proof that the clean run means something: without acquire/release the kernels race.
    run = subprocess.run(
        [tsan_binaries[1], "6"], capture_output=True, text=True, env=_tsan_env(), timeout=120
    )
    assert "WARNING: ThreadSanitizer: data race" in run.stderr and run.returncode != 0


def test_the_runtime_formats_without_iostreams() -> None:
    """The CPU runtime builds its messages without iostreams: where it links a static libstdc++
    (the GPU machine's image) the stream locale may be uninitialised, and the first failed run
    that formatted a number through it ended the process (bench/RESULTS.md, session 41)."""
    root = Path(__file__).resolve().parents[2] / "runtime"
    sources = [*root.glob("src/*.cpp"), *root.glob("src/*.h"), *root.glob("include/mk/cpu_*.h")]
    assert sources
    for path in sources:
        text = path.read_text()
        for header in ("<sstream>", "<iostream>", "<ostream>", "<fstream>"):
            assert f"#include {header}" not in text, f"{path.name} includes {header}"
