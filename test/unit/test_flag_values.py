"""Flagged buffers (mugraph-to-task{flag-values}): the IR, the events, the tables and the CUDA."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import mk
from mk import compiler
from mk.backends.cpu.emit_ops import BufferRef
from mk.backends.cuda import build as cuda_build
from mk.backends.cuda.emit import plain
from mk.backends.tables import tables_from_graph
from mk.diagnostics import MkError
from mk.dialects.task import BufferOp, EventOp
from mk.inputs import random_inputs
from mk.source import load_module

ROOT = Path(__file__).resolve().parents[2]
BLOCK = ROOT / "examples" / "decoder_block.mlir"
HAS_NVCC = cuda_build.nvcc() is not None


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mk-flag-cache")


@pytest.fixture(scope="module")
def block(cache: Path) -> mk.Program:
    # Unfolded (attention_fold=0): q's RoPE kernel reads q's head view (q4) by plain loads. Two
    # splits: the merge reads the attention's partials (one split would read its output). The
    # o-projection unsplit (split_loop=0): its r is then written plainly, and flagged.
    return mk.compile(
        BLOCK, target="cpu", flag_values=True, cache_dir=cache, attention_fold=0, kv_splits=2,
        split_loop=0,
    )  # fmt: skip


def _ops(prog: mk.Program, kind: type) -> list:
    return [op for op in prog.graph.body.block.ops if isinstance(op, kind)]


def test_plain_loads_make_flagged_buffers(block: mk.Program) -> None:
    flagged = {b.sym_name.data for b in _ops(block, BufferOp) if b.is_flagged}
    # q and k (read by their QK-norm) and the o-projection's output (read by the MLP's norm);
    # not v (a library copy reads it), nor q after RoPE (attention reads it in place), nor the
    # MLP's f32 sum (its blocks add into it in any order: mugraph-fuse-accumulate).
    assert flagged == {"q4", "k", "r"}
    for buf in _ops(block, BufferOp):
        if buf.is_flagged:
            assert buf.nbytes == 8 * int(np.prod(buf.shape))


def test_an_unfused_mlp_flags_its_gated_product() -> None:
    """Without the accumulating MLP the down projection reads the gated product m plainly."""
    task = compiler.run_pipeline(load_module(BLOCK), {"flag_values": True, "fuse_accumulate": 0})[
        "task"
    ]
    assert "task.buffer @m activation flagged" in task


def test_flagged_buffers_share_no_arena_bytes(block: mk.Program) -> None:
    spans = [
        (int(b.offset.value.data), int(b.offset.value.data) + b.nbytes, b.is_flagged)  # type: ignore[union-attr]
        for b in _ops(block, BufferOp)
        if b.offset is not None
    ]
    for a0, a1, fa in spans:
        for b0, b1, fb in spans:
            if (fa or fb) and (a0, a1) != (b0, b1):
                assert a1 <= b0 or b1 <= a0


def test_merged_partials_are_not_flagged(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """A split merge reduces its partials over the split dim, which the CUDA merge does by reading
    them in place: they stay unflagged, so both targets take the program (the CUDA one used to
    refuse it), and the CPU executor still matches the reference."""
    path = ROOT / "examples" / "attention_decode.mlir"
    task = compiler.run_pipeline(load_module(path), {"flag_values": True})["task"]
    assert "task.buffer @o_o activation offset" in task and " flagged" not in task
    monkeypatch.setattr(cuda_build, "nvcc", lambda: None)
    import mk.backends.cuda as backend

    monkeypatch.setattr(backend, "nvcc", lambda: None)
    assert "merge_splits" in mk.compile(path, target="cuda", flag_values=True).cuda_source
    prog = mk.compile(path, target="cpu", flag_values=True, cache_dir=cache)
    inputs = random_inputs(prog.func, seed=5)
    refs = mk.reference(path, *[x.copy() for x in inputs])
    for out, ref in zip(prog(*inputs), refs, strict=True):
        error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
        assert error <= bound


def test_reads_of_flagged_buffers_get_flagged_events(block: mk.Program) -> None:
    events = {e.sym_name.data: e.is_flagged for e in _ops(block, EventOp)}
    assert any(events.values()) and not all(events.values())
    cpu, cuda = tables_from_graph(block.graph), tables_from_graph(block.graph, flags=True)
    # The CPU keeps every counter; the CUDA tables drop the flagged events' waits and signals.
    assert len(cuda.waits) < len(cpu.waits) and len(cuda.signals) < len(cpu.signals)


def test_without_the_option_nothing_is_flagged(cache: Path) -> None:
    prog = mk.compile(BLOCK, target="cpu", cache_dir=cache)
    assert " flagged" not in prog.ir("task")


def test_the_cpu_executor_runs_flagged_programs(block: mk.Program) -> None:
    inputs = random_inputs(block.func, seed=3)
    refs = mk.reference(BLOCK, *[x.copy() for x in inputs])
    for out, ref in zip(block(*inputs), refs, strict=True):
        error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
        assert error <= bound


def test_a_flagged_buffer_read_in_place_is_refused() -> None:
    ref = BufferRef(3, "mk::DTYPE_BF16", (1, 64), flagged=True)
    op = EventOp("e", [1], 1)
    assert plain(BufferRef(3, "mk::DTYPE_BF16", (1, 64)), op, "x").index == 3
    with pytest.raises(MkError, match=r"flagged buffer \(buffers\[3\]\) is read in place"):
        plain(ref, op, "in place")


def test_the_megakernel_reads_and_writes_flags(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cuda_build, "nvcc", lambda: None)
    import mk.backends.cuda as backend

    monkeypatch.setattr(backend, "nvcc", lambda: None)
    prog = mk.compile(
        BLOCK, target="cuda", flag_values=True, cache_dir=cache, attention_fold=0, split_loop=0
    )
    src = prog.cuda_source
    assert src.count("store_flag_run_elem") >= 3 and "load_flag_runs" in src
    assert "sl.x_flag = arena.flag;" in src
    plain = mk.compile(BLOCK, target="cuda", cache_dir=cache).cuda_source
    assert "store_flag_run_elem" not in plain and "arena.flag" not in plain


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
def test_nvcc_builds_a_flagged_megakernel(cache: Path) -> None:
    prog = mk.compile(BLOCK, target="cuda", flag_values=True, cache_dir=cache)
    assert prog.library_path is not None and Path(prog.library_path).exists()
    used = prog.cuda_resources
    assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name", ["decoder_block", "gated_mlp", "rmsnorm_linear", "decode_loop", "attention_decode"]
)
def test_flagged_examples_match_the_reference_on_the_gpu(name: str, cache: Path) -> None:
    path = ROOT / "examples" / f"{name}.mlir"
    prog = mk.compile(path, target="cuda", flag_values=True, cache_dir=cache)
    for seed in (0, 1, 2):  # later launches use later flags: stale words must not pass
        inputs = random_inputs(prog.func, seed=seed)
        refs = mk.reference(path, *[x.copy() for x in inputs])
        for out, ref in zip(prog(*inputs), refs, strict=True):
            error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
            assert error <= bound
