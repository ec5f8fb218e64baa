"""Barriers only where a task body needs them: between element loops that share data.

An element loop the emitter writes itself (`MK_FOR_EACH_U32(e, n)`: element e on thread
e mod blockDim) leaves its results in the same thread that wrote them. A later loop over the same
n that reads those tiles at index e reads its own writes and needs no `__syncthreads()`; one that
reads them at another offset, or over another n, does. Any other statement (a cooperative
helper, a tile loop's bounds, an arena reset) may read or overwrite anything, so it waits for
every loop before it. A decode task's epilogue (norm scale, silu·mul, residual, stores) so runs
with one barrier or none instead of one per op, each ~0.15 µs on the H200.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

BARRIER = "__syncthreads();"
PLACEHOLDER = "@@mk_loop "
# Statements that touch no tile data: declarations, logical sizes, handle copies, the prefetch.
_QUIET = re.compile(
    r"^(std::vector<\w+> \w+;|mk::gpu::Tile<\w+> \w+\(arena, \d+\);|\(void\).*"
    r"|const int64_t (bx|last) .*"
    r"|\w+\.resize\(\d+\);|if \(ahead == .*)$"
)
ALIAS = re.compile(r"^(\w+)\.alias\((\w+)\);$")
RESIZE = re.compile(r"^(\w+)\.resize\(\d+\);$")
# The header of an element loop the emitter wrote: element e on thread e mod blockDim.
ELEMENT_LOOP = re.compile(r"^MK_FOR_EACH_U32\(e, (\d+)\) \{$")


@dataclass(frozen=True)
class Loop:
    """One element loop: its extent, the tiles it reads (with the offset expression of `e`
    each is read at) and writes (at `e`), and its statements."""

    n: int
    reads: tuple[tuple[str, str], ...]
    writes: tuple[str, ...]
    text: tuple[str, ...]


def every_loop() -> bool:
    """MK_CUDA_BARRIERS=all: a barrier after every element loop, as before this analysis (to
    tell a race from another bug in one build)."""
    return os.environ.get("MK_CUDA_BARRIERS", "") == "all"


def place_barriers(lines: Sequence[str], loops: Sequence[Loop], trailing: bool = True) -> list[str]:
    """`lines` with each placeholder (`PLACEHOLDER` + index into `loops`) replaced by its loop,
    and a barrier before a loop or statement that could see another thread's unfinished work
    (and at the end when `trailing`: a task body's caller synchronises after it anyway)."""
    strict = every_loop()
    out: list[str] = []
    dirty: dict[str, int] = {}  # tile -> extent of the loop that wrote it since the last barrier
    pending = False  # a loop ran since the last barrier

    def barrier() -> None:
        nonlocal pending
        out.append(BARRIER)
        dirty.clear()
        pending = False

    for line in lines:
        if line.startswith(PLACEHOLDER):
            loop = loops[int(line[len(PLACEHOLDER) :])]
            if (
                pending
                and strict
                or any(t in dirty and (at != "e" or dirty[t] != loop.n) for t, at in loop.reads)
            ):
                barrier()
            out += loop.text
            dirty.update(dict.fromkeys(loop.writes, loop.n))
            pending = True
            continue
        alias = ALIAS.match(line)
        if alias and alias.group(2) in dirty:
            dirty[alias.group(1)] = dirty[alias.group(2)]
        elif not alias and not _QUIET.match(line) and pending:
            barrier()
        out.append(line)
    if pending and trailing:
        barrier()
    return out
