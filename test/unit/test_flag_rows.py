"""Flagged head rows (mugraph-to-task{flag-rows}): which inputs an attention reads as head rows,
the flagged buffers and events of a decode loop, the CPU executor's tokens, and the CUDA body
that polls the rows and the cache write that polls the new V row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tiny_generation

import mk
from mk import compiler
from mk.backends.cuda import build as cuda_build
from mk.dialects import make_context
from mk.dialects.mugraph import GraphDefOp
from mk.dialects.mugraph_tiles import AccumSoftmaxOp
from mk.dialects.task import BufferOp, EventOp, GridOp
from mk.dialects.task import GraphOp as TaskGraphOp
from mk.inputs import random_inputs
from mk.models import decode_program, prefill_program, preset
from mk.passes.mugraph_to_task_flags import head_row_inputs
from mk.passes.task_stats import STATS_ATTR, TaskStatsPass
from mk.source import load_module

ROOT = Path(__file__).resolve().parents[2]
DECODE = ROOT / "examples" / "decode_loop.mlir"
HAS_NVCC = cuda_build.nvcc() is not None


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mk-flag-rows-cache")


def _attention(module_text: str) -> GraphDefOp:
    mugraph = load_module(compiler.run_pipeline(load_module(module_text), {})["mugraph"])
    return next(
        op
        for op in mugraph.walk()
        if isinstance(op, GraphDefOp)
        and any(isinstance(o, AccumSoftmaxOp) for o in op.body.block.ops)
    )


def test_the_head_rows_are_the_query_and_the_new_key_and_value() -> None:
    attention = _attention(DECODE.read_text())
    sources = {attention.operands[op.source_index()] for op in head_row_inputs(attention)}
    # The attention also reads the caches (walked by the loop), the norm weights, the RoPE
    # tables and scalars: none of them is a head row.
    assert {v.name_hint for v in sources} == {"q", "k4", "v4"}


def test_flagged_buffers_and_events_of_a_decode_loop(cache: Path) -> None:
    prog = mk.compile(DECODE, target="cpu", flag_rows=True, cache_dir=cache)
    flagged = {op.sym_name.data for op in prog.graph.body.block.ops if _flagged_buffer(op)}
    assert flagged == {"q", "k4", "v4"}
    events = [op for op in prog.graph.body.block.ops if isinstance(op, EventOp) and op.is_flagged]
    assert [e.sym_name.data for e in events] == ["k6_q_flags"]
    plain = mk.compile(DECODE, target="cpu", cache_dir=cache)
    assert not any(_flagged_buffer(op) for op in plain.graph.body.block.ops)


def _grid(prog: mk.Program, name: str) -> GridOp:
    return next(
        op
        for op in prog.graph.body.block.ops
        if isinstance(op, GridOp) and op.sym_name.data == name
    )


def _edges(grid: GridOp, kind: str) -> list[str]:
    return [e.event_name for e in getattr(grid, kind)]


def test_a_projection_whose_flags_were_seen_signals_no_counter(cache: Path) -> None:
    """The attention saw the flags of every q task, so their reads of x are over by the time
    the next step's embedding (which waits for the last step's tokens) writes x, and by the
    time the logits write over x's arena bytes (they wait for r, which waits for every
    attention task): neither waits on q, and q signals only its flagged event."""
    prog = mk.compile(DECODE, target="cpu", flag_rows=True, cache_dir=cache)
    assert _edges(_grid(prog, "k6_q"), "signals") == ["k6_q_flags"]
    for name in ("k3_x", "k11_logits"):
        assert not any(e.startswith("k6_q") for e in _edges(_grid(prog, name), "waits")), name
    plain = mk.compile(DECODE, target="cpu", cache_dir=cache)
    assert "k6_q_done" in _edges(_grid(plain, "k6_q"), "signals")


def test_each_layers_attention_waits_for_what_its_projection_waited_for(cache: Path) -> None:
    """Past the first layer the attention's one counter wait is the previous layer's output,
    which its projection waited for: it implies the kv length, the RoPE tables and the previous
    step's o-projection, which the flagged read of q does not."""
    config = preset("tiny-qwen3").with_(layers=3)
    prog = mk.compile(
        decode_program(config, 2, 5, 4), target="cpu", cache_dir=cache, flag_rows=True
    )
    events = {op.sym_name.data: op for op in prog.graph.body.block.ops if isinstance(op, EventOp)}
    for layer in (1, 2):
        q = _grid(prog, f"k{6 * layer + 6}_l{layer}_q")
        attention = _grid(prog, f"k{6 * layer + 7}_l{layer}_att2")
        waits = _edges(attention, "waits")
        counters = [w for w in waits if not events[w].is_flagged]
        assert counters == _edges(q, "waits") == [f"k{6 * layer + 5}_l{layer - 1}_y_acc_done"]
        assert [w for w in waits if events[w].is_flagged] == [f"k{6 * layer + 6}_l{layer}_q_flags"]


