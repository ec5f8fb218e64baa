"""mugraph-to-task: footprints match the kernels' slices, events cover every dependence, scale."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from nn_programs import OPTIONS, programs  # the random nn programs of the previous pass
from xdsl.dialects.builtin import ModuleOp

from mk.diagnostics import MkError
from mk.dialects import make_context
from mk.dialects.mugraph import GraphDefOp
from mk.dialects.task import BufferOp, EventOp, GraphOp, GridOp
from mk.dialects.task_maps import edge_elements, grid_points, linearize
from mk.passes.mugraph_to_task import MugraphToTaskPass
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.source import load_module

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL_EXAMPLES = sorted(p.name for p in EXAMPLES.glob("*.mlir") if p.name != "llama3_8b_block.mlir")
LLAMA = EXAMPLES / "llama3_8b_block.mlir"

CHAIN = """
func.func @chain(%x: tensor<8x256xf32>) -> (tensor<8x256xf32>, tensor<8x256xf32>) {
  %a = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%x) : (tensor<8x256xf32>) -> tensor<8x256xf32> {
  ^bb0(%x_a: tensor<8x256xf32>, %a_r: tensor<8x256xf32>):
    %t = mugraph.input %x_a imap [1, -1, -1] fmap -1 : tensor<8x256xf32> -> tensor<8x64xf32>
    %e = mugraph.unary "exp" %t : tensor<8x64xf32> -> tensor<8x64xf32>
    mugraph.output %e to %a_r omap [1, -1, -1] : tensor<8x64xf32> -> tensor<8x256xf32>
  }
  %b = mugraph.graph_def grid [4, 1, 1] threads 128 forloop 1 (%a) : (tensor<8x256xf32>) -> tensor<8x256xf32> {
  ^bb0(%a_a: tensor<8x256xf32>, %b_r: tensor<8x256xf32>):
    %t = mugraph.input %a_a imap [1, -1, -1] fmap -1 : tensor<8x256xf32> -> tensor<8x64xf32>
    %e = mugraph.unary "neg" %t : tensor<8x64xf32> -> tensor<8x64xf32>
    mugraph.output %e to %b_r omap [1, -1, -1] : tensor<8x64xf32> -> tensor<8x256xf32>
  }
  %s = mugraph.kernel "softmax" (%b) {dim = -1 : i64} : (tensor<8x256xf32>) -> tensor<8x256xf32>
  func.return %s, %x : tensor<8x256xf32>, tensor<8x256xf32>
}
"""


def lower(module: ModuleOp, nn: bool = True, **options: int | bool) -> GraphOp:
    ctx = make_context()
    if nn:
        NnToMugraphPass().apply(ctx, module)
    MugraphToTaskPass(**options).apply(ctx, module)  # pyright: ignore[reportArgumentType]
    module.verify()
    graphs = [op for op in module.ops if isinstance(op, GraphOp)]
    assert len(graphs) == 1
    return graphs[0]


def example(name: str, iterations: int = 1, merge_events: bool = True) -> GraphOp:
    module = load_module(EXAMPLES / name)
    return lower(module, iterations=iterations, merge_events=merge_events)


# --------------------------------------------------------------------------- brute force


def _closure(graph: GraphOp) -> tuple[list[int], list[int], list[GridOp]]:
    """Per global task: bitsets of the tasks it waits for (transitively), this and the previous
    iteration, computed from the events alone; and each task's grid."""
    index = graph.index()
    signallers: dict[tuple[str, int], int] = {}  # (event, flat element) -> bitset of tasks
    for name, edges in index.producers.items():
        shape = index.events[name].shape_tuple
        for grid, edge in edges:
            elements = edge_elements(grid, edge)
            assert elements is not None
            for offset, element in enumerate(linearize(elements, shape)):
                key = (name, int(element))
                signallers[key] = signallers.get(key, 0) | 1 << (index.base_of(grid) + offset)
    same = [0] * index.total_tasks
    prev = [0] * index.total_tasks
    grid_of = [grid for grid in index.grids for _ in range(grid.num_tasks)]
    waits: list[list[tuple[int, int]]] = [[] for _ in range(index.total_tasks)]
    for grid in index.grids:
        for edge in grid.waits:
            shape = index.events[edge.event_name].shape_tuple
            elements = edge_elements(grid, edge)
            assert elements is not None
            for offset, element in enumerate(linearize(elements, shape)):
                preds = signallers[(edge.event_name, int(element))]
                waits[index.base_of(grid) + offset] += [
                    (p, edge.distance_value) for p in _bits(preds)
                ]
    # Same-iteration waits point to earlier grids, so task order is a topological order; the
    # previous iteration's closure needs every task's same-iteration closure first.
    for task, preds in enumerate(waits):
        for p, distance in preds:
            if distance == 0:
                same[task] |= 1 << p | same[p]
    for task, preds in enumerate(waits):
        for p, distance in preds:
            prev[task] |= prev[p] if distance == 0 else 1 << p | same[p]
    return same, prev, grid_of


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _summed_buffers(grid: GridOp) -> set[str]:
    """The buffers the grid's tasks add into (accumulating outputs): any order is right."""
    kernel = grid.body.block.first_op
    if not isinstance(kernel, GraphDefOp):
        return set()
    writes = [fp.buffer_name for role, fp in grid.footprints if role == "writes"]
    outs = kernel.output_ops()
    return {writes[out.result_index()] for out in outs if out.accumulated() is not None}


