"""The queue entries the CUDA dispatcher reads: one record per queue position, from the tables."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

import mk
from mk.backends.cuda.entries import (
    entry_tasks,
    entry_words,
    head_words,
    launch_heads,
    queue_entries,
    resolve_heads,
)
from mk.runtime_tables import KIND_FIRST_LOWERED, SIGNAL_DESC

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("name", ["decode_loop", "llama3_8b_block"])
def test_every_queue_position_has_its_task(name: str, tmp_path: Path) -> None:
    prog = mk.compile(
        ROOT / "examples" / f"{name}.mlir", target="cuda", cache_dir=tmp_path, max_tail_tasks=64
    )
    src, t = prog.cuda_source, prog.tables  # type: ignore[attr-defined]
    slots = int(re.search(r"kSlots = (\d+);", src).group(1))  # type: ignore[union-attr]
    assert f"QueueEntry<Dispatch::kSlots>) == {4 * entry_words(slots)}," in src
    assert f"LaunchHead<Dispatch::kSlots>) == {4 * head_words(slots)}," in src
    assert f"kBuffers = {len(t.buffers)};" in src  # the kernel copies that many table rows
    entries = prog.queue_entries  # type: ignore[attr-defined]
    ids = entry_tasks(t)
    tails = sorted({int(x) for x in t.signals["tail"] if x >= 0})
    assert tails, "the example has tail tasks"
    assert list(ids) == [*t.queue_tasks, *tails]  # the queues' positions, then the tails
    assert entries.shape == (len(t.queue_tasks) + len(tails), entry_words(slots))
    waits = t.waits.view(np.int32).reshape(-1, 3)
    shared_rows = {}
    for q, task in enumerate(ids):
        row, desc = entries[q], t.tasks[task]
        assert list(row[:16]) == list(t.tasks[task : task + 1].view(np.int32))
        w0, w1 = desc["wait_begin"], desc["wait_end"]
        s0, s1 = desc["signal_begin"], desc["signal_end"]
        near_waits = row[16:40].reshape(8, 3)
        assert (near_waits[: min(8, w1 - w0)] == waits[w0 : min(w1, w0 + 8)]).all()
        assert (near_waits[min(8, w1 - w0) :] == 0).all()
        near = t.signals[s0 : min(s1, s0 + 8)]
        assert list(row[40 : 40 + len(near)]) == list(near["counter"])
        # A signal's tail is the entry of the tail task, with the event's count.
        for i, sig in enumerate(near):
            assert row[48 + i] == (-1 if sig["tail"] < 0 else list(ids).index(sig["tail"]))
            assert row[56 + i] == sig["count"]
        assert (row[48 + len(near) : 56] == -1).all()
        assert row[64] == task
        rows = tuple(row[65 : 65 + slots])
        assert all(0 <= r < len(t.buffers) for r in rows if r >= 0)
        # Every task of a kind reads the same buffers (its grid's slots).
        assert shared_rows.setdefault(desc["kind"], rows) == rows
    assert min(shared_rows) >= KIND_FIRST_LOWERED


def test_entries_of_builtin_kinds_and_long_wait_lists() -> None:
    """A task with more than 8 waits keeps its first 8 in the entry (the rest are read from the
    table); a builtin kind has no slots; a tail task gets an entry after the queues'."""

    class Tables:
        tasks = np.zeros(3, [("w", "<i4", (16,))])
        waits = np.arange(30, dtype=np.int32)
        signals = np.array([(7, 2, 1), (9, -1, 0)], SIGNAL_DESC)
        queue_tasks = np.array([1, 0])

    Tables.tasks["w"][0, [0, 5, 6, 7, 8]] = [KIND_FIRST_LOWERED, 0, 10, 0, 2]
    Tables.tasks["w"][1, [0, 5, 6, 7, 8]] = [2, 0, 0, 2, 2]
    Tables.tasks["w"][2, [0, 5, 6, 7, 8]] = [KIND_FIRST_LOWERED, 0, 0, 2, 2]
    got = queue_entries(Tables, [(4, 5)], 2)
    assert got.shape == (3, entry_words(2)) and entry_words(2) == 68
    assert list(got[1, 16:40]) == list(range(24)) and got[1, 64] == 0
    assert list(got[1, 40:42]) == [7, 9] and list(got[1, 65:67]) == [4, 5]
    assert list(got[1, 48:50]) == [2, -1] and list(got[1, 56:58]) == [1, 0]  # tail: entry 2
    assert (got[0, 16:48] == 0).all() and got[0, 64] == 1 and list(got[0, 65:67]) == [-1, -1]
    assert got[2, 64] == 2 and list(got[2, 65:67]) == [4, 5]


