"""nn-to-mugraph with tile-n=0: the column blocks of a linear, by wave fill or by modelled time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import mk
from mk import compiler
from mk.diagnostics import MkError
from mk.inputs import random_inputs
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.passes.nn_to_mugraph_groups import _timed_blocks, _wave_blocks, _wave_time
from mk.passes.nn_to_mugraph_rules import Tiling


def _lm_head(rows: int, vocab: int, k: int) -> str:
    x, w, y = (
        f"tensor<{rows}x{k}xbf16>",
        f"tensor<{vocab}x{k}xbf16>",
        f"tensor<{rows}x{vocab}xbf16>",
    )
    return (
        f"func.func @head(%x: {x}, %w: {w}) -> {y} {{\n"
        f"  %y = nn.linear %x, %w : ({x}, {w}) -> {y}\n"
        f"  func.return %y : {y}\n}}"
    )


@pytest.mark.parametrize(
    ("width", "k", "blocks"),
    [(4096, 4096, 128), (14336, 4096, 128), (12288, 4096, 128), (2 * 12288, 4096, 128),
     (1024, 1024, 128), (151936, 1024, 128), (128256, 2048, 128)],
)  # fmt: skip
def test_modelled_time_keeps_one_wave_and_merges_lm_head_tasks(
    width: int, k: int, blocks: int
) -> None:
    """The decode linears of the presets stay at 128 blocks on 132 SMs; the lm_heads (1,187
    and 5,344 blocks by wave fill) become 128 larger tasks."""
    t = Tiling(num_sms=132, tile_n=0, task_us=3)
    common = width // 2 if width == 2 * 12288 else width
    assert _timed_blocks(common, common, width, 1, 2 * k, t) == blocks


def test_fill_rule_is_unchanged_without_a_task_cost() -> None:
    assert _wave_blocks(128256, 128256, 1, 132) == 5344
    assert _wave_blocks(151936, 151936, 1, 132) == 1187


def test_the_model_counts_waves_of_tasks() -> None:
    t = Tiling(num_sms=4, tile_n=0, task_us=2)
    # 8 blocks of 4 rows (1 KB each) on 4 SMs: 2 waves of 2 µs + 4 KB at 25 KB/µs.
    assert _wave_time(8, 32, 1, 1000, t) == pytest.approx(2 * (2 + 4 * 1000 / 25_000))
    assert _wave_time(4, 32, 2, 1000, t) == pytest.approx(2 * (2 + 8 * 1000 / 25_000))


def test_task_us_must_not_be_negative() -> None:
    with pytest.raises(MkError, match="task-us must be >= 0"):
        NnToMugraphPass(task_us=-1).tiling()


def test_fewer_larger_tasks_agree_with_the_reference(tmp_path: Path) -> None:
    """On the CPU executor: an lm_head-shaped linear of 1,016 = 8 · 127 columns over 5 SMs, in
    127 blocks (26 waves) by wave fill and in 4 (one wave) by modelled time."""
    text = _lm_head(2, 1016, 256)
    counts = []
    for task_us in (0, 3):
        prog = mk.compile(text, num_sms=5, tile_n=0, task_us=task_us, cache_dir=tmp_path)
        counts.append(max(g.num_tasks for g in prog.graph.index().grids))  # type: ignore[attr-defined]
        inputs = random_inputs(prog.func, seed=task_us)
        (out,) = prog(*inputs)
        (ref,) = mk.reference(text, *inputs)
        error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
        assert error <= bound
    assert counts == [127, 4]