Access = tuple[str, np.ndarray, bool, bool]


def _byte_masks(graph: GraphOp) -> list[list[Access]]:
    """Per global task: (address space, byte mask, writes?, summed?) of every footprint."""
    index = graph.index()
    arena = int(graph.arena.value.data)
    result: list[list[Access]] = []
    for grid in index.grids:
        summed = _summed_buffers(grid)
        for coords, _ in index.tasks(grid):
            accesses = []
            for role, fp in grid.footprints:
                buf = index.buffers[fp.buffer_name]
                elements = np.zeros(buf.shape, dtype=bool)
                elements[fp.slices(coords)] = True
                width = buf.nbytes // max(elements.size, 1)
                bytes_ = np.repeat(elements.reshape(-1), width)
                if buf.offset is not None:
                    space, offset = "arena", int(buf.offset.value.data)
                    mask = np.zeros(arena, dtype=bool)
                    mask[offset : offset + bytes_.size] = bytes_
                else:
                    space, mask = fp.buffer_name, bytes_
                accesses.append((space, mask, role == "writes", fp.buffer_name in summed))
            result.append(accesses)
    return result


def check_dependences_covered(graph: GraphOp) -> int:
    """Every pair of tasks touching a common byte, one of them writing, is ordered by waits.

    Earlier grid first within an iteration (RAW, WAR, WAW); with several iterations, the later
    grid's task of iteration t before the earlier grid's task of t + 1. Returns the pairs checked.
    """
    same, prev, grid_of = _closure(graph)
    masks = _byte_masks(graph)
    order = {grid: i for i, grid in enumerate(graph.index().grids)}
    iterations = int(graph.iterations.value.data)
    checked = 0
    for a, accesses_a in enumerate(masks):
        for b, accesses_b in enumerate(masks):
            ga, gb = order[grid_of[a]], order[grid_of[b]]
            if a == b or not _conflict(accesses_a, accesses_b, same_grid=ga == gb):
                continue
            assert ga != gb, f"tasks {a} and {b} of one grid touch the same bytes"
            if ga < gb:
                assert same[b] >> a & 1, f"task {b} does not wait for task {a}"
            elif iterations > 1:
                assert prev[b] >> a & 1, (
                    f"task {b} does not wait for task {a} of the last iteration"
                )
            checked += 1
    return checked


def _conflict(xs: list[Access], ys: list[Access], same_grid: bool) -> bool:
    """A common byte, one side writing; tasks of one grid may add into a buffer together."""
    return any(
        sx == sy and (wx or wy) and not (same_grid and ax and ay) and bool((mx & my).any())
        for sx, mx, wx, ax in xs
        for sy, my, wy, ay in ys
    )


def check_footprints_match_slices(graph: GraphOp) -> None:
    """Each graph_def task's footprints are its blocks' input/output slices (bounding box)."""
    for grid in graph.index().grids:
        kernel = grid.body.block.first_op
        if not isinstance(kernel, GraphDefOp):
            continue
        reads, writes = list(grid.reads), list(grid.writes)
        for coords in grid_points(grid.shape_tuple):
            block = tuple(int(c) for c in coords) + (0,) * (3 - len(coords))
            for pos, fp in enumerate(reads):
                at = [k for k, a in enumerate(kernel.args) if a is grid.body.block.args[pos]]
                made = [r for k in at if (r := kernel.in_place_result(k)) is not None]
                if made:  # written in place: a block reads the part it writes back
                    write = writes[kernel.results.index(made[0])]
                    assert fp.slices(tuple(coords)) == write.slices(tuple(coords))
                    continue
                slices = [
                    i.block_slices(block)
                    for i in kernel.input_ops()
                    if kernel.args[i.source_index()] is grid.body.block.args[pos]
                ]
                rect = fp.slices(tuple(coords))
                lo = [min(s[d].start for s in slices) for d in range(len(rect))]
                hi = [max(s[d].stop for s in slices) for d in range(len(rect))]
                assert [(r.start, r.stop) for r in rect] == list(zip(lo, hi, strict=True))
            for out in kernel.output_ops():
                fp = writes[out.result_index()]
                want = list(out.tile_slices(block))
                if (placed := out.position()) is not None:  # any position: the whole dim
                    want[placed[1]] = slice(0, out.dest.type.get_shape()[placed[1]])  # type: ignore[attr-defined]
                assert fp.slices(tuple(coords)) == tuple(want)