def test_task_stats_count_the_flagged_waits() -> None:
    """task-stats' flagged_waits: the (task, wait) pairs a backend that waits on flags drops."""
    module = load_module(DECODE.read_text())
    compiler.run_pipeline(module, {"flag_rows": True})
    TaskStatsPass().apply(make_context(), module)
    graph = next(op for op in module.walk() if isinstance(op, TaskGraphOp))
    stats = graph.attributes[STATS_ATTR].data  # type: ignore[attr-defined]
    events = {op.sym_name.data: op for op in graph.body.block.ops if isinstance(op, EventOp)}
    grids = [op for op in graph.body.block.ops if isinstance(op, GridOp)]
    flagged = sum(
        grid.num_tasks * sum(events[w].is_flagged for w in _edges(grid, "waits")) for grid in grids
    )
    assert flagged > 0 and stats["flagged_waits"].value.data == flagged


def test_the_decode_example_matches_the_reference_on_the_cpu(cache: Path) -> None:
    prog = mk.compile(DECODE, target="cpu", flag_rows=True, cache_dir=cache)
    for seed in (0, 1):
        inputs = random_inputs(prog.func, seed=seed)
        refs = mk.reference(DECODE, *[x.copy() for x in inputs])
        for out, ref in zip(prog(*inputs), refs, strict=True):
            error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
            assert error <= bound


def _flagged_buffer(op: object) -> bool:
    return isinstance(op, BufferOp) and op.flagged is not None


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_the_cpu_executor_generates_the_same_tokens(name: str, cache: Path) -> None:
    args = tiny_generation.inputs(name)
    runs = [
        tiny_generation.decode(name, cache, "cpu", **options)(*[np.copy(a) for a in args])
        for options in ({}, {"flag_rows": True})
    ]
    for got, want in zip(*runs, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.usefixtures("no_nvcc")
def test_the_attention_polls_its_rows_and_the_cache_write_its_new_row(cache: Path) -> None:
    config = preset("tiny-qwen3")
    src = mk.compile(
        decode_program(config, 1, 5, 2), target="cuda", cache_dir=cache, flag_rows=True
    ).cuda_source
    assert "sa.flagged = 7;" in src and "sa.flags = &arena;" in src
    assert "sa.q = static_cast<const uint64_t*>(" in src
    assert "mk::gpu::cache_write_flagged(" in src and "cache_write_bytes" not in src
    assert "load_flag_runs" in src  # the K cache write's norm and RoPE read the new K row
    plain = mk.compile(decode_program(config, 1, 5, 2), target="cuda", cache_dir=cache)
    assert "sa.flagged" not in plain.cuda_source


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("length", [4, 16])
def test_a_prefill_flags_nothing(length: int, cache: Path) -> None:
    """A prefill's queries are no decode step's head rows (several positions, causally masked):
    with the option its program compiles as without it, no buffer flagged."""
    text = prefill_program(preset("tiny-qwen3"), 1, length, 32)
    prog = mk.compile(text, target="cuda", cache_dir=cache, flag_rows=True)
    assert not any(_flagged_buffer(op) for op in prog.graph.body.block.ops)
    plain = mk.compile(text, target="cuda", cache_dir=cache)
    assert prog.cuda_source == plain.cuda_source


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
def test_nvcc_builds_a_decode_loop_with_flagged_rows(cache: Path) -> None:
    prog = mk.compile(DECODE, target="cuda", flag_rows=True, cache_dir=cache)
    used = prog.cuda_resources
    assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used
    assert used.warnings == (), used.warnings


@pytest.mark.gpu
def test_the_decode_example_matches_the_reference_on_the_gpu(cache: Path) -> None:
    prog = mk.compile(DECODE, target="cuda", flag_rows=True, cache_dir=cache)
    for seed in (0, 1, 2):  # later launches use later flags: stale words must not pass
        inputs = random_inputs(prog.func, seed=seed)
        refs = mk.reference(DECODE, *[x.copy() for x in inputs])
        for out, ref in zip(prog(*inputs), refs, strict=True):
            error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
            assert error <= bound


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_tiny_generates_the_reference_tokens_on_the_gpu(name: str, cache: Path) -> None:
    prog = tiny_generation.decode(name, cache, "cuda", flag_rows=True)
    tiny_generation.assert_generates_the_reference(name, prog)
