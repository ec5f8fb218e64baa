"""Where a megakernel run's time goes between tasks: per kind of grid, how long tasks waited for
their producers, how long they took to start once they could, and how long they ran.

Usage: python bench/hops.py --model PRESET [--layers N] [--batch B] TRACE.json
(TRACE.json from `bench/timeline.py --model ... --out DIR`; the program is rebuilt here, without
a GPU, to know each task's producers.) `bench/timeline.py --model` prints the same table live.

For task i with start s_i and end e_i on its SM: ready_i is the last end among the tasks that
signal the event elements it waits for (this iteration's), free_i the end of the task before it
in its SM's queue. Then `dispatch` = s_i - max(ready_i, free_i): the event hop (release fence,
counter, poll, barrier) plus the dispatcher's own work; `starved` = max(0, ready_i - free_i):
the SM idle waiting for producers; `run` = e_i - s_i.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def kind_of(grid: str) -> str:
    """`k12_l3_q` -> `q`: a grid's role, the same in every layer."""
    return re.sub(r"^k\d+_(l\d+_)?", "", grid)


def ready_times(
    num_tasks: int,
    end: np.ndarray,
    waits_of: Callable[[int], list[tuple[str, tuple[int, ...], int]]],
    producers_of: Callable[[str, tuple[int, ...]], list[int]],
) -> np.ndarray:
    """Per task, the last end among its same-iteration producers (NaN: none)."""
    ready = np.full(num_tasks, np.nan)
    for task in range(num_tasks):
        ends = [
            end[p]
            for event, element, distance in waits_of(task)
            if distance == 0
            for p in producers_of(event, element)
        ]
        if ends:
            ready[task] = max(ends)
    return ready


def producer_table(index: Any) -> dict[tuple[str, tuple[int, ...]], list[int]]:
    """Every event element's producing tasks, built once from the producer edges (a query per
    wait would evaluate each producer grid's element map again)."""
    from mk.dialects.task_maps import edge_elements

    table: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for event, edges in index.producers.items():
        for grid, edge in edges:
            elements = edge_elements(grid, edge)
            if elements is None:
                continue
            base = index.base_of(grid)
            for i, element in enumerate(map(tuple, elements.tolist())):
                table.setdefault((event, element), []).append(base + i)
    return table


def free_times(queues: Sequence[Sequence[int]], end: np.ndarray, origin: float) -> np.ndarray:
    """Each task's SM's previous task's end (`origin`, the launch's start, for a queue's first)."""
    free = np.full(len(end), float(origin))
    for queue in queues:
        for prev, task in zip(queue, queue[1:], strict=False):
            free[task] = end[prev]
    return free


def started_tasks(grids: Sequence[str], start: np.ndarray) -> dict[str, list[int]]:
    """Each grid's tasks that ran (a start > 0), in task order."""
    by_grid: dict[str, list[int]] = {}
    for task, grid in enumerate(grids):
        if start[task] > 0:
            by_grid.setdefault(grid, []).append(task)
    return by_grid


def hop_rows(
    kinds: Sequence[str],
    start: np.ndarray,
    end: np.ndarray,
    ready: np.ndarray,
    queues: Sequence[Sequence[int]],
) -> list[tuple[str, int, float, float, float]]:
    """(kind, tasks, mean starved µs, mean dispatch µs, mean run µs) per kind, by summed
    dispatch + run, largest first. Times in ns; tasks with no start (0) are left out."""
    origin = start[start > 0].min() if (start > 0).any() else 0
    free = free_times(queues, end, origin)
    could = np.fmax(np.nan_to_num(ready, nan=origin), free)
    starved = np.clip(np.nan_to_num(ready, nan=origin) - free, 0, None)
    sums: dict[str, np.ndarray] = {}
    for task, kind in enumerate(kinds):
        if start[task] <= 0:
            continue
        row = np.array([1.0, starved[task], start[task] - could[task], end[task] - start[task]])
        sums[kind] = sums.get(kind, np.zeros(4)) + row
    rows = [
        (kind, int(s[0]), s[1] / s[0] / 1e3, s[2] / s[0] / 1e3, s[3] / s[0] / 1e3)
        for kind, s in sums.items()
    ]
    return sorted(rows, key=lambda r: -(r[3] + r[4]) * r[1])


