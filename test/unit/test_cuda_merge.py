"""The split-KV merge on the GPU: the merge kernel as one call, the merge folded into the
o-projection's staged activation, and both against the reference on a GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from attention_programs import attention, attention_oproj, matches_the_reference
from xdsl.dialects import arith

import mk
from mk import compiler
from mk.backends.cuda.split_merge import MergedX, plan_merge
from mk.backends.cuda.stream import plan_stream
from mk.dialects import make_context
from mk.dialects.mugraph import GraphDefOp
from mk.inputs import random_inputs
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.source import load_module

ROOT = Path(__file__).resolve().parents[2]


def _merges(text: str, **options: int) -> dict[str, GraphDefOp]:
    module = load_module(text)
    NnToMugraphPass(**options).apply(make_context(), module)
    return {
        op.results[0].name_hint or "": op
        for op in module.walk()
        if isinstance(op, GraphDefOp) and plan_merge(op) is not None
    }


@pytest.mark.parametrize(
    ("example", "kernel", "splits", "rows", "width"),
    [("attention_decode", "o", 4, 4, 64),
     ("llama3_8b_block", "att2", 16, 4, 128),  # a KV head's share of 16 folds into wo's loop
     ("decoder_block", "att2", 2, 2, 64)],
)  # fmt: skip
def test_merge_kernels_of_the_examples_become_one_call(
    example: str, kernel: str, splits: int, rows: int, width: int
) -> None:
    # decoder_block's 128 keys are one split by default (two chunks a split at batch 1), without
    # a merge: its two splits are asked for; the others' are the automatic choice.
    options = {"kv_splits": splits} if example == "decoder_block" else {}
    merges = _merges((ROOT / "examples" / f"{example}.mlir").read_text(), **options)
    assert list(merges) == [kernel]
    plan = plan_merge(merges[kernel])
    assert plan is not None and (plan.splits, plan.rows, plan.width) == (splits, rows, width)
    # The three sums stay tiles for the normalisation; the partials and weights do not.
    streamed = plan.streamed()
    assert not {r.res for r in plan.results()} & streamed
    assert {plan.out.tile, plan.peak.tile, plan.total.tile} <= streamed


def test_a_merge_of_another_form_keeps_its_tile_steps() -> None:
    text = attention(1, 8, 2, 256, 64)
    (op,) = _merges(text, kv_splits=4).values()
    sub = next(o for o in op.walk() if isinstance(o, arith.SubfOp))
    sub.operands = (sub.rhs, sub.lhs)  # e^(mx − m): not the merge's weights
    assert plan_merge(op) is None
    assert not _merges(text, kv_splits=1)  # a single split has no merge kernel


@pytest.mark.usefixtures("no_nvcc")
def test_emitted_merge_call(tmp_path: Path) -> None:
    # 16 splits: a merge that reads more than mugraph-fuse-loop folds stays a kernel of its own
    # (unsplit: split a KV head a block, each block's share would fold).
    prog = mk.compile(
        ROOT / "examples/llama3_8b_block.mlir", target="cuda", cache_dir=tmp_path, kv_splits=16,
        split_loop=0,
    )  # fmt: skip
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert src.count("mk::gpu::merge_splits<16, 4, 128>(") == 1
    merge = [b for b in src.split("__device__ __noinline__") if "merge_splits<" in b][0]
    assert "reduce_line" not in merge and merge.count("__syncthreads") == 0


@pytest.mark.usefixtures("no_nvcc")
def test_more_splits_than_registers_hold_merge_in_two_passes(tmp_path: Path) -> None:
    text = attention(1, 8, 2, 64 * 40, 64)
    (op,) = _merges(text, kv_splits=40).values()
    plan = plan_merge(op)
    assert plan is not None and plan.splits == 40
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path, kv_splits=40)
    assert "mk::gpu::merge_splits<40, 4, 64>(" in prog.cuda_source  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [2, 32, 40])
def test_merged_splits_match_the_reference(splits: int, tmp_path: Path) -> None:
    """The merge call on both sides of the splits it holds in registers."""
    text = attention(2, 8, 2, 64 * splits, 64)
    assert _merges(text, kv_splits=splits)
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path, kv_splits=splits)
    inputs = random_inputs(prog.func, seed=splits)
    (out,) = prog(*inputs)
    (ref,) = mk.reference(text, *inputs)
    error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
    assert error <= bound, (splits, error)


# --------------------------------------------------------------------------- merge in the o-proj


def _fused_oproj(text: str, label: str = "loop+", **options: int) -> GraphDefOp:
    """The o-projection the merge folded into (`label` "loop+", split_loop 0 unless given) or
    its split form ("split+")."""
    module = load_module(text)
    given = {"tile_n": 0, "split_loop": int(label == "split+"), **options}
    compiler.run_pipeline(module, given, compiler.PIPELINE[:2])
    return next(
        op
        for op in module.walk()
        if isinstance(op, GraphDefOp) and label in str(op.attributes.get("mk.fused", ""))
    )


def test_the_folded_merge_is_staged_by_one_call() -> None:
    op = _fused_oproj(attention_oproj(16, 8, 1024, 128, 1024))
    plan = plan_stream(op)
    assert plan is not None and isinstance(plan.x, MergedX)
    assert (plan.x.merge.splits, plan.x.rows, plan.x.merge.width) == (8, 16, 128)
    assert plan.x.empty_below == pytest.approx(-1e29)
    assert not plan.tensor_cores(2048)


def test_a_split_oprojs_merge_is_staged_by_one_call() -> None:
    """Under mugraph-split-loop a block merges one KV head's 2 rows of 16 splits (qwen3-0.6b's
    batch-1 shape), and streams on CUDA cores."""
    op = _fused_oproj(attention_oproj(16, 8, 1024, 128, 1024), "split+")
    plan = plan_stream(op)
    assert op.grid_shape() == (16, 1, 8) and plan is not None and isinstance(plan.x, MergedX)
    assert (plan.x.merge.splits, plan.x.rows, plan.x.merge.width) == (16, 2, 128)
    assert not plan.tensor_cores(256)


def test_a_batchs_folded_merge_is_staged_by_one_call() -> None:
    """With merge-rows, batch 8's merge (a block per KV head, all rows) folds as well, and the
    staged activation is every batch row's heads: 8 x 16 partial rows, on CUDA cores."""
    text = attention_oproj(16, 8, 1024, 128, 1024, batch=8)
    op = _fused_oproj(text, merge_rows=8, kv_splits=2)
    plan = plan_stream(op)
    assert plan is not None and isinstance(plan.x, MergedX)
    assert (plan.x.merge.splits, plan.x.rows, plan.x.merge.width, plan.rows) == (2, 128, 128, 8)
    assert not plan.tensor_cores(2048)