def check_arena_disjoint(graph: GraphOp) -> None:
    """Buffers that are live at the same time never share arena bytes."""
    index = graph.index()
    live: dict[str, list[int]] = {}
    for pos, grid in enumerate(index.grids):
        for _, fp in grid.footprints:
            live.setdefault(fp.buffer_name, []).append(pos)
    arena = [b for b in index.buffers.values() if b.offset is not None]
    for x in arena:
        for y in arena:
            if x is y:
                continue
            (x0, x1), (y0, y1) = _range(live[x.sym_name.data]), _range(live[y.sym_name.data])
            xo, yo = int(x.offset.value.data), int(y.offset.value.data)  # type: ignore[union-attr]
            if not (x1 < y0 or y1 < x0):
                assert xo + x.nbytes <= yo or yo + y.nbytes <= xo, (x.sym_name, y.sym_name)


def _range(positions: list[int]) -> tuple[int, int]:
    return min(positions), max(positions)


def coarse_events(graph: GraphOp) -> list[str]:
    return [
        op.sym_name.data
        for op in graph.body.block.ops
        if isinstance(op, EventOp) and "mk.coarse" in op.attributes
    ]


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", SMALL_EXAMPLES)
@pytest.mark.parametrize("iterations", [1, 3])
def test_examples_cover_every_dependence(name: str, iterations: int) -> None:
    graph = example(name, iterations=iterations)
    check_footprints_match_slices(graph)
    check_arena_disjoint(graph)
    assert check_dependences_covered(graph) > 0 or name == "rmsnorm_linear.mlir"


@pytest.mark.parametrize("name", SMALL_EXAMPLES)
def test_examples_without_merging_still_cover(name: str) -> None:
    merged = example(name, iterations=2)
    graph = example(name, iterations=2, merge_events=False)
    check_dependences_covered(graph)
    count = lambda g: sum(isinstance(o, EventOp) for o in g.body.block.ops)  # noqa: E731
    assert count(graph) >= count(merged)


@pytest.mark.parametrize("name", ["decoder_block.mlir", "gated_mlp.mlir", "lm_head_argmax.mlir"])
def test_single_iteration_events_are_exact(name: str) -> None:
    # With the attention folded (the default) no per-head RoPE kernel of q runs before it.
    # Unfolded, the attention's outputs reused the arena bytes that kernel read: a write-after-
    # read bounded by byte spans, one coarse event (k3_qr_done).
    assert coarse_events(example(name)) == []


def test_chain_gets_identity_and_whole_tensor_events() -> None:
    graph = lower(load_module(CHAIN), nn=False)
    index = graph.index()
    a_done, b_done = index.events["k0_a_done"], index.events["k1_b_done"]
    assert (a_done.shape_tuple, a_done.count_value) == ((4,), 1)
    b_grid, s_grid = index.grids_by_name["k1_b"], index.grids_by_name["k2_s"]
    assert [str(e.element_map) for e in b_grid.waits] == ["(d0) -> (d0)"]
    # The softmax reads all of @b: one element that all 4 producers signal.
    assert (b_done.shape_tuple, b_done.count_value) == ((1,), 4)
    assert [e.event_name for e in s_grid.waits] == ["k1_b_done"]
    assert coarse_events(graph) == []
    # Result #1 is the argument: an explicit copy task reads @x and writes the output.
    copy = index.grids_by_name["k3_copy_result1"]
    assert [f.buffer_name for _, f in copy.footprints] == ["x", "result1"]
    check_dependences_covered(graph)


