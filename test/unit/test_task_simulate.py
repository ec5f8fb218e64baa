"""Tests of the task-graph simulator and the task-simulate pass: clean runs, results against the
reference, and deliberately broken graphs (dropped waits, swapped queues, shrunk footprints,
overlapping arena buffers) that must be caught."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from xdsl.dialects.builtin import DenseArrayBase, IntegerAttr, ModuleOp, i32, i64
from xdsl.passes import PassPipeline

import mk
from mk.diagnostics import MkError, parse_module
from mk.dialects import make_context
from mk.dialects.nn_decode import STEPS
from mk.dialects.task import BufferOp, GraphOp, GridOp
from mk.dialects.task_index import check_queues_deadlock_free
from mk.dialects.task_maps import FootprintAttr
from mk.inputs import random_inputs
from mk.interp.task import Simulator, sequential, simulate
from mk.passes import get_all_passes
from mk.passes.task_simulate import check_graph, random_graph_inputs
from mk.source import entry_function, load_module

ROOT = Path(__file__).resolve().parents[2]
LIT = ROOT / "test" / "lit" / "passes" / "task_simulate.mlir"
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.mlir") if "llama3" not in p.name)
HAVE_LOWERING = importlib.util.find_spec("mk.passes.mugraph_to_task") is not None
needs_lowering = pytest.mark.skipif(not HAVE_LOWERING, reason="mugraph-to-task not available")


def chain_text() -> str:
    """The valid graph of the lit test: the first split chunk, without its CHECK lines."""
    first = LIT.read_text().split("// -----")[0]
    return "\n".join(line for line in first.splitlines() if not line.startswith("//"))


def parse(text: str) -> ModuleOp:
    module = parse_module(make_context(), text, "<test>")
    module.verify()
    return module


def graph_of(module: ModuleOp) -> GraphOp:
    return next(op for op in module.walk() if isinstance(op, GraphOp))


def grid(graph: GraphOp, name: str) -> GridOp:
    return graph.index().grids_by_name[name]


def chain_inputs() -> list[np.ndarray]:
    return [np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)]


def violations(graph: GraphOp, seeds: int = 8, max_delay: int = 8) -> list[str]:
    """The kinds of violation each seed reports ("" for a clean run)."""
    sim = Simulator(graph)
    values = random_graph_inputs(graph)
    ref = sim.reference(values)
    if ref.violation is not None:
        return [ref.violation.kind]
    kinds = []
    for seed in range(seeds):
        result = sim.simulate(values, seed, ref, max_delay)
        kinds.append(result.violation.kind if result.violation else "")
    return kinds


# --------------------------------------------------------------------------- hand-built graph


def test_chain_runs_clean_and_computes_the_kernels() -> None:
    graph = graph_of(parse(chain_text()))
    (x,) = chain_inputs()
    h = np.exp(x)
    want = (h * -h).astype(np.float32)
    ref = sequential(graph, [x])
    assert ref.violation is None
    np.testing.assert_allclose(ref.outputs[0], want, rtol=1e-6)
    orders = set()
    for seed in range(8):
        result = simulate(graph, [x], seed)
        assert result.violation is None, result.violation
        assert result.outputs[0].tobytes() == ref.outputs[0].tobytes()
        orders.add(tuple(result.order))
    assert len(orders) > 2, "the seeds should give different interleavings"


def test_pass_leaves_valid_ir_unchanged() -> None:
    module = parse(chain_text())
    before = str(module)
    PassPipeline.parse_spec(get_all_passes(), "task-simulate{seeds=3}").apply(
        make_context(), module
    )
    assert str(module) == before


def test_dropped_wait_is_a_raw() -> None:
    graph = graph_of(parse(chain_text()))
    b = grid(graph, "b")
    b.waits = type(b.waits)([e for e in b.waits if e.event_name != "h_ready"])
    kinds = violations(graph)
    assert "raw" in kinds
    with pytest.raises(MkError, match="read-after-write: task [45] \\(@b"):
        check_graph(graph, seeds=8, max_delay=8)


def test_dropped_signal_deadlocks() -> None:
    graph = graph_of(parse(chain_text()))
    a = grid(graph, "a")
    a.signals = type(a.signals)([])
    result = simulate(graph, chain_inputs(), 0)
    assert result.violation is not None and result.violation.kind == "deadlock"
    assert "@h_ready[0] (counter 0, needs 2)" in result.violation.message


def test_swapped_queue_entries_deadlock_and_fail_the_static_check() -> None:
    graph = graph_of(parse(chain_text()))
    queue = graph.index().schedule.queues[0]  # type: ignore[union-attr]
    queue.tasks = DenseArrayBase.from_list(i32, [0, 6, 4, 2])
    assert check_queues_deadlock_free(graph) is not None
    for seed in range(3):
        result = simulate(graph, chain_inputs(), seed)
        assert result.violation is not None and result.violation.kind == "deadlock"
        assert "SM 0 at task 6 (@c[0])" in result.violation.message


def test_shrunk_footprint_is_caught() -> None:
    graph = graph_of(parse(chain_text()))
    b = grid(graph, "b")
    fp = b.reads.data[0]
    b.reads = type(b.reads)([FootprintAttr(fp.buffer_name, fp.start_map, [8, 16])])
    ref = sequential(graph, chain_inputs())
    assert ref.violation is not None and ref.violation.kind == "footprint"
    assert ref.violation.buffer == "h"


def test_overlapping_live_activations_clobber() -> None:
    graph = graph_of(parse(chain_text()))
    t = graph.index().buffers["t"]
    t.offset = IntegerAttr(0, i64)
    kinds = violations(graph, seeds=4)
    assert all(k == "war" for k in kinds), kinds


def test_unscheduled_graph_is_an_error() -> None:
    graph = graph_of(parse(chain_text()))
    schedule = graph.index().schedule
    assert schedule is not None
    schedule.detach()
    schedule.erase()
    assert simulate(graph, chain_inputs(), 0).violation.kind == "unscheduled"  # type: ignore[union-attr]
    with pytest.raises(MkError, match="has no task.schedule"):
        check_graph(graph, 1, 4)


# --------------------------------------------------------------------------- real pipeline


def lower(path: Path, num_sms: int = 4, one_step: bool = False) -> tuple[ModuleOp, GraphOp]:
    """The scheduled graph of an example; `one_step` drops a decode loop's `nn.steps`."""
    module = load_module(path)
    if one_step:
        for func in module.ops:
            func.attributes.pop(STEPS, None)
    spec = f"nn-to-mugraph,mugraph-to-task,task-schedule{{num-sms={num_sms}}}"
    PassPipeline.parse_spec(get_all_passes(), spec).apply(make_context(), module)
    return module, graph_of(module)


