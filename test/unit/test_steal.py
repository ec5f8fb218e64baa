"""bench/steal.py: what work stealing would save, from a model step's per-task trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bench_scripts import load, simulated_tiny


def test_idle_sms_take_the_slow_tasks_last_cells() -> None:
    """Four tasks from 0, three of 10 µs and one of 20, in 10 cells: at 10 the slow one has 5
    cells left (2 µs each); the three idle SMs take cells 9, 8, 7 (1 µs each, ending at 11) and
    then 6 (ending at 12, before its owner, busy with cell 5 until 12, would), so the grid ends
    at 12. With 1.5 µs a claim they take 9, 8, 7 (ending at 12.5) and the owner ends 5 and 6 at
    14. Equal tasks give nothing to take."""
    steal = load("steal")
    runs = np.array([10.0, 10.0, 10.0, 20.0])
    assert steal.stolen_end(np.zeros(4), runs, 10, 0.0) == pytest.approx(12.0)
    assert steal.stolen_end(np.zeros(4), runs, 10, 1.5) == pytest.approx(14.0)
    assert steal.stolen_end(np.zeros(3), np.full(3, 10.0), 10, 0.0) == pytest.approx(10.0)
    # A claim dearer than any cell: nothing is taken, the grid ends with its slowest task.
    assert steal.stolen_end(np.zeros(4), runs, 10, 50.0) == pytest.approx(20.0)


def test_grids_of_a_program_are_estimated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tiny's queues walked with 1 µs hops and 2 µs runs, then one `m` task made 4 µs longer: its
    grid (4 tasks) gains more than before, by less than those 4 µs; the other grids as before."""
    steal, hops = load("steal"), load("hops")
    prog, start, end = simulated_tiny(tmp_path, monkeypatch)

    def savings(slower_ns: float) -> dict[str, tuple[int, float]]:
        run = hops.Run(prog, np.stack([start, end], axis=1))
        run.end[run.grids.index("k11_l0_m")] += slower_ns
        return {grid: (n, saving) for grid, n, _, _, saving in steal.grid_rows(run, 8, 0.0, 4)}

    before, after = savings(0.0), savings(4000.0)
    assert after.keys() == before.keys() and after["k11_l0_m"][0] == 4
    assert 0.0 < after["k11_l0_m"][1] - before["k11_l0_m"][1] < 4.0
    assert all(after[g] == before[g] for g in after if g != "k11_l0_m")
