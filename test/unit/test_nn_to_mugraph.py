"""nn-to-mugraph: every example and random nn programs compute the same before and after lowering."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from mugraph_checks import EXAMPLES, QKV_VIEWS, check_agrees, kernels, lower, rel_error
from nn_programs import OPTIONS, programs
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, TensorType, bf16, i64
from xdsl.dialects.func import FuncOp
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, result_def

from mk.diagnostics import MkError
from mk.dialects import make_context, nn
from mk.dialects import mugraph as mg
from mk.inputs import random_inputs
from mk.interp.mugraph import run_mugraph
from mk.interp.nn import run_reference
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.source import entry_function, load_module

SMALL_EXAMPLES = sorted(p.name for p in EXAMPLES.glob("*.mlir") if p.name != "llama3_8b_block.mlir")


# ------------------------------------------------------------------------------------------------
# Examples
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SMALL_EXAMPLES)
@pytest.mark.parametrize(
    "options", [{}, {"num_sms": 8, "tile_n": 32, "tile_k": 32, "kv_chunk": 16}]
)
def test_example_agrees_with_reference(name: str, options: dict[str, int]) -> None:
    check_agrees(load_module(EXAMPLES / name), **options)


def test_rmsnorm_linear_is_one_fused_kernel() -> None:
    lowered = lower(load_module(EXAMPLES / "rmsnorm_linear.mlir"), k_splits=1)
    (kernel,) = kernels(lowered)
    assert isinstance(kernel, mg.GraphDefOp)
    assert kernel.grid_shape() == (16, 1, 1) and kernel.forloop_range() == 8
    accums = [op.kind.data for op in kernel.body.ops if isinstance(op, mg.AccumOp)]
    assert sorted(accums) == ["sum", "sum_sq_last"]
    assert [len(op.operands) for op in kernel.input_ops()] == [1, 1, 1]


def test_gated_mlp_is_fused_plus_down_projection() -> None:
    lowered = lower(load_module(EXAMPLES / "gated_mlp.mlir"), k_splits=1)
    fused, down = kernels(lowered)
    assert isinstance(fused, mg.GraphDefOp) and isinstance(down, mg.GraphDefOp)
    assert fused.attributes["mk.fused"].data == "linear+linear+silu+mul"  # type: ignore[attr-defined]
    assert len([op for op in fused.body.ops if isinstance(op, mg.AccumOp)]) == 2
    assert any(isinstance(op, mg.ThreadMapOp) for op in fused.epilogue_ops())
    assert down.args[0] is fused.results[0]


MIRAGE_GATED_MLP = """
func.func @gated(%x: tensor<8x256xbf16>, %g: tensor<256xbf16>, %w1: tensor<512x256xbf16>, %w3: tensor<512x256xbf16>) -> tensor<8x512xbf16> {
  %h = nn.rms_norm %x, %g : (tensor<8x256xbf16>, tensor<256xbf16>) -> tensor<8x256xbf16>
  %a = nn.linear %h, %w1 : (tensor<8x256xbf16>, tensor<512x256xbf16>) -> tensor<8x512xbf16>
  %b = nn.linear %h, %w3 : (tensor<8x256xbf16>, tensor<512x256xbf16>) -> tensor<8x512xbf16>
  %s = nn.silu %a : (tensor<8x512xbf16>) -> tensor<8x512xbf16>
  %y = nn.mul %s, %b : (tensor<8x512xbf16>, tensor<8x512xbf16>) -> tensor<8x512xbf16>
  func.return %y : tensor<8x512xbf16>
}
"""


def test_mirage_gated_mlp_is_one_kernel() -> None:
    """Mirage's gated MLP, silu(norm(x)·W1ᵀ)·(norm(x)·W3ᵀ), is a single graph-defined kernel."""
    lowered = check_agrees(load_module(MIRAGE_GATED_MLP), k_splits=1)
    (kernel,) = kernels(lowered)
    assert isinstance(kernel, mg.GraphDefOp)
    assert kernel.attributes["mk.fused"].data == "rms_norm+linear+linear+silu+mul"  # type: ignore[attr-defined]


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
    # qkv, attention split (with q's RoPE folded in) + merge, o-proj + residual, norm + gate/up
    # + silu·mul, down + residual, RoPE of k (one block per head, its cache row after the
    # attention's reads);
    # qkv, o-proj and down have 64 column blocks on 132 SMs: each splits K in two + a reduce
    assert sum(isinstance(k, mg.GraphDefOp) for k in ks) == 10
    splits = [k.attributes["mk.split_k"] for k in ks if "mk.split_k" in k.attributes]
    assert splits == [IntegerAttr(2, i64)] * 3
    library = sorted(k.kind.data for k in ks if isinstance(k, mg.KernelOp))
    # v's head view is read through by its cache write: no reshape copy.
    assert library == ["cache_write", "cache_write", "step"]
    fused = [k.attributes["mk.fused"].data for k in ks if "mk.fused" in k.attributes]  # type: ignore[attr-defined]
    assert "rms_norm+linear+linear+silu+mul" in fused


