"""The task dialect: Python builders, printing round trips, verifiers, queries and the deadlock check."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, TensorType, bf16, f32, i64
from xdsl.ir import Attribute
from xdsl.ir.affine import AffineExpr, AffineMap
from xdsl.utils.exceptions import VerifyException

from mk.diagnostics import parse_module
from mk.dialects import make_context
from mk.dialects.task import (
    BufferOp,
    EdgeAttr,
    EventOp,
    FootprintAttr,
    GraphOp,
    GridOp,
    ScheduleOp,
    YieldOp,
)
from mk.dialects.task_grid import make_grid_body, tile_type
from mk.dialects.task_index import check_queues_deadlock_free
from mk.dialects.task_maps import (
    eval_map,
    format_map,
    grid_points,
    parse_map,
    wait_threshold,
)

Fp = FootprintAttr
Edge = EdgeAttr


class GraphBuilder:
    """Appends buffers, events and grids (with placeholder bodies) to a new task.graph."""

    def __init__(self, name: str, iterations: int = 1, arena: int = 0) -> None:
        self.graph = GraphOp(name, iterations, arena)
        self.buffers: dict[str, BufferOp] = {}
        self.arena_top = 0

    def buffer(self, name: str, shape: Sequence[int], kind: str, index: int | None = None,
               dtype: Attribute = bf16, offset: int | None = None) -> None:  # fmt: skip
        ttype = TensorType(dtype, list(shape))
        if kind in ("activation", "workspace") and offset is None:
            offset = self.arena_top
        op = BufferOp(name, ttype, kind, index=index, offset=offset)
        if offset is not None:
            self.arena_top = max(self.arena_top, -(-(offset + op.nbytes) // 128) * 128)
        self.buffers[name] = op
        self.graph.body.block.add_op(op)

    def event(self, name: str, shape: Sequence[int], count: int) -> None:
        self.graph.body.block.add_op(EventOp(name, shape, count))

    def grid(self, name: str, shape: Sequence[int], reads=(), writes=(), **edges) -> GridOp:
        rtypes = [self.buffers[f.buffer_name].buffer_type for f in reads]
        wtypes = [self.buffers[f.buffer_name].buffer_type for f in writes]
        names = [f.buffer_name for f in (*reads, *writes)]
        body = make_grid_body(rtypes, wtypes, names)
        op = GridOp(name, shape, body, reads=reads, writes=writes, **edges)
        self.graph.body.block.add_op(op)
        return op

    def schedule(self, num_sms: int, queues: Sequence[Sequence[int]]) -> ScheduleOp:
        op = ScheduleOp(num_sms, queues)
        self.graph.body.block.add_op(op)
        return op

    def finish(self) -> ModuleOp:
        self.graph.arena = IntegerAttr(self.arena_top, i64)
        return ModuleOp([self.graph])


def round_robin(total: int, num_sms: int) -> list[list[int]]:
    return [list(range(sm, total, num_sms)) for sm in range(num_sms)]


def rms_linear(num_sms: int = 4, norm_distance: int = 1) -> ModuleOp:
    """The graph of test/lit/dialects/task/ops.mlir, built with the Python API."""
    b = GraphBuilder("rms_linear", iterations=4)
    b.buffer("x", [8, 6144], "input", 0)
    b.buffer("g", [6144], "weight", 1)
    b.buffer("w", [6144, 1024], "weight", 2)
    b.buffer("y", [8, 1024], "output", 0)
    b.buffer("h", [8, 6144], "activation", offset=0)
    b.buffer("t", [8, 1024], "activation", offset=0)
    b.buffer("part", [16, 8, 1024], "workspace", dtype=f32, offset=98304)
    b.event("h_ready", [4], 12)
    b.event("part_ready", [1], 16)
    b.event("part_free", [1], 8)
    b.event("t_ready", [8], 1)
    b.event("t_free", [1], 8)
    b.grid("norm", [48],
           reads=[Fp("x", "(d0) -> (0, 0)", [8, 6144]), Fp("g", "(d0) -> (d0 * 128)", [128])],
           writes=[Fp("h", "(d0) -> (0, d0 * 128)", [8, 128])],
           waits=[Edge("t_free", "(d0) -> (0)", norm_distance)],
           signals=[Edge("h_ready", "(d0) -> (d0 floordiv 12)")])  # fmt: skip
    b.grid("linear", [16],
           reads=[Fp("h", "(d0) -> (0, d0 * 384)", [8, 384]),
                  Fp("w", "(d0) -> (d0 * 384, 0)", [384, 1024])],
           writes=[Fp("part", "(d0) -> (d0, 0, 0)", [1, 8, 1024])],
           waits=[Edge("h_ready", "(d0) -> (d0 floordiv 4)"),
                  Edge("part_free", "(d0) -> (0)", 1)],
           signals=[Edge("part_ready", "(d0) -> (0)")],
           prefetch=["w"], cost={"bytes": 792576, "flops": 6291456})  # fmt: skip
    b.grid("reduce", [8],
           reads=[Fp("part", "(d0) -> (0, 0, d0 * 128)", [16, 8, 128])],
           writes=[Fp("t", "(d0) -> (0, d0 * 128)", [8, 128])],
           waits=[Edge("part_ready", "(d0) -> (0)")],
           signals=[Edge("t_ready", "(d0) -> (d0)"), Edge("part_free", "(d0) -> (0)")])  # fmt: skip
    b.grid("act", [8],
           reads=[Fp("t", "(d0) -> (0, d0 * 128)", [8, 128])],
           writes=[Fp("y", "(d0) -> (0, d0 * 128)", [8, 128])],
           waits=[Edge("t_ready", "(d0) -> (d0)")],
           signals=[Edge("t_free", "(d0) -> (0)")])  # fmt: skip
    b.schedule(num_sms, round_robin(80, num_sms))
    return b.finish()


def graph_of(module: ModuleOp) -> GraphOp:
    op = module.body.block.first_op
    assert isinstance(op, GraphOp)
    return op


def reparse(text: str) -> ModuleOp:
    return parse_module(make_context(), text, "<t>")


# --------------------------------------------------------------------------- build/print/parse


def test_built_graph_verifies_prints_and_reparses_to_the_same_ir() -> None:
    module = rms_linear()
    module.verify()
    text = str(module)
    again = reparse(text)
    again.verify()
    assert str(again) == text
    assert again.is_structurally_equivalent(module)
    assert "task.grid @linear [16]" in text
    assert "waits(@h_ready (d0) -> (d0 floordiv 4), @part_free (d0) -> (0) distance 1)" in text
    assert "cost(bytes = 792576, flops = 6291456)" in text


def test_built_graph_matches_the_lit_test_file() -> None:
    from pathlib import Path

    lit = Path(__file__).parents[1] / "lit" / "dialects" / "task" / "ops.mlir"
    first_chunk = lit.read_text().split("// -----")[0]
    parsed = reparse(first_chunk)
    parsed.verify()
    assert str(parsed) == str(rms_linear())


def test_generic_form_round_trips() -> None:
    from io import StringIO

    from xdsl.printer import Printer

    module = rms_linear()
    out = StringIO()
    Printer(stream=out, print_generic_format=True).print_op(module)
    assert "#task.footprint<@h[(d0) -> (0, d0 * 384)] [8, 384]>" in out.getvalue()
    assert str(reparse(out.getvalue())) == str(module)


# --------------------------------------------------------------------------- queries


def test_task_ids_are_row_major_after_earlier_grids() -> None:
    index = graph_of(rms_linear()).index()
    assert index.total_tasks == 80
    assert [g.sym_name.data for g in index.grids] == ["norm", "linear", "reduce", "act"]
    assert index.bases == [0, 48, 64, 72]
    linear = index.grids_by_name["linear"]
    tasks = list(index.tasks(linear))
    assert tasks[0] == ((0,), 48) and tasks[-1] == ((15,), 63)
    assert index.locate(70) == (index.grids_by_name["reduce"], (6,))
    assert index.describe(70) == "task 70 (@reduce[6])"
    with pytest.raises(ValueError):
        index.locate(80)


def test_multi_dimensional_grid_ids() -> None:
    text = """
    task.graph @g iterations 1 arena 0 {
      task.buffer @a input 0 : tensor<64x64xf32>
      task.grid @k [2, 3, 4] reads(@a[(d0, d1, d2) -> (d0 * 32, d2 * 16)] [32, 16]) {
      ^bb0(%a: tensor<64x64xf32>):
        task.yield
      }
    }"""
    index = graph_of(reparse(text)).index()
    grid = index.grids[0]
    assert index.task_id(grid, (1, 2, 3)) == 1 * 12 + 2 * 4 + 3
    assert index.locate(23) == (grid, (1, 2, 3))
    assert grid.reads.data[0].slices((1, 2, 3)) == (slice(32, 64), slice(48, 64))


def test_footprints_events_and_their_tasks() -> None:
    index = graph_of(rms_linear()).index()
    norm = index.grids_by_name["norm"]
    h_write = norm.writes.data[0]
    assert h_write.slices((5,)) == (slice(0, 8), slice(640, 768))
    assert index.producers_of("h_ready", (2,)) == list(range(24, 36))
    assert index.consumers_of("h_ready", (2,)) == [56, 57, 58, 59]
    assert index.producers_of("part_ready", (0,)) == list(range(48, 64))
    assert index.waits_of(56) == [("h_ready", (2,), 0), ("part_free", (0,), 1)]
    assert index.signals_of(56) == [("part_ready", (0,))]
    assert index.signals_of(64) == [("t_ready", (0,)), ("part_free", (0,))]
    assert index.waits_of(0) == [("t_free", (0,), 1)]


def test_flat_event_counters_and_monotone_thresholds() -> None:
    index = graph_of(rms_linear()).index()
    # events in block order: h_ready[4], part_ready[1], part_free[1], t_ready[8], t_free[1]
    assert index.counter_bases == {
        "h_ready": 0, "part_ready": 4, "part_free": 5, "t_ready": 6, "t_free": 14,
    }  # fmt: skip
    assert index.total_counters == 15
    assert index.counter("t_ready", (3,)) == 9
    assert index.locate_counter(9) == ("t_ready", (3,))
    assert index.locate_counter(14) == ("t_free", (0,))
    # @h_ready has count 12: iteration t needs 12 * (t + 1); a distance-1 wait lags one iteration
    assert [wait_threshold(12, t) for t in range(4)] == [12, 24, 36, 48]
    assert [wait_threshold(8, t, distance=1) for t in range(4)] == [0, 8, 16, 24]


def test_every_read_tile_is_covered_by_the_producers_it_waits_on() -> None:
    """The RAW edge @h_ready: a linear task's producers write exactly the columns it reads."""
    index = graph_of(rms_linear()).index()
    norm, linear = index.grids_by_name["norm"], index.grids_by_name["linear"]
    for coords, task in index.tasks(linear):
        (event, element, _), _ = index.waits_of(task)
        assert event == "h_ready"
        read = linear.reads.data[0].slices(coords)[1]
        written = set()
        for producer in index.producers_of(event, element):
            _, pcoords = index.locate(producer)
            cols = norm.writes.data[0].slices(pcoords)[1]
            written.update(range(cols.start, cols.stop))
        assert set(range(read.start, read.stop)) <= written


