"""Op marks: a profile build stamps each statement of a task body; the profile's arithmetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import mk
from mk.backends.cuda import build as cuda_build
from mk.backends.cuda.op_marks import (
    ATTENTION_PHASES,
    MARK,
    STREAM_LINEAR_PHASES,
    mark_statements,
    op_segments,
)
from mk.inputs import random_inputs

ROOT = Path(__file__).resolve().parents[2]
HAS_NVCC = cuda_build.nvcc() is not None


def test_marks_follow_statements_not_declarations() -> None:
    body = [
        "const int64_t bx = t->coord[0], by = t->coord[1], bz = t->coord[2];",
        "(void)bx; (void)by; (void)bz;",
        "mk::gpu::Tile<float> t0_x(arena, 16);",
        "t0_x.assign(16, 0.0f);",
        "{",
        "mk::gpu::StreamLinear sl{};",
        "mk::gpu::stream_linear<1, 4, 6>(sl);",
        "}",
        "mk::gpu::binary_tile(t1, mk::gpu::Dims{1, 16}, t0_x, mk::gpu::Dims{1, 16}, t0_x,",
        "    mk::gpu::Dims{1, 16}, mk::gpu::B_MUL);",
    ]
    out, labels = mark_statements(body)
    assert out.count(MARK) == 3
    assert out[out.index("t0_x.assign(16, 0.0f);") + 1] == MARK
    # Nothing inside the block is marked; the block and the two-line call are marked once each.
    assert out[out.index("}") + 1] == MARK and out[-1] == MARK
    assert out[:3] == body[:3]
    assert labels == [
        "init accumulator",
        *STREAM_LINEAR_PHASES,
        "stream_linear: sum_sq, sync",
        "binary_tile",
    ]


def test_a_statement_with_a_note_is_marked_where_it_ends() -> None:
    body = [
        "mk::gpu::rows_dot_lanes<1, 24, 1024, true>(a, w, 3072, d);  // the product",
        "mk::gpu::add_tile_v4(y, d, 1024);  // add",
        "mk::gpu::load_runs_together(mk::gpu::run_load<mk::DTYPE_BF16, 8, 8>(t,",
        "    p, 0, 8));  // load",
    ]
    out, labels = mark_statements(body)
    assert [out[i + 1] for i in (0, 2, 5)] == [MARK] * 3 and out.count(MARK) == 3
    assert labels == ["rows_dot_lanes", "add_tile_v4", "load_runs_together"]


def test_attention_marks_its_phases_then_its_merge() -> None:
    for call in ("stream_attention<2, 128>", "stream_attention_mma<2, 128, true, 3>"):
        body = ["{", "mk::gpu::StreamAttention sa{};", f"mk::gpu::{call}(sa, score);", "}"]
        out, labels = mark_statements(body)
        assert out == [*body, MARK]
        assert labels == [*ATTENTION_PHASES, "attention: merge"]


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize(
    ("mma", "call"), [("1", "stream_attention_mma<"), ("0", "stream_attention<")]
)
def test_attention_profile_stamps_its_phases(
    mma: str, call: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile build hands each streamed attention the arena for the marks between its
    phases; a plain build's source has no trace of them."""
    path = ROOT / "examples/attention_decode.mlir"
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", mma)
    plain = mk.compile(path, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert "sa.arena" not in plain and f"mk::gpu::{call}" in plain
    monkeypatch.setenv("MK_CUDA_OP_MARKS", "1")
    prog = mk.compile(path, target="cuda", cache_dir=tmp_path)
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert src.count("sa.arena = &arena;") == src.count("mk::gpu::StreamAttention sa{};") > 0
    phased = [v for v in prog.mark_labels.values() if "attention: merge" in v]  # type: ignore[attr-defined]
    assert phased
    for labels in phased:
        at = labels.index("attention: merge")
        assert labels[at - len(ATTENTION_PHASES) : at] == ATTENTION_PHASES


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not found")
@pytest.mark.parametrize("mma", ["1", "0"])
def test_attention_profile_source_builds(
    mma: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MK_CUDA_ATTN_MMA", mma)
    monkeypatch.setenv("MK_CUDA_OP_MARKS", "1")
    prog = mk.compile(ROOT / "examples/attention_decode.mlir", target="cuda", cache_dir=tmp_path)
    assert prog.library_path is not None


@pytest.mark.usefixtures("no_nvcc")
def test_profile_source_only_with_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = ROOT / "examples/rmsnorm_linear.mlir"
    plain = mk.compile(path, target="cuda", cache_dir=tmp_path)
    assert "MK_OP_MARKS" not in plain.cuda_source and MARK not in plain.cuda_source  # type: ignore[attr-defined]
    assert plain.marks == 0 and plain.mark_labels is None  # type: ignore[attr-defined]
    monkeypatch.setenv("MK_CUDA_OP_MARKS", "1")
    prog = mk.compile(path, target="cuda", cache_dir=tmp_path)
    src = prog.cuda_source  # type: ignore[attr-defined]
    assert src.startswith("// Generated") and "#define MK_OP_MARKS 1" in src.splitlines()[1:3]
    labels = prog.mark_labels  # type: ignore[attr-defined]
    grids = [g.sym_name.data for g in prog.graph.index().grids]
    assert set(labels) == set(grids)
    # Every grid's function stamps as many marks as it has labels (streamed phases included).
    assert prog.marks == max(len(v) for v in labels.values()) > 0  # type: ignore[attr-defined]
    streamed = [v for v in labels.values() if "stream_linear: weights" in v]
    assert streamed and all(v.count(MARK) == 0 for v in streamed)
    assert src.count(MARK) == sum(
        len([x for x in v if not x.startswith("stream_linear: ") or x.endswith("sync")])
        for v in {labels[g]: None for g in grids}
    )


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not found")
def test_profile_source_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MK_CUDA_OP_MARKS", "1")
    prog = mk.compile(ROOT / "examples/rmsnorm_linear.mlir", target="cuda", cache_dir=tmp_path)
    assert prog.library_path is not None


@pytest.mark.usefixtures("no_nvcc")
def test_warm_profile_is_a_profile_build_that_runs_each_body_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = ROOT / "examples/rmsnorm_linear.mlir"
    monkeypatch.setenv("MK_CUDA_OP_MARKS", "1")
    marked = mk.compile(path, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    monkeypatch.setenv("MK_CUDA_OP_MARKS", "warm")
    warm = mk.compile(path, target="cuda", cache_dir=tmp_path).cuda_source  # type: ignore[attr-defined]
    assert "#define MK_OP_MARKS_WARM 1" in warm.splitlines()[:4]
    assert "MK_OP_MARKS_WARM" not in marked
    # The same bodies and marks: only the dispatcher's switch differs.
    assert warm.replace("#define MK_OP_MARKS_WARM 1\n", "") == marked


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not found")
def test_warm_profile_source_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MK_CUDA_OP_MARKS", "warm")
    prog = mk.compile(ROOT / "examples/rmsnorm_linear.mlir", target="cuda", cache_dir=tmp_path)
    assert prog.library_path is not None


def test_segments_are_mean_gaps_between_stamps() -> None:
    timeline = np.array([[100, 1100], [200, 1400], [300, 0], [50, 950]], np.int64)
    marks = np.array([[400, 900], [600, 1000], [0, 0], [150, 0]], np.int64)
    labels = [("a", "b"), ("a", "b"), ("a", "b"), ("c",)]
    kinds = ["lin", "lin", "lin", "copy"]
    seg = op_segments(timeline, marks, labels, kinds)
    # Task 2 never ended (0): skipped. lin: (300 + 400) / 2, (500 + 400) / 2, (200 + 400) / 2 ns.
    assert [n for n, _ in seg["lin"]] == ["a", "b", "signal"]
    assert [v for _, v in seg["lin"]] == pytest.approx([0.35, 0.45, 0.3])
    assert [n for n, _ in seg["copy"]] == ["c", "signal"]
    assert [v for _, v in seg["copy"]] == pytest.approx([0.1, 0.8])


@pytest.mark.gpu
@pytest.mark.parametrize("example", ["rmsnorm_linear", "attention_decode"])
@pytest.mark.parametrize("mode", ["1", "warm"])
def test_profile_run_stamps_inside_each_task(
    mode: str, example: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile run stamps in order, as many marks as the task's labels (the streamed
    phases' too); a warm one too, its pure bodies' outputs unchanged."""
    monkeypatch.setenv("MK_CUDA_OP_MARKS", mode)
    path = ROOT / f"examples/{example}.mlir"
    prog = mk.compile(path, target="cuda", cache_dir=tmp_path)
    prog.record_timeline = True  # type: ignore[attr-defined]
    inputs = random_inputs(prog.func, seed=0)
    (out,) = prog(*inputs)
    (ref,) = mk.reference(path, *inputs)
    error, bound = mk.compiler.output_error(np.asarray(out), np.asarray(ref))
    assert error <= bound
    timeline, marks = prog.last_timeline[-1], prog.last_marks[-1]  # type: ignore[attr-defined]
    index = prog.graph.index()
    for task, (start, end) in enumerate(timeline):
        n = len(prog.mark_labels[index.locate(task)[0].sym_name.data])  # type: ignore[attr-defined]
        stamps = [start, *marks[task, :n], end]
        assert all(a <= b for a, b in zip(stamps, stamps[1:], strict=False)), (task, stamps)
        assert (marks[task, n:] == 0).all()
