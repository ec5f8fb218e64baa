"""mk.compile(target="cpu") end to end: tables, kernel library loading, Program, cache, mk-run."""

from __future__ import annotations

import atexit
import dataclasses
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
from attention_programs import attention
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mugraph_checks import lower
from nn_programs import programs
from xdsl.dialects.builtin import ModuleOp

import mk
import mk._runtime as rt
from mk import compiler
from mk.backends.tables import table_shape, tables_from_graph
from mk.inputs import random_inputs
from mk.interp.mugraph import run_mugraph
from mk.runtime_tables import KIND_FIRST_LOWERED
from mk.source import entry_function, load_module

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.mlir") if "llama3" not in p.name)
INCLUDE = ROOT / "runtime" / "include"
# Hypothesis runs outside fixtures; one directory for the whole session is enough.
RANDOM_CACHE = Path(tempfile.mkdtemp(prefix="mk-random-cache-"))
atexit.register(shutil.rmtree, RANDOM_CACHE, True)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")

ADD_RELU = """
func.func @add(%a: tensor<4x256xf32>, %b: tensor<4x256xf32>) -> tensor<4x256xf32> {
  %c = nn.add %a, %b : (tensor<4x256xf32>, tensor<4x256xf32>) -> tensor<4x256xf32>
  %d = nn.relu %c : (tensor<4x256xf32>) -> tensor<4x256xf32>
  func.return %d : tensor<4x256xf32>
}
"""

# A hand-written library that follows the kernel ABI for ADD_RELU's one grid (4 tasks, each a
# 4x64 column tile); NUM_KINDS and the failing coord are substituted per test.
ABI_SOURCE = r"""
#include <cstdint>
#include <cstdio>
#include "mk/tables.h"
#include "mk/version.h"
static thread_local char error[128];
extern "C" {
int32_t mk_abi_version(void) { return ABI; }
int32_t mk_num_kinds(void) { return NUM_KINDS; }
const char* mk_kind_name(int32_t kind) { return kind == 16 ? "add_relu" : "other"; }
const char* mk_last_error(void) { return error; }
int32_t mk_dispatch(int32_t kind, const mk::TaskDesc* task, void* const* buffers, int32_t) {
  if (kind != 16) return 0;
  if (task->coord[0] == FAIL_AT) {
    std::snprintf(error, sizeof error, "tile %d refused", task->coord[0]);
    return 7;
  }
  const float* a = static_cast<const float*>(buffers[0]);
  const float* b = static_cast<const float*>(buffers[1]);
  float* d = static_cast<float*>(buffers[2]);
  for (int r = 0; r < 4; ++r)
    for (int c = task->coord[0] * 64; c < task->coord[0] * 64 + 64; ++c) {
      float v = a[r * 256 + c] + b[r * 256 + c];
      d[r * 256 + c] = v > 0.0f ? v : 0.0f;
    }
  return 0;
}
}
"""


def abi_source(num_kinds: int = 1, fail_at: int = -1, abi: str = "MK_RUNTIME_ABI") -> str:
    return (
        ABI_SOURCE.replace("NUM_KINDS", str(num_kinds))
        .replace("FAIL_AT", str(fail_at))
        .replace("ABI;", f"{abi};")
    )