# --------------------------------------------------------------------------- affine maps


def _exprs(num_dims: int) -> st.SearchStrategy[AffineExpr]:
    leaf = st.one_of(
        st.integers(0, num_dims - 1).map(AffineExpr.dimension),
        st.integers(-20, 20).map(AffineExpr.constant),
    )

    def extend(inner: st.SearchStrategy[AffineExpr]) -> st.SearchStrategy[AffineExpr]:
        const = st.integers(-9, 9)
        positive = st.integers(1, 9)
        return st.one_of(
            st.tuples(inner, inner).map(lambda p: p[0] + p[1]),
            st.tuples(inner, inner).map(lambda p: p[0] - p[1]),
            st.tuples(inner, const).map(lambda p: p[0] * p[1]),
            st.tuples(inner, positive).map(lambda p: p[0] // p[1]),
            st.tuples(inner, positive).map(lambda p: p[0].ceil_div(p[1])),
            st.tuples(inner, positive).map(lambda p: p[0] % p[1]),
        )

    return st.recursive(leaf, extend, max_leaves=6)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3).flatmap(
        lambda n: st.tuples(st.just(n), st.lists(_exprs(n), min_size=1, max_size=3))
    )
)
def test_map_printing_round_trips_and_numpy_evaluation_agrees(case) -> None:
    num_dims, results = case
    amap = AffineMap(num_dims, 0, tuple(results))
    text = format_map(amap)
    again = parse_map(text)
    assert format_map(again) == text
    points = grid_points([3, 4, 5][:num_dims]) - 1
    expected = np.array([amap.eval(list(p), []) for p in points])
    assert np.array_equal(eval_map(amap, points), expected)
    assert np.array_equal(eval_map(again, points), expected)


