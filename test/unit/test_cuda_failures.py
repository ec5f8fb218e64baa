"""backends/cuda/failures.py: a failed task's code in the CPU executor's words."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import ml_dtypes
import numpy as np
import pytest

import mk
import mk.backends.cuda
from mk.backends.cuda.failures import PICK_CODE, START_LIMIT, kernel_failure
from mk.inputs import random_inputs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_decode_loop import ROWS, ROWS4  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

EMBED = """
func.func @embed(%table: tensor<10x8xbf16>, %ids: tensor<2x3xi32>) -> tensor<2x3x8xbf16> {
  %e = nn.embedding %table, %ids : (tensor<10x8xbf16>, tensor<2x3xi32>) -> tensor<2x3x8xbf16>
  func.return %e : tensor<2x3x8xbf16>
}
"""


def _cuda(source: str) -> object:
    with mock.patch.object(mk.backends.cuda, "nvcc", lambda: None):
        return mk.compile(source, target="cuda")


def _failing_grid(prog: object) -> object:
    grids = [g for g in prog.graph.index().grids if kernel_failure(g, 0) is not None]  # type: ignore[attr-defined]
    assert len(grids) == 1
    return grids[0]


def _cpu_message(source: str, bad: list[np.ndarray]) -> str:
    with pytest.raises(RuntimeError) as caught:
        mk.compile(source, target="cpu")(*bad)
    return str(caught.value)


@pytest.mark.parametrize("source", [ROWS, ROWS4], ids=["rows-per-run", "rows-per-3-runs"])
@pytest.mark.parametrize("start", [3, -2])
def test_cache_write_reads_as_the_cpu_executor_says_it(source: str, start: int) -> None:
    """The task returns the bad start (detail = start - 1 as a uint32): the message from the
    op's location on is the CPU executor's for the same positions."""
    prog = _cuda(source)
    cache, new, at = random_inputs(prog.func, 5)  # type: ignore[attr-defined]
    at[...] = 0
    at[-1] = start
    cpu = _cpu_message(source, [cache, new, at])
    gpu = kernel_failure(_failing_grid(prog), (start - 1) % (1 << 32))
    assert gpu is not None and gpu.startswith("<source>:3:3: ")  # the nn.cache_write's line
    assert cpu.endswith(gpu), (cpu, gpu)


def test_cache_write_code_is_emitted_and_a_clamped_start_says_so() -> None:
    prog = _cuda(ROWS)
    assert "return mk::gpu::cache_write_code(a2.p[bad * a2.n / 3]);" in prog.cuda_source  # type: ignore[attr-defined]
    text = kernel_failure(_failing_grid(prog), START_LIMIT - 1)
    assert text is not None and f"index ≥ {START_LIMIT} writes" in text


def test_embedding_names_the_index_of_the_id_out_of_range() -> None:
    prog = _cuda(EMBED)
    table, ids = random_inputs(prog.func, 1)  # type: ignore[attr-defined]
    ids[1, 2] = 10
    cpu = _cpu_message(EMBED, [table, ids])
    text = kernel_failure(_failing_grid(prog), 5)  # the flat index of (1, 2)
    assert text is not None and text.startswith("<source>:3:3: ")  # the nn.embedding's line
    loc, _, words = text.partition(" error: ")
    assert f"{loc} error: " in cpu
    assert (
        words
        == "'mugraph.kernel' \"embedding\" id at index (1, 2) is out of range for a table of 10 rows"
    )
    assert "id 10 at index (1, 2) is out of range for a table of 10 rows" in cpu


# A token history, the positions picked from it and their embedding: one gather of gathers.
PICKED = """
func.func @picked(%table: tensor<10x8xbf16>, %history: tensor<6x2xi32>, %at: tensor<3xi32>) -> tensor<6x8xbf16> {
  %ids = nn.embedding %history, %at : (tensor<6x2xi32>, tensor<3xi32>) -> tensor<3x2xi32>
  %e = nn.embedding %table, %ids : (tensor<10x8xbf16>, tensor<3x2xi32>) -> tensor<3x2x8xbf16>
  %v = nn.reshape %e : (tensor<3x2x8xbf16>) -> tensor<6x8xbf16>
  func.return %v : tensor<6x8xbf16>
}
"""


def _picked_inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    table = rng.standard_normal((10, 8)).astype(ml_dtypes.bfloat16)
    history = rng.integers(0, 10, (6, 2)).astype(np.int32)
    return [table, history, np.array([5, 0, 2], np.int32)]


def test_a_gather_of_gathers_is_one_kernel_that_matches_the_reference() -> None:
    """table[history[at]] in one kernel: the rows NumPy picks, and the reference's."""
    prog = mk.compile(PICKED, target="cpu")
    assert prog.ir("mugraph").count('mugraph.kernel "embedding"') == 1
    table, history, at = _picked_inputs()
    (got,) = prog(table, history, at)
    (want,) = mk.reference(PICKED, table, history, at)
    picked = table[history[at].reshape(-1)]
    np.testing.assert_array_equal(np.asarray(got), picked)
    np.testing.assert_array_equal(np.asarray(want, np.float32), picked.astype(np.float32))


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ("position", "id at index (1,) is out of range for a table of 6 rows"),
        ("id", "id at index (2, 1) is out of range for a table of 10 rows"),
    ],
)
def test_a_gather_of_gathers_names_what_was_out_of_range(bad: str, words: str) -> None:
    """A position out of the history, or a picked id out of the table: the CPU executor's and
    the GPU's words (from the task's code) name the same index and table."""
    table, history, at = _picked_inputs()
    if bad == "position":
        at[1], detail = 6, PICK_CODE + 1
    else:
        history[at[2], 1], detail = 10, 5  # picked ids [3, 2]: (2, 1) is flat index 5
    cpu = _cpu_message(PICKED, [table, history, at])
    gpu = kernel_failure(_failing_grid(_cuda(PICKED)), detail)
    assert gpu is not None and gpu.startswith("<source>:4:3: ")  # the outer nn.embedding
    assert gpu.endswith(f'"embedding" {words}'), gpu
    assert words.replace("id at", f"id {6 if bad == 'position' else 10} at") in cpu, cpu


