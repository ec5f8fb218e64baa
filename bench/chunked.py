"""How much earlier a model step's grids could end if a task that waits for a whole producer grid
took the producer's output in chunks, each as soon as its producers end (chunked waits).

Usage: python bench/chunked.py TRACE.json --model PRESET [--layers N] [--batch B]
                               [--pair PRODUCER:CONSUMER ...] [--chunks N]
(TRACE.json from `bench/timeline.py --model ... --out DIR`; the program is rebuilt here, without
a GPU, to know each task's producers.) A pair names two kinds of grid (`m:y`: the gate/up grid
and the down projection that reads its output along K), default qwen3-8b's unfused boundaries
`m:y y:q`. The producer's tasks, in task order, are cut into N chunks (default 8) of the
consumer's K.

The estimate keeps every task's measured run T and dispatch d (its start less the later of its
producers' last end and its SM's previous task's end: the hop and the dispatcher), and lets a
consumer take chunk c once the chunk's last producer has ended, plus d, spending T / N on each
chunk in order (`in order`) or in the order they complete (`any order`, which needs each
chunk's sums apart to stay deterministic). The consumer grid's last end moves by the difference;
the model ignores what a chunk's own wait and staging would cost, so it bounds what the change
could give, and each boundary is taken alone (a saving is not carried into the next grid).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hops import Run, free_times, kind_of, started_tasks, traced_program  # noqa: E402


def chunk_ready(producer_ends: np.ndarray, chunks: int) -> np.ndarray:
    """The last end of each of `chunks` consecutive runs of the producers (in task order)."""
    return np.array([part.max() for part in np.array_split(producer_ends, chunks)])


def chunked_end(
    free: float, ready: np.ndarray, dispatch: float, run: float, in_order: bool
) -> float:
    """When a consumer that takes the chunks as they become ready ends (times in ns): it starts
    once its SM is free and its first chunk is ready, each chunk waits for its producers and
    takes an equal share of the run."""
    order = ready if in_order else np.sort(ready)
    t = max(free, order[0]) + dispatch
    for r in order:
        t = max(t, r + dispatch) + run / len(ready)
    return t


def boundary_rows(
    r: Run, pairs: Sequence[tuple[str, str]], chunks: int
) -> list[tuple[str, str, int, float, float, float]]:
    """(consumer grid, producer grid, consumer tasks, grid end µs from the producer grid's last
    end, saving in order µs, saving in any order µs) for each consumer grid of a pair's kind
    whose every task waits for every task of one producer grid of the pair's kind."""
    free = free_times(r.queues, r.end, r.start[r.start > 0].min())
    tasks_of = started_tasks(r.grids, r.start)
    rows = []
    for grid, tasks in tasks_of.items():
        for producer_kind, consumer_kind in pairs:
            if kind_of(grid) != consumer_kind:
                continue
            producer = whole_producer(r, tasks, producer_kind, tasks_of)
            if producer is None:
                continue
            ready = chunk_ready(r.end[tasks_of[producer]], chunks)
            ends = r.end[tasks]
            saved = []
            for in_order in (True, False):
                new_ends = []
                for task in tasks:
                    could = max(free[task], ready.max())
                    dispatch = r.start[task] - could
                    run = r.end[task] - r.start[task]
                    new_ends.append(chunked_end(free[task], ready, dispatch, run, in_order))
                saved.append((ends.max() - max(new_ends)) / 1e3)
            after = (ends.max() - ready.max()) / 1e3
            rows.append((grid, producer, len(tasks), after, saved[0], saved[1]))
    return rows


def whole_producer(
    r: Run, tasks: Sequence[int], kind: str, tasks_of: dict[str, list[int]]
) -> str | None:
    """The grid of `kind` (its tasks in `tasks_of`) whose every task each of `tasks` waits for,
    if there is one."""
    grids_of_kind = {g for g in tasks_of if kind_of(g) == kind}
    found = None
    for task in tasks:
        producers = {
            p
            for event, element, distance in r.waits_of(task)
            if distance == 0
            for p in r.producers_of(event, element)
        }
        grids = {r.grids[p] for p in producers} & grids_of_kind
        if len(grids) != 1:
            return None
        (grid,) = grids
        if found not in (None, grid):
            return None
        if not set(tasks_of[grid]) <= producers:
            return None
        found = grid
    return found


def print_rows(rows: Sequence[tuple[str, str, int, float, float, float]], step_us: float) -> None:
    print(f"  {'consumer':<14}{'producer':<14}{'tasks':>6}{'end after us':>13}"
          f"{'in order us':>13}{'any order us':>14}")  # fmt: skip
    for grid, producer, n, after, in_order, any_order in rows:
        print(f"  {grid:<14}{producer:<14}{n:>6}{after:>13.2f}{in_order:>13.2f}{any_order:>14.2f}")
    if rows:
        total = [sum(row[i] for row in rows) for i in (4, 5)]
        print(
            f"  together: {total[0]:.1f} us in order, {total[1]:.1f} us in any order, of a"
            f" {step_us:.1f} us step ({100 * total[0] / step_us:.1f} %, {100 * total[1] / step_us:.1f} %)"
        )


def parse_pair(item: str) -> tuple[str, str]:
    """PRODUCER:CONSUMER kinds."""
    producer, colon, consumer = item.partition(":")
    if not colon or not producer or not consumer:
        raise argparse.ArgumentTypeError(f"a pair is PRODUCER:CONSUMER kinds, got {item!r}")
    return producer, consumer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pair", type=parse_pair, action="append", default=None)
    parser.add_argument("--chunks", type=int, default=8)
    name, prog, timeline = traced_program(__doc__, parser)
    args = parser.parse_args()
    pairs = args.pair or [("m", "y"), ("y", "q")]
    r = Run(prog, timeline)
    print(f"{name}: chunked waits, {args.chunks} chunks a producer grid")
    print_rows(boundary_rows(r, pairs, args.chunks), r.step_us())
    return 0


if __name__ == "__main__":
    sys.exit(main())