def gxx_build(source: str, out_dir: Path) -> Path:
    """What mk.backends.cpu.build_library does, for the hand-written sources."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cpp, lib = out_dir / "kernels.cpp", out_dir / "kernels.so"
    cpp.write_text(source)
    cmd = ["g++", "-O1", "-std=c++17", "-shared", "-fPIC", f"-I{INCLUDE}", str(cpp), "-o", str(lib)]
    subprocess.run(cmd, check=True)
    return lib


@pytest.fixture
def fake_backend(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """Replaces mk.backends.cpu with the hand-written ABI source; counts emits and builds."""
    fake = SimpleNamespace(source=abi_source(), emits=0, builds=0)

    def emit_source(graph: object) -> str:
        fake.emits += 1
        return fake.source

    def build_library(source: str, cache_dir: Path) -> Path:
        fake.builds += 1
        return gxx_build(source, Path(cache_dir))

    backend = SimpleNamespace(emit_source=emit_source, build_library=build_library)
    monkeypatch.setattr(compiler, "cpu_backend", lambda: backend)
    return fake


def add_inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((4, 256)).astype(np.float32) for _ in range(2))  # type: ignore[return-value]


# --------------------------------------------------------------------------- tables


def test_tables_from_decoder_block_match_the_graph_index() -> None:
    module = load_module(ROOT / "examples" / "decoder_block.mlir")
    texts = compiler.run_pipeline(module, {"num_sms": 3})
    graph = compiler.find_graph(module, "decoder_block")
    index = graph.index()
    tables = tables_from_graph(graph)
    assert len(tables.tasks) == index.total_tasks and tables.num_counters == index.total_counters
    assert tables.num_sms == 3 and "task.schedule num_sms 3" in texts["task"]
    for task_id, row in enumerate(tables.tasks):
        grid, coords = index.locate(task_id)
        assert row["kind"] == KIND_FIRST_LOWERED + index.grids.index(grid)
        assert list(row["coord"]) == [*coords, *[0] * (3 - len(coords))]
        waits = tables.waits[row["wait_begin"] : row["wait_end"]]
        expected = [
            (index.counter(e, el), index.events[e].count_value, d)
            for e, el, d in index.waits_of(task_id)
        ]
        assert [tuple(int(v) for v in w) for w in waits] == expected
        signals = tables.signals[row["signal_begin"] : row["signal_end"]]
        assert [int(s["counter"]) for s in signals] == [
            index.counter(e, el) for e, el in index.signals_of(task_id)
        ]
    queued = [list(q.task_ids) for q in index.schedule.queues]  # type: ignore[union-attr]
    offsets = tables.queue_offsets
    assert [list(tables.queue_tasks[offsets[s] : offsets[s + 1]]) for s in range(3)] == queued
    names = [b.sym_name.data for b in graph.body.block.ops if b.name == "task.buffer"]
    assert len(tables.buffers) == len(names)
    assert tables.arena_bytes == int(graph.arena.value.data)


def test_table_shape_folds_leading_dims() -> None:
    assert table_shape((2, 1, 4, 1, 64)) == (2, 4, 1, 64)
    assert table_shape((3, 5)) == (3, 5)


# --------------------------------------------------------------------------- kernel libraries


def test_kernel_library_loads_and_names_kinds(tmp_path: Path) -> None:
    lib = rt.KernelLibrary(gxx_build(abi_source(num_kinds=2), tmp_path))
    assert (lib.abi, lib.num_kinds) == (rt.abi, 2)
    assert lib.kind_name(16) == "add_relu" and lib.kind_name(18) == ""


def test_kernel_library_abi_mismatch_and_missing_file(tmp_path: Path) -> None:
    path = gxx_build(abi_source(abi="MK_RUNTIME_ABI + 100"), tmp_path)
    with pytest.raises(RuntimeError, match=f"built for runtime ABI {rt.abi + 100}.*recompile"):
        rt.KernelLibrary(path)
    with pytest.raises(RuntimeError, match="cannot load kernel library .*nowhere.so"):
        rt.KernelLibrary(tmp_path / "nowhere.so")


def test_program_runs_the_hand_written_library(
    fake_backend: SimpleNamespace, tmp_path: Path
) -> None:
    prog = mk.compile(ADD_RELU, num_sms=2, cache_dir=tmp_path)
    a, b = add_inputs()
    (out,) = prog(a, b)
    np.testing.assert_array_equal(out, np.maximum(a + b, 0))
    (ref,) = mk.reference(ADD_RELU, a, b)
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    assert prog.executor().library.num_kinds == 1


def test_kernel_failure_names_the_task_and_message(
    fake_backend: SimpleNamespace, tmp_path: Path
) -> None:
    fake_backend.source = abi_source(fail_at=2)
    prog = mk.compile(ADD_RELU, num_sms=2, cache_dir=tmp_path)
    with pytest.raises(
        RuntimeError, match=r"task 2 .*coord \[2, 0, 0\].*add_relu.*returned 7: tile 2 refused"
    ):
        prog(*add_inputs())


def test_kind_outside_the_library_is_rejected(
    fake_backend: SimpleNamespace, tmp_path: Path
) -> None:
    prog = mk.compile(ADD_RELU, num_sms=2, cache_dir=tmp_path)
    tasks = prog.tables.tasks.copy()
    tasks[0]["kind"] = 17
    prog.tables = dataclasses.replace(prog.tables, tasks=tasks)
    with pytest.raises(ValueError, match=r"tasks\[0\]: kind 17 is not in kernel library"):
        prog(*add_inputs())


def test_dropped_signal_deadlocks_quickly(fake_backend: SimpleNamespace, tmp_path: Path) -> None:
    fake_backend.source = abi_source(num_kinds=64)  # every grid a no-op: only the protocol runs
    prog = mk.compile(ROOT / "examples" / "decoder_block.mlir", num_sms=4, cache_dir=tmp_path)
    prog(*random_inputs(prog.func))  # intact tables finish
    tasks = prog.tables.tasks.copy()
    victim = int(np.flatnonzero(tasks["signal_end"] > tasks["signal_begin"])[0])
    tasks[victim]["signal_end"] = tasks[victim]["signal_begin"]
    prog.tables = dataclasses.replace(prog.tables, tasks=tasks)
    start = time.perf_counter()
    with pytest.raises(
        rt.DeadlockError, match=r"@decoder_block: task \d+ \(@\w+.*\) waits on @\w+"
    ) as info:
        prog(*random_inputs(prog.func), timeout_ms=200)
    assert time.perf_counter() - start < 10
    assert isinstance(info.value, RuntimeError) and info.value.wait_ms >= 200


# --------------------------------------------------------------------------- Program API


def test_wrong_inputs_name_the_argument(fake_backend: SimpleNamespace, tmp_path: Path) -> None:
    prog = mk.compile(ADD_RELU, cache_dir=tmp_path)
    a, b = add_inputs()
    with pytest.raises(ValueError, match=r"expects 2 inputs \(%a, %b\), got 1"):
        prog(a)
    with pytest.raises(
        ValueError, match=r"argument 1 \('%b'\): expected shape \(4, 256\), got \(4, 255\)"
    ):
        prog(a, b[:, :255])
    with pytest.raises(
        ValueError, match=r"argument 0 \('%a'\): expected dtype float32.*got float64"
    ):
        prog(a.astype(np.float64), b)
    with pytest.raises(ValueError, match=r"argument 1 \('%b'\): expected a numpy array"):
        prog(a, b.tolist())


def test_ir_stages_and_source(fake_backend: SimpleNamespace, tmp_path: Path) -> None:
    prog = mk.compile(ADD_RELU, cache_dir=tmp_path, tile_n=32)
    assert "nn.add" in prog.ir("nn") and "mugraph.graph_def" not in prog.ir("nn")
    assert "mugraph.graph_def" in prog.ir("mugraph") and "task.graph" not in prog.ir("mugraph")
    assert "task.schedule num_sms 8" in prog.ir("task")
    assert prog.cpu_source == fake_backend.source
    with pytest.raises(ValueError, match="unknown stage 'cuda'; expected one of nn, mugraph, task"):
        prog.ir("cuda")
    with pytest.raises(TypeError, match="unknown pass option.*tile_q"):
        mk.compile(ADD_RELU, cache_dir=tmp_path, tile_q=3)
    with pytest.raises(ValueError, match="unknown target"):
        mk.compile(ADD_RELU, target="tpu")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tile_n": "abc"}, "pass option tile_n must be an int, got 'abc'"),
        ({"tile_n": 2.5}, "pass option tile_n must be an int, got 2.5"),
        ({"tile_n": True}, "pass option tile_n must be an int, got True"),
        ({"flag_values": 2}, "pass option flag_values must be a bool, got 2"),
        ({"bandwidth_gbs": "fast"}, "pass option bandwidth_gbs must be a float, got 'fast'"),
    ],
)
def test_a_pass_option_of_the_wrong_type_is_named(
    fake_backend: SimpleNamespace, tmp_path: Path, options: dict[str, object], message: str
) -> None:
    with pytest.raises(TypeError, match=re.escape(message)):
        mk.compile(ADD_RELU, cache_dir=tmp_path, **options)


def test_a_whole_number_or_a_switch_takes_its_options_type(
    fake_backend: SimpleNamespace, tmp_path: Path
) -> None:
    """bandwidth_gbs=4100 is a float option given as an int, flag_values=1 a bool given as 1."""
    prog = mk.compile(ADD_RELU, cache_dir=tmp_path, bandwidth_gbs=4100, flag_values=1)
    assert "task.schedule" in prog.ir("task")


def test_second_compile_hits_the_cache(fake_backend: SimpleNamespace, tmp_path: Path) -> None:
    first = mk.compile(ADD_RELU, num_sms=2, cache_dir=tmp_path)
    second = mk.compile(ADD_RELU, num_sms=2, cache_dir=tmp_path)
    assert fake_backend.builds == 1 and not first.cache_hit and second.cache_hit
    assert second.library_path == first.library_path
    entry = first.library_path.parent
    assert {p.name for p in entry.iterdir()} >= {
        "kernels.so",
        "kernels.cpp",
        "task.mlir",
        "meta.json",
    }
    other = mk.compile(ADD_RELU, num_sms=3, cache_dir=tmp_path)  # options are part of the key
    assert fake_backend.builds == 2 and other.library_path != first.library_path
    np.testing.assert_array_equal(second(*add_inputs())[0], first(*add_inputs())[0])


def test_programs_compile_in_threads(fake_backend: SimpleNamespace, tmp_path: Path) -> None:
    """mk.compile from three threads at once (an embedding compiler's workers), three times
    each: every compile lowers as a lone one does. (xDSL's implicit builder patches every op's
    initialiser for the whole process; unguarded, two threads inserted an op twice.)"""
    from mk.models.build import decode_program
    from mk.models.config import preset

    text = decode_program(preset("tiny"), 1, 64, 8)
    want = mk.compile(text, num_sms=8, cache_dir=tmp_path).ir("task")
    got: list[str] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(3):
                got.append(mk.compile(text, num_sms=8, cache_dir=tmp_path).ir("task"))
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert got == [want] * 9


def test_cache_dir_defaults_to_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MK_CACHE_DIR", str(tmp_path))
    assert compiler.cache_root() == tmp_path
    monkeypatch.delenv("MK_CACHE_DIR")
    assert compiler.cache_root() == Path.home() / ".cache" / "mk"


def test_outputs_start_as_nan_so_holes_show(fake_backend: SimpleNamespace, tmp_path: Path) -> None:
    fake_backend.source = abi_source().replace(
        "if (kind != 16) return 0;", "if (kind != 16 || task->coord[0] == 1) return 0;"
    )
    prog = mk.compile(ADD_RELU, cache_dir=tmp_path)
    (out,) = prog(*add_inputs())
    assert np.isnan(out[:, 64:128]).all() and not np.isnan(out[:, :64]).any()


def test_bf16_helpers_round_trip() -> None:
    assert compiler._unwritten(np.dtype(np.int32)) == np.iinfo(np.int32).min
    x = np.arange(6, dtype=ml_dtypes.bfloat16)
    assert compiler._raw(x).nbytes == 12


def test_entry_function_is_used_for_checks(fake_backend: SimpleNamespace, tmp_path: Path) -> None:
    prog = mk.compile(ADD_RELU, cache_dir=tmp_path)
    assert prog.func.sym_name.data == entry_function(load_module(ADD_RELU)).sym_name.data == "add"


# --------------------------------------------------------------------------- real backend, end to end


def _real_backend() -> None:
    try:
        compiler.cpu_backend()
    except mk.MkError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mk-cache")


def assert_matches_reference(outs: tuple[np.ndarray, ...], refs: tuple[np.ndarray, ...]) -> None:
    assert len(outs) == len(refs)
    for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        error, bound = compiler.output_error(out, ref)
        assert error <= bound, (
            f"output {i} {ref.dtype}{list(ref.shape)}: error {error:.3g} > {bound}"
        )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_matches_the_reference(path: Path, cache: Path) -> None:
    _real_backend()
    prog = mk.compile(path, cache_dir=cache)
    for seed in (0, 1):
        inputs = random_inputs(prog.func, seed=seed)
        outs = prog(*inputs)
        assert all(isinstance(o, np.ndarray) for o in outs)
        assert_matches_reference(outs, mk.reference(path, *inputs))


IDENTITY = """
func.func @same(%x: tensor<4x8xbf16>) -> tensor<4x8xbf16> {
  func.return %x : tensor<4x8xbf16>
}
"""


@pytest.mark.parametrize("kv_splits", [1, 2])
@pytest.mark.parametrize(
    "text",
    [
        attention(2, 4, 2, 7, 8, dtype="f32", shared_kv=True),
        attention(1, 2, 2, 5, 8, kv_len=False, shared_kv=True),
    ],
)
def test_attention_whose_keys_are_its_values(cache: Path, text: str, kv_splits: int) -> None:
    """K and V one value: the kernel reads it once, as both (the key lengths after it)."""
    _real_backend()
    prog = mk.compile(text, num_sms=3, kv_splits=kv_splits, cache_dir=cache)
    inputs = random_inputs(prog.func, seed=2)
    assert_matches_reference(prog(*inputs), mk.reference(text, *inputs))


def test_a_function_that_returns_its_argument_copies_it(cache: Path) -> None:
    """No nn op at all: the lowering still makes the result's copy task."""
    _real_backend()
    prog = mk.compile(IDENTITY, cache_dir=cache)
    (x,) = random_inputs(prog.func, seed=3)
    (out,) = prog(x)
    assert out.dtype == x.dtype and np.array_equal(out, x)


@pytest.mark.parametrize("text", ["", "  \n", "// nothing but a comment\n"])
def test_an_empty_program_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(mk.MkError, match="the program is empty: <source>"):
        mk.compile(text, cache_dir=tmp_path)


def test_a_function_that_returns_nothing_is_refused_at_its_location(tmp_path: Path) -> None:
    path = tmp_path / "nothing.mlir"
    path.write_text("func.func @f(%x: tensor<4x8xf32>) {\n  func.return\n}\n")
    with pytest.raises(mk.MkError, match="@f returns nothing") as info:
        mk.compile(path, cache_dir=tmp_path)
    assert "nothing.mlir:1:1: error: @f returns nothing" in info.value.render()


def test_a_cpu_run_records_its_timeline_as_a_chrome_trace(cache: Path, tmp_path: Path) -> None:
    """prog.record_timeline on the CPU: a box per task and iteration, on its SM's row, times from
    the first start; an SM's boxes do not overlap (it runs one task at a time)."""
    _real_backend()
    prog = mk.compile(ROOT / "examples" / "decode_loop.mlir", cache_dir=cache)
    inputs = random_inputs(prog.func, seed=0)
    with pytest.raises(mk.MkError, match="no timeline: set prog.record_timeline"):
        prog.trace(tmp_path / "none.json")
    prog.record_timeline = True
    prog(*inputs)
    prog.trace(tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    iterations, tasks = prog.tables.iterations, len(prog.tables.tasks)
    assert iterations > 1 and len(events) == iterations * tasks
    assert min(e["ts"] for e in events) == 0 and all(e["dur"] >= 0 for e in events)
    by_sm: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        by_sm.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    assert set(by_sm) <= set(range(prog.num_sms))
    for boxes in by_sm.values():
        boxes.sort()
        assert all(end <= start for (_, end), (start, _) in zip(boxes, boxes[1:], strict=False))


def test_llama3_block_compiles(cache: Path) -> None:
    _real_backend()
    prog = mk.compile(ROOT / "examples" / "llama3_8b_block.mlir", cache_dir=cache)
    assert len(prog.tables.tasks) > 100 and "mk_dispatch" in prog.cpu_source
    assert prog.executor().num_tasks == len(prog.tables.tasks)


def test_stress_threads_and_random_delays(cache: Path) -> None:
    _real_backend()
    path = ROOT / "examples" / "decoder_block.mlir"
    prog = mk.compile(path, num_sms=6, cache_dir=cache)
    inputs = random_inputs(prog.func, seed=3)
    first = prog(*inputs, num_threads=1)
    assert_matches_reference(first, mk.reference(path, *inputs))
    for threads, seed in [(2, 0), (4, 1), (16, 2), (16, 3), (4, 4)]:
        outs = prog(*inputs, num_threads=threads, max_delay_us=200, seed=seed, timeout_ms=30_000)
        for got, want in zip(outs, first, strict=True):  # every interleaving gives the same bits
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@settings(
    max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(programs(), st.integers(1, 6), st.integers(0, 3))
def test_random_programs_match_the_reference(module: ModuleOp, num_sms: int, seed: int) -> None:
    _real_backend()
    text = str(module)
    prog = mk.compile(text, num_sms=num_sms, num_threads=min(num_sms, 4), cache_dir=RANDOM_CACHE)
    inputs = random_inputs(prog.func, seed=seed)
    assert_matches_reference(prog(*inputs, max_delay_us=20, seed=seed), mk.reference(text, *inputs))


# --------------------------------------------------------------------------- mk-run


def test_mk_run_cpu_reports_error_and_time(
    fake_backend: SimpleNamespace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    gpu_present: bool,
) -> None:
    from mk.tools.mk_run import main as mk_run

    path = tmp_path / "add.mlir"
    path.write_text(ADD_RELU)
    args = [str(path), "--target", "cpu", "--threads", "2", "--num-sms", "3"]
    assert mk_run([*args, "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "@add: cpu, 4 tasks on 3 SMs, 2 threads, seed 0" in out
    assert "error vs reference 0.000e+00 (tolerance 1e-05): ok" in out and "cpu run time:" in out
    assert mk_run([*args, "--option", "tile_n"]) == 1
    assert "mk-run: error: pass option 'tile_n': expected NAME=VALUE" in capsys.readouterr().err
    assert mk_run([*args, "--option", "warp_speed=9"]) == 1
    assert "unknown pass option(s) warp_speed" in capsys.readouterr().err
    fake_backend.source = abi_source().replace("v > 0.0f ? v : 0.0f", "v")  # relu forgotten
    assert mk_run([*args, "--cache-dir", str(tmp_path / "c")]) == 1
    assert "MISMATCH" in capsys.readouterr().out
    if not gpu_present:
        assert mk_run([str(path), "--target", "cuda"]) == 2


def test_mk_run_passes_options_to_the_compiler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--option reaches mk.compile: a smaller tile_n gives the same results with more tasks."""
    from mk.tools.mk_run import main as mk_run

    base = [str(ROOT / "examples/rmsnorm_linear.mlir"), "--target", "cpu", "--num-sms", "4"]
    base += ["--cache-dir", str(tmp_path)]
    counts = []
    for extra in ([], ["--option", "tile_n=16"]):
        assert mk_run([*base, *extra]) == 0
        out = capsys.readouterr().out
        assert "MISMATCH" not in out and ": ok" in out
        counts.append(int(out.split(" tasks on ")[0].rsplit(" ", 1)[1]))
    assert counts[1] > counts[0]


def test_mk_run_accepts_a_decode_loop_that_diverges_after_a_near_tie(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seed 114's step 0 has an exact tie of bf16 logits in row 1: the CPU executor picks the other
    token, and the loop follows it. mk-run names the tie and checks everything against the
    reference made to take the same choice."""
    from mk.tools.mk_run import main as mk_run

    path = str(ROOT / "examples/decode_loop.mlir")
    assert mk_run([path, "--target", "cpu", "--seed", "114", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "MISMATCH" in out  # the plain reference diverged
    assert "near-tie: nn.argmax at step 0, row 1: its top two values are 0 x rms apart" in out
    assert "this run chose 17, the reference 12" in out
    assert out.rstrip().endswith("every output matches: ok")


def test_near_ties_do_not_excuse_other_differences() -> None:
    """A token changed where the reference has no near-tie stays a mismatch."""
    from mk.interp.nn import random_inputs
    from mk.source import entry_function, load_module
    from mk.tools.mk_run import _explain_by_near_ties, _reference

    module = load_module(ROOT / "examples/decode_loop.mlir")
    func = entry_function(module, None)
    inputs = random_inputs(func, 114)
    results = list(_reference(module, func, inputs, None))
    tokens = results[0].copy()
    tokens[2, 0] = (tokens[2, 0] + 1) % 64  # a token no near-tied choice gives
    assert _explain_by_near_ties(module, func, inputs, [tokens, *results[1:]]) == 1


@pytest.mark.parametrize("kv_splits", [1, 2])
def test_attention_skips_nan_cache_rows_past_kv_len(cache: Path, kv_splits: int) -> None:
    """A cache never written past kv_len may hold NaN there: the executor and the mugraph
    interpreter give the output of the same cache with zeros there, not 0·NaN."""
    _real_backend()
    text = attention(2, 4, 2, 9, 8, dtype="f32")
    prog = mk.compile(text, num_sms=3, kv_splits=kv_splits, cache_dir=cache)
    q, k, v, kv_len = random_inputs(prog.func, seed=4)
    kv_len[:] = [6, 2]
    clean_k, clean_v = k.copy(), v.copy()
    for row, length in enumerate(kv_len):
        clean_k[row, :, length:], clean_v[row, :, length:] = 0.0, 0.0
        k[row, :, length:], v[row, :, length:] = np.nan, np.nan
    (want,) = mk.reference(text, q, clean_k, clean_v, kv_len)
    (out,) = prog(q, k, v, kv_len)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    (interp,) = run_mugraph(lower(load_module(text), kv_splits=kv_splits), q, k, v, kv_len)
    np.testing.assert_allclose(interp, want, rtol=1e-5, atol=1e-6)