ATTENTION_VIEWS = """
func.func @attention_views(%qf: tensor<1x256xf32>, %k: tensor<1x2x64x64xf32>, %v: tensor<1x2x64x64xf32>, %kv_len: tensor<1xi32>) -> tensor<1x256xf32> {
  %q = nn.reshape %qf : (tensor<1x256xf32>) -> tensor<1x4x1x64xf32>
  %o = nn.attention %q, %k, %v, %kv_len {scale = 0.125 : f32, causal = true} : (tensor<1x4x1x64xf32>, tensor<1x2x64x64xf32>, tensor<1x2x64x64xf32>, tensor<1xi32>) -> tensor<1x4x1x64xf32>
  %o2 = nn.reshape %o : (tensor<1x4x1x64xf32>) -> tensor<1x256xf32>
  func.return %o2 : tensor<1x256xf32>
}"""


@pytest.mark.parametrize("options", [{}, {"tile_n": 128}, {"tile_n": 16}])
def test_split_heads_reshape_folds_into_the_linear_output(options: dict[str, int]) -> None:
    lowered = check_agrees(load_module(QKV_VIEWS), **options)
    left = {64: 1, 128: 0, 16: 2}[options.get("tile_n", 64)]  # blocks of whole heads fold
    copies = [k.kind.data for k in kernels(lowered) if isinstance(k, mg.KernelOp)]
    assert copies == ["reshape"] * left


@pytest.mark.parametrize("options", [{}, {"kv_splits": 2, "kv_chunk": 16}, {"kv_splits": 4}])
def test_attention_reshapes_fold_and_masking_agrees(options: dict[str, int]) -> None:
    lowered = check_agrees(load_module(ATTENTION_VIEWS), **options)
    assert all(isinstance(k, mg.GraphDefOp) for k in kernels(lowered))


def test_fully_masked_causal_rows_are_zero() -> None:
    text = """
    func.func @f(%q: tensor<1x2x3x4xf32>, %k: tensor<1x1x8x4xf32>, %v: tensor<1x1x8x4xf32>, %n: tensor<1xi32>) -> tensor<1x2x3x4xf32> {
      %o = nn.attention %q, %k, %v, %n {scale = 0.5 : f32, causal = true} : (tensor<1x2x3x4xf32>, tensor<1x1x8x4xf32>, tensor<1x1x8x4xf32>, tensor<1xi32>) -> tensor<1x2x3x4xf32>
      func.return %o : tensor<1x2x3x4xf32>
    }"""
    module = load_module(text)
    q, k, v, _ = random_inputs(entry_function(module), 3)
    n = np.array([2], dtype=np.int32)  # query 0 sits at position -1: it sees no key
    reference = run_reference(module, q, k, v, n)[0]
    out = run_mugraph(lower(module, kv_splits=2, kv_chunk=2), q, k, v, n)[0]
    assert (reference[:, :, 0] == 0).all() and (out[:, :, 0] == 0).all()
    assert rel_error(out, reference) <= 1e-5


