"""nn-to-mugraph's split-K: few output blocks split K across grid z, and a reduce kernel sums
the f32 partials; every form agrees with the nn reference."""

from __future__ import annotations

import pytest
from mugraph_checks import EXAMPLES, QKV_VIEWS, check_agrees, kernels, lower
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, TensorType, f32, i64
from xdsl.ir import SSAValue

from mk.diagnostics import MkError
from mk.dialects import mugraph as mg
from mk.source import load_module


def split_and_reduce(module: ModuleOp) -> tuple[mg.GraphDefOp, mg.GraphDefOp]:
    split, reduce = [k for k in kernels(module) if isinstance(k, mg.GraphDefOp)][-2:]
    assert list(reduce.args)[: len(split.results)] == list(split.results)
    return split, reduce


def test_rmsnorm_linear_splits_k_when_blocks_are_few() -> None:
    lowered = check_agrees(load_module(EXAMPLES / "rmsnorm_linear.mlir"))
    split, reduce = kernels(lowered)  # type: ignore[misc]
    assert isinstance(split, mg.GraphDefOp) and isinstance(reduce, mg.GraphDefOp)
    # 16 column blocks on 132 SMs; K = 8 iterations: 4 splits of 2 (each split >= 2 iterations)
    assert split.grid_shape() == (16, 1, 4) and split.forloop_range() == 2
    assert split.res[0].type == TensorType(f32, (4, 8, 1024))
    assert split.attributes["mk.split_k"] == IntegerAttr(4, i64)
    # the reduce kernel recomputes Σx² from x (blocks of one column tile see only their K split)
    assert reduce.grid_shape() == (16, 1, 1) and reduce.forloop_range() == 8
    accums = [op.kind.data for op in reduce.body.ops if isinstance(op, mg.AccumOp)]
    assert accums == ["sum_sq_last"]
    assert any(isinstance(op, mg.ReduceOp) for op in reduce.body.ops)


def test_filled_sms_do_not_split() -> None:
    lowered = lower(load_module(EXAMPLES / "rmsnorm_linear.mlir"), num_sms=16)
    assert len(kernels(lowered)) == 1
    lowered = lower(load_module(EXAMPLES / "rmsnorm_linear.mlir"), num_sms=32)
    assert [k.grid_shape() for k in kernels(lowered)] == [(16, 1, 2), (16, 1, 1)]  # type: ignore[union-attr]


SPLIT_K_EPILOGUE = """
func.func @f(%x: tensor<2x3x512xbf16>, %g: tensor<512xbf16>, %w1: tensor<128x512xbf16>, %w3: tensor<128x512xbf16>, %r: tensor<3x128xbf16>) -> tensor<2x3x2x1x64xbf16> {
  %h = nn.rms_norm %x, %g {epsilon = 1.0e-05 : f32} : (tensor<2x3x512xbf16>, tensor<512xbf16>) -> tensor<2x3x512xbf16>
  %a = nn.linear %h, %w1 : (tensor<2x3x512xbf16>, tensor<128x512xbf16>) -> tensor<2x3x128xbf16>
  %b = nn.linear %h, %w3 : (tensor<2x3x512xbf16>, tensor<128x512xbf16>) -> tensor<2x3x128xbf16>
  %s = nn.silu %a : (tensor<2x3x128xbf16>) -> tensor<2x3x128xbf16>
  %m = nn.mul %s, %b : (tensor<2x3x128xbf16>, tensor<2x3x128xbf16>) -> tensor<2x3x128xbf16>
  %y = nn.add %m, %r : (tensor<2x3x128xbf16>, tensor<3x128xbf16>) -> tensor<2x3x128xbf16>
  %v = nn.reshape %y : (tensor<2x3x128xbf16>) -> tensor<2x3x2x1x64xbf16>
  func.return %v : tensor<2x3x2x1x64xbf16>
}"""

VECTOR_LINEAR = """
func.func @f(%x: tensor<256xf32>, %b: tensor<48x256xf32>, %c: tensor<48xf32>) -> tensor<48xf32> {
  %y = nn.linear %x, %b : (tensor<256xf32>, tensor<48x256xf32>) -> tensor<48xf32>
  %z = nn.mul %y, %c : (tensor<48xf32>, tensor<48xf32>) -> tensor<48xf32>
  func.return %z : tensor<48xf32>
}"""


@pytest.mark.parametrize("splits", [0, 2, 3, 4, 16])
def test_split_k_norm_epilogue_and_view_agree(splits: int) -> None:
    lowered = check_agrees(load_module(SPLIT_K_EPILOGUE), k_splits=splits, tile_k=32)
    split, reduce = split_and_reduce(lowered)
    want = {0: 8, 2: 2, 3: 2, 4: 4, 16: 16}[splits]  # auto: 2 blocks, 16 iterations -> 8
    assert split.grid_shape()[2] == want and split.forloop_range() == 16 // want
    assert reduce.attributes["mk.split_k_reduce"] == IntegerAttr(want, i64)
    assert all(tensor_element(r) == f32 for r in split.results)


