"""backends/cuda/barriers.py: a barrier exactly where an element loop or a statement could see
another thread's unfinished work, and the decode epilogues that need none."""

from __future__ import annotations

from pathlib import Path

import pytest

import mk
from mk.backends.cuda.barriers import BARRIER, PLACEHOLDER, Loop, place_barriers

ROOT = Path(__file__).resolve().parents[2]


def _loop(n: int, reads: tuple[tuple[str, str], ...], writes: tuple[str, ...]) -> Loop:
    return Loop(n, reads, writes, (f"LOOP {' '.join(writes) or 'store'}",))


def _place(lines: list[str], loops: list[Loop], trailing: bool = True) -> list[str]:
    return place_barriers(lines, loops, trailing)


def test_loops_reading_their_own_elements_share_no_barrier() -> None:
    loops = [_loop(8, (), ("a",)), _loop(8, (("a", "e"),), ("b",)), _loop(8, (("b", "e"),), ())]
    out = _place([f"{PLACEHOLDER}{i}" for i in range(3)], loops)
    assert out == ["LOOP a", "LOOP b", "LOOP store", BARRIER]
    assert _place([f"{PLACEHOLDER}{i}" for i in range(3)], loops, trailing=False)[-1] != BARRIER


@pytest.mark.parametrize(("n", "at"), [(8, "0"), (8, "(e) % 4u"), (16, "e")])
def test_other_offsets_or_extents_wait_for_the_writer(n: int, at: str) -> None:
    loops = [_loop(8, (), ("a",)), _loop(n, (("a", at),), ("b",))]
    out = _place([f"{PLACEHOLDER}0", f"{PLACEHOLDER}1"], loops, trailing=False)
    assert out == ["LOOP a", BARRIER, "LOOP b"]


def test_statements_wait_for_loops_but_declarations_do_not() -> None:
    loops = [_loop(8, (), ("a",)), _loop(8, (("c", "0"),), ("d",))]
    lines = [
        f"{PLACEHOLDER}0",
        "mk::gpu::Tile<float> t9_x(arena, 8);",
        "t9_x.resize(8);",
        "c.alias(a);",
        f"{PLACEHOLDER}1",  # reads a's storage through the view c at another offset
        "mk::gpu::div_tile(d, 2.0f);",
    ]
    out = _place(lines, loops)
    assert out == [
        "LOOP a",
        "mk::gpu::Tile<float> t9_x(arena, 8);",
        "t9_x.resize(8);",
        "c.alias(a);",
        BARRIER,
        "LOOP d",
        BARRIER,
        "mk::gpu::div_tile(d, 2.0f);",
    ]


def test_a_tile_loop_synchronises_each_iteration() -> None:
    loops = [_loop(4, (), ("a",))]
    lines = ["for (int64_t it = 0; it < 2; ++it) {", f"{PLACEHOLDER}0", "}"]
    assert _place(lines, loops, trailing=False) == [lines[0], "LOOP a", BARRIER, "}"]


@pytest.mark.usefixtures("no_nvcc")
def test_decode_epilogues_run_without_barriers(tmp_path: Path) -> None:
    """The residual add of the Llama block's o-projection and down-projection: load the residual,
    add, store, all at the same elements, so the streamed linear's own barrier is the last one."""
    prog = mk.compile(ROOT / "examples/llama3_8b_block.mlir", target="cuda", cache_dir=tmp_path)
    src: str = prog.cuda_source  # type: ignore[attr-defined]
    bodies = [b for b in src.split("__device__ __noinline__")[1:] if "stream_linear<" in b]
    residual = [b for b in bodies if b.count("// load") == 1 and "// store" in b]
    assert residual
    for body in residual:
        after = body[body.index("stream_linear<") :]
        assert BARRIER not in after.split("return 0;")[0]


@pytest.mark.usefixtures("no_nvcc")
def test_split_merge_reduces_in_element_loops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As tile steps, the split-KV merge's three reductions are element loops over their outputs
    (extents resolved at emission), each after the barrier its input needs."""
    monkeypatch.setenv("MK_CUDA_MERGE_TILES", "1")
    prog = mk.compile(ROOT / "examples/attention_decode.mlir", target="cuda", cache_dir=tmp_path)
    src: str = prog.cuda_source  # type: ignore[attr-defined]
    assert "mk::gpu::reduce_tile(" not in src
    lines = src.splitlines()
    reduces = [i for i, line in enumerate(lines) if "mk::gpu::reduce_line(" in line]
    assert len(reduces) == 3
    for i in reduces:  # each reads a tile an element loop just wrote at other offsets
        assert BARRIER in lines[i - 2] or BARRIER in lines[i - 3]


def test_every_loop_mode_puts_a_barrier_after_each_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MK_CUDA_BARRIERS", "all")
    loops = [_loop(8, (), ("a",)), _loop(8, (("a", "e"),), ("b",))]
    out = _place([f"{PLACEHOLDER}0", f"{PLACEHOLDER}1"], loops, trailing=False)
    assert out == ["LOOP a", BARRIER, "LOOP b"]