PREFILL_ATTENTION = """
func.func @f(%q: tensor<2x4x300x8xf32>, %k: tensor<2x2x320x8xf32>, %v: tensor<2x2x320x8xf32>, %n: tensor<2xi32>) -> tensor<2x4x300x8xf32> {
  %o = nn.attention %q, %k, %v, %n {scale = 0.35 : f32, causal = true} : (tensor<2x4x300x8xf32>, tensor<2x2x320x8xf32>, tensor<2x2x320x8xf32>, tensor<2xi32>) -> tensor<2x4x300x8xf32>
  func.return %o : tensor<2x4x300x8xf32>
}"""


@pytest.mark.parametrize("lengths", [(300, 300), (310, 305)])
def test_many_queries_take_query_blocks(lengths: tuple[int, int]) -> None:
    """A prefill's attention (300 queries, causal over a cache of 320 with kv_len): blocks of
    (KV head, 60 queries, batch row) walk all the keys, with no split and no merge, and agree
    with the reference, the queries sitting at the end of each row's kv_len."""
    module = load_module(PREFILL_ATTENTION)
    lowered = lower(load_module(PREFILL_ATTENTION), kv_chunk=32)
    (kernel,) = kernels(lowered)
    assert isinstance(kernel, mg.GraphDefOp) and kernel.grid_shape() == (2, 5, 2)
    assert kernel.forloop_range() == 10
    q, k, v, _ = random_inputs(entry_function(module), 4)
    n = np.array(lengths, dtype=np.int32)
    reference = run_reference(module, q, k, v, n)[0]
    assert rel_error(run_mugraph(lowered, q, k, v, n)[0], reference) <= 1e-5


def test_a_long_row_chain_takes_blocks_of_rows() -> None:
    """A prefill's QK-norm + RoPE over 200 positions of 4 heads: blocks of 50 rows of a head,
    each with its own rows of the RoPE tables."""
    text = """
    func.func @f(%x: tensor<1x4x200x16xf32>, %g: tensor<16xf32>, %c: tensor<200x8xf32>, %s: tensor<200x8xf32>) -> tensor<1x4x200x16xf32> {
      %n = nn.rms_norm %x, %g {epsilon = 1.0e-06 : f32} : (tensor<1x4x200x16xf32>, tensor<16xf32>) -> tensor<1x4x200x16xf32>
      %r = nn.rope %n, %c, %s : (tensor<1x4x200x16xf32>, tensor<200x8xf32>, tensor<200x8xf32>) -> tensor<1x4x200x16xf32>
      func.return %r : tensor<1x4x200x16xf32>
    }"""
    lowered = check_agrees(load_module(text))
    (kernel,) = kernels(lowered)
    assert isinstance(kernel, mg.GraphDefOp) and kernel.grid_shape() == (4, 4, 1)


def norm_linear(rows: int) -> str:
    x = f"tensor<{rows}x64xf32>"
    return f"""
    func.func @f(%x: {x}, %g: tensor<64xf32>, %w: tensor<32x64xf32>) -> tensor<{rows}x32xf32> {{
      %h = nn.rms_norm %x, %g {{epsilon = 1.0e-06 : f32}} : ({x}, tensor<64xf32>) -> {x}
      %y = nn.linear %h, %w : ({x}, tensor<32x64xf32>) -> tensor<{rows}x32xf32>
      func.return %y : tensor<{rows}x32xf32>
    }}"""


@pytest.mark.parametrize(
    ("rows", "norm_rows", "fused"),
    [(16, 16, True), (17, 16, False), (999, 0, True), (40, 64, True)],
)
def test_norm_rows_bounds_the_rows_a_fused_norm_takes(
    rows: int, norm_rows: int, fused: bool
) -> None:
    """Past norm-rows rows (a prefill's) the norm is a kernel of its own before the linear."""
    lowered = check_agrees(load_module(norm_linear(rows)), norm_rows=norm_rows, k_splits=1)
    labels = [k.attributes["mk.fused"].data for k in kernels(lowered) if "mk.fused" in k.attributes]  # type: ignore[attr-defined]
    assert len(kernels(lowered)) == (1 if fused else 2), labels
    assert any(label.startswith("rms_norm+linear") for label in labels) == fused, labels


