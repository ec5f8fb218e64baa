"""task-schedule and task-stats: valid, deadlock-free, dependence-ordered, balanced and fast."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xdsl.dialects.builtin import DictionaryAttr, FloatAttr, IntegerAttr, ModuleOp
from xdsl.passes import PassPipeline

from mk.diagnostics import MkError, parse_module
from mk.dialects import make_context
from mk.dialects.task import EventOp, GraphOp, GridOp
from mk.dialects.task_grid import make_grid_body
from mk.dialects.task_index import check_queues_deadlock_free
from mk.dialects.task_maps import EdgeAttr
from mk.passes import get_all_passes
from mk.passes.task_schedule import (
    TaskSchedulePass,
    build_dag,
    list_schedule,
    queue_makespan,
    schedule_graph,
    target_for,
)
from mk.passes.task_stats import STATS_ATTR, TaskStatsPass

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.mlir"))
HAS_LOWERING = "mugraph-to-task" in get_all_passes()

# ------------------------------------------------------------------------------------------------
# Random DAG-shaped task graphs, built with the Python API
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GridSpec:
    shape: tuple[int, ...]
    cost: dict[str, int] | None


@dataclass(frozen=True)
class EventSpec:
    """An event with `elements` elements; producers and consumers are grid indices."""

    elements: int
    producers: tuple[int, ...]
    consumers: tuple[tuple[int, int, int, int], ...]  # (grid, stride, offset, distance)


def _linear(shape: Sequence[int]) -> tuple[str, str]:
    """The map domain of a grid and its row-major linear index as an affine expression."""
    dims = [f"d{i}" for i in range(len(shape))]
    expr = dims[0]
    for dim, extent in zip(dims[1:], shape[1:], strict=True):
        expr = f"({expr}) * {extent} + {dim}"
    return f"({', '.join(dims)})", expr


def _signal_map(shape: Sequence[int], elements: int) -> str:
    domain, index = _linear(shape)
    return f"{domain} -> (({index}) mod {elements})"


def _wait_map(shape: Sequence[int], elements: int, stride: int, offset: int) -> str:
    domain, index = _linear(shape)
    return f"{domain} -> ((({index}) * {stride} + {offset}) mod {elements})"


def build_graph(grids: Sequence[GridSpec], events: Sequence[EventSpec]) -> ModuleOp:
    """A task graph without buffers: the events alone order the tasks."""
    graph = GraphOp("g", 2, 0)
    waits: list[list[EdgeAttr]] = [[] for _ in grids]
    signals: list[list[EdgeAttr]] = [[] for _ in grids]
    for number, event in enumerate(events):
        name = f"e{number}"
        count = sum(math.prod(grids[p].shape) // event.elements for p in event.producers)
        graph.body.block.add_op(EventOp(name, [event.elements], count))
        for p in event.producers:
            signals[p].append(EdgeAttr(name, _signal_map(grids[p].shape, event.elements)))
        for grid, stride, offset, distance in event.consumers:
            wait_map = _wait_map(grids[grid].shape, event.elements, stride, offset)
            waits[grid].append(EdgeAttr(name, wait_map, distance))
    for number, spec in enumerate(grids):
        body = make_grid_body([], [])
        grid = GridOp(
            f"k{number}",
            spec.shape,
            body,
            waits=waits[number],
            signals=signals[number],
            cost=spec.cost,
        )
        graph.body.block.add_op(grid)
    module = ModuleOp([graph])
    module.verify()
    return module


@st.composite
def task_graphs(draw: st.DrawFn) -> ModuleOp:
    num_grids = draw(st.integers(1, 6))
    shapes = st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple)
    costs = st.none() | st.fixed_dictionaries(
        {"bytes": st.integers(0, 4_000_000)}, optional={"flops": st.integers(0, 10**9)}
    )
    grids = [GridSpec(draw(shapes), draw(costs)) for _ in range(num_grids)]
    sizes = [math.prod(g.shape) for g in grids]
    events: list[EventSpec] = []
    for consumer in range(1, num_grids):
        for producer in draw(st.sets(st.integers(0, consumer - 1), max_size=2)):
            partner = draw(st.sampled_from([None, *range(consumer)]))
            producers = tuple(sorted({producer} | ({partner} if partner is not None else set())))
            common = math.gcd(*(sizes[p] for p in producers))
            elements = draw(st.sampled_from([d for d in range(1, common + 1) if common % d == 0]))
            stride, offset = draw(st.integers(0, 3)), draw(st.integers(0, 3))
            events.append(EventSpec(elements, producers, ((consumer, stride, offset, 0),)))
    if num_grids > 1 and draw(
        st.booleans()
    ):  # a loop-carried wait from an early grid on a late one
        late = draw(st.integers(1, num_grids - 1))
        events.append(EventSpec(1, (late,), ((draw(st.integers(0, late - 1)), 1, 0, 1),)))
    return build_graph(grids, events)


def _graph(module: ModuleOp) -> GraphOp:
    return next(op for op in module.walk() if isinstance(op, GraphOp))


def _queues(graph: GraphOp) -> dict[int, tuple[int, ...]]:
    schedule = graph.index().schedule
    assert schedule is not None
    return {int(q.sm.value.data): q.task_ids for q in schedule.queues}


def _same_iteration_deps(graph: GraphOp) -> set[tuple[int, int]]:
    """(producer, consumer) task pairs, from GraphIndex's per-element queries."""
    index = graph.index()
    deps: set[tuple[int, int]] = set()
    for task in range(index.total_tasks):
        for event, element, distance in index.waits_of(task):
            if distance == 0:
                deps.update((p, task) for p in index.producers_of(event, element))
    return deps


