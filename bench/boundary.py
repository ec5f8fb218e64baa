"""The step boundary of an in-kernel decode loop: what runs between one step's lm_head and the
next step's first layer, and how long it takes.

Usage (on the GPU machine): python bench/boundary.py --model PRESET [--layers N] [--batch B]
                            [--steps S] [--runs R]

One launch of a decode program of S steps (nn.steps) runs S iterations of the same task
queues. Step t's first layer waits for step t−1's token: the argmax's reduce, the token write,
the next token's embedding and whatever the queues put between them (the token history's copy
into the result, the position steps). bench/timeline.py profiles one step, whose start and end
are the launch's own; this script profiles the boundary between steps. Per boundary (steps
1..S−1 of each of R launches): from the end of the last lm_head task of step t−1 to the first
and the last start of a first-layer q task of step t, and every task in between (the tasks of
step t−1 that start after its lm_head, those of step t that end before its first q task), with
their SM and their start and end relative to the lm_head's end: medians over the boundaries.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hops import kind_of  # noqa: E402

from mk.dialects.task import GraphOp, GridOp  # noqa: E402

HEAD = "logits"  # the lm_head grid's kind in mk.models' decode programs
FIRST = re.compile(r"^k\d+_l0_q$")  # the first layer's q/k/v projection


def boundary_tasks(
    grids: Sequence[str], start: np.ndarray, end: np.ndarray
) -> tuple[float, float, float, list[int], list[int]] | None:
    """Of two consecutive steps' [tasks] start/end times (ns; `start[0]`, `end[0]` the earlier
    step): the lm_head's last end, the first and the last start of a first-layer q task after
    it, and the tasks between (the earlier step's, then the later step's), each by start.
    None when the program has no lm_head or no first-layer q grid."""
    head = [i for i, g in enumerate(grids) if kind_of(g) == HEAD]
    first = [i for i, g in enumerate(grids) if FIRST.match(g)]
    if not head or not first:
        return None
    head_end = float(end[0][head].max())
    q_start = start[1][first]
    before = [i for i in range(len(grids)) if start[0][i] >= head_end and i not in head]
    after = [i for i in range(len(grids)) if end[1][i] <= q_start.min() and i not in first]
    before.sort(key=lambda i: start[0][i])
    after.sort(key=lambda i: start[1][i])
    return head_end, float(q_start.min()), float(q_start.max()), before, after


Row = tuple[str, int, float, float]  # task, SM, start, end (µs after the lm_head's end)


def boundary_rows(
    grids: Sequence[str], sm_of: Sequence[int], timelines: Sequence[np.ndarray]
) -> tuple[list[float], list[float], list[Row]]:
    """Over every boundary of every launch's [steps, tasks, 2] timeline (ns): the µs from the
    lm_head's last end to the first and to the last first-layer q start, and the boundary's
    tasks with their medians (a task named `grid` or `grid[i]` for task i of a grid of many,
    `@t-1` when it belongs to the earlier step)."""
    first_q: list[float] = []
    last_q: list[float] = []
    seen: dict[str, tuple[int, list[float], list[float]]] = {}
    names = _task_names(grids)
    for timeline in timelines:
        for t in range(1, timeline.shape[0]):
            pair = timeline[t - 1 : t + 1]
            found = boundary_tasks(grids, pair[:, :, 0], pair[:, :, 1])
            if found is None:
                return [], [], []
            origin, q0, q1, before, after = found
            first_q.append((q0 - origin) / 1e3)
            last_q.append((q1 - origin) / 1e3)
            for step, tasks in ((0, before), (1, after)):
                for task in tasks:
                    key = names[task] + ("@t-1" if step == 0 else "")
                    _, starts, ends = seen.setdefault(key, (sm_of[task], [], []))
                    starts.append((pair[step, task, 0] - origin) / 1e3)
                    ends.append((pair[step, task, 1] - origin) / 1e3)
    rows = [(k, sm, float(np.median(s)), float(np.median(e))) for k, (sm, s, e) in seen.items()]
    return first_q, last_q, sorted(rows, key=lambda r: r[2])


def _task_names(grids: Sequence[str]) -> list[str]:
    count: dict[str, int] = {}
    for g in grids:
        count[g] = count.get(g, 0) + 1
    at: dict[str, int] = {}
    names = []
    for g in grids:
        i = at.get(g, 0)
        at[g] = i + 1
        names.append(kind_of(g) if count[g] == 1 else f"{kind_of(g)}[{i}]")
    return names


def waits_by_kind(waits: Sequence[tuple[str, Sequence[tuple[str, int]]]]) -> dict[str, str]:
    """Per grid kind, the kinds it waits on: from (grid, [(producer grid, distance)]) in program
    order, each producer kind once, `@t-1` for a wait on the iteration before (a step's position
    waits on the step before's cache writes, which read the position it overwrites)."""
    out: dict[str, str] = {}
    for grid, producers in waits:
        seen: list[str] = []
        for producer, distance in producers:
            name = kind_of(producer) + ("@t-1" if distance else "")
            if name not in seen:
                seen.append(name)
        out.setdefault(kind_of(grid), ", ".join(seen) or "-")
    return out


def program_waits(graph: GraphOp) -> list[tuple[str, list[tuple[str, int]]]]:
    """(grid, [(producer grid, distance)]) of a task.graph's grids, the producers of an event
    being the grids that signal it."""
    grids = [op for op in graph.body.block.ops if isinstance(op, GridOp)]
    signalled_by: dict[str, list[str]] = {}
    for grid in grids:
        for edge in grid.signals:
            signalled_by.setdefault(edge.event_name, []).append(grid.sym_name.data)
    return [
        (
            grid.sym_name.data,
            [(p, e.distance_value) for e in grid.waits for p in signalled_by.get(e.event_name, [])],
        )
        for grid in grids
    ]


def print_boundary(
    first_q: Sequence[float],
    last_q: Sequence[float],
    rows: Sequence[Row],
    waits: dict[str, str] | None = None,
) -> None:
    if not first_q:
        print("  (no boundary: one step, or no lm_head / first-layer q grid)")
        return
    print(
        f"  {len(first_q)} boundaries: lm_head's end -> first layer-0 q start "
        f"{np.median(first_q):.2f} us (min {min(first_q):.2f}, max {max(first_q):.2f}), "
        f"-> last q start {np.median(last_q):.2f} us"
    )
    print(f"  {'task':<22}{'SM':>5}{'start us':>10}{'end us':>9}{'run us':>8}  waits on")
    for name, sm, start, end in rows:
        kind = re.sub(r"(\[\d+\])?(@t-1)?$", "", name)
        on = (waits or {}).get(kind, "")
        print(f"  {name:<22}{sm:>5}{start:>10.2f}{end:>9.2f}{end - start:>8.2f}  {on[:60]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2: a boundary lies between two steps")
    import torch

    import mk
    from bench import at_full_context, pass_options, to_torch
    from mk.inputs import random_inputs
    from mk.models import decode_program, preset
    from mk.source import entry_function, load_module

    config = preset(args.model)
    if args.layers is not None:
        config = config.with_(layers=args.layers)
    text = decode_program(config, args.batch, 1024, args.steps)
    func = entry_function(load_module(text))
    inputs = [to_torch(a) for a in at_full_context(func, random_inputs(func, seed=0))]
    prog = mk.compile(text, target="cuda", **pass_options())
    prog.record_timeline = True  # type: ignore[attr-defined]
    timelines = []
    for run in range(args.runs + 1):
        # The history and caches are donated: each launch writes the same slots again.
        prog(*inputs)
        torch.cuda.synchronize()
        if run:  # the first launch builds and warms up
            timelines.append(np.asarray(prog.last_timeline, dtype=np.float64)[..., :2])  # type: ignore[attr-defined]
    index, tables = prog.graph.index(), prog.tables  # type: ignore[attr-defined]
    grids = [index.locate(t)[0].sym_name.data for t in range(len(tables.tasks))]
    sm_of = [0] * len(grids)
    offsets, order = tables.queue_offsets, tables.queue_tasks
    for sm in range(len(offsets) - 1):
        for task in order[offsets[sm] : offsets[sm + 1]]:
            sm_of[int(task)] = sm
    name = f"{args.model} L{config.layers} B{args.batch}, {args.steps} steps a launch"
    print(f"{name}: the step boundary, medians over {args.runs} launches")
    waits = waits_by_kind(program_waits(prog.graph))  # type: ignore[attr-defined]
    print_boundary(*boundary_rows(grids, sm_of, timelines), waits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
