"""Consecutive run loads of a task body issued together: all loads before any store.

`mk::gpu::load_runs` stores each value into its tile right after loading it, and the compiler
cannot move the next statement's loads above those stores (a tile might alias the buffer), so a
body that loads four small inputs in a row (QK-norm + RoPE: the row, the norm weight, cos, sin)
waits four L2 round trips. `group_loads` rewrites such a run of statements into one
`mk::gpu::load_runs_together`, whose loads all go out before the first store: one round trip.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mk.backends.cuda import switches

_LOAD = re.compile(r"^mk::gpu::load_runs<(\w+::\w+|\w+), (\d+), (\d+)>\((.*)\);  // load$")
_RESIZE = re.compile(r"^\w+\.resize\(\d+\);$")
THREADS = 256  # mk::kCudaThreads
MOST_HELD = 16  # values a thread holds between a group's loads and its stores (load_runs' cap)


def held(n: int) -> int:
    """Values of an n-element run load one thread holds."""
    return -(-n // THREADS)


def group_loads(lines: Sequence[str]) -> list[str]:
    """`lines` with each run of two or more load_runs statements (only tile resizes between
    them) issued as one load_runs_together, the resizes first; a group holds at most MOST_HELD
    values a thread. Only with MK_CUDA_LOAD_GROUPS=1."""
    if not switches.load_groups():
        return list(lines)
    out: list[str] = []
    i = 0
    while i < len(lines):
        j, resizes, loads = i, [], []
        while j < len(lines) and (_RESIZE.match(lines[j]) or _LOAD.match(lines[j])):
            load = _LOAD.match(lines[j])
            if (
                load
                and sum(held(int(m.group(2))) for m in loads) + held(int(load.group(2))) > MOST_HELD
            ):
                break
            (loads if load else resizes).append(load or lines[j])
            j += 1
        if len(loads) < 2:
            out.append(lines[i])
            i += 1
            continue
        while not _LOAD.match(lines[j - 1]):  # trailing resizes belong to what follows
            j -= 1
            resizes.pop()
        parts = ", ".join(f"mk::gpu::run_load<{m[1]}, {m[2]}, {m[3]}>({m[4]})" for m in loads)
        out += [*resizes, f"mk::gpu::load_runs_together({parts});  // load"]
        i = j
    return out
