"""backends/cuda/load_groups.py: consecutive run loads of a task body issued together."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mk
from mk.backends.cuda.load_groups import MOST_HELD, group_loads

ROOT = Path(__file__).resolve().parents[2]


def _load(tile: str, n: int, buffer: int) -> str:
    return (
        f"mk::gpu::load_runs<mk::DTYPE_BF16, {n}, {n}>({tile}, buffers[{buffer}], 0, {n});  // load"
    )


@pytest.fixture
def grouping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MK_CUDA_LOAD_GROUPS", "1")


@pytest.mark.usefixtures("grouping")
def test_loads_with_only_resizes_between_go_out_together() -> None:
    lines = [
        "a.resize(128);",
        _load("a", 128, 0),
        "b.resize(64);",
        _load("b", 64, 1),
        "c.alias(a);",
    ]
    assert group_loads(lines) == [
        "a.resize(128);",
        "b.resize(64);",
        "mk::gpu::load_runs_together(mk::gpu::run_load<mk::DTYPE_BF16, 128, 128>(a, buffers[0], 0, "
        "128), mk::gpu::run_load<mk::DTYPE_BF16, 64, 64>(b, buffers[1], 0, 64));  // load",
        "c.alias(a);",
    ]


@pytest.mark.usefixtures("grouping")
def test_a_lone_load_or_one_behind_a_barrier_stays_as_it_is() -> None:
    lines = ["a.resize(8);", _load("a", 8, 0), "__syncthreads();", "b.resize(8);", _load("b", 8, 1)]
    assert group_loads(lines) == lines


@pytest.mark.usefixtures("grouping")
def test_a_trailing_resize_stays_with_what_follows() -> None:
    lines = [_load("a", 8, 0), _load("b", 8, 1), "c.resize(8);", "MK_FOR_EACH_U32(e, 8) {"]
    out = group_loads(lines)
    assert out[0].startswith("mk::gpu::load_runs_together(") and out[1:] == lines[2:]


@pytest.mark.usefixtures("grouping")
def test_a_group_holds_at_most_sixteen_values_a_thread() -> None:
    # 256 threads: a 2048-element run holds 8 values a thread, so the third starts a new group.
    lines = [_load(t, 2048, i) for i, t in enumerate("abc")]
    out = group_loads(lines)
    assert [line.count("run_load<") for line in out] == [2, 0] and out[1] == lines[2]
    assert 2 * 2048 // 256 == MOST_HELD


def _product(call: str) -> list[str]:
    return [
        "{",
        "mk::gpu::StreamLinear sl{};",
        "sl.w[0] = mk::gpu::StreamWeight{p, 8, 8, q};",
        call,
        "}",
    ]


@pytest.mark.usefixtures("grouping")
def test_a_residual_after_a_product_is_loaded_before_it() -> None:
    """The loads right after a streamed product go out before its block; their stores stay."""
    block = _product("mk::gpu::stream_linear<1, 1, 8, 1, false>(sl);")
    lines = ["a.resize(1);", *block, "r.resize(8);", _load("r", 8, 2), "MK_FOR_EACH_U32(e, 8) {"]
    out = group_loads(lines)
    assert out == [
        "a.resize(1);",
        "auto early0 = mk::gpu::load_early(mk::gpu::run_load<mk::DTYPE_BF16, 8, 8>(r, "
        "buffers[2], 0, 8));",
        *block,
        "r.resize(8);",
        "mk::gpu::store_loaded(early0);  // load",
        "MK_FOR_EACH_U32(e, 8) {",
    ]


@pytest.mark.usefixtures("grouping")
def test_a_product_of_staged_weights_keeps_its_loads_after_it() -> None:
    call = "if (!mk::gpu::stream_linear<1, 4, 4, 1, false, true>(sl)) return 2147483646;"
    lines = [*_product(call), "r.resize(8);", _load("r", 8, 2)]
    assert group_loads(lines) == lines


def test_off_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MK_CUDA_LOAD_GROUPS", "0")
    lines = [_load("a", 8, 0), _load("b", 8, 1)]
    assert group_loads(lines) == lines


@pytest.mark.usefixtures("grouping")
def test_the_decode_layer_loads_its_qk_norm_inputs_together(tmp_path: Path) -> None:
    """QK-norm + RoPE of a decode layer (its own kernel where the attention is not folded): the
    row, the norm weight, cos and sin (and the cache position) in one group, the residuals ahead
    of their products; the CUDA compiles where nvcc is present (no GPU needed)."""
    prog = mk.compile(ROOT / "examples" / "llama3_8b_block.mlir", target="cuda", num_sms=16,
                      cache_dir=tmp_path, attention_fold=0, split_loop=0)  # fmt: skip
    source = prog.cuda_source or ""
    groups = re.findall(r"mk::gpu::load_runs_together\((.*)\);  // load", source)
    assert groups and max(g.count("mk::gpu::run_load<") for g in groups) >= 4
    lines = source.splitlines()
    for a, b in zip(lines, lines[1:], strict=False):
        assert not ("load_runs<" in a and "load_runs<" in b), (a, b)
    # The o- and down projections' residuals (the o-projection unsplit: mugraph-split-loop's
    # blocks take theirs from the sum's start): loaded before their products, stored after.
    early = re.findall(r"auto (early\d+) = mk::gpu::load_early\(", source)
    assert len(early) >= 2 and source.count("mk::gpu::store_loaded(") == len(early)
    resources = prog.cuda_resources  # type: ignore[attr-defined]
    assert resources is None or resources.spilling == 0