def _asap_times(graph: GraphOp, costs: Sequence[float]) -> tuple[list[float], list[float]] | None:
    """(start, finish) times when each SM runs its queue in order, every task as early as
    possible; None if the queues get stuck. Written apart from the pass, from GraphIndex."""
    preds: dict[int, list[int]] = {}
    for p, c in _same_iteration_deps(graph):
        preds.setdefault(c, []).append(p)
    queues = list(_queues(graph).values())
    starts: dict[int, float] = {}
    finish: dict[int, float] = {}
    heads, sm_time = [0] * len(queues), [0.0] * len(queues)
    progress = True
    while progress:
        progress = False
        for sm, queue in enumerate(queues):
            while heads[sm] < len(queue) and all(
                p in finish for p in preds.get(queue[heads[sm]], [])
            ):
                task = queue[heads[sm]]
                starts[task] = max([sm_time[sm], *(finish[p] for p in preds.get(task, []))])
                finish[task] = sm_time[sm] = starts[task] + costs[task]
                heads[sm] += 1
                progress = True
    if len(finish) < sum(map(len, queues)):
        return None
    return [starts[t] for t in sorted(starts)], [finish[t] for t in sorted(finish)]


def _run(module: ModuleOp, pipeline: str) -> None:
    PassPipeline.parse_spec(get_all_passes(), pipeline).apply(make_context(), module)


# ------------------------------------------------------------------------------------------------
# Properties of the schedule on random graphs
# ------------------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(module=task_graphs(), num_sms=st.integers(1, 5))
def test_random_graphs_schedule_validly(module: ModuleOp, num_sms: int) -> None:
    graph = _graph(module)
    target = target_for(num_sms, 4100.0, 740.0, "test")
    result = schedule_graph(graph, num_sms, target)
    module.verify()
    assert check_queues_deadlock_free(graph) is None
    queues = _queues(graph)
    assert all(0 <= sm < num_sms and ids for sm, ids in queues.items())
    flat = [t for ids in queues.values() for t in ids]
    assert sorted(flat) == list(range(graph.index().total_tasks))  # every task exactly once
    # dependence order: on one SM the producer comes first; across SMs the ASAP times (which
    # are the list schedule's own times) never start a consumer before its producer ends
    position = {t: (sm, i) for sm, ids in queues.items() for i, t in enumerate(ids)}
    deps = _same_iteration_deps(graph)
    for p, c in deps:
        if position[p][0] == position[c][0]:
            assert position[p][1] < position[c][1]
    dag = build_dag(graph.index(), target)
    times = _asap_times(graph, dag.cost_us)
    assert times is not None
    starts, finish = times
    for p, c in deps:
        assert starts[c] >= finish[p]
    assert max(finish, default=0.0) == pytest.approx(result.makespan_us)
    assert queue_makespan(dag, list(queues.values())) == pytest.approx(result.makespan_us)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(module=task_graphs(), num_sms=st.integers(1, 6))
