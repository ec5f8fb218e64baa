"""Accumulating outputs and mugraph-fuse-accumulate: the interpreter's sum, the rewrite's
conditions, the CPU executor and the CUDA build against the references, the GPU run."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import mk
from mk import compiler
from mk.backends.cuda import build as cuda_build
from mk.compiler import PIPELINE, run_pipeline
from mk.dialects.mugraph import GraphDefOp, OutputOp
from mk.inputs import random_inputs
from mk.interp.mugraph import run_mugraph
from mk.models import (
    decode_program,
    generated_tokens,
    preset,
    program_inputs,
    random_prompt,
    random_weights,
    reference_generate,
)
from mk.models.reference import compare
from mk.source import entry_function, load_module

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("decoder_block", "llama3_8b_block")
HAS_NVCC = cuda_build.nvcc() is not None
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")

ACCUMULATE = """
func.func @accumulate(%x: tensor<4x64xbf16>, %w: tensor<32x64xbf16>, %acc: tensor<4x32xf32>) -> tensor<4x32xf32> {
  %y = mugraph.graph_def grid [8, 1, 1] threads 128 forloop 1 (%x, %w, %acc) : (tensor<4x64xbf16>, tensor<32x64xbf16>, tensor<4x32xf32>) -> tensor<4x32xf32> {
  ^bb0(%xa: tensor<4x64xbf16>, %wa: tensor<32x64xbf16>, %acca: tensor<4x32xf32>, %ya: tensor<4x32xf32>):
    %xt = mugraph.input %xa imap [1, -1, -1] fmap -1 : tensor<4x64xbf16> -> tensor<4x8xbf16>
    %wt = mugraph.input %wa imap [1, -1, -1] fmap -1 : tensor<32x64xbf16> -> tensor<32x8xbf16>
    %p = mugraph.matmul %xt, %wt transpose_b : (tensor<4x8xbf16>, tensor<32x8xbf16>) -> tensor<4x32xf32>
    mugraph.output %p to %ya omap [-1, -1, -1] accumulate over %acca : tensor<4x32xf32> -> tensor<4x32xf32>
  }
  func.return %y : tensor<4x32xf32>
}
"""


# An accumulating output of an element tile (no product to stream): each of three blocks adds
# half of x into the whole f32 result.
SCALED = """
func.func @scaled(%x: tensor<4x32xf32>, %acc: tensor<4x32xf32>) -> tensor<4x32xf32> {
  %y = mugraph.graph_def grid [3, 1, 1] threads 128 forloop 1 (%x, %acc) : (tensor<4x32xf32>, tensor<4x32xf32>) -> tensor<4x32xf32> {
  ^bb0(%xa: tensor<4x32xf32>, %acca: tensor<4x32xf32>, %ya: tensor<4x32xf32>):
    %xt = mugraph.input %xa imap [-1, -1, -1] fmap -1 : tensor<4x32xf32> -> tensor<4x32xf32>
    %st = mugraph.thread_map %xt : (tensor<4x32xf32>) -> tensor<4x32xf32> {
    ^bb0(%v: f32):
      %h = arith.constant 0.5 : f32
      %m = arith.mulf %v, %h : f32
      mugraph.yield %m : f32
    }
    mugraph.output %st to %ya omap [-1, -1, -1] accumulate over %acca : tensor<4x32xf32> -> tensor<4x32xf32>
  }
  func.return %y : tensor<4x32xf32>
}
"""


def residual_mlp(batch: int, intermediate: int, hidden: int = 256) -> str:
    """An o-projection + residual, then a gated MLP + residual: with `tile_n` = the columns a
    gate/up block owns, the down projection's blocks read that many columns of each row."""

    def t(rows: int, cols: int) -> str:
        return f"tensor<{rows}x{cols}xbf16>"

    b, i, h = batch, intermediate, hidden
    return f"""func.func @mlp(%a: {t(b, h)}, %x: {t(b, h)}, %wo: {t(h, h)}, %wg: {t(i, h)}, %wu: {t(i, h)}, %wd: {t(h, i)}) -> {t(b, h)} {{
  %o = nn.linear %a, %wo : ({t(b, h)}, {t(h, h)}) -> {t(b, h)}
  %r = nn.add %x, %o : ({t(b, h)}, {t(b, h)}) -> {t(b, h)}
  %g = nn.linear %r, %wg : ({t(b, h)}, {t(i, h)}) -> {t(b, i)}
  %u = nn.linear %r, %wu : ({t(b, h)}, {t(i, h)}) -> {t(b, i)}
  %s = nn.silu %g : ({t(b, i)}) -> {t(b, i)}
  %m = nn.mul %s, %u : ({t(b, i)}, {t(b, i)}) -> {t(b, i)}
  %d = nn.linear %m, %wd : ({t(b, i)}, {t(h, i)}) -> {t(b, h)}
  %y = nn.add %r, %d : ({t(b, h)}, {t(b, h)}) -> {t(b, h)}
  func.return %y : {t(b, h)}
}}"""