def print_hops(rows: Sequence[tuple[str, int, float, float, float]]) -> None:
    print(f"  {'kind':<16}{'tasks':>7}{'starved us':>12}{'dispatch us':>13}{'run us':>9}")
    for kind, n, starved, dispatch, run in rows:
        print(f"  {kind:<16}{n:>7}{starved:>12.2f}{dispatch:>13.2f}{run:>9.2f}")


def tail_rows(
    grids: Sequence[str], start: np.ndarray, end: np.ndarray, least: int = 8
) -> list[tuple[str, int, float, float]]:
    """(kind, grids, mean µs, most µs) per kind of grid of at least `least` tasks: how long after
    its tasks' mean end a grid's last task ends, which whatever waits for the whole grid waits
    beyond the average task. Times in ns; tasks with no start (0) are left out."""
    tails: dict[str, list[float]] = {}
    for grid, tasks in started_tasks(grids, start).items():
        if len(tasks) >= least:
            ends = end[tasks]
            tails.setdefault(kind_of(grid), []).append((ends.max() - ends.mean()) / 1e3)
    rows = [(kind, len(t), float(np.mean(t)), float(np.max(t))) for kind, t in tails.items()]
    return sorted(rows, key=lambda r: -r[2] * r[1])


def print_tails(rows: Sequence[tuple[str, int, float, float]]) -> None:
    print(f"  {'kind':<16}{'grids':>7}{'mean us':>9}{'most us':>9}")
    for kind, n, mean, most in rows:
        print(f"  {kind:<16}{n:>7}{mean:>9.2f}{most:>9.2f}")


def phase_rows(
    grids: Sequence[str], start: np.ndarray, end: np.ndarray, least: int = 8
) -> list[tuple[str, int, float, float]]:
    """(kind, grids, mean µs, most µs) per kind of grid of at least `least` tasks: the grids in
    the order their last tasks end, each one's phase from the last end of the grid before it to
    its own last end (the first grid's from the launch's first start). What a layer's chain of
    whole-grid waits costs phase by phase, whether a grid's readers wait on counters or on
    flags (session 84 compared two builds this way). Times in ns; tasks with no start (0) are
    left out."""
    ordered = sorted(
        (end[tasks].max(), grid)
        for grid, tasks in started_tasks(grids, start).items()
        if len(tasks) >= least
    )
    first = start[start > 0].min() if (start > 0).any() else 0
    phases: dict[str, list[float]] = {}
    before = first
    for last, grid in ordered:
        phases.setdefault(kind_of(grid), []).append((last - before) / 1e3)
        before = last
    rows = [(kind, len(p), float(np.mean(p)), float(np.max(p))) for kind, p in phases.items()]
    return sorted(rows, key=lambda r: -r[2] * r[1])


def task_grids(prog: object) -> list[str]:
    """Each task's grid name, in task order."""
    index = prog.graph.index()  # type: ignore[attr-defined]
    return [index.locate(t)[0].sym_name.data for t in range(len(prog.tables.tasks))]  # type: ignore[attr-defined]


def sm_queues(tables: Any) -> list[list[int]]:
    """Each SM's queue of task ids, in order."""
    off, tasks = tables.queue_offsets, tables.queue_tasks
    return [list(tasks[off[s] : off[s + 1]]) for s in range(len(off) - 1)]


class Run:
    """What the per-task analyses read of a compiled CUDA program and one iteration's
    [tasks, 2] timeline (ns): start and end per task, each task's kind, the SM queues, and
    each task's same-iteration waits and their producers."""

    def __init__(self, prog: object, timeline: np.ndarray) -> None:
        index = prog.graph.index()  # type: ignore[attr-defined]
        tables = prog.tables  # type: ignore[attr-defined]
        self.n = len(tables.tasks)
        self.start = timeline[:, 0].astype(np.float64)
        self.end = timeline[:, 1].astype(np.float64)
        self.queues = sm_queues(tables)
        self.grids = task_grids(prog)
        self.kinds = [kind_of(grid) for grid in self.grids]
        self.waits_of = index.waits_of
        table = producer_table(index)
        self.producers_of: Callable[[str, tuple[int, ...]], list[int]] = lambda e, el: table.get(
            (e, tuple(el)), []
        )

    def step_us(self) -> float:
        """From the first task's start to the last task's end."""
        ran = self.start > 0
        return float(self.end[ran].max() - self.start[ran].min()) / 1e3


def hops_of(r: Run) -> list[tuple[str, int, float, float, float]]:
    """hop_rows of one run."""
    ready = ready_times(r.n, r.end, r.waits_of, r.producers_of)
    return hop_rows(r.kinds, r.start, r.end, ready, r.queues)


