"""Decode loops in one call: nn.steps, donated arguments, nn.step and nn.cache_write at every level."""

from __future__ import annotations

import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from xdsl.passes import PassPipeline

import mk
from mk.diagnostics import MkError
from mk.dialects import make_context
from mk.dialects.nn_decode import donated_args
from mk.inputs import random_inputs
from mk.interp.mugraph import run_mugraph
from mk.passes import get_all_passes
from mk.passes.nn_to_mugraph import NnToMugraphPass
from mk.source import entry_function, load_module

ROOT = Path(__file__).resolve().parents[2]
DECODE = ROOT / "examples" / "decode_loop.mlir"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")

HISTORY = """
func.func @history(%tokens: tensor<8x2xi32> {nn.donated}, %pos: tensor<1xi32>, %table: tensor<16x2xi32>)
    -> tensor<8x2xi32> attributes {nn.steps = STEPS : i64} {
  %p = nn.step %pos : (tensor<1xi32>) -> tensor<1xi32>
  %p1 = nn.step %pos {offset = 1 : i64} : (tensor<1xi32>) -> tensor<1xi32>
  %tok = nn.embedding %tokens, %p : (tensor<8x2xi32>, tensor<1xi32>) -> tensor<1x2xi32>
  %flat = nn.reshape %tok : (tensor<1x2xi32>) -> tensor<2xi32>
  %next = nn.embedding %table, %flat : (tensor<16x2xi32>, tensor<2xi32>) -> tensor<2x2xi32>
  %pick = nn.slice %next {offsets = array<i64: 0, 0>, sizes = array<i64: 1, 2>} : (tensor<2x2xi32>) -> tensor<1x2xi32>
  %t2 = nn.cache_write %tokens, %pick, %p1 {dim = 0 : i64} : (tensor<8x2xi32>, tensor<1x2xi32>, tensor<1xi32>) -> tensor<8x2xi32>
  func.return %t2 : tensor<8x2xi32>
}
"""

ROWS = """
func.func @rows(%cache: tensor<3x4x5xf32>, %new: tensor<3x2x5xf32>, %at: tensor<3xi32>) -> tensor<3x4x5xf32> {
  %r = nn.cache_write %cache, %new, %at {dim = 1 : i64} : (tensor<3x4x5xf32>, tensor<3x2x5xf32>, tensor<3xi32>) -> tensor<3x4x5xf32>
  func.return %r : tensor<3x4x5xf32>
}
"""

# Two positions for six runs (rows < runs): run o starts at at[o * 2 // 6].
ROWS4 = """
func.func @rows4(%cache: tensor<2x3x4x5xf32>, %new: tensor<2x3x2x5xf32>, %at: tensor<2xi32>) -> tensor<2x3x4x5xf32> {
  %r = nn.cache_write %cache, %new, %at {dim = 2 : i64} : (tensor<2x3x4x5xf32>, tensor<2x3x2x5xf32>, tensor<2xi32>) -> tensor<2x3x4x5xf32>
  func.return %r : tensor<2x3x4x5xf32>
}
"""


def history_inputs() -> list[np.ndarray]:
    tokens = np.full((8, 2), -7, np.int32)
    tokens[1] = [3, 5]
    table = np.arange(32, dtype=np.int32).reshape(16, 2) % 16
    return [tokens, np.array([1], np.int32), table]


def expected_history(steps: int) -> np.ndarray:
    """NumPy by hand: next token of sequence b is table[token, 0]... via the slice of row 0."""
    tokens, pos, table = history_inputs()
    p = int(pos[0])
    for t in range(steps):
        cur = tokens[p + t]
        tokens[p + t + 1] = table[cur[0]]
    return tokens


@pytest.mark.parametrize("steps", [1, 3, 6])
def test_reference_runs_the_body_steps_times_and_updates_donated_in_place(steps: int) -> None:
    source = HISTORY.replace("STEPS", str(steps))
    inputs = history_inputs()
    (out,) = mk.reference(source, *inputs)
    want = expected_history(steps)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(inputs[0], want)  # the donated argument holds the last state
    assert not np.shares_memory(out, inputs[0])


