"""Op marks: a profile build stamps the time after each statement of every task body.

With MK_CUDA_OP_MARKS=1 in the environment, the emitted source defines MK_OP_MARKS and puts
`MK_MARK(arena);` after each top-level statement of a task body; `mk::gpu::stream_linear` also
marks its start, the end of its first staging, its weights landing and the end of its weight
stream, and `mk::gpu::stream_attention(_mma)` the end of its rows' preparation and of its keys
(the statement's mark then ends its merge). A run with
`prog.record_timeline = True` then fills `prog.last_marks`, and `bench/timeline.py --ops`
prints where each kind of task spends its time, statement by statement. Off by default: the
marks are not even in the source then. MK_CUDA_OP_MARKS=warm also runs each body once untimed
before the timed run (warm()).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import numpy as np

ENV = "MK_CUDA_OP_MARKS"
MARK = "MK_MARK(arena);"
# Marks inside mk::gpu::stream_linear, before the one after its statement.
STREAM_LINEAR_PHASES = (
    "stream_linear: descriptors",
    "stream_linear: stage x",
    "stream_linear: sync, weights landed",
    "stream_linear: weights",
)
# Marks inside mk::gpu::stream_attention and stream_attention_mma (the statement's own mark
# then ends the merge of the warps' states).
ATTENTION_PHASES = ("attention: rows prepared", "attention: keys")
_CALL = re.compile(r"mk::gpu::(\w+)")
_SILENT = re.compile(
    r"^(mk::gpu::Tile<\w+> \w+\((arena|reinterpret_cast<\w+\*>\(tiles \+ \d+\)), \d+\);"
    r"|uint8_t\* const tiles = .*|\(void\).*|const int64_t (bx|last) .*"
    r"|\w+\.resize\(\d+\);|if \(ahead == .*|\w+\.alias\(\w+\);"
    r"|const mk::gpu::ArenaMark .*|arena\.reset\(\w+\);)$"
)
# A tile loop of one iteration: its statements are marked as if at the top level.
_ONE_ITERATION = "for (int64_t it = 0; it < 1; ++it) {"


def enabled() -> bool:
    return os.environ.get(ENV, "0") not in ("", "0")


def warm() -> bool:
    """MK_CUDA_OP_MARKS=warm: a diagnostic profile build that runs every task body twice, the
    first time untimed, so that the marks show the body with its code in the instruction cache
    and what it read in L2. Its outputs are not meant to be used (a body that updates memory in
    place does it twice)."""
    return os.environ.get(ENV, "0") == "warm"


def _label(statement: Sequence[str]) -> str:
    """What a statement does, in a few words: the first library call in it."""
    text = " ".join(statement)
    if statement[0].startswith("{  // "):  # an element loop the emitter named
        return statement[0][6:].strip()
    if "mk::gpu::stream_attention" in text:
        return "attention: merge"
    if "block_attention<" in text:
        return "block_attention"
    if "stream_linear<" in text:
        return "stream_linear: sum_sq, sync"
    if "MK_FOR_EACH" in text:  # an element loop: its note (load, store, init, mul, ...)
        note = re.search(r"// (\w+)", text)
        return note.group(1) if note else "thread_map"
    if text.startswith("for (int64_t it"):
        return "tile loop"
    if ".assign(" in text:
        return "init accumulator"
    call = _CALL.search(text)
    return call.group(1) if call else text[:40]


def mark_statements(body: Sequence[str]) -> tuple[list[str], list[str]]:
    """The body with a mark after each top-level statement (not declarations), and the label
    of every mark in the order a run stamps them."""
    out: list[str] = []
    labels: list[str] = []
    depth = top = 0
    statement: list[str] = []
    for line in body:
        out.append(line)
        if depth == top and line.strip() == _ONE_ITERATION:
            depth = top = top + 1
            continue
        statement.append(line)
        depth += line.count("{") - line.count("}")
        if depth < top:  # the one-iteration loop closed
            top, statement = depth, []
            continue
        # A statement may end in a note ("...;  // the product"): it ends where its code does.
        if depth != top or not line.split("//", 1)[0].rstrip().endswith((";", "}")):
            continue
        if len(statement) == 1 and _SILENT.match(line.strip()):
            statement = []
            continue
        label = _label(statement)
        if label.startswith("stream_linear"):
            labels += STREAM_LINEAR_PHASES
        elif label == "attention: merge":
            labels += ATTENTION_PHASES
        labels.append(label)
        out.append(MARK)
        statement = []
    return out, labels


def op_segments(
    timeline: np.ndarray, marks: np.ndarray, labels: Sequence[tuple[str, ...]], kinds: Sequence[str]
) -> dict[str, list[tuple[str, float]]]:
    """Per kind of grid, each op mark's label and the mean µs from the previous mark (or the
    task's start) to it, then "signal" up to the task's end; tasks not fully stamped are skipped.
    timeline: [tasks, 2] ns, marks: [tasks, K] ns (0 = not stamped), labels/kinds per task."""
    sums: dict[tuple[str, tuple[str, ...]], np.ndarray] = {}
    counts: dict[tuple[str, tuple[str, ...]], int] = {}
    for task, (start, end) in enumerate(timeline):
        names = tuple(labels[task])
        stamps = np.array([start, *marks[task, : len(names)], end], dtype=np.int64)
        if not names or len(stamps) != len(names) + 2 or (stamps <= 0).any():
            continue
        key = (kinds[task], names)
        sums[key] = sums.get(key, 0) + np.diff(stamps) / 1e3
        counts[key] = counts.get(key, 0) + 1
    out: dict[str, list[tuple[str, float]]] = {}
    for (kind, names), total in sums.items():
        name = kind if kind not in out else f"{kind} ({len(names)} marks)"
        mean = total / counts[(kind, names)]
        out[name] = list(zip((*names, "signal"), (float(v) for v in mean), strict=True))
    return out
