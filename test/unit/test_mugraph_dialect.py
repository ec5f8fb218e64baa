"""mugraph dialect: Python builders, verifier, print/parse round trip and the tile-map helpers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from xdsl.dialects import arith, func, math
from xdsl.dialects.builtin import (
    FloatAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    TensorType,
    bf16,
    f32,
    i64,
)
from xdsl.ir import SSAValue
from xdsl.utils.exceptions import VerifyException

from mk.diagnostics import parse_module
from mk.dialects import make_context
from mk.dialects import mugraph as mg
from mk.dialects import mugraph_maps as maps
from mk.dialects.mugraph_base import Phase, Phases
from mk.dialects.mugraph_builder import BlockGraphBuilder
from mk.dialects.mugraph_tiles import (
    AccumOp,
    AccumSoftmaxOp,
    BinaryOp,
    MatmulOp,
    ReshapeOp,
    UnaryOp,
)

OPS_MLIR = Path(__file__).parents[1] / "lit" / "dialects" / "mugraph" / "ops.mlir"


def _chunk(name: str) -> str:
    """The split-input-file chunk of ops.mlir that defines func @name."""
    for chunk in OPS_MLIR.read_text().split("// -----"):
        if f"func.func @{name}(" in chunk:
            return chunk
    raise KeyError(name)


def _parse(text: str) -> ModuleOp:
    module = parse_module(make_context(), text, "<t>")
    module.verify()
    return module


def _named(op_result: SSAValue, name: str) -> SSAValue:
    op_result.name_hint = name
    return op_result


def build_rms_norm_linear(
    m: int = 8, k: int = 4096, n: int = 6144, grid: int = 48, forloop: int = 64
) -> ModuleOp:
    """Mirage's fused RMSNorm+Linear, built with the Python API (same graph as in ops.mlir)."""
    tx, tg, tw, ty = (TensorType(bf16, s) for s in ([m, k], [k], [n, k], [m, n]))
    fn = func.FuncOp("rms_norm_linear", ((tx, tg, tw), (ty,)))
    for arg, name in zip(fn.args, "xgw", strict=True):
        arg.name_hint = name
    b = BlockGraphBuilder(fn.args, [ty], (grid, 1, 1), 128, forloop, ("xa", "ga", "wa"), ("ya",))
    xt = b.input(0, (-1, -1, -1), fmap=1, name="xt")
    gt = b.input(1, (-1, -1, -1), fmap=0, name="gt")
    wt = b.input(2, (0, -1, -1), fmap=1, name="wt")
    xg = b.add(BinaryOp("mul", xt, gt, elem=bf16), "xg").res
    p = b.add(MatmulOp(xg, wt, transpose_b=True), "p").res
    acc = b.add(AccumOp("sum", p), "acc").res
    ms = b.add(AccumOp("mean_sq_last", xt), "ms").res

    def rsqrt_eps(mean_sq: SSAValue) -> list[SSAValue]:
        mean_sq.name_hint = "m"
        eps = _named(arith.ConstantOp(FloatAttr(1e-6, f32)).result, "eps")
        total = _named(arith.AddfOp(mean_sq, eps).result, "sum")
        return [_named(math.RsqrtOp(total).result, "r")]

    rs = b.thread_map([ms], [ms.type], rsqrt_eps, "rs").res[0]
    yt = b.add(BinaryOp("mul", acc, rs, elem=bf16), "yt").res
    b.output(yt, 0, (1, -1, -1))
    kernel = b.finish()
    kernel.results[0].name_hint = "y"
    fn.body.block.add_ops([kernel, func.ReturnOp(kernel.results[0])])
    return ModuleOp([fn])


def _graph(module: ModuleOp, index: int = 0) -> mg.GraphDefOp:
    return [op for op in module.walk() if isinstance(op, mg.GraphDefOp)][index]


def test_builder_verifies_and_prints_the_lit_text() -> None:
    module = build_rms_norm_linear()
    module.verify()
    assert str(module) == str(_parse(_chunk("rms_norm_linear")))


def test_printed_form_reparses_to_the_same_ir() -> None:
    module = build_rms_norm_linear()
    text = str(module)
    again = _parse(text)
    assert str(again) == text
    assert again.is_structurally_equivalent(module)