# (batch, columns a block reads of each W_down row): 24 and 96 are where `packed` differs from
# `lanes` (3 lanes a row; 4 lanes of 3 pieces each, or 6 of 2 at batch 2).
SHORT_RUNS = [(1, 24), (1, 96), (2, 96)]


def _fused(text: str, cache: Path, cols: int, target: str = "cuda") -> mk.Program:
    """`text` with every residual linear fused, whatever its blocks' columns, and `cols`
    columns a gate/up block."""
    return mk.compile(
        text,
        target=target,
        cache_dir=cache,
        accumulate_columns=0,
        accumulate_row_columns=0,
        tile_n=cols,
    )


def _check_runs(batch: int, cols: int, target: str, cache: Path, hidden: int = 256) -> mk.Program:
    text = residual_mlp(batch, cols * 16, hidden)
    prog = _fused(text, cache, cols, target)
    inputs = random_inputs(prog.func, seed=cols)
    (want,) = mk.reference(text, *[x.copy() for x in inputs])
    (got,) = prog(*inputs)
    error, bound = compiler.output_error(np.asarray(got), np.asarray(want))
    assert error <= bound, f"batch {batch}, {cols} columns: error {error:.3g} > {bound:.3g}"
    return prog


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mk-accumulate-cache")


def _mugraph(path: Path, fuse: int) -> str:
    """The mugraph stage without mugraph-split-loop, whose o-projection also accumulates."""
    module = load_module(path)
    options = {"fuse_accumulate": fuse, "split_loop": 0}
    return run_pipeline(module, options, PIPELINE[:2])["mugraph"]


def test_the_interpreter_adds_every_blocks_tile_to_the_operand() -> None:
    x, w, acc = random_inputs(entry_function(load_module(ACCUMULATE)), seed=2)
    (y,) = run_mugraph(ACCUMULATE, x, w, acc)
    want = acc.astype(np.float64) + x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_the_output_knows_its_operand() -> None:
    module = load_module(ACCUMULATE)
    graph = next(op for op in module.walk() if isinstance(op, GraphDefOp))
    (out,) = [op for op in graph.body.block.ops if isinstance(op, OutputOp)]
    assert out.accumulated() is graph.input_args()[2] and out.position() is None
    assert graph.in_place_result(2) is graph.results[0] and graph.in_place_result(0) is None
    assert out.tile_slices((5, 0, 0)) == (slice(0, 4), slice(0, 32))  # every block: all of it


@needs_gxx
def test_a_start_that_others_see_is_copied_first(cache: Path) -> None:
    """%acc is an argument: the sum lands in the output buffer, the caller's array unchanged."""
    prog = mk.compile(ACCUMULATE, target="cpu", cache_dir=cache)
    assert prog.ir("task").count('"reshape"') == 1  # the copy of %acc that the blocks add into
    x, w, acc = random_inputs(prog.func, seed=3)
    start = acc.copy()
    (y,) = prog(x, w, acc)
    np.testing.assert_array_equal(acc, start)
    want = start.astype(np.float64) + x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@needs_gxx