@pytest.mark.usefixtures("no_nvcc")
def test_entries_follow_replaced_tables(tmp_path: Path) -> None:
    """Entries copy the tables' waits and signals, so replacing the tables must rebuild them
    (the GPU watchdog test drops a signal that way)."""
    prog = mk.compile(ROOT / "examples" / "decode_loop.mlir", target="cuda", cache_dir=tmp_path)
    before = prog.queue_entries.copy()  # type: ignore[attr-defined]
    tasks = prog.tables.tasks.copy()
    victim = int(np.flatnonzero(tasks["signal_end"] > tasks["signal_begin"])[0])
    tasks[victim]["signal_end"] = tasks[victim]["signal_begin"]
    prog.tables = dataclasses.replace(prog.tables, tasks=tasks)
    after = prog.queue_entries  # type: ignore[attr-defined]
    changed = np.flatnonzero((before != after).any(axis=1))
    assert list(entry_tasks(prog.tables)[changed]) == [victim]


@pytest.mark.usefixtures("no_nvcc")
def test_buffer_pointers_cover_every_slot(tmp_path: Path) -> None:
    """The launch's buffer table, built on the host from stand-in tensors (runs without a GPU)."""

    class Fake:
        def __init__(self, ptr: int) -> None:
            self.ptr = ptr

        def data_ptr(self) -> int:
            return self.ptr

    class State:
        arena = Fake(1 << 40)

    prog = mk.compile(ROOT / "examples" / "rmsnorm_linear.mlir", target="cuda", cache_dir=tmp_path)
    ins = [Fake(1000 * (i + 1)) for i in range(len(prog.func.args))]
    outs = [Fake(10**6)]
    got = prog._pointers(State(), ins, outs)  # type: ignore[attr-defined]
    assert len(got) == len(prog.tables.buffers)
    assert {1000 * (i + 1) for i in range(len(ins))} | {10**6} <= set(got.tolist())


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("name", ["decode_loop", "gated_mlp"])
def test_each_cta_starts_from_its_head(name: str, tmp_path: Path) -> None:
    """A CTA's launch head: its first queue entry, its queue's bounds, and that entry's buffer
    addresses (from the buffer table, 0 past its slots); an idle CTA's head has no entry."""
    prog = mk.compile(ROOT / "examples" / f"{name}.mlir", target="cuda", cache_dir=tmp_path)
    t, slots = prog.tables, prog._entry_slots  # type: ignore[attr-defined]
    entries = prog.queue_entries  # type: ignore[attr-defined]
    words = entry_words(slots)
    heads = launch_heads(entries, t.queue_offsets, slots)
    assert heads.shape == (len(t.queue_offsets) - 1, head_words(slots))
    table = np.arange(len(t.buffers), dtype=np.uint64) * 4096 + (1 << 44)
    got = resolve_heads(heads, slots, table)
    assert (got[:, : words + 4] == heads[:, : words + 4]).all()  # only the addresses change
    idle = 0
    for sm, (begin, end) in enumerate(zip(t.queue_offsets[:-1], t.queue_offsets[1:], strict=True)):
        assert list(got[sm, words : words + 4]) == [begin, end, 0, 0]
        addresses = got[sm, words + 4 :].view(np.uint64)
        if begin == end:
            idle += 1
            assert (got[sm, :words] == 0).all() and (addresses == 0).all()
            continue
        assert (got[sm, :words] == entries[begin]).all()
        rows = entries[begin, 65 : 65 + slots]
        want = [int(table[r]) if r >= 0 else 0 for r in rows]
        assert list(addresses[:slots]) == want and (addresses[slots:] == 0).all()
        assert any(want), "the first task reads some buffer"
    assert idle < len(heads)