def test_a_standalone_norm_of_many_rows_fills_one_wave() -> None:
    """999 hidden rows alone: the fewest rows a block (9) that keep the blocks within one wave
    of 132 SMs. On 16 SMs no divisor up to 64 rows keeps one wave: blocks of 37 as before."""
    (norm, _) = kernels(check_agrees(load_module(norm_linear(999)), k_splits=1))
    assert isinstance(norm, mg.GraphDefOp) and norm.grid_shape() == (111, 1, 1)
    (norm, _) = kernels(lower(load_module(norm_linear(999)), k_splits=1, num_sms=16))
    assert isinstance(norm, mg.GraphDefOp) and norm.grid_shape() == (27, 1, 1)


def _head_transposes(batch: int) -> str:
    """Heads out of rows and back, as a prefill moves q into and out of attention."""
    b, s, h, d = batch, 150, 4, 8
    rows, four, heads = (
        f"tensor<{b * s}x{h * d}xf32>",
        f"tensor<{b}x{s}x{h}x{d}xf32>",
        f"tensor<{b}x{h}x{s}x{d}xf32>",
    )
    return f"""
    func.func @f(%x: {rows}) -> {rows} {{
      %x4 = nn.reshape %x : ({rows}) -> {four}
      %t = nn.transpose %x4 {{perm = array<i64: 0, 2, 1, 3>}} : ({four}) -> {heads}
      %e = nn.exp %t : ({heads}) -> {heads}
      %u = nn.transpose %e {{perm = array<i64: 0, 2, 1, 3>}} : ({heads}) -> {four}
      %y = nn.reshape %u : ({four}) -> {rows}
      func.return %y : {rows}
    }}"""


@pytest.mark.parametrize("batch", [1, 2])
def test_head_transposes_take_blocks_of_rows(batch: int) -> None:
    """[B, S, H, D] <-> [B, H, S, D] as graph_defs of (head, 50 rows, batch row) blocks; at
    batch 1 they read and write the [S, H·D] rows through the reshapes (no copy kernels)."""
    lowered = check_agrees(load_module(_head_transposes(batch)))
    grids = [k.grid_shape() for k in kernels(lowered) if isinstance(k, mg.GraphDefOp)]
    assert grids.count((4, 3, batch)) == 2
    copies = [
        k for k in kernels(lowered) if isinstance(k, mg.KernelOp) and k.kind.data == "reshape"
    ]
    assert len(copies) == (0 if batch == 1 else 2)


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
    lowered = lower(
        load_module(EXAMPLES / "rmsnorm_linear.mlir"), tile_k=32, tile_n=128, k_splits=1
    )
    (kernel,) = kernels(lowered)
    assert isinstance(kernel, mg.GraphDefOp)
    assert kernel.forloop_range() == 16 and kernel.grid_shape() == (8, 1, 1)


def test_elementwise_chain_is_one_kernel() -> None:
    text = """
    func.func @f(%a: tensor<4x6xbf16>, %b: tensor<4x6xbf16>, %c: tensor<6xbf16>) -> (tensor<4x6xbf16>, tensor<4x6xbf16>) {
      %s = nn.silu %a : (tensor<4x6xbf16>) -> tensor<4x6xbf16>
      %m = nn.mul %s, %b : (tensor<4x6xbf16>, tensor<4x6xbf16>) -> tensor<4x6xbf16>
      %r = nn.add %m, %c : (tensor<4x6xbf16>, tensor<6xbf16>) -> tensor<4x6xbf16>
      %e = nn.exp %r : (tensor<4x6xbf16>) -> tensor<4x6xbf16>
      func.return %r, %e : tensor<4x6xbf16>, tensor<4x6xbf16>
    }"""
    fused, exp = kernels(check_agrees(load_module(text), tile_n=3))
    assert isinstance(fused, mg.GraphDefOp) and fused.grid_shape() == (2, 1, 1)
    assert fused.attributes["mk.fused"] == StringAttr("silu+mul+add")
    # %r has a user outside the chain (the return), so %e is not fused after it.
    assert isinstance(exp, mg.KernelOp) and exp.args[0] is fused.res[0]