def test_makespan_within_graham_bound(module: ModuleOp, num_sms: int) -> None:
    """A greedy list schedule ends by total work / SMs + critical path (Graham's bound)."""
    graph = _graph(module)
    _run(module, f"task-stats{{num-sms={num_sms}}}")
    stats = graph.attributes[STATS_ATTR]
    assert isinstance(stats, DictionaryAttr)
    est, path = _float(stats, "est_us"), _float(stats, "critical_path_us")
    dag = build_dag(graph.index(), target_for(num_sms, 4100.0, 740.0, "test"))
    slack = 1e-3 + 1e-5 * est  # the printed numbers are rounded
    assert path - slack <= est <= sum(dag.cost_us) / num_sms + path + slack
    assert est + slack >= sum(dag.cost_us) / num_sms


def _float(attr: DictionaryAttr, key: str) -> float:
    value = attr.data[key]
    assert isinstance(value, FloatAttr)
    return float(value.value.data)


def _int(attr: DictionaryAttr, key: str) -> int:
    value = attr.data[key]
    assert isinstance(value, IntegerAttr)
    return int(value.value.data)


@given(module=task_graphs())
@settings(max_examples=20, deadline=None)
def test_schedule_is_deterministic_and_idempotent(module: ModuleOp) -> None:
    _run(module, "task-schedule{num-sms=3}")
    first = str(module)
    _run(module, "task-schedule{num-sms=3}")  # replaces its own schedule by the same one
    assert str(module) == first
    assert str(module).count("task.schedule") == 1


# ------------------------------------------------------------------------------------------------
# Known schedules
# ------------------------------------------------------------------------------------------------


def _chain_with_free_tasks() -> ModuleOp:
    """Three independent tasks (ids 0-2), then a chain of three (ids 3-5)."""
    events = [EventSpec(1, (1,), ((2, 0, 0, 0),)), EventSpec(1, (2,), ((3, 0, 0, 0),))]
    return build_graph([GridSpec((3,), None)] + [GridSpec((1,), None)] * 3, events)


def test_critical_path_goes_first() -> None:
    module = _chain_with_free_tasks()
    _run(module, "task-schedule{num-sms=2}")
    assert _queues(_graph(module)) == {0: (3, 4, 2), 1: (0, 1, 5)}


def test_one_sm_runs_a_topological_order() -> None:
    module = _chain_with_free_tasks()
    _run(module, "task-schedule{num-sms=1},task-stats")
    graph = _graph(module)
    assert _queues(graph) == {0: (3, 4, 0, 1, 2, 5)}
    stats = graph.attributes[STATS_ATTR]
    assert isinstance(stats, DictionaryAttr)
    assert _float(stats, "est_us") == 6.0  # six 1 µs tasks in a row
    assert _float(stats, "critical_path_us") == 3.0


def test_stats_count_waits_and_elements() -> None:
    # k0 [2, 3] signals e0 (3 elements, count 2), which k1 [4] waits on; k1 signals e1 (2
    # elements) and e2 (1 element), and k2 [2] waits on e1 and, loop-carried, on e2:
    # 4 + 2 * 2 = 8 waits over 12 tasks
    grids = [GridSpec((2, 3), None), GridSpec((4,), None), GridSpec((2,), None)]
    events = [
        EventSpec(3, (0,), ((1, 1, 0, 0),)),
        EventSpec(2, (1,), ((2, 1, 0, 0),)),
        EventSpec(1, (1,), ((2, 1, 0, 1),)),
    ]
    module = build_graph(grids, events)
    _run(module, "task-stats{num-sms=2}")
    stats = _graph(module).attributes[STATS_ATTR]
    assert isinstance(stats, DictionaryAttr)
    expected = {"tasks": 12, "grids": 3, "events": 3, "event_elements": 6, "waits": 8,
                "max_waits_per_task": 2, "coarse_events": 0, "stacked_queues": 0,
                "flagged_waits": 0}  # fmt: skip
    assert {k: _int(stats, k) for k in expected} == expected
    assert _float(stats, "mean_waits_per_task") == pytest.approx(8 / 12, abs=1e-3)
    assert _float(stats, "critical_path_us") == 3.0
    assert _float(stats, "est_us") == 6.0  # 3 + 2 + 1 rounds on 2 SMs
    assert list(stats.data) == [
        "tasks", "grids", "events", "event_elements", "waits", "max_waits_per_task",
        "mean_waits_per_task", "critical_path_us", "est_us", "coarse_events", "stacked_queues",
        "flagged_waits",
    ]  # fmt: skip


