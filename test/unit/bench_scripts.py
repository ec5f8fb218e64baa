"""The scripts under bench/, loaded as modules for their tests (they are not a package)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    """bench/<name>.py as the module `name` (registered in sys.modules, so its dataclasses
    resolve their own annotations)."""
    if str(ROOT / "bench") not in sys.path:  # the scripts import each other, as when run
        sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(name, ROOT / f"bench/{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def stack_frames(nvcc: str, source: str, work: Path) -> list[str]:
    """Compiles a standalone CUDA program for sm_90a (a cubin, no GPU needed) and returns the
    stack frame bytes ptxas reports for each kernel: "0" for each one that keeps its loads in
    registers."""
    from mk.backends.cpu.build import include_dir

    cu = work / "program.cu"
    cu.write_text(source)
    result = subprocess.run(
        [nvcc, "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
         "--expt-relaxed-constexpr", f"-I{include_dir()}", "-Xptxas", "-v", "-cubin",
         "-o", str(work / "program.cubin"), str(cu)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return re.findall(r"(\d+) bytes stack frame", result.stderr)


def run_main(name: str, args: list[str], monkeypatch: Any, capsys: Any) -> list[str]:
    """bench/<name>.py's main() with `args` on its command line; the lines it printed."""
    bench = load(name)
    monkeypatch.setattr("sys.argv", [f"{name}.py", *args])
    bench.main()
    return capsys.readouterr().out.splitlines()


def simulated_schedule(
    prog: Any, run_ns: float = 2000.0, gap_ns: float = 1000.0
) -> tuple[Any, Any, Any]:
    """A compiled CUDA program's queues walked as the GPU would: each task starts `gap_ns` after
    the later of its producers' ends and its SM's previous task's end (the first task of a queue
    with no producer at the launch's start, 1 ms) and runs `run_ns`. (start, end, gap) per
    task, in ns."""
    import numpy as np

    index, tables = prog.graph.index(), prog.tables
    n = len(tables.tasks)
    offsets, order = tables.queue_offsets, tables.queue_tasks
    queues = [list(order[offsets[s] : offsets[s + 1]]) for s in range(len(offsets) - 1)]
    start, end, gap = np.zeros(n), np.zeros(n), np.zeros(n)
    free, at = [1e6] * len(queues), [0] * len(queues)
    while any(at[s] < len(q) for s, q in enumerate(queues)):
        moved = False
        for s, queue in enumerate(queues):
            if at[s] == len(queue):
                continue
            task = queue[at[s]]
            producers = [
                p
                for event, element, distance in index.waits_of(task)
                if distance == 0
                for p in index.producers_of(event, element)
            ]
            if any(end[p] == 0 for p in producers):
                continue
            ready = max([end[p] for p in producers] + [free[s]])
            gap[task] = gap_ns if producers or at[s] else 0
            start[task], end[task] = ready + gap[task], ready + gap[task] + run_ns
            free[s], at[s], moved = end[task], at[s] + 1, True
        assert moved, "the simulated queues deadlocked"
    return start, end, gap


def simulated_tiny(tmp_path: Path, monkeypatch: Any) -> tuple[Any, Any, Any]:
    """tiny's decode step as a CUDA program on 4 SMs (its tables only: no nvcc), with its down
    projections in grids of their own (fuse_accumulate=0) and no tails, and its queues walked by
    simulated_schedule: (program, start, end)."""
    import mk
    import mk.backends.cuda as backend
    from mk.backends.cuda import build
    from mk.models import decode_program, preset

    monkeypatch.setattr(build, "nvcc", lambda: None)
    monkeypatch.setattr(backend, "nvcc", lambda: None)
    text = decode_program(preset("tiny"), 1, 64, 1)
    prog = mk.compile(
        text, target="cuda", num_sms=4, cache_dir=tmp_path, max_tail_tasks=0, fuse_accumulate=0
    )
    start, end, _ = simulated_schedule(prog)
    return prog, start, end
