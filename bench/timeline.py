"""Per-grid timeline of one megakernel run on the GPU: where a workload's time goes.

Usage (on the GPU machine): python bench/timeline.py [--only NAME] [--out DIR] [--ops]
                            python bench/timeline.py --model PRESET [--layers N] [--batch B] [--ops]
                                                     [--grids] [--prefill P]
For each task.grid: its tasks, the span from its first start to its last end (µs, from the
launch's first task start) and the mean task time. Also writes a Chrome trace per workload.
With --model, one decode step of a model preset (positions at the end of a 1,024-slot cache),
summed per kind of grid over the layers (`k12_l3_q` counts as `q`), and how long each kind's
tasks starve, take to start once they could, and run, how late each grid's last task ends and
each grid's phase from the last end before it (bench/hops.py), and the critical path per kind
(bench/critical_path.py); with --grids also grid by grid, so that layer 0 (whose
code comes from a cold instruction cache) shows against the rest. With --prefill P, the
model's prefill program of P positions (mk.models.prefill_program) instead of a decode step. With --ops, a profile build
(op marks, backends/cuda/op_marks.py) also says how long each statement of a task body takes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

import mk
from mk.backends.cuda.op_marks import op_segments
from mk.inputs import random_inputs
from mk.source import entry_function, load_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from critical_path import path_of, print_path  # noqa: E402
from hops import (  # noqa: E402
    Run,
    edges_line,
    hops_of,
    kind_of,
    phase_rows,
    print_hops,
    print_tails,
    tail_rows,
    wait_summary,
)

from bench import at_full_context, pass_options, to_torch, workloads  # noqa: E402


def grid_rows(prog: object) -> list[tuple[str, int, float, float, float]]:
    """(grid, tasks, start µs, end µs, mean task µs) in order of first start."""
    timeline = prog.last_timeline[-1]  # type: ignore[attr-defined]
    index = prog.graph.index()  # type: ignore[attr-defined]
    origin = timeline[:, 0][timeline[:, 0] > 0].min()
    spans: dict[str, list[tuple[int, int]]] = {}
    for task, (start, end) in enumerate(timeline):
        grid, _ = index.locate(task)
        spans.setdefault(grid.sym_name.data, []).append((int(start), int(end)))
    rows = []
    for name, s in spans.items():
        a = np.array(s, dtype=np.int64) - origin
        rows.append(
            (
                name,
                len(s),
                a[:, 0].min() / 1e3,
                a[:, 1].max() / 1e3,
                (a[:, 1] - a[:, 0]).mean() / 1e3,
            )
        )
    return sorted(rows, key=lambda r: r[2])


def grid_bytes(prog: object) -> dict[str, int]:
    """DRAM bytes per grid by the cost model (its per-task share × tasks)."""
    out = {}
    for grid in prog.graph.index().grids:  # type: ignore[attr-defined]
        out[grid.sym_name.data] = grid.cost.get("bytes", 0) * grid.num_tasks
    return out


def print_grids(rows: list[tuple[str, int, float, float, float]]) -> None:
    """Each grid's tasks, start, end and mean task time (µs), in order of start."""
    print(f"  {'grid':<14}{'tasks':>6}{'start us':>10}{'end us':>10}{'mean task us':>14}")
    for grid, n, start, end, mean in sorted(rows, key=lambda r: r[2]):
        print(f"  {grid:<14}{n:>6}{start:>10.2f}{end:>10.2f}{mean:>14.2f}")


def model_summary(prog: object) -> None:
    """Per kind of grid: grids, tasks, summed span, mean task time and the DRAM bandwidth its
    bytes (cost model) over its span make, largest first."""
    kinds: dict[str, list[float]] = {}
    moved = grid_bytes(prog)
    for grid, n, start, end, mean in grid_rows(prog):
        k = kinds.setdefault(kind_of(grid), [0, 0, 0.0, 0.0, 0.0])
        k[0], k[1], k[2], k[3] = k[0] + 1, k[1] + n, k[2] + end - start, k[3] + mean * n
        k[4] += moved.get(grid, 0)
    rows = sorted(kinds.items(), key=lambda kv: -kv[1][2])
    print(f"  {'kind':<16}{'grids':>6}{'tasks':>7}{'span us':>10}{'mean task us':>14}{'GB/s':>8}")
    for kind, (grids, tasks, span, busy, nbytes) in rows:
        rate = nbytes / (span * 1e3) if span > 0 else 0.0
        print(
            f"  {kind:<16}{grids:>6}{tasks:>7}{span:>10.1f}{busy / max(tasks, 1):>14.2f}{rate:>8.0f}"
        )


