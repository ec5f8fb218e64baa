"""mugraph-split-loop: which folded o-projections split into a block per KV head, and that the
split programs compute what the reference does (CPU executor against the NumPy reference)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from attention_programs import attention_oproj
from linear_programs import cuda_source
from test_mugraph_fuse_loop import ATTN_OPROJ, ATTN_OPROJ_B3, _cpu_ready
from xdsl.dialects.builtin import ModuleOp

import mk
from mk import compiler
from mk.backends.cuda import build
from mk.dialects.mugraph import GraphDefOp
from mk.dialects.mugraph_base import shape_of
from mk.inputs import random_inputs
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
from mk.passes.mugraph_fuse_loop import reads
from mk.source import load_module

OPTIONS = {"num_sms": 8, "tile_n": 16, "kv_splits": 4}


def _lowered(text: str, **options: int) -> ModuleOp:
    module = load_module(text)
    compiler.run_pipeline(module, {**OPTIONS, **options}, compiler.PIPELINE[:2])
    return module


def _labelled(module: ModuleOp) -> dict[str, GraphDefOp]:
    graphs = [op for op in module.walk() if isinstance(op, GraphDefOp)]
    return {str(g.attributes.get("mk.fused", "")).strip('"'): g for g in graphs}


def test_the_oproj_takes_a_block_per_kv_head_adding_into_a_started_sum() -> None:
    graphs = _labelled(_lowered(ATTN_OPROJ))
    split, start = graphs["split+linear+add"], graphs["start"]
    assert "loop+linear+add" not in graphs and "round" in graphs  # r is returned: rounded
    assert split.grid_shape() == (1, 1, 2) and split.forloop_range() == 1
    reads = {op.tile.name_hint: (op.imap_dims(), op.fmap_dim()) for op in split.input_ops()}
    assert reads["op"] == ((-1, -1, 2), 2) and reads["wot"] == ((0, -1, 1), 1)
    assert "x_t" not in reads  # the residual comes in through the start
    (out,) = split.output_ops()
    assert out.accumulated() is not None and split.args[out.accumulated().index] is start.res[0]  # type: ignore[union-attr]
    assert start.grid_shape() == (1, 1, 1) and str(start.res[0].type) == "tensor<1x32xf32>"


def test_the_split_is_deterministic() -> None:
    assert str(_lowered(ATTN_OPROJ)) == str(_lowered(ATTN_OPROJ))


def test_off_keeps_the_loop_and_a_batch_splits_under_merge_rows() -> None:
    assert "loop+linear+add" in _labelled(_lowered(ATTN_OPROJ, split_loop=0))
    assert "split+linear+add" not in _labelled(_lowered(ATTN_OPROJ_B3))  # no fold: no loop
    graphs = _labelled(_lowered(ATTN_OPROJ_B3, merge_rows=3))
    assert "loop+linear+add" not in graphs and "start" in graphs
    split = graphs["split+linear+add"]
    (out,) = split.output_ops()
    assert split.grid_shape() == (1, 1, 2) and shape_of(out.tile) == (3, 32)


def test_split_loop_must_not_be_negative() -> None:
    with pytest.raises(mk.MkError, match="split-loop must be >= 0"):
        _lowered(ATTN_OPROJ, split_loop=-1)


# Four KV heads: the folded loop has four iterations.
FOUR_HEADS = attention_oproj(8, 4, 256, 32, 64)


@pytest.mark.parametrize(("per_block", "grid"), [(1, (1, 1, 4)), (2, (2, 1, 2)), (4, None)])
def test_split_loop_n_gives_each_block_n_heads(
    per_block: int, grid: tuple[int, int, int] | None, tmp_path: Path
) -> None:
    """split-loop=N: N of the loop's iterations (KV heads) a block, as many blocks in all; N =
    the whole loop leaves nothing to split. Each form against the reference (CPU executor)."""
    graphs = _labelled(_lowered(FOUR_HEADS, kv_splits=4, split_loop=per_block))
    if grid is None:
        assert "loop+linear+add" in graphs and "start" not in graphs
        return
    split = graphs["split+linear+add"]
    assert split.grid_shape() == grid and split.forloop_range() == per_block
    _cpu_ready()
    prog = mk.compile(
        FOUR_HEADS, cache_dir=tmp_path, num_sms=8, tile_n=16, kv_splits=4, split_loop=per_block
    )
    inputs = random_inputs(prog.func, seed=per_block)
    (out,) = prog(*inputs)
    (ref,) = mk.reference(FOUR_HEADS, *inputs)
    error, bound = compiler.output_error(out, ref)
    assert np.isfinite(out.astype(np.float32)).all() and error <= bound


def _merge_reads(text: str, **options: int) -> int:
    """What the unfolded split-KV merge of `text` reads: all of its partials."""
    module = _lowered(text, fold_bytes=0, split_loop=0, **options)
    (merge,) = [g for g in _labelled(module).values() if g.res[0].name_hint == "att2"]
    return reads(merge)


@pytest.mark.parametrize(("split_loop", "folds"), [(1, True), (2, False), (0, False)])
def test_the_fold_bound_is_a_split_blocks_share(
    split_loop: int, folds: bool, tmp_path: Path
) -> None:
    """mugraph-fuse-loop bounds what a block will read once split: a quarter of the partials
    with a KV head a block, half with two, all of them unsplit. The folded and split program
    against the reference (CPU executor)."""
    total = _merge_reads(FOUR_HEADS, kv_splits=4)
    bound = total // 4 + 1
    graphs = _labelled(_lowered(FOUR_HEADS, kv_splits=4, fold_bytes=bound, split_loop=split_loop))
    assert ("split+linear+add" in graphs) == folds and ("linear+add" in graphs) != folds
    if not folds:
        return
    _cpu_ready()
    prog = mk.compile(
        FOUR_HEADS, cache_dir=tmp_path, num_sms=8, tile_n=16, kv_splits=4, fold_bytes=bound
    )
    inputs = random_inputs(prog.func, seed=7)
    (out,) = prog(*inputs)
    (ref,) = mk.reference(FOUR_HEADS, *inputs)
    error, limit = compiler.output_error(out, ref)
    assert np.isfinite(out.astype(np.float32)).all() and error <= limit


def test_an_8b_merge_of_16_splits_folds_split_by_kv_head() -> None:
    """qwen3-8b's 16-split merge reads 266 KB, past the fold bound; split, a block reads 33 KB
    of it: with kv_splits=16 the o-projection folds and splits instead of keeping a merge phase."""
    config = dataclasses.replace(preset("qwen3-8b"), layers=1, vocab=2048)
    text = decode_program(config, 1, 1024)
    for split_loop, merged in ((1, False), (0, True)):
        module = load_module(text)
        options = {"num_sms": 132, "kv_splits": 16, "split_loop": split_loop}
        compiler.run_pipeline(module, options, compiler.PIPELINE[:2])
        graphs = [op for op in module.walk() if isinstance(op, GraphDefOp)]
        assert any(g.res[0].name_hint == "l0_att2" for g in graphs) == merged
        labels = [str(g.attributes.get("mk.fused", "")) for g in graphs]
        assert any("split+" in label for label in labels) != merged


@pytest.mark.parametrize(("batch", "split_loop"), [(1, 0), (1, 1), (3, 1)])
def test_split_and_unsplit_programs_match_the_reference(
    batch: int, split_loop: int, tmp_path: Path
) -> None:
    _cpu_ready()
    text = ATTN_OPROJ if batch == 1 else ATTN_OPROJ_B3
    prog = mk.compile(
        text, cache_dir=tmp_path, num_sms=8, tile_n=16, kv_splits=4, merge_rows=batch,
        split_loop=split_loop,
    )  # fmt: skip
    assert ("split+" in prog.ir("mugraph")) == bool(split_loop)
    for seed in (0, 1, 2):
        inputs = random_inputs(prog.func, seed=seed)
        (out,) = prog(*inputs)
        (ref,) = mk.reference(text, *inputs)
        error, bound = compiler.output_error(out, ref)
        assert np.isfinite(out.astype(np.float32)).all() and error <= bound


def test_a_split_decode_generates_the_reference_tokens(tmp_path: Path) -> None:
    """tiny-qwen3 over 256 cached tokens on 8 SMs: every layer's o-projection split, each
    layer's sums started from the last one's, restarted at each of the launch's steps; the
    tokens and the last logits against the NumPy model."""
    _cpu_ready()
    config = preset("tiny-qwen3")
    batch, steps, context = 1, 4, 256
    prompt = random_prompt(config, batch, length=100)
    prog = mk.compile(decode_program(config, batch, context, steps), cache_dir=tmp_path, num_sms=8)
    assert prog.ir("mugraph").count("split+linear+add") == config.layers
    weights = random_weights(config)
    tokens, logits = prog(*program_inputs(config, weights, batch, context, prompt))
    got = generated_tokens(tokens, prompt.shape[1] - 1, steps)
    ref = reference_generate(config, weights, prompt, steps, context=context, forced=got)
    result = compare(got, ref.logits, {steps - 1: logits.astype(np.float32)})
    assert result.ok, result.problems


@pytest.mark.parametrize(("batch", "runs"), [(1, ""), (3, ", 2, 4")])
def test_the_split_oproj_streams_one_kv_heads_merge(batch: int, runs: str, tmp_path: Path) -> None:
    """CUDA: the split block merges its own head's partials (offset by grid z; at batch 3 a run
    of 2 heads every 4 partial rows) into the staged activation, streams its weight columns and
    adds its sums into r. The merge takes a few threads: by default (MK_CUDA_MERGE_EARLY=auto)
    the warps beside it ask for the weights."""
    text = ATTN_OPROJ if batch == 1 else ATTN_OPROJ_B3
    src = cuda_source(text, tmp_path, merge_rows=batch, **OPTIONS)
    body = src[src.index("// task.grid @k2_r") :]
    body = body[: body.index("\n}\n")]
    merge = re.search(rf"mk::gpu::merge_rows_beside<4, 16{runs}>\((.*)\);", body)
    assert merge is not None and "2 * bz" in merge.group(1)
    assert f", {2 * batch}, -1e+29f," in merge.group(1)  # the block's rows
    assert "mk::gpu::stream_linear<" in body and "mma_tile" not in body
    assert "mk::gpu::add_run_elem<" in body


def test_merge_early_beside_asks_for_the_weights_while_the_partials_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MK_CUDA_MERGE_EARLY=beside: the threads of the warps that do not merge ask the L2 for the
    block's weights (merge_rows_beside, no round held in registers) and the stream then loads
    them as usual; at batch 3 too. nvcc builds it without spills; an unknown mode is named."""
    monkeypatch.setenv("MK_CUDA_MERGE_EARLY", "beside")
    for text, extra in ((ATTN_OPROJ, {}), (ATTN_OPROJ_B3, {"merge_rows": 3})):
        body = _split_body(cuda_source(text, tmp_path, **extra, **OPTIONS))
        assert "mk::gpu::merge_rows<" not in body and "WeightRound" not in body
        merge = re.search(
            r"mk::gpu::merge_rows_beside<[^;]*\[&\]\(int t, int n\) \{ (.*?) \}\);", body
        )
        assert merge is not None and merge.group(1) == "mk::gpu::prefetch_rows_l2_by(sl, t, n);"
        call = re.search(r"mk::gpu::stream_linear<\d+, \d+, \d+, \d+, false>\(sl\);", body)
        weights = body.index("sl.w[0] = ")
        assert call is not None
        assert weights < merge.start() < body.index("sl.x_ready = true;") < call.start()
    _assert_builds_without_spills(tmp_path)
    monkeypatch.setenv("MK_CUDA_MERGE_EARLY", "ahead")
    with pytest.raises(mk.MkError, match="MK_CUDA_MERGE_EARLY must be one of auto, 0, beside"):
        cuda_source(ATTN_OPROJ, tmp_path, **OPTIONS)


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("dims", "beside"),
    [((16, 8, 1024, 128, 1024), True), ((32, 8, 1024, 64, 2048), True),
     ((32, 8, 4096, 128, 4096), False)],
)  # fmt: skip
def test_merge_early_auto_asks_beside_only_a_small_merge(
    dims: tuple[int, int, int, int, int], beside: bool, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """MK_CUDA_MERGE_EARLY=auto (the default): the split o-projection's idle warps ask for its
    weights beside the merge where the merge takes at most a quarter of the CTA's threads
    (qwen3-0.6b's and llama-3.2-1b's shapes: 2 or 4 heads of 128 or 64 columns a KV head, 64
    of 256 threads), not at qwen3-8b's (4 heads of 128: 128 threads); `auto` and unset are the
    same build."""

    def source() -> str:
        prog = mk.compile(
            attention_oproj(*dims), target="cuda", num_sms=132, cache_dir=tmp_path, split_loop=1
        )
        return prog.cuda_source  # type: ignore[attr-defined]

    src = source()
    assert ("mk::gpu::merge_rows_beside<" in src) == beside
    assert ("mk::gpu::merge_rows<" in src) == (not beside)
    if beside:
        assert "[&](int t, int n) { mk::gpu::prefetch_rows_l2_by(sl, t, n); });" in src
    monkeypatch.setenv("MK_CUDA_MERGE_EARLY", "auto")
    assert source() == src


def _assert_builds_without_spills(tmp_path: Path) -> None:
    """Where nvcc is present: the split o-projection's program builds and no body spills."""
    if build.nvcc() is not None:
        prog = mk.compile(ATTN_OPROJ, target="cuda", cache_dir=tmp_path, **OPTIONS)
        used = prog.cuda_resources  # type: ignore[attr-defined]
        assert prog.library_path is not None and used is not None and used.spill_stores == 0


def _split_body(src: str) -> str:
    body = src[src.index("// task.grid @k2_r") :]
    return body[: body.index("\n}\n")]
