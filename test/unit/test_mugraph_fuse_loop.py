"""mugraph-fuse-loop: which producers fold into their consumer's loop, and that the folded
programs compute what the unfolded ones do (CPU executor against the NumPy reference)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from xdsl.dialects.builtin import ModuleOp

import mk
from mk import compiler
from mk.dialects.mugraph import GraphDefOp
from mk.inputs import random_inputs
from mk.passes.mugraph_fuse_loop import fuse_loops, match_fold
from mk.source import load_module

ROOT = Path(__file__).resolve().parents[2]
LIT = ROOT / "test" / "lit" / "passes" / "mugraph_fuse_loop.mlir"

ATTN_OPROJ = """
func.func @attn_oproj(%q: tensor<1x64xbf16>, %k: tensor<1x2x128x16xbf16>, %v: tensor<1x2x128x16xbf16>, %len: tensor<1xi32>, %wo: tensor<32x64xbf16>, %x: tensor<1x32xbf16>) -> tensor<1x32xbf16> {
  %q4 = nn.reshape %q : (tensor<1x64xbf16>) -> tensor<1x4x1x16xbf16>
  %att = nn.attention %q4, %k, %v, %len {scale = 0.25 : f32, causal = false} : (tensor<1x4x1x16xbf16>, tensor<1x2x128x16xbf16>, tensor<1x2x128x16xbf16>, tensor<1xi32>) -> tensor<1x4x1x16xbf16>
  %att2 = nn.reshape %att : (tensor<1x4x1x16xbf16>) -> tensor<1x64xbf16>
  %o = nn.linear %att2, %wo : (tensor<1x64xbf16>, tensor<32x64xbf16>) -> tensor<1x32xbf16>
  %r = nn.add %x, %o : (tensor<1x32xbf16>, tensor<1x32xbf16>) -> tensor<1x32xbf16>
  func.return %r : tensor<1x32xbf16>
}
"""

# The same at batch 3: the merge folds only under merge-rows (a merge block per KV head).
ATTN_OPROJ_B3 = (
    ATTN_OPROJ.replace("tensor<1x64xbf16>", "tensor<3x64xbf16>")
    .replace("tensor<1x4x1x16xbf16>", "tensor<3x4x1x16xbf16>")
    .replace("tensor<1x2x128x16xbf16>", "tensor<3x2x128x16xbf16>")
    .replace("tensor<1xi32>", "tensor<3xi32>")
    .replace("tensor<1x32xbf16>", "tensor<3x32xbf16>")
)


def _lowered(text: str, **options: int) -> ModuleOp:
    """The mugraph stage, mugraph-split-loop off unless asked: these tests look at the fold."""
    module = load_module(text)
    given = {"num_sms": 8, "tile_n": 16, "split_loop": 0, **options}
    compiler.run_pipeline(module, given, compiler.PIPELINE[:2])
    return module


def _graph_defs(module: ModuleOp) -> list[GraphDefOp]:
    return [op for op in module.walk() if isinstance(op, GraphDefOp)]


def _fused(module: ModuleOp) -> list[GraphDefOp]:
    return [g for g in _graph_defs(module) if "loop+" in str(g.attributes.get("mk.fused", ""))]


def test_the_merge_folds_into_the_oproj_and_its_loop_walks_the_merge_blocks() -> None:
    module = _lowered(ATTN_OPROJ, kv_splits=4)
    (fused,) = _fused(module)
    assert fused.forloop_range() == 2  # 2 KV heads: the merge's blocks
    assert fused.grid_shape() == (2, 1, 1)
    reads = {op.tile.name_hint: (op.imap_dims(), op.fmap_dim()) for op in fused.input_ops()}
    assert reads["op"] == ((-1, -1, -1), 2) and reads["mp"] == ((-1, -1, -1), 2)
    assert len(_graph_defs(module)) == 2  # the split attention and the fused o-projection


def test_a_batchs_merge_folds_under_merge_rows() -> None:
    assert not _fused(_lowered(ATTN_OPROJ_B3, kv_splits=4))  # a merge block per head and row
    assert not _fused(_lowered(ATTN_OPROJ_B3, kv_splits=4, merge_rows=2))  # 3 rows > 2
    module = _lowered(ATTN_OPROJ_B3, kv_splits=4, merge_rows=3)
    (fused,) = _fused(module)
    assert fused.forloop_range() == 2
    reads = {op.tile.name_hint: (op.imap_dims(), op.fmap_dim()) for op in fused.input_ops()}
    assert reads["op"] == ((-1, -1, -1), 2) and reads["mp"] == ((-1, -1, -1), 2)
    assert len(_graph_defs(module)) == 2


@pytest.mark.parametrize(("preset", "folds"), [("qwen3-0.6b", True), ("qwen3-8b", False)])
def test_batch_eight_folds_the_merge_where_its_partials_fit(preset: str, folds: bool) -> None:
    """merge-rows=8: qwen3-0.6b's 8 rows x 16 heads x 2 splits of partials (133 KB) fold; an
    8B model's 266 KB do not, and its merge keeps a block per KV head and batch row."""
    import dataclasses

    from mk.models import decode_program
    from mk.models import preset as model_preset

    config = dataclasses.replace(model_preset(preset), layers=1)
    module = load_module(decode_program(config, 8, 1024))
    compiler.run_pipeline(module, {"merge_rows": 8, "split_loop": 0}, compiler.PIPELINE[:2])
    merges = [g for g in _graph_defs(module) if g.res[0].name_hint == "l0_att2"]
    assert (len(_fused(module)), len(merges)) == ((1, 0) if folds else (0, 1))
    assert all(g.grid_shape() == (8, 1, 8) for g in merges)