def print_op_segments(prog: object, top: int = 12) -> None:
    """The op-mark profile of the last run (a build with MK_CUDA_OP_MARKS=1), per kind."""
    marks = prog.last_marks  # type: ignore[attr-defined]
    if marks is None:
        print("  (no op marks: the program was not built with MK_CUDA_OP_MARKS=1)")
        return
    index = prog.graph.index()  # type: ignore[attr-defined]
    grids = [index.locate(t)[0].sym_name.data for t in range(len(prog.tables.tasks))]  # type: ignore[attr-defined]
    labels = [prog.mark_labels.get(g, ()) for g in grids]  # type: ignore[attr-defined]
    segments = op_segments(prog.last_timeline[-1], marks[-1], labels, [kind_of(g) for g in grids])  # type: ignore[attr-defined]
    ranked = sorted(segments.items(), key=lambda kv: -sum(v for _, v in kv[1]))
    for kind, rows in ranked[:top]:
        parts = ", ".join(f"{name} {us:.2f}" for name, us in rows)
        print(f"  {kind:<16}{sum(v for _, v in rows):>7.2f} us = {parts}")


def model_workload(name: str, layers: int | None, batch: int) -> tuple[str, str]:
    from mk.models import decode_program

    config = model_config(name, layers)
    return f"{name} L{config.layers} B{batch}", decode_program(config, batch, 1024, 1)


def model_config(name: str, layers: int | None) -> Any:
    from mk.models import preset

    config = preset(name)
    return config if layers is None else config.with_(layers=layers)


def prefill_workload(
    name: str, layers: int | None, batch: int, length: int
) -> tuple[str, str, list[Any]]:
    """(name, text, inputs) of the model's prefill of `length` positions, random weights."""
    from mk.models import (
        prefill_inputs,
        prefill_program,
        program_inputs,
        random_prompt,
        random_weights,
    )

    config = model_config(name, layers)
    context = length + 8
    prompt = random_prompt(config, batch, length + 1, seed=0)
    host = program_inputs(
        config, random_weights(config, seed=0), batch, context, prompt, prefill=False
    )
    inputs = [
        to_torch(v) if isinstance(v, np.ndarray) else v
        for v in prefill_inputs(config, host, prompt, context)
    ]
    text = prefill_program(config, batch, length, context)
    return f"{name} L{config.layers} B{batch} prefill {length}", text, inputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--model", default=None, help="a model preset instead of the workloads")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument(
        "--grids", action="store_true", help="a model's grids one by one (layer 0 against the rest)"
    )
    parser.add_argument("--prefill", type=int, default=0, help="the model's prefill of P positions")
    parser.add_argument(
        "--ops", action="store_true", help="op marks: where each kind of task spends its time"
    )
    args = parser.parse_args()
    if args.ops and os.environ.get("MK_CUDA_OP_MARKS", "") in ("", "0"):
        os.environ["MK_CUDA_OP_MARKS"] = "1"  # MK_CUDA_OP_MARKS=warm stays
    if args.model and args.prefill:
        name, text, inputs = prefill_workload(args.model, args.layers, args.batch, args.prefill)
    elif args.model:
        name, text = model_workload(args.model, args.layers, args.batch)
        func = entry_function(load_module(text))
        inputs = [to_torch(a) for a in at_full_context(func, random_inputs(func, seed=0))]
    if args.model:
        prog = mk.compile(text, target="cuda", **pass_options())
        prog.record_timeline = True  # type: ignore[attr-defined]
        for _ in range(3):
            prog(*inputs)
        torch.cuda.synchronize()
        total = grid_rows(prog)
        print(f"{name}: {len(prog.tables.tasks)} tasks, step {max(r[3] for r in total):.1f} us")
        used = prog.cuda_resources  # type: ignore[attr-defined]
        print(f"megakernel: {used.summary() if used else 'no ptxas report'}")
        print(wait_summary(prog))
        print(edges_line(prog))
        model_summary(prog)
        if args.grids:
            print_grids(total)
        run = Run(prog, prog.last_timeline[-1])  # type: ignore[attr-defined]
        print("per kind, mean µs per task (bench/hops.py):")
        print_hops(hops_of(run))
        print(
            "how long after its tasks' mean end a grid's last task ends, per kind (bench/hops.py):"
        )
        print_tails(tail_rows(run.grids, run.start, run.end))
        print("a grid's phase: from the last end of the grid before it to its own (bench/hops.py):")
        print_tails(phase_rows(run.grids, run.start, run.end))
        print("the critical path, per kind (bench/critical_path.py):")
        print_path(path_of(run))
        if args.ops:
            print("mean task time per statement (µs), by kind:")
            print_op_segments(prog)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            prog.trace(args.out / f"{args.model}_L{args.layers or 'all'}_B{args.batch}.json")  # type: ignore[attr-defined]
        return 0
    for name, text in workloads().items():
        if args.only not in name:
            continue
        inputs = [to_torch(a) for a in random_inputs(entry_function(load_module(text)), seed=0)]
        prog = mk.compile(text, target="cuda", **pass_options())
        prog.record_timeline = True  # type: ignore[attr-defined]
        for _ in range(3):
            prog(*inputs)
        torch.cuda.synchronize()
        print(f"{name}: {len(prog.tables.tasks)} tasks")
        print(edges_line(prog))
        print_grids(grid_rows(prog))
        if args.ops:
            print_op_segments(prog)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            prog.trace(args.out / (name.split()[0] + "_" + name.split()[1] + ".json"))  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.exit(main())