def test_a_folded_merge_of_another_form_does_not_stream() -> None:
    op = _fused_oproj(attention_oproj(4, 2, 128, 16, 32), kv_splits=4)
    assert plan_stream(op) is not None
    div = next(o for o in op.walk() if isinstance(o, arith.DivfOp))
    div.operands = (div.rhs, div.lhs)  # lsum / osum
    assert plan_stream(op) is None


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("batch", "split_loop", "splits", "rows"),
    [(1, 0, 8, 16), (1, 1, 16, 2), (8, 0, 2, 128)],
)
def test_emitted_merged_activation(
    batch: int, split_loop: int, splits: int, rows: int, tmp_path: Path
) -> None:
    """One call merges every partial row (batch rows x query heads) into the staged activation;
    split by KV head (mugraph-split-loop), a block's own 2 rows, with the idle warps beside it
    asking for the weights (MK_CUDA_MERGE_EARLY=auto: 64 of 256 threads merge)."""
    text = attention_oproj(16, 8, 1024, 128, 1024, batch=batch)
    options = {"merge_rows": batch} if batch > 1 else {}
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path, split_loop=split_loop, **options)
    src = prog.cuda_source  # type: ignore[attr-defined]
    call = "merge_rows_beside" if split_loop else "merge_rows"
    assert src.count(f"mk::gpu::{call}<{splits}, 128>(") == 1 and "sl.x_ready = true;" in src
    stride = batch * 16  # the maxima's split stride, then the rows
    assert f", {stride}, {rows}, -1e+29f," in src
    assert "merge_splits<" not in src  # no merge kernel left


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dims", "splits", "batch"),
    [
        ((4, 2, 128, 16, 32), 4, 1),
        ((16, 8, 1024, 128, 1024), 0, 1),
        ((32, 8, 1024, 64, 2048), 0, 1),
        ((4, 2, 128, 16, 32), 4, 3),
        ((16, 8, 1024, 128, 1024), 2, 8),
    ],
)
def test_merge_folded_into_the_oproj_matches_the_reference(
    dims: tuple[int, int, int, int, int], splits: int, batch: int, tmp_path: Path
) -> None:
    """Batch 1 by default; several rows with merge-rows (one merge block per KV head)."""
    text = attention_oproj(*dims, batch=batch)
    options = {"kv_splits": splits, "merge_rows": batch}
    prog = mk.compile(text, target="cuda", cache_dir=tmp_path, **options)
    assert "merge_rows<" in prog.cuda_source  # type: ignore[attr-defined]
    matches_the_reference(prog, text, dims)