def test_map_printing_is_compact() -> None:
    amap = parse_map("(i, j) -> (i * 2 + 1, (j ceildiv 2) * 16, (j mod 2) * 16 + 16 - (i * 16))")
    assert format_map(amap) == (
        "(d0, d1) -> (d0 * 2 + 1, (d1 ceildiv 2) * 16, (d1 mod 2) * 16 + 16 - d0 * 16)"
    )
    assert format_map(parse_map("(d0) -> (-d0, 5 - d0)")) == "(d0) -> (-d0, -d0 + 5)"


# --------------------------------------------------------------------------- verifier


def _verify_error(module: ModuleOp) -> str:
    with pytest.raises(VerifyException) as info:
        module.verify()
    return str(info.value)


def test_verifier_rejects_a_wrong_count_and_a_missing_queue_entry() -> None:
    module = rms_linear()
    graph = graph_of(module)
    event = next(op for op in graph.body.ops if isinstance(op, EventOp))
    event.count = IntegerAttr(11, i64)
    assert "element [0] is signalled by 12 tasks per iteration" in _verify_error(module)

    module = rms_linear()
    schedule = graph_of(module).index().schedule
    assert schedule is not None
    last = schedule.body.block.last_op
    assert last is not None
    schedule.body.block.erase_op(last)  # SM 3's queue
    assert "task 3 (@norm[3]) is in no queue (20 of 80 tasks unscheduled)" in _verify_error(module)


