"""The queue entries the CUDA dispatcher reads: one record per queue position, built once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mk.runtime_tables import KIND_FIRST_LOWERED

# mk::NearTask in int32 words: the TaskDesc, 8 WaitDescs of 3 words, 8 signal counters, and per
# signal the entry of its tail task (-1 for none) and the tail's event count.
_DESC, _WAITS, _SIGNALS = 16, 8, 8
_SIGNAL_AT = _DESC + 3 * _WAITS
_TAIL_AT = _SIGNAL_AT + _SIGNALS
_COUNT_AT = _TAIL_AT + _SIGNALS
_NEAR = _COUNT_AT + _SIGNALS
_WAIT_BEGIN, _WAIT_END, _SIGNAL_BEGIN, _SIGNAL_END = 5, 6, 7, 8  # TaskDesc words


def entry_words(slots: int) -> int:
    """int32 words of mk::QueueEntry<slots>: NearTask, id, slot rows, padded to 16 bytes."""
    return -(-(_NEAR + 1 + slots) // 4) * 4


def head_words(slots: int) -> int:
    """int32 words of mk::LaunchHead<slots>: a QueueEntry, the queue's bounds (4 words), and
    the entry's buffer addresses (8 bytes each, padded to 16 bytes)."""
    return entry_words(slots) + 4 + -(-slots // 2) * 4


def launch_heads(entries: np.ndarray, queue_offsets: np.ndarray, slots: int) -> np.ndarray:
    """[SMs][head_words(slots)] int32: each CTA's first queue entry and its queue's bounds, the
    addresses left 0 (resolve_heads fills them). A CTA's launch starts from its head alone, so
    its first task waits for one round trip to memory, not three (bounds, entry, buffers)."""
    offsets = np.asarray(queue_offsets, dtype=np.int64)
    sms, words = len(offsets) - 1, entry_words(slots)
    heads = np.zeros((sms, head_words(slots)), np.int32)
    busy = offsets[1:] > offsets[:-1]
    heads[busy, :words] = entries[offsets[:-1][busy]]
    heads[:, words] = offsets[:-1]
    heads[:, words + 1] = offsets[1:]
    return heads


def resolve_heads(heads: np.ndarray, slots: int, pointers: np.ndarray) -> np.ndarray:
    """`heads` with each first entry's buffer addresses: `pointers` (the buffer table) at the
    entry's slot rows, 0 where it has none."""
    words = entry_words(slots)
    slot_rows = heads[:, _NEAR + 1 : _NEAR + 1 + slots].astype(np.int64)
    busy = (heads[:, words + 1] > heads[:, words])[:, None]
    table = np.asarray(pointers, dtype=np.uint64)
    addresses = np.where(busy & (slot_rows >= 0), table[np.maximum(slot_rows, 0)], np.uint64(0))
    out = heads.copy()
    out[:, words + 4 : words + 4 + 2 * slots] = addresses.view(np.int32).reshape(len(heads), -1)
    return out


def entry_tasks(tables: Any) -> np.ndarray:
    """The task of every entry: the concatenated queues' positions, then the tail tasks (in no
    queue; the dispatcher loads a tail's entry when a signal completes its element)."""
    signals = np.ascontiguousarray(tables.signals)
    tails = np.unique(signals["tail"][signals["tail"] >= 0]).astype(np.int64)
    return np.concatenate([np.asarray(tables.queue_tasks, dtype=np.int64), tails])


def queue_entries(tables: Any, slot_rows: Sequence[Sequence[int]], slots: int) -> np.ndarray:
    """[entries][entry_words(slots)] int32 (entry_tasks' order): each task's descriptor, first
    waits and signals (with their tails' entries and counts), id, and the buffer-table rows of
    its body's slots (`slot_rows[kind - KIND_FIRST_LOWERED]`, -1 past the last)."""
    tasks = np.ascontiguousarray(tables.tasks).view(np.int32).reshape(-1, _DESC)
    waits = np.ascontiguousarray(tables.waits).view(np.int32).reshape(-1, 3)
    signals = np.ascontiguousarray(tables.signals)
    ids = entry_tasks(tables)
    entry_of = np.full(len(tasks) + 1, -1, np.int64)  # the last slot: "no tail" (-1) maps to -1
    entry_of[ids[len(tables.queue_tasks) :]] = np.arange(len(tables.queue_tasks), len(ids))
    desc = tasks[ids]
    out = np.zeros((len(ids), entry_words(slots)), np.int32)
    out[:, :_DESC] = desc
    for i in range(_WAITS):
        has = desc[:, _WAIT_BEGIN] + i < desc[:, _WAIT_END]
        at = _DESC + 3 * i
        out[has, at : at + 3] = waits[desc[has, _WAIT_BEGIN] + i]
    out[:, _TAIL_AT : _TAIL_AT + _SIGNALS] = -1
    for i in range(_SIGNALS):
        has = desc[:, _SIGNAL_BEGIN] + i < desc[:, _SIGNAL_END]
        row = signals[desc[has, _SIGNAL_BEGIN] + i]
        out[has, _SIGNAL_AT + i] = row["counter"]
        out[has, _TAIL_AT + i] = entry_of[row["tail"]]
        out[has, _COUNT_AT + i] = row["count"]
    far = signals[_far_signal_rows(tasks)]
    if np.any(far["tail"] >= 0):
        raise ValueError(
            f"signal row of counter {int(far['counter'][far['tail'] >= 0][0])} has a tail but "
            f"is past a task's first {_SIGNALS} signals, which the CUDA dispatcher reads"
        )
    out[:, _NEAR] = ids
    rows = np.full((len(slot_rows) + 1, slots), -1, np.int32)  # the last row: builtin kinds
    for k, kind_rows in enumerate(slot_rows):
        rows[k, : len(kind_rows)] = kind_rows
    kind = desc[:, 0] - KIND_FIRST_LOWERED
    kind = np.where((kind >= 0) & (kind < len(slot_rows)), kind, len(slot_rows))
    out[:, _NEAR + 1 : _NEAR + 1 + slots] = rows[kind]
    return out


def _far_signal_rows(tasks: np.ndarray) -> np.ndarray:
    """Indices of the signal rows past each task's first _SIGNALS."""
    parts = [
        np.arange(b + _SIGNALS, e)
        for b, e in zip(
            tasks[:, _SIGNAL_BEGIN].tolist(), tasks[:, _SIGNAL_END].tolist(), strict=True
        )
        if e - b > _SIGNALS
    ]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
