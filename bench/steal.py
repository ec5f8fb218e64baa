"""How much earlier a model step's grids could end if the SMs done with their task of a grid took
parts of the tasks still running (work stealing), estimated from a saved per-task trace.

Usage: python bench/steal.py TRACE.json --model PRESET [--layers N] [--batch B]
                             [--cells N] [--claim-us C] [--least T]
(TRACE.json from `bench/timeline.py --model ... --out DIR`; the program is rebuilt here, without
a GPU, to know each task's grid and SM.)

Each task of a grid of at least T tasks (default 64) is cut into N equal cells (default 16). Its
owner takes them from the front at its measured pace (run / N a cell), starting when it did;
an SM whose own task of the grid is done takes a cell from the back of the task with the most
cells left, at its own pace plus C µs (default 1.0: the claim's round trip and the victim's
descriptors), where it ends that cell before the owner would, and a task ends when its last
cell does. The grid's last end moves by the
difference. Each grid is taken alone (a saving is not carried into the grids after it), an SM
keeps its measured pace when fewer SMs stream beside it, and the cells' partial sums are assumed
free to combine: so the figure bounds what stealing could give under these costs.
"""

from __future__ import annotations

import argparse
import heapq
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hops import Run, kind_of, started_tasks, traced_program  # noqa: E402


def stolen_end(start: np.ndarray, run: np.ndarray, cells: int, claim_ns: float) -> float:
    """The last end of a grid's tasks (started at `start`, running `run` alone, in ns) when the
    SMs done with their own task take cells from the back of the task with the most left."""
    n = len(start)
    front = np.zeros(n, np.int64)  # the owner's next cell
    back = np.full(n, cells, np.int64)  # cells [front, back) not yet taken
    done = start.astype(np.float64).copy()  # when each task's last taken cell ends
    owner = done.copy()  # when each owner ends the cell it is on
    events = [(float(start[j]), 0, j, j) for j in range(n)]  # (time, thief?, sm, task)
    heapq.heapify(events)
    while events:
        t, thief, sm, task = heapq.heappop(events)
        if not thief and front[task] < back[task]:
            front[task] += 1  # the owner takes its next cell
            owner[task] = t + run[task] / cells
            heapq.heappush(events, (owner[task], 0, sm, task))
            done[task] = max(done[task], owner[task])
            continue
        left = back - front
        victim = int(np.argmax(left))
        end = t + claim_ns + run[sm] / cells
        # Only a cell the thief ends before its owner would: the owner, busy with its cell
        # `front - 1` until `owner`, would end the last one `left` cells later.
        mine = max(owner[victim], t)
        if left[victim] < 1 or end >= mine + left[victim] * run[victim] / cells:
            continue
        back[victim] -= 1
        done[victim] = max(done[victim], end)
        heapq.heappush(events, (end, 1, sm, victim))
    return float(done.max())


def grid_rows(
    r: Run, cells: int, claim_us: float, least: int
) -> list[tuple[str, int, float, float, float]]:
    """(grid, tasks, mean task µs, last end − mean end µs, saving µs) for each grid of at least
    `least` tasks that ran."""
    rows = []
    for grid, tasks in started_tasks(r.grids, r.start).items():
        if len(tasks) < least:
            continue
        start, end = r.start[tasks], r.end[tasks]
        run = end - start
        saving = end.max() - stolen_end(start, run, cells, claim_us * 1e3)
        rows.append(
            (grid, len(tasks), run.mean() / 1e3, (end.max() - end.mean()) / 1e3, saving / 1e3)
        )
    return rows


def print_rows(rows: Sequence[tuple[str, int, float, float, float]], step_us: float) -> None:
    kinds: dict[str, list[float]] = {}
    for grid, _, _, _, saving in rows:
        kinds.setdefault(kind_of(grid), []).append(saving)
    print(f"  {'grid':<16}{'tasks':>6}{'mean task us':>14}{'tail us':>9}{'saving us':>11}")
    for grid, n, mean, tail, saving in rows:
        print(f"  {grid:<16}{n:>6}{mean:>14.2f}{tail:>9.2f}{saving:>11.2f}")
    total = sum(sum(v) for v in kinds.values())
    by_kind = ", ".join(
        f"{k} {sum(v):.1f}" for k, v in sorted(kinds.items(), key=lambda kv: -sum(kv[1]))
    )
    print(
        f"  together: {total:.1f} us of a {step_us:.1f} us step ({100 * total / step_us:.1f} %): {by_kind}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=16)
    parser.add_argument("--claim-us", type=float, default=1.0)
    parser.add_argument("--least", type=int, default=64)
    name, prog, timeline = traced_program(__doc__, parser)
    args = parser.parse_args()
    r = Run(prog, timeline)
    print(f"{name}: work stealing, {args.cells} cells a task, {args.claim_us} us a stolen cell")
    print_rows(grid_rows(r, args.cells, args.claim_us, args.least), r.step_us())
    return 0


if __name__ == "__main__":
    sys.exit(main())
