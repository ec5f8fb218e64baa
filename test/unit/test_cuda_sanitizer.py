"""compute-sanitizer's memcheck and racecheck report no error on the examples' megakernels (GPU)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from attention_programs import attention

ROOT = Path(__file__).resolve().parents[2]
# llama3_8b_block (440 MB of weights) is left out to keep the suite short; run it by hand with
# mk-run under compute-sanitizer.
EXAMPLES = [
    "decode_loop",
    "rmsnorm_linear",
    "gated_mlp",
    "attention_decode",
    "decoder_block",
    "lm_head_argmax",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mk-sanitizer-cache")  # one build per example for both tools


@pytest.mark.gpu
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
@pytest.mark.parametrize("example", EXAMPLES)
def test_sanitizer_finds_no_error(example: str, tool: str, cache: Path) -> None:
    sanitize(ROOT / "examples" / f"{example}.mlir", tool, cache)


@pytest.mark.gpu
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_sanitizer_on_keys_ahead_of_the_scalars(tool: str, cache: Path, tmp_path: Path) -> None:
    """qwen3-0.6b's heads at batch 1: each task reads its first round of keys before it knows
    the kv length, so a task past the length reads cache rows nobody wrote this step."""
    path = tmp_path / "attention.mlir"
    path.write_text(attention(1, 16, 8, 1024, 128))
    sanitize(path, tool, cache)


def sanitize(path: Path, tool: str, cache: Path) -> None:
    """mk-run of the program under compute-sanitizer's `tool`: no error reported."""
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("compute-sanitizer is not installed")
    command = [sanitizer, "--tool", tool, "--error-exitcode", "3", sys.executable, "-m"]
    command += ["mk.tools.mk_run", str(path), "--target", "cuda"]
    command += ["--cache-dir", str(cache)]
    # Racecheck checks the build whose raw-chunk mbarriers last the launch: the default
    # re-initialises them in each task, and racecheck then reports a copy into bytes that the
    # previous task's copy filled as a race (the copies' protocol is the same in both builds).
    env = {**os.environ, "MK_CUDA_RAW_BARS": "launch"} if tool == "racecheck" else None
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    report = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, report
    assert "ERROR SUMMARY: 0 errors" in report or "0 errors, 0 warnings" in report, report
