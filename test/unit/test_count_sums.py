"""Counted sums (mugraph-to-task{count-sums}): the IR, the events, the CPU run and the CUDA."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

import mk
from mk import compiler
from mk.backends.cuda import build as cuda_build
from mk.dialects.task import BufferOp, GridOp
from mk.inputs import random_inputs
from mk.models.build import decode_program
from mk.models.config import preset
from mk.pipeline import run_pipeline
from mk.source import load_module

ROOT = Path(__file__).resolve().parents[2]
BLOCK = ROOT / "examples" / "decoder_block.mlir"
HAS_NVCC = cuda_build.nvcc() is not None


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mk-count-cache")


@pytest.fixture(scope="module")
def block(cache: Path) -> mk.Program:
    return mk.compile(BLOCK, target="cpu", count_sums=True, cache_dir=cache)


def _buffers(prog: mk.Program) -> dict[str, BufferOp]:
    return {op.sym_name.data: op for op in prog.graph.body.block.ops if isinstance(op, BufferOp)}


def _grids(prog: mk.Program) -> dict[str, GridOp]:
    return {op.sym_name.data: op for op in prog.graph.body.block.ops if isinstance(op, GridOp)}


def test_sums_that_plain_loads_read_are_counted(block: mk.Program) -> None:
    """The block's two sums: r (x stored, then the o-projection's two splits) and the MLP's
    y_acc (x stored, the o-projection's two, the MLP's eight tasks)."""
    counted = {name: b.terms for name, b in _buffers(block).items() if b.terms}
    assert counted == {"r": 3, "y_acc": 11}
    for name in counted:
        buf = _buffers(block)[name]
        assert buf.is_flagged and buf.nbytes == 8 * int(np.prod(buf.shape))
    assert "task.buffer @y_acc activation flagged counted 11 offset" in block.ir("task")


def test_adders_wait_for_the_first_store_only(block: mk.Program) -> None:
    """The o-projection and the MLP add into y_acc in any order: the MLP waits for the sum's
    first store (the start grid), and for r's counts, but not for the o-projection's adds."""
    grids = _grids(block)
    mlp = next(g for name, g in grids.items() if name.endswith("_y_acc"))
    oproj = next(g for name, g in grids.items() if name.endswith("_r"))
    start = next(g for name, g in grids.items() if name.endswith("_start"))
    waits = [w.event_name for w in mlp.waits]
    assert any(e.startswith(start.sym_name.data) for e in waits), waits
    assert not any(e.startswith(oproj.sym_name.data) and e.endswith("_done") for e in waits)
    assert any(e.startswith(oproj.sym_name.data) and e.endswith("_flags") for e in waits)


def test_without_the_option_nothing_is_counted() -> None:
    task = run_pipeline(load_module(BLOCK), {})["task"]
    assert " counted" not in task and "task.buffer @y_acc activation offset" in task


def test_the_cpu_executor_runs_counted_programs(block: mk.Program) -> None:
    for seed in (0, 1):
        inputs = random_inputs(block.func, seed=seed)
        refs = mk.reference(BLOCK, *[x.copy() for x in inputs])
        for out, ref in zip(block(*inputs), refs, strict=True):
            error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
            assert error <= bound


def test_a_decode_step_counts_its_residual_sums() -> None:
    """A two-layer qwen3-0.6b step: each layer's r takes x and the o-projection's 8 head-pair
    splits, its y_acc those and the MLP's 128 tasks; the next layer's start copies y_acc."""
    cfg = dataclasses.replace(preset("qwen3-0.6b"), layers=2, vocab=2048)
    module = load_module(decode_program(cfg, 1, 1024, 8))
    task = run_pipeline(module, {"count_sums": True, "num_sms": 132, "tile_n": 0})["task"]
    counted = re.findall(r"task.buffer @(\w+) activation flagged counted (\d+)", task)
    assert counted == [("l0_r", "9"), ("l0_y_acc", "137"), ("l1_r", "9"), ("l1_y_acc", "137")]


def test_the_megakernel_stores_adds_and_polls_counts(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mk.backends.cuda as backend

    monkeypatch.setattr(cuda_build, "nvcc", lambda: None)
    monkeypatch.setattr(backend, "nvcc", lambda: None)
    src = mk.compile(BLOCK, target="cuda", count_sums=True, cache_dir=cache).cuda_source
    assert src.count("store_count_run_elem<") == 2  # the start's stores into r and y_acc
    assert "add_count_run_elem<" in src and "add_count_tile(" in src  # o-projection, MLP
    assert "sl.x_count = mk::gpu::count_expect(arena.flag, 3);" in src  # the MLP reads r
    # the output copy loads y_acc's 67 terms (x, the o-projection's 2, the MLP's 64 tasks)
    assert re.search(r"load_flag_runs<\d+, \d+, true>\(.*, arena, 67\);", src)
    plain = mk.compile(BLOCK, target="cuda", cache_dir=cache).cuda_source
    assert "count" not in plain.replace("account", "")


def test_a_stuck_sum_names_its_terms(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog's record of a counted sum that never completed (mk::gpu::kCountCounter) as
    the host reports it: the terms seen of those wanted, and whether the word was the previous
    iteration's (its parity bit)."""
    import mk.backends.cuda as backend
    from mk.backends.cuda.host import COUNT_COUNTER, RUN_TIMEOUT
    from mk.runtime_tables import RUN_STATUS

    monkeypatch.setattr(cuda_build, "nvcc", lambda: None)
    monkeypatch.setattr(backend, "nvcc", lambda: None)
    prog = mk.compile(BLOCK, target="cuda", count_sums=True, cache_dir=cache)
    status = np.zeros((), RUN_STATUS)
    status["error"], status["sm"], status["task"] = RUN_TIMEOUT, 3, 0
    status["counter"], status["iteration"], status["wait_ms"] = COUNT_COUNTER, 2, 300
    status["value"], status["threshold"] = 45, 67
    text = str(prog._run_error(status[()]))  # type: ignore[attr-defined]
    assert "on SM 3 waits for the sum of a counted buffer it reads" in text
    assert "saw 45 of its 67 terms in iteration 2 after 300 ms" in text
    status["value"] = 512 | 67  # the last iteration's complete sum
    text = str(prog._run_error(status[()]))  # type: ignore[attr-defined]
    assert "saw 67 of its 67 terms (of the iteration before)" in text


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc is not on PATH")
def test_nvcc_builds_a_counted_megakernel(cache: Path) -> None:
    """With one watcher a reading task (MK_CUDA_COUNT_POLL=cta, the default; `threads` only
    empties count_watch, which test_cuda_backend's switch builds compile that way)."""
    prog = mk.compile(BLOCK, target="cuda", count_sums=True, cache_dir=cache)
    assert "MK_COUNT_POLL_THREADS" not in prog.cuda_source
    assert prog.library_path is not None and Path(prog.library_path).exists()
    used = prog.cuda_resources
    assert used is not None and (used.spill_stores, used.spilling) == (0, 0), used


@pytest.mark.gpu
@pytest.mark.parametrize(
    "env",
    [
        {},
        {"MK_CUDA_COUNT_POLL": "cta-early"},
    ],
    ids=["default", "cta-early"],
)
def test_counted_sums_match_the_reference_on_the_gpu(
    env: dict[str, str], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also with the readers' first weights asked for before their watch (cta-early)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    prog = mk.compile(BLOCK, target="cuda", count_sums=True, cache_dir=cache)
    for seed in (0, 1, 2):  # later launches, other parities: stale sums must not pass
        inputs = random_inputs(prog.func, seed=seed)
        refs = mk.reference(BLOCK, *[x.copy() for x in inputs])
        for out, ref in zip(prog(*inputs), refs, strict=True):
            error, bound = compiler.output_error(np.asarray(out), np.asarray(ref))
            assert error <= bound