def tolerance(array: np.ndarray) -> float:
    return 1e-5 if array.dtype == np.float32 else 2e-2


def assert_matches_reference(path: Path, graph: GraphOp, seeds: int = 2) -> None:
    inputs = random_inputs(entry_function(load_module(path)), seed=3)
    want = mk.reference(path, *[x.copy() for x in inputs])  # donated inputs change in place
    ref = sequential(graph, inputs)
    assert ref.violation is None, ref.violation
    for seed in range(seeds):
        result = simulate(graph, inputs, seed, reference=ref)
        assert result.violation is None, result.violation
        for got, exp in zip(result.outputs, want, strict=True):
            if got.dtype.kind in "iu":
                np.testing.assert_array_equal(got, exp)
                continue
            got64, exp64 = got.astype(np.float64), exp.astype(np.float64)
            error = np.linalg.norm(got64 - exp64) / max(np.linalg.norm(exp64), 1e-30)
            assert error <= tolerance(exp), f"{path.name}: relative error {error}"


@needs_lowering
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_pipeline_simulates_to_the_reference(path: Path) -> None:
    _, graph = lower(path)
    check_graph(graph, seeds=2, max_delay=8)
    assert_matches_reference(path, graph)


def _drop_wait(graph: GraphOp, grid_name: str, position: int) -> None:
    g = grid(graph, grid_name)
    g.waits = type(g.waits)([e for i, e in enumerate(g.waits) if i != position])


def unordered_conflicts(graph: GraphOp) -> int:
    """Independent oracle: pairs of tasks touching the same physical bytes (one of them writing)
    that neither events (distance 0) nor queue order put in sequence. One iteration only."""
    assert int(graph.iterations.value.data) == 1
    sim = Simulator(graph)
    index = sim.index
    # Arena buffers at their offsets; every other buffer in its own far-away range.
    offset = {
        n: int(b.offset.value.data) if b.offset is not None else (k + 1) << 40
        for k, (n, b) in enumerate(index.buffers.items())
    }

    def touched(fps: tuple[tuple[str, tuple[slice, ...]], ...]) -> np.ndarray:
        parts = [np.zeros(0, dtype=np.int64)]
        for name, where in fps:
            buf = index.buffers[name]
            size = np.dtype(sim_dtype(buf)).itemsize
            addr = np.arange(buf.nbytes).reshape(*buf.shape, size)[where].ravel()
            parts.append(addr + offset[name])
        return np.unique(np.concatenate(parts))

    access = [(touched(t.reads), touched(t.writes)) for t in sim.tasks]
    after: list[set[int]] = [set() for _ in sim.tasks]
    signallers: dict[int, set[int]] = {}
    for t, info in enumerate(sim.tasks):
        for c in info.signals:
            signallers.setdefault(c, set()).add(t)
    for t, info in enumerate(sim.tasks):
        for c, _, distance in info.waits:
            if distance == 0:
                for p in signallers.get(c, ()):
                    after[p].add(t)
    for _, ids in sim.queues:
        for a, b in zip(ids, ids[1:], strict=False):
            after[a].add(b)
    lost = 0
    for a in range(sim.num_tasks):
        seen, stack = set(), [a]
        while stack:
            for nxt in after[stack.pop()] - seen:
                seen.add(nxt)
                stack.append(nxt)
        for b in range(a + 1, sim.num_tasks):
            (ra, wa), (rb, wb) = access[a], access[b]
            if b not in seen:
                pairs = ((wa, rb), (ra, wb), (wa, wb))
                lost += any(np.intersect1d(x, y, assume_unique=True).size for x, y in pairs)
    return lost


