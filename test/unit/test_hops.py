"""bench/hops.py: per kind of grid, the time tasks starve, take to start, and run."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from bench_scripts import load, simulated_schedule

import mk

ROOT = Path(__file__).resolve().parents[2]


def _module(name: str = "hops") -> ModuleType:
    """bench/<name>.py, loaded as a module."""
    return load(name)


def test_hop_rows_split_starving_dispatch_and_run() -> None:
    hops = _module()
    us = 1000.0
    # SM 0 runs a (0..10) then b (12..15); SM 1 runs c, which waits for a: ready at 10,
    # starts at 13 after idling from 0.
    start = np.array([1, 12, 13]) * us
    end = np.array([10, 15, 20]) * us
    ready = np.array([np.nan, np.nan, 10 * us])
    rows = hops.hop_rows(["a", "b", "c"], start, end, ready, [[0, 1], [2]])
    got = {kind: (n, starved, dispatch, run) for kind, n, starved, dispatch, run in rows}
    assert got["a"] == (1, 0.0, 0.0, 9.0)
    assert got["b"] == (1, 0.0, 2.0, 3.0)  # 2 µs after its SM was free
    assert got["c"] == (1, 9.0, 3.0, 7.0)  # idle from the launch's start (1) to ready (10)


def test_tail_rows_measure_how_late_a_grids_last_task_ends() -> None:
    """Per kind, the mean and the most over its grids of (last end - mean end); grids of fewer
    tasks than `least`, and tasks that never started, are left out."""
    hops = _module()
    us = 1000.0
    grids = ["k1_l0_m"] * 4 + ["k2_l1_m"] * 4 + ["k3_x"] * 2
    start = np.array([1, 1, 1, 0, 1, 1, 1, 1, 1, 1]) * us
    end = np.array([10, 11, 15, 99, 20, 20, 20, 24, 5, 9]) * us
    rows = hops.tail_rows(grids, start, end, least=3)
    assert [(kind, n) for kind, n, _, _ in rows] == [("m", 2)]
    _, _, mean, most = rows[0]
    assert most == pytest.approx(3.0)  # 15 - 12 (the task with no start left out)
    assert mean == pytest.approx(3.0)  # 24 - 21 as well


def test_phase_rows_measure_a_grid_from_the_last_end_before_it() -> None:
    """Grids of at least `least` tasks in the order their last tasks end: each one's phase runs
    from the previous one's last end (the first from the launch's first start) to its own; per
    kind the mean and the most; a grid too small to count is skipped over."""
    hops = _module()
    us = 1000.0
    grids = ["k1_l0_q"] * 3 + ["k2_x"] * 2 + ["k3_l0_m"] * 3 + ["k4_l1_q"] * 3
    start = np.array([2, 2, 3, 5, 5, 9, 9, 9, 15, 15, 15]) * us
    end = np.array([6, 8, 7, 9, 9, 12, 14, 13, 17, 21, 18]) * us
    rows = {kind: (n, mean, most) for kind, n, mean, most in hops.phase_rows(grids, start, end, 3)}
    assert set(rows) == {"q", "m"}
    assert rows["m"] == (1, pytest.approx(6.0), pytest.approx(6.0))  # 14 - 8
    assert rows["q"][0] == 2
    assert rows["q"][1] == pytest.approx(6.5)  # (8 - 2 + 21 - 14) / 2
    assert rows["q"][2] == pytest.approx(7.0)


def test_program_hops_recover_a_simulated_schedule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks simulated to start 1 µs after their producers and their SM are done (the first ones
    at the launch's start) and to run 2 µs read back (through a Chrome trace) as exactly that."""
    import mk.backends.cuda as backend
    from mk.backends.cuda import build
    from mk.models import decode_program, preset

    hops = _module()
    monkeypatch.setattr(build, "nvcc", lambda: None)
    monkeypatch.setattr(backend, "nvcc", lambda: None)
    text = decode_program(preset("tiny"), 1, 64, 1)
    # Queued tasks only: the simulation below walks the queues (a tail is run by no queue).
    prog = mk.compile(text, target="cuda", num_sms=4, cache_dir=tmp_path, max_tail_tasks=0)
    index = prog.graph.index()  # type: ignore[attr-defined]
    start, end, gap = simulated_schedule(prog)
    n = len(start)
    prog.last_timeline = np.stack([start, end], axis=1)[None].astype(np.int64)  # type: ignore[attr-defined]
    prog.trace(tmp_path / "t.json")  # type: ignore[attr-defined]
    timeline = hops.read_trace(tmp_path / "t.json", n)
    rows = hops.hops_of(hops.Run(prog, timeline))
    assert {kind for kind, *_ in rows} >= {"logits", "tokens"}
    kinds = np.array([hops.kind_of(index.locate(t)[0].sym_name.data) for t in range(n)])
    for kind, count, _, dispatch, run in rows:
        assert count == (kinds == kind).sum()
        assert dispatch == pytest.approx(gap[kinds == kind].mean() / 1000, abs=1e-6), kind
        assert run == pytest.approx(2.0, abs=1e-6), kind
    assert gap.mean() > 500  # most tasks have a producer or a task before them
    # The critical path spans the run: from the launch's start to the last end, 2 µs per task
    # on it and 1 µs before each but the first.
    path = _module("critical_path").path_of(hops.Run(prog, timeline))
    tasks = sum(n for _, n, *_ in path)
    run, hop, queue = (sum(r[i] for r in path) for i in (2, 3, 4))
    assert run == pytest.approx(2.0 * tasks) and hop + queue == pytest.approx(tasks - 1.0)
    assert run + hop + queue == pytest.approx((timeline[:, 1].max() - timeline[:, 0].min()) / 1e3)
    # The grids' phases of a run (every grid counted) tile it from the first start to the last end.
    r = hops.Run(prog, timeline)
    phases = hops.phase_rows(r.grids, r.start, r.end, least=1)
    total = sum(n * mean for _, n, mean, _ in phases)
    assert total == pytest.approx((timeline[:, 1].max() - timeline[:, 0].min()) / 1e3)


