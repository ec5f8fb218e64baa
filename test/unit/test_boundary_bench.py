"""bench/boundary.py: the tasks between one decode step's lm_head and the next step's first
layer, and their times."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bench_scripts import load

import mk

US = 1000.0  # ns


def _timeline(rows: list[list[tuple[float, float]]]) -> np.ndarray:
    """[steps, tasks, 2] in ns from (start, end) µs per task per step."""
    return np.array(rows, dtype=np.float64) * US


# Two q tasks of the first layer, one lm_head of two tasks, and the boundary's chain.
GRIDS = ["k0_tok", "k1_x", "k2_l0_q", "k2_l0_q", "k3_l0_r", "k4_logits", "k4_logits", "k5_next"]
SMS = [0, 0, 0, 1, 1, 0, 1, 0]


def _step(origin: float, q_late: float) -> list[tuple[float, float]]:
    """One step's times (µs) from `origin`: tok, x, q (the second starting q_late later), r, two
    lm_head tasks, the argmax's reduce."""
    o = origin
    return [
        (o, o + 1),
        (o + 2, o + 3),
        (o + 4, o + 9),
        (o + 4 + q_late, o + 9 + q_late),
        (o + 10, o + 15),
        (o + 16, o + 30),
        (o + 16, o + 31),
        (o + 32, o + 33),
    ]


def test_boundary_from_the_lm_head_to_the_first_layer() -> None:
    boundary = load("boundary")
    # Step 1 starts 2 µs after step 0's argmax; the q tasks start at 8 and 9 µs past the
    # lm_head's end (31): 31 → next 32..33 → tok 35..36 → x 37..38 → q 39 and 40.
    timeline = _timeline([_step(0, 1), _step(35, 1), _step(70, 3)])
    first, last, rows = boundary.boundary_rows(GRIDS, SMS, [timeline])
    assert first == [8.0, 8.0]
    assert last == [9.0, 11.0]
    got = {name: (sm, start, end) for name, sm, start, end in rows}
    assert list(got) == ["next@t-1", "tok", "x"]  # by start
    assert got["next@t-1"] == (0, 1.0, 2.0)
    assert got["tok"] == (0, 4.0, 5.0)
    assert got["x"] == (0, 6.0, 7.0)


def test_boundary_names_the_tasks_of_a_grid_of_many() -> None:
    boundary = load("boundary")
    grids = ["k0_p", "k0_p", "k1_l0_q", "k2_logits"]
    timeline = _timeline(
        [
            [(0, 1), (0, 2), (3, 4), (5, 6)],
            [(7, 8), (7, 9), (10, 11), (12, 13)],
        ]
    )
    _, _, rows = boundary.boundary_rows(grids, [0, 1, 0, 0], [timeline])
    assert [name for name, *_ in rows] == ["p[0]", "p[1]"]


def test_no_boundary_without_an_lm_head_or_with_one_step() -> None:
    boundary = load("boundary")
    one_step = _timeline([_step(0, 1)])
    assert boundary.boundary_rows(GRIDS, SMS, [one_step]) == ([], [], [])
    no_head = ["k0_tok", "k1_x", "k2_l0_q", "k2_l0_q", "k3_l0_r", "k4_y", "k4_y", "k5_next"]
    two = _timeline([_step(0, 1), _step(35, 1)])
    assert boundary.boundary_rows(no_head, SMS, [two]) == ([], [], [])


def test_a_decode_program_has_the_grids_the_boundary_looks_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The names the script keys on (the lm_head's kind, the first layer's q grid) are those
    mk.models' decode programs get, and a schedule-shaped timeline finds a boundary of tasks."""
    import mk.backends.cuda as backend
    from mk.backends.cuda import build
    from mk.models import decode_program, preset

    boundary = load("boundary")
    monkeypatch.setattr(build, "nvcc", lambda: None)
    monkeypatch.setattr(backend, "nvcc", lambda: None)
    prog = mk.compile(
        decode_program(preset("tiny"), 1, 64, 2), target="cuda", num_sms=4, cache_dir=tmp_path
    )
    index, tables = prog.graph.index(), prog.tables  # type: ignore[attr-defined]
    grids = [index.locate(t)[0].sym_name.data for t in range(len(tables.tasks))]
    # Each task in its own µs, in task order (the grids are in program order): step 0 then 1.
    n = len(grids)
    steps = np.stack([np.arange(n), np.arange(n) + 0.5], axis=1)[None] * US
    timeline = np.concatenate([steps, steps + n * US])
    first, _, rows = boundary.boundary_rows(grids, [0] * n, [timeline])
    assert len(first) == 1 and first[0] > 0
    names = [name for name, *_ in rows]
    assert any(name.endswith("@t-1") for name in names)  # the argmax's reduce and the token write
    assert "x" in names  # the next token's embedding, before the first layer


def test_waits_name_producer_kinds_once_and_the_step_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each grid kind's producers, from a decode program's events: the next token's embedding
    (picked from the history and embedded in one gather) waits on the token write of
    the step before and on the position, the position on the step before's cache writes (which
    read the position it overwrites), each kind named once however many layers signal it."""
    from mk.compiler import run_pipeline
    from mk.diagnostics import parse_module
    from mk.dialects import make_context
    from mk.dialects.task import GraphOp
    from mk.models import decode_program, preset
    from mk.source import load_module

    boundary = load("boundary")
    text = run_pipeline(load_module(decode_program(preset("tiny"), 1, 64, 2)), {})["task"]
    module = parse_module(make_context(), text, "t.mlir")
    graph = next(op for op in module.walk() if isinstance(op, GraphOp))
    waits = boundary.waits_by_kind(boundary.program_waits(graph))
    assert sorted(waits["x"].split(", ")) == ["p", "tokens@t-1"]
    assert waits["p"].split(", ") == ["k_cache@t-1", "v_cache@t-1"]
    synthetic = [("k0_a", []), ("k1_l0_b", [("k0_a", 0), ("k0_a", 0), ("k2_l1_c", 1)])]
    assert boundary.waits_by_kind(synthetic) == {"a": "-", "b": "a, c@t-1"}
