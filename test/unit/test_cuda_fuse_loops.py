"""backends/cuda/fuse_loops.py: element loops that need no barrier between them run as one."""

from __future__ import annotations

from pathlib import Path

import pytest

import mk
from mk.backends.cuda.barriers import BARRIER, PLACEHOLDER, Loop, place_barriers
from mk.backends.cuda.fuse_loops import fuse_element_loops

ROOT = Path(__file__).resolve().parents[2]


def block_without(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, switch: str) -> tuple[str, str]:
    """The Llama block's CUDA with `switch` set to 0, then by default."""
    path = ROOT / "examples/llama3_8b_block.mlir"
    monkeypatch.setenv(switch, "0")
    off = mk.compile(path, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    monkeypatch.delenv(switch)
    on = mk.compile(path, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    return off, on


def _loop(n: int, reads: tuple[tuple[str, str], ...], writes: tuple[str, ...], body: str) -> Loop:
    return Loop(n, reads, writes, (f"MK_FOR_EACH_U32(e, {n}) {{", body, "}"))


def _fused(lines: list[str], loops: list[Loop]) -> list[str]:
    return place_barriers(*fuse_element_loops(lines, loops), trailing=False)


def _holders(n: int) -> list[str]:
    return [f"{PLACEHOLDER}{i}" for i in range(n)]


def test_a_loop_reading_its_own_elements_joins_the_writer() -> None:
    loops = [_loop(8, (), ("a",), "A;"), _loop(8, (("a", "e"),), (), "STORE a;")]
    assert _fused(_holders(2), loops) == ["MK_FOR_EACH_U32(e, 8) {", "A;", "STORE a;", "}"]


@pytest.mark.parametrize(("n", "at"), [(8, "0"), (16, "e")])
def test_other_offsets_or_extents_stay_apart(n: int, at: str) -> None:
    loops = [_loop(8, (), ("a",), "A;"), _loop(n, (("a", at),), ("b",), "B;")]
    out = _fused(_holders(2), loops)
    assert out.count(BARRIER) == 1 and out.count("}") == 2


def test_a_loop_moves_up_past_loops_it_shares_no_tile_with() -> None:
    loops = [
        _loop(16, (), ("q",), "Q;"),
        _loop(8, (), ("k",), "K;"),
        _loop(16, (("q", "e"),), (), "STORE q;"),
        _loop(8, (("k", "e"),), (), "STORE k;"),
    ]
    lines = [_holders(4)[0], "k.resize(8);", *_holders(4)[1:]]
    assert _fused(lines, loops) == [
        "MK_FOR_EACH_U32(e, 16) {",
        "Q;",
        "STORE q;",
        "}",
        "k.resize(8);",
        "MK_FOR_EACH_U32(e, 8) {",
        "K;",
        "STORE k;",
        "}",
    ]


def test_a_loop_does_not_move_above_a_loop_it_depends_on() -> None:
    loops = [
        _loop(16, (), ("a",), "A;"),
        _loop(8, (("a", "e"),), ("b",), "B;"),
        _loop(16, (("b", "0"),), ("c",), "C;"),
    ]
    fused, groups = fuse_element_loops(_holders(3), loops)
    assert len(groups) == 3 and fused == _holders(3)


def test_statements_other_than_sizes_end_a_run() -> None:
    loops = [_loop(8, (), ("a",), "A;"), _loop(8, (("a", "e"),), (), "STORE a;")]
    lines = [_holders(2)[0], "mk::gpu::div_tile(x, 2.0f);", _holders(2)[1]]
    _, groups = fuse_element_loops(lines, loops)
    assert len(groups) == 2


def test_statement_loops_never_move_nor_take_others() -> None:
    load = Loop(8, (), ("x",), ("mk::gpu::load_runs<mk::DTYPE_BF16, 8, 8>(x, p, 0, 8);",))
    loops = [load, _loop(8, (("x", "e"),), ("y",), "Y;"), load]
    _, groups = fuse_element_loops(_holders(3), loops)
    assert len(groups) == 3


def test_a_joined_loops_sizes_move_above_it() -> None:
    loops = [_loop(8, (), ("a",), "A;"), _loop(8, (), ("b",), "B;")]
    lines = ["a.resize(8);", _holders(2)[0], "b.resize(8);", _holders(2)[1]]
    out = _fused(lines, loops)
    assert out == ["a.resize(8);", "b.resize(8);", "MK_FOR_EACH_U32(e, 8) {", "A;", "B;", "}"]


@pytest.mark.usefixtures("no_nvcc")
def test_decode_epilogues_become_one_loop_per_extent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Llama block's bodies: fewer element loops by default than with MK_CUDA_FUSE_LOOPS=0."""
    plain, fused = block_without(tmp_path, monkeypatch, "MK_CUDA_FUSE_LOOPS")
    path = ROOT / "examples/llama3_8b_block.mlir"
    assert fused.count("MK_FOR_EACH_U32(") < plain.count("MK_FOR_EACH_U32(")
    assert fused.count("// store") == plain.count("// store")
    assert fused.count(BARRIER) <= plain.count(BARRIER)
    monkeypatch.setenv("MK_CUDA_BARRIERS", "all")  # one loop per op again, for telling races apart
    strict = mk.compile(path, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert strict.count("MK_FOR_EACH_U32(") == plain.count("MK_FOR_EACH_U32(")


def test_a_loop_reading_a_view_joins_the_views_writer() -> None:
    """A reshape's view names its source's elements in their order: a store through the view
    joins the loop that wrote the source, and the view's line moves above that loop."""
    loops = [_loop(8, (), ("a",), "A;"), _loop(8, (("v", "e"),), (), "STORE v;")]
    lines = [_holders(2)[0], "v.alias(a);", _holders(2)[1]]
    out = _fused(lines, loops)
    assert out == ["v.alias(a);", "MK_FOR_EACH_U32(e, 8) {", "A;", "STORE v;", "}"]


def test_a_view_read_elsewhere_keeps_its_barrier() -> None:
    """Named by the tile it views, a read at another element still waits for the writer."""
    loops = [_loop(8, (), ("a",), "A;"), _loop(8, (("v", "0"),), ("b",), "B;")]
    lines = [_holders(2)[0], "v.alias(a);", _holders(2)[1]]
    out = _fused(lines, loops)
    assert out == ["MK_FOR_EACH_U32(e, 8) {", "A;", "}", "v.alias(a);", BARRIER, *loops[1].text]
