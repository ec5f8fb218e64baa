"""A task body's run loads issued together and early: loads go out before stores wait on them.

`mk::gpu::load_runs` stores each value into its tile right after loading it, and the compiler
cannot move the next statement's loads above those stores (a tile might alias the buffer), so a
body that loads four small inputs in a row (QK-norm + RoPE: the row, the norm weight, cos, sin)
waits four L2 round trips. `group_loads` rewrites such a run of statements into one
`mk::gpu::load_runs_together`, whose loads all go out before the first store: one round trip.
And an epilogue input loaded right after a streamed product (the residual of the o- and down
projections) waits a round trip of its own after the weights; `group_loads` issues its loads
before the product (`mk::gpu::load_early`) and stores them after it (`mk::gpu::store_loaded`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mk.backends.cuda import switches
from mk.backends.cuda.stream_attention import THREADS

_LOAD = re.compile(r"^mk::gpu::load_runs<(\w+::\w+|\w+), (\d+), (\d+)>\((.*)\);  // load$")
_RESIZE = re.compile(r"^\w+\.resize\(\d+\);$")
# A streamed product that waits for nothing inside (its weights not staged).
_PLAIN_PRODUCT = re.compile(r"^mk::gpu::stream_linear<[^>]*>\(sl\);$")
MOST_HELD = 16  # values a thread holds between a group's loads and its stores (load_runs' cap)


def held(load: re.Match[str]) -> int:
    """Values of a matched run load that one thread holds."""
    return -(-int(load[2]) // THREADS)


def _run_load(load: re.Match[str]) -> str:
    """The mk::gpu::RunLoad of a matched load_runs statement."""
    return f"mk::gpu::run_load<{load[1]}, {load[2]}, {load[3]}>({load[4]})"


def group_loads(lines: Sequence[str]) -> list[str]:
    """`lines` with each run of two or more load_runs statements (only tile resizes between
    them) issued as one load_runs_together, the resizes first; a group holds at most MOST_HELD
    values a thread; run loads right after a streamed product are issued before it first
    (hoist_after_products). Off with MK_CUDA_LOAD_GROUPS=0."""
    if not switches.load_groups():
        return list(lines)
    lines = hoist_after_products(lines)
    out: list[str] = []
    i = 0
    while i < len(lines):
        j = _loads_end(lines, i)
        while j > i and not _LOAD.match(lines[j - 1]):  # trailing resizes belong to what follows
            j -= 1
        loads = [m for line in lines[i:j] if (m := _LOAD.match(line))]
        if len(loads) < 2:
            out.append(lines[i])
            i += 1
            continue
        resizes = [line for line in lines[i:j] if not _LOAD.match(line)]
        parts = ", ".join(_run_load(m) for m in loads)
        out += [*resizes, f"mk::gpu::load_runs_together({parts});  // load"]
        i = j
    return out


def _loads_end(lines: Sequence[str], start: int) -> int:
    """The end of the run of tile resizes and run loads from `start` whose loads hold at most
    MOST_HELD values a thread."""
    j, values = start, 0
    while j < len(lines):
        load = _LOAD.match(lines[j])
        if load is None and not _RESIZE.match(lines[j]):
            break
        if load is not None:
            values += held(load)
            if values > MOST_HELD:
                break
        j += 1
    return j


def hoist_after_products(lines: Sequence[str]) -> list[str]:
    """`lines` with the run loads that follow a streamed product's block (only tile resizes
    between) issued before the block and stored after it, at most MOST_HELD values a thread.
    The body has waited for its task's events before the block: a product that reads staged
    weights (and may find them lost) is left as it is."""
    out = list(lines)
    early = 0
    i = 0
    while i < len(out):
        if out[i] != "{" or i + 1 >= len(out) or out[i + 1] != "mk::gpu::StreamLinear sl{};":
            i += 1
            continue
        end = _block_end(out, i)
        if not _PLAIN_PRODUCT.match(out[end - 1]):
            i = end + 1
            continue
        issued: list[str] = []
        for j in range(end + 1, _loads_end(out, end + 1)):
            if (load := _LOAD.match(out[j])) is not None:
                name = f"early{early}"
                early += 1
                issued.append(f"auto {name} = mk::gpu::load_early({_run_load(load)});")
                out[j] = f"mk::gpu::store_loaded({name});  // load"
        out[i:i] = issued
        i = end + 1 + len(issued)
    return out


def _block_end(lines: Sequence[str], start: int) -> int:
    """The index of the line that closes the block opened at `start`."""
    depth = 0
    for j in range(start, len(lines)):
        depth += lines[j].count("{") - lines[j].count("}")
        if depth == 0:
            return j
    raise ValueError("unclosed block")