def test_a_body_without_a_failing_op_has_no_words() -> None:
    prog = _cuda(ROOT / "examples/rmsnorm_linear.mlir")
    assert all(kernel_failure(g, 0) is None for g in prog.graph.index().grids)  # type: ignore[attr-defined]


_FAILING_CPU_RUN = """
import numpy as np
import mk
from test_decode_loop import ROWS
cache = np.ones((3, 4, 5), np.float32)
new = np.ones((3, 2, 5), np.float32)
try:
    mk.compile(ROWS, target="cpu")(cache, new, np.array([0, 0, 3], np.int32))
except RuntimeError as e:
    print(str(e))
"""


@pytest.mark.gpu
def test_cpu_executor_failure_raises_on_the_gpu_machine() -> None:
    """A failed task on the CPU executor raises its located error in the GPU machine's image too
    (there it once ended the process with a segmentation fault: bench/RESULTS.md, session 40).
    In a child process, so that a crash fails this test instead of the session."""
    here = str(Path(__file__).resolve().parent)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", _FAILING_CPU_RUN],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "index 3 writes positions [3, 5) outside [0, 4) of dim 1" in done.stdout, done.stdout


@pytest.mark.gpu
def test_a_gather_of_gathers_on_the_gpu() -> None:
    """table[history[at]] on the GPU: NumPy's rows; a position out of the history fails the
    run with the located words the host makes of the task's code."""
    from mk.backends.cuda.host import CudaRunError

    prog = mk.compile(PICKED, target="cuda")
    table, history, at = _picked_inputs()
    (got,) = prog(table, history, at)
    np.testing.assert_array_equal(np.asarray(got), table[history[at].reshape(-1)])
    at[1] = 6
    with pytest.raises(CudaRunError) as caught:
        prog(table, history, at)
    assert str(caught.value).endswith(
        "<source>:4:3: error: 'mugraph.kernel' \"embedding\" id at index (1,) is out of range "
        "for a table of 6 rows"
    ), str(caught.value)
