"""What a launch costs before any task runs: CUDA-graph replays of tiny programs on the GPU.

Usage (on the GPU machine): python bench/launch.py [--runs 200]
Prints the median replay time (CUDA events) on an idle GPU, which also times the host's
submission of the replay, and queued behind a GPU sleep (the device's time alone), of:
- one tiny PyTorch kernel, and a 4 KB memset before it (what a graph node costs);
- a tiny mk program (one elementwise task) and RMSNorm+Linear B1 4096x6144, each a launch
  (one kernel node: launches continue each other's counters) and, for measurement only, with
  the reset before every launch (two memset nodes: the flags, as every launch had before, and
  the epochs); and each again built with MK_CUDA_LAUNCH=plain (cudaLaunchKernel instead of the
  cooperative launch).
Then, from one timeline run of each program (the timeline's per-CTA entry and exit), what its
CTAs spend before their first task and after their last.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import mk
from mk.inputs import random_inputs
from mk.models.torch_reference import capture_graph
from mk.source import entry_function, load_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hops import edges_line  # noqa: E402

from bench import median_ms, rmsnorm_linear, to_torch  # noqa: E402

TINY = """
func.func @tiny(%x: tensor<256xf32>) -> tensor<256xf32> {
  %y = nn.mul %x, %x : (tensor<256xf32>, tensor<256xf32>) -> tensor<256xf32>
  func.return %y : tensor<256xf32>
}
"""


Row = tuple[str, float, float]
EDGES: list[str] = []  # mk_rows' per-CTA summaries, printed after the table


def both(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """(idle, queued) median ms of a graph replay."""
    return median_ms(fn, runs), median_ms(fn, runs, queued=True)


def mk_rows(name: str, text: str, runs: int, plain: bool = False) -> list[Row]:
    """A launch of the program, then (measurement only) the flags reset before every launch;
    with `plain`, a build with MK_CUDA_LAUNCH=plain, its launch alone."""
    fn = entry_function(load_module(text))
    inputs = [to_torch(a) for a in random_inputs(fn, seed=0)]
    before = os.environ.get("MK_CUDA_LAUNCH")
    os.environ["MK_CUDA_LAUNCH"] = "plain" if plain else "cooperative"
    try:
        prog = mk.compile(text, target="cuda")
    finally:
        os.environ.pop("MK_CUDA_LAUNCH")
        if before is not None:
            os.environ["MK_CUDA_LAUNCH"] = before
    outs = prog(*inputs)  # type: ignore[operator]
    grids = prog.ir("task").count("task.grid @")
    how = "plain launch (MK_CUDA_LAUNCH=plain)" if plain else "one launch"
    replay = capture_graph(lambda: prog.launch(*inputs, out=outs))  # type: ignore[attr-defined]
    rows = [(f"mk {name} ({grids} grid(s)), {how}", *both(replay, runs))]
    state = prog._state  # type: ignore[attr-defined]

    def with_reset() -> object:
        state.needs_reset = True  # measurement only: the reset (two memset nodes) every launch
        return prog.launch(*inputs, out=outs)  # type: ignore[attr-defined]

    if not plain:
        rows.append(
            (
                f"mk {name}, reset first (flags and epoch memset nodes)",
                *both(capture_graph(with_reset), runs),
            )
        )
    prog.check()  # type: ignore[attr-defined]
    prog(*inputs)  # type: ignore[operator]  # a normal, checked run after it
    prog.record_timeline = True  # type: ignore[attr-defined]
    for _ in range(3):  # the last of three, its code and tables warm
        prog(*inputs)  # type: ignore[operator]
    spans = prog.last_timeline[-1]  # type: ignore[attr-defined]
    run = float(np.median(spans[:, 1] - spans[:, 0])) / 1e3
    EDGES.append(f"mk {name}, {how}: {edges_line(prog)}; median task {run:.2f} us")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    x = torch.rand(256, device="cuda") + 0.5
    flags = torch.zeros(1024, dtype=torch.int32, device="cuda")
    rows: list[Row] = [
        ("torch: one tiny kernel", *both(capture_graph(lambda: x.mul_(1.0)), args.runs)),
        (
            "torch: 4 KB memset + one tiny kernel",
            *both(capture_graph(lambda: (flags.zero_(), x.mul_(1.0))), args.runs),
        ),
    ]
    for plain in (False, True):
        rows += mk_rows("tiny", TINY, args.runs, plain)
        rows += mk_rows("rmsnorm_linear B1 4096x6144", rmsnorm_linear(1, 6144), args.runs, plain)
    print("| graph replay | idle GPU µs | queued µs |\n|---|---:|---:|")
    for name, idle, queued in rows:
        print(f"| {name} | {idle * 1e3:.2f} | {queued * 1e3:.2f} |")
    print("\n".join(EDGES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