def sim_dtype(buffer: BufferOp) -> np.dtype:
    from mk.inputs import numpy_dtype

    return numpy_dtype(buffer.buffer_type.get_element_type())


@needs_lowering
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_dropped_wait_is_caught_exactly_when_it_was_needed(path: Path) -> None:
    # Vector clocks make detection independent of luck: a dropped wait that leaves two
    # conflicting tasks unordered is reported in every seed, a redundant one in none.
    module, graph = lower(path, num_sms=8, one_step=True)  # the oracle covers one iteration
    assert unordered_conflicts(graph) == 0
    edges = [(g.sym_name.data, i) for g in graph.index().grids for i in range(len(g.waits))]
    needed = 0
    for name, position in edges:
        mutant = graph_of(module.clone())
        _drop_wait(mutant, name, position)
        kinds = violations(mutant, seeds=3)
        if unordered_conflicts(mutant):
            needed += 1
            assert all(k in ("raw", "war", "waw") for k in kinds), (name, position, kinds)
        else:
            assert kinds == ["", "", ""], (name, position, kinds)
    assert needed >= 1 or not edges


@needs_lowering
def test_swapping_a_producer_behind_its_consumer_deadlocks() -> None:
    path = next(p for p in EXAMPLES if p.stem == "decoder_block")
    _, graph = lower(path, num_sms=2)
    index = graph.index()
    assert index.schedule is not None
    sim = Simulator(graph)
    for queue in index.schedule.queues:
        ids = list(queue.task_ids)
        for i, producer in enumerate(ids):
            signals = set(sim.tasks[producer].signals)
            for j in range(i + 1, len(ids)):
                if any(c in signals and d == 0 for c, _, d in sim.tasks[ids[j]].waits):
                    ids[i], ids[j] = ids[j], ids[i]
                    queue.tasks = DenseArrayBase.from_list(i32, ids)
                    assert check_queues_deadlock_free(graph) is not None
                    result = simulate(graph, random_graph_inputs(graph), 0)
                    assert result.violation is not None
                    assert result.violation.kind == "deadlock"
                    return
    pytest.fail("no producer and direct consumer share a queue")


@needs_lowering
def test_overlapping_live_arena_buffers_are_caught() -> None:
    path = next(p for p in EXAMPLES if p.stem == "decoder_block")
    module, graph = lower(path)
    index = graph.index()
    order = {g: i for i, g in enumerate(index.grids)}
    live: dict[str, list[int]] = {}
    for g in index.grids:
        for _, fp in g.footprints:
            live.setdefault(fp.buffer_name, []).append(order[g])
    arena = [b for b in index.buffers.values() if b.offset is not None]
    pairs = [
        (a, b)
        for a in arena
        for b in arena
        if min(live[b.sym_name.data]) > min(live[a.sym_name.data])
        and min(live[b.sym_name.data]) < max(live[a.sym_name.data])
    ]
    assert pairs, "decoder_block should have two activations live at once"
    old, new = pairs[0]
    mutated = module.clone()
    buffers = graph_of(mutated).index().buffers
    target: BufferOp = buffers[new.sym_name.data]
    target.offset = IntegerAttr(int(buffers[old.sym_name.data].offset.value.data), i64)  # type: ignore[union-attr]
    kinds = violations(graph_of(mutated), seeds=6)
    assert any(k in ("war", "raw", "waw") for k in kinds), kinds


@needs_lowering
def test_mk_opt_pipeline_on_an_example() -> None:
    from mk.tools.mk_opt import main

    path = next(p for p in EXAMPLES if p.stem == "rmsnorm_linear")
    spec = "nn-to-mugraph,mugraph-to-task,task-schedule{num-sms=8},task-simulate{seeds=4}"
    main([str(path), "-p", spec, "-o", "/dev/null"])  # exits 1 on any violation