@irdl_op_definition
class FutureOp(IRDLOperation):
    """An nn op this pass has no rule for (as a newly added op would be)."""

    name = "nn.future"
    x = operand_def(TensorType)
    res = result_def(TensorType)


def test_op_without_a_rule_is_a_located_error() -> None:
    module = load_module(EXAMPLES / "gated_mlp.mlir")
    silu = next(op for op in module.walk() if isinstance(op, nn.SiluOp))
    future = FutureOp.create(operands=[silu.x], result_types=[silu.result.type])
    future.location = silu.location
    silu.result.replace_all_uses_with(future.results[0])
    assert silu.parent is not None
    silu.parent.insert_op_before(future, silu)
    silu.parent.erase_op(silu)
    with pytest.raises(MkError, match=r"gated_mlp.mlir:5:\d+: error: 'nn.future' has no lowering"):
        NnToMugraphPass().apply(make_context(), module)


@pytest.mark.parametrize(("option", "low"), [("tile_k", 0), ("tile_m", -1), ("norm_rows", -1)])
def test_bad_option_is_a_located_error(option: str, low: int) -> None:
    name = option.replace("_", "-")
    with pytest.raises(MkError, match=f"{name} must be >= {low + 1}"):
        lower(load_module(EXAMPLES / "rmsnorm_linear.mlir"), **{option: low})


# ------------------------------------------------------------------------------------------------
# Random nn programs (the strategy lives in nn_programs.py, shared with the pipeline tests)
# ------------------------------------------------------------------------------------------------


