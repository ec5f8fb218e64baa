"""bench/chunked.py: what chunked waits would save, from a model step's per-task trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bench_scripts import load, simulated_tiny


def test_chunks_are_ready_when_their_last_producer_ends() -> None:
    chunked = load("chunked")
    ends = np.array([5.0, 9.0, 7.0, 20.0, 6.0, 8.0])
    assert chunked.chunk_ready(ends, 3).tolist() == [9.0, 20.0, 8.0]


def test_a_consumer_takes_each_chunk_once_it_is_ready() -> None:
    """A consumer of run 8 (2 a chunk) and dispatch 1 over chunks ready at 10, 30, 12, 14: in
    order it ends 2 after its late chunk and then 2 more for the last (30 + 1 + 2 + 2 + 2 = 37);
    in any order it ends with the late chunk (30 + 1 + 2); whole, at 30 + 1 + 8 = 39."""
    chunked = load("chunked")
    ready = np.array([10.0, 30.0, 12.0, 14.0])
    assert chunked.chunked_end(0.0, ready, 1.0, 8.0, in_order=True) == pytest.approx(37.0)
    assert chunked.chunked_end(0.0, ready, 1.0, 8.0, in_order=False) == pytest.approx(33.0)
    # Its SM busy until 40: nothing to gain, the run follows the SM's previous task.
    assert chunked.chunked_end(40.0, ready, 1.0, 8.0, in_order=False) == pytest.approx(49.0)


def test_each_down_projection_finds_its_gate_up_grid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tiny with its down projections in grids of their own (fuse_accumulate=0), its queues
    walked with 1 µs hops and 2 µs runs: each layer's `y` waits for the whole of its layer's
    `m` and ends 3 µs after it; taking `m` in two chunks cannot make it end later, nor earlier
    than a chunk's hop and half a run after the last chunk."""
    chunked = load("chunked")
    hops = load("hops")
    prog, start, end = simulated_tiny(tmp_path, monkeypatch)
    rows = chunked.boundary_rows(hops.Run(prog, np.stack([start, end], axis=1)), [("m", "y")], 2)
    assert [(grid, producer, n) for grid, producer, n, *_ in rows] == [
        ("k12_l0_y", "k11_l0_m", 4),
        ("k19_l1_y", "k18_l1_m", 4),
    ]
    for *_, after, in_order, any_order in rows:
        assert after == pytest.approx(3.0)
        assert 0.0 <= in_order <= any_order <= 3.0 - 2.0