def test_cache_write_per_row_positions_and_copy_semantics() -> None:
    rng = np.random.default_rng(1)
    cache = rng.standard_normal((3, 4, 5)).astype(np.float32)
    new = rng.standard_normal((3, 2, 5)).astype(np.float32)
    at = np.array([0, 2, 1], np.int32)
    (out,) = mk.reference(ROWS, cache, new, at)
    want = cache.copy()
    for b, s in enumerate(at):
        want[b, s : s + 2] = new[b]
    np.testing.assert_array_equal(out, want)
    assert not np.array_equal(cache, want)  # not donated: the argument is left alone


def test_cache_write_out_of_range_is_a_value_error_with_the_location() -> None:
    cache = np.zeros((3, 4, 5), np.float32)
    with pytest.raises(ValueError, match=r"<source>:3:\d+: .*index 3 writes positions \[3, 5\)"):
        mk.reference(ROWS, cache, np.ones((3, 2, 5), np.float32), np.array([0, 3, 1], np.int32))


def test_read_only_donated_array_is_rejected_before_running() -> None:
    inputs = history_inputs()
    inputs[0].flags.writeable = False
    with pytest.raises(ValueError, match="'%tokens'.*donated array must be writable"):
        mk.reference(HISTORY.replace("STEPS", "2"), *inputs)


def test_random_inputs_keep_every_step_in_range() -> None:
    func = entry_function(load_module(DECODE))
    for seed in range(20):
        pos = random_inputs(func, seed)[1]
        # 4 steps write token positions pos+1 .. pos+4 of 24 and cache rows pos .. pos+3.
        assert 0 <= int(pos[0]) <= 24 - 4 - 1


def test_random_inputs_keep_a_direct_cache_position_in_range() -> None:
    text = """
func.func @w(%c: tensor<2x6x4xbf16> {nn.donated}, %n: tensor<2x2x4xbf16>, %p: tensor<2xi32>) -> tensor<2x2x4xbf16> {
  %c2 = nn.cache_write %c, %n, %p {dim = 1 : i64} : (tensor<2x6x4xbf16>, tensor<2x2x4xbf16>, tensor<2xi32>) -> tensor<2x6x4xbf16>
  func.return %n : tensor<2x2x4xbf16>
}"""
    func = entry_function(load_module(text))
    seen = set()
    for seed in range(30):
        p = random_inputs(func, seed)[2]
        assert ((p >= 0) & (p <= 6 - 2)).all()  # two slots from p inside six
        seen |= set(p.tolist())
    assert len(seen) > 1


def test_mugraph_interpreter_matches_the_reference_with_state() -> None:
    module = load_module(DECODE)
    func = entry_function(module)
    inputs = random_inputs(func, 2)
    ref_inputs = [x.copy() for x in inputs]
    want = mk.reference(DECODE, *ref_inputs)
    NnToMugraphPass().apply(make_context(), module)
    got = run_mugraph(module, *inputs)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(inputs[0], ref_inputs[0])
    for i in donated_args(func)[1:]:  # KV caches: the fused linears round differently
        a, b = inputs[i].astype(np.float64), ref_inputs[i].astype(np.float64)
        assert np.linalg.norm(a - b) <= 2e-2 * np.linalg.norm(b)


def test_task_graph_iterates_with_loop_carried_waits() -> None:
    module = load_module(DECODE)
    spec = "nn-to-mugraph,mugraph-to-task,task-schedule{num-sms=4},task-simulate{seeds=3}"
    PassPipeline.parse_spec(get_all_passes(), spec).apply(make_context(), module)
    text = str(module)
    assert "iterations 4" in text
    assert "distance 1" in text  # the next step's token read waits on this step's write


@needs_gxx
@pytest.mark.parametrize("threads", [1, 4])
def test_cpu_executor_generates_like_the_reference(threads: int) -> None:
    func = entry_function(load_module(DECODE))
    inputs = random_inputs(func, 5)
    ref_inputs = [x.copy() for x in inputs]
    want = mk.reference(DECODE, *ref_inputs)
    prog = mk.compile(DECODE, target="cpu", num_threads=threads)
    got = prog(*inputs, max_delay_us=20 if threads > 1 else 0)
    np.testing.assert_array_equal(got[0], want[0])  # token history: exact
    rel = np.linalg.norm(got[1].astype(np.float64) - want[1].astype(np.float64))
    assert rel / np.linalg.norm(want[1].astype(np.float64)) <= 2e-2
    np.testing.assert_array_equal(inputs[0], ref_inputs[0])
    for i in donated_args(func)[1:]:  # KV caches: written rows agree within bf16 rounding
        a, b = inputs[i].astype(np.float64), ref_inputs[i].astype(np.float64)
        assert np.linalg.norm(a - b) <= 2e-2 * np.linalg.norm(b)


