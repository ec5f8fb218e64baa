"""mugraph-fuse-epilogue: the rewrite on the lit test's kernels, positions of a written tile in
the interpreter, and decode loops with the partial argmax in the lm_head's blocks on the CPU
executor, in the CUDA source and on the GPU."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import tiny_generation

import mk
from mk.dialects.mugraph import GraphDefOp
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
from mk.passes.mugraph_fuse_epilogue import fuse_epilogues
from mk.source import entry_function, load_module

ROOT = Path(__file__).resolve().parents[2]
LIT = ROOT / "test" / "lit" / "passes" / "mugraph_fuse_epilogue.mlir"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")


def _cases() -> list[str]:
    return LIT.read_text().split("// -----")


def _fused_text(text: str) -> tuple[str, int]:
    module = load_module(text)
    count = fuse_epilogues(module)
    module.verify()
    return str(module), count


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mk-epilogue-cache")


def test_only_the_matching_tiles_fuse() -> None:
    counts = [_fused_text(text)[1] for text in _cases()]
    assert counts == [1, 0, 0, 0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fused_argmax_finds_what_the_separate_one_finds(seed: int) -> None:
    """Positions of the written tile are global vocabulary rows: the fused kernel's partials and
    the token are the separate kernels' exactly, on random logits with a planted maximum."""
    text = _cases()[0]
    fused, _ = _fused_text(text)
    x, w = random_inputs(entry_function(load_module(text)), seed=seed)
    w[(7919 * (seed + 1)) % w.shape[0]] = np.abs(w).max() * 4  # a row no block boundary hides
    want = run_mugraph(text, x.copy(), w.copy())
    got = run_mugraph(fused, x.copy(), w.copy())
    for g, r in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, r)
    logits = np.asarray(want[0], dtype=np.float32)
    assert int(np.asarray(got[1]).ravel()[0]) == int(np.argmax(logits[0]))


def _decode(config_name: str, cache: Path, target: str, **options: object) -> mk.Program:
    config = preset(config_name)
    return mk.compile(decode_program(config, 2, 5, 4), target=target, cache_dir=cache, **options)


def test_the_decode_loop_loses_its_argmax_partials_grid(cache: Path) -> None:
    fused = _decode("tiny", cache, "cpu").ir("task")
    apart = _decode("tiny", cache, "cpu", epilogues=False).ir("task")
    assert re.search(r"task\.grid @k\d+_next_pv ", apart)
    assert not re.search(r"task\.grid @k\d+_next_pv ", fused)
    assert re.search(r"writes\(@logits\[.*\], @next_pv\[.*\], @next_pi\[", fused)
    assert fused.count("task.grid @") == apart.count("task.grid @") - 1


@needs_gxx
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_tiny_generates_the_same_tokens_with_and_without(name: str, cache: Path) -> None:
    config = preset(name)
    weights = random_weights(config)
    prompt = random_prompt(config, 2)
    args = program_inputs(config, weights, 2, 5, prompt)
    outs = [
        _decode(name, cache, "cpu", epilogues=on, gather_pairs=int(on))(*[np.copy(a) for a in args])
        for on in (True, False)
    ]
    for got, want in zip(outs[0], outs[1], strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    tokens, logits = outs[0]
    got = generated_tokens(tokens, 0, 4)
    ref = reference_generate(config, weights, prompt, 4, context=5, forced=got)
    result = compare(got, ref.logits, {3: np.asarray(logits).astype(np.float32)})
    assert result.ok, result.problems


@pytest.mark.usefixtures("no_nvcc")
def test_the_cuda_body_takes_positions_from_its_output(cache: Path) -> None:
    """The lm_head's body stores its logits and finds their maximum at the rows it wrote."""
    src = _decode("tiny", cache, "cuda").cuda_source  # type: ignore[attr-defined]
    body = src[src.index("// task.grid @k") :]
    lm_head = next(b for b in body.split("// task.grid @")[1:] if "_logits" in b.split("\n")[0])
    assert "mk::gpu::argmax_tile(" in lm_head
    assert re.search(r"mk::gpu::position_tile\([^;]*, 1, \d+ \* bx\);", lm_head)
    assert "_next_pv" not in src


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_tiny_generates_the_reference_tokens_on_the_gpu(name: str, cache: Path) -> None:
    tiny_generation.assert_generates_the_reference(name, _decode(name, cache, "cuda"))


def test_graph_defs_keep_their_results_in_order() -> None:
    """The producer's results first, then the consumer's, each named as before."""
    module = load_module(_cases()[0])
    fuse_epilogues(module)
    graphs = [op for op in module.walk() if isinstance(op, GraphDefOp)]
    assert [r.name_hint for r in graphs[0].res] == ["l", "pv", "pi"]


def test_nn_to_mugraph_chunks_an_argmax_as_its_producer_blocks_only_where_it_fuses() -> None:
    """The lm_head-shaped producer gives its 16 blocks; one that rounds its f32 sums as it
    stores them (its tile is not what a reader loads) gives none, and the argmax keeps its own
    chunks."""
    from mk.passes.nn_to_mugraph_rules import producer_parts

    parts = []
    for text in (_cases()[0], _cases()[2]):
        module = load_module(text)
        first = next(op for op in module.walk() if isinstance(op, GraphDefOp))
        parts.append(producer_parts(first.res[0]))
    assert parts == [16, None]


@pytest.mark.usefixtures("no_nvcc")
def test_the_fused_decode_is_deterministic(cache: Path) -> None:
    """Two compiles of one decode give byte-identical task IR and CUDA source."""
    first, second = (_decode("tiny-qwen3", cache, "cuda") for _ in range(2))
    assert first.ir("task") == second.ir("task")
    assert first.cuda_source == second.cuda_source  # type: ignore[attr-defined]
    assert "mk::gpu::pick_ids(" in first.cuda_source  # type: ignore[attr-defined]