def test_located_verification_blames_the_event_and_sees_later_edits() -> None:
    from mk.diagnostics import MkError, verify_located

    module = rms_linear()
    graph = graph_of(module)
    event = graph.index().events["part_free"]
    event.count = IntegerAttr(7, i64)
    with pytest.raises(MkError) as info:
        verify_located(module)
    assert info.value.message.startswith("'task.event' count 7 of @part_free does not match")
    event.count = IntegerAttr(8, i64)
    verify_located(module)
    module.verify()


def test_replacing_a_buffer_is_seen_by_the_next_verification() -> None:
    module = rms_linear()
    module.verify()
    graph = graph_of(module)
    old = graph.index().buffers["t"]
    new = BufferOp("t", TensorType(f32, [8, 1024]), "activation", offset=0)
    graph.body.block.insert_op_after(new, old)
    graph.body.block.erase_op(old)
    assert "expected tensor<8x1024xf32> (the buffer @t)" in _verify_error(module)


def test_body_types_are_whole_buffers_and_tile_types_are_footprints() -> None:
    graph = graph_of(rms_linear())
    index = graph.index()
    linear = next(g for g in index.grids if g.sym_name.data == "linear")
    body = [str(t) for t in linear.body_types(index.buffers)]
    tiles = [str(t) for t in linear.tile_types(index.buffers)]
    assert body == ["tensor<8x6144xbf16>", "tensor<6144x1024xbf16>", "tensor<16x8x1024xf32>"]
    assert tiles == ["tensor<8x384xbf16>", "tensor<384x1024xbf16>", "tensor<1x8x1024xf32>"]
    assert [str(a.type) for a in linear.body.block.args] == body
    assert tile_type(index.buffers["w"], [384, 1024]) == linear.tile_types(index.buffers)[1]


def test_a_buffer_read_and_written_is_a_body_argument_twice() -> None:
    b = GraphBuilder("in_place")
    b.buffer("a", [16, 32], "output", index=0, dtype=f32)
    fp = Fp("a", "(d0) -> (d0 * 8, 0)", [8, 32])
    grid = b.grid("scale", [2], reads=[fp], writes=[fp])
    module = b.finish()
    module.verify()
    args = grid.body.block.args
    assert [str(a.type) for a in args] == ["tensor<16x32xf32>"] * 2
    yielded = grid.body.block.last_op
    assert isinstance(yielded, YieldOp) and list(yielded.operands) == [args[1]]
    assert str(reparse(str(module))) == str(module)