@pytest.mark.parametrize("name", ["task-schedule", "task-stats"])
def test_cycle_is_a_located_error(name: str) -> None:
    text = """task.graph @g iterations 1 arena 0 {
  task.event @a [1] count 1
  task.event @b [1] count 1
  task.grid @x [1] waits(@b (d0) -> (0)) signals(@a (d0) -> (0)) {
    task.yield
  }
  task.grid @y [1] waits(@a (d0) -> (0)) signals(@b (d0) -> (0)) {
    task.yield
  }
}"""
    module = parse_module(make_context(), text, "cycle.mlir")
    with pytest.raises(MkError, match=rf"cycle\.mlir:1:1: error: {name}: .* form a cycle"):
        _run(module, name)


@pytest.mark.parametrize("options", ["num-sms=0", "bandwidth-gbs=0.0", "peak-tflops=-1.0"])
@pytest.mark.parametrize("name", ["task-schedule", "task-stats"])
def test_bad_options(name: str, options: str) -> None:
    with pytest.raises(MkError, match=name):
        _run(_chain_with_free_tasks(), f"{name}{{{options}}}")


def test_registered() -> None:
    passes = get_all_passes()
    assert passes["task-schedule"]() is TaskSchedulePass
    assert passes["task-stats"]() is TaskStatsPass


# ------------------------------------------------------------------------------------------------
# Size: a decoder-block-shaped graph of ~1000 tasks on 132 SMs
# ------------------------------------------------------------------------------------------------

# (name, tasks, bytes per task): the grids of a Llama-3-8B decode step after fusion
_LLAMA_GRIDS = [
    ("qkv", 96, 1_048_576), ("rope", 40, 16_384), ("attn", 64, 65_536),
    ("attn_merge", 32, 8_192), ("o_proj", 64, 524_288), ("gate_up", 448, 262_144),
    ("down", 224, 262_144), ("residual", 32, 4_096),
]  # fmt: skip


def _llama_shaped() -> ModuleOp:
    """Each grid waits on 4-way coarse events of the previous one, the first grid on nothing."""
    grids = [GridSpec((n,), {"bytes": b, "flops": b}) for _, n, b in _LLAMA_GRIDS]
    events = [EventSpec(4, (i,), ((i + 1, 1, 0, 0),)) for i in range(len(grids) - 1)]
    events.append(EventSpec(2, (len(grids) - 1,), ((0, 1, 0, 1),)))
    return build_graph(grids, events)


def test_llama_shaped_graph_schedules_fast() -> None:
    module = _llama_shaped()
    graph = _graph(module)
    start = time.perf_counter()
    _run(module, "task-schedule{num-sms=132},task-stats")
    elapsed = time.perf_counter() - start
    assert graph.index().total_tasks == 1000
    assert check_queues_deadlock_free(graph) is None
    assert len(_queues(graph)) == 132
    assert elapsed < 2.0, f"scheduling 1000 tasks took {elapsed:.2f} s"


def test_list_schedule_uses_every_sm_when_work_allows() -> None:
    module = _llama_shaped()
    graph = _graph(module)
    dag = build_dag(graph.index(), target_for(132, 4100.0, 740.0, "test"))
    result = list_schedule(dag, [0.0] * dag.num_tasks, 132)
    assert result is not None
    assert all(result.queues)  # 1000 tasks in waves of >= 32: no SM left without work


# ------------------------------------------------------------------------------------------------
# The real pipeline, once mugraph-to-task exists
# ------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_LOWERING, reason="mugraph-to-task has not landed")
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_schedule(path: Path) -> None:
    module = parse_module(make_context(), path.read_text(), str(path))
    start = time.perf_counter()
    _run(module, "nn-to-mugraph,mugraph-to-task")
    lowered = time.perf_counter()
    _run(module, "task-schedule{num-sms=132},task-stats")
    scheduled = time.perf_counter()
    module.verify()
    for graph in (op for op in module.walk() if isinstance(op, GraphOp)):
        assert check_queues_deadlock_free(graph) is None
        queues = _queues(graph)
        flat = sorted(t for ids in queues.values() for t in ids)
        assert flat == list(range(graph.index().total_tasks))
        dag = build_dag(graph.index(), target_for(132, 4100.0, 740.0, "test"))
        times = _asap_times(graph, dag.cost_us)
        assert times is not None
        starts, finish = times
        assert all(starts[c] >= finish[p] for p, c in _same_iteration_deps(graph))
    assert len(str(module).splitlines()) < 2000
    assert scheduled - lowered < 2.0, f"{path.stem}: scheduling took {scheduled - lowered:.2f} s"
    assert lowered - start < 30.0