def test_every_ops_mlir_chunk_is_a_print_fixed_point() -> None:
    for chunk in OPS_MLIR.read_text().split("// -----"):
        printed = str(_parse(chunk))
        assert str(_parse(printed)) == printed


def test_graph_accessors() -> None:
    g = _graph(build_rms_norm_linear())
    assert g.grid_shape() == (48, 1, 1)
    assert g.thread_count() == 128
    assert g.forloop_range() == 64
    assert [i.source_index() for i in g.input_ops()] == [0, 1, 2]
    assert [i.tile_shape() for i in g.input_ops()] == [(8, 64), (64,), (128, 64)]
    assert [o.result_index() for o in g.output_ops()] == [0]
    assert len(list(g.blocks())) == 48
    assert list(maps.grid_blocks((2, 2, 1))) == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]


def test_loop_and_epilogue_split() -> None:
    g = _graph(build_rms_norm_linear())
    loop = [(op.name, op.results[0].name_hint) for op in g.loop_ops()]
    epilogue = [op.name for op in g.epilogue_ops()]
    assert loop == [
        ("mugraph.input", "xt"),
        ("mugraph.input", "gt"),
        ("mugraph.input", "wt"),
        ("mugraph.binary", "xg"),
        ("mugraph.matmul", "p"),
        ("mugraph.accum", "acc"),
        ("mugraph.accum", "ms"),
    ]
    assert epilogue == ["mugraph.thread_map", "mugraph.binary", "mugraph.output"]


def test_phases_of_fmap_minus_one_inputs_are_invariant() -> None:
    g = _graph(_parse(_chunk("gated_mlp")), 1)
    phases = Phases(g.body.block)
    by_name = {r.name_hint: phases.of(r) for op in g.body.block.ops for r in op.results}
    assert by_name["rt"] == Phase.INVARIANT  # the residual: same tile in every iteration
    assert by_name["ht"] == Phase.LOOP
    assert by_name["p"] == Phase.LOOP
    assert by_name["acc"] == Phase.EPILOGUE
    assert by_name["yt"] == Phase.EPILOGUE


def test_tile_slices_on_concrete_blocks() -> None:
    g = _graph(build_rms_norm_linear())
    x, gamma, w = g.input_ops()
    out = g.output_ops()[0]
    assert x.tile_slices((5, 0, 0), 3) == (slice(0, 8), slice(192, 256))
    assert gamma.tile_slices((5, 0, 0), 3) == (slice(192, 256),)
    assert w.tile_slices((5, 0, 0), 3) == (slice(640, 768), slice(192, 256))
    assert w.tile_slices((47, 0, 0), 63) == (slice(6016, 6144), slice(4032, 4096))
    assert out.tile_slices((5, 0, 0)) == (slice(0, 8), slice(640, 768))
    assert w.block_slices((5, 0, 0)) == (slice(640, 768), slice(0, 4096))


def test_tile_slices_when_grid_and_loop_split_one_dim() -> None:
    # Split-KV attention: grid y splits the 4096 keys in 4, the loop walks 64 of a split's 1024.
    g = _graph(_parse(_chunk("decode_attention")))
    q, k, _ = g.input_ops()
    assert q.tile_slices((3, 2, 0), 5) == (slice(0, 1), slice(12, 16), slice(0, 1), slice(0, 128))
    assert k.tile_slices((3, 2, 0), 5) == (
        slice(0, 1),
        slice(3, 4),
        slice(2368, 2432),
        slice(0, 128),
    )
    o, m, _ = g.output_ops()
    assert o.tile_slices((3, 2, 0)) == (
        slice(2, 3),
        slice(0, 1),
        slice(12, 16),
        slice(0, 1),
        slice(0, 128),
    )
    assert m.tile_slices((7, 3, 0))[:3] == (slice(3, 4), slice(0, 1), slice(28, 32))


def test_position_and_argmax_partials() -> None:
    g = _graph(_parse(_chunk("argmax")))
    pos = next(op for op in g.body.block.ops if isinstance(op, mg.PositionOp))
    assert pos.positions((3, 0, 0), 0) == range(6144, 8192)
    outs = g.output_ops()
    assert [o.tile_slices((3, 0, 0)) for o in outs] == [(slice(0, 8), slice(3, 4))] * 2