def assert_norm_scale_in_the_epilogue(kernel: mg.GraphDefOp) -> None:
    """A fused RMSNorm is a Σx² accumulator read only by the output thread_maps, each of which
    turns it into rsqrt(Σx²/K + ε) itself: no mean accumulator (its division loop) and no
    thread_map of the scale alone (its loop and the barrier behind it)."""
    accums = [op for op in kernel.body.ops if isinstance(op, mg.AccumOp)]
    assert "mean_sq_last" not in [op.kind.data for op in accums]
    (sum_sq,) = [op.res for op in accums if op.kind.data == "sum_sq_last"]
    maps = [op for op in kernel.body.ops if isinstance(op, mg.ThreadMapOp)]
    assert all(len(m.operands) > 1 for m in maps)  # none is the scale alone
    readers = {u.operation for u in sum_sq.uses}
    assert readers and all(isinstance(r, mg.ThreadMapOp) for r in readers)
    for m in readers:
        arg = m.body.block.args[list(m.operands).index(sum_sq)]
        (div,) = [u.operation for u in arg.uses]  # Σx² / K, then + ε, then rsqrt
        assert div.name == "arith.divf"
        (add,) = [u.operation for u in div.results[0].uses]
        (rsqrt,) = [u.operation for u in add.results[0].uses]
        assert add.name == "arith.addf" and rsqrt.name == "math.rsqrt"
    outputs = [op for op in kernel.body.ops if isinstance(op, mg.OutputOp)]
    assert len(readers) == len(outputs)


@pytest.mark.parametrize(
    ("src", "options"),
    [
        (None, {"k_splits": 1}),
        (None, {"k_splits": 0}),
        (QKV_VIEWS, {}),
        (SPLIT_K_EPILOGUE, {"k_splits": 1}),
        (SPLIT_K_EPILOGUE, {"k_splits": 2, "tile_k": 32}),
    ],
)
def test_rms_norm_scale_folds_into_the_output_thread_map(
    src: str | None, options: dict[str, int]
) -> None:
    module = load_module(EXAMPLES / "rmsnorm_linear.mlir") if src is None else load_module(src)
    lowered = check_agrees(module, **options)  # the NumPy reference, within tolerance
    graphs = [k for k in kernels(lowered) if isinstance(k, mg.GraphDefOp)]
    if options.get("k_splits") != 1:
        split, reduce = split_and_reduce(lowered)
        assert not any(isinstance(op, mg.AccumOp) and "sq" in op.kind.data for op in split.body.ops)
        graphs = [reduce]
    for kernel in graphs:
        assert_norm_scale_in_the_epilogue(kernel)


@pytest.mark.parametrize("options", [{}, {"tile_k": 16, "tile_n": 16}, {"k_splits": 16}])
def test_split_k_vector_linear_agrees(options: dict[str, int]) -> None:
    lowered = check_agrees(load_module(VECTOR_LINEAR), **options)
    split, _ = split_and_reduce(lowered)
    assert split.grid_shape()[2] > 1


BATCHED_MATMUL = """
func.func @f(%a: tensor<2x4x256xbf16>, %b: tensor<2x256x32xbf16>) -> tensor<2x4x32xbf16> {
  %y = nn.matmul %a, %b : (tensor<2x4x256xbf16>, tensor<2x256x32xbf16>) -> tensor<2x4x32xbf16>
  func.return %y : tensor<2x4x32xbf16>
}"""


def test_split_k_batched_matmul_agrees() -> None:
    lowered = check_agrees(load_module(BATCHED_MATMUL), tile_k=32, num_sms=8)
    split, _ = split_and_reduce(lowered)
    assert split.grid_shape() == (1, 1, 4) and split.res[0].type == TensorType(f32, (4, 2, 4, 32))


def test_split_k_rows_split_agrees() -> None:
    text = """
    func.func @f(%x: tensor<128x256xbf16>, %w: tensor<64x256xbf16>) -> tensor<128x64xbf16> {
      %y = nn.linear %x, %w : (tensor<128x256xbf16>, tensor<64x256xbf16>) -> tensor<128x64xbf16>
      func.return %y : tensor<128x64xbf16>
    }"""
    lowered = check_agrees(load_module(text), tile_k=32, tile_n=32)
    split, reduce = split_and_reduce(lowered)
    assert split.grid_shape() == (2, 2, 4) and reduce.grid_shape() == (2, 2, 1)


def test_split_k_is_deterministic() -> None:
    text = (EXAMPLES / "llama3_8b_block.mlir").read_text()
    first, second = (str(lower(load_module(text))) for _ in range(2))
    assert first == second and "mk.split_k = 2" in first


def test_negative_k_splits_is_an_error() -> None:
    with pytest.raises(MkError, match="k-splits must be >= 0"):
        lower(load_module(EXAMPLES / "rmsnorm_linear.mlir"), k_splits=-1)


def tensor_element(value: object) -> object:
    assert isinstance(value, SSAValue) and isinstance(value.type, TensorType)
    return value.type.element_type