@needs_gxx
def test_cpu_executor_reports_a_bad_position_at_the_op() -> None:
    prog = mk.compile(ROWS, target="cpu")
    cache = np.zeros((3, 4, 5), np.float32)
    with pytest.raises(Exception, match=r"cache_write.*index 3 writes positions \[3, 5\)"):
        prog(cache, np.ones((3, 2, 5), np.float32), np.array([0, 3, 1], np.int32))


@needs_gxx
def test_cpu_executor_non_donated_cache_write_copies() -> None:
    rng = np.random.default_rng(3)
    cache = rng.standard_normal((3, 4, 5)).astype(np.float32)
    new = rng.standard_normal((3, 2, 5)).astype(np.float32)
    at = np.array([2, 0, 1], np.int32)
    before = cache.copy()
    (got,) = mk.compile(ROWS, target="cpu")(cache, new, at)
    (want,) = mk.reference(ROWS, cache, new, at)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(cache, before)


@needs_gxx
def test_cpu_executor_donated_bf16_cache_in_place() -> None:
    source = HISTORY.replace("STEPS", "5")
    inputs = history_inputs()
    (out,) = mk.compile(source, target="cpu")(*inputs)
    np.testing.assert_array_equal(out, expected_history(5))
    np.testing.assert_array_equal(inputs[0], expected_history(5))


