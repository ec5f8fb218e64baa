"""nn-to-mugraph: every example and random nn programs compute the same before and after lowering."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xdsl.dialects.builtin import ModuleOp, TensorType, bf16, f32, i32
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Attribute, Block, Region, SSAValue

from mk.diagnostics import MkError
from mk.dialects import make_context
from mk.dialects import mugraph as mg
from mk.dialects import nn
from mk.inputs import random_inputs
from mk.interp.mugraph import run_mugraph
from mk.interp.nn import run_reference
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.source import entry_function, load_module

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL_EXAMPLES = sorted(p.name for p in EXAMPLES.glob("*.mlir") if p.name != "llama3_8b_block.mlir")


def lower(module: ModuleOp, **options: int) -> ModuleOp:
    NnToMugraphPass(**options).apply(make_context(), module)
    module.verify()
    return module


def kernels(module: ModuleOp) -> list[mg.KernelOp | mg.GraphDefOp]:
    return [op for op in module.walk() if isinstance(op, mg.KernelOp | mg.GraphDefOp)]


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    o, r = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert o.shape == r.shape
    same_nan = np.isnan(o) == np.isnan(r)
    assert same_nan.all(), "NaN in different places"
    o, r = np.nan_to_num(o, nan=0.0), np.nan_to_num(r, nan=0.0)
    same_inf = np.isinf(o) == np.isinf(r)
    assert same_inf.all(), "inf in different places"
    finite = np.isfinite(r)
    assert (o[~finite] == r[~finite]).all(), "infinities of different signs"
    o, r = o[finite], r[finite]
    return float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-30))


def tolerance(ref: np.ndarray) -> float:
    return 1e-5 if ref.dtype == np.float32 else 2e-2


def check_agrees(module: ModuleOp, seed: int = 0, **options: int) -> ModuleOp:
    """Run the nn reference, lower, run the mugraph interpreter on the same inputs, compare."""
    func = entry_function(module)
    inputs = random_inputs(func, seed)
    reference = run_reference(module, *inputs)
    lowered = lower(module, **options)
    assert not [op for op in lowered.walk() if op.dialect_name() == "nn"]
    outputs = run_mugraph(lowered, *inputs)
    for out, ref in zip(outputs, reference, strict=True):
        assert out.dtype == ref.dtype and out.shape == ref.shape
        if ref.dtype.kind in "iu":
            np.testing.assert_array_equal(out, ref)
        else:
            assert rel_error(out, ref) <= tolerance(ref), (rel_error(out, ref), str(lowered))
    return lowered


# ------------------------------------------------------------------------------------------------
# Examples
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SMALL_EXAMPLES)
@pytest.mark.parametrize("options", [{}, {"num_sms": 8, "tile_n": 32, "tile_k": 32, "kv_chunk": 16}])
def test_example_agrees_with_reference(name: str, options: dict[str, int]) -> None:
    check_agrees(load_module(EXAMPLES / name), **options)


def test_rmsnorm_linear_is_one_fused_kernel() -> None:
    lowered = lower(load_module(EXAMPLES / "rmsnorm_linear.mlir"))
    (kernel,) = kernels(lowered)
    assert isinstance(kernel, mg.GraphDefOp)
    assert kernel.grid_shape() == (16, 1, 1) and kernel.forloop_range() == 8
    accums = [op.kind.data for op in kernel.body.ops if isinstance(op, mg.AccumOp)]
    assert sorted(accums) == ["mean_sq_last", "sum"]
    assert [len(op.operands) for op in kernel.input_ops()] == [1, 1, 1]


def test_gated_mlp_is_fused_plus_down_projection() -> None:
    lowered = lower(load_module(EXAMPLES / "gated_mlp.mlir"))
    fused, down = kernels(lowered)
    assert isinstance(fused, mg.GraphDefOp) and isinstance(down, mg.GraphDefOp)
    assert fused.attributes["mk.fused"].data == "linear+linear+silu+mul"  # type: ignore[attr-defined]
    assert len([op for op in fused.body.ops if isinstance(op, mg.AccumOp)]) == 2
    assert any(isinstance(op, mg.ThreadMapOp) for op in fused.epilogue_ops())
    assert down.args[0] is fused.results[0]


def test_attention_splits_and_merges() -> None:
    lowered = lower(load_module(EXAMPLES / "attention_decode.mlir"), num_sms=8)
    split, merge = kernels(lowered)
    assert isinstance(split, mg.GraphDefOp) and isinstance(merge, mg.GraphDefOp)
    assert split.grid_shape() == (2, 2, 2) and split.forloop_range() == 2
    assert any(isinstance(op, mg.AccumSoftmaxOp) for op in split.body.ops)
    assert list(merge.args) == list(split.results)


def test_llama3_block_lowers_and_verifies() -> None:
    lowered = lower(load_module(EXAMPLES / "llama3_8b_block.mlir"))
    ks = kernels(lowered)
    assert sum(isinstance(k, mg.GraphDefOp) for k in ks) == 6
    assert len(ks) <= 13
    fused = [k.attributes["mk.fused"].data for k in ks if "mk.fused" in k.attributes]  # type: ignore[attr-defined]
    assert "rms_norm+linear+linear+silu+mul" in fused


def test_lowering_is_deterministic_and_keeps_the_signature() -> None:
    text = (EXAMPLES / "decoder_block.mlir").read_text()
    first, second = (lower(load_module(text)) for _ in range(2))
    assert str(first) == str(second)
    before = entry_function(load_module(text)).function_type
    assert entry_function(first).function_type == before


def test_odd_contraction_falls_back_to_one_iteration() -> None:
    text = """
    func.func @f(%x: tensor<3x5xf32>, %w: tensor<7x5xf32>) -> tensor<3x7xf32> {
      %y = nn.linear %x, %w : (tensor<3x5xf32>, tensor<7x5xf32>) -> tensor<3x7xf32>
      func.return %y : tensor<3x7xf32>
    }"""
    lowered = check_agrees(load_module(text), tile_k=4, tile_n=4)
    (kernel,) = kernels(lowered)
    assert isinstance(kernel, mg.GraphDefOp)
    assert kernel.forloop_range() == 1 and kernel.grid_shape() == (1, 1, 1)
    text = text.replace("x5x", "x6x")
    (kernel,) = kernels(check_agrees(load_module(text), tile_k=4, tile_n=7))
    assert isinstance(kernel, mg.GraphDefOp)
    assert kernel.forloop_range() == 2 and kernel.grid_shape() == (1, 1, 1)


def test_tile_k_option_sets_the_loop() -> None:
    lowered = lower(load_module(EXAMPLES / "rmsnorm_linear.mlir"), tile_k=32, tile_n=128)
    (kernel,) = kernels(lowered)
    assert isinstance(kernel, mg.GraphDefOp)
    assert kernel.forloop_range() == 16 and kernel.grid_shape() == (8, 1, 1)


def test_bad_option_is_a_located_error() -> None:
    with pytest.raises(MkError, match="tile-k must be >= 1"):
        lower(load_module(EXAMPLES / "rmsnorm_linear.mlir"), tile_k=0)


# ------------------------------------------------------------------------------------------------
# Random nn programs
# ------------------------------------------------------------------------------------------------

UNARY = (nn.NegOp, nn.ReluOp, nn.SigmoidOp, nn.SiluOp, nn.GeluOp, nn.SquareOp, nn.ExpOp)
BINARY = (nn.AddOp, nn.SubOp, nn.MulOp, nn.MaximumOp)


class ProgramBuilder:
    """Builds a random nn function op by op; new operands become function arguments."""

    def __init__(self, draw: st.DrawFn, dtype: Attribute) -> None:
        self.draw = draw
        self.dtype = dtype
        self.args: list[TensorType] = []
        self.block = Block()
        self.values: list[SSAValue] = []

    def arg(self, shape: Sequence[int], dtype: Attribute | None = None) -> SSAValue:
        ty = TensorType(dtype or self.dtype, shape)
        self.args.append(ty)
        value = self.block.insert_arg(ty, len(self.block.args))
        value.name_hint = f"a{len(self.block.args) - 1}"
        return value

    def add(self, op: nn.NNOp) -> SSAValue:
        self.block.add_op(op)
        op.result.name_hint = f"v{len(self.values)}"
        self.values.append(op.result)
        return op.result

    def pick(self, min_rank: int = 1) -> SSAValue:
        floats = [v for v in self.values if _shape(v) and len(_shape(v)) >= min_rank]
        floats = [v for v in floats if _elem(v) == self.dtype]
        if not floats:
            return self.arg(self.draw(_shapes(min_rank)))
        return self.draw(st.sampled_from(floats))

    def module(self, results: Sequence[SSAValue]) -> ModuleOp:
        self.block.add_op(ReturnOp(*results))
        from xdsl.dialects.builtin import FunctionType

        ftype = FunctionType.from_lists(self.args, [v.type for v in results])
        func = FuncOp("random", ftype, Region(self.block))
        return ModuleOp([func])


def _shape(v: SSAValue) -> tuple[int, ...]:
    assert isinstance(v.type, TensorType)
    return tuple(v.type.get_shape())


def _elem(v: SSAValue) -> Attribute:
    assert isinstance(v.type, TensorType)
    return v.type.element_type


def _shapes(min_rank: int = 1) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(1, 6), min_size=min_rank, max_size=3).map(tuple)


def _step_linear(p: ProgramBuilder) -> None:
    x = p.pick()
    n = p.draw(st.integers(1, 9))
    heads = p.draw(st.integers(1, 2))
    outs = [p.add(nn.LinearOp(x, p.arg((n, _shape(x)[-1])))) for _ in range(heads)]
    if heads == 2 and p.draw(st.booleans()):
        p.add(nn.MulOp(p.add(nn.SiluOp(outs[0])), outs[1]))


def _step_norm_linear(p: ProgramBuilder) -> None:
    x = p.pick()
    h = p.add(nn.RMSNormOp(x, p.arg(_shape(x)[-1:]), epsilon=1e-5))
    if p.draw(st.booleans()):
        p.add(nn.LinearOp(h, p.arg((p.draw(st.integers(1, 9)), _shape(x)[-1]))))


def _step_matmul(p: ProgramBuilder) -> None:
    a = p.pick(min_rank=2)
    k = _shape(a)[-1]
    p.add(nn.MatmulOp(a, p.arg((k, p.draw(st.integers(1, 7))))))


def _step_unary(p: ProgramBuilder) -> None:
    x = p.pick()
    op = p.draw(st.sampled_from(UNARY))
    if op is nn.ExpOp:
        x = p.add(nn.SigmoidOp(x))  # keeps exp chains bounded
    p.add(op(x))
    if p.draw(st.booleans()):
        p.add(nn.ScaleOp(p.values[-1], p.draw(st.sampled_from([0.5, -2.0]))))


def _step_binary(p: ProgramBuilder) -> None:
    a = p.pick()
    shape = _shape(a)
    kind = p.draw(st.sampled_from(["same", "row", "value"]))
    if kind == "row":
        b = p.arg(shape[-1:])
    else:
        same = [v for v in p.values if _shape(v) == shape and _elem(v) == p.dtype and v is not a]
        b = p.draw(st.sampled_from(same)) if kind == "value" and same else p.arg(shape)
    p.add(p.draw(st.sampled_from(BINARY))(a, b))


def _step_reduce(p: ProgramBuilder) -> None:
    x = p.pick()
    op = p.draw(st.sampled_from([nn.ReduceSumOp, nn.ReduceMaxOp, nn.ReduceMeanOp, nn.SoftmaxOp]))
    dim = p.draw(st.integers(-len(_shape(x)), len(_shape(x)) - 1))
    p.add(op(x, dim) if op is nn.SoftmaxOp else op(x, dim, p.draw(st.booleans())))


def _step_layout(p: ProgramBuilder) -> None:
    x = p.pick()
    shape = _shape(x)
    kind = p.draw(st.sampled_from(["reshape", "transpose", "slice", "concat"]))
    if kind == "reshape":
        p.add(nn.ReshapeOp(x, (math.prod(shape),) if len(shape) > 1 else (1, shape[0])))
    elif kind == "transpose":
        p.add(nn.TransposeOp(x, p.draw(st.permutations(range(len(shape))))))
    elif kind == "slice":
        sizes = [p.draw(st.integers(1, s)) for s in shape]
        offsets = [p.draw(st.integers(0, s - z)) for s, z in zip(shape, sizes, strict=True)]
        p.add(nn.SliceOp(x, offsets, sizes))
    else:
        p.add(nn.ConcatOp([x, p.arg(shape)], p.draw(st.integers(0, len(shape) - 1))))


def _step_attention(p: ProgramBuilder) -> None:
    b, hkv, group = (p.draw(st.integers(1, 2)) for _ in range(3))
    sq, s, d = p.draw(st.integers(1, 2)), p.draw(st.integers(2, 9)), p.draw(st.sampled_from([2, 4]))
    causal = p.draw(st.booleans()) and sq <= s
    q = p.arg((b, hkv * group, sq, d))
    if sq == 1 and p.draw(st.booleans()):
        q = p.add(nn.ReshapeOp(p.arg((b, hkv * group * d)), (b, hkv * group, 1, d)))
    k, v = p.arg((b, hkv, s, d)), p.arg((b, hkv, s, d))
    kv_len = p.arg((b,), i32) if p.draw(st.booleans()) else None
    out = p.add(nn.AttentionOp(q, k, v, kv_len, scale=0.5, causal=causal))
    if sq == 1 and p.draw(st.booleans()):
        p.add(nn.ReshapeOp(out, (b, hkv * group * d)))


STEPS = (
    _step_linear, _step_norm_linear, _step_matmul, _step_unary, _step_binary, _step_reduce,
    _step_layout, _step_attention,
)  # fmt: skip


@st.composite
def programs(draw: st.DrawFn) -> ModuleOp:
    p = ProgramBuilder(draw, draw(st.sampled_from([f32, bf16])))
    p.arg(draw(_shapes()))
    for _ in range(draw(st.integers(1, 5))):
        draw(st.sampled_from(STEPS))(p)
    if p.dtype == f32 and draw(st.booleans()):
        p.add(nn.ArgmaxOp(p.pick(), -1))
    results = [p.values[-1]] if p.values else []
    extra = [v for v in p.values[:-1] if v.uses and draw(st.booleans())]
    return p.module(results + extra[:1])


OPTIONS = st.fixed_dictionaries(
    {
        "num_sms": st.integers(1, 16),
        "tile_n": st.integers(1, 8),
        "tile_k": st.integers(1, 8),
        "kv_chunk": st.integers(1, 8),
        "kv_splits": st.integers(0, 3),
    }
)


@settings(
    max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(programs(), OPTIONS)
def test_random_programs_agree(module: ModuleOp, options: dict[str, int]) -> None:
    text = str(module)
    module = load_module(text)  # parsed and verified, as a user program would be
    check_agrees(module, seed=1, **options)
