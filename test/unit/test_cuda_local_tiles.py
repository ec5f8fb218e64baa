"""backends/cuda/local_tiles.py: a tile one element loop writes and reads back becomes a local."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cuda_fuse_loops import block_without

from mk.backends.cuda.barriers import PLACEHOLDER, Loop
from mk.backends.cuda.local_tiles import localise_tiles


def _loop(reads: tuple[tuple[str, str], ...], writes: tuple[str, ...], *body: str) -> Loop:
    return Loop(8, reads, writes, ("MK_FOR_EACH_U32(e, 8) {", *body, "}"))


DECLS = ["mk::gpu::Tile<float> t1_a(arena, 8);", "mk::gpu::Tile<float> t2_v(arena, 8);"]


def test_a_tile_written_and_stored_in_one_loop_becomes_a_local() -> None:
    loop = _loop(
        (("t0_x", "e"), ("t1_a", "e")),
        ("t1_a",),
        "const float s1 = t0_x[e];",
        "t1_a[e] = s1 * 2.0f;",
        "store(p, e, t1_a[e]);",
    )
    lines = [*DECLS[:1], "t1_a.resize(8);", f"{PLACEHOLDER}0"]
    out, loops = localise_tiles(lines, [loop])
    assert out == [f"{PLACEHOLDER}0"]
    assert loops[0].text[2:4] == (
        "const float t1_a_e = static_cast<float>(s1 * 2.0f);",
        "store(p, e, t1_a_e);",
    )
    assert loops[0].writes == () and loops[0].reads == (("t0_x", "e"),)


def test_a_view_of_the_tile_is_read_as_the_local() -> None:
    loop = _loop((("t2_v", "e"),), ("t1_a",), "t1_a[e] = 1.0f;", "store(p, e, t2_v[e]);")
    lines = [*DECLS, "t2_v.alias(t1_a);", f"{PLACEHOLDER}0"]
    out, loops = localise_tiles(lines, [loop])
    assert out == [f"{PLACEHOLDER}0"] and loops[0].text[2] == "store(p, e, t1_a_e);"


@pytest.mark.parametrize(
    ("body", "elsewhere"),
    [
        (("t1_a[e] = 1.0f;", "store(p, e, t1_a[e]);"), "use(t1_a.data());"),  # read by a call
        (("t1_a[e] = 1.0f;", "store(p, e, t1_a[0]);"), ""),  # read at another element
        (("store(p, e, t1_a[e]);", "t1_a[e] = 1.0f;"), ""),  # read before the write
        (("t1_a[e] = t1_a[e] + 1.0f;",), ""),  # accumulates
        (("t1_a[e] = 1.0f;", "t1_a[e] = 2.0f;"), ""),  # written twice
        (("t1_a[e] = 1.0f;", "store(p, e, t1_a[e]);"), "use(t2_v.data());"),  # a view read
    ],
)
def test_a_tile_seen_anywhere_else_stays(body: tuple[str, ...], elsewhere: str) -> None:
    loop = _loop((("t1_a", "e"),), ("t1_a",), *body)
    lines = [*DECLS, "t2_v.alias(t1_a);", f"{PLACEHOLDER}0", *([elsewhere] if elsewhere else [])]
    out, loops = localise_tiles(lines, [loop])
    assert out == lines and loops == [loop]


def test_a_tile_another_loop_reads_stays() -> None:
    write = _loop((), ("t1_a",), "t1_a[e] = 1.0f;")
    read = _loop((("t1_a", "e"),), (), "store(p, e, t1_a[e]);")
    lines = [*DECLS[:1], f"{PLACEHOLDER}0", "call();", f"{PLACEHOLDER}1"]
    out, loops = localise_tiles(lines, [write, read])
    assert out == lines and loops == [write, read]


@pytest.mark.usefixtures("no_nvcc")
def test_the_llama_blocks_epilogues_keep_no_tile_they_store_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer tiles with the pass than with MK_CUDA_LOCAL_TILES=0, the same stores, and every
    body that shares a function across layers still shares it."""
    kept, local = block_without(tmp_path, monkeypatch, "MK_CUDA_LOCAL_TILES")
    assert local.count("mk::gpu::Tile<") < kept.count("mk::gpu::Tile<")
    assert local.count("// store") == kept.count("// store")
    assert local.count("// task.grid") == kept.count("// task.grid")
