"""Tail tasks (task-tails): run by the SM whose signal completes their element, on the CPU
executor and in the CUDA megakernel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_cpu_executor import LONG_MS, check_trace

import mk
import mk._runtime as rt
import mk.backends.cuda as cuda_backend
from mk import compiler
from mk import runtime_tables as tb
from mk.backends.cuda import build as cuda_build
from mk.inputs import random_inputs
from mk.runtime_tables import Task, Wait, build_tables

ROOT = Path(__file__).resolve().parents[2]

T = tb.KIND_TRACE


def split_merge(
    n: int, iterations: int
) -> tuple[list[Task], list[list[int]], dict[int, tuple[int, int]]]:
    """n splits (tasks 0..n-1) signal counter 0; the merge (task n, a tail of counter 0) signals
    counter 1, whose tail (task n + 1) signals counter 2, which the queued consumer (task n + 2)
    waits on. With iterations > 1 the splits wait (distance 1) for the consumer."""
    free = [Wait(3, 1, 1)] if iterations > 1 else []
    splits = [Task(T, waits=free, signals=[0], coord=[i]) for i in range(n)]
    merge = Task(T, waits=[Wait(0, n)], signals=[1])
    second = Task(T, waits=[Wait(1)], signals=[2])
    consumer = Task(T, waits=[Wait(2)], signals=[3])
    queues = [list(range(s, n, 3)) for s in range(3)]
    queues[0].append(n + 2)
    return [*splits, merge, second, consumer], queues, {0: (n, n), 1: (n + 1, 1)}


@pytest.mark.parametrize("threads", [1, 3, 8])
@pytest.mark.parametrize("iterations", [1, 4])
def test_tails_run_once_per_iteration_after_their_element(threads: int, iterations: int) -> None:
    tasks, queues, tails = split_merge(7, iterations)
    tables = build_tables(tasks, queues, num_counters=4, iterations=iterations, tails=tails)
    assert (
        list(tables.signals["tail"][:7]) == [7] * 7 and list(tables.signals["count"][:7]) == [7] * 7
    )
    assert sorted(tables.queue_tasks) == [0, 1, 2, 3, 4, 5, 6, 9]  # the tails are in no queue
    for seed in range(3):
        trace = tables.executor().run(
            num_threads=threads, timeout_ms=LONG_MS, max_delay_us=200, seed=seed
        )
        check_trace(trace, tasks, queues)  # each ran once per iteration, after its producers
        # A tail starts right after the signal that completed its element, on the same thread.
        last_split = trace[:, :7, 1].max(axis=1)
        assert (trace[:, 7, 0] > last_split).all() and (trace[:, 8, 0] > trace[:, 7, 1]).all()


def test_a_tail_that_waits_blocks_only_its_sm() -> None:
    """Task 0 completes the tail's element at once; the tail (task 2) also waits on task 1,
    which SM 1 runs after a long chain: the tail waits there without a hang."""
    chain = [Task(T, waits=[Wait(3 + i - 1)] if i else [], signals=[3 + i]) for i in range(20)]
    tasks = [
        Task(T, signals=[0]),
        Task(T, waits=[Wait(3 + 19)], signals=[1]),
        Task(T, waits=[Wait(0), Wait(1)], signals=[2]),
        *chain,
    ]
    queues = [[0], [*range(3, 23), 1]]
    tables = build_tables(tasks, queues, num_counters=23, tails={0: (2, 1)})
    trace = tables.executor().run(num_threads=2, timeout_ms=LONG_MS, max_delay_us=100)
    check_trace(trace, tasks, queues)
    assert trace[0, 2, 0] > trace[0, 1, 1]


def test_a_stuck_tail_is_named_by_the_watchdog() -> None:
    tasks = [Task(T, signals=[0]), Task(T, waits=[Wait(0), Wait(1)], signals=[2])]
    tables = build_tables(tasks, [[0]], num_counters=3, tails={0: (1, 1)})
    with pytest.raises(rt.DeadlockError, match=r"task 1 .* on event counter 1"):
        tables.executor().run(num_threads=1, timeout_ms=300)


def test_tail_tables_are_checked() -> None:
    tasks, queues, tails = split_merge(4, 1)
    with pytest.raises(ValueError, match=r"task 4 is a tail and also queued"):
        build_tables(tasks, [[*queues[0], 4], *queues[1:]], num_counters=4, tails=tails)
    with pytest.raises(ValueError, match=r"tasks\[4\]: is in no queue and no tail"):
        build_tables(tasks, queues, num_counters=4, tails={1: (5, 1)})
    tables = build_tables(tasks, queues, num_counters=4, tails=tails)
    signals = tables.signals.copy()
    signals["tail"][1] = 5  # one split names another tail for the same counter
    with pytest.raises(ValueError, match=r"signals\[1\]: counter 0 has tail 5 here and 4"):
        tb.Tables(**{**tables.__dict__, "signals": signals}).executor()
    signals = tables.signals.copy()
    signals["tail"][4] = -1  # the merge's own signal loses its tail: task 5 is then unreachable
    with pytest.raises(ValueError, match=r"tasks\[5\].*no tail"):
        tb.Tables(**{**tables.__dict__, "signals": signals}).executor()
    assert np.all(tables.signals["count"][tables.signals["tail"] < 0] == 0)


def _check_with_tails(target: str, example: str, cache: Path) -> None:
    path = ROOT / "examples" / f"{example}.mlir"
    prog = mk.compile(path, target=target, num_sms=8, cache_dir=cache, max_tail_tasks=64)
    tails = prog.tables.signals["tail"]
    assert (tails >= 0).any(), "the example has no tail task"
    assert not set(tails[tails >= 0].tolist()) & set(prog.tables.queue_tasks.tolist())
    for seed in (0, 1):
        inputs = random_inputs(prog.func, seed=seed)
        refs = mk.reference(path, *[x.copy() for x in inputs])  # donated inputs change in place
        for i, (out, ref) in enumerate(zip(prog(*inputs), refs, strict=True)):
            error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
            assert error <= bound, f"output {i}: error {error:.3g} over {bound:.3g}"


@pytest.mark.parametrize("example", ["decode_loop", "decoder_block"])
def test_examples_with_tails_match_the_reference_on_the_cpu(example: str, tmp_path: Path) -> None:
    _check_with_tails("cpu", example, tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("example", ["decode_loop", "decoder_block"])
def test_examples_with_tails_match_the_reference_on_the_gpu(example: str, tmp_path: Path) -> None:
    _check_with_tails("cuda", example, tmp_path)


def test_only_a_program_with_tails_has_the_dispatchers_tail_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dispatch::kTails: the dispatcher runs at every task, so a program without tails (the
    default) leaves the tails' code out; one with tails keeps it and builds with nvcc."""
    path = ROOT / "examples" / "decoder_block.mlir"
    builds = nvcc_builds()
    if not builds:
        monkeypatch.setattr(cuda_backend, "nvcc", lambda: None)
        monkeypatch.setattr(cuda_build, "nvcc", lambda: None)
    tails = mk.compile(path, target="cuda", num_sms=8, cache_dir=tmp_path, max_tail_tasks=64)
    assert "static constexpr bool kTails = true;" in tails.cuda_source  # type: ignore[attr-defined]
    if builds:
        assert tails.library_path is not None and tails.library_path.is_file()
    monkeypatch.setattr(cuda_backend, "nvcc", lambda: None)
    monkeypatch.setattr(cuda_build, "nvcc", lambda: None)
    plain = mk.compile(path, target="cuda", num_sms=8, cache_dir=tmp_path)
    assert "static constexpr bool kTails = false;" in plain.cuda_source  # type: ignore[attr-defined]


def nvcc_builds() -> bool:
    return cuda_build.nvcc() is not None