def _run_linear(x: np.ndarray, w: np.ndarray, g: mg.GraphDefOp) -> np.ndarray:
    """x @ w.T evaluated block by block and iteration by iteration through the tile slices."""
    xin, win = (op for op in g.input_ops() if op.source_index() in (0, 2))
    out = g.output_ops()[0]
    y = np.full((x.shape[0], w.shape[0]), np.nan)
    for block in g.blocks():
        acc = 0.0
        for i in range(g.forloop_range()):
            acc = acc + x[xin.tile_slices(block, i)] @ w[win.tile_slices(block, i)].T
        y[out.tile_slices(block)] = acc
    return y


def test_slices_reassemble_the_full_computation() -> None:
    rng = np.random.default_rng(0)
    module = build_rms_norm_linear(m=4, k=48, n=24, grid=3, forloop=4)
    module.verify()
    x, w = rng.standard_normal((4, 48)), rng.standard_normal((24, 48))
    np.testing.assert_allclose(_run_linear(x, w, _graph(module)), x @ w.T, rtol=1e-12)


def test_a_changed_map_is_caught_by_the_verifier() -> None:
    module = build_rms_norm_linear(m=4, k=48, n=24, grid=3, forloop=4)
    x_in = _graph(module).input_ops()[0]
    x_in.fmap = IntegerAttr(-1, i64)  # x would be read whole every iteration instead of walked
    with pytest.raises(
        VerifyException, match="tile type is tensor<4x12xbf16>, but the maps give tensor<4x48xbf16>"
    ):
        module.verify()


def test_verifier_rejects_a_wrong_tile_type_built_in_python() -> None:
    g = _graph(build_rms_norm_linear())
    w_in = g.input_ops()[2]
    bad = mg.InputOp(w_in.source, w_in.imap_dims(), w_in.fmap_dim(), TensorType(bf16, [64, 64]))
    g.body.block.insert_op_before(bad, w_in)
    with pytest.raises(
        VerifyException,
        match="tile type is tensor<64x64xbf16>, but the maps give tensor<128x64xbf16>",
    ):
        bad.verify()


def test_verifier_rejects_epilogue_use_of_a_loop_tile() -> None:
    g = _graph(build_rms_norm_linear())
    xt = g.input_ops()[0].tile
    ms = next(op for op in g.body.block.ops if isinstance(op, AccumOp) and op.res.name_hint == "ms")
    mixed = BinaryOp("mul", xt, ms.res)
    g.body.block.add_op(mixed)
    with pytest.raises(
        VerifyException, match="uses accumulator result %ms and per-iteration tile %xt"
    ):
        mixed.verify()
    assert Phases(g.body.block).ops[mixed] == Phase.EPILOGUE


def test_kernel_op_kinds_and_arity() -> None:
    t = TensorType(bf16, [8, 64])
    fn = func.FuncOp("f", ((t, TensorType(bf16, [64])), (t,)))
    ok = mg.KernelOp("rms_norm", fn.args, [t], {"epsilon": FloatAttr(1e-6, f32)})
    bad_kind = mg.KernelOp("softplus", fn.args[:1], [t])
    bad_arity = mg.KernelOp("silu", fn.args, [t])
    fn.body.block.add_ops([ok, bad_kind, bad_arity, func.ReturnOp(ok.res[0])])
    ok.verify()
    with pytest.raises(VerifyException, match="unknown library kernel kind 'softplus'"):
        bad_kind.verify()
    with pytest.raises(VerifyException, match="'silu' takes 1 operands, got 2"):
        bad_arity.verify()
    assert ok.kind == StringAttr("rms_norm")


def test_accum_softmax_and_reshape_builders_infer_types() -> None:
    module = _parse(_chunk("decode_attention"))
    g = _graph(module)
    s = next(op for op in g.body.block.ops if isinstance(op, UnaryOp)).res
    v2 = next(
        op for op in g.body.block.ops if isinstance(op, ReshapeOp) and op.res.name_hint == "v2"
    ).res
    built = AccumSoftmaxOp(s, v2)
    assert [str(r.type) for r in built.results] == [
        "tensor<4x128xf32>",
        "tensor<4x1xf32>",
        "tensor<4x1xf32>",
    ]
    assert ReshapeOp(v2, [1, 64, 128]).res.type == TensorType(bf16, [1, 64, 128])


