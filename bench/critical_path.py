"""The critical path of one megakernel run: the chain of tasks and waits that set its time,
summed per kind of grid.

Usage: python bench/critical_path.py --model PRESET [--layers N] [--batch B] TRACE.json
(a trace of `bench/timeline.py --model ... --out DIR`; the program is rebuilt here, without a
GPU, to know each task's producers). `bench/timeline.py --model` prints the same table live.

Walking back from the task that ends last: a task could start once its producers (this
iteration's) and the task before it on its SM were done; whichever of the two ended later is
the step before it on the path. Each task on the path adds its run (end - start) and the gap
before it (start - that end): after a producer, the event hop and the dispatch ("hop"); after
the task before on the same SM, the dispatch alone ("queue").
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hops import Run, traced_program  # noqa: E402

Row = tuple[str, int, float, float, float]  # kind, tasks on the path, run, hop, queue (µs)


def last_producers(
    num_tasks: int,
    end: np.ndarray,
    waits_of: Callable[[int], list[tuple[str, tuple[int, ...], int]]],
    producers_of: Callable[[str, tuple[int, ...]], list[int]],
) -> np.ndarray:
    """Per task, its same-iteration producer that ended last (-1: none)."""
    last = np.full(num_tasks, -1, np.int64)
    for task in range(num_tasks):
        producers = [
            p
            for event, element, distance in waits_of(task)
            if distance == 0
            for p in producers_of(event, element)
        ]
        if producers:
            last[task] = max(producers, key=lambda p: end[p])
    return last


def previous_on_sm(num_tasks: int, queues: Sequence[Sequence[int]]) -> np.ndarray:
    """Per task, the task before it in its SM's queue (-1: the first)."""
    prev = np.full(num_tasks, -1, np.int64)
    for queue in queues:
        for before, task in zip(queue, queue[1:], strict=False):
            prev[task] = before
    return prev


def walk(
    start: np.ndarray, end: np.ndarray, producer: np.ndarray, prev: np.ndarray
) -> list[tuple[int, float, bool]]:
    """(task, gap before it in ns, whether a producer ended last) along the critical path, in
    run order; the first task's gap is 0."""
    steps: list[tuple[int, float, bool]] = []
    task = int(np.argmax(end))
    while True:
        p, q = int(producer[task]), int(prev[task])
        if p < 0 and q < 0:
            steps.append((task, 0.0, False))
            return steps[::-1]
        after_producer = q < 0 or (p >= 0 and end[p] >= end[q])
        before = p if after_producer else q
        steps.append((task, float(start[task] - end[before]), after_producer))
        task = before


def path_rows(
    kinds: Sequence[str],
    start: np.ndarray,
    end: np.ndarray,
    steps: Sequence[tuple[int, float, bool]],
) -> list[Row]:
    """Per kind on the path: tasks, and summed run, hop and queue µs; largest total first."""
    sums: dict[str, np.ndarray] = {}
    for task, gap, after_producer in steps:
        row = np.array(
            [
                1.0,
                end[task] - start[task],
                gap if after_producer else 0.0,
                0.0 if after_producer else gap,
            ]
        )
        sums[kinds[task]] = sums.get(kinds[task], np.zeros(4)) + row
    rows = [(kind, int(s[0]), s[1] / 1e3, s[2] / 1e3, s[3] / 1e3) for kind, s in sums.items()]
    return sorted(rows, key=lambda r: -(r[2] + r[3] + r[4]))


def print_path(rows: Sequence[Row]) -> None:
    run, hop, queue = (sum(r[i] for r in rows) for i in (2, 3, 4))
    print(
        f"  critical path {run + hop + queue:.1f} us = run {run:.1f} + hop {hop:.1f} + queue {queue:.1f}"
    )
    print(f"  {'kind':<16}{'on path':>8}{'run us':>9}{'hop us':>9}{'queue us':>10}")
    for kind, n, r, h, q in rows:
        print(f"  {kind:<16}{n:>8}{r:>9.1f}{h:>9.1f}{q:>10.1f}")


def path_of(r: Run) -> list[Row]:
    """path_rows of one run."""
    producer = last_producers(r.n, r.end, r.waits_of, r.producers_of)
    prev = previous_on_sm(r.n, r.queues)
    return path_rows(r.kinds, r.start, r.end, walk(r.start, r.end, producer, prev))


def main() -> int:
    name, prog, timeline = traced_program(__doc__)
    print(f"{name}: the critical path, per kind")
    print_path(path_of(Run(prog, timeline)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
