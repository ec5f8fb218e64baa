"""The queue entries the CUDA dispatcher reads: one record per queue position, built once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mk.runtime_tables import KIND_FIRST_LOWERED

# mk::NearTask in int32 words: the TaskDesc, 8 WaitDescs of 3 words, 8 signal counters.
_DESC, _WAITS, _SIGNALS = 16, 8, 8
_NEAR = _DESC + 3 * _WAITS + _SIGNALS
_WAIT_BEGIN, _WAIT_END, _SIGNAL_BEGIN, _SIGNAL_END = 5, 6, 7, 8  # TaskDesc words


def entry_words(slots: int) -> int:
    """int32 words of mk::QueueEntry<slots>: NearTask, id, slot rows, padded to 16 bytes."""
    return -(-(_NEAR + 1 + slots) // 4) * 4


def queue_entries(tables: Any, slot_rows: Sequence[Sequence[int]], slots: int) -> np.ndarray:
    """[queue positions][entry_words(slots)] int32: for the task at each position of the
    concatenated queues, its descriptor, first waits and signals, id, and the buffer-table rows
    of its body's slots (`slot_rows[kind - KIND_FIRST_LOWERED]`, -1 past the last)."""
    tasks = np.ascontiguousarray(tables.tasks).view(np.int32).reshape(-1, _DESC)
    waits = np.ascontiguousarray(tables.waits).view(np.int32).reshape(-1, 3)
    signals = np.ascontiguousarray(tables.signals).view(np.int32).reshape(-1)
    ids = np.asarray(tables.queue_tasks, dtype=np.int64)
    desc = tasks[ids]
    out = np.zeros((len(ids), entry_words(slots)), np.int32)
    out[:, :_DESC] = desc
    for i in range(_WAITS):
        has = desc[:, _WAIT_BEGIN] + i < desc[:, _WAIT_END]
        at = _DESC + 3 * i
        out[has, at : at + 3] = waits[desc[has, _WAIT_BEGIN] + i]
    for i in range(_SIGNALS):
        has = desc[:, _SIGNAL_BEGIN] + i < desc[:, _SIGNAL_END]
        out[has, _DESC + 3 * _WAITS + i] = signals[desc[has, _SIGNAL_BEGIN] + i]
    out[:, _NEAR] = ids
    rows = np.full((len(slot_rows) + 1, slots), -1, np.int32)  # the last row: builtin kinds
    for k, kind_rows in enumerate(slot_rows):
        rows[k, : len(kind_rows)] = kind_rows
    kind = desc[:, 0] - KIND_FIRST_LOWERED
    kind = np.where((kind >= 0) & (kind < len(slot_rows)), kind, len(slot_rows))
    out[:, _NEAR + 1 : _NEAR + 1 + slots] = rows[kind]
    return out