def test_critical_path_follows_whichever_ended_last() -> None:
    """a (SM 0, 0-10) feeds b (SM 1, 11-15: a 1 µs hop); c follows b on SM 1 (15.5-20: a 0.5 µs
    queue gap) and also waits for d (SM 0, 10-12), which ended earlier: the path is a, b, c."""
    cp = _module("critical_path")
    us = 1000.0
    start = np.array([0, 11, 15.5, 10]) * us
    end = np.array([10, 15, 20, 12]) * us
    producers = {1: [0], 2: [3]}
    producer = cp.last_producers(
        4,
        end,
        lambda t: [("e", (t,), 0)] if t in producers else [],
        lambda _e, element: producers[element[0]],
    )
    prev = cp.previous_on_sm(4, [[0, 3], [1, 2]])
    steps = cp.walk(start, end, producer, prev)
    assert [(t, round(g / us, 3), p) for t, g, p in steps] == [
        (0, 0.0, False),
        (1, 1.0, True),
        (2, 0.5, False),
    ]
    rows = cp.path_rows(["a", "b", "c", "d"], start, end, steps)
    assert {k: (n, r, h, q) for k, n, r, h, q in rows} == {
        "a": (1, 10.0, 0.0, 0.0),
        "b": (1, 4.0, 1.0, 0.0),
        "c": (1, 4.5, 0.0, 0.5),
    }


def test_wait_summary_names_the_grid_with_the_most_waits(tmp_path: Path) -> None:
    hops = _module()
    prog = mk.compile(ROOT / "examples" / "decoder_block.mlir", target="cpu", cache_dir=tmp_path)
    grids = prog.graph.index().grids
    most = max(len(g.waits) for g in grids)
    line = hops.wait_summary(prog)
    assert line.startswith(f"waits per task: at most {most} (") and "on average" in line
    worst = line.split("(")[1].split(")")[0]
    assert any(g.sym_name.data == worst and len(g.waits) == most for g in grids)


def test_cta_edges_measure_the_launch_around_the_tasks() -> None:
    """Entries at 0 and 1 µs, tasks from 2 µs after each entry, exits 0.5 µs after the last end;
    an idle CTA (no queue) counts for nothing, and a CTA without its stamps makes no summary."""
    hops = _module()
    timeline = np.zeros((1, 3, 2), np.int64)
    timeline[0] = [[2000, 3000], [3000, 4000], [4000, 6000]]  # tasks 0, 1 on CTA 0; 2 on CTA 1
    ctas = np.array([[0, 4500], [1000, 6500], [0, 0]], np.int64)
    timeline += 10**9  # globaltimer ns: never 0, which means "not stamped"
    ctas[:2] += 10**9
    queues = [[0, 1], [2], []]
    assert hops.cta_edges(ctas, timeline, queues) == pytest.approx((1.0, 2.5, 0.5, 2.0))
    ctas[1, 1] = 0
    assert hops.cta_edges(ctas, timeline, queues) is None