def test_a_tile_typed_body_is_rejected() -> None:
    text = """
    task.graph @g iterations 1 arena 0 {
      task.buffer @a input 0 : tensor<64xf32>
      task.buffer @b output 0 : tensor<64xf32>
      task.grid @k [4] reads(@a[(d0) -> (d0 * 16)] [16]) writes(@b[(d0) -> (d0 * 16)] [16]) {
      ^bb0(%a: tensor<64xf32>, %b: tensor<16xf32>):
        task.yield %b : tensor<16xf32>
      }
    }"""
    message = _verify_error(reparse(text))
    # the yield is verified before its grid, so a tile-typed write is caught there first
    assert message == "value #0 has type tensor<16xf32>, expected tensor<64xf32> (the buffer @b)"


def test_large_grids_are_checked_at_their_corners() -> None:
    text = """
    task.graph @g iterations 1 arena 0 {
      task.buffer @a input 0 : tensor<1048576xf32>
      task.grid @k [512, 1024] reads(@a[(d0, d1) -> (d0 * 2048 + d1 * 2)] [3]) {
      ^bb0(%a: tensor<1048576xf32>):
        task.yield
      }
    }"""
    module = reparse(text)
    message = _verify_error(module)
    assert "out of bounds: task [511, 1023] covers [1048574:1048577]" in message


# --------------------------------------------------------------------------- deadlock check


def _with_queues(module: ModuleOp, queues: list[list[int]]) -> GraphOp:
    graph = graph_of(module)
    old = graph.index().schedule
    assert old is not None
    new = ScheduleOp(len(queues), queues)
    graph.body.block.insert_op_after(new, old)
    graph.body.block.erase_op(old)
    return graph


def test_round_robin_queues_in_id_order_are_deadlock_free() -> None:
    assert check_queues_deadlock_free(graph_of(rms_linear())) is None
    assert check_queues_deadlock_free(graph_of(rms_linear(num_sms=1))) is None


def test_a_swapped_queue_deadlocks() -> None:
    queues = round_robin(80, 4)
    sm0 = queues[0]
    sm0[0], sm0[12] = sm0[12], sm0[0]  # linear[0] (task 48) now runs before norm[0] on SM 0
    graph = _with_queues(rms_linear(), queues)
    graph.verify()  # every task still appears exactly once: only the order is wrong
    problem = check_queues_deadlock_free(graph)
    assert problem is not None
    assert problem.startswith("queues deadlock: ")
    assert "task 0 (@norm[0]) signals @h_ready[0]" in problem
    assert "task 48 (@linear[0]) waits on @h_ready[0]" in problem
    assert "SM 0 runs task 48 (@linear[0]) before task 0 (@norm[0])" in problem


def test_a_cycle_across_two_sms_deadlocks() -> None:
    text = """
    task.graph @g iterations 1 arena 0 {
      task.event @e [2] count 1
      task.grid @p [2] signals(@e (d0) -> (d0)) {
        task.yield
      }
      task.grid @c [2] waits(@e (d0) -> (1 - d0)) {
        task.yield
      }
      task.schedule num_sms 2 {
        task.queue sm 0 [2, 0]
        task.queue sm 1 [3, 1]
      }
    }"""
    graph = graph_of(reparse(text))
    graph.verify()
    problem = check_queues_deadlock_free(graph)
    assert problem == (
        "queues deadlock: task 0 (@p[0]) signals @e[0]; task 3 (@c[1]) waits on @e[0]; "
        "SM 1 runs task 3 (@c[1]) before task 1 (@p[1]); task 1 (@p[1]) signals @e[1]; "
        "task 2 (@c[0]) waits on @e[1]; SM 0 runs task 2 (@c[0]) before task 0 (@p[0])"
    )


def test_loop_carried_waits_do_not_order_tasks_within_an_iteration() -> None:
    # With distance 0, norm would wait for act of the same iteration: a true cycle.
    graph = graph_of(rms_linear(norm_distance=0))
    problem = check_queues_deadlock_free(graph)
    assert problem is not None and "waits on @t_free[0]" in problem


def test_malformed_queues_are_reported_without_a_verifier() -> None:
    queues = round_robin(80, 4)
    queues[1].append(0)
    assert check_queues_deadlock_free(_with_queues(rms_linear(), queues)) == (
        "task 0 (@norm[0]) is queued on SM 0 and SM 1"
    )
    module = rms_linear()
    graph = graph_of(module)
    schedule = graph.index().schedule
    assert schedule is not None
    graph.body.block.erase_op(schedule)
    assert check_queues_deadlock_free(graph) == "@rms_linear has no task.schedule"