def test_merge_rows_must_be_positive() -> None:
    with pytest.raises(mk.MkError, match="merge-rows must be >= 1"):
        _lowered(ATTN_OPROJ, merge_rows=0)


def test_nothing_folds_with_fold_bytes_0_or_one_split() -> None:
    assert not _fused(_lowered(ATTN_OPROJ, kv_splits=4, fold_bytes=0))
    module = _lowered(ATTN_OPROJ, kv_splits=1)
    assert not _fused(module) and len(_graph_defs(module)) == 2


def test_a_limit_below_the_partials_keeps_the_merge() -> None:
    module = _lowered(ATTN_OPROJ, kv_splits=4, fold_bytes=0)
    merge = next(g for g in _graph_defs(module) if g.res[0].name_hint == "att2")
    partials = 4 * 64 * 4 + 2 * 4 * 4 * 4  # o, then m and l, f32
    assert match_fold(merge, partials) is not None
    assert match_fold(merge, partials - 1) is None


@pytest.mark.parametrize(
    ("preset", "splits", "unsplit"),
    [("qwen3-0.6b", 16, 8), ("llama-3.2-1b", 16, 8), ("qwen3-8b", 16, 8)],
)
def test_batch_one_picks_kv_splits_whose_merge_folds(
    preset: str, splits: int, unsplit: int
) -> None:
    """At the default splits (≈ one block per SM) an 8B model's merge reads 266 KB, past the
    fold budget: split by mugraph-split-loop, a block reads one KV head's share (33 KB) and it
    folds; without it the choice halves the splits until the whole merge fits, and every
    o-projection block merges every split, so each split also takes two chunks of keys at least
    (1,024 keys: 8 splits)."""
    import dataclasses

    from mk.models import decode_program
    from mk.models import preset as model_preset
    from mk.passes.mugraph_fuse_loop import DEFAULT_FOLD_BYTES
    from mk.passes.nn_to_mugraph_attention import kv_splits, merge_input_bytes, merge_share_bytes
    from mk.passes.nn_to_mugraph_rules import Tiling

    config = model_preset(preset)
    hq, hkv, d = config.heads, config.kv_heads, config.head_dim
    t = Tiling(num_sms=132)
    assert kv_splits(1, hq, hkv, 1024, d, t) == splits
    assert kv_splits(1, hq, hkv, 1024, d, Tiling(num_sms=132, split_loop=0)) == unsplit
    assert merge_share_bytes(splits, hq, hkv, d, t) <= DEFAULT_FOLD_BYTES
    assert merge_input_bytes(unsplit, hq, d) <= DEFAULT_FOLD_BYTES
    assert kv_splits(8, hq, hkv, 1024, d, t) == 132 // (8 * hkv)  # no batch-1 merge to fold
    for split_loop, label in ((0, "loop+"), (1, "split+")):
        module = load_module(decode_program(dataclasses.replace(config, layers=1), 1, 1024))
        compiler.run_pipeline(module, {"split_loop": split_loop}, compiler.PIPELINE[:2])
        labels = [str(g.attributes.get("mk.fused", "")) for g in _graph_defs(module)]
        assert sum(label in s for s in labels) == 1
        assert not [g for g in _graph_defs(module) if g.res[0].name_hint == "l0_att2"]


def test_the_lit_cases_that_must_not_fold_do_not() -> None:
    for chunk in LIT.read_text().split("// -----")[1:]:
        module = load_module(chunk)
        before = len(_graph_defs(module))
        assert fuse_loops(module, 1 << 30) == 0
        assert len(_graph_defs(module)) == before


def _cpu_ready() -> None:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    try:
        compiler.cpu_backend()
    except mk.MkError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize(
    ("batch", "options", "folds"),
    [
        (1, {"fold_bytes": 0}, False),
        (1, {"fold_bytes": 1 << 20}, True),
        (3, {}, False),  # a merge block per KV head and batch row
        (3, {"merge_rows": 3}, True),
    ],
)
def test_folded_and_unfolded_programs_match_the_reference(
    batch: int, options: dict[str, Any], folds: bool, tmp_path: Path
) -> None:
    _cpu_ready()
    text = ATTN_OPROJ if batch == 1 else ATTN_OPROJ_B3
    prog = mk.compile(text, cache_dir=tmp_path, kv_splits=4, split_loop=0, **options)
    assert ("loop+" in prog.ir("mugraph")) == folds
    for seed in (0, 1):
        inputs = random_inputs(prog.func, seed=seed)
        (out,) = prog(*inputs)
        (ref,) = mk.reference(text, *inputs)
        error, bound = compiler.output_error(out, ref)
        assert np.isfinite(out.astype(np.float32)).all() and error <= bound


@pytest.mark.parametrize(("split_loop", "label"), [(0, "loop+linear+add"), (1, "split+linear+add")])
def test_decoder_block_folds_and_matches_the_reference(
    split_loop: int, label: str, tmp_path: Path
) -> None:
    _cpu_ready()
    path = ROOT / "examples" / "decoder_block.mlir"
    prog = mk.compile(path, cache_dir=tmp_path, kv_splits=2, split_loop=split_loop)
    assert label in prog.ir("mugraph")
    inputs = random_inputs(prog.func, seed=3)
    (out,) = prog(*inputs)
    (ref,) = mk.reference(path, *inputs)
    error, bound = compiler.output_error(out, ref)
    assert error <= bound