def read_trace(path: Path, num_tasks: int) -> np.ndarray:
    """A Chrome trace of `prog.trace` back to an iteration-0 [tasks, 2] timeline (ns)."""
    timeline = np.zeros((num_tasks, 2))
    for event in json.loads(path.read_text())["traceEvents"]:
        if event.get("args", {}).get("iteration", 0) != 0:
            continue
        task = int(re.match(r"task (\d+)", event["name"]).group(1))  # type: ignore[union-attr]
        timeline[task] = (1e3 * event["ts"] + 1.0, 1e3 * (event["ts"] + event["dur"]) + 1.0)
    return timeline


def traced_program(
    doc: str | None, parser: argparse.ArgumentParser | None = None
) -> tuple[str, object, np.ndarray]:
    """From the command line (TRACE.json --model PRESET [--layers N] [--batch B], and whatever
    else `parser` takes: read them from its parse_args() after this): the model step's name,
    its CUDA program rebuilt without a GPU (the tables only) and the trace's iteration-0
    timeline."""
    parser = parser or argparse.ArgumentParser(description=doc)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    import mk
    import mk.backends.cuda as backend
    from mk.backends.cuda import build
    from mk.models import decode_program, preset

    build.nvcc = backend.nvcc = lambda: None  # the tables only: no module to build
    config = preset(args.model)
    if args.layers is not None:
        config = config.with_(layers=args.layers)
    prog = mk.compile(decode_program(config, args.batch, 1024, 1), target="cuda")
    timeline = read_trace(args.trace, len(prog.tables.tasks))  # type: ignore[attr-defined]
    return f"{args.model} L{config.layers} B{args.batch}", prog, timeline


def cta_edges(
    ctas: np.ndarray, timeline: np.ndarray, queues: Sequence[Sequence[int]]
) -> tuple[float, float, float, float] | None:
    """What a launch costs around its tasks, from each CTA's (entry, exit) ns (`ctas`,
    `last_ctas`) and the tasks' [iterations][tasks] (start, end) ns, per CTA with a queue:
    (µs from the first CTA's entry to the last's, median µs from a CTA's entry to its first
    task's start, median µs from its last task's end to its exit, µs from the first entry to
    the first task's start anywhere). None without every busy CTA's entry and exit."""
    busy = [sm for sm, q in enumerate(queues) if len(q)]
    if not busy or (ctas[busy] == 0).any():
        return None
    first = np.array([timeline[0, queues[sm][0], 0] for sm in busy], dtype=np.int64)
    last = np.array([timeline[-1, queues[sm][-1], 1] for sm in busy], dtype=np.int64)
    entry, exit_ = ctas[busy, 0].astype(np.int64), ctas[busy, 1].astype(np.int64)
    return (
        float(entry.max() - entry.min()) / 1e3,
        float(np.median(first - entry)) / 1e3,
        float(np.median(exit_ - last)) / 1e3,
        float(first.min() - entry.min()) / 1e3,
    )


def edges_line(prog: object) -> str:
    """cta_edges of the program's last launch as one line (or why there is none)."""
    ctas = getattr(prog, "last_ctas", None)
    queues = sm_queues(prog.tables)  # type: ignore[attr-defined]
    got = None if ctas is None else cta_edges(ctas, prog.last_timeline, queues)  # type: ignore[attr-defined]
    if got is None:
        return "CTA entries and exits: not recorded"
    spread, to_first, from_last, first = got
    return (
        f"CTA entries within {spread:.2f} us; entry to its first task {to_first:.2f} us "
        f"(median), last task to exit {from_last:.2f} us; first entry to first task {first:.2f} us"
    )


def wait_summary(prog: object) -> str:
    """The grid whose tasks check the most events before they start (each an L2 round trip of
    the dispatcher), and the mean over all tasks."""
    grids = prog.graph.index().grids  # type: ignore[attr-defined]
    worst = max(grids, key=lambda g: len(g.waits))
    total = sum(len(g.waits) * g.num_tasks for g in grids)
    tasks = sum(g.num_tasks for g in grids)
    return (
        f"waits per task: at most {len(worst.waits)} ({worst.sym_name.data}), "
        f"{total / max(tasks, 1):.2f} on average"
    )


def main() -> int:
    name, prog, timeline = traced_program(__doc__)
    print(f"{name}: per kind, mean µs per task")
    print_hops(hops_of(Run(prog, timeline)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