def test_donated_argument_without_a_write_is_a_located_error() -> None:
    bad = """
func.func @f(%c: tensor<4xbf16> {nn.donated}) -> tensor<4xbf16> {
  func.return %c : tensor<4xbf16>
}
"""
    with pytest.raises(MkError, match=r"<source>:2:1: .*donated argument #0 must be the cache"):
        mk.reference(bad, np.zeros(4, ml_dtypes.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("source", "dim"), [(ROWS, 1), (ROWS4, 2)], ids=["rows-per-run", "rows-per-3-runs"]
)
def test_gpu_cache_write_positions_and_bad_ones_match_the_cpu(
    source: str, dim: int, tmp_path: Path
) -> None:
    """On the GPU, per-row positions land where the reference puts them, and a position past
    the end is reported in the CPU executor's words (op, line, positions, dim; the CPU side of
    the comparison is test_cuda_failures.py, which needs no GPU: in one process after a CUDA
    run, the CPU executor's failing run crashed on the GPU machine)."""
    prog = mk.compile(source, target="cuda", cache_dir=tmp_path)
    cache, new, at = random_inputs(prog.func, 5)  # positions in range
    (got,) = prog(cache, new, at)
    (want,) = mk.reference(source, cache, new, at)
    np.testing.assert_array_equal(got, want)
    bad = np.zeros_like(at)
    bad[-1] = 3  # positions [3, 5) of a dim of 4
    with pytest.raises(Exception) as caught:
        prog(cache, new, bad)
    assert str(caught.value).endswith(
        "<source>:3:3: error: 'mugraph.kernel' \"cache_write\" index 3 writes positions [3, 5) "
        f"outside [0, 4) of dim {dim}"
    ), str(caught.value)


@pytest.mark.gpu
def test_gpu_decode_loop_updates_donated_tensors_in_place(tmp_path: Path) -> None:
    import torch

    prog = mk.compile(DECODE, target="cuda", cache_dir=tmp_path)
    func = prog.func
    inputs = random_inputs(func, 7)
    ref_inputs = [x.copy() for x in inputs]
    want = mk.reference(DECODE, *ref_inputs)
    tensors = [mk.compiler._to_torch(x).cuda() for x in inputs]
    got = prog(*tensors)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(got[0].cpu().numpy(), want[0])
    np.testing.assert_array_equal(tensors[0].cpu().numpy(), ref_inputs[0])
    for i in donated_args(func)[1:]:
        a = tensors[i].float().cpu().numpy().astype(np.float64)
        b = ref_inputs[i].astype(np.float64)
        assert np.linalg.norm(a - b) <= 2e-2 * np.linalg.norm(b)
    numpy_inputs = random_inputs(func, 7)  # the NumPy path copies the donated state back
    prog(*numpy_inputs)
    np.testing.assert_array_equal(numpy_inputs[0], ref_inputs[0])


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_grid_level_pruning_alone_keeps_a_model_decode_loop_race_free(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Long programs pass PRUNE_LIMIT and rely on the grid-level pruning only; force that path
    # on a small model and let the simulator check every read, write and iteration.
    from mk.models import decode_program, preset
    from mk.passes import mugraph_to_task_events

    monkeypatch.setattr(mugraph_to_task_events, "PRUNE_LIMIT", 0)
    module = load_module(decode_program(preset(name), 2, 32, 3))
    spec = "nn-to-mugraph,mugraph-to-task,task-schedule{num-sms=8},task-simulate{seeds=3}"
    PassPipeline.parse_spec(get_all_passes(), spec).apply(make_context(), module)
    assert "iterations 3" in str(module)


# A K row's norm + RoPE written into a donated cache by the chain's own kernel
# (mugraph-append-writes).
APPEND = """
func.func @append(%k: tensor<1x32xf32>, %kw: tensor<16xf32>, %cos: tensor<1x8xf32>, %sin: tensor<1x8xf32>, %p: tensor<1xi32>, %cache: tensor<1x2x6x16xf32> {nn.donated}) -> tensor<1x2x6x16xf32> {
  %k4 = nn.reshape %k : (tensor<1x32xf32>) -> tensor<1x2x1x16xf32>
  %kn = nn.rms_norm %k4, %kw {epsilon = 1.0e-06 : f32} : (tensor<1x2x1x16xf32>, tensor<16xf32>) -> tensor<1x2x1x16xf32>
  %kr = nn.rope %kn, %cos, %sin : (tensor<1x2x1x16xf32>, tensor<1x8xf32>, tensor<1x8xf32>) -> tensor<1x2x1x16xf32>
  %kc = nn.cache_write %cache, %kr, %p {dim = 2 : i64} : (tensor<1x2x6x16xf32>, tensor<1x2x1x16xf32>, tensor<1xi32>) -> tensor<1x2x6x16xf32>
  %s = nn.add %kc, %kc : (tensor<1x2x6x16xf32>, tensor<1x2x6x16xf32>) -> tensor<1x2x6x16xf32>
  func.return %s : tensor<1x2x6x16xf32>
}
"""


def _write_args(
    pos: int, shapes: list[tuple[int, ...]], cache: tuple[int, ...]
) -> list[np.ndarray]:
    """Random f32 operands of `shapes`, the position, then a random cache (seeded by pos)."""
    rng = np.random.default_rng(pos)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return [*arrays, np.array([pos], np.int32), rng.standard_normal(cache).astype(np.float32)]


def append_inputs(pos: int) -> list[np.ndarray]:
    return _write_args(pos, [(1, 32), (16,), (1, 8), (1, 8)], (1, 2, 6, 16))


@needs_gxx
@pytest.mark.parametrize("options", [{}, {"append_writes": 0}])
def test_cpu_executor_appends_chain_rows_in_place(options: dict[str, int]) -> None:
    prog = mk.compile(APPEND, target="cpu", **options)
    ir = prog.ir("mugraph")
    fused = " at %" in ir and 'kernel "cache_write"' not in ir
    assert fused == (not options)
    inputs, ref_inputs = append_inputs(4), append_inputs(4)
    before = inputs[-1].copy()
    (got,) = prog(*inputs)
    (want,) = mk.reference(APPEND, *ref_inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inputs[-1], ref_inputs[-1], rtol=1e-5, atol=1e-6)  # in place
    changed = np.argwhere(inputs[-1] != before)
    assert set(changed[:, 2].tolist()) == {4}  # row 4 of each head, nothing else


@needs_gxx
def test_cpu_executor_reports_an_appended_row_out_of_range_at_the_op() -> None:
    prog = mk.compile(APPEND, target="cpu")
    with pytest.raises(
        Exception, match=r"<source>:\d+:\d+: .*writes positions \[6, 7\) outside \[0, 6\) of dim 2"
    ):
        prog(*append_inputs(6))


READ_BEFORE_WRITE = """
func.func @f(%k: tensor<1x2x1x4xf32>, %p: tensor<1xi32>, %c: tensor<1x2x3x4xf32> {nn.donated}) -> tensor<1x2x3x4xf32> {
  %old = nn.mul %c, %c : (tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32>
  %w = nn.cache_write %c, %k, %p {dim = 2 : i64} : (tensor<1x2x3x4xf32>, tensor<1x2x1x4xf32>, tensor<1xi32>) -> tensor<1x2x3x4xf32>
  %s = nn.add %w, %old : (tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32>
  func.return %s : tensor<1x2x3x4xf32>
}
"""


@needs_gxx
def test_a_read_of_a_donated_cache_before_its_write_sees_the_old_bytes() -> None:
    """The elementwise fusion once put `%old` (a read before the write) and `%s` (after it) in
    one kernel after the write, which the compiler then refused."""
    rng = np.random.default_rng(5)
    k, cache = rng.standard_normal((1, 2, 1, 4)), rng.standard_normal((1, 2, 3, 4))
    args = [k.astype(np.float32), np.array([1], np.int32), cache.astype(np.float32)]
    (got,) = mk.compile(READ_BEFORE_WRITE, target="cpu")(*[a.copy() for a in args])
    want = cache * cache
    written = cache.copy()
    written[:, :, 1] = k[:, :, 0]
    np.testing.assert_allclose(got, written + want, rtol=1e-6)


# A prefill's K rows: 96 positions through RoPE in blocks of rows, each block writing its rows
# into the donated cache at %p plus its offset; the add reads the cache whole (it waits for
# every block).
APPEND_ROWS = """
func.func @rows(%k: tensor<1x2x96x16xf32>, %cos: tensor<96x8xf32>, %sin: tensor<96x8xf32>, %p: tensor<1xi32>, %cache: tensor<1x2x128x16xf32> {nn.donated}) -> tensor<1x2x128x16xf32> {
  %kr = nn.rope %k, %cos, %sin : (tensor<1x2x96x16xf32>, tensor<96x8xf32>, tensor<96x8xf32>) -> tensor<1x2x96x16xf32>
  %kc = nn.cache_write %cache, %kr, %p {dim = 2 : i64} : (tensor<1x2x128x16xf32>, tensor<1x2x96x16xf32>, tensor<1xi32>) -> tensor<1x2x128x16xf32>
  %s = nn.add %kc, %kc : (tensor<1x2x128x16xf32>, tensor<1x2x128x16xf32>) -> tensor<1x2x128x16xf32>
  func.return %s : tensor<1x2x128x16xf32>
}
"""


def append_rows_inputs(pos: int) -> list[np.ndarray]:
    return _write_args(pos, [(1, 2, 96, 16), (96, 8), (96, 8)], (1, 2, 128, 16))


@needs_gxx
@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_blocks_of_rows_append_side_by_side(target: str, tmp_path: Path) -> None:
    prog = mk.compile(APPEND_ROWS, target=target, cache_dir=tmp_path)
    ir = prog.ir("mugraph")
    assert 'kernel "cache_write"' not in ir and "omap [1, 2, -1] at %" in ir
    inputs, ref_inputs = append_rows_inputs(20), append_rows_inputs(20)
    before = inputs[-1].copy()
    (got,) = prog(*inputs)
    (want,) = mk.reference(APPEND_ROWS, *ref_inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inputs[-1], ref_inputs[-1], rtol=1e-5, atol=1e-6)  # in place
    changed = np.argwhere(inputs[-1] != before)
    assert set(changed[:, 2].tolist()) == set(range(20, 116))


def test_the_interpreter_appends_blocks_of_rows_side_by_side() -> None:
    module = load_module(APPEND_ROWS)
    inputs, ref_inputs = append_rows_inputs(7), append_rows_inputs(7)
    want = mk.reference(APPEND_ROWS, *ref_inputs)
    spec = "nn-to-mugraph,mugraph-append-writes"
    PassPipeline.parse_spec(get_all_passes(), spec).apply(make_context(), module)
    assert " at %" in str(module)
    got = run_mugraph(module, *inputs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inputs[-1], ref_inputs[-1], rtol=1e-5, atol=1e-6)


@needs_gxx
def test_a_block_of_rows_past_the_cache_end_is_reported_at_the_op() -> None:
    prog = mk.compile(APPEND_ROWS, target="cpu")
    with pytest.raises(
        Exception,
        match=r"<source>:\d+:\d+: .*writes positions \[88, 136\) outside \[0, 128\) of dim 2",
    ):
        prog(*append_rows_inputs(40))
