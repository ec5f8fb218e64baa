"""A run's per-task timeline as a Chrome trace (Perfetto opens it): one row per SM, one box per
task and iteration, shared by the CPU executor's programs and the CUDA megakernel's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from mk.dialects.task import GraphOp
from mk.runtime_tables import Tables


def sm_of_tasks(tables: Tables) -> np.ndarray:
    """The SM whose queue holds each task."""
    sm_of = np.zeros(len(tables.tasks), np.int64)
    for sm in range(tables.num_sms):
        sm_of[tables.queue_tasks[tables.queue_offsets[sm] : tables.queue_offsets[sm + 1]]] = sm
    return sm_of


def write_chrome_trace(
    path: str | os.PathLike[str], graph: GraphOp, tables: Tables, timeline: np.ndarray
) -> None:
    """`timeline` [iterations][tasks] (start, end) in ns on one clock; a task that did not run
    has an end <= 0. Times in the trace start at the first task's start."""
    ran = timeline[..., 1] > 0
    starts = timeline[..., 0][ran]
    origin = int(starts.min()) if starts.size else 0
    sm_of, index = sm_of_tasks(tables), graph.index()
    events = [
        {
            "name": index.describe(task),
            "ph": "X",
            "pid": 0,
            "tid": int(sm_of[task]),
            "ts": (int(start) - origin) / 1000,
            "dur": (int(end) - int(start)) / 1000,
            "args": {"iteration": it},
        }
        for it, row in enumerate(timeline)
        for task, (start, end) in enumerate(row)
        if end > 0
    ]
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