def test_three_blocks_add_an_element_tile(cache: Path) -> None:
    prog = mk.compile(SCALED, target="cpu", cache_dir=cache)
    x, acc = random_inputs(prog.func, seed=4)
    (y,) = prog(x, acc)
    np.testing.assert_allclose(y, acc + 1.5 * x, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
def test_an_element_tile_adds_element_by_element_on_the_gpu(cache: Path) -> None:
    prog = mk.compile(SCALED, target="cuda", cache_dir=cache)
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert "mk::gpu::add_run_elem<128>(" in src and "rows_dot" not in src
    assert prog.library_path is not None  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_down_projection_joins_the_mlp(name: str) -> None:
    """One kernel fewer: the MLP kernel adds into the o-projection's second (f32) result."""
    path = ROOT / "examples" / f"{name}.mlir"
    before, after = _mugraph(path, 0), _mugraph(path, 1)
    assert after.count("mugraph.graph_def") == before.count("mugraph.graph_def")  # + round
    assert "accumulate over" in after and "accumulate" not in before
    assert 'mk.fused = "round"' in after  # the block's result is returned: rounded to bf16
    assert after.count("rms_norm+linear+linear+silu+mul+linear+add") == 1


@pytest.mark.parametrize(
    ("name", "fused"), [("qwen3-0.6b", 1), ("llama-3.2-1b", 1), ("qwen3-8b", 0)]
)
def test_accumulate_columns_bounds_the_weight_runs(name: str, fused: int) -> None:
    """On 132 SMs a block reads 24, 64 and 96 columns of each down-projection row."""
    module = load_module(decode_program(preset(name).with_(layers=1), 1, 64, 1))
    options = {"fuse_accumulate": 1, "accumulate_columns": 64, "tile_n": 0, "num_sms": 132}
    assert run_pipeline(module, options, PIPELINE[:2])["mugraph"].count("accumulate over") == fused


@pytest.mark.parametrize(
    ("name", "batch", "fused"),
    [("qwen3-0.6b", 1, 1), ("qwen3-0.6b", 4, 1), ("qwen3-0.6b", 8, 0), ("llama-3.2-1b", 8, 1)],
)
def test_accumulate_row_columns_bounds_the_adds(name: str, batch: int, fused: int) -> None:
    """At the default 4 columns a row: qwen3-0.6b's 24 columns fuse up to 6 rows, llama-3.2-1b's
    64 up to 16; with the bound off every batch fuses."""
    module = load_module(decode_program(preset(name).with_(layers=1), batch, 64, 1))
    options = {"fuse_accumulate": 1, "tile_n": 0, "num_sms": 132}
    mugraph = run_pipeline(module, options, PIPELINE[:2])["mugraph"]
    assert mugraph.count("accumulate over") == fused
    unbound = run_pipeline(module.clone(), {**options, "accumulate_row_columns": 0}, PIPELINE[:2])
    assert unbound["mugraph"].count("accumulate over") == 1


@pytest.mark.parametrize("option", ["accumulate_columns", "accumulate_row_columns"])
def test_a_negative_bound_is_refused(option: str) -> None:
    path = ROOT / "examples" / "decoder_block.mlir"
    dashed = option.replace("_", "-")
    with pytest.raises(mk.MkError, match=f"mugraph-fuse-accumulate: {dashed} must be >= 0"):
        mk.compile(path, target="cpu", **{option: -1})


def test_the_rewrite_is_deterministic() -> None:
    path = ROOT / "examples" / "decoder_block.mlir"
    assert _mugraph(path, 1) == _mugraph(path, 1)


def _check_example(
    name: str, target: str, cache: Path, seeds: int = 2, **options: int | bool
) -> None:
    """The fused example against the reference on fresh inputs (tolerance of DESIGN.md)."""
    path = ROOT / "examples" / f"{name}.mlir"
    prog = mk.compile(
        path,
        target=target,
        cache_dir=cache,
        fuse_accumulate=1,
        accumulate_columns=0,
        accumulate_row_columns=0,
        **options,
    )
    for seed in range(seeds):
        inputs = random_inputs(prog.func, seed=seed)
        refs = mk.reference(path, *[x.copy() for x in inputs])  # donated inputs change
        for out, ref in zip(prog(*inputs), refs, strict=True):
            error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
            assert error <= bound, f"{name} seed {seed}: error {error:.3g} > {bound:.3g}"


@needs_gxx
@pytest.mark.parametrize("name", EXAMPLES)
def test_the_cpu_executor_matches_the_reference(name: str, cache: Path) -> None:
    _check_example(name, "cpu", cache, seeds=2 if name == "decoder_block" else 1)  # 8B: ~10 s


@needs_gxx
def test_flag_values_leave_the_sum_unflagged(cache: Path) -> None:
    """Blocks add into the accumulator in any order, so no element's flag could say it is
    complete: with flag-values it keeps its counter event, the other activations their flags
    (the o-projection's r too, unless mugraph-split-loop makes it a sum)."""
    for split_loop, r_kind in ((0, "flagged"), (1, "offset")):
        module = load_module(ROOT / "examples" / "decoder_block.mlir")
        task = run_pipeline(module, {"flag_values": True, "split_loop": split_loop})["task"]
        assert "task.buffer @y_acc activation offset" in task
        assert f"task.buffer @r activation {r_kind}" in task
        assert "task.buffer @k activation flagged" in task
    _check_example("decoder_block", "cpu", cache, seeds=1, flag_values=True)


@needs_gxx
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_tiny_generates_the_reference_tokens(name: str, cache: Path) -> None:
    """Layer after layer, the next norm and residual read the f32 sum."""
    config = preset(name)
    weights = random_weights(config)
    batch, steps, context = 2, 4, 5
    prompt = random_prompt(config, batch)
    prog = mk.compile(
        decode_program(config, batch, context, steps), cache_dir=cache, fuse_accumulate=1
    )
    assert "accumulate over" in prog.ir("mugraph")
    tokens, logits = prog(*program_inputs(config, weights, batch, context, prompt))
    got = generated_tokens(tokens, 0, steps)
    ref = reference_generate(config, weights, prompt, steps, context=context, forced=got)
    result = compare(got, ref.logits, {steps - 1: logits.astype(np.float32)})
    assert result.ok, result.problems


@pytest.mark.parametrize("rows", ["threads", "lanes", "packed"])
def test_the_cuda_body_streams_the_weight_columns(
    rows: str, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tile for the weight columns: rows_dot reads them, add_tile_v4 adds the product; with
    nvcc, both ways build without spills."""
    monkeypatch.setenv("MK_CUDA_ROWS_DOT", rows)
    path = ROOT / "examples" / "decoder_block.mlir"
    prog = mk.compile(path, target="cuda", cache_dir=cache, fuse_accumulate=1)
    src = prog.cuda_source  # type: ignore[attr-defined]
    name, packed = ("lanes", ", true") if rows == "packed" else (rows, "")
    assert re.search(rf"mk::gpu::rows_dot_{name}<1, \d+, 256, true{packed}>\(", src)
    assert src.count("mk::gpu::add_tile_v4(") == 1 and "matmul_tile" not in src
    if HAS_NVCC:
        used = prog.cuda_resources  # type: ignore[attr-defined]
        assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used


@needs_gxx
def test_short_runs_match_the_reference_on_the_cpu(cache: Path) -> None:
    prog = _check_runs(1, 24, "cpu", cache)
    assert "accumulate over" in prog.ir("mugraph")


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
@pytest.mark.parametrize(("batch", "cols"), SHORT_RUNS)
def test_packed_lanes_build_without_spills(
    batch: int, cols: int, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The packed layouts (rows_layout's static_asserts compile with them) and their sums."""
    monkeypatch.setenv("MK_CUDA_ROWS_DOT", "packed")
    text = residual_mlp(batch, cols * 16)
    prog = _fused(text, cache, cols)
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert f"mk::gpu::rows_dot_lanes<{batch}, {cols}, 256, true, true>(" in src
    used = prog.cuda_resources  # type: ignore[attr-defined]
    assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used


# (batch, columns) for MK_CUDA_ROWS_DOT=mma: qwen3-0.6b's 24 and llama-3.2-1b's 64 columns at
# batch 8, 96 at batch 2 (three 32-column steps), and one row (lanes under `mma` below 64
# columns, tensor cores from 64 and under `mma-all`).
MMA_RUNS = [(8, 24), (8, 64), (2, 96), (16, 128), (1, 24), (1, 64)]


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
@pytest.mark.parametrize(("batch", "cols"), MMA_RUNS)
def test_rows_dot_on_tensor_cores_builds_without_spills(
    batch: int, cols: int, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_ROWS_DOT=mma: 2..16 activation rows take rows_dot_mma, one row too from 64
    columns and stays on lanes below; with mma-all one row takes rows_dot_mma at any width."""
    monkeypatch.setenv("MK_CUDA_ROWS_DOT", "mma-all" if batch == 1 else "mma")
    text = residual_mlp(batch, cols * 16)
    prog = _fused(text, cache, cols)
    src = prog.cuda_source  # type: ignore[attr-defined]
    if batch == 1:
        monkeypatch.setenv("MK_CUDA_ROWS_DOT", "mma")
        default = _fused(text, cache, cols).cuda_source  # type: ignore[attr-defined]
        name = "mma" if cols >= 64 else "lanes"
        assert f"mk::gpu::rows_dot_{name}<1, {cols}, 256, true>(" in default
    assert f"mk::gpu::rows_dot_mma<{batch}, {cols}, 256, true>(" in src
    used = prog.cuda_resources  # type: ignore[attr-defined]
    assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "cols"), [*MMA_RUNS, (8, 112)])
def test_rows_dot_on_tensor_cores_matches_the_reference_on_the_gpu(
    batch: int, cols: int, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also 112 columns at batch 8 (the 8B-shaped MLP fused: 16 batches of tiles a warp)."""
    monkeypatch.setenv("MK_CUDA_ROWS_DOT", "mma-all")
    _check_runs(batch, cols, "cuda", cache)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ["threads", "lanes", "packed"])
@pytest.mark.parametrize(("batch", "cols"), SHORT_RUNS)
def test_short_runs_match_the_reference_on_the_gpu(
    batch: int, cols: int, rows: str, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MK_CUDA_ROWS_DOT", rows)
    _check_runs(batch, cols, "cuda", cache)


@pytest.mark.gpu
@pytest.mark.parametrize("text", [ACCUMULATE, SCALED], ids=["matmul", "scaled"])
def test_accumulating_outputs_on_the_gpu(text: str, cache: Path) -> None:
    prog = mk.compile(text, target="cuda", cache_dir=cache)
    inputs = random_inputs(prog.func, seed=5)
    (want,) = run_mugraph(text, *[a.copy() for a in inputs])
    (y,) = prog(*inputs)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ["threads", "lanes", "packed"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_accumulating_mlp_matches_the_reference_on_the_gpu(
    name: str, rows: str, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MK_CUDA_ROWS_DOT", rows)
    _check_example(name, "cuda", cache)
