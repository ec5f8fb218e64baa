"""The mugraph cost model and the mugraph-stats pass: exact unions, FLOPs, annotations."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DictionaryAttr,
    FloatAttr,
    IntegerAttr,
    ModuleOp,
    TensorType,
    bf16,
    f32,
)
from xdsl.ir import Operation

from mk.diagnostics import parse_module
from mk.dialects import make_context
from mk.dialects import mugraph as mg
from mk.dialects.mugraph_base import shape_of
from mk.dialects.mugraph_builder import BlockGraphBuilder
from mk.dialects.mugraph_tiles import AccumOp, MatmulOp
from mk.passes import cost_model as cm
from mk.passes import get_all_passes
from mk.passes.mugraph_stats import COST_ATTR, MugraphStatsPass

ROOT = Path(__file__).parents[2]
OPS_MLIR = ROOT / "test" / "lit" / "dialects" / "mugraph" / "ops.mlir"
EXAMPLES = ROOT / "examples"


def _chunk(name: str) -> str:
    for chunk in OPS_MLIR.read_text().split("// -----"):
        if f"func.func @{name}(" in chunk:
            return chunk
    raise KeyError(name)


def _parse(text: str) -> ModuleOp:
    module = parse_module(make_context(), text, "<t>")
    module.verify()
    return module


def _kernels(module: ModuleOp) -> list[mg.GraphDefOp | mg.KernelOp]:
    return [op for op in module.walk() if isinstance(op, mg.GraphDefOp | mg.KernelOp)]


# ------------------------------------------------------------------------------------------------
# RMSNorm+Linear: every tensor read from global memory exactly once
# ------------------------------------------------------------------------------------------------

X, G, W, Y = 8 * 4096 * 2, 4096 * 2, 6144 * 4096 * 2, 8 * 6144 * 2


def test_rms_norm_linear_reads_each_tensor_once() -> None:
    (kernel,) = _kernels(_parse(_chunk("rms_norm_linear")))
    cost = cm.kernel_cost(kernel)
    assert [(r.name, r.bytes, r.tensor_bytes) for r in cost.reads] == [
        ("x", X, X),
        ("g", G, G),
        ("w", W, W),
    ]
    assert all(r.fraction == 1.0 for r in cost.reads)
    assert cost.dram_read_bytes == X + G + W
    assert cost.dram_write_bytes == Y
    assert cost.blocks == 48 and cost.kernels == 1
    # x and g are replicated into all 48 blocks' shared memory; W is split among them
    assert cost.read("x").tile_load_bytes == 48 * X
    assert cost.read("g").tile_load_bytes == 48 * G
    assert cost.read("w").tile_load_bytes == W


def test_module_cost_sums_the_entry_function() -> None:
    module = _parse(_chunk("gated_mlp"))
    total = cm.module_cost(module)
    per = [cm.kernel_cost(k) for k in _kernels(module)]
    assert total.function == "gated_mlp" and total.kernels == 2
    assert total.dram_read_bytes == sum(c.dram_read_bytes for c in per)
    assert total.flops == sum(c.flops for c in per)
    assert total.est_seconds == pytest.approx(sum(c.est_seconds() for c in per))
    # the fused gate/up kernel reads x, W1 and W3 once each and writes h once
    x, w13, h = 8 * 4096 * 2, 12288 * 4096 * 2, 8 * 12288 * 2
    assert (per[0].dram_read_bytes, per[0].dram_write_bytes) == (x + 2 * w13, h)
    assert list(cm.module_costs(module)) == ["gated_mlp"]


def test_split_kv_attention_reads_q_k_v_once() -> None:
    attn, merge = _kernels(_parse(_chunk("decode_attention")))
    q, kv = 32 * 128 * 2, 8 * 4096 * 128 * 2
    cost = cm.kernel_cost(attn)
    assert [(r.name, r.bytes) for r in cost.reads] == [("q", q), ("k", kv), ("v", kv)]
    partials = 4 * 32 * 128 * 4 + 2 * 4 * 32 * 4
    assert cost.dram_write_bytes == partials
    assert cm.kernel_cost(merge).dram_read_bytes == partials


# ------------------------------------------------------------------------------------------------
# Exact unions: the fast path against enumeration
# ------------------------------------------------------------------------------------------------


def _brute_progression(
    outer_stride: int, outer_count: int, inner_stride: int, inner_count: int, width: int
) -> set[int]:
    return {
        o * outer_stride + i * inner_stride + w
        for o in range(outer_count)
        for i in range(inner_count)
        for w in range(width)
    }


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 7), min_size=5, max_size=5))
def test_progression_cover_matches_enumeration(params: list[int]) -> None:
    outer_stride, outer_count, inner_stride, inner_count, width = params
    cover = cm.progression_cover(outer_stride, outer_count, inner_stride, inner_count, width)
    got = {p for a, b in cover for p in range(a, b)}
    assert got == _brute_progression(*params)
    assert all(a < b for a, b in cover)
    assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(cover))  # disjoint, merged


@st.composite
def _covers(draw: st.DrawFn) -> tuple[tuple[int, ...], list[cm.Cover]]:
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 7)) for _ in range(rank))
    covers = []
    for _ in range(draw(st.integers(1, 4))):
        cover = []
        for size in shape:
            cuts = sorted(draw(st.sets(st.integers(0, size), max_size=6)))
            cover.append(tuple(itertools.pairwise(cuts))[::2])
        covers.append(tuple(cover))
    return shape, covers


@settings(max_examples=300, deadline=None)
@given(_covers())
def test_union_of_box_covers_matches_enumeration(case: tuple[tuple[int, ...], list]) -> None:
    shape, covers = case
    hit = np.zeros(shape, dtype=bool)
    for cover in covers:
        index = [np.array([p for a, b in ivs for p in range(a, b)], dtype=int) for ivs in cover]
        if all(len(i) for i in index):
            hit[np.ix_(*index)] = True
    assert cm.union_elements(covers) == int(hit.sum())


Maps = list[tuple[tuple[int, ...], int]]  # (imap, fmap) per input


@st.composite
def _tiled_graphs(draw: st.DrawFn) -> tuple[list[int], tuple[int, int, int], int, Maps]:
    """Random shape, grid, forloop and one or two (imap, fmap) pairs that divide the shape."""
    rank = draw(st.integers(1, 3))
    grid = (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    forloop = draw(st.integers(1, 3))
    maps_: Maps = []
    for _ in range(draw(st.integers(1, 2))):
        dims = draw(st.permutations([*range(rank), -1, -1, -1]))[:3]
        maps_.append((tuple(dims), draw(st.integers(-1, rank - 1))))
    shape = [draw(st.integers(1, 2)) for _ in range(rank)]
    for imap, fmap in maps_:  # make every split divide: multiply in what each map needs
        for axis, d in enumerate(imap):
            if d >= 0:
                shape[d] *= grid[axis] // math.gcd(shape[d], grid[axis])
        if fmap >= 0:
            parts = next((grid[a] for a, d in enumerate(imap) if d == fmap), 1)
            chunk = shape[fmap] // parts
            shape[fmap] = parts * chunk * (forloop // math.gcd(chunk, forloop))
    return shape, grid, forloop, maps_


def _tiled_graph(
    shape: list[int], grid: tuple[int, int, int], forloop: int, maps_: Maps
) -> mg.GraphDefOp:
    """A graph_def whose operand #0 is read by the given inputs and whose result is written by
    every block (copied from operand #1)."""
    source = TensorType(bf16, shape)
    result = TensorType(f32, [2 * g for g in grid])
    fn = func.FuncOp("f", ((source, result), (result,)))
    b = BlockGraphBuilder(fn.args, [result], grid, 32, forloop)
    for i, (imap, fmap) in enumerate(maps_):
        b.input(0, imap, fmap, name=f"t{i}")
    # the result is copied from a second operand: the test only needs the output's footprint
    b.output(b.input(1, (0, 1, 2), -1, name="r"), 0, (0, 1, 2))
    graph = b.finish()
    fn.body.block.add_ops([graph, func.ReturnOp(graph.results[0])])
    fn.verify()
    return graph


def _brute_input_union(op: mg.InputOp) -> tuple[int, int]:
    g = op.parent_graph()
    hit = np.zeros(shape_of(op.source), dtype=bool)
    loads = 0
    iterations = range(g.forloop_range()) if op.fmap_dim() >= 0 else range(1)
    for block in g.blocks():
        for it in iterations:
            window = op.tile_slices(block, it)
            hit[window] = True
            loads += math.prod(s.stop - s.start for s in window)
    return int(hit.sum()), loads


@settings(max_examples=60, deadline=None)
@given(_tiled_graphs())
def test_graph_reads_match_enumerated_tiles(spec: tuple) -> None:
    graph = _tiled_graph(*spec)
    cost = cm.kernel_cost(graph)
    read = cost.reads[0]
    inputs = [i for i in graph.input_ops() if i.source_index() == 0]
    hit = np.zeros(shape_of(graph.args[0]), dtype=bool)
    loads = 0
    for inp in inputs:
        hit_one, loads_one = _brute_input_union(inp)
        assert cm.union_elements([cm.input_cover(inp)]) == hit_one
        loads += loads_one
        for block in graph.blocks():
            for it in range(graph.forloop_range()):
                hit[inp.tile_slices(block, it)] = True
    assert read.bytes == int(hit.sum()) * 2
    assert read.tile_load_bytes == loads * 2
    (out,) = graph.output_ops()
    written = np.zeros(shape_of(graph.res[0]), dtype=int)
    for block in graph.blocks():
        written[out.tile_slices(block)] += 1
    assert cost.dram_write_bytes == int((written > 0).sum()) * 4


# ------------------------------------------------------------------------------------------------
# FLOPs
# ------------------------------------------------------------------------------------------------


def _matmul_graph(m: int, n: int, k: int, grid: Sequence[int], forloop: int) -> mg.GraphDefOp:
    """y[m, n] = x[m, k] · w[n, k]ᵀ, grid x over n, grid y over m, the loop over k."""
    tx, tw, ty = TensorType(bf16, [m, k]), TensorType(bf16, [n, k]), TensorType(f32, [m, n])
    fn = func.FuncOp("mm", ((tx, tw), (ty,)))
    b = BlockGraphBuilder(fn.args, [ty], (*grid, 1), 128, forloop)
    xt = b.input(0, (-1, 0, -1), fmap=1, name="xt")
    wt = b.input(1, (0, -1, -1), fmap=1, name="wt")
    p = b.add(MatmulOp(xt, wt, transpose_b=True), "p").res
    if forloop > 1:
        p = b.add(AccumOp("sum", p), "acc").res
    b.output(p, 0, (1, 0, -1))
    graph = b.finish()
    fn.body.block.add_ops([graph, func.ReturnOp(graph.results[0])])
    fn.verify()
    return graph


@pytest.mark.parametrize(
    "m, n, k, grid, forloop",
    [
        (8, 64, 128, (4, 1), 1),
        (16, 96, 64, (3, 2), 1),
        (8, 64, 256, (2, 1), 4),
        (4, 32, 96, (1, 4), 3),
    ],
)
def test_matmul_graph_flops_are_2mnk(
    m: int, n: int, k: int, grid: tuple[int, int], forloop: int
) -> None:
    cost = cm.kernel_cost(_matmul_graph(m, n, k, grid, forloop))
    # the accumulator adds each iteration's m×n partial tile: m·n·forloop more
    accumulate = m * n * forloop if forloop > 1 else 0
    assert cost.flops == 2 * m * n * k + accumulate
    assert cost.blocks == grid[0] * grid[1]
    assert cost.dram_read_bytes == (m * k + n * k) * 2
    assert cost.dram_write_bytes == m * n * 4
    # x is re-read by each of the grid[0] column blocks, w by each of the grid[1] row blocks
    assert cost.tile_load_bytes == (grid[0] * m * k + grid[1] * n * k) * 2


def test_same_operand_twice_counts_once() -> None:
    text = """
    func.func @f(%x: tensor<8x64xf32>) -> tensor<8x64xf32> {
      %y = mugraph.graph_def grid [2, 1, 1] threads 32 forloop 1 (%x, %x) : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32> {
      ^bb0(%a: tensor<8x64xf32>, %b: tensor<8x64xf32>, %ya: tensor<8x64xf32>):
        %at = mugraph.input %a imap [1, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<8x32xf32>
        %bt = mugraph.input %b imap [0, -1, -1] fmap -1 : tensor<8x64xf32> -> tensor<4x64xf32>
        %bs = mugraph.reduce "sum" %bt dim 0 keepdim : tensor<4x64xf32> -> tensor<1x64xf32>
        %s = mugraph.reduce "max" %at dim 1 keepdim : tensor<8x32xf32> -> tensor<8x1xf32>
        %yt = mugraph.binary "add" %at, %s : (tensor<8x32xf32>, tensor<8x1xf32>) -> tensor<8x32xf32>
        mugraph.output %yt to %ya omap [1, -1, -1] : tensor<8x32xf32> -> tensor<8x64xf32>
      }
      func.return %y : tensor<8x64xf32>
    }
    """
    (kernel,) = _kernels(_parse(text))
    cost = cm.kernel_cost(kernel)
    (read,) = cost.reads
    assert (read.name, read.operand, read.bytes, read.fraction) == ("x", 0, 8 * 64 * 4, 1.0)
    assert read.tile_load_bytes == 2 * (8 * 32 + 4 * 64) * 4
    # per block: Σ over 4x64 (256), max over 8x32 (256), add 8x32 (256)
    assert cost.flops == 2 * 3 * 256


def test_library_kernels() -> None:
    text = """
    func.func @f(%t: tensor<1000x64xbf16>, %ids: tensor<4xi32>, %w: tensor<128x64xbf16>) -> tensor<4x128xbf16> {
      %e = mugraph.kernel "embedding" (%t, %ids) : (tensor<1000x64xbf16>, tensor<4xi32>) -> tensor<4x64xbf16>
      %y = mugraph.kernel "linear" (%e, %w) : (tensor<4x64xbf16>, tensor<128x64xbf16>) -> tensor<4x128xbf16>
      %s = mugraph.kernel "silu" (%y) : (tensor<4x128xbf16>) -> tensor<4x128xbf16>
      func.return %s : tensor<4x128xbf16>
    }
    """
    emb, lin, silu = (cm.kernel_cost(k) for k in _kernels(_parse(text)))
    assert emb.read("t").bytes == 4 * 64 * 2  # only the gathered rows
    assert emb.read("t").fraction == pytest.approx(4 / 1000)
    assert emb.read("ids").bytes == 16 and emb.flops == 0
    assert (lin.dram_read_bytes, lin.dram_write_bytes) == ((4 * 64 + 128 * 64) * 2, 4 * 128 * 2)
    assert lin.flops == 2 * 4 * 128 * 64
    assert silu.flops == cm.UNARY_FLOPS["silu"] * 4 * 128
    assert all(
        c.kind == k for c, k in zip((emb, lin, silu), ("embedding", "linear", "silu"), strict=True)
    )
    with pytest.raises(TypeError, match="not a mugraph kernel"):
        cm.kernel_cost(func.ReturnOp())


def test_time_estimate() -> None:
    target = cm.Target(num_sms=4, bandwidth=1e9, peak_flops=1e9, kernel_overhead_s=1e-6)
    memory_bound = cm.KernelCost("k", 3000, 1000, 0, 10, blocks=4)
    assert memory_bound.est_seconds(target) == pytest.approx(4e-6 + 1e-6)
    compute_bound = cm.KernelCost("k", 10, 0, 0, 8000, blocks=4)
    assert compute_bound.est_seconds(target) == pytest.approx(8e-6 + 1e-6)
    # 5 blocks on 4 SMs take two waves, filling 5 of 8 slots
    assert cm.KernelCost("k", 4000, 0, 0, 0, blocks=5).est_seconds(target) == pytest.approx(
        4e-6 * 8 / 5 + 1e-6
    )


# ------------------------------------------------------------------------------------------------
# The pass
# ------------------------------------------------------------------------------------------------


def _cost_attr(op: Operation) -> dict[str, float]:
    attr = op.attributes[COST_ATTR]
    assert isinstance(attr, DictionaryAttr)
    out: dict[str, float] = {}
    for key, value in attr.data.items():
        assert isinstance(value, IntegerAttr | FloatAttr)
        out[key] = value.value.data
    return out


def test_pass_is_registered_with_typed_options() -> None:
    cls = get_all_passes()["mugraph-stats"]()
    assert cls is MugraphStatsPass
    p = MugraphStatsPass(num_sms=48, bandwidth_gbs=1000.0, peak_tflops=100.0)
    assert p.target() == cm.Target(48, 1e12, 1e14)


def test_pass_annotates_kernels_and_functions() -> None:
    module = _parse(_chunk("rms_norm_linear") + _chunk("argmax"))
    MugraphStatsPass().apply(make_context(), module)
    module.verify()
    (kernel, *_) = _kernels(module)
    assert _cost_attr(kernel) == {
        "read_bytes": X + G + W,
        "write_bytes": Y,
        "tile_load_bytes": 48 * (X + G) + W,
        "flops": cm.kernel_cost(kernel).flops,
        "blocks": 48,
    }
    funcs = [op for op in module.ops if isinstance(op, func.FuncOp)]
    totals = [_cost_attr(f) for f in funcs]
    assert [t["kernels"] for t in totals] == [1, 2]
    costs = cm.module_costs(module)
    assert totals[1]["est_us"] == pytest.approx(costs["argmax"].est_us, abs=1e-3)
    assert totals[1]["read_bytes"] == costs["argmax"].dram_read_bytes


def test_pass_output_round_trips_and_is_deterministic() -> None:
    text = _chunk("gated_mlp") + _chunk("decode_attention") + _chunk("library")
    first = _parse(text)
    MugraphStatsPass().apply(make_context(), first)
    printed = str(first)
    again = _parse(printed)
    assert str(again) == printed
    MugraphStatsPass().apply(make_context(), again)  # re-running overwrites, same numbers
    assert str(again) == printed
    second = _parse(text)
    MugraphStatsPass().apply(make_context(), second)
    assert str(second) == printed


# ------------------------------------------------------------------------------------------------
# After nn-to-mugraph
# ------------------------------------------------------------------------------------------------

needs_lowering = pytest.mark.skipif(
    "nn-to-mugraph" not in get_all_passes(),
    reason="the nn-to-mugraph pass (passes/nn_to_mugraph.py) is not registered yet",
)


def _lower(path: Path) -> ModuleOp:
    module = _parse(path.read_text())
    get_all_passes()["nn-to-mugraph"]()().apply(make_context(), module)
    module.verify()
    return module


@needs_lowering
def test_lowered_rms_norm_linear_is_one_kernel_reading_each_tensor_once() -> None:
    module = _lower(EXAMPLES / "rmsnorm_linear.mlir")
    total = cm.module_cost(module)
    assert total.kernels == 1
    (kernel,) = total.per_kernel
    x, g, w, y = 8 * 512 * 2, 512 * 2, 1024 * 512 * 2, 8 * 1024 * 2
    assert sorted((r.name, r.bytes, r.fraction) for r in kernel.reads) == [
        ("g", g, 1.0),
        ("w", w, 1.0),
        ("x", x, 1.0),
    ]
    assert kernel.dram_read_bytes == x + g + w
    assert kernel.dram_write_bytes == y


@needs_lowering
@pytest.mark.parametrize(
    "name", sorted(p.stem for p in EXAMPLES.glob("*.mlir") if p.stem != "llama3_8b_block")
)
def test_lowered_examples_have_sane_costs(name: str) -> None:
    module = _lower(EXAMPLES / f"{name}.mlir")
    total = cm.module_cost(module)
    assert total.kernels >= 1 and total.est_seconds > 0
    for kernel in total.per_kernel:
        for read in kernel.reads:
            assert 0 <= read.bytes <= read.tensor_bytes
            # shared memory loads every byte global memory delivers at least once
            assert read.tile_load_bytes >= read.bytes