def test_buffers_keep_the_signature() -> None:
    graph = example("decoder_block.mlir")
    buffers = [op for op in graph.body.block.ops if isinstance(op, BufferOp)]
    kinds = {b.sym_name.data: (b.kind.data, b.index) for b in buffers if b.index is not None}
    weights = sorted(n for n, (k, _) in kinds.items() if k == "weight")
    inputs = sorted(n for n, (k, _) in kinds.items() if k == "input")
    assert weights == sorted(
        ["attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down"]
    )
    assert inputs == ["cos", "k_cache", "sin", "v_cache", "x"]
    assert [int(kinds[n][1].value.data) for n in ("x", "w_down")] == [0, 13]  # type: ignore[union-attr]
    assert kinds["y"][0] == "output"
    workspaces = [b.sym_name.data for b in buffers if b.kind.data == "workspace"]
    # 128 keys are two splits at batch 1 (mugraph-split-loop: one chunk of keys a split)
    assert workspaces == ["att2_o", "att2_m", "att2_l"]
    # Grids prefetch exactly the weights they read.
    for grid in graph.index().grids:
        read = {f.buffer_name for f in grid.reads}
        assert {r.root_reference.data for r in grid.prefetch} == {n for n in weights if n in read}


def test_output_is_deterministic_and_round_trips() -> None:
    first = str(example("decoder_block.mlir", iterations=2).parent_op())
    second = str(example("decoder_block.mlir", iterations=2).parent_op())
    assert first == second
    assert str(load_module(first)) == first


CALLER = """
func.func @callee(%x: tensor<4xf32>) -> tensor<4xf32> {
  func.return %x : tensor<4xf32>
}
func.func @caller(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = mugraph.kernel "exp" (%x) : (tensor<4xf32>) -> tensor<4xf32>
  %z = func.call @callee(%y) : (tensor<4xf32>) -> tensor<4xf32>
  func.return %z : tensor<4xf32>
}
"""


def test_non_kernel_op_is_a_located_error() -> None:
    with pytest.raises(MkError, match="'func.call' is not a mugraph kernel") as info:
        lower(load_module(CALLER), nn=False)
    assert info.value.location is not None and info.value.location.endswith(":7:3")


HUGE = """
func.func @huge(%x: tensor<100000x100000xbf16>, %w: tensor<100000x100000xbf16>) -> tensor<100000x100000xbf16> {
  %y = nn.linear %x, %w : (tensor<100000x100000xbf16>, tensor<100000x100000xbf16>) -> tensor<100000x100000xbf16>
  func.return %y : tensor<100000x100000xbf16>
}
"""


def test_a_program_of_millions_of_tasks_is_refused_at_its_largest_op() -> None:
    """Before the scheduler spends minutes on it, at the nn op whose kernel it is."""
    with pytest.raises(MkError, match=r"lowers to [\d,]+ tasks, more than the 1,048,576") as info:
        lower(load_module(HUGE))
    assert info.value.location is not None and info.value.location.endswith(":3:3")


def test_bad_options_are_errors() -> None:
    with pytest.raises(MkError, match="align must be a multiple of 128"):
        lower(load_module(CHAIN), nn=False, align=100)
    with pytest.raises(MkError, match="iterations must be >= 1"):
        lower(load_module(CHAIN), nn=False, iterations=0)


def test_llama3_block_builds_fast_and_compact() -> None:
    module = load_module(LLAMA)
    NnToMugraphPass().apply(make_context(), module)
    start = time.perf_counter()
    MugraphToTaskPass(iterations=4).apply(make_context(), module)
    module.verify()
    text = str(module)
    elapsed = time.perf_counter() - start
    lines = text.count("\n") + 1
    print(f"llama3_8b_block: mugraph-to-task + verify + print {elapsed:.2f} s, {lines} lines")
    assert elapsed < 5.0
    assert lines < 2000
    graph = next(op for op in module.ops if isinstance(op, GraphOp))
    assert graph.index().total_tasks > 400
    check_arena_disjoint(graph)