@settings(
    max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(programs(), OPTIONS)
def test_random_programs_agree(module: ModuleOp, options: dict[str, int]) -> None:
    text = str(module)
    module = load_module(text)  # parsed and verified, as a user program would be
    check_agrees(module, seed=1, **options)


QK_NORM = """
func.func @qk_norm(%q: tensor<3x4x1x16xbf16>, %w: tensor<16xbf16>) -> tensor<3x4x1x16xbf16> {
  %y = nn.rms_norm %q, %w {epsilon = 1.0e-05 : f32} : (tensor<3x4x1x16xbf16>, tensor<16xbf16>) -> tensor<3x4x1x16xbf16>
  func.return %y : tensor<3x4x1x16xbf16>
}"""


def test_standalone_rms_norm_gets_a_block_per_row() -> None:
    lowered = check_agrees(load_module(QK_NORM))
    (kernel,) = kernels(lowered)
    assert isinstance(kernel, mg.GraphDefOp) and kernel.grid_shape() == (3, 4, 1)
    (norm,) = [op for op in kernel.body.ops if isinstance(op, mg.RMSNormOp)]
    assert abs(norm.epsilon.value.data - 1e-5) < 1e-12


QK_NORM_VIEW = """
func.func @qk_norm_view(%q: tensor<3x64xbf16>, %w: tensor<16xbf16>) -> tensor<3x4x1x16xbf16> {
  %q4 = nn.reshape %q : (tensor<3x64xbf16>) -> tensor<3x4x1x16xbf16>
  %y = nn.rms_norm %q4, %w {epsilon = 1.0e-06 : f32} : (tensor<3x4x1x16xbf16>, tensor<16xbf16>) -> tensor<3x4x1x16xbf16>
  func.return %y : tensor<3x4x1x16xbf16>
}"""


def test_head_splitting_reshape_folds_into_the_row_norm() -> None:
    """A block per head, taking all 3 rows of it (a decode step's few rows share a block)."""
    lowered = check_agrees(load_module(QK_NORM_VIEW))
    (kernel,) = kernels(lowered)  # no reshape copy kernel left
    assert isinstance(kernel, mg.GraphDefOp) and kernel.grid_shape() == (4, 1, 1)
    (x,) = [op for op in kernel.input_ops() if op.tile.type == TensorType(bf16, (3, 16))]
    assert kernel.operands[0].type == TensorType(bf16, (3, 64))  # reads q itself
    assert tuple(x.imap.get_values()) == (1, -1, -1)


def test_more_rows_than_a_block_takes_spread_over_blocks() -> None:
    """Nine rows are more than one block's warps take: a block per (row, head) again."""
    text = QK_NORM_VIEW.replace("3x", "9x")
    (kernel,) = kernels(check_agrees(load_module(text)))
    assert isinstance(kernel, mg.GraphDefOp) and kernel.grid_shape() == (9, 4, 1)
    (x,) = [op for op in kernel.input_ops() if op.tile.type == TensorType(bf16, (1, 16))]
    assert tuple(x.imap.get_values()) == (0, 1, -1)


CACHE_WRITE_VIEW = """
func.func @step(%cache: tensor<2x2x8x4xbf16> {nn.donated}, %v: tensor<2x8xbf16>, %p: tensor<2xi32>) -> tensor<2x8xbf16> {
  %v4 = nn.reshape %v : (tensor<2x8xbf16>) -> tensor<2x2x1x4xbf16>
  %c = nn.cache_write %cache, %v4, %p {dim = 2 : i64} : (tensor<2x2x8x4xbf16>, tensor<2x2x1x4xbf16>, tensor<2xi32>) -> tensor<2x2x8x4xbf16>
  %y = nn.add %v, %v : (tensor<2x8xbf16>, tensor<2x8xbf16>) -> tensor<2x8xbf16>
  func.return %y : tensor<2x8xbf16>
}
"""


def test_cache_write_reads_through_a_reshape() -> None:
    # One position per batch row; the slab [2, 2, 1, 4] is read from v [2, 8] directly.
    module = load_module(CACHE_WRITE_VIEW)
    lowered = check_agrees(module, seed=3)
    library = [k for k in kernels(lowered) if isinstance(k, mg.KernelOp)]
    assert sorted(k.kind.data for k in library) == ["add", "cache_write"]  # no reshape copy
    (write,) = [k for k in library if k.kind.data == "cache_write"]
    assert isinstance(write.args[1].type, TensorType)
    assert tuple(write.args[1].type.get_shape()) == (2, 8)


def test_cache_write_view_runs_on_the_cpu(tmp_path: Path) -> None:
    import mk
    from mk import compiler

    prog = mk.compile(CACHE_WRITE_VIEW, cache_dir=tmp_path)
    inputs = random_inputs(prog.func, seed=4)
    inputs[2][:] = [3, 7]  # a position per batch row, inside the 8 slots
    ref_inputs = [x.copy() for x in inputs]
    (out,) = prog(*inputs)
    (ref,) = mk.reference(CACHE_WRITE_VIEW, *ref_inputs)
    assert compiler.output_error(np.asarray(out), np.asarray(ref))[0] == 0
    np.testing.assert_array_equal(inputs[0], ref_inputs[0])  # the cache, written in place


EMBEDDING_VIEW = """
func.func @embed(%embed: tensor<64x16xbf16>, %tok: tensor<1x3xi32>, %ids: tensor<3xi32>) -> (tensor<3x16xbf16>, tensor<1x48xbf16>, tensor<3x16xbf16>) {
  %x3 = nn.embedding %embed, %tok : (tensor<64x16xbf16>, tensor<1x3xi32>) -> tensor<1x3x16xbf16>
  %x = nn.reshape %x3 : (tensor<1x3x16xbf16>) -> tensor<3x16xbf16>
  %y = nn.embedding %embed, %ids : (tensor<64x16xbf16>, tensor<3xi32>) -> tensor<3x16xbf16>
  %y2 = nn.reshape %y : (tensor<3x16xbf16>) -> tensor<1x48xbf16>
  func.return %x, %y2, %y : tensor<3x16xbf16>, tensor<1x48xbf16>, tensor<3x16xbf16>
}
"""


def _embedding_inputs(func: FuncOp) -> list[np.ndarray]:
    inputs = random_inputs(func, seed=5)
    inputs[1][:] = [[63, 0, 17]]  # ids inside the 64 rows, the last and the first among them
    inputs[2][:] = [5, 5, 62]
    return inputs


def test_a_reshape_of_an_embedding_is_the_gathers_result() -> None:
    module = load_module(EMBEDDING_VIEW)
    lowered = lower(module)
    library = [k for k in kernels(lowered) if isinstance(k, mg.KernelOp)]
    # %x's reshape folds into its gather; %y has another user, so its reshape stays a copy.
    assert [k.kind.data for k in library] == ["embedding", "embedding", "reshape"]
    gather = library[0]
    assert isinstance(gather.res[0].type, TensorType)
    assert tuple(gather.res[0].type.get_shape()) == (3, 16)
    func = entry_function(load_module(EMBEDDING_VIEW))
    inputs = _embedding_inputs(func)
    got = run_mugraph(lowered, *inputs)
    for out, ref in zip(got, run_reference(load_module(EMBEDDING_VIEW), *inputs), strict=True):
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


def test_an_embedding_view_runs_on_the_cpu(tmp_path: Path) -> None:
    import mk

    prog = mk.compile(EMBEDDING_VIEW, cache_dir=tmp_path)
    inputs = _embedding_inputs(prog.func)
    grids = [g.sym_name.data for g in prog.graph.index().grids]  # type: ignore[attr-defined]
    assert len(grids) == 3  # the two gathers and %y2's copy: none for %x
    for out, ref in zip(prog(*inputs), mk.reference(EMBEDDING_VIEW, *inputs), strict=True):
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


SAMPLE = """
func.func @sample(%logits: tensor<3x512xbf16>, %tokens: tensor<16x3xi32> {nn.donated}, %p1: tensor<1xi32>) -> tensor<16x3xi32> {
  %next = nn.argmax %logits {dim = -1 : i64} : (tensor<3x512xbf16>) -> tensor<3xi32>
  %next2 = nn.reshape %next : (tensor<3xi32>) -> tensor<1x3xi32>
  %tokens2 = nn.cache_write %tokens, %next2, %p1 {dim = 0 : i64} : (tensor<16x3xi32>, tensor<1x3xi32>, tensor<1xi32>) -> tensor<16x3xi32>
  func.return %tokens2 : tensor<16x3xi32>
}
"""
# The argmax read by two ops: its reduce writes [3] as before, and the reshape stays a copy.
SAMPLE_KEPT = SAMPLE.replace(
    "-> tensor<16x3xi32> {\n", "-> (tensor<16x3xi32>, tensor<3xi32>) {\n"
).replace(
    "func.return %tokens2 : tensor<16x3xi32>",
    "func.return %tokens2, %next : tensor<16x3xi32>, tensor<3xi32>",
)


def _sample_inputs(func: FuncOp) -> list[np.ndarray]:
    inputs = random_inputs(func, seed=6)
    inputs[2][:] = 9  # the position the next tokens go to
    return inputs


@pytest.mark.parametrize(("source", "shape"), [(SAMPLE, (1, 3)), (SAMPLE_KEPT, (3,))])
def test_the_argmax_reduce_writes_its_reshape(source: str, shape: tuple[int, ...]) -> None:
    lowered = lower(load_module(source))
    reduce = [k for k in kernels(lowered) if isinstance(k, mg.GraphDefOp)][-1]
    assert isinstance(reduce.res[0].type, TensorType)
    assert tuple(reduce.res[0].type.get_shape()) == shape
    inputs = _sample_inputs(entry_function(load_module(source)))
    ref_inputs = [x.copy() for x in inputs]
    got = run_mugraph(lowered, *inputs)
    for out, want in zip(got, run_reference(load_module(source), *ref_inputs), strict=True):
        np.testing.assert_array_equal(np.asarray(out), np.asarray(want))


def test_the_next_token_written_by_the_reduce_runs_on_the_cpu(tmp_path: Path) -> None:
    import mk

    prog = mk.compile(SAMPLE, cache_dir=tmp_path)
    grids = [g.sym_name.data for g in prog.graph.index().grids]  # type: ignore[attr-defined]
    # The argmax's partials, its reduce writing the history, the history's copy into the
    # result: no task of its own for the write.
    assert len(grids) == 3
    inputs = _sample_inputs(prog.func)
    ref_inputs = [x.copy() for x in inputs]
    (out,) = prog(*inputs)
    (ref,) = mk.reference(SAMPLE, *ref_inputs)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
    np.testing.assert_array_equal(inputs[1], ref_inputs[1])  # the history, written in place
