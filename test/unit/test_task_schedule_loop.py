"""task-schedule{fixed-us}: a decode loop's queues laid out for its steady state."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import mk
from mk.compiler import run_pipeline
from mk.diagnostics import MkError, parse_module
from mk.dialects import make_context
from mk.dialects.task import GraphOp
from mk.models import decode_program, preset
from mk.passes.task_schedule import (
    ListSchedule,
    TaskDag,
    TaskSchedulePass,
    build_dag,
    steady_period,
    target_for,
)
from mk.passes.task_schedule_loop import loop_waits, steady_start
from mk.source import load_module

ROOT = Path(__file__).parents[2]

# ids: start 0, first 1, mid 2-3, last 4; @first waits @last of the iteration before.
STEADY = """
task.graph @steady iterations 4 arena 0 {
  task.event @s [1] count 1
  task.event @e1 [1] count 1
  task.event @e2 [1] count 2
  task.event @e3 [1] count 1
  task.grid @start [1] signals(@s (d0) -> (0)) {
    task.yield
  }
  task.grid @first [1] waits(@s (d0) -> (0), @e3 (d0) -> (0) distance 1) signals(@e1 (d0) -> (0)) {
    task.yield
  }
  task.grid @mid [2] waits(@e1 (d0) -> (0)) signals(@e2 (d0) -> (0)) cost(bytes = 4000, flops = 0) {
    task.yield
  }
  task.grid @last [1] waits(@e2 (d0) -> (0)) signals(@e3 (d0) -> (0)) {
    task.yield
  }
}
"""


def _graph() -> GraphOp:
    module = parse_module(make_context(), STEADY, "steady.mlir")
    return next(op for op in module.walk() if isinstance(op, GraphOp))


def _dag(graph: GraphOp, fixed_us: float = 0.0) -> TaskDag:
    return build_dag(graph.index(), target_for(2, 2.0, 740.0, "test"), fixed_us=fixed_us)


def test_loop_waits_name_the_counter_and_distance() -> None:
    graph = _graph()
    index = graph.index()
    waits = loop_waits(index)
    assert waits[1] == [(index.counter("e3", (0,)), 1)]
    assert all(not w for i, w in enumerate(waits) if i != 1)


def test_steady_period_runs_the_queues_iteration_after_iteration() -> None:
    graph = _graph()
    dag = _dag(graph, fixed_us=1.0)  # start 2, first 2, mid 5, last 2 µs
    loop = loop_waits(graph.index())
    # @start behind @last on SM 0: last -> start -> first -> mid -> last.
    assert steady_period(dag, loop, [[0, 1, 2, 4], [3]]) == pytest.approx(11.0)
    # @start on SM 1 behind @mid[1]: last -> first -> mid -> last.
    assert steady_period(dag, loop, [[1, 2, 4], [0, 3]]) == pytest.approx(9.0)
    # Queues that wait on a task queued later on the same SM never finish.
    assert steady_period(dag, loop, [[4, 0, 1, 2], [3]]) is None


def test_steady_start_is_where_the_iteration_before_leaves_each_sm() -> None:
    graph = _graph()
    dag = _dag(graph, fixed_us=1.0)
    loop = loop_waits(graph.index())
    first = ListSchedule([[0, 1, 2, 4], [3]], 11.0, [0, 1, 2, 3, 4], [2, 4, 9, 9, 11])
    start = steady_start(dag, loop, first)
    assert start.sm_free == [0.0, -2.0]
    assert start.ready[0] == -2.0  # no waits: as soon as an SM is free
    assert start.ready[1] == 0.0  # @last of the iteration before ends at 11 - 11
    assert start.ready[2:] == [-math.inf] * 3  # this iteration's producers say when


def test_the_schedule_keeps_the_faster_layout_only() -> None:
    graph = _graph()
    TaskSchedulePass(num_sms=2, bandwidth_gbs=2.0, fixed_us=1.0).apply(None, graph.parent_op())  # type: ignore[arg-type]
    queues = [q.task_ids for q in graph.index().schedule.queues]  # type: ignore[union-attr]
    assert queues == [(1, 2, 4), (0, 3)]
    # Without a loop-carried wait nothing is laid out again.
    plain = parse_module(
        make_context(), STEADY.replace(", @e3 (d0) -> (0) distance 1", ""), "plain.mlir"
    )
    TaskSchedulePass(num_sms=2, bandwidth_gbs=2.0, fixed_us=1.0).apply(None, plain)  # type: ignore[arg-type]
    (g,) = [op for op in plain.walk() if isinstance(op, GraphOp)]
    assert [q.task_ids for q in g.index().schedule.queues] == [(0, 1, 2, 4), (3,)]  # type: ignore[union-attr]


def test_a_negative_fixed_cost_is_refused() -> None:
    with pytest.raises(MkError, match="fixed-us must be >= 0"):
        TaskSchedulePass(fixed_us=-1.0).apply(None, parse_module(make_context(), STEADY, "s.mlir"))  # type: ignore[arg-type]


def test_a_decode_loop_in_its_steady_layout_runs_on_the_cpu(tmp_path: Path) -> None:
    """The example decode loop, its queues laid out for the steady state (the default fixed
    cost), generates the reference's tokens on the CPU executor, and its position steps leave
    the SM that ends each step."""
    source = ROOT / "examples/decode_loop.mlir"
    prog = mk.compile(source, target="cpu", num_sms=4, cache_dir=tmp_path)
    inputs = mk.inputs.random_inputs(prog.func, seed=1)
    inputs[1][:] = 3  # pos: the 4 steps write slots 4..7 of the 24-slot history
    ref_inputs = [a.copy() for a in inputs]
    outs = prog(*inputs)
    refs = mk.reference(source, *ref_inputs)
    np.testing.assert_array_equal(outs[0], refs[0])  # the token history
    np.testing.assert_array_equal(inputs[0], ref_inputs[0])  # written in place alike
    index = prog.graph.index()  # type: ignore[attr-defined]
    sm_of = {t: q.sm.value.data for q in index.schedule.queues for t in q.task_ids}
    grid_of = {
        index.locate(t)[0].sym_name.data.split("_", 1)[1]: t for t in range(index.total_tasks)
    }
    assert sm_of[grid_of["p"]] != sm_of[grid_of["tokens"]]  # the step's position, the token write


@pytest.mark.parametrize(("options", "apart"), [({}, True), ({"fixed_us": 0.0}, False)])
def test_the_default_moves_the_position_off_the_token_writes_sm(
    options: dict[str, float], apart: bool
) -> None:
    """The tiny preset's decode loop: by default the next step's position runs on another SM
    than the token write that ends each step; on bytes alone both are SM 0's, the position
    behind the write (on the H100 that layout cost qwen3-0.6b 4 % a token)."""
    text = decode_program(preset("tiny").with_(layers=2), 1, 64, 4)
    task = run_pipeline(load_module(text), options)["task"]
    graph = next(
        op for op in parse_module(make_context(), task, "t.mlir").walk() if isinstance(op, GraphOp)
    )
    index = graph.index()
    sm_of = {t: q.sm.value.data for q in index.schedule.queues for t in q.task_ids}
    first = {
        index.locate(t)[0].sym_name.data.split("_", 1)[1]: t
        for t in reversed(range(index.total_tasks))
    }
    assert (sm_of[first["p"]] != sm_of[first["tokens"]]) is apart