@settings(
    max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(programs(), OPTIONS)
def test_random_programs_cover_every_dependence(module: ModuleOp, options: dict[str, int]) -> None:
    _lower_and_check(module, options)


@settings(
    max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(programs(), OPTIONS)
def test_grid_level_pruning_alone_covers_every_dependence(
    module: ModuleOp, options: dict[str, int]
) -> None:
    """The pruning long programs get (task-level off), on the random programs."""
    import mk.passes.mugraph_to_task_events as events

    saved, events.PRUNE_LIMIT = events.PRUNE_LIMIT, 0
    try:
        _lower_and_check(module, options)
    finally:
        events.PRUNE_LIMIT = saved


def _lower_and_check(module: ModuleOp, options: dict[str, int]) -> None:
    module = load_module(str(module))
    NnToMugraphPass(**options).apply(make_context(), module)
    MugraphToTaskPass(iterations=2).apply(make_context(), module)
    module.verify()
    for graph in (op for op in module.ops if isinstance(op, GraphOp)):
        check_footprints_match_slices(graph)
        check_arena_disjoint(graph)
        check_dependences_covered(graph)


@pytest.mark.parametrize("name", SMALL_EXAMPLES)
@pytest.mark.parametrize("iterations", [1, 3])
def test_examples_with_grid_level_pruning_alone_cover_every_dependence(
    name: str, iterations: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mk.passes.mugraph_to_task_events as events

    monkeypatch.setattr(events, "PRUNE_LIMIT", 0)
    check_dependences_covered(example(name, iterations=iterations))


def test_checker_catches_a_dropped_wait() -> None:
    """The brute-force check is not vacuous: without one wait edge a dependence is uncovered."""
    from xdsl.dialects.builtin import ArrayAttr

    graph = example("gated_mlp.mlir")
    down = graph.index().grids_by_name["k1_y"]
    assert len(down.waits) == 1
    down.properties["waits"] = ArrayAttr([])
    with pytest.raises(AssertionError, match="does not wait for"):
        check_dependences_covered(graph)


def test_waits_stay_few_on_llama3() -> None:
    module = load_module(LLAMA)
    graph = lower(module, iterations=2)
    grids = graph.index().grids
    # At most one wait per operand producer: attention reads q, both caches and kv_len.
    assert max(len(g.waits) for g in grids) <= 4
    events = [op for op in graph.body.block.ops if isinstance(op, EventOp)]
    # The qkv linear signals one event per consumer grouping (q's RoPE, k's RoPE per head, the
    # v copy), and loop-carried waits add a few; k's RoPE, which writes the cache in place, signals
    # the attention per head and the merge (reusing its input's arena bytes) per group of heads.
    assert len(events) <= len(grids) + 4


def test_grid_level_pruning_follows_waits_on_some_producer_tasks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the task-level pruning off (as for long programs), a per-head QK-norm that waits on
    its head's columns of q waits, through them, on every earlier layer: it keeps no wait on an
    earlier layer's attention. (Before, a 4-layer program's QK-norm of q kept 9 waits; a
    28-layer qwen3-0.6b's kept 57, which cost ~18 µs a layer on the H200.)"""
    from dataclasses import replace

    import mk.passes.mugraph_to_task_events as events
    from mk import compiler
    from mk.models import decode_program, preset

    monkeypatch.setattr(events, "PRUNE_LIMIT", 0)
    config = replace(
        preset("qwen3-0.6b"), hidden=128, heads=4, kv_heads=2, head_dim=32, layers=4,
        intermediate=256, vocab=256,
    )  # fmt: skip
    module = load_module(decode_program(config, 1, 128, 1))
    options = {"num_sms": 16, "tile_n": 0, "fold_bytes": 0}
    compiler.run_pipeline(module, options, compiler.PIPELINE[:3])
    graph = next(op for op in module.walk() if isinstance(op, GraphOp))
    assert max(len(g.waits) for g in graph.index().grids) <= 4
    assert check_dependences_covered(graph) > 0


@pytest.mark.parametrize("batch", [1, 8])
def test_a_whole_decode_model_keeps_few_waits(batch: int) -> None:
    """qwen3-0.6b's 28 layers (past the task-level pruning): every wait is a round trip of the
    GPU dispatcher before its task starts, so none may pile up on earlier layers; the MLP's
    linears wait only on their input."""
    from dataclasses import replace

    from mk import compiler
    from mk.models import decode_program, preset

    config = replace(preset("qwen3-0.6b"), vocab=1024)
    module = load_module(decode_program(config, batch, 1024, 1))
    compiler.run_pipeline(module, {"num_sms": 132, "tile_n": 0}, compiler.PIPELINE[:2])
    MugraphToTaskPass().apply(make_context(), module)
    graph = next(op for op in module.walk() if isinstance(op, GraphOp))
    grids = graph.index().grids
    assert graph.index().total_tasks > 4096  # the grid-level pruning is what runs
    assert max(len(g.waits) for g in grids) <= 4
    # Gate/up + down fused at batch 1; at batch 8 (24 columns a block for 8 rows) two kernels.
    names = ("_y_acc",) if batch == 1 else ("_m", "_y")
    mlp = [g for g in grids if g.sym_name.data.endswith(names)]
    assert len(mlp) == 28 * len(names) and all(len(g.waits) == 1 for g in mlp)