def test_map_errors() -> None:
    with pytest.raises(maps.MapError, match="block \\[3, 0, 0\\] is outside grid \\[3, 1, 1\\]"):
        maps.input_tile_slices((6, 6), (3, 1, 1), (0, -1, -1), -1, 1, (3, 0, 0), 0)
    with pytest.raises(maps.MapError, match="iteration 2 is outside forloop range 2"):
        maps.input_tile_slices((6, 6), (3, 1, 1), (0, -1, -1), 1, 2, (0, 0, 0), 2)
    with pytest.raises(maps.MapError, match="fmap is dim 2, but the tensor has rank 2"):
        maps.input_tile_shape((6, 6), (1, 1, 1), (-1, -1, -1), 2, 1)
    assert maps.broadcast_shapes((8, 1), (64,)) == (8, 64)
    assert maps.broadcast_shapes((8, 2), (3,)) is None
    assert maps.matmul_shape((2, 1, 4, 8), (3, 8, 5), transpose_b=False) == (2, 3, 4, 5)


@st.composite
def _mapped_tensor(
    draw: st.DrawFn,
) -> tuple[tuple[int, ...], tuple[int, int, int], tuple[int, ...], int, int]:
    """A tensor shape with a grid, an imap, an fmap and a forloop that divide it."""
    rank = draw(st.integers(1, 3))
    dims = draw(st.permutations(range(rank)))
    imap = [-1, -1, -1]
    for axis in draw(st.lists(st.integers(0, 2), unique=True, max_size=rank)):
        imap[axis] = dims.pop()
    grid = [draw(st.integers(1, 3)) if d >= 0 else draw(st.integers(1, 2)) for d in imap]
    fmap = draw(st.integers(-1, rank - 1))
    forloop = draw(st.integers(1, 3)) if fmap >= 0 else draw(st.integers(1, 2))
    shape = [draw(st.integers(1, 3)) for _ in range(rank)]
    for axis, d in enumerate(imap):
        if d >= 0:
            shape[d] *= grid[axis]
    if fmap >= 0:
        shape[fmap] *= forloop
    return tuple(shape), (grid[0], grid[1], grid[2]), tuple(imap), fmap, forloop


@settings(max_examples=60, deadline=None)
@given(_mapped_tensor())
def test_input_slices_cover_each_blocks_chunk_once_per_loop(case) -> None:
    shape, grid, imap, fmap, forloop = case
    tile = maps.input_tile_shape(shape, grid, imap, fmap, forloop)
    reads = np.zeros(shape, dtype=int)
    for block in maps.grid_blocks(grid):
        for i in range(forloop):
            sl = maps.input_tile_slices(shape, grid, imap, fmap, forloop, block, i)
            assert reads[sl].shape == tile
            reads[sl] += 1
    for block in maps.grid_blocks(grid):
        union = np.zeros(shape, dtype=bool)
        for i in range(forloop):
            union[maps.input_tile_slices(shape, grid, imap, fmap, forloop, block, i)] = True
        footprint = np.zeros(shape, dtype=bool)
        footprint[maps.input_block_slices(shape, grid, imap, block)] = True
        assert (union == footprint).all()
    # every element is read by each block that does not partition its dims, once per iteration
    # unless the loop walks a dim (then once over the loop)
    replicas = int(np.prod([g for g, d in zip(grid, imap, strict=True) if d < 0]))
    per_block = 1 if fmap >= 0 else forloop
    assert (reads == replicas * per_block).all()


@settings(max_examples=60, deadline=None)
@given(_mapped_tensor())
def test_output_slices_write_every_element_exactly_once(case) -> None:
    shape, grid, omap, _, _ = case
    grid = tuple(g if d >= 0 else 1 for g, d in zip(grid, omap, strict=True))
    writes = np.zeros(shape, dtype=int)
    for block in maps.grid_blocks(grid):
        writes[maps.output_tile_slices(shape, grid, omap, block)] += 1
    assert (writes == 1).all()
