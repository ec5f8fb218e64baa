"""The orderings a task graph must guarantee: for each task, the earlier tasks it conflicts with.

Computed once from the footprints on *physical* bytes (arena buffers at their offsets), over the
sequential order of all iterations: a task must start after the last writer of every byte it
reads (RAW) or writes (WAW), and after every task that read a byte it writes since that byte was
last written (WAR). Older conflicts follow by transitivity. The simulator checks each pair with
vector clocks, so a missing event is caught even when the race happens to go the right way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# (earlier stamp, "raw" | "waw" | "war", buffer of the later task's footprint)
Conflict = tuple[int, str, str]
_PRIORITY = {"raw": 0, "waw": 1, "war": 2}


def footprint_bytes(
    offset: int, stamp_shape: Sequence[int], where: tuple[slice, ...]
) -> np.ndarray:
    """Byte addresses of one footprint of a buffer at `offset` (stamp_shape = (*shape, itemsize))."""
    count = int(np.prod(stamp_shape))
    return offset + np.arange(count, dtype=np.int64).reshape(tuple(stamp_shape))[where].ravel()


def conflicts(
    accesses: Sequence[tuple[list[tuple[str, np.ndarray]], list[tuple[str, np.ndarray]]]],
    iterations: int,
) -> list[list[Conflict]]:
    """For each stamp (iteration * tasks + task), the earlier stamps it must be ordered after.

    `accesses[task]` = (reads, writes), each a list of (buffer name, byte addresses).
    """
    tasks = len(accesses)
    universe = np.unique(np.concatenate([b for _, ws in accesses for _, b in ws] or [[]]))
    universe = universe.astype(np.int64)

    def compact(addresses: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(universe, addresses)
        pos = np.minimum(pos, max(len(universe) - 1, 0))
        hit = universe[pos] == addresses if len(universe) else np.zeros(0, dtype=bool)
        return np.unique(pos[hit])

    local = [
        ([(n, compact(b)) for n, b in reads], [(n, compact(b)) for n, b in writes])
        for reads, writes in accesses
    ]
    last_writer = np.full(len(universe), -1, dtype=np.int64)
    readers: list[tuple[int, np.ndarray]] = []
    result: list[list[Conflict]] = []
    for stamp in range(tasks * iterations):
        reads, writes = local[stamp % tasks]
        found: dict[int, Conflict] = {}

        def add(other: int, kind: str, name: str, found: dict[int, Conflict] = found) -> None:
            old = found.get(other)
            if other >= 0 and (old is None or _PRIORITY[kind] < _PRIORITY[old[1]]):
                found[other] = (other, kind, name)

        for name, idx in reads:
            for other in np.unique(last_writer[idx]):
                add(int(other), "raw", name)
        for name, idx in writes:
            for other in np.unique(last_writer[idx]):
                add(int(other), "waw", name)
            for reader, ridx in readers:
                common = np.intersect1d(ridx, idx, assume_unique=True)
                if common.size and (last_writer[common] < reader).any():
                    add(reader, "war", name)
        result.append(sorted(found.values()))
        everything = np.concatenate([idx for _, idx in reads] or [np.zeros(0, np.int64)])
        if everything.size:
            readers.append((stamp, np.unique(everything)))
        for _, idx in writes:
            last_writer[idx] = stamp
        # A reader whose bytes have all been rewritten can no longer conflict with anything.
        readers = [(r, ridx) for r, ridx in readers if (last_writer[ridx] < r).any()]
    return result
