"""backends/cuda/pair_loops.py: loops that only store 16-bit runs take two elements a thread."""

from __future__ import annotations

from pathlib import Path

import pytest

import mk
from mk.backends.cuda.barriers import BARRIER, PLACEHOLDER, Loop, place_barriers
from mk.backends.cuda.pair_loops import PAIRED, pair_loops

ROOT = Path(__file__).resolve().parents[2]
STORE = (
    "mk::gpu::store_run_elem<mk::DTYPE_BF16, {cols}>(bp[4], 64 * bx, 2048, e, {value});  // store"
)


def _loop(n: int, writes: tuple[str, ...], *body: str) -> Loop:
    return Loop(n, (("t1_a", "e"),), writes, (f"MK_FOR_EACH_U32(e, {n}) {{", *body, "}"))


def test_a_storing_loop_takes_pairs() -> None:
    loop = _loop(8, (), "const float s1 = t1_a[e] * 2.0f;", STORE.format(cols=64, value="s1"))
    (paired,) = pair_loops([loop])
    assert (
        paired.text[0] == "for (uint32_t e2 = 2 * threadIdx.x; e2 < 8u; e2 += 2 * MK_CTA_THREADS) {"
    )
    assert "mk_pair[0][j] = s1;" in paired.text
    assert paired.text[-2] == (
        "mk::gpu::store_run_pair<mk::DTYPE_BF16, 64>(bp[4], 64 * bx, 2048, e2, mk_pair[0][0], "
        "mk_pair[0][1]);  // store"
    )
    assert paired.reads == (("t1_a", PAIRED),)


@pytest.mark.parametrize(
    ("n", "writes", "body"),
    [
        (7, (), STORE.format(cols=64, value="s1")),  # an odd extent
        (8, (), STORE.format(cols=63, value="s1")),  # runs of odd length
        (8, ("t2_b",), "t2_b[e] = 1.0f;"),  # writes a tile
        (8, (), "mk::gpu::store_run_elem<mk::DTYPE_F32, 64>(bp[4], 0, 64, e, s1);  // store"),
        (8, (), "const float s1 = 1.0f;"),  # stores nothing
    ],
)
def test_other_loops_stay(n: int, writes: tuple[str, ...], body: str) -> None:
    loop = _loop(n, writes, body)
    assert pair_loops([loop]) == [loop]


def test_a_paired_loop_waits_for_the_loop_that_wrote_its_tiles() -> None:
    """Element e is now another thread's: the barrier an own-element read would not need."""
    write = Loop(8, (), ("t1_a",), ("MK_FOR_EACH_U32(e, 8) {", "t1_a[e] = 1.0f;", "}"))
    store = _loop(8, (), STORE.format(cols=64, value="t1_a[e]"))
    loops = [write, *pair_loops([store])]
    out = place_barriers([f"{PLACEHOLDER}0", f"{PLACEHOLDER}1"], loops, trailing=False)
    assert out.count(BARRIER) == 1
    plain = place_barriers([f"{PLACEHOLDER}0", f"{PLACEHOLDER}1"], [write, store], trailing=False)
    assert plain.count(BARRIER) == 0


def test_a_loop_shorter_than_the_least_stays() -> None:
    loop = _loop(8, (), STORE.format(cols=64, value="t1_a[e]"))
    assert pair_loops([loop], least=16) == [loop]
    assert pair_loops([loop], least=8) != [loop]


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(("mode", "paired"), [("", False), ("all", True), ("0", False)])
def test_a_decode_blocks_small_loops_pair_only_when_asked(
    mode: str, paired: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default only loops of PAIR_MIN elements or more pair: a decode step's stay as timed."""
    monkeypatch.setenv("MK_CUDA_PAIR_STORES", mode)
    path = ROOT / "examples/llama3_8b_block.mlir"
    src = mk.compile(path, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert ("mk::gpu::store_run_pair<" in src) == paired