# --------------------------------------------------------------------------- size


def llama3_8b_decoder_block(num_sms: int = 132) -> ModuleOp:
    """One Llama-3-8B decoder layer at decode (8 tokens): 12 grids, 952 tasks, 132 SM queues."""
    b = GraphBuilder("llama_block")
    b.buffer("x", [8, 4096], "input", 0)
    b.buffer("k_cache", [8, 8, 1024, 128], "input", 1)
    b.buffer("v_cache", [8, 8, 1024, 128], "input", 2)
    for i, (name, shape) in enumerate(
        [("ln1", [4096]), ("wqkv", [6144, 4096]), ("wo", [4096, 4096]), ("ln2", [4096]),
         ("wgu", [28672, 4096]), ("wd", [4096, 14336])], start=3):  # fmt: skip
        b.buffer(name, shape, "weight", i)
    b.buffer("out", [8, 4096], "output", 0)
    for name, shape in [("h1", [8, 4096]), ("qkv", [8, 6144]), ("q", [8, 4096]),
                        ("k_new", [8, 1024]), ("attn", [8, 4096]), ("x2", [8, 4096]),
                        ("h2", [8, 4096]), ("gu", [8, 28672]), ("act", [8, 14336])]:  # fmt: skip
        b.buffer(name, shape, "activation")
    b.buffer("attn_part", [4, 8, 32, 128], "workspace", dtype=f32)
    b.buffer("attn_lse", [4, 8, 32], "workspace", dtype=f32)
    b.buffer("down_part", [4, 8, 4096], "workspace", dtype=f32)
    for name, shape, count in [
        ("h1_ready", [1], 8), ("qkv_ready", [48], 1), ("q_ready", [8], 4), ("k_ready", [8], 1),
        ("part_ready", [8, 8], 4), ("attn_ready", [1], 64), ("x2_ready", [1], 32),
        ("h2_ready", [1], 8), ("gu_ready", [112], 2), ("act_ready", [4], 28),
        ("down_ready", [32], 4)]:  # fmt: skip
        b.event(name, shape, count)
    row = "(d0) -> (d0, 0)"
    col = "(d0) -> (0, d0 * 128)"
    b.grid("rms1", [8], reads=[Fp("x", row, [1, 4096]), Fp("ln1", "(d0) -> (0)", [4096])],
           writes=[Fp("h1", row, [1, 4096])], signals=[Edge("h1_ready", "(d0) -> (0)")])  # fmt: skip
    b.grid("qkv_proj", [48],
           reads=[Fp("h1", "(d0) -> (0, 0)", [8, 4096]),
                  Fp("wqkv", "(d0) -> (d0 * 128, 0)", [128, 4096])],
           writes=[Fp("qkv", col, [8, 128])], waits=[Edge("h1_ready", "(d0) -> (0)")],
           signals=[Edge("qkv_ready", "(d0) -> (d0)")], prefetch=["wqkv"])  # fmt: skip
    b.grid("rope_q", [32], reads=[Fp("qkv", col, [8, 128])], writes=[Fp("q", col, [8, 128])],
           waits=[Edge("qkv_ready", "(d0) -> (d0)")],
           signals=[Edge("q_ready", "(d0) -> (d0 floordiv 4)")])  # fmt: skip
    b.grid("rope_k", [8], reads=[Fp("qkv", "(d0) -> (0, d0 * 128 + 4096)", [8, 128])],
           writes=[Fp("k_new", col, [8, 128])],
           waits=[Edge("qkv_ready", "(d0) -> (d0 + 32)")],
           signals=[Edge("k_ready", "(d0) -> (d0)")])  # fmt: skip
    b.grid("attention", [8, 8, 4],
           reads=[Fp("q", "(b, g, s) -> (b, g * 512)", [1, 512]),
                  Fp("k_cache", "(b, g, s) -> (b, g, s * 256, 0)", [1, 1, 256, 128]),
                  Fp("v_cache", "(b, g, s) -> (b, g, s * 256, 0)", [1, 1, 256, 128]),
                  Fp("k_new", "(b, g, s) -> (b, g * 128)", [1, 128]),
                  Fp("qkv", "(b, g, s) -> (b, g * 128 + 5120)", [1, 128])],
           writes=[Fp("attn_part", "(b, g, s) -> (s, b, g * 4, 0)", [1, 1, 4, 128]),
                   Fp("attn_lse", "(b, g, s) -> (s, b, g * 4)", [1, 1, 4])],
           waits=[Edge("q_ready", "(b, g, s) -> (g)"), Edge("k_ready", "(b, g, s) -> (g)"),
                  Edge("qkv_ready", "(b, g, s) -> (g + 40)")],
           signals=[Edge("part_ready", "(b, g, s) -> (b, g)")])  # fmt: skip
    b.grid("attn_combine", [8, 8],
           reads=[Fp("attn_part", "(b, g) -> (0, b, g * 4, 0)", [4, 1, 4, 128]),
                  Fp("attn_lse", "(b, g) -> (0, b, g * 4)", [4, 1, 4])],
           writes=[Fp("attn", "(b, g) -> (b, g * 512)", [1, 512])],
           waits=[Edge("part_ready", "(b, g) -> (b, g)")],
           signals=[Edge("attn_ready", "(b, g) -> (0)")])  # fmt: skip
    b.grid("o_proj", [32],
           reads=[Fp("attn", "(d0) -> (0, 0)", [8, 4096]),
                  Fp("wo", "(d0) -> (d0 * 128, 0)", [128, 4096]), Fp("x", col, [8, 128])],
           writes=[Fp("x2", col, [8, 128])], waits=[Edge("attn_ready", "(d0) -> (0)")],
           signals=[Edge("x2_ready", "(d0) -> (0)")], prefetch=["wo"])  # fmt: skip
    b.grid("rms2", [8], reads=[Fp("x2", row, [1, 4096]), Fp("ln2", "(d0) -> (0)", [4096])],
           writes=[Fp("h2", row, [1, 4096])], waits=[Edge("x2_ready", "(d0) -> (0)")],
           signals=[Edge("h2_ready", "(d0) -> (0)")])  # fmt: skip
    b.grid("gate_up", [224],
           reads=[Fp("h2", "(d0) -> (0, 0)", [8, 4096]),
                  Fp("wgu", "(d0) -> (d0 * 128, 0)", [128, 4096])],
           writes=[Fp("gu", col, [8, 128])], waits=[Edge("h2_ready", "(d0) -> (0)")],
           signals=[Edge("gu_ready", "(d0) -> (d0 mod 112)")], prefetch=["wgu"])  # fmt: skip
    b.grid("silu_mul", [112],
           reads=[Fp("gu", col, [8, 128]), Fp("gu", "(d0) -> (0, d0 * 128 + 14336)", [8, 128])],
           writes=[Fp("act", col, [8, 128])], waits=[Edge("gu_ready", "(d0) -> (d0)")],
           signals=[Edge("act_ready", "(d0) -> (d0 floordiv 28)")])  # fmt: skip
    b.grid("down", [32, 4],
           reads=[Fp("act", "(n, k) -> (0, k * 3584)", [8, 3584]),
                  Fp("wd", "(n, k) -> (n * 128, k * 3584)", [128, 3584])],
           writes=[Fp("down_part", "(n, k) -> (k, 0, n * 128)", [1, 8, 128])],
           waits=[Edge("act_ready", "(n, k) -> (k)")],
           signals=[Edge("down_ready", "(n, k) -> (n)")], prefetch=["wd"])  # fmt: skip
    b.grid("down_reduce", [32],
           reads=[Fp("down_part", "(d0) -> (0, 0, d0 * 128)", [4, 8, 128]),
                  Fp("x2", col, [8, 128])],
           writes=[Fp("out", col, [8, 128])], waits=[Edge("down_ready", "(d0) -> (d0)")])  # fmt: skip
    b.schedule(num_sms, round_robin(952, num_sms))
    return b.finish()


def test_llama3_8b_decoder_block_prints_in_under_2000_lines() -> None:
    module = llama3_8b_decoder_block()
    module.verify()
    graph = graph_of(module)
    index = graph.index()
    assert len(index.grids) == 12 and index.total_tasks == 952
    assert check_queues_deadlock_free(graph) is None
    text = str(module)
    lines = text.count("\n") + 1
    assert lines < 2000, lines
    assert text.count("task.queue sm") == 132
    assert str(reparse(text)) == text
